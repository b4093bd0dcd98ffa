"""Oracle trajectories and RRS references in KBQA-R1's action space (the ``sexpr`` tool set,
kgsynth.agent.spaces.sexpr.oracle): walks and hand-written constraint rows replayed to their gold
answers, the reference's format, referenced rollouts and the leak check, and the CLI."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.spaces import parse_turn
from kgsynth.agent.spaces.sexpr.oracle import sexpr_oracle_calls, walk_sexpr
from kgsynth.agent.spaces.sexpr.turns import quote_answer
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.agent.topics import in_mention_order
from kgsynth.cli import app
from kgsynth.core.stage import Reject
from kgsynth.filter import FilterConfig, run_filters
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from kgsynth.llm.template import TemplateLLM
from kgsynth.metrics import normalize_answer
from kgsynth.synthesize.questions import QuestionConfig, synthesize_questions
from kgsynth.synthesize.trajectories import (
    TrajectoryConfig,
    oracle_calls,
    reference_text,
    synthesize_trajectories,
)
from kgsynth.walk import WalkConfig, run_walks
from tests.kgfixtures import (
    E,
    build_pipeline_inputs,
    freebase_kg,
    generated_movie_facts,
    movie_kg,
    movie_ntriples,
)
from tests.test_trajectories import ScriptedPolicy

SEXPR = AgentConfig(toolset="sexpr")


@pytest.fixture(scope="module")
def kg():
    return EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))


@pytest.fixture(scope="module")
def questions(kg, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("oracle_sexpr")
    run_walks(kg, WalkConfig(n=40, seed=5), tmp / "walks.parquet")
    walks = pq.read_table(tmp / "walks.parquet").to_pylist()
    accepted, _, _ = synthesize_questions(walks, QuestionConfig(), llm=TemplateLLM())
    return accepted


def _oracle(rows, graph, **options):
    cfg = TrajectoryConfig(agent=SEXPR, **options)
    return synthesize_trajectories(rows, cfg, graph=graph, llm=TemplateLLM())


def _written(hop) -> str:
    return hop["relation"] if hop["inverse"] else f"(R {hop['relation']})"


def _expected_calls(row) -> list[str]:
    """The actions, written out per structure (a conjunction's branches in the order the
    question names their topics, as the user prompt lists them)."""
    row = in_mention_order(row)
    topics, hops = row["topic_names"], [h for b in row["branches"] for h in b]
    if row["structure"] == "chain-1":
        return [f"Find_relation [ {topics[0]} | {_written(hops[0])} ]"]
    if row["structure"] == "chain-2":
        return [
            f"Find_relation [ {topics[0]} | {_written(hops[0])} ]",
            f"Find_relation [ expression1 | {_written(hops[1])} ]",
        ]
    return [  # 2I
        f"Find_relation [ {topics[0]} | {_written(hops[0])} ]",
        f"Find_relation [ {topics[1]} | {_written(hops[1])} ]",
        "Merge [ expression1 | expression2 ]",
    ]


def test_chain_and_2i_walks_replay_to_their_gold_answers(kg, questions):
    graph = KGGraph(kg)
    # a chain that turns back along its own relation reaches its topic again (see below)
    picked = [
        next(
            q
            for q in questions
            if q["structure"] == s
            and len({h["relation"] for b in q["branches"] for h in b}) == q["hops"]
        )
        for s in ("chain-1", "chain-2", "2I")
    ]
    rows, rejected, stats = _oracle(picked, graph)
    assert rejected == [] and stats["trajectories"] == 3
    for q, row in zip(picked, rows, strict=True):
        assert row["tool_calls"] == _expected_calls(q)
        env = ToolEnvironment(graph, q["question"], SEXPR)  # the same observations, replayed
        tool_msgs = [m["content"] for m in row["messages"] if m["role"] == "tool"]
        for call, obs in zip(row["tool_calls"], tool_msgs, strict=True):
            assert obs == f"<information>{env.execute(call).text}</information>"
        assert tool_msgs[-1].startswith(f"<information>expression{len(tool_msgs)} = ")
        assistant = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert all(parse_turn(a, "sexpr").format_error is None for a in assistant)
        assert all("<action>" in a for a in assistant[:-1])
        assert parse_turn(assistant[-1], "sexpr").answer == row["predicted_answers"]
        assert sorted(map(normalize_answer, row["predicted_answers"])) == sorted(
            map(normalize_answer, q["answer_names"])
        )
        assert "I follow" in assistant[0]  # a thought per step (the template's)
    accepted, filtered, _ = run_filters(rows, FilterConfig())
    assert accepted.num_rows == 3 and filtered.num_rows == 0


def test_every_walk_structure_is_accepted_or_its_s_expression_reaches_more(kg, questions):
    graph = KGGraph(kg)
    rows, rejected, stats = _oracle(questions, graph)
    assert len(rows) + len(rejected) == len(questions) and len(rows) >= 0.8 * len(questions)
    assert {s for s in Counter(r["structure"] for r in rows)} >= {"chain-1", "chain-2", "2I", "IP"}
    # a walk's paths never pass through an entity twice (its SPARQL's NOT IN filters); an
    # S-expression's JOINs do, and reach more: a chain back through its topic
    assert set(stats["rejects"]) <= {"oracle_answers_differ"}
    by_id = {q["question_id"]: q for q in questions}
    for r in rejected:
        q = by_id[r["question_id"]]
        env = ToolEnvironment(graph, q["question"], SEXPR)
        for c in sexpr_oracle_calls(q, graph):
            env.execute(c.call)
        last = env.session.expressions[-1]
        got = {graph.display_name(t) for t in last.members}
        assert set(q["answer_names"]) < got and "NOT IN" in q["sparql"]


def test_a_chain_back_through_its_topic_answers_without_the_topic(kg, questions):
    graph = KGGraph(kg)
    rows, _, _ = _oracle(questions, graph)
    by_id = {q["question_id"]: q for q in questions}
    back = 0
    for r in rows:
        q = by_id[r["question_id"]]
        env = ToolEnvironment(graph, q["question"], SEXPR)
        for c in sexpr_oracle_calls(q, graph):
            env.execute(c.call)
        got = {graph.display_name(t) for t in env.session.expressions[-1].members}
        if got != set(q["answer_names"]):
            back += 1
            assert got - set(q["topic_names"]) == set(q["answer_names"])
            assert not set(r["predicted_answers"]) & set(q["topic_names"])
            assert set(r["predicted_answers"]) == set(q["answer_names"])
    assert back > 0  # the fixture's walks include chains that come back through their topic


def test_the_reference_is_shown_as_kbqa_r1_numbers_its_actions(questions):
    row = next(q for q in questions if q["structure"] == "2I")
    ref = reference_text(row, "sexpr")
    assert ref.splitlines() == [f"Action{i}: {c}" for i, c in enumerate(_expected_calls(row), 1)]
    assert [c.kind for c in oracle_calls(row, "sexpr")] == [
        "find_relation", "find_relation", "merge"
    ]  # fmt: skip
    tree, names = walk_sexpr(row)
    assert tree[0] == "AND" and set(names.values()) == set(row["topic_names"])


# --- constraint rows: count, superlative, comparative, time --------------------------------------

DIETERLE = f"<{E}William%20Dieterle>"
CONSTRAINTS = [  # (structure, S-expression, gold, the actions)
    (
        "count",
        f"(COUNT (JOIN directed_by {DIETERLE}))",
        ["2"],
        ["Find_relation [ William Dieterle | directed_by ]", "Count [ expression1 ]"],
    ),
    (
        "superlative",
        f"(ARGMAX (JOIN directed_by {DIETERLE}) release_year)",
        ["Kismet"],
        [
            "Find_relation [ William Dieterle | directed_by ]",
            "Order [ argmax | expression1 | release_year ]",
        ],
    ),
    (
        "comparative",
        f"(AND (JOIN starred_actors <{E}Bette%20Davis>) (lt release_year 1939))",
        ["Jezebel"],
        [
            "Find_relation [ Bette Davis | starred_actors ]",
            "Compare [ lt | release_year | 1939 ]",
            "Merge [ expression1 | expression2 ]",
        ],
    ),
    (
        "time",
        f"(TC (JOIN has_genre <{E}Drama>) release_year 1939)",
        ["Juarez"],
        ["Find_relation [ Drama | has_genre ]", "Time_constraint [ release_year | 1939 ]"],
    ),
]


def _row(structure, sexpr, gold, topics=(), ids=()):
    return {
        "question_id": f"q-{structure}",
        "walk_id": f"w-{structure}",
        "question": f"a {structure} question",
        "structure": structure,
        "hops": 1,
        "topic_names": list(topics),
        "topic_ids": list(ids),
        "branches": [[{"relation": "x", "inverse": False, "entity": "y"}]] * max(1, len(topics)),
        "merge_at": [1] * max(1, len(topics)),
        "answer_names": gold,
        "sexpr": sexpr,
    }


def test_constraint_rows_replay_their_s_expressions_to_the_gold_answers():
    graph = KGGraph(movie_kg())
    rows_in = [_row(s, x, gold) for s, x, gold, _ in CONSTRAINTS]  # names from the KG's labels
    rows, rejected, stats = _oracle(rows_in, graph)
    assert rejected == [] and stats["trajectories"] == 4
    for (structure, _, gold, actions), row in zip(CONSTRAINTS, rows, strict=True):
        assert row["tool_calls"] == actions, structure
        assert row["predicted_answers"] == gold
        written = " ".join(quote_answer(g) for g in gold)  # KBQA-R1: separated by spaces
        assert row["messages"][-1]["content"].endswith(f"<answer>{written}</answer>")
    thoughts = [m["content"].split("</think>")[0] for r in rows for m in r["messages"][2::2]]
    assert any("I count the members of expression1" in t for t in thoughts)
    assert any("largest release year: I order expression1 by release_year" in t for t in thoughts)
    assert any("release year below 1939: I compare release_year with 1939" in t for t in thoughts)
    assert any("whose release year falls in 1939" in t for t in thoughts)
    count_obs = [m["content"] for m in rows[0]["messages"] if m["role"] == "tool"][-1]
    assert count_obs.endswith("Count: 2</information>")


def test_a_constraint_on_typed_literals_and_the_row_topic_names():
    from tests.test_toolset_sexpr import XSD, _films_nt

    graph = KGGraph(EmbeddedKG.from_ntriples(_films_nt(), get_profile("generic")))
    ann = f"{E}Ann"
    rows_in = [
        _row("superlative", f"(ARGMIN (JOIN directed_by <{ann}>) release_date)", ["Alpha"],
             ["Ann Lee"], [ann]),
        _row("comparative",
             f"(AND (JOIN directed_by <{ann}>) (ge release_date 1994-02-01^^{XSD}date))",
             ["Beta"], ["Ann Lee"], [ann]),
        _row("time", f"(TC (JOIN directed_by <{ann}>) release_date 1994^^{XSD}gYear)",
             ["Beta", "Gamma"], ["Ann Lee"], [ann]),
        _row("class", f"(AND Film (JOIN directed_by <{ann}>))", ["Alpha", "Beta", "Gamma"],
             ["Ann Lee"], [ann]),
    ]  # fmt: skip
    rows, rejected, _ = _oracle(rows_in, graph)
    assert rejected == [] and [r["predicted_answers"] for r in rows] == [
        ["Alpha"], ["Beta"], ["Beta", "Gamma"], ["Alpha", "Beta", "Gamma"]
    ]  # fmt: skip
    assert rows[1]["tool_calls"][1] == "Compare [ ge | release_date | 1994-02-01 ]"
    assert rows[2]["tool_calls"][1] == "Time_constraint [ release_date | 1994 ]"
    assert rows[3]["tool_calls"] == [
        "Find_relation [ Ann Lee | directed_by ]", "Merge [ Film | expression1 ]"
    ]  # fmt: skip


def test_a_freebase_s_expression_names_its_entities_by_label():
    graph = KGGraph(freebase_kg())
    row = _row("chain-1", "(JOIN (R people.person.nationality) m.irons)", ["United Kingdom"])
    assert [c.call for c in sexpr_oracle_calls(row, graph)] == [
        "Find_relation [ Jeremy Irons | (R people.person.nationality) ]"
    ]
    rows, rejected, _ = _oracle([row], graph)
    assert rejected == [] and rows[0]["predicted_answers"] == ["United Kingdom"]
    assert (
        "expression1 = (JOIN (R people.person.nationality) m.irons)"
        in (rows[0]["messages"][3]["content"])
    )
    with pytest.raises(Reject, match="sexpr_entity_unnamed"):
        sexpr_oracle_calls(row)  # without the KG nothing names m.irons


def test_rows_the_oracle_turns_down_say_why():
    graph = KGGraph(movie_kg())
    bad = [
        _row("count", f"(COUNT (JOIN directed_by {DIETERLE}))", ["3"]),  # the gold is 2
        _row("superlative", "(ARGMAX Film (JOIN rel_a rel_b))", ["x"]),
        _row("count", "(COUNT (JOIN directed_by", ["2"]),
        _row("chain-1", f"(JOIN (R no_such_relation) {DIETERLE})", ["x"]),
    ]
    _, rejected, stats = _oracle(bad, graph)
    assert [r["reject_reason"] for r in rejected] == [
        "oracle_answers_differ", "sexpr_unsupported", "sexpr_unparsable",
        "oracle_relation_not_found",
    ]  # fmt: skip
    assert stats["trajectories"] == 0


# --- referenced rollouts (KBQA-R1's RRS) and the leak check -------------------------------------


def test_referenced_rollouts_see_the_reference_and_store_none_of_it(kg, questions):
    row = next(q for q in questions if q["structure"] == "chain-2")
    ref = reference_text(row, "sexpr", KGGraph(kg))
    calls = _expected_calls(row)
    written = " ".join(quote_answer(a) for a in row["answer_names"])
    answer = f"<think>done</think><answer>{written}</answer>"
    follows = [f"<think>step</think><action>{c}</action>" for c in calls] + [answer]
    # a policy that copies the reference's numbered lines keeps them in its turns
    copies = [f"<think>step</think><action>{line}</action>" for line in ref.splitlines()]
    out = []
    for script in (follows, [*copies, answer]):
        policy = ScriptedPolicy({row["question"]: script})
        cfg = TrajectoryConfig(mode="referenced", agent=SEXPR)
        rows, _, _ = synthesize_trajectories([row], cfg, graph=KGGraph(kg), llm=policy)
        # per step (KBQA-R1 §IV-B1 step 2): each turn's prompt ends with the next gold action
        hints = [p[-1]["content"].rsplit("\n\n", 1)[1] for p in policy.prompts]
        assert hints == [f"Reference for your next action: {line}" for line in ref.splitlines()] + [
            "Reference: every reference action has run; give the answer from the results."
        ]
        (traj,) = rows
        assert traj["reference"] == ref and traj["tool_errors"] == 0
        assert all(
            ref not in m["content"] and "Reference" not in m["content"] for m in traj["messages"]
        )
        out.append(traj)
    accepted, filtered, _ = run_filters(out, FilterConfig())
    assert accepted.num_rows == 1 and accepted.column("trajectory_id").to_pylist() == [
        out[0]["trajectory_id"]
    ]
    assert filtered.column("reject_reason").to_pylist() == ["reference_leak"]


def test_a_question_without_a_reference_is_turned_down_in_referenced_mode():
    graph = KGGraph(movie_kg())
    good = _row("count", f"(COUNT (JOIN directed_by {DIETERLE}))", ["2"])
    bad = {**_row("superlative", "(ARGMAX Film (JOIN rel_a rel_b))", ["x"]), "question": "bad"}
    policy = ScriptedPolicy({good["question"]: ['<think>t</think><answer>["2"]</answer>']})
    cfg = TrajectoryConfig(mode="referenced", agent=SEXPR)
    rows, rejected, stats = synthesize_trajectories([bad, good], cfg, graph=graph, llm=policy)
    assert [r["question"] for r in rows] == [good["question"]]
    assert [r["reject_reason"] for r in rejected] == ["sexpr_unsupported"]
    assert stats["rejects"] == {"sexpr_unsupported": 1}


# --- the CLI ---------------------------------------------------------------------------------------


def test_cli_synthesizes_sexpr_oracle_trajectories(tmp_path):
    paths = build_pipeline_inputs(tmp_path, walks=12, structures="chain-1:0.5,chain-2:0.5")
    out = tmp_path / "trajectories.parquet"
    args = ["synthesize", "trajectories", "--questions", str(paths["questions"]), "--kg",
            str(paths["store"]), "--out", str(out), "--tools", "sexpr", "--gate-high", "0.9"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = pq.read_table(out).to_pylist()
    questions = pq.read_table(paths["questions"]).num_rows
    rejected = pq.read_table(tmp_path / "trajectories.rejected.parquet").to_pylist()
    assert rows and len(rows) + len(rejected) == questions
    assert {r["reject_reason"] for r in rejected} <= {"oracle_answers_differ"}
    for r in rows:
        assert r["tool_calls"][0].startswith("Find_relation [ ")
        assert "Find_relation [" in r["messages"][0]["content"]  # the sexpr system prompt
    manifest = json.loads((tmp_path / "trajectories.manifest.json").read_text())
    config = manifest["config"]
    agent = config.get("agent", config)
    assert agent["toolset"] == "sexpr" and agent["gate_high"] == 0.9


def _sexpr_policy(n, body):
    """An API agent in KBQA-R1's action space: its turns by question and turn number."""
    from tests.llm_servers import Reply, chat_completion

    messages = (body or {}).get("messages", [])
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    counting = "how many" in messages[1]["content"]
    script = (
        [
            "<think>a</think><action>Find_relation [ William Dieterle | directed_by ]\n"
            "Count [ expression1 ]</action>",
            "<think>c</think><answer>2</answer>",
        ]
        if counting
        else [
            "<think>a</think><action>Action1: Find_relation [ Kismet | banana ]</action>",
            "<think>b</think><action>Find_relation [ Kismet | (R directed_by) ]</action>",
            '<think>c</think><answer>"William Dieterle"</answer>',
        ]
    )
    return Reply(body=chat_completion(script[min(turns, len(script) - 1)]))


