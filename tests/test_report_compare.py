"""``kgsynth report`` on any layout, and ``kgsynth report RUN_A RUN_B``.

Two real runs over the same tiny KG: one written by the recipe runner (``kgsynth run``, its
step folders, a second walk and its questions sharing ``val/``), one written by hand with
names a person chose (``walks.parquet`` at the run's root, the KG outside the run, the corpus
in ``sft_corpus/``). Each adds a training folder (``metrics.jsonl``) and an evaluation
(``metrics.json``) as in tests/test_report.py. The report finds every stage of both by its
manifest; the comparison shows both runs' headline numbers and their difference, the funnels
side by side and the training curves overlaid, and its headline table is on Chromium's first
1280x800 screen."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from kgsynth.cli import app
from kgsynth.core.schema import PREDICTION_SCHEMA
from kgsynth.metrics import wilson_interval
from kgsynth.report import collect_run
from kgsynth.report.headline import type_rows
from tests.kgfixtures import MOVIE_FACTS
from tests.test_report import Page, browser, first_screen  # noqa: F401 (browser: a fixture)

runner = CliRunner()

RECIPE = {
    "steps": [
        {"name": "kg", "run": "kg import"},
        {"name": "kg_stats", "run": "kg stats", "kg": "kg"},
        {"name": "walks", "run": "walk", "kg": "kg"},
        {"name": "questions", "run": "synthesize questions", "walks": "walks", "llm": "template"},
        {"name": "trajectories", "run": "synthesize trajectories", "questions": "questions",
         "kg": "kg", "llm": "template"},
        {"name": "corpus", "run": "filter", "in": "trajectories"},
        {"name": "val_walk", "run": "walk", "kg": "kg", "out": "val/walks.parquet"},
        {"name": "val_questions", "run": "synthesize questions", "walks": "val_walk",
         "llm": "template", "out": "val/questions.parquet"},
    ],
    "walks": {"n": 16, "structures": "chain-1,chain-2"},
    "val_walk": {"n": 6, "seed": 5, "structures": "chain-1"},
}  # fmt: skip


def invoke(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def add_training_and_eval(root: Path, train: str, evaluation: str, hits: float) -> None:
    """A finished training folder (manifest, ``metrics.jsonl``) and an evaluation."""
    folder = root / train
    folder.mkdir(parents=True)
    losses = [4.0 / (s * hits * 4) for s in range(1, 11)]
    (folder / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in enumerate(losses, 1))
    )
    (folder / "manifest.json").write_text(json.dumps({
        "stage": "train stage1", "steps": 10, "loss_first": losses[0], "loss_last": losses[-1],
        "written": "2099-01-01T00:00:00Z",
    }))  # fmt: skip
    out = root / evaluation
    out.mkdir(parents=True)
    overall = {"em_strict": hits, "hit": hits, "f1": hits, "hits_at_1": hits, "rhits_at_1": hits}
    ci = {k: [hits / 2, (1 + hits) / 2] for k in overall}
    (out / "metrics.json").write_text(json.dumps({
        "label": "stage1",
        "counts": {"questions": 8, "runs": 1, "predictions": 8},
        "overall": overall, "ci95": ci, "union": {},
        "breakdowns": {"hops": {"1": {**overall, "questions": 8, "ci95": ci}},
                       "qtype": {"a_to_b": {**overall, "questions": 8}}},
    }))  # fmt: skip
    (out / "manifest.json").write_text(
        json.dumps({"stage": "eval", "label": "stage1", "written": "2099-01-01T00:00:01Z"})
    )


@pytest.fixture(scope="module")
def kb(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kb") / "kb.txt"
    path.write_text("\n".join("|".join(f) for f in MOVIE_FACTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def runner_run(kb, tmp_path_factory) -> Path:
    """The recipe runner's layout: ``kgsynth run`` writes every step where its plan says."""
    base = tmp_path_factory.mktemp("runner")
    recipe = base / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE, sort_keys=False))
    invoke("run", str(recipe), "--kg", str(kb), "--out", str(base / "r"), "--nproc", "1")
    add_training_and_eval(base / "r", "stage1", "eval/stage1", 0.25)
    return base / "r"


