"""KnowCoder-A1's expert data without an LLM (issue 17): trial-and-error demonstrations from the
knowcoder oracle (``--trial-and-error``), an isp oracle step exploring several topics at once,
and the filter's seeded upsampling of rare structures."""

from __future__ import annotations

import json

import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.spaces import parse_turn
from kgsynth.agent.spaces.oracle_call import TRIAL_MODE
from kgsynth.agent.topics import in_mention_order
from kgsynth.core.errors import ConfigError
from kgsynth.filter import FilterConfig, run_filters
from kgsynth.llm.template import TemplateLLM
from kgsynth.metrics import normalize_answer
from kgsynth.synthesize.trajectories import TrajectoryConfig, synthesize_trajectories
from tests.test_filter import traj


def _oracle(rows, graph, toolset="knowcoder", **options):
    cfg = TrajectoryConfig(agent=AgentConfig(toolset=toolset), **options)
    return synthesize_trajectories(rows, cfg, graph=graph, llm=TemplateLLM())


def _gold(names):
    return sorted(map(normalize_answer, names))


def test_a_trial_fails_first_then_corrects_and_still_answers(movie_graph, movie_questions):
    rows, rejected, stats = _oracle(movie_questions, movie_graph, trial_and_error=1.0)
    plain = [r for r in rows if r["mode"] == "oracle"]
    trials = [r for r in rows if r["mode"] == TRIAL_MODE]
    assert rejected == [] and len(plain) == len(movie_questions)
    assert len(trials) >= len(movie_questions) * 3 // 4 and stats["trial_and_error"] == len(trials)
    kinds = set()
    by_question = {r["question_id"]: r for r in plain}
    for t in trials:
        q = next(q for q in movie_questions if q["question_id"] == t["question_id"])
        execs = [c for c in t["tool_calls"] if c.startswith("ExecuteSPARQL(")]
        assert len(execs) == 2 and execs[-1] == f"ExecuteSPARQL({json.dumps(q['sparql'])})"
        assert execs[0] != execs[-1]
        # the plain trajectory's calls, with the failing attempt before the gold query
        assert (
            t["tool_calls"][:-2] + t["tool_calls"][-1:]
            == by_question[q["question_id"]]["tool_calls"]
        )
        obs = [m["content"] for m in t["messages"] if m["role"] == "tool"]
        wrong_rows = obs[-2].removeprefix("<information>").removesuffix("</information>")
        shown = (
            []
            if wrong_rows == "no rows"
            else [r.split("\t")[0] for r in wrong_rows.split("\n")[1:]]
        )
        assert _gold(shown) != _gold(q["answer_names"])  # the first attempt really is wrong
        thoughts = [
            parse_turn(m["content"]).think for m in t["messages"] if m["role"] == "assistant"
        ]
        retry = thoughts[-2]
        seen = "The query returned no rows" if wrong_rows == "no rows" else "Those rows do not fit"
        assert retry.startswith(seen)
        kinds.add("direction" if "runs the other way" in retry else "relation")
        assert "is the wrong relation" in retry or "runs the other way" in retry
        assert _gold(t["predicted_answers"]) == _gold(q["answer_names"])
        assert (
            t["sample"] == 1
            and t["trajectory_id"] != by_question[q["question_id"]]["trajectory_id"]
        )
    assert kinds == {"direction", "relation"}
    accepted, rejected_rows, _ = run_filters(rows, FilterConfig())
    assert accepted.num_rows == len(rows) and rejected_rows.num_rows == 0


def test_trial_and_error_is_seeded_and_off_by_default(movie_graph, movie_questions):
    base, _, stats = _oracle(movie_questions, movie_graph)
    assert "trial_and_error" not in stats
    assert (
        _oracle(movie_questions, movie_graph, trial_and_error=0.0)[0] == base
    )  # rate 0: the same rows
    half = _oracle(movie_questions, movie_graph, trial_and_error=0.5, seed=1)[0]
    assert half == _oracle(movie_questions, movie_graph, trial_and_error=0.5, seed=1)[0]
    other = _oracle(movie_questions, movie_graph, trial_and_error=0.5, seed=2)[0]
    picked = {r["question_id"] for r in half if r["mode"] == TRIAL_MODE}
    assert 0 < len(picked) < len(movie_questions)
    assert picked != {r["question_id"] for r in other if r["mode"] == TRIAL_MODE}
    assert [r for r in half if r["mode"] == "oracle"] == base
    with pytest.raises(ConfigError, match="--toolset knowcoder"):
        TrajectoryConfig(agent=AgentConfig(toolset="isp"), trial_and_error=0.5)
    with pytest.raises(ConfigError, match="within"):
        TrajectoryConfig(agent=AgentConfig(toolset="knowcoder"), trial_and_error=1.5)


