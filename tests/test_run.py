"""``kgsynth run RECIPE --kg SOURCE --out RUN`` (issue 43, part 1): the recipe's steps in order,
every path derived from RUN, complete steps skipped on a re-run, --from / --until, one line a
step, and a failed step that names itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kgsynth.cli.recipe import RunOptions, plan
from kgsynth.core.errors import ConfigError
from kgsynth.resources import resource
from tests.kgfixtures import MOVIE_FACTS

DEFAULT = resource("recipes", "metaqa_default.yaml")

TINY_RECIPE = {
    "steps": [
        {"name": "kg", "run": "kg import"},
        {"name": "walks", "run": "walk", "kg": "kg"},
        {"name": "questions", "run": "synthesize questions", "walks": "walks", "llm": "template",
         "benchmark": "{eval_questions}"},
        {"name": "trajectories", "run": "synthesize trajectories", "questions": "questions",
         "kg": "kg", "llm": "template"},
        {"name": "corpus", "run": "filter", "in": "trajectories"},
        {"name": "stage1", "run": "train stage1", "corpus": "corpus/accepted.parquet",
         "model": "tiny"},
        {"name": "eval_stage1", "run": "eval", "model": "stage1", "kg": "kg",
         "questions": "{eval_questions}", "label": "stage1", "out": "eval/stage1"},
        {"name": "summary", "run": "compare", "of": ["eval_stage1"]},
        {"name": "report", "run": "report"},
    ],
    "walks": {"n": 24, "structures": "chain-1,chain-2"},
    "stage1": {"max_steps": 2, "batch_size": 2, "micro_batch_size": 2, "tiny_vocab_size": 300,
               "max_length": 1024, "save_steps": 1},
    "eval_stage1": {"limit": 4, "max_tokens": 16, "max_turns": 2},
}  # fmt: skip


def test_the_default_recipe_derives_every_path_from_the_run_folder(tmp_path: Path) -> None:
    dev = tmp_path / "dev.jsonl"
    dev.write_text("{}\n")
    kb = tmp_path / "kb.txt"
    kb.write_text("a|r|b\n")
    steps = plan(DEFAULT, RunOptions(kg=str(kb), out=tmp_path / "run", eval_questions=dev))
    names = [s.name for s in steps]
    assert names[:6] == ["kg", "kg_stats", "walks", "questions", "trajectories", "corpus"]
    assert names[-2:] == ["summary", "report"]
    run = str(tmp_path / "run")
    for step in steps:
        outs = [step.argv[i + 1] for i, a in enumerate(step.argv) if a == "--out"]
        assert all(o.startswith(run) for o in outs), step.argv
    by = {s.name: s.argv for s in steps}
    assert by["kg"][:3] == ["kg", "import", str(kb)]
    # a step's input is the output of the step it names
    assert by["stage1"][by["stage1"].index("--corpus") + 1] == f"{run}/corpus/accepted.parquet"
    assert by["questions"][by["questions"].index("--walks") + 1] == f"{run}/walks/walks.parquet"
    assert by["questions"][by["questions"].index("--benchmark") + 1] == str(dev)
    assert by["free_rollouts"][by["free_rollouts"].index("--model") + 1] == f"{run}/stage1"
    assert "--no-cache" in by["free_rollouts"] and "--workers" not in by["free_rollouts"]
    assert by["eval_stage1"].count("--baseline") == 2
    assert by["stage1"][by["stage1"].index("--model") + 1] == "tiny"
    # the settings come from the step's section of the recipe
    assert by["corpus_stage2"][by["corpus_stage2"].index("--section") + 1] == "filter_stage2"


def test_without_eval_questions_the_evaluations_are_left_out(tmp_path: Path) -> None:
    steps = plan(DEFAULT, RunOptions(kg="kb.txt", out=tmp_path, size="smoke", nproc=2))
    names = [s.name for s in steps]
    assert not [n for n in names if n.startswith("eval") or n == "summary"]
    by = {s.name: s.argv for s in steps}
    assert "--benchmark" not in by["questions"]
    # smoke sizes and the processes reach their steps
    assert by["walks"][by["walks"].index("--n") + 1] == "300"
    assert by["stage1"][by["stage1"].index("--nproc-per-node") + 1] == "2"
    assert by["free_rollouts"][by["free_rollouts"].index("--workers") + 1] == "2"


def test_a_named_size_changes_only_the_steps_it_names(tmp_path: Path) -> None:
    recipe = dict(TINY_RECIPE, sizes={"long": {"stage1": {"max_steps": 50}}})
    recipe["smoke"] = {"walks": {"n": 6}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    dev = tmp_path / "dev.jsonl"

    def argv(size: str | None) -> dict[str, list[str]]:
        opts = RunOptions(kg="kb.txt", out=tmp_path / "run", eval_questions=dev, size=size)
        return {s.name: s.argv for s in plan(path, opts)}

    plain, long, smoke = argv(None), argv("long"), argv("smoke")
    assert long["stage1"][long["stage1"].index("--max-steps") + 1] == "50"
    assert "--max-steps" not in plain["stage1"]
    assert long["walks"] == plain["walks"] and "--n" not in plain["walks"]
    assert smoke["walks"][smoke["walks"].index("--n") + 1] == "6"
    with pytest.raises(ConfigError, match="no size 'huge'; its sizes: long, smoke"):
        argv("huge")
    recipe["sizes"] = {"long": {"stage9": {"max_steps": 1}}}
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(ConfigError, match="sizes: long: no step 'stage9'"):
        argv("long")


def test_the_learn_size_of_the_default_recipe_runs_the_longer_chain(tmp_path: Path) -> None:
    opts = RunOptions(kg="kb.txt", out=tmp_path, size="learn", nproc=2)
    by = {s.name: s.argv for s in plan(DEFAULT, opts)}
    rl = by["rl"]
    assert rl[rl.index("--group-size") + 1] == "8" and "--dynamic-sampling" in rl
    assert int(rl[rl.index("--questions-per-step") + 1]) >= 64
    # GRPO keeps its best validation checkpoint; stage 2 keeps its section's sign test
    assert rl[rl.index("--select-alpha") + 1] == "1"
    assert "--select-alpha" not in by["stage2"]


def test_an_endpoint_or_a_store_is_used_as_it_is(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9/sparql"
    steps = plan(DEFAULT, RunOptions(kg=url, out=tmp_path))
    assert steps[0].name == "kg_stats"
    by = {s.name: s.argv for s in steps}
    assert by["walks"][by["walks"].index("--kg") + 1] == url


@pytest.mark.parametrize(
    ("recipe", "needle"),
    [
        ({"walk": {"n": 3}}, "no steps: list"),
        ({"steps": [{"name": "a", "run": "dance"}]}, "run must be one of"),
        ({"steps": [{"name": "a", "run": "walk"}, {"name": "a", "run": "walk"}]}, "a second step"),
        ({"steps": ["walk"]}, "a mapping with a name"),
    ],
)
def test_a_bad_recipe_is_one_error_naming_the_file(
    tmp_path: Path, recipe: dict, needle: str
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(ConfigError, match=needle) as info:
        plan(path, RunOptions(kg="kb.txt", out=tmp_path / "run"))
    assert str(path) in str(info.value)


def kgsynth(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "kgsynth.cli", *args], cwd=cwd, capture_output=True, text=True,
        env=env, timeout=900,
    )  # fmt: skip


def test_a_recipe_runs_on_a_kg_of_my_own_then_resumes_and_reruns_from_a_step(
    tmp_path: Path,
) -> None:
    kb = tmp_path / "my kg.tsv"  # a tab-separated KG of a user's own
    kb.write_text("\n".join("\t".join(f) for f in MOVIE_FACTS) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(TINY_RECIPE, sort_keys=False))
    run = tmp_path / "run"
    # questions a user brings for evaluation: template questions of other walks of the KG
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(dict(TINY_RECIPE, walks={"n": 12, "seed": 9}), sort_keys=False))
    seed_run = kgsynth("run", str(other), "--kg", str(kb), "--out", "first", "--until",
                       "questions", "--nproc", "1", cwd=tmp_path)  # fmt: skip
    assert seed_run.returncode == 0, seed_run.stderr
    evalq = tmp_path / "first" / "questions" / "questions.parquet"
    args = ["run", str(recipe), "--kg", str(kb), "--out", "run", "--eval-questions", str(evalq),
            "--nproc", "1"]  # fmt: skip
    first = kgsynth(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    lines = [line for line in first.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == 9 and all("skipped" not in line for line in lines), first.stdout
    for path in ("kg/kg.json", "walks/walks.parquet", "questions/questions.parquet",
                 "corpus/accepted.parquet", "stage1/config.json", "eval/stage1/metrics.json",
                 "summary/compare.md", "report.html"):  # fmt: skip
        assert (run / path).exists(), path
    assert "stage1" in first.stdout  # the summary table ends the run
    # the report found every stage where the runner wrote it
    report = (run / "report.html").read_text()
    assert "not in this run" not in report.split("Evaluation")[0]
    # a re-run finds every step complete
    again = kgsynth(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("done already, skipped") == 9, again.stdout
    # --from reruns that step and the later ones; --until stops after one
    partial = kgsynth(*args, "--from", "eval_stage1", "--until", "summary", cwd=tmp_path)
    assert partial.returncode == 0, partial.stderr
    assert partial.stdout.count("kept (before --from") == 6, partial.stdout
    assert "eval_stage1" in partial.stdout and "report" not in partial.stdout.split("[ 9/")[0]
    # a step that fails names itself and its log; fixing it and running again goes on
    broken = dict(TINY_RECIPE, eval_stage1={**TINY_RECIPE["eval_stage1"], "limit": -3})
    recipe.write_text(yaml.safe_dump(broken, sort_keys=False))
    failed = kgsynth(*args, cwd=tmp_path)
    assert failed.returncode != 0
    last = failed.stderr.strip().splitlines()[-1]
    assert "Traceback" not in failed.stderr
    assert "step eval_stage1" in " ".join(failed.stderr.split()) and "error" in last
    assert failed.stdout.count("done already, skipped") == 6, failed.stdout
    recipe.write_text(yaml.safe_dump(TINY_RECIPE, sort_keys=False))
    fixed = kgsynth(*args, cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    # the failed step left the output it had before: with the settings it was made with again,
    # nothing is left to do
    assert fixed.stdout.count("done already, skipped") == 9, fixed.stdout


def test_make_learn_evaluates_on_1500_dev_questions_outside_both_samples(tmp_path: Path) -> None:
    import json

    root = Path(__file__).resolve().parents[1]
    if not (root.parent / "shared" / "data" / "metaqa").is_dir():
        pytest.skip("no MetaQA download beside the repository")
    run = tmp_path / "learn"
    questions = run / "dev_questions.jsonl"
    dry = subprocess.run(
        ["make", "-n", "learn", f"LEARN_RUN={run}"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert f"--size learn --out {run} --eval-questions {questions}" in dry
    fresh = subprocess.run(
        ["make", "-n", f"LEARN_RUN={run}", "LEARN_SEED=3", "LEARN_EXCLUDE=a.jsonl b.jsonl",
         str(questions)],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "--seed 3" in fresh and "--exclude a.jsonl --exclude b.jsonl" in fresh
    # the target's first part, run: the evaluation questions it draws
    subprocess.run(
        ["make", f"LEARN_RUN={run}", str(questions)], cwd=root, check=True, capture_output=True
    )

    def lines(path: Path) -> set[tuple[str, int]]:
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        return {(r["source"], r["source_line"]) for r in rows}

    drawn = lines(questions)
    assert len(drawn) == 1500
    samples = root / "kgsynth/resources/metaqa"
    assert not drawn & lines(samples / "dev_sample/metaqa_dev_sample.jsonl")
    assert not drawn & lines(samples / "dev_check/metaqa_dev_check.jsonl")


def test_make_learn_without_the_metaqa_download_evaluates_on_the_dev_sample(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    questions = tmp_path / "learn" / "dev_questions.jsonl"
    done = subprocess.run(
        ["make", f"LEARN_RUN={tmp_path / 'learn'}", f"METAQA_DATA={tmp_path / 'none'}",
         str(questions)],
        cwd=root, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "no MetaQA download" in done.stdout
    sample = root / "kgsynth/resources/metaqa/dev_sample/metaqa_dev_sample.jsonl"
    assert questions.read_bytes() == sample.read_bytes()