@pytest.fixture(scope="module")
def hand_run(kb, tmp_path_factory) -> Path:
    """A layout a person chose: the KG beside the run, files at the run's root, own names."""
    base = tmp_path_factory.mktemp("hand")
    root = base / "my"
    kg = base / "kg"
    invoke("kg", "import", str(kb), "--out", str(kg))
    invoke("walk", "--kg", str(kg), "--out", str(root / "walks.parquet"), "--n", "12",
           "--structures", "chain-1,chain-2")  # fmt: skip
    invoke("synthesize", "questions", "--walks", str(root / "walks.parquet"), "--out",
           str(root / "qs.parquet"), "--llm", "template")  # fmt: skip
    invoke("synthesize", "trajectories", "--questions", str(root / "qs.parquet"), "--kg",
           str(kg), "--mode", "oracle", "--llm", "template", "--out",
           str(root / "oracle data" / "traj.parquet"))  # fmt: skip
    invoke("filter", "--in", str(root / "oracle data" / "traj.parquet"), "--out",
           str(root / "sft_corpus"), "--max-chars", "1800")  # fmt: skip
    add_training_and_eval(root, "models/first", "results/first-eval", 0.5)
    return root


def kinds_and_keys(run: Path) -> list[tuple[str, str]]:
    return [(s.kind, s.key) for s in collect_run(run, samples=1).stages]


def test_the_runners_layout_is_read_from_its_manifests(runner_run):
    assert kinds_and_keys(runner_run) == [
        ("kg import", "kg"),
        ("walk", "walks/walks.parquet"),
        ("synthesize questions", "questions/questions.parquet"),
        ("synthesize trajectories", "trajectories/trajectories.parquet"),
        ("filter", "corpus"),
        ("walk", "val/walks.parquet"),
        ("synthesize questions", "val/questions.parquet"),
        ("train stage1", "stage1"),
        ("eval", "eval/stage1"),
    ]
    report = collect_run(runner_run, samples=1)
    kg = report.stages[0]
    assert kg.info["triples"] > 0 and "top_relations" in kg.info  # kg.json and kg_stats.json
    assert [k for k, _ in report.missing] == ["train stage2", "train rl", "eval compare"]


def test_a_hand_made_layout_is_read_from_its_manifests(hand_run):
    assert kinds_and_keys(hand_run) == [
        ("kg import", str(hand_run.parent / "kg")),  # outside the run, named by the manifests
        ("walk", "walks.parquet"),
        ("synthesize questions", "qs.parquet"),
        ("synthesize trajectories", "oracle data/traj.parquet"),
        ("filter", "sft_corpus"),
        ("train stage1", "models/first"),
        ("eval", "results/first-eval"),
    ]
    invoke("report", str(hand_run))
    page = (hand_run / "report.html").read_text(encoding="utf-8")
    head = page.split('id="headline-data"', 1)[1].split("</table>", 1)[0]
    counts = [int(a["data-count"]) for a in Page(head).find("strong") if a.get("data-count")]
    walk = json.loads((hand_run / "walks.manifest.json").read_text())
    corpus = json.loads((hand_run / "sft_corpus" / "manifest.json").read_text())
    assert counts[0] == walk["accepted"] and counts[-1] == corpus["accepted"] > 0
    assert "<code>sft_corpus</code>" in head


