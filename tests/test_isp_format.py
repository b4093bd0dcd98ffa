"""ISP-KGR's action format for the ``isp`` tool set (issue 17): ``<node>``/``<SPARQL>`` operations,
several a step, run in order and observed together; answers in ``\\boxed{}``. Parsing (clean,
several operations, malformed), the environment's step on the movie fixture, the loop's final
request, and the filter's fast check against the parser."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.episode import Episode, EpisodeTask, step
from kgsynth.agent.loop import Generated, run_turns
from kgsynth.agent.protocol import (
    ISP_FINAL_ANSWER_PROMPT,
    ISP_NO_ACTION_HINT,
    MAX_OPERATIONS,
    Operation,
)
from kgsynth.agent.spaces import close_action, parse_turn, stop_sequences
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.filter import FilterConfig, run_filters
from kgsynth.filter.checks import FAST_ISP_ANSWER, FAST_ISP_STEP
from kgsynth.kg.graph import KGGraph
from tests.kgfixtures import E, R, movie_kg

ISP = AgentConfig(toolset="isp")
QUERY = f"SELECT ?film WHERE {{ ?film <{R}directed_by> <{E}William%20Dieterle> }}"


@pytest.fixture(scope="module")
def graph():
    return KGGraph(movie_kg())


# --- parsing ---------------------------------------------------------------------------------


def test_one_operation_and_several_in_order():
    one = parse_turn("<think>who directed it</think>\n<node>Kismet</node>", "isp")
    assert one.format_error is None and one.ops == (Operation("node", "Kismet"),)
    assert one.query == "<node>Kismet</node>" and one.action == "kg-query"
    text = f"<think>both</think><node> Kismet </node>\n<node>Juarez</node> <SPARQL>{QUERY}</SPARQL>"
    turn = parse_turn(text, "isp")
    assert turn.format_error is None and turn.answer is None
    assert [(op.tag, op.tool, op.text) for op in turn.ops] == [
        ("node", "node", "Kismet"),
        ("node", "node", "Juarez"),
        ("SPARQL", "sparql", QUERY),  # '<' of the IRIs stays in the query
    ]
    assert turn.query == f"<node>Kismet</node>\n<node>Juarez</node>\n<SPARQL>{QUERY}</SPARQL>"


def test_boxed_answers_one_box_per_answer():
    turn = parse_turn("<think>found</think>\\boxed{Juarez} \\boxed{Washington, D.C.}", "isp")
    assert turn.format_error is None and turn.answer == ["Juarez", "Washington, D.C."]
    assert turn.action == "answer" and turn.ops == ()
    # a box holding a JSON list is that list; braces inside a box stay balanced
    assert parse_turn('<think>t</think>\\boxed{["A", "B"]}', "isp").answer == ["A", "B"]
    assert parse_turn("<think>t</think>\\boxed{f{x}}", "isp").answer == ["f{x}"]
    # <node> inside the thought and a written <information> block are not operations
    fake = "<think>maybe <node>X</node></think>\\boxed{A}<information><node>Y</node></information>"
    assert parse_turn(fake, "isp").answer == ["A"] and parse_turn(fake, "isp").format_error is None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<node>Kismet</node>", "missing <think> block"),
        ("<think>t</think>", "no <node>, <SPARQL> or \\boxed{} action"),
        ("<think>t</think><kg-query>node('Kismet')</kg-query>", "no <node>, <SPARQL> or"),
        ('<think>t</think><answer>["A"]</answer>', "no <node>, <SPARQL> or"),
        ("<think>t</think><node>Kismet", "unclosed <node> operation"),
        ("<think>t</think><node> </node>", "empty <node> operation"),
        ("<think>t</think><SPARQL>SELECT</node>", "unclosed <SPARQL> operation"),
        ("<think>t</think>\\boxed{Juarez", "unclosed \\boxed{"),
        ("<think>t</think>\\boxed{ }", "empty \\boxed{} answer"),
        ("<think>t</think><node>A</node> \\boxed{B}", "a step either runs operations or answers"),
        ("<think>t</think>" + "<node>A</node>" * (MAX_OPERATIONS + 1), "more than 5 operations"),
    ],
)
def test_malformed_steps_name_their_error(text, error):
    turn = parse_turn(text, "isp")
    assert turn.format_error is not None and turn.format_error.startswith(error)


def test_a_mixed_step_runs_what_comes_first_and_caps_the_operations():
    ops_first = parse_turn("<think>t</think><node>A</node> \\boxed{B}", "isp")
    assert ops_first.ops == (Operation("node", "A"),) and ops_first.answer is None
    box_first = parse_turn("<think>t</think>\\boxed{B} <node>A</node>", "isp")
    assert box_first.answer == ["B"] and box_first.ops == ()
    many = parse_turn("<think>t</think>" + "<node>A</node>" * 7, "isp")
    assert len(many.ops) == MAX_OPERATIONS


def test_other_tool_sets_keep_their_format():
    isp_turn = "<think>t</think><node>Kismet</node>"
    assert parse_turn(isp_turn).format_error == "no <kg-query> or <answer> action"
    assert parse_turn(isp_turn, "graphwalker") == parse_turn(isp_turn)
    classic = '<think>t</think><kg-query>get_relations("Kismet")</kg-query>'
    assert parse_turn(classic, "kgr1").query == 'get_relations("Kismet")'
    assert stop_sequences("knowcoder") == ("</kg-query>", "</answer>")
    assert stop_sequences("isp") == ("<information>",)
    assert close_action("<think>t</think><node>A</node> <information>fake", "isp") == (
        "<think>t</think><node>A</node>"
    )


# --- the environment's step --------------------------------------------------------------------


def _step(graph, text, config=ISP):
    ep = Episode(EpisodeTask("who directed Kismet", ["Kismet"]))
    env = ToolEnvironment(graph, "who directed Kismet", config)
    step(ep, env, text, None, final=False)
    return ep, env


def test_several_operations_are_observed_together_in_order(graph):
    ep, env = _step(graph, f"<think>t</think><node>Kismet</node><SPARQL>{QUERY}</SPARQL>")
    record = ep.turns[0]
    node_text = "<relation>\n" + env.execute('node("Kismet")').text + "\n</relation>"  # Fig. 8
    assert ep.messages[-1] == {
        "role": "tool",
        "content": f'<information>Operation 1 (node "Kismet"):\n{node_text}\n\n'
        "Operation 2 (SPARQL):\n?film\nJuarez\nKismet</information>",
    }
    assert record.tool == "node+sparql" and record.args == ("Kismet", QUERY)
    assert record.tool_error is None and record.format_error is None
    assert {"Kismet", "Juarez"} <= set(record.entities)
    assert ep.tool_calls == [f"<node>Kismet</node>\n<SPARQL>{QUERY}</SPARQL>"]


def test_each_operation_has_its_own_typed_error(graph):
    kg = graph.kg
    before = kg.select("SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }")[0]["n"].value
    text = (
        "<think>t</think><node>Nobody Here</node><SPARQL>DELETE WHERE { ?s ?p ?o }</SPARQL>"
        f"<SPARQL>{QUERY}</SPARQL>"
    )
    ep, _ = _step(graph, text)
    obs = ep.messages[-1]["content"]
    assert ep.turns[0].tool_error == "entity_not_found"  # the first error
    assert 'Operation 1 (node "Nobody Here"):\nError (entity not found)' in obs
    assert "Operation 2 (SPARQL):\nError (query refused)" in obs
    assert "Operation 3 (SPARQL):\n?film\nJuarez\nKismet" in obs  # later ones still run
    assert kg.select("SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }")[0]["n"].value == before


def test_a_long_step_is_cut_with_the_marker(graph):
    small = AgentConfig(toolset="isp", max_observation_chars=150)
    ep, _ = _step(graph, "<think>t</think><node>Kismet</node><node>Juarez</node>", small)
    obs = ep.messages[-1]["content"]
    assert "[... truncated:" in obs and len(obs) < 2 * 150 + 100


def test_a_turn_without_an_action_gets_the_isp_hint(graph):
    ep, _ = _step(graph, '<think>t</think><kg-query>get_relations("Kismet")</kg-query>')
    assert ep.turns[0].format_error == "no <node>, <SPARQL> or \\boxed{} action"
    assert ep.messages[-1]["content"] == f"<information>{ISP_NO_ACTION_HINT}</information>"


class _Script:
    """A turn policy that writes fixed turns (one list per episode)."""

    batch_size = None

    def __init__(self, turns: list[str]) -> None:
        self.turns = turns

    def begin(self, episode):
        return None

    def generate(self, live, turn):
        return [Generated(self.turns[min(turn, len(self.turns) - 1)]) for _ in live]

    def observe(self, live, generated, reply, turn):
        return None


def test_the_loop_asks_for_boxes_at_the_turn_limit(graph):
    policy = _Script(
        ["<think>t</think><node>Kismet</node>", "<think>t</think>\\boxed{X} \\boxed{Y}"]
    )
    live = run_turns(
        policy,
        [EpisodeTask("who directed Kismet", ["Kismet"])],
        lambda task: ToolEnvironment(graph, task.question, ISP),
        system_text="sys",
        max_turns=1,
    )
    ep = live[0].episode
    assert ep.messages[-2] == {"role": "user", "content": ISP_FINAL_ANSWER_PROMPT}
    assert ep.forced_answer and ep.answered and ep.predicted_answers == ["X", "Y"]


# --- the filter's fast check ---------------------------------------------------------------------


def _isp_texts(rng: random.Random, n: int) -> list[str]:
    parts = [
        "<think>",
        "</think>",
        "<node>",
        "</node>",
        "<SPARQL>",
        "</SPARQL>",
        "<information>",
        "</information>",
        "\\boxed{",
        "}",
        "{",
        "<",
        "</",
        "\\",
        "[",
        "]",
        '"',
        "A",
        "1",
        " ",
        "\n",
        "\u00a0",
        "<x>",
    ]
    texts = []
    for _ in range(n):
        texts.append("".join(rng.choice(parts) for _ in range(rng.randint(0, 14))))
        ops = "".join(
            rng.choice(["<node>Kismet</node>", f"<SPARQL>{QUERY}</SPARQL>", " ", "\n"])
            for _ in range(rng.randint(1, 7))
        )
        boxes = " ".join(
            rng.choice(["\\boxed{A}", '\\boxed{["A"]}', "\\boxed{ }", "\\boxed{[]}"])
            for _ in range(rng.randint(1, 3))
        )
        texts.append(f"<think>t</think>{rng.choice([ops, boxes, ops + boxes])}")
    return texts


def test_fast_isp_regexes_accept_only_what_the_parser_accepts():
    texts = _isp_texts(random.Random(11), 3000)
    arr = pa.chunked_array([pa.array(texts)])
    step_ok = pc.match_substring_regex(arr, FAST_ISP_STEP).to_pylist()
    answer_ok = pc.match_substring_regex(arr, FAST_ISP_ANSWER).to_pylist()
    matched = 0
    for text, s, a in zip(texts, step_ok, answer_ok, strict=True):
        turn = parse_turn(text, "isp")
        if s:
            assert turn.format_error is None and turn.ops, repr(text)
        if a:
            assert turn.format_error is None and turn.answer, repr(text)
        matched += s or a
    assert matched > 500


def test_the_filter_accepts_a_trajectory_in_one_format_only():
    from tests.test_filter import traj

    def row(tid, turns):
        messages = [{"role": "system", "content": "s"}]
        for t in turns:
            messages += [{"role": "assistant", "content": t}, {"role": "tool", "content": "o"}]
        return traj(tid, messages=messages[:-1])

    step_ = "<think>t</think><node>Kismet</node>"
    rows = [
        row("isp", [step_, "<think>t</think>\\boxed{William Dieterle}"]),
        row("mixed", [step_, '<think>t</think><answer>["William Dieterle"]</answer>']),
        row(
            "classic-box",
            [
                '<think>t</think><kg-query>x("Kismet")</kg-query>',
                "<think>t</think>\\boxed{William Dieterle}",
            ],
        ),
    ]
    accepted, rejected, stats = run_filters(rows, FilterConfig())
    assert accepted.column("trajectory_id").to_pylist() == ["isp"]
    assert rejected.column("reject_reason").to_pylist() == ["bad_format", "bad_format"]
    assert stats["format_rows_parsed_one_by_one"] == 2  # the isp row took the fast path
