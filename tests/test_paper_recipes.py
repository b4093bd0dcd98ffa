"""The five paper recipes (issue 42, items 2-3): each a ``steps:`` recipe that ``kgsynth run``
plans on the shipped KB with an evaluation on the packaged dev sample, each step carrying its
paper's settings; and ``make papers``' table of their final evaluations
(:mod:`kgsynth.eval.papers`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kgsynth.cli.recipe import RunOptions, load_recipe, plan
from kgsynth.core.errors import InputFileError
from kgsynth.eval.papers import HEADLINE, PaperRow, main, papers_table, read_run
from kgsynth.resources import default_kg, dev_sample, find_recipe

PAPERS = ("graphwalker", "kg-r1", "kbqa-r1", "knowcoder-a1", "isp")
PRESET = {"graphwalker": "graphwalker", "kg-r1": "kg-r1", "kbqa-r1": "kbqa-r1",
          "knowcoder-a1": "knowcoder-a1", "isp": "isp"}  # fmt: skip


def _plan(name: str, tmp_path: Path, smoke: bool = False) -> dict[str, list[str]]:
    opts = RunOptions(
        kg=str(default_kg()),
        out=tmp_path,
        eval_questions=dev_sample(),
        size="smoke" if smoke else None,
    )
    return {s.name: s.argv for s in plan(find_recipe(name), opts)}


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("name", PAPERS)
def test_each_paper_recipe_plans_an_rl_run_and_its_evaluation_on_the_dev_sample(name, tmp_path):
    recipe = load_recipe(find_recipe(name))
    steps = _plan(name, tmp_path)
    assert steps["eval_rl"][0] == "eval"
    assert _value(steps["eval_rl"], "--questions") == str(dev_sample())
    assert _value(steps["eval_rl"], "--model") == str(tmp_path / "rl")
    assert _value(steps["questions"], "--benchmark") == str(dev_sample())  # contamination guard
    assert steps["summary"][:2] == ["eval", "--compare"]
    assert recipe["rl"]["preset"] == PRESET[name]
    # the preset's GPU sizes are cut for the tiny model, and the smoke sizes cut them again
    assert recipe["rl"]["questions_per_step"] <= 4 and recipe["rl"]["lr"] > 1e-6
    smoke = _plan(name, tmp_path, smoke=True)
    assert int(_value(smoke["rl"], "--max-steps")) <= 2
    assert int(_value(smoke["eval_rl"], "--limit")) == 9
    assert int(_value(smoke["walks"], "--n")) == 300
    # the header says where the recipe departs from its paper, and links its notes
    text = find_recipe(name).read_text()
    assert "Departures" in text and "docs/papers/" in text


def test_the_recipes_that_allow_it_synthesize_the_same_questions(tmp_path):
    shared = [n for n in PAPERS if n != "kbqa-r1"]  # KBQA-R1's constraint walks are its own
    walks = [load_recipe(find_recipe(n))["walk"] for n in shared]
    assert all(w == walks[0] for w in walks)
    sizes = {json.dumps(load_recipe(find_recipe(n))["stage1"].get("tiny_hidden_size")) for n in
             ("graphwalker", "kbqa-r1", "knowcoder-a1", "isp")}  # fmt: skip
    assert sizes == {"64"} and load_recipe(find_recipe("kg-r1"))["base"]["tiny_hidden_size"] == 64


def test_graphwalker_runs_the_papers_environment_and_filter(tmp_path):
    recipe = load_recipe(find_recipe("graphwalker"))
    assert recipe["agent"]["graphwalker_observations"] == "paper"
    assert recipe["agent"]["relation_ranking"] == "bm25" and recipe["agent"]["max_turns"] == 10
    assert recipe["filter"]["outcome"] == "em_strict" and recipe["filter"]["grounding"] is True
    steps = _plan("graphwalker", tmp_path)
    assert _value(steps["stage2"], "--init") == str(tmp_path / "stage1")
    assert _value(steps["rl"], "--init") == str(tmp_path / "stage2")


def test_kg_r1_trains_no_sft_stage_and_starts_rl_from_the_untrained_tiny_model(tmp_path):
    steps = _plan("kg-r1", tmp_path)
    assert _value(steps["rl"], "--init") == str(tmp_path / "base" / "init-tiny")
    assert not [n for n in steps if n.startswith("stage") or n == "corpus"]
    assert [argv[:2] for argv in steps.values()].count(["train", "stage1"]) == 1
    assert load_recipe(find_recipe("kg-r1"))["agent"]["toolset"] == "kgr1"


def test_kg_r1_sft_is_kg_r1_with_a_cold_start_and_nothing_else_changed(tmp_path):
    """The named variant: an SFT stage on kgr1 oracle replays before the same RL, in the same
    environment, on the same questions (docs/recipes.md)."""
    steps = _plan("kg-r1-sft", tmp_path)
    base, variant = (load_recipe(find_recipe(n)) for n in ("kg-r1", "kg-r1-sft"))
    assert variant["agent"] == base["agent"]
    assert variant["walk"] == base["walk"] and variant["questions"] == base["questions"]
    assert variant["rl"]["preset"] == "kg-r1"
    assert steps["trajectories"][:2] == ["synthesize", "trajectories"]
    assert _value(steps["stage1"], "--corpus") == str(tmp_path / "corpus" / "accepted.parquet")
    assert _value(steps["rl"], "--init") == str(tmp_path / "stage1")
    assert _value(steps["eval_rl"], "--questions") == str(dev_sample())
    smoke = _plan("kg-r1-sft", tmp_path, smoke=True)
    assert int(_value(smoke["rl"], "--max-steps")) <= 2


def test_knowcoder_a1_runs_the_cold_start_and_two_phases_with_their_own_questions(tmp_path):
    steps = _plan("knowcoder-a1", tmp_path)
    recipe = load_recipe(find_recipe("knowcoder-a1"))
    assert recipe["coldstart"]["mode"] == "coldstart"
    phase2 = _value(steps["rl"], "--phase2-questions")
    assert phase2 == str(tmp_path / "phase2" / "questions.parquet")
    assert phase2 != _value(steps["rl"], "--questions")
    assert recipe["walks_phase2"]["seed"] != recipe["walk"]["seed"]
    rl = recipe["rl"]
    assert 0 < rl["fbeta_switch_step"] < rl["max_steps"] and rl["fbeta_switch_reward"] > 1


def test_kbqa_r1_is_still_found_by_its_earlier_name_and_compares_rrs_with_plain_sampling(
    tmp_path,
):
    assert find_recipe("kbqa_r1") == find_recipe("kbqa-r1")
    steps = _plan("kbqa-r1", tmp_path)
    assert _value(steps["rrs_referenced_kept"], "--out") == str(tmp_path / "rrs/referenced_kept")
    assert _value(steps["rrs_plain_kept"], "--out") == str(tmp_path / "rrs/plain_kept")
    assert steps["corpus_stage2"].count("--in") == 3


def test_kgsynth_run_on_the_shipped_kb_evaluates_on_its_dev_sample(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def dry(*extra: str) -> str:
        res = subprocess.run(
            [sys.executable, "-m", "kgsynth.cli", "run", "isp", "--out", str(tmp_path / "r"),
             "--dry-run", *extra], capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        return res.stdout

    assert str(dev_sample()) in dry() and "kgsynth eval --compare" in dry()
    kb = tmp_path / "kb.tsv"
    kb.write_text("a\tr\tb\n")
    assert "kgsynth eval" not in dry("--kg", str(kb))  # a KG of one's own brings its questions


# --- the table ------------------------------------------------------------------------------


def _fake_run(root: Path, name: str, hits: float, *, questions: int = 300) -> Path:
    """A run folder as a paper recipe leaves it: the final evaluation's metrics.json and the
    manifests the table reads (the values are the test's own)."""
    run = root / name
    (run / "eval" / "rl").mkdir(parents=True)
    metrics = {
        "counts": {"questions": questions, "runs": 1, "predictions": questions},
        "overall": {"hits_at_1": hits, "f1": hits / 2, "em_strict": hits / 4, "hit": hits},
        "ci95": {"hits_at_1": [hits - 0.05, hits + 0.05], "f1": [0.1, 0.2]},
    }
    (run / "eval" / "rl" / "metrics.json").write_text(json.dumps(metrics))
    manifests = {  # the run was made elsewhere: start_from names the folders there
        "stage1/manifest.json": {"stage": "train stage1", "elapsed_s": 100.0,
                                 "tokens_trained": 1000,
                                 "start_from": {"path": "/elsewhere/stage1/init-tiny"}},
        "stage1/checkpoints/checkpoint-1/manifest.json": {"stage": "train stage1",
                                                          "tokens_trained": 99},
        # trained, but not on the way to the final agent (kg-r1's base): time, no tokens
        "base/manifest.json": {"stage": "train stage1", "elapsed_s": 5.0,
                               "tokens_trained": 7},
        "rl/manifest.json": {"stage": "train rl", "elapsed_s": 50.5, "generated_tokens": 300,
                             "start_from": {"path": "/elsewhere/stage1"}},
        "walks/walks.manifest.json": {"stage": "walk", "elapsed_s": 2.0},
        "eval/rl/manifest.json": {"stage": "eval", "elapsed_s": 10.0},
    }  # fmt: skip
    for rel, body in manifests.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(json.dumps(body))
    return run


def test_the_table_reads_each_runs_final_evaluation_tokens_and_time(tmp_path):
    row = read_run(_fake_run(tmp_path, "isp", 0.4))
    assert row == PaperRow(
        label="isp", questions=300,
        metrics={"hits_at_1": 0.4, "f1": 0.2, "em_strict": 0.1, "hit": 0.4},
        ci95={"hits_at_1": (0.35000000000000003, 0.45), "f1": (0.1, 0.2)},
        sft_tokens=1000, rl_tokens=300, wall_s=167.5,
    )  # fmt: skip
    table = papers_table([row, read_run(_fake_run(tmp_path, "x", 0.2), "kg-r1")])
    lines = table.splitlines()
    assert lines[0].startswith("| recipe | questions | Hits@1 | F1 | EM (strict) | Hit |")
    assert lines[2] == ("| isp | 300 | 0.400 [0.350, 0.450] | 0.200 [0.100, 0.200] | 0.100 | "
                        "0.400 | Hit, F1 | 1,000 | 300 | 168 |")  # fmt: skip
    assert lines[3].startswith("| kg-r1 | 300 | 0.200 [0.150, 0.250] |")
    assert "F1, Hits@1" in lines[3]
    assert "warning" not in table


def test_the_table_warns_when_the_runs_saw_different_questions(tmp_path):
    rows = [read_run(_fake_run(tmp_path, "isp", 0.4)),
            read_run(_fake_run(tmp_path, "kg-r1", 0.1, questions=9))]  # fmt: skip
    assert "different numbers of questions [9, 300]" in papers_table(rows)


def test_a_run_without_its_final_evaluation_is_one_error_naming_the_file(tmp_path, capsys):
    (tmp_path / "isp").mkdir()
    with pytest.raises(InputFileError, match=r"isp/eval/rl/metrics\.json: no final evaluation"):
        read_run(tmp_path / "isp")
    assert main([str(tmp_path / "isp")]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    run = _fake_run(tmp_path, "graphwalker", 0.5)
    assert main([f"gw={run}"]) == 0
    assert "| gw | 300 | 0.500" in capsys.readouterr().out


@pytest.mark.slow
def test_a_smoke_run_of_a_paper_recipe_fills_a_row(tmp_path):
    """kgsynth run graphwalker --smoke end to end (about 2.5 minutes on one core), then its
    row of the table."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "kgsynth.cli", "run", "graphwalker", "--out",
         str(tmp_path / "graphwalker"), "--smoke", "--nproc", "1"],
        capture_output=True, text=True, env=env, timeout=1200,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    row = read_run(tmp_path / "graphwalker")
    assert row.questions == 9 and set(row.metrics) == {"hits_at_1", "f1", "em_strict", "hit"}
    assert row.sft_tokens > 0 and row.rl_tokens > 0 and row.wall_s > 0
    assert all(0 <= lo <= row.metrics[k] <= hi <= 1 for k, (lo, hi) in row.ci95.items())


def test_make_papers_runs_every_paper_and_kg_r1s_answering_variant_each_with_its_headline():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text(encoding="utf-8")
    names = next(line for line in makefile.splitlines() if line.startswith("PAPERS :="))
    recipes = names.split(":=", 1)[1].split()
    assert set(PAPERS) | {"kg-r1-sft"} == set(recipes)
    for name in recipes:
        assert find_recipe(name).is_file() and HEADLINE[name]