def test_type_intervals_come_from_the_predictions(tmp_path):
    """Hits@1 by type with the interval eval computes: Wilson over one run's 0/1 scores."""
    (tmp_path / "metrics.json").write_text(json.dumps({"breakdowns": {
        "hops": {"1": {}}, "qtype": {"x": {"questions": 5, "hits_at_1": 0.6},
                                     "y": {"questions": 2, "hits_at_1": 0.0}}}}))  # fmt: skip
    rows = [{"question_id": f"q{i}", "system": "model", "qtype": "x", "hits_at_1": float(i < 3)}
            for i in range(5)]  # fmt: skip
    rows += [{"question_id": f"r{i}", "system": "model", "qtype": "y", "hits_at_1": 0.0}
             for i in range(2)]  # fmt: skip
    rows += [{"question_id": "q9", "system": "untrained", "qtype": "x", "hits_at_1": 1.0}]
    table = pa.Table.from_pylist(rows, schema=pa.schema(
        [PREDICTION_SCHEMA.field(n) for n in ("question_id", "system", "qtype", "hits_at_1")]))  # fmt: skip
    pq.write_table(table, tmp_path / "predictions.parquet")
    got = type_rows(tmp_path)["qtype"]
    assert got["x"]["ci95"] == pytest.approx(list(wilson_interval(3, 5)))
    assert got["y"]["ci95"] == pytest.approx(list(wilson_interval(0, 2)))
    assert got["x"]["hits_at_1"] == 0.6 and "hops" not in type_rows(tmp_path)


@pytest.fixture(scope="module")
def comparison(runner_run, hand_run) -> tuple[Path, str]:
    invoke("report", str(runner_run), str(hand_run))
    out = runner_run / f"compare_{hand_run.name}.html"
    return out, out.read_text(encoding="utf-8")


def test_two_runs_side_by_side(runner_run, hand_run, comparison):
    text = comparison[1]
    parsed = Page(text)
    assert not parsed.mismatched and not parsed.stack
    tables = [a.get("id") for t, a in parsed.tags if t == "table"]
    assert tables[0] == "headline-evals"
    evals = text.split('id="headline-evals"', 1)[1].split("</table>", 1)[0]
    # A's row, B's row and B - A, overall and by hops
    assert evals.count('<strong data-value="0.25">') == 2
    assert evals.count('<strong data-value="0.5">') == 2
    deltas = [a["data-delta"] for a in Page(evals).find("span") if a.get("data-delta")]
    assert deltas == ["0.25", "0.25"]
    # funnels paired by kind in the order they ran, whatever the folders are called
    pairs = [a["data-kind"] for a in parsed.find("div") if a.get("class") == "pair"]
    assert pairs == ["walk", "synthesize questions", "synthesize trajectories", "filter",
                     "walk", "synthesize questions"]  # fmt: skip
    data = text.split('id="headline-data"', 1)[1].split("</table>", 1)[0]
    assert "<code>corpus</code>" in data and "<code>sft_corpus</code>" in data
    assert "<code>val/walks.parquet</code>" in data
    # the training curves overlaid: one chart, a line for each run
    curves = text.split('data-stage="curves"', 1)[1]
    series = [a["data-series"] for a in parsed.find("polyline")]
    assert series == ["A", "B"] and "loss (A: 10 points; B: 10 points)" in curves
    # one run still gives the one-run page
    invoke("report", str(runner_run))
    assert "data-missing" in (runner_run / "report.html").read_text(encoding="utf-8")


def test_the_comparison_cli_checks_its_arguments(runner_run, hand_run, comparison, tmp_path):
    res = runner.invoke(app, ["report", str(runner_run), str(hand_run)])
    assert res.exit_code == 2 and "--overwrite" in res.output
    res = runner.invoke(app, ["report", str(runner_run), str(hand_run), str(tmp_path)])
    assert res.exit_code == 2 and "got 3" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = runner.invoke(app, ["report", str(runner_run), str(tmp_path)])
    assert res.exit_code == 2 and "not a kgsynth run" in res.output and str(tmp_path) in res.output


def test_the_comparisons_headline_is_on_the_first_screen(browser, comparison, tmp_path):  # noqa: F811
    boxes = first_screen(browser, comparison[0], tmp_path)
    top, bottom = boxes["headline-evals"]
    assert 0 < top < bottom <= 800, boxes
    assert boxes["headline"][0] < top
    assert all(b[0] >= boxes["headline"][1] for k, b in boxes.items()
               if not k.startswith("headline")), boxes  # fmt: skip
