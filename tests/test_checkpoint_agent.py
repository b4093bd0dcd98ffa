"""A checkpoint carries its agent (issue 43): every training stage saves the agent settings it
trained under (``agent_config.json``) beside the weights and in every checkpoint, and eval,
rl, free rollouts and ``kg tool --agent-from`` start from them; a setting given over a
different carried one is named on stderr.

The module builds one tiny pipeline through the CLI: template questions on the movie fixture,
oracle trajectories made with non-default agent settings, the filter's corpus, and a 2-step
stage 1 on it."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.agent.carried import (
    AGENT_CONFIG_FILE,
    corpus_agent,
    read_agent_file,
    sft_agent,
    write_agent_file,
)
from kgsynth.agent.strategies.round_trips import round_trip_words
from kgsynth.cli import app
from kgsynth.core.errors import InputFileError
from tests.kgfixtures import build_pipeline_inputs

runner = CliRunner()

# the settings the corpus's trajectories are made with: none of them the default
MADE_WITH = {
    "relation_ranking": "focus",
    "first_hop_fallback": "dense",
    "max_turns": 3,
    "top_k_relations": 4,
    "system_prompt": "short",
}
# the policy's turn-token cap: not carried from oracle replays (they generate nothing); the
# evals and rollouts below give it to keep the tiny model's turns short
SHORT_TURNS = ["--max-turn-tokens", "8"]


def _flags(settings: dict) -> list[str]:
    return [a for k, v in settings.items() for a in (f"--{k.replace('_', '-')}", str(v))]


def _ok(args: list[str]):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res


def _saved(folder: Path) -> dict:
    return json.loads((folder / AGENT_CONFIG_FILE).read_text())["agent"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """questions, store, trajectories (made with MADE_WITH), corpus and a 2-step stage 1."""
    root = tmp_path_factory.mktemp("carried")
    paths = build_pipeline_inputs(root, walks=60, structures="chain-1,chain-2")
    paths["trajectories"] = root / "trajectories.parquet"
    paths["corpus"] = root / "corpus"
    paths["stage1"] = root / "stage1"
    _ok(["synthesize", "trajectories", "--questions", paths["questions"], "--kg", paths["store"],
         "--out", paths["trajectories"], *_flags(MADE_WITH)])  # fmt: skip
    _ok(["filter", "--in", paths["trajectories"], "--out", paths["corpus"]])
    _ok(["train", "stage1", "--corpus", paths["corpus"] / "accepted.parquet", "--model", "tiny",
         "--out", paths["stage1"], "--max-steps", "2", "--save-steps", "1", "--batch-size", "4",
         "--tiny-vocab-size", "400"])  # fmt: skip
    return paths


def test_stage1_and_each_checkpoint_carry_the_settings_of_the_corpus_trajectories(made):
    stage1 = made["stage1"]
    saved = _saved(stage1)
    assert {k: saved[k] for k in MADE_WITH} == MADE_WITH
    assert saved["toolset"] == "graphwalker" and saved["entity_matching"] == "exact"
    assert "system_text" not in saved  # the prompt is agent_system_prompt.txt
    assert "max_turn_tokens" not in saved and "resample_cut_turns" not in saved
    # the round-trip words the trajectories read from their questions' walks (none this small)
    rows = pq.read_table(made["questions"]).to_pylist()
    assert saved["round_trip_words"] == list(round_trip_words(rows))
    checkpoints = sorted((stage1 / "checkpoints").iterdir())
    assert [c.name for c in checkpoints] == ["checkpoint-1", "checkpoint-2"]
    for ckpt in checkpoints:
        assert _saved(ckpt) == saved
    manifest = json.loads((stage1 / "manifest.json").read_text())
    assert manifest["agent"]["settings"] == saved
    assert "accepted.parquet" in manifest["agent"]["from"]


def _eval(made, model: Path, out: Path, *extra) -> tuple[list[dict], dict, str]:
    res = _ok(["eval", "--model", model, "--kg", made["store"], "--questions",
               made["questions"], "--limit", "3", "--out", out, *SHORT_TURNS, *extra])  # fmt: skip
    rows = pq.read_table(out / "predictions.parquet").to_pylist()
    return rows, json.loads((out / "manifest.json").read_text())["config"], res.output


def test_eval_without_config_answers_as_with_the_recipe_and_a_flag_override_says_so(made, tmp_path):
    stage1 = made["stage1"]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("eval:\n" + "".join(f"  {k}: {v}\n" for k, v in MADE_WITH.items()))
    plain, plain_cfg, plain_out = _eval(made, stage1, tmp_path / "plain")
    stated, stated_cfg, stated_out = _eval(made, stage1, tmp_path / "stated", "--config", recipe)
    assert plain == stated and plain_cfg == stated_cfg
    assert {k: plain_cfg[k] for k in MADE_WITH} == MADE_WITH
    assert "warning" not in plain_out and "warning" not in stated_out  # they agree

    # the behaviour before: the same weights without the file run the default agent
    old = tmp_path / "old"
    shutil.copytree(stage1, old, ignore=shutil.ignore_patterns("checkpoints", AGENT_CONFIG_FILE))
    before, before_cfg, _ = _eval(made, old, tmp_path / "before")
    assert before_cfg["relation_ranking"] == "bm25" and before_cfg["max_turns"] == 10
    assert [r["num_turns"] for r in before] != [r["num_turns"] for r in plain]

    _, cfg, output = _eval(made, stage1, tmp_path / "flag", "--relation-ranking", "bm25",
                           "--first-hop-fallback", "none", "--max-turns", "3")  # fmt: skip
    assert cfg["relation_ranking"] == "bm25" and cfg["first_hop_fallback"] == "none"
    assert cfg["top_k_relations"] == 4  # the rest as carried
    warnings = [ln for ln in output.splitlines() if ln.startswith("warning:")]
    assert warnings == [  # --max-turns 3 is what it was trained with: no override
        f"warning: the model {stage1} was trained with relation_ranking focus and "
        "first_hop_fallback dense; --relation-ranking bm25 and --first-hop-fallback none "
        "override them"
    ]
    # a check between two settings that fails on a carried value says where it came from
    res = runner.invoke(app, ["eval", "--model", str(stage1), "--kg", str(made["store"]),
                              "--questions", str(made["questions"]), "--out",
                              str(tmp_path / "bad"), "--relation-ranking", "bm25"])  # fmt: skip
    assert res.exit_code == 2
    assert (
        f"(first_hop_fallback dense: what the model {stage1} was trained with; give "
        "--first-hop-fallback too)"
    ) in res.output.replace("\n", "")


def test_a_config_file_setting_over_a_carried_one_is_named_with_its_file(made, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("eval:\n  max_turns: 2\n  max_tokens: 8\n  top_k_relations: 4\n")
    _, cfg, output = _eval(made, made["stage1"], tmp_path / "e", "--config", recipe)
    assert cfg["max_turns"] == 2 and cfg["relation_ranking"] == "focus"
    line = next(ln for ln in output.splitlines() if ln.startswith("warning:"))
    assert line == (
        f"warning: the model {made['stage1']} was trained with max_turns 3; max_turns 2 "
        f"(--config {recipe}, section eval) overrides it"
    )


def test_free_rollouts_and_kg_tool_start_from_the_checkpoint(made, tmp_path):
    out = tmp_path / "free.parquet"
    _ok(["synthesize", "trajectories", "--questions", made["questions"], "--kg", made["store"],
         "--llm", "hf", "--model", made["stage1"], "--mode", "free", "--limit", "2",
         "--no-cache", "--out", out, *SHORT_TURNS])  # fmt: skip
    config = json.loads(out.with_name("free.manifest.json").read_text())["config"]
    assert {k: config[k] for k in MADE_WITH} == MADE_WITH

    call = ['kg', 'tool', 'get_relations("Kismet")', "--kg", made["store"], "--question",
            "who directed Kismet"]  # fmt: skip
    carried = _ok([*call, "--agent-from", made["stage1"]]).output
    stated = _ok([*call, "--top-k-relations", "4", "--relation-ranking", "focus",
                  "--first-hop-fallback", "dense"]).output  # fmt: skip
    assert carried == stated and "<- directed" in carried  # the focus ranking's match mark
    assert carried != _ok(call).output
    res = _ok([*call, "--agent-from", made["stage1"], "--top-k-relations", "2"])
    assert "showing 2 of 3" in res.output
    assert "trained with top_k_relations 4; --top-k-relations 2 overrides it" in res.output
    res = runner.invoke(app, [*call, "--agent-from", made["store"]])
    assert res.exit_code != 0 and "carries no agent settings" in res.output


def test_corpus_provenance_takes_what_most_rows_were_made_with(made, tmp_path, caplog):
    """Two trajectory files of disjoint questions made with different max_turns, filtered into
    one corpus: the run carries the majority's value and a warning names the field; where the
    corpus says nothing, stage 2 falls back to its --init's settings."""
    few, many = tmp_path / "few.parquet", tmp_path / "many.parquet"
    common = ["synthesize", "trajectories", "--questions", made["questions"], "--kg",
              made["store"], "--relation-ranking", "focus"]  # fmt: skip
    _ok([*common, "--split", "heldout", "--max-turns", "5", "--out", few])
    _ok([*common, "--split", "train", "--max-turns", "4", "--out", many])
    corpus = tmp_path / "corpus"
    _ok(["filter", "--in", few, "--in", many, "--out", corpus])
    rows = pq.read_table(corpus / "accepted.parquet").column("trajectory_id").to_pylist()
    heldout = set(pq.read_table(few).column("trajectory_id").to_pylist())
    assert 0 < sum(r in heldout for r in rows) < len(rows) / 2  # the held-out split is smaller

    with caplog.at_level(logging.WARNING, logger="kgsynth.agent.carried"):
        carried = corpus_agent(corpus / "accepted.parquet")
    assert carried is not None
    assert carried.values["max_turns"] == 4 and carried.values["relation_ranking"] == "focus"
    assert carried.values["top_k_relations"] == 10  # both files' default: no warning for it
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "different max_turns" in warned[0], warned

    # a trajectories file is its own provenance; a file without a manifest has none
    assert corpus_agent(few).values["max_turns"] == 5  # type: ignore[union-attr]
    bare = tmp_path / "bare.parquet"
    shutil.copy(few, bare)
    assert corpus_agent(bare) is None
    init = tmp_path / "init"
    init.mkdir()
    write_agent_file(init, {**MADE_WITH, "toolset": "kgr1"})
    fallback = sft_agent(bare, init)
    assert fallback is not None and fallback.values["toolset"] == "kgr1"
    assert fallback.subject == f"the model {init}"
    merged = sft_agent(few, init)  # the corpus's settings over the start's
    assert merged.values["max_turns"] == 5 and merged.values["toolset"] == "graphwalker"  # type: ignore[union-attr]


