"""A recipe's token caps fit the model it runs on (issue 44, item 4): a cap above the model's
positions (``config.json``'s ``max_position_embeddings``, else a real tokenizer
``model_max_length``) is lowered to them with one warning naming the setting, the value asked
and the limit, instead of an error. SFT's ``max_length``, rl's ``max_turn_tokens`` and
``max_obs_tokens``, eval's per-turn ``max_turn_tokens``.

The model is the tiny one built with 512 positions; stage 1 runs as a user runs it (a
``kgsynth`` process, so its stderr is what a user sees)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kgsynth.core.modelio import fit_to_model, position_limit
from kgsynth.train.data import corpus_texts
from tests.test_sft import CONVERSATIONS, write_corpus

WARNING = "max_length 4096 is more than the model's 512 positions"


@pytest.fixture(scope="module")
def model_512(tmp_path_factory) -> Path:
    from kgsynth.train.tiny import build_tiny_model

    return build_tiny_model(
        corpus_texts(CONVERSATIONS),
        tmp_path_factory.mktemp("fits") / "m512",
        vocab_size=600,
        max_position=512,
    )


def test_stage1_with_max_length_4096_on_a_512_position_model_trains_at_512(model_512, tmp_path):
    corpus = write_corpus(tmp_path / "accepted.parquet")
    out = tmp_path / "stage1"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "kgsynth.cli", "train", "stage1", "--corpus", str(corpus),
         "--model", str(model_512), "--out", str(out), "--max-length", "4096",
         "--recipe", "tiny", "--max-steps", "2", "--batch-size", "4",
         "--micro-batch-size", "2"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    warnings = [ln for ln in res.stderr.splitlines() if "positions" in ln]
    assert len(warnings) == 1, res.stderr
    assert WARNING in warnings[0] and "max_position_embeddings" in warnings[0]
    assert "using max_length 512" in warnings[0]
    spec = json.loads((out / "train_config.json").read_text())
    assert spec["config"]["max_length"] == 512
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["max_length"] == 512 and manifest["steps"] == 2


def test_a_cap_within_the_limit_is_kept_without_a_word(model_512, caplog):
    with caplog.at_level(logging.WARNING):
        assert fit_to_model("max_length", 512, model_512) == 512
        assert fit_to_model("max_length", 100, model_512) == 100
        assert fit_to_model("max_length", None, model_512) is None
        assert fit_to_model("max_length", 9999, None) == 9999  # no model to fit
    assert not caplog.records


def test_the_limit_comes_from_the_config_else_a_real_tokenizer_limit(model_512, tmp_path):
    assert position_limit(model_512) == (512, f"max_position_embeddings in {model_512}/config.json")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert position_limit(folder) is None  # nothing says
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": int(1e30)}))
    assert position_limit(folder) is None  # transformers' "no limit"
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 300}))
    assert position_limit(folder) == (300, f"model_max_length in {folder}/tokenizer_config.json")
    (folder / "config.json").write_text(
        json.dumps({"text_config": {"max_position_embeddings": 64}})
    )
    assert position_limit(folder)[0] == 64  # a multimodal config's text model


def test_rl_turn_and_observation_caps_fit_the_model(model_512, caplog):
    from kgsynth.agent.config import AgentConfig
    from kgsynth.train.grpo_config import GRPOConfig, resolve_config

    agent = AgentConfig(max_turn_tokens=1024)
    with caplog.at_level(logging.WARNING, logger="kgsynth.core.modelio"):
        cfg = resolve_config(GRPOConfig(init=str(model_512), agent=agent, max_obs_tokens=2048))
    assert cfg.agent.max_turn_tokens == 512 and cfg.max_obs_tokens == 512
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("max_turn_tokens 1024 is more than the model's 512 positions")
    assert lines[1].startswith("max_obs_tokens 2048 is more than the model's 512 positions")


def test_eval_turn_cap_fits_the_model(model_512, caplog):
    from kgsynth.agent.config import AgentConfig
    from kgsynth.eval.config import EvalConfig

    cfg = EvalConfig(agent=AgentConfig(max_turn_tokens=1000))
    with caplog.at_level(logging.WARNING, logger="kgsynth.core.modelio"):
        fitted = cfg.for_policy("hf", str(model_512))
    assert fitted.agent.max_turn_tokens == 512 and fitted.params(0).max_tokens == 512
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "max_turn_tokens 1000 is more than the model's 512 positions"
    ]
    # an API model's limit is not known here: its cap is kept
    assert cfg.for_policy("openai", "gpt-x").agent.max_turn_tokens == 1000
