"""``synthesize trajectories --questions BENCHMARK.json`` (issue 18, part 5): a benchmark's gold
logical forms are the oracle's actions (and the references of referenced rejection sampling),
on the Freebase-schema fixture KG: GrailQA's S-expressions in KBQA-R1's action space, WebQSP's
path SPARQL in GraphWalker's; questions that cannot be used are counted by reason."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.cli import app
from kgsynth.datasets.benchmarks import read_benchmark
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.open import open_kg
from kgsynth.metrics import normalize_answer
from kgsynth.synthesize.benchmark_questions import benchmark_question_rows, is_benchmark_file

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "benchmarks"


@pytest.fixture(scope="module")
def store(fb_small_store) -> Path:
    return fb_small_store


def _oracle(store: Path, tmp: Path, name: str, tools: str, mode: str = "oracle") -> Path:
    out = tmp / f"{tools}-{name}.parquet"
    args = ["synthesize", "trajectories", "--questions", str(FIXTURES / f"{name}.json")]
    args += ["--kg", str(store), "--toolset", tools, "--mode", mode, "--llm", "template"]
    res = CliRunner().invoke(app, [*args, "--split", "all", "--no-cache", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _norm(names) -> set[str]:
    return {normalize_answer(n) for n in names}


def test_grailqa_s_expressions_replay_in_kbqa_r1_actions(store, tmp_path):
    out = _oracle(store, tmp_path, "grailqa", "sexpr")
    rows = pq.read_table(out).to_pylist()
    records = read_benchmark(FIXTURES / "grailqa.json")
    assert len(rows) == len(records) == 5  # every question, with or without a topic entity
    for r in rows:
        assert _norm(r["predicted_answers"]) == _norm(r["gold_answers"])
        assert all(c.split(" [")[0] in {"Find_relation", "Merge", "Order", "Count", "Compare",
                                        "Time_constraint"} for c in r["tool_calls"])  # fmt: skip
    assert any(c.startswith("Count") for r in rows for c in r["tool_calls"])
    assert any(c.startswith("Order [ argmax") for r in rows for c in r["tool_calls"])
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert manifest["benchmarks"]["format"] == "grailqa"
    assert manifest["benchmarks"]["usable"] == 5


def test_webqsp_paths_replay_in_graphwalker_actions_and_the_rest_are_counted(store, tmp_path):
    out = _oracle(store, tmp_path, "webqsp", "graphwalker")
    rows = pq.read_table(out).to_pylist()
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    bench = manifest["benchmarks"]
    assert bench["questions"] == 6
    assert bench["usable"] + sum(bench["left_out"].values()) == 6 and bench["left_out"]
    assert all(k.startswith("benchmark_") for k in bench["left_out"])
    assert len(rows) + manifest["rejected"] == bench["usable"] and rows
    for r in rows:
        assert r["tool_calls"][0].startswith("get_relations(")
        assert _norm(r["predicted_answers"]) <= _norm(r["gold_answers"])


def test_question_rows_by_mode_and_tool_set(store):
    graph = KGGraph(open_kg(store))
    grail = read_benchmark(FIXTURES / "grailqa.json")
    free, left = benchmark_question_rows(grail, graph, "graphwalker", "free")
    # free rollouts need a topic entity to start from; GrailQA's questions may have none
    assert len(free) + left["no_topic_entity"] == len(grail) and left["no_topic_entity"] >= 1
    walks, left = benchmark_question_rows(grail, graph, "graphwalker", "oracle")
    assert all(k.startswith("benchmark_") for k in left) and "benchmark_class_constraint" in left
    assert all(r["branches"] for r in walks)
    _, left = benchmark_question_rows(grail, graph, "isp", "referenced")
    assert left["no_reference"] > 0
    cwq = read_benchmark(FIXTURES / "cwq.json")
    rows, _ = benchmark_question_rows(cwq, graph, "graphwalker", "free")
    assert rows and all(r["topic_names"] for r in rows)  # CWQ's topics by id, named from the KG
    assert is_benchmark_file("x/grailqa_dev.json.gz") and not is_benchmark_file("q.parquet")