def test_a_multi_topic_walk_explores_each_topic_then_merges(movie_graph, movie_questions):
    # ISP-KGR App. E.2: each branch on its own (its topic explored, its sub-query run), then
    # one query joining them
    multi = [q for q in movie_questions if len(q["topic_names"]) == 2]
    assert {q["structure"] for q in multi} >= {"2I"}
    rows, rejected, _ = _oracle(multi, movie_graph, toolset="isp")
    assert rejected == [] and len(rows) == len(multi)
    for q, row in zip(multi, rows, strict=True):
        said = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        steps = [parse_turn(text, "isp") for text in said[:-1]]
        assert all(s.format_error is None for s in steps)
        # a <node> turn, then its <SPARQL> turn (§4.3.2: they alternate)
        assert [[op.tag for op in s.ops] for s in steps[:2]] == [["node"], ["SPARQL"]]
        explored = {op.text for s in steps for op in s.ops if op.tag == "node"}
        assert set(q["topic_names"]) <= explored
        t = in_mention_order(q)["topic_names"][0]  # where the question starts
        assert f'<information><relation>\nTemplates of "{t}"' in row["messages"][3]["content"]
        assert [op.tag for op in steps[-1].ops][-1] == "SPARQL"
        assert row["num_turns"] == len(steps) + 1
    accepted, _, stats = run_filters(rows, FilterConfig())
    assert accepted.num_rows == len(rows)
    assert stats["format_rows_parsed_one_by_one"] == 0  # ISP's turns take the fast check


# --- upsampling --------------------------------------------------------------------------------


def _rows():
    rows = [traj(f"c{i}", question_id=f"q{i}", tool_calls=[f"x{i}()"]) for i in range(6)]
    rows += [traj(f"i{i}", question_id=f"p{i}", structure="2I", hops=2) for i in range(2)]
    rows.append(traj("p0", question_id="r0", structure="PI", hops=3))
    return rows


def test_upsampling_grows_rare_structures_towards_the_largest():
    cfg = FilterConfig(balance="structure", balance_factor=10.0, upsample_factor=2.5, seed=3)
    accepted, rejected, stats = run_filters(_rows(), cfg)
    ids = accepted.column("trajectory_id").to_pylist()
    assert rejected.num_rows == 0 and ids[:9] == [r["trajectory_id"] for r in _rows()]
    # 2I: 2 rows -> min(6, floor(2.5 * 2)) = 5: one whole copy, then 1 drawn; PI: 1 -> 2
    copies = ids[9:]
    assert sorted(c for c in copies if c.startswith("i")) in (
        ["i0~copy1", "i0~copy2", "i1~copy1"],
        ["i0~copy1", "i1~copy1", "i1~copy2"],
    )
    assert [c for c in copies if c.startswith("p")] == ["p0~copy1"]
    structures = accepted.column("structure").to_pylist()
    assert {s: structures.count(s) for s in set(structures)} == {"chain-1": 6, "2I": 5, "PI": 2}
    info = stats["balance"]["upsample"]
    assert info["copies"] == {"2I": 3, "PI": 1} and info["seed"] == 3 and info["factor"] == 2.5
    assert info["groups_after"] == {"2I": 5, "PI": 2, "chain-1": 6}
    assert stats["upsampled_rows"] == 4 and stats["accepted"] == 9
    # a copy is its original row, id aside
    rows = accepted.to_pylist()
    copy = next(r for r in rows if r["trajectory_id"] == "p0~copy1")
    original = next(r for r in rows if r["trajectory_id"] == "p0")
    assert {**copy, "trajectory_id": "p0"} == original


def test_upsampling_is_seeded_and_needs_balance():
    def drawn(seed):
        cfg = FilterConfig(balance="structure", balance_factor=10.0, upsample_factor=2.5, seed=seed)
        return run_filters(_rows(), cfg)[0].column("trajectory_id").to_pylist()

    assert drawn(3) == drawn(3)
    assert len({tuple(drawn(s)) for s in range(8)}) == 2  # the 2I row drawn differs by seed
    same = run_filters(_rows(), FilterConfig(balance="structure", balance_factor=10.0))
    assert same[0].num_rows == 9 and same[2]["balance"].get("upsample") is None
    with pytest.raises(ConfigError, match="--balance"):
        FilterConfig(upsample_factor=2.0)
    with pytest.raises(ConfigError, match="--upsample-factor must be >= 1"):
        FilterConfig(balance="structure", upsample_factor=0.5)