def test_cli_evaluates_an_agent_in_the_sexpr_action_space(tmp_path):
    from tests.llm_servers import FakeOpenAIServer

    kg = tmp_path / "kg.nt"
    kg.write_text(movie_ntriples())
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(
        "".join(
            json.dumps(q) + "\n"
            for q in (
                {"question": "who directed [Kismet]", "answer_names": ["William Dieterle"]},
                {"question": "how many films did [William Dieterle] direct", "answer_names": ["2"]},
            )
        )
    )
    out = tmp_path / "eval"
    with FakeOpenAIServer(_sexpr_policy) as server:
        args = ["eval", "--questions", str(qfile), "--kg", str(kg), "--out", str(out),
                "--llm", "openai", "--model", "m", "--api-key", "x", "--base-url",
                server.base_url, "--tools", "sexpr", "--max-turns", "4"]  # fmt: skip
        res = CliRunner().invoke(app, args)
        system = server.bodies[0]["messages"][0]["content"]
    assert res.exit_code == 0, res.output
    assert "Count [ expressionN ]" in system and "<action>" in system
    rows = sorted(
        pq.read_table(out / "predictions.parquet").to_pylist(), key=lambda r: r["question"]
    )
    assert [r["predicted"] for r in rows] == [["2"], ["William Dieterle"]]
    # the first action was rejected (every candidate listed with its score), the second ran
    who = rows[1]["messages"]
    assert "nothing was run" in who[3]["content"] and "(R directed_by) (0." in who[3]["content"]
    assert who[5]["content"].startswith("<information>expression1 = (JOIN (R directed_by) ")
    # two actions in one turn (KBQA-R1 §IV-A), observed together
    count = rows[0]["messages"][3]["content"]
    assert "Action 1 (Find_relation [ William Dieterle | directed_by ]):" in count
    assert (
        "Action 2 (Count [ expression1 ]):\nexpression2 = (COUNT " in count and "Count: 2" in count
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["tools"] == "sexpr" and metrics["overall"]["hits_at_1"] == 1.0
    assert metrics["config"]["toolset"] == "sexpr" and metrics["config"]["gate_low"] == 0.3


def test_a_join_on_a_typed_literal_is_never_read_as_a_name():
    from tests.test_toolset_sexpr import XSD, _films_nt

    nt = _films_nt() + f'<{E}Other> <http://www.w3.org/2000/01/rdf-schema#label> "95" .\n'
    graph = KGGraph(EmbeddedKG.from_ntriples(nt, get_profile("generic")))
    row = _row("chain-1", f"(JOIN runtime 95^^{XSD}integer)", ["Beta"])
    rows, rejected, _ = _oracle([row], graph)
    assert rejected == [] and rows[0]["tool_calls"] == [
        f"Find_relation [ 95^^{XSD}integer | runtime ]"
    ]
    assert rows[0]["predicted_answers"] == ["Beta"]


def test_copy_drills_of_a_sexpr_corpus_copy_its_results_in_its_syntax(kg, questions):
    from kgsynth.train.drills import copy_drills

    rows, _, _ = _oracle(questions[:12], KGGraph(kg))
    drills = copy_drills([r["messages"] for r in rows], 9, seed=0, toolset="sexpr")
    assert len(drills) == 9
    replies = [d[2]["content"] for d in drills]
    calls = [r for r in replies if r.startswith("<kg-query>")]
    assert calls and all(c.startswith("<kg-query>Find_relation [ ") for c in calls)
    assert all("get_relations" not in r and "get_triples" not in r for r in replies)
    shown = [d[1]["content"] for d in drills if d[1]["content"].startswith("<information>")]
    assert shown and all(" result" in s and "(" not in s for s in shown)
    observed = {n for r in rows for n in r["observed_entities"]}
    copied = {n for r in replies if r.startswith("<answer>") for n in json.loads(r[8:-9])}
    assert copied and copied <= observed


def test_reference_share_shows_the_reference_in_a_seeded_share_of_oracle_prompts(kg, questions):
    graph = KGGraph(kg)
    plain, _, _ = _oracle(questions, graph)
    every, _, _ = _oracle(questions, graph, reference_share=1.0)
    some, _, _ = _oracle(questions, graph, reference_share=0.5, seed=3)
    again, _, _ = _oracle(questions, graph, reference_share=0.5, seed=3)
    by_id = {q["question_id"]: q for q in questions}
    assert not any("reference action sequence" in r["messages"][1]["content"] for r in plain)
    for r in every:
        prompt = r["messages"][1]["content"]
        assert reference_text(by_id[r["question_id"]], "sexpr", graph) in prompt
        assert r["mode"] == "oracle" and r["reference"] == ""  # shown, so nothing is stripped
        # the assistant turns are the oracle's, unchanged by the prompt
    assert [r["messages"][2:] for r in every] == [r["messages"][2:] for r in plain]
    shown = [("reference action sequence" in r["messages"][1]["content"]) for r in some]
    assert 0 < sum(shown) < len(shown)
    assert shown == [("reference action sequence" in r["messages"][1]["content"]) for r in again]


def test_reference_share_needs_oracle_mode():
    from kgsynth.core.errors import ConfigError

    with pytest.raises(ConfigError, match="--reference-share"):
        TrajectoryConfig(agent=SEXPR, mode="free", reference_share=0.3)
    with pytest.raises(ConfigError, match="within"):
        TrajectoryConfig(agent=SEXPR, reference_share=1.5)
