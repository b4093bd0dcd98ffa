"""Trial-and-error demonstrations in KBQA-R1's action space (issue 42): a relation guessed wrong,
the relation gate's answer (rejected, or a tentative substitution that went wrong), then the
gold action (``--trial-and-error`` with ``--toolset sexpr``)."""

from __future__ import annotations

import re

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.spaces import parse_turn
from kgsynth.agent.spaces.oracle_call import TRIAL_MODE, OracleCall
from kgsynth.agent.spaces.sexpr.trial import shifted
from kgsynth.filter import FilterConfig, run_filters
from kgsynth.llm.template import TemplateLLM
from kgsynth.metrics import normalize_answer
from kgsynth.synthesize.trajectories import TrajectoryConfig, synthesize_trajectories

_CALL = re.compile(r"Find_relation \[ (.+) \| (.+) \]")


def _oracle(rows, graph, **options):
    cfg = TrajectoryConfig(agent=AgentConfig(toolset="sexpr"), **options)
    return synthesize_trajectories(rows, cfg, graph=graph, llm=TemplateLLM())


def _bare(relation):
    return relation.removeprefix("(R ").removesuffix(")")


def test_a_guessed_relation_is_gated_then_fixed_and_the_episode_still_answers(
    movie_graph, movie_questions
):
    rows, _, stats = _oracle(movie_questions, movie_graph, trial_and_error=1.0)
    plain = {r["question_id"]: r for r in rows if r["mode"] == "oracle"}
    trials = [r for r in rows if r["mode"] == TRIAL_MODE]
    assert len(trials) >= len(plain) // 2 and stats["trial_and_error"] == len(trials)
    bands = set()
    for t in trials:
        gold_calls = plain[t["question_id"]]["tool_calls"]
        assert len(t["tool_calls"]) == len(gold_calls) + 1
        at = next(i for i, c in enumerate(t["tool_calls"]) if c not in gold_calls)
        tried, fixed = (
            _CALL.fullmatch(t["tool_calls"][at]),
            _CALL.fullmatch(t["tool_calls"][at + 1]),
        )
        assert tried and fixed and tried.group(1) == fixed.group(1)  # the same operand
        assert _bare(tried.group(2)) != _bare(fixed.group(2))  # another relation first
        obs = [m["content"] for m in t["messages"] if m["role"] == "tool"][at]
        thoughts = [parse_turn(m["content"], "sexpr").think for m in t["messages"]
                    if m["role"] == "assistant"]  # fmt: skip
        assert thoughts[at] == f"I try {tried.group(2)} from {tried.group(1)}."
        if "Error (relation not found)" in obs:  # rejected: nothing ran, the candidates listed
            bands.add("rejected")
            assert _bare(fixed.group(2)) in obs and "nothing was run" in obs
            assert thoughts[at + 1].startswith(f"{tried.group(1)} has no relation like")
            assert t["tool_calls"][:at] + t["tool_calls"][at + 1 :] == gold_calls
        else:  # a tentative substitution whose results are not the gold step's
            bands.add("substituted")
            assert "tentatively substituted" in obs
            assert "is not a relation of" in thoughts[at + 1]
        assert sorted(map(normalize_answer, t["predicted_answers"])) == sorted(
            map(normalize_answer, plain[t["question_id"]]["predicted_answers"])
        )
    assert "rejected" in bands
    accepted, _, _ = run_filters(rows, FilterConfig(outcome="f1_above", check_format=True))
    assert accepted.num_rows == len(rows)


def test_a_wrong_expression_moves_the_later_references_up():
    call = OracleCall("merge", "Merge [ expression1 | expression3 ]", "expression3", None)
    moved = shifted(call, 2)
    assert moved.call == "Merge [ expression1 | expression4 ]" and moved.entity == "expression4"
    assert shifted(call, 3) == call


def test_sexpr_trials_are_seeded_and_leave_the_plain_replays_alone(movie_graph, movie_questions):
    base = _oracle(movie_questions, movie_graph)[0]
    half = _oracle(movie_questions, movie_graph, trial_and_error=0.5, seed=1)[0]
    assert half == _oracle(movie_questions, movie_graph, trial_and_error=0.5, seed=1)[0]
    assert [r for r in half if r["mode"] == "oracle"] == base
    assert 0 < sum(r["mode"] == TRIAL_MODE for r in half) < len(base)
