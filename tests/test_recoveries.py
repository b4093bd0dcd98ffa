"""benchmarks/recoveries.py: where a failed rollout leaves the oracle's replay, what kind of
mistake it is, and a recovery built through the real tools on a small KG."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from kgsynth.cli import app
from tests.kgfixtures import build_pipeline_inputs

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "recoveries.py"
spec = importlib.util.spec_from_file_location("recoveries", SCRIPT)
rec = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rec)


def test_first_divergence_is_where_both_call_differently() -> None:
    o = ["a", "b", "c", None]
    assert rec.first_divergence(["a", "x", "c", None], o) == 1
    assert rec.first_divergence(["a", "b", "c", None], o) is None  # same calls: went wrong later
    assert rec.first_divergence(["a", None], o) is None  # answered early: no wrong call
    assert rec.first_divergence(["a", "b", "x", None], o) == 2
    assert rec.first_divergence(["a", "b", "c", "d"], o) is None  # the replay answers there
    assert rec.first_divergence(["x"], o) == 0


def test_divergence_kinds() -> None:
    t = 'get_triples("A", ["r"])'
    assert rec.divergence_kind('get_triples("A", ["s"])', t, None) == "relation"
    assert rec.divergence_kind('get_relations("B")', 'get_relations("A")', {}) == "entity"
    assert rec.divergence_kind('get_relations("A")', t, None) == "other"
    assert rec.divergence_kind('get_triples("Ax", ["r"])', t, {"tool_error": "x"}) == "error"


def test_a_recovery_through_the_tools(tmp_path: Path, capsys) -> None:
    """A rollout that calls a name the KG lacks at its second step: the recovery keeps the
    replay's first step, the wrong call as context only with the tools' error, then the
    replay's steps and answer."""
    paths = build_pipeline_inputs(tmp_path, walks=4, structures="chain-2")
    run = tmp_path / "run"
    (run / "questions").mkdir(parents=True)
    shutil.copy(paths["questions"], run / "questions" / "questions.parquet")
    res = CliRunner().invoke(app, [
        "synthesize", "trajectories", "--config", str(rec.RECIPE), "--section", "heldout_oracle",
        "--split", "all", "--questions", str(paths["questions"]), "--kg", str(paths["store"]),
        "--llm", "template", "--out", str(run / "stage2_data" / "oracle.parquet"),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    replay = pq.read_table(run / "stage2_data" / "oracle.parquet").to_pylist()[0]
    turns, calls = rec.calls_of(replay["messages"])
    assert len(calls) >= 3
    wrong = '<think>I list the relations of Nobody.</think>\n<kg-query>get_relations("Nobody At All")</kg-query>'
    rollout = {
        "question_id": replay["question_id"],
        "messages": [*replay["messages"][:4], {"role": "assistant", "content": wrong},
                     {"role": "tool", "content": "<information>Error</information>"},
                     {"role": "assistant", "content": '<answer>["x"]</answer>'}],
        "predicted_answers": ["x"],
        "gold_answers": replay["gold_answers"],
        "turns": [{"tool_error": None}, {"tool_error": "entity_not_found"}, {}],
    }  # fmt: skip
    succeeded = {**rollout, "predicted_answers": replay["gold_answers"]}
    got, tally = rec.build(run, [rollout, rollout, succeeded], {"error"}, str(paths["store"]))
    assert tally["recoveries"] == 1 and tally["left out: repeat"] == 1
    assert tally["succeeded"] == 1
    (messages,) = got
    assert messages[:4] == replay["messages"][:4]
    assert messages[4] == {"role": "assistant", "content": wrong, "train": False}
    assert messages[5]["role"] == "tool" and "Error" in messages[5]["content"]
    assert messages[6:] == replay["messages"][4:]
    # only relation mistakes asked for: the error is left out
    assert rec.build(run, [rollout], {"relation"}, str(paths["store"]))[0] == []
    # the corpus reads back with the mark, after a base corpus
    out = tmp_path / "c.parquet"
    rec.write_corpus(out, [replay["messages"], messages])
    from kgsynth.train.data import read_corpus

    base, back = read_corpus(out)
    assert [m.get("train") for m in back].count(False) == 1 and len(base) == len(turns) * 2 + 1
