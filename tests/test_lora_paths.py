"""A LoRA adapter finds its base model from anywhere (issue 44, item 4).

A LoRA stage trained with relative paths (``--model base --out runs/lora``, as typed) names its
base by absolute path in ``adapter_config.json`` and relative to the adapter in
``adapter_base.json``. ``kgsynth train merge`` and ``kgsynth eval`` then work from another
working directory; a run folder moved together with its base still loads; a base that is
gone fails at once with one line naming the adapter, the base and ``--base-model`` (no hub
attempt, no traceback), and ``--base-model`` fixes it. The commands run as a user runs them:
``kgsynth`` processes started in another folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgsynth.cli import app
from kgsynth.core.errors import InputFileError
from kgsynth.core.modelio import (
    ADAPTER_BASE,
    ADAPTER_CONFIG,
    adapter_base,
    load_causal_lm,
    model_digest,
)
from kgsynth.train.data import corpus_texts
from tests.kgfixtures import movie_ntriples
from tests.test_sft import CONVERSATIONS, write_corpus

runner = CliRunner()
LORA = ["--recipe", "tiny", "--max-steps", "2", "--batch-size", "4", "--micro-batch-size", "2",
        "--max-length", "512", "--lora-r", "4", "--lora-target", "q_proj,v_proj",
        "--lr", "5e-2"]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """ROOT/base (a tiny model), ROOT/runs/lora (LoRA stage 1 on it, trained from ROOT with
    relative paths), ROOT/runs/lora2 (LoRA stage 2 on that adapter), a question and the KG."""
    from kgsynth.train.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("lora_paths")
    build_tiny_model(corpus_texts(CONVERSATIONS), root / "base", vocab_size=600, max_position=512)
    write_corpus(root / "accepted.parquet")
    (root / "q.jsonl").write_text(
        json.dumps({"question": "who directed Kismet?", "topic_names": ["Kismet"],
                    "answer_names": ["William Dieterle"]}) + "\n"
    )  # fmt: skip
    (root / "movie.nt").write_text(movie_ntriples())
    cwd = Path.cwd()
    os.chdir(root)  # the paths are given relative, as a user types them
    try:
        for args in (
            ["stage1", "--model", "base", "--out", "runs/lora"],
            ["stage2", "--init", "runs/lora", "--out", "runs/lora2"],
        ):
            res = runner.invoke(app, ["train", *args, "--corpus", "accepted.parquet", *LORA])
            assert res.exit_code == 0, res.output
    finally:
        os.chdir(cwd)
    return root


def _kgsynth(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_OFFLINE", None)  # failing fast must not depend on it
    started = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "kgsynth.cli", *map(str, args)],
        cwd=cwd, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    return res, time.perf_counter() - started


def _one_line_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    return lines[0]


def test_the_adapter_names_its_base_absolute_and_relative(trained):
    lora = trained / "runs" / "lora"
    config = json.loads((lora / ADAPTER_CONFIG).read_text())
    assert config["base_model_name_or_path"] == str((trained / "base").resolve())
    record = json.loads((lora / ADAPTER_BASE).read_text())
    assert record["relative"] == os.path.join("..", "..", "base")
    for ckpt in (lora / "checkpoints").iterdir():  # each checkpoint loads from anywhere too
        ckpt_config = json.loads((ckpt / ADAPTER_CONFIG).read_text())
        assert ckpt_config["base_model_name_or_path"] == str((trained / "base").resolve())
    # stage 2 on an adapter: its base is that adapter, merged first (not stage 1's base)
    lora2 = trained / "runs" / "lora2"
    assert adapter_base(lora2) == str(lora.resolve())
    assert json.loads((lora2 / ADAPTER_BASE).read_text())["relative"] == os.path.join("..", "lora")


def test_merge_and_eval_from_another_working_directory(trained, tmp_path):
    import torch

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lora = trained / "runs" / "lora2"
    res, _ = _kgsynth(elsewhere, "train", "merge", lora, "--out", tmp_path / "merged")
    assert res.returncode == 0, res.stderr
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        merged = load_causal_lm(tmp_path / "merged")(ids).logits
        direct = load_causal_lm(lora)(ids).logits
        base = load_causal_lm(trained / "base")(ids).logits
    assert torch.allclose(merged, direct, atol=1e-5)
    assert not torch.allclose(merged, base, atol=1e-3)  # both adapters are in it

    res, _ = _kgsynth(elsewhere, "eval", "--model", lora, "--kg", trained / "movie.nt",
                      "--questions", trained / "q.jsonl", "--out", tmp_path / "eval",
                      "--max-turns", "1", "--max-turn-tokens", "4")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "eval" / "predictions.parquet").is_file()


def test_a_run_folder_moved_with_its_base_still_loads(trained, tmp_path):
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copytree(trained / "base", moved / "base")
    shutil.copytree(trained / "runs" / "lora", moved / "runs" / "lora")
    # the same model wherever it lies: the request cache keys it the same
    assert model_digest(moved / "runs" / "lora") == model_digest(trained / "runs" / "lora")
    hidden = trained / "base.away"  # the original is gone: the copy beside the run is found
    os.replace(trained / "base", hidden)
    try:
        assert adapter_base(moved / "runs" / "lora") == str((moved / "base").resolve())
        res, _ = _kgsynth(tmp_path, "train", "merge", moved / "runs" / "lora",
                          "--out", tmp_path / "merged")  # fmt: skip
        assert res.returncode == 0, res.stderr
    finally:
        os.replace(hidden, trained / "base")


def test_a_missing_base_fails_fast_in_one_line_and_base_model_fixes_it(trained, tmp_path):
    adapter = tmp_path / "lora"
    shutil.copytree(trained / "runs" / "lora", adapter)  # moved without its base
    wanted = str((trained / "base").resolve())
    hidden = trained / "base.away"
    os.replace(trained / "base", hidden)
    try:
        res, seconds = _kgsynth(tmp_path, "train", "merge", adapter, "--out", tmp_path / "m")
        line = _one_line_error(res)
        assert str(adapter / ADAPTER_CONFIG) in line and wanted in line
        assert "--base-model PATH" in line and seconds < 15
        assert not (tmp_path / "m").exists()

        res, seconds = _kgsynth(tmp_path, "eval", "--model", adapter, "--kg",
                                trained / "movie.nt", "--questions", trained / "q.jsonl",
                                "--out", tmp_path / "ev")  # fmt: skip
        line = _one_line_error(res)
        assert str(adapter / ADAPTER_CONFIG) in line and "--base-model PATH" in line
        assert seconds < 15 and not (tmp_path / "ev").exists()

        # training stages have no --base-model: they say how to make a full model to start from
        for args in (
            ["stage2", "--init", adapter, "--corpus", trained / "accepted.parquet"],
            ["rl", "--init", adapter, "--questions", trained / "q.jsonl", "--dry-run"],
        ):
            out = tmp_path / f"train_{args[0]}"
            res_in = runner.invoke(app, ["train", *map(str, args), "--out", str(out)])
            assert res_in.exit_code == 3, res_in.output
            (line,) = [ln for ln in res_in.output.splitlines() if ln.startswith("error:")]
            assert wanted in line and "kgsynth train merge RUN --out DIR --base-model" in line
            assert not out.exists()

        res, _ = _kgsynth(tmp_path, "train", "merge", adapter, "--out", tmp_path / "m",
                          "--base-model", hidden)  # fmt: skip
        assert res.returncode == 0, res.stderr
        manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
        assert manifest["input"]["base_model"] == str(hidden.resolve())
    finally:
        os.replace(hidden, trained / "base")


def test_an_older_adapter_with_a_relative_base_fails_fast_without_the_hub(trained, tmp_path):
    """Adapters saved before this named their base as typed (``base``, relative to where the
    training ran) and had no adapter_base.json: from that folder they load as before; from
    anywhere else the name looks like a hub id, but a kgsynth run's base is a local folder,
    so no hub is tried."""
    adapter = tmp_path / "runs" / "old"
    shutil.copytree(trained / "runs" / "lora", adapter)
    (adapter / ADAPTER_BASE).unlink()
    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    (adapter / ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": "a/b"}))
    with pytest.raises(InputFileError, match="base model is not at a/b; pass --base-model PATH"):
        adapter_base(adapter)
    res, seconds = _kgsynth(tmp_path, "train", "merge", adapter, "--out", tmp_path / "m")
    assert "a/b" in _one_line_error(res) and seconds < 15
    shutil.copytree(trained / "base", tmp_path / "a" / "b")  # where it was trained from
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        assert adapter_base(adapter) == str((tmp_path / "a" / "b").resolve())
    finally:
        os.chdir(cwd)


def test_a_hub_base_is_left_to_the_hub_unless_offline(tmp_path, monkeypatch):
    """An adapter made elsewhere (no kgsynth records beside it) may name a hub model; with
    HF_HUB_OFFLINE set and the model not in the local cache it fails at once instead."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    config = {"base_model_name_or_path": "someorg/not-a-cached-model", "peft_type": "LORA"}
    (adapter / ADAPTER_CONFIG).write_text(json.dumps(config))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert adapter_base(adapter) == "someorg/not-a-cached-model"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputFileError, match="not in the hub cache, and HF_HUB_OFFLINE is set"):
        adapter_base(adapter)
