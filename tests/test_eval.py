"""kgsynth eval: aggregation on hand-made predictions (majority, first run, union, pass@k,
breakdowns), the shipped MetaQA dev sample, the agent and no-tools runs with a scripted policy,
the untrained-model chain, the compare table, and the CLI end to end with a tiny hf model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.agent.config import AgentConfig
from kgsynth.cli import app
from kgsynth.core.errors import ConfigError, InputFileError
from kgsynth.datasets.qafiles import QARecord, hops_of_qtype, read_questions
from kgsynth.eval.checkpoints import untrained_model
from kgsynth.eval.compare import compare_markdown, compare_runs
from kgsynth.eval.config import METRIC_LEGEND, UNION_LABEL, EvalConfig, check_records
from kgsynth.eval.paired import paired_markdown, paired_rows
from kgsynth.eval.scoring import majority_choice, pass_at_k, pass_ks, summarize, union_answers
from kgsynth.eval.subjects import evaluate
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM, Completion
from kgsynth.metrics import bootstrap_interval, score
from kgsynth.resources import dev_sample
from tests.kgfixtures import movie_kg, movie_ntriples

ROOT = Path(__file__).resolve().parents[1]
DEV_SAMPLE = dev_sample()
METAQA = ROOT.parent / "shared" / "data" / "metaqa"


# --- aggregation on hand-made predictions --------------------------------------------------


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # fewer wrong runs than k: always a hit
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    assert pass_ks(1) == [1]
    assert pass_ks(5) == [1, 2, 4, 5]
    assert pass_ks(8) == [1, 2, 4, 8]


def test_majority_vote_and_union():
    # sets are compared normalized and unordered; "B" and "the b" are one vote
    assert majority_choice([["A"], ["B"], ["the b"], []]) == 1
    assert majority_choice([["A", "B"], ["C"], ["b", "a"]]) == 0
    assert majority_choice([["A"], ["B"]]) == 0  # tie: the first run
    assert majority_choice([[], ["X"], ["Y"]]) == 1  # runs without an answer do not vote
    assert majority_choice([[], []]) == 0
    assert union_answers([["A", "B"], ["the A", "C"], []]) == ["A", "B", "C"]


def _row(qid: str, run: int, predicted: list[str], gold: list[str], **extra) -> dict:
    s = score(predicted, gold)
    return {
        "question_id": qid,
        "run": run,
        "predicted": predicted,
        "gold": gold,
        "em_strict": s.em_strict,
        "hit": s.hit,
        "f1": s.f1,
        "hits_at_1": s.hits_at_1,
        "rhits_at_1": s.rhits_at_1,
        "precision": s.precision,
        "recall": s.recall,
        **extra,
    }


def hand_rows() -> list[dict]:
    q1 = {"hops": 1, "structure": "chain-1", "num_turns": 2, "generated_tokens": 10}
    q2 = {"hops": 2, "structure": None, "num_turns": 4, "generated_tokens": 30, "tool_errors": 1}
    return [
        _row("q1", 0, ["A"], ["A", "B"], **q1),  # EM 0, F1 2/3, Hits@1 1
        _row("q1", 1, ["B", "A"], ["A", "B"], **q1),  # EM 1
        _row("q1", 2, ["C"], ["A", "B"], **q1),  # all 0
        _row("q2", 0, [], ["X"], **q2),
        _row("q2", 1, ["Y"], ["X"], **q2),
        _row("q2", 2, ["X"], ["X"], **q2),  # EM 1
    ]


def test_summarize_hand_made_predictions():
    m = summarize(hand_rows())
    assert m["counts"] == {"questions": 2, "runs": 3, "predictions": 6}
    assert m["overall"]["em_strict"] == pytest.approx(2 / 6)
    assert m["overall"]["hit"] == pytest.approx(3 / 6)  # q1 runs 0 and 1, q2 run 2
    assert m["overall"]["f1"] == pytest.approx((2 / 3 + 1 + 1) / 6)
    assert m["overall"]["hits_at_1"] == pytest.approx(3 / 6)
    assert m["overall"]["rhits_at_1"] == pytest.approx(3 / 6)
    assert [r["em_strict"] for r in m["per_run"]] == [0.0, 0.5, 0.5]
    assert m["per_run"][0]["f1"] == pytest.approx(1 / 3)
    assert m["first_run"] == {k: m["per_run"][0][k] for k in m["first_run"]}
    assert m["std_over_runs"]["em_strict"] == pytest.approx(0.288675, abs=1e-6)
    # majority: q1 is a three-way tie -> run 0 ["A"]; q2: the empty run 0 does not vote,
    # {Y} and {X} tie -> run 1 ["Y"]
    assert m["majority"]["em_strict"] == 0.0
    assert m["majority"]["f1"] == pytest.approx((2 / 3 + 0) / 2)
    assert m["majority"]["hits_at_1"] == pytest.approx(0.5)
    # union: q1 [A, B, C] -> P 2/3, R 1, F1 0.8; q2 [Y, X] -> F1 2/3. KG-R1's N-run Hits@1
    # counts a question when any answer of the union is gold: both do (Y coming first in q2's
    # union does not matter; the union has no first answer)
    assert m["union"]["label"] == UNION_LABEL
    assert m["union"]["em_strict"] == 0.0
    assert m["union"]["f1"] == pytest.approx((0.8 + 2 / 3) / 2, abs=1e-6)
    assert m["union"]["hits_at_1"] == 1.0 and m["union"]["hit"] == 1.0
    assert m["union"]["rhits_at_1"] == pytest.approx((2 / 3 + 1 / 2) / 2, abs=1e-6)
    assert m["union"]["mean_answers"] == pytest.approx(2.5)
    # pass@k by hit: q1 n = 3, c = 2 (runs 0 and 1); q2 n = 3, c = 1.
    # pass@1 = (2/3 + 1/3) / 2; pass@2 = (1 + (1 - C(2,2)/C(3,2))) / 2 = (1 + 2/3) / 2
    assert m["pass_at_k_metric"] == "hit"
    assert m["pass_at_k"] == {
        "1": pytest.approx(0.5, abs=1e-6),
        "2": pytest.approx(5 / 6, abs=1e-6),
        "3": 1.0,
    }
    by_hops = m["breakdowns"]["hops"]
    assert list(by_hops) == ["1", "2"]
    assert by_hops["1"]["questions"] == 1
    assert by_hops["1"]["f1"] == pytest.approx((2 / 3 + 1) / 3, abs=1e-6)
    assert by_hops["2"]["em_strict"] == pytest.approx(1 / 3, abs=1e-6)
    # 95 % CI, the question as the unit: both questions' mean strict EM over runs is 1/3 (no
    # spread to resample); F1 5/9 and 1/3, Hits@1 (and Hit, RHits@1) 2/3 and 1/3: a
    # two-question bootstrap spans both
    assert m["ci95"] == {
        "em_strict": [0.333333, 0.333333],
        "hit": [0.333333, 0.666667],
        "f1": [0.333333, 0.555556],
        "hits_at_1": [0.333333, 0.666667],
        "rhits_at_1": [0.333333, 0.666667],
    }
    assert "bootstrap" in m["ci95_method"] and "Wilson" in m["ci95_method"]
    # one question per hop group: its interval is its mean
    assert by_hops["1"]["ci95"]["f1"] == [0.555556, 0.555556]
    assert by_hops["2"]["ci95"]["hits_at_1"] == [0.333333, 0.333333]
    assert list(m["breakdowns"]["structure"]) == ["chain-1", "unknown"]
    assert "ci95" not in m["breakdowns"]["structure"]["chain-1"]  # intervals by hops only
    assert "qtype" not in m["breakdowns"]  # no question carries one
    p = m["process"]
    assert (p["turns_per_question"], p["generated_tokens_per_question"]) == (3.0, 20.0)
    assert p["tool_errors_per_question"] == pytest.approx(0.5)


def test_single_run_aggregates_agree():
    rows = [r for r in hand_rows() if r["run"] == 1]
    m = summarize(rows)
    assert m["counts"]["runs"] == 1 and m["pass_at_k"] == {"1": 0.5}
    for agg in ("first_run", "majority"):
        assert m[agg] == m["overall"]
    assert {k: m["union"][k] for k in m["overall"]} == m["overall"]
    # one run of 0/1 scores (q1 right, q2 wrong): Wilson score intervals, 1 of 2 and by hops
    # 1 of 1 and 0 of 1
    shown = ("em_strict", "hit", "f1", "hits_at_1", "rhits_at_1")
    assert m["ci95"] == {k: [0.094531, 0.905469] for k in shown}
    assert m["breakdowns"]["hops"]["1"]["ci95"]["em_strict"] == [0.206549, 1.0]
    assert m["breakdowns"]["hops"]["2"]["ci95"]["hit"] == [0.0, 0.793451]


# --- the shipped dev sample --------------------------------------------------------------


def test_dev_sample_parses_with_hops_and_types():
    recs = read_questions(DEV_SAMPLE)
    assert len(recs) == 300
    assert Counter(r.hops for r in recs) == {1: 100, 2: 100, 3: 100}
    # interleaved, so that --limit K takes every hop count
    assert [r.hops for r in recs[:6]] == [1, 2, 3, 1, 2, 3]
    check_records(recs, DEV_SAMPLE)
    for r in recs:
        assert r.hops == hops_of_qtype(r.qtype)
        assert r.topic_names and all(f"[{t}]" in r.raw_question for t in r.topic_names)
        assert "[" not in r.question and r.answer_names
        assert r.question_id.startswith(f"metaqa-dev-{r.hops}hop-L")
    assert len({r.question_id for r in recs}) == 300


@pytest.mark.skipif(not METAQA.is_dir(), reason=f"MetaQA data not found at {METAQA}")
def test_dev_sample_is_drawn_from_consistent_dev_questions_and_regenerates(tmp_path):
    rows = [json.loads(line) for line in DEV_SAMPLE.read_text().splitlines()]
    for hops in (1, 2, 3):
        lines = (METAQA / f"{hops}-hop" / "vanilla" / "qa_dev.txt").read_text().splitlines()
        consistent = set((METAQA / "derived" / f"consistent_dev_{hops}hop.idx").read_text().split())
        for row in (r for r in rows if r["hops"] == hops):
            question, answers = lines[row["source_line"] - 1].split("\t")
            assert (row["question"], row["answer_names"]) == (question, answers.split("|"))
            assert str(row["source_line"] - 1) in consistent
    out = tmp_path / "sample.jsonl"
    subprocess.run(
        [
            sys.executable,
            str(DEV_SAMPLE.parents[1] / "make_dev_sample.py"),
            "--out",
            str(out),
            "--metaqa",
            str(METAQA),
        ],
        check=True,
        capture_output=True,
    )
    assert out.read_bytes() == DEV_SAMPLE.read_bytes()


@pytest.mark.skipif(not METAQA.is_dir(), reason=f"MetaQA data not found at {METAQA}")
def test_the_check_sample_shares_no_question_with_the_dev_sample_and_regenerates(tmp_path):
    script = str(DEV_SAMPLE.parents[1] / "make_dev_sample.py")
    check = DEV_SAMPLE.parents[1] / "dev_check" / "metaqa_dev_check.jsonl"
    out = tmp_path / "check.jsonl"
    cmd = [sys.executable, script, "--metaqa", str(METAQA), "--seed", "1"]
    cmd += ["--exclude", str(DEV_SAMPLE), "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    assert out.read_bytes() == check.read_bytes()
    rows = [json.loads(line) for line in check.read_text().splitlines()]
    ids = {r["question_id"] for r in rows}
    assert len(ids) == 300 and Counter(r["hops"] for r in rows) == {1: 100, 2: 100, 3: 100}
    assert not ids & {
        json.loads(line)["question_id"] for line in DEV_SAMPLE.read_text().splitlines()
    }
    # the exclusion is what changes the draw: seed 1 without it draws other questions
    subprocess.run([*cmd[:6], "--out", str(out)], check=True, capture_output=True)
    again = {json.loads(line)["question_id"] for line in out.read_text().splitlines()}
    assert again != ids
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": "x"}\n')
    done = subprocess.run(
        [*cmd[:6], "--exclude", str(bad), "--out", str(out)], capture_output=True, text=True
    )
    assert done.returncode != 0 and f"{bad}, line 1: needs source and source_line" in done.stderr


# --- agent and no-tools runs with a scripted policy ---------------------------------------


class ScriptedPolicy(LLM):
    """Replies by (question, run seed, turn); no-tools requests get ``no_tools`` replies."""

    backend = "scripted"
    model = "script"

    def __init__(self, scripts: dict, no_tools: dict | None = None) -> None:
        super().__init__()
        self.scripts = scripts
        self.no_tools = no_tools or {}

    def generate_batch(self, requests, progress=None):
        out = []
        for i, r in enumerate(requests):
            msgs = r.message_dicts()
            question = msgs[1]["content"].split("\n")[0].removeprefix("Question: ")
            if r.task == "no_tools_answer":
                text = self.no_tools[(question, r.params.seed)]
            else:
                turns = self.scripts[(question, r.params.seed)]
                text = turns[min(sum(m["role"] == "assistant" for m in msgs), len(turns) - 1)]
            c = Completion(text, completion_tokens=len(text.split()))
            self.stats.add(c)
            out.append(c)
            if progress:
                progress(i, c)
        return out


def _record(question: str, topic: str, answers: list[str], line: int, hops: int) -> QARecord:
    return QARecord(question, question, [topic], answers, None, hops, line)


KISMET = _record("who directed Kismet", "Kismet", ["William Dieterle"], 1, 1)
JUAREZ = _record("what genre is Juarez", "Juarez", ["Drama"], 2, 1)


class LoopingPolicy(LLM):
    """Greedy turns copy a name in a loop until the token cap (no closing tag); a sample at
    another temperature closes its action, except for the questions in ``stuck``."""

    backend = "scripted"
    model = "loops"

    def __init__(self, stuck: set[str]) -> None:
        super().__init__()
        self.stuck = stuck
        self.seen: list[tuple[str, int, float, int | None]] = []

    def generate_batch(self, requests, progress=None):
        out = []
        for r in requests:
            msgs = r.message_dicts()
            question = msgs[1]["content"].split("\n")[0].removeprefix("Question: ")
            turn = sum(m["role"] == "assistant" for m in msgs)
            p = r.params
            self.seen.append((question, turn, p.temperature, p.seed))
            if p.temperature == 0 or question in self.stuck:
                text, n = "<think>I list the relations of Kismetmet met met met", p.max_tokens
            elif turn == 0:
                text = '<think>x</think><kg-query>get_triples("Kismet", ["directed_by"])</kg-query>'
                n = 5
            else:
                text, n = '<think>found</think><answer>["William Dieterle"]</answer>', 3
            out.append(Completion(text, completion_tokens=n))
        return out


@pytest.mark.parametrize("budget", [0, 2])
def test_a_turn_cut_in_a_copy_loop_is_sampled_again(budget: int):
    """--resample-cut-turns N: a turn that fills the token cap without closing its action is
    sampled again at --resample-temperature (seed + try) until one closes, at most N new
    samples an episode; the closing sample replaces it and its tokens count too. A question
    whose samples all loop keeps the cut turn, and spends no more once its budget is gone."""
    fixed = _record("who directed Kismet", "Kismet", ["William Dieterle"], 1, 1)
    stuck = _record("what genre is Juarez", "Juarez", ["Drama"], 2, 1)
    llm = LoopingPolicy({stuck.question})
    cfg = EvalConfig(
        agent=AgentConfig(max_turns=3, max_turn_tokens=8, resample_cut_turns=budget), seed=5
    )
    rows, m = evaluate([fixed, stuck], llm, KGGraph(movie_kg()), cfg)
    by = {r["question"]: r for r in rows}
    hot = [s for s in llm.seen if s[2] != 0.0]
    if budget == 0:
        assert not hot and by[fixed.question]["hits_at_1"] == 0.0
        assert by[fixed.question]["format_errors"] == 4
        return
    first = by[fixed.question]
    # both of its greedy turns loop; each is replaced by its first new sample
    assert first["hits_at_1"] == 1.0 and first["format_errors"] == 0 and first["resamples"] == 2
    assert first["messages"][2]["content"].endswith("</kg-query>")
    assert first["generated_tokens"] == (8 + 5) + (8 + 3)
    assert [(t, seed) for q, t, _, seed in hot if q == fixed.question] == [(0, 6), (1, 6)]
    loops = by[stuck.question]
    assert loops["resamples"] == 2 and loops["format_errors"] == 4
    assert [(t, seed) for q, t, _, seed in hot if q == stuck.question] == [(0, 6), (0, 7)]
    assert loops["messages"][2]["content"].startswith("<think>I list the relations of Kismetmet")
    assert m["process"]["resamples_per_question"] == 2.0


def test_agent_runs_scored_with_tools_errors_and_tokens():
    q = '<think>look it up</think><kg-query>get_triples("Kismet", ["directed_by"])</kg-query>'
    scripts = {
        ("who directed Kismet", 7): [
            q,
            '<think>found</think><answer>["William Dieterle"]</answer>',
        ],
        ("who directed Kismet", 8): [
            '<think>x</think><kg-query>get_relations("Nobody Here")</kg-query>',
            '<think>guess</think><answer>["Ronald Colman"]</answer>',
        ],
        ("what genre is Juarez", 7): ["no protocol at all"],
        ("what genre is Juarez", 8): ['<think>g</think><answer>["drama"]</answer>'],
    }
    cfg = EvalConfig(runs=2, temperature=1.0, agent=AgentConfig(max_turns=3), seed=7)
    rows, m = evaluate([KISMET, JUAREZ], ScriptedPolicy(scripts), KGGraph(movie_kg()), cfg)
    by = {(r["question_id"], r["run"]): r for r in rows}
    assert len(rows) == 4
    k0, k1 = by[("line-1", 0)], by[("line-1", 1)]
    assert (k0["em_strict"], k0["num_turns"], k0["tool_errors"], k0["answered"]) == (
        1.0,
        2,
        0,
        True,
    )
    assert k0["tool_calls"] == ['get_triples("Kismet", ["directed_by"])']
    assert [msg["role"] for msg in k0["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    # tokens: the backend's completion counts, summed over the episode's turns
    assert k0["generated_tokens"] == len(q.split()) + 2
    assert (k1["em_strict"], k1["tool_errors"], k1["predicted"]) == (0.0, 1, ["Ronald Colman"])
    j0 = by[("line-2", 0)]
    assert (j0["answered"], j0["forced_answer"], j0["num_turns"]) == (False, True, 4)
    assert j0["format_errors"] == 4 and j0["predicted"] == []
    assert by[("line-2", 1)]["em_strict"] == 1.0  # normalized: "drama" == "Drama"
    assert m["overall"]["em_strict"] == 0.5 and m["first_run"]["em_strict"] == 0.5
    assert m["majority"]["em_strict"] == 1.0  # Kismet: tie -> run 0; Juarez: only run 1 answered
    assert m["union"]["em_strict"] == 0.5 and m["union"]["f1"] == pytest.approx((2 / 3 + 1) / 2)
    # Kismet's union [William Dieterle, Ronald Colman] holds the gold director: a hit
    assert m["union"]["hits_at_1"] == 1.0
    assert m["pass_at_k"] == {"1": 0.5, "2": 1.0}
    assert m["process"]["tool_errors_per_question"] == 0.25
    assert m["speed"]["questions_per_s"] > 0 and m["system"] == "model"


def test_no_tools_baseline_answers_directly():
    no_tools = {
        ("who directed Kismet", 0): '<think>I recall</think><answer>["William Dieterle"]',
        ("what genre is Juarez", 0): "Drama, I think",
    }
    rows, m = evaluate(
        [KISMET, JUAREZ],
        ScriptedPolicy({}, no_tools),
        None,
        EvalConfig(),
        system="no-tools",
        tools=False,
    )
    kismet, juarez = rows
    # the API's stop sequence removed </answer>; it is restored before parsing
    assert kismet["messages"][-1]["content"].endswith("</answer>")
    assert (kismet["em_strict"], kismet["num_turns"], kismet["tool_calls"]) == (1.0, 1, [])
    assert (juarez["answered"], juarez["format_errors"], juarez["em_strict"]) == (False, 1, 0.0)
    assert m["overall"]["em_strict"] == 0.5 and m["tools"] is None and m["system"] == "no-tools"


def test_config_and_record_checks_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="--runs"):
        EvalConfig(runs=0)
    with pytest.raises(ConfigError, match="--tools"):
        EvalConfig(agent=AgentConfig(toolset="sql"))
    bad = QARecord("q", "q", ["T"], [], None, None, 5)
    with pytest.raises(InputFileError, match=r"q\.jsonl:5: field answer_names is empty"):
        check_records([KISMET, bad], tmp_path / "q.jsonl")
    no_topic = QARecord("q", "q", [], ["A"], None, None, 2)
    with pytest.raises(InputFileError, match=r"q\.jsonl:2: field topic_names"):
        check_records([no_topic], tmp_path / "q.jsonl")
    twice = [QARecord("q", "q", ["T"], ["A"], None, None, n, None, "id-1") for n in (1, 4)]
    with pytest.raises(
        InputFileError, match=r"q\.jsonl:4: field question_id 'id-1' repeats line 1"
    ):
        check_records(twice, tmp_path / "q.jsonl")


def _checkpoint(path: Path, start_from: str | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    if start_from is not None:
        manifest = {"stage": "train x", "start_from": {"path": start_from}}
        (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_untrained_model_follows_the_start_from_chain(tmp_path):
    base = _checkpoint(tmp_path / "base")
    stage1 = _checkpoint(tmp_path / "run" / "stage1", str(base))
    stage2 = _checkpoint(tmp_path / "run" / "stage2", str(stage1))
    assert untrained_model(stage2) == base
    # a tiny run's init-tiny, named by a relative path from another working directory
    tiny = _checkpoint(tmp_path / "moved" / "stage1", "runs/elsewhere/stage1/init-tiny")
    _checkpoint(tiny / "init-tiny")
    assert untrained_model(tiny) == tiny / "init-tiny"
    with pytest.raises(ConfigError, match=r"no manifest\.json with start_from"):
        untrained_model(base)
    lost = _checkpoint(tmp_path / "lost", "/nowhere/model")
    with pytest.raises(ConfigError, match="not a checkpoint folder here"):
        untrained_model(lost)


def test_untrained_model_checks_the_recorded_weights(tmp_path):
    from kgsynth.core.manifest import sha256_file

    elsewhere = _checkpoint(tmp_path / "runs" / "stage1" / "init-tiny")
    (elsewhere / "model.safetensors").write_bytes(b"someone else's newer run")
    moved = _checkpoint(tmp_path / "moved" / "stage1", str(elsewhere))
    inside = _checkpoint(moved / "init-tiny")
    (inside / "model.safetensors").write_bytes(b"the weights stage1 started from")
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["start_from"]["weights_sha256"] = sha256_file(inside / "model.safetensors")
    (moved / "manifest.json").write_text(json.dumps(manifest))
    # the path as written exists but holds other weights: the copy inside the folder is used
    assert untrained_model(moved) == inside
    (inside / "model.safetensors").write_bytes(b"changed")
    with pytest.raises(ConfigError, match="does not hold the weights"):
        untrained_model(moved)


# --- compare --------------------------------------------------------------------------------


def _metrics_dir(path: Path, label: str, rows: list[dict], *, nested: bool = False) -> Path:
    folder = path / "eval" if nested else path
    folder.mkdir(parents=True)
    metrics = {"label": label, **summarize(rows), "baselines": {}}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return path


def _without_intervals(path: Path) -> Path:
    """A metrics.json as written before eval reported confidence intervals."""
    metrics = json.loads((path / "metrics.json").read_text())
    del metrics["ci95"], metrics["ci95_method"]
    for group in metrics["breakdowns"]["hops"].values():
        del group["ci95"]
    (path / "metrics.json").write_text(json.dumps(metrics))
    return path


COMPARE_MD = f"""\
| run | questions | runs | EM (strict) | Hit | F1 | Hits@1 | RHits@1 | {UNION_LABEL} Hits@1 |
|---|---|---|---|---|---|---|---|---|
| stage1 | 2 | 1 | 0.000 [0.000, 0.658] | 0.500 [0.095, 0.905] | 0.333 [0.000, 0.667] | \
0.500 [0.095, 0.905] | 0.500 [0.095, 0.905] | – |
| stage2 | 2 | 3 | 0.333 [0.333, 0.333] | 0.500 [0.333, 0.667] | 0.444 [0.333, 0.556] | \
0.500 [0.333, 0.667] | 0.500 [0.333, 0.667] | 1.000 |
| old | 2 | 3 | 0.333 | 0.500 | 0.444 | 0.500 | 0.500 | 1.000 |