def test_stage2_records_its_own_options_over_the_corpus_and_lora_merge_keeps_them(made, tmp_path):
    stage2 = tmp_path / "stage2"
    res = _ok(["train", "stage2", "--corpus", made["corpus"] / "accepted.parquet", "--init",
               made["stage1"], "--out", stage2, "--max-steps", "1", "--batch-size", "4",
               "--entity-matching", "near", "--max-turn-tokens", "96", "--lora-r", "2",
               "--lora-target", "q_proj,v_proj"])  # fmt: skip
    saved = _saved(stage2)
    # given to the command: they win and are recorded (the cap, carried by no trajectory, too)
    assert saved["entity_matching"] == "near" and saved["max_turn_tokens"] == 96
    assert {k: saved[k] for k in MADE_WITH} == MADE_WITH  # the rest: the corpus's
    assert (
        "the trajectories of" in res.output and "--entity-matching near overrides it" in res.output
    )
    assert (stage2 / "adapter_config.json").is_file()
    for ckpt in (stage2 / "checkpoints").iterdir():
        assert _saved(ckpt) == saved
    merged = tmp_path / "merged"
    _ok(["train", "merge", stage2, "--out", merged])
    assert _saved(merged) == saved


def test_rl_rolls_out_with_the_init_agent_and_saves_what_it_ran(made, tmp_path):
    rl = tmp_path / "rl"
    res = _ok(["train", "rl", "--init", made["stage1"], "--questions", made["questions"],
               "--kg", made["store"], "--out", rl, "--max-steps", "2", "--save-steps", "1",
               "--group-size", "2", "--questions-per-step", "1", "--entity-matching", "near"])  # fmt: skip
    assert "was trained with entity_matching exact; --entity-matching near overrides it" in (
        res.output.replace("\n", "")
    )
    saved = _saved(rl)
    # what stage 1 carried (the system prompt style too, which rl has no option for), the flag
    # over it, and the tiny recipe's turn-token cap, which stage 1 did not carry
    assert {k: saved[k] for k in MADE_WITH} == MADE_WITH
    assert saved["entity_matching"] == "near" and saved["max_turn_tokens"] == 64
    assert _saved(rl / "checkpoints" / "step-1") == saved
    config = json.loads((rl / "manifest.json").read_text())["config"]
    assert config["max_turns"] == 3 and config["relation_ranking"] == "focus"


def test_an_agent_file_is_checked_and_a_later_setting_is_left_out(tmp_path, caplog):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_agent_file(folder, {"toolset": "kgr1", "max_turns": 4})
    assert read_agent_file(folder) == {"toolset": "kgr1", "max_turns": 4}
    path = folder / AGENT_CONFIG_FILE
    data = json.loads(path.read_text())
    data["agent"]["a_later_setting"] = 1
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="kgsynth.agent.carried"):
        assert read_agent_file(folder) == {"toolset": "kgr1", "max_turns": 4}
    assert "a_later_setting" in caplog.text
    for bad, says in (
        ("{not json", "unreadable agent settings"),
        ('{"agent": {"max_turns": "8"}}', "max_turns must be an integer"),
        ('{"agent": {"max_turns": 0}}', "max_turns must be >= 1"),
        ('{"agent": [1]}', 'holds no "agent" mapping'),
    ):
        path.write_text(bad)
        with pytest.raises(InputFileError, match=says) as info:
            read_agent_file(folder)
        assert str(path) in str(info.value)
    assert read_agent_file(tmp_path) is None  # no file: nothing carried