## Hits@1 by hops with 95 % CI

| run | 1-hop | 2-hop |
|---|---|---|
| stage1 | 1.000 [0.207, 1.000] | 0.000 [0.000, 0.793] |
| stage2 | 0.667 [0.667, 0.667] | 0.333 [0.333, 0.333] |
| old | 0.667 | 0.333 |

## EM (strict) / Hit / F1 / Hits@1 / RHits@1 by hops

| run | 1-hop | 2-hop |
|---|---|---|
| stage1 | 0.000 / 1.000 / 0.667 / 1.000 / 1.000 | 0.000 / 0.000 / 0.000 / 0.000 / 0.000 |
| stage2 | 0.333 / 0.667 / 0.556 / 0.667 / 0.667 | 0.333 / 0.333 / 0.333 / 0.333 / 0.333 |
| old | 0.333 / 0.667 / 0.556 / 0.667 / 0.667 | 0.333 / 0.333 / 0.333 / 0.333 / 0.333 |

`mean [lo, hi]`: the mean and its 95 % CI; Wilson score interval over questions where every \
question scores 0 or 1, else percentile bootstrap over questions with all their runs (2000 \
resamples, seed 0).

{METRIC_LEGEND}

A mean without an interval: its metrics.json predates intervals.
"""


def _predictions(folder: Path, hits: dict[str, list[float]], system: str = "model") -> None:
    """predictions.parquet with ``system``'s Hits@1 of each question over its runs."""
    import polars as pl

    rows = [
        {"system": system, "question_id": q, "run": i, "hits_at_1": h}
        for q, runs in hits.items()
        for i, h in enumerate(runs)
    ]
    pl.DataFrame(rows).write_parquet(folder / "predictions.parquet")


def test_paired_differences_count_questions_that_changed(tmp_path):
    """stage2 - stage1 on the same 8 questions: 3 better, 1 worse, one half better over two
    runs; rl has no predictions.parquet, so rl - stage2 is skipped with the reason."""
    one = _metrics_dir(tmp_path / "stage1", "stage1", [r for r in hand_rows() if r["run"] == 0])
    two = _metrics_dir(tmp_path / "stage2", "stage2", hand_rows())
    three = _metrics_dir(tmp_path / "rl", "rl", hand_rows())
    before = {f"q{i}": [1.0] if i < 4 else [0.0] for i in range(8)}
    after = {**before, "q0": [0.0], "q4": [1.0], "q5": [1.0], "q6": [1.0], "q7": [1.0, 0.0]}
    _predictions(one, before)
    _predictions(two, {**after, "q9": [1.0]})  # a question stage1 did not answer: not paired
    paired = paired_rows(compare_runs([one, two, three]))
    assert paired[0] == {
        "earlier": "stage1",
        "later": "stage2",
        "questions": 8,
        "difference": 0.3125,  # (-1 + 3 + 0.5) / 8
        "ci95": paired[0]["ci95"],
        "better": 4,
        "worse": 1,
        "same": 3,
        "sign_test_p": 0.375,  # 2 * (1 + 5) / 32
    }
    # the percentile bootstrap over the 8 questions' differences, as eval's own intervals
    diffs = [-1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5]
    lo, hi = bootstrap_interval([[d] for d in diffs], resamples=2000, seed=0)
    assert paired[0]["ci95"] == [round(lo, 6), round(hi, 6)] and lo < 0.3125 < hi
    assert paired[1]["later"] == "rl" and "no predictions.parquet" in paired[1]["skipped"]
    md = "\n".join(paired_markdown(paired))
    assert "| stage2 − stage1 | 8 | +0.312 [" in md and "0.375 |" in md
    assert "- rl − stage2: skipped, no predictions.parquet" in md


def test_compare_table_reads_folders_and_nested_eval(tmp_path):
    one = _metrics_dir(tmp_path / "stage1", "stage1", [r for r in hand_rows() if r["run"] == 0])
    two = _metrics_dir(tmp_path / "stage2", "stage2", hand_rows(), nested=True)
    old = _without_intervals(_metrics_dir(tmp_path / "old", "old", hand_rows()))
    rows = compare_runs([one, two, old])
    assert [r["label"] for r in rows] == ["stage1", "stage2", "old"]
    assert rows[0]["union_hits_at_1"] is None and rows[1]["union_hits_at_1"] == 1.0
    assert rows[1]["em_strict"] == pytest.approx(1 / 3, abs=1e-6)
    assert rows[1]["by_hops"]["2"]["em_strict"] == pytest.approx(1 / 3, abs=1e-6)
    assert rows[0]["ci95"]["hits_at_1"] == [0.094531, 0.905469]  # Wilson, 1 of 2
    assert rows[2]["ci95"] == {} and rows[2]["by_hops"]["1"]["ci95"] == {}
    assert compare_markdown(rows) == COMPARE_MD
    # all rows with intervals: no note about older files
    assert "predates" not in compare_markdown(rows[:2])

    res = CliRunner().invoke(
        app,
        ["eval", "--compare", str(one), str(two), str(old), "--out", str(tmp_path / "summary")],
    )
    assert res.exit_code == 0, res.output
    assert "stage2" in res.output
    assert COMPARE_MD in (tmp_path / "summary" / "compare.md").read_text()
    assert (tmp_path / "summary" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    res = CliRunner().invoke(app, ["eval", "--compare", str(one), str(tmp_path)])
    assert res.exit_code == 3 and "no metrics.json" in res.output


# --- the command end to end with a tiny model ----------------------------------------------


@pytest.fixture(scope="module")
def tiny_stage1(tmp_path_factory) -> Path:
    """A 'stage1' folder with a training manifest pointing at its init-tiny (no training)."""
    from kgsynth.agent.loop import system_prompt
    from kgsynth.train.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("tiny-run") / "stage1"
    texts = [
        system_prompt(),
        "who directed Kismet",
        '<think>x</think><answer>["William Dieterle"]</answer>',
        '<kg-query>get_relations("Kismet")</kg-query>',
    ]
    build_tiny_model(texts, root / "init-tiny", vocab_size=400)
    for f in (root / "init-tiny").iterdir():
        shutil.copy(f, root / f.name)
    manifest = {"stage": "train stage1", "start_from": {"path": str(root / "init-tiny")}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def _questions_file(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


QUESTIONS = [
    {
        "question": "who directed [Kismet]",
        "answer_names": ["William Dieterle"],
        "qtype": "movie_to_director",
    },
    {
        "question": "which films did the director of [Juarez] make",
        "answer_names": ["Kismet"],
        "qtype": "movie_to_director_to_movie",
    },
]


@pytest.fixture
def one_torch_thread():
    """One intra-op thread: on a busy 2-core machine two spinning threads make the tiny
    model's generation ~30x slower; the result does not depend on it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_cli_evaluates_a_tiny_checkpoint_with_baselines(tmp_path, tiny_stage1, one_torch_thread):
    kg = tmp_path / "kg.nt"
    kg.write_text(movie_ntriples())
    qfile = _questions_file(tmp_path / "q.jsonl", QUESTIONS)
    out = tmp_path / "eval"
    args = ["eval", "--questions", str(qfile), "--kg", str(kg), "--model", str(tiny_stage1)]
    args += ["--out", str(out), "--runs", "2", "--temperature", "1.0", "--max-turns", "1"]
    args += ["--max-tokens", "6", "--baseline", "untrained", "--baseline", "no-tools"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "stage1" in res.output  # the table's columns wrap at test width: check the file
    saved = json.loads((out / "metrics.json").read_text())
    assert "hits_at_1" in saved["union"] and "2" in saved["pass_at_k"]

    rows = pq.read_table(out / "predictions.parquet").to_pylist()
    assert len(rows) == 2 * 2 * 3  # questions x runs x (model, untrained, no-tools)
    assert Counter(r["system"] for r in rows) == {"model": 4, "untrained": 4, "no-tools": 4}
    model_rows = [r for r in rows if r["system"] == "model"]
    assert {r["model"] for r in model_rows} == {str(tiny_stage1)}
    assert all(r["messages"][0]["role"] == "system" for r in rows)
    assert all(1 <= r["num_turns"] <= 2 and r["generated_tokens"] > 0 for r in model_rows)
    assert sorted(r["hops"] for r in model_rows) == [1, 1, 2, 2]
    assert {r["system"]: r["model"] for r in rows}["untrained"] == str(tiny_stage1 / "init-tiny")

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["label"] == "stage1" and metrics["counts"]["predictions"] == 4
    assert set(metrics["baselines"]) == {"untrained", "no-tools"}
    assert set(metrics["pass_at_k"]) == {"1", "2"}
    assert set(metrics["breakdowns"]) == {"hops", "qtype"}
    assert metrics["process"]["generated_tokens_per_question"] > 0
    assert metrics["config"]["runs"] == 2 and metrics["union"]["label"] == UNION_LABEL
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "eval" and manifest["input"]["rows"] == 2
    assert (out / "eval.png").read_bytes()[:4] == b"\x89PNG"

    res = CliRunner().invoke(app, ["eval", "--compare", str(out), "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert "stage1 · untrained" in res.output
    # each baseline against its model, question by question, from predictions.parquet
    paired = json.loads((tmp_path / "s" / "paired.json").read_text())
    assert [(e["earlier"], e["later"]) for e in paired] == [
        ("stage1 · untrained", "stage1"),
        ("stage1 · no-tools", "stage1"),
    ]
    assert all(e["questions"] == 2 and e["better"] + e["worse"] + e["same"] == 2 for e in paired)
    assert "Stage against stage" in (tmp_path / "s" / "compare.md").read_text()


def test_cli_bad_question_file_is_one_line_naming_file_and_row(tmp_path):
    rows = [QUESTIONS[0], {"question": "who directed [Juarez]", "qtype": "movie_to_director"}]
    qfile = _questions_file(tmp_path / "q.jsonl", rows)
    args = ["eval", "--questions", str(qfile), "--model", str(tmp_path), "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 3
    assert res.output.strip() == f"error: {qfile}:2: field answer_names is missing"
    res = CliRunner().invoke(app, [*args[:-2], "--out", str(tmp_path / "o"), "--baseline", "x"])
    assert res.exit_code == 2 and "--baseline: unknown x" in res.output
    res = CliRunner().invoke(app, ["eval", "--questions", str(qfile), "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--model is required" in res.output
