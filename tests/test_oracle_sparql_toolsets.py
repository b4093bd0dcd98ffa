"""Oracle trajectories for the SPARQL-writing tool sets (issue 17): knowcoder (SearchTypes,
SearchGraphPatterns, ExecuteSPARQL) and isp (node, sparql), replayed on the movie fixture."""

import json

import pyarrow.parquet as pq
import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.spaces import parse_turn
from kgsynth.agent.spaces.isp.oracle import prefixed
from kgsynth.agent.spaces.isp.tools import run_step
from kgsynth.agent.toolcall import parse_tool_call
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.agent.topics import in_mention_order
from kgsynth.filter import FilterConfig, run_filters
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from kgsynth.llm.template import TemplateLLM
from kgsynth.metrics import normalize_answer
from kgsynth.synthesize.questions import QuestionConfig, synthesize_questions
from kgsynth.synthesize.trajectories import TrajectoryConfig, synthesize_trajectories
from kgsynth.walk import WalkConfig, run_walks
from tests.kgfixtures import E, R, generated_movie_facts, movie_ntriples

RDF_TYPE = "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>"
LABEL = "<http://www.w3.org/2000/01/rdf-schema#label>"
FILM = "http://kgsynth.org/type/Film"


@pytest.fixture(scope="module")
def kg():
    return EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))


@pytest.fixture(scope="module")
def questions(kg, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("oracle_sparql")
    run_walks(kg, WalkConfig(n=40, seed=5), tmp / "walks.parquet")
    walks = pq.read_table(tmp / "walks.parquet").to_pylist()
    accepted, _, _ = synthesize_questions(walks, QuestionConfig(), llm=TemplateLLM())
    return accepted


def _first(questions, structure):
    return next(q for q in questions if q["structure"] == structure)


def _oracle(rows, graph, toolset):
    cfg = TrajectoryConfig(agent=AgentConfig(toolset=toolset))
    return synthesize_trajectories(rows, cfg, graph=graph, llm=TemplateLLM())


def _node(name):
    return f'"{name}"'


def _hint(row):
    # empty: the tool ranks the patterns by the question (issue 42 item 4, knowcoder/oracle.py)
    return ""


def _expected_calls(row, toolset):
    query = json.dumps(row["sparql"], ensure_ascii=False)
    if toolset == "isp":  # ISP-KGR App. E.2: a node, then a sub-query, per hop; the query last
        if row["structure"] == "chain-1":
            query = prefixed(row["sparql"], row["topic_ids"])
            return [f"<node>{row['topic_names'][0]}</node>", f"<SPARQL>{query}</SPARQL>"]
        return None  # the decomposition's steps: tests/test_isp_paper.py
    # KnowCoder-A1 App. F: the sketch binds ?x to the topic entities, in the order the
    # question names them (the order the user prompt lists them in)
    topics = in_mention_order(row)["topic_names"]
    values = " ".join(dict.fromkeys(_node(t) for t in topics))
    sketch_text = f"SELECT DISTINCT ?x WHERE {{ VALUES ?x {{ {values} }} }}"
    sketch = "SearchGraphPatterns('" + sketch_text + "', " + json.dumps(_hint(row)) + ")"
    return [sketch, f"ExecuteSPARQL({query})"]


@pytest.mark.parametrize("toolset", ["knowcoder", "isp"])
def test_chain_and_2i_walks_give_accepted_trajectories_with_the_exact_calls(kg, questions, toolset):
    graph = KGGraph(kg)
    rows_in = [_first(questions, s) for s in ("chain-1", "chain-2", "2I")]
    rows, rejected, stats = _oracle(rows_in, graph, toolset)
    assert rejected == [] and stats["trajectories"] == 3
    for q, row in zip(rows_in, rows, strict=True):
        expected = _expected_calls(q, toolset)
        assert expected is None or row["tool_calls"] == expected
        if toolset == "isp":
            query = prefixed(q["sparql"], q["topic_ids"])
            assert row["tool_calls"][-1] == f"<SPARQL>{query}</SPARQL>"
        env = ToolEnvironment(graph, q["question"], AgentConfig(toolset=toolset))
        tool_msgs = [m["content"] for m in row["messages"] if m["role"] == "tool"]
        assistant = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        if toolset == "knowcoder":
            # the stored SPARQL survives the tool-call syntax: the parser reads it back exactly
            assert parse_tool_call(row["tool_calls"][-1]).args == (q["sparql"],)
            for call, obs in zip(row["tool_calls"], tool_msgs, strict=True):
                assert obs == f"<information>{env.execute(call).text}</information>"
            assert assistant[-1].endswith("</answer>")
        else:  # each step parses back in ISP's format to the operations it ran
            for text, call, obs in zip(assistant, row["tool_calls"], tool_msgs, strict=False):
                turn = parse_turn(text, "isp")
                assert turn.format_error is None and turn.query == call
                assert obs == f"<information>{run_step(env, turn.ops).text}</information>"
            final = parse_turn(assistant[-1], "isp")
            assert final.format_error is None and final.answer == row["predicted_answers"]
            assert "<answer>\\boxed{" in assistant[-1]  # ISP-KGR's Figure 8
        # the answer is the whole gold set, in the order the query's rows show it
        last = tool_msgs[-1].removeprefix("<information>").split("(SPARQL):\n")[-1]
        rows_shown = last.removesuffix("</information>").split("\n")[1:]
        assert row["predicted_answers"] == [line.split("\t")[0] for line in rows_shown]
        assert sorted(map(normalize_answer, row["predicted_answers"])) == sorted(
            map(normalize_answer, q["answer_names"])
        )
        assert len(assistant) == len(row["tool_calls"]) + 1 == row["num_turns"]
        assert all(a.startswith("<think>") and "</think>" in a for a in assistant)
        first = in_mention_order(q)["topic_names"][0]  # where the question starts
        # isp explores the topic the question starts from first
        assert toolset == "knowcoder" or f"relations around {first}." in assistant[0]
    accepted, filtered, _ = run_filters(rows, FilterConfig())
    assert accepted.num_rows == 3 and filtered.num_rows == 0


def test_every_structure_replays_and_thoughts_name_only_what_was_seen(kg, questions):
    import re

    names = {n for f in generated_movie_facts() for n in (f[0], f[2])}
    for toolset in ("knowcoder", "isp"):
        rows, rejected, _ = _oracle(questions, KGGraph(kg), toolset)
        assert rejected == [] and len(rows) == len(questions)
        for row in rows:
            seen = set(row["topic_names"])
            for m in row["messages"][2:]:
                text = m["content"].split("</think>")[0] if m["role"] == "assistant" else ""
                found = {n for n in names if re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text)}
                assert found <= seen or "<answer>" in m["content"] or "\\boxed{" in m["content"]
                if m["role"] == "tool":
                    seen |= {n for n in names if n in m["content"]}


def test_a_typed_kg_searches_the_answers_type_first(questions):
    facts = generated_movie_facts()
    extra = [f"<{E}Movie%20{m}> {RDF_TYPE} <{FILM}> ." for m in range(40)]
    extra.append(f'<{FILM}> {LABEL} "film" .')
    typed = EmbeddedKG.from_ntriples(
        movie_ntriples(facts) + "\n".join(extra) + "\n", get_profile("generic")
    )
    row = next(
        q
        for q in questions
        if q["structure"] == "chain-1" and q["answer_names"][0].startswith("Movie ")
    )
    rows, rejected, _ = _oracle([row], KGGraph(typed), "knowcoder")
    assert rejected == []
    assert rows[0]["tool_calls"][0] == 'SearchTypes("film")'
    assert rows[0]["tool_calls"][1:] == _expected_calls(row, "knowcoder")
    first_obs = rows[0]["messages"][3]["content"]
    assert f"<{FILM}> film (40 instances)" in first_obs
    assert "of type film" in rows[0]["messages"][2]["content"]


def test_a_capped_query_result_is_rejected(questions):
    # 60 more Westerns: the films of the genre are past the agent's row cap (50)
    facts = generated_movie_facts() + [(f"Western {i}", "has_genre", "Western") for i in range(60)]
    big = EmbeddedKG.from_ntriples(movie_ntriples(facts), get_profile("generic"))
    western = f"<{E}Western>"
    query = (
        f"SELECT DISTINCT ?answer ?name WHERE {{ ?answer <{R}has_genre> {western} . "
        f"FILTER(?answer NOT IN ({western})) OPTIONAL {{ VALUES ?lp {{ {LABEL} }} "
        "?answer ?lp ?name } }"
    )
    answers = sorted(r["name"].value for r in big.select(query))
    assert len(answers) > 60
    base = _first(questions, "chain-1")
    row = {
        **base,
        "question": "which films are westerns",
        "topic_names": ["Western"],
        "topic_ids": [f"{E}Western"],
        "branches": [[{"relation": "has_genre", "inverse": True, "entity": "Western 0"}]],
        "merge_at": [1],
        "answer_names": answers,
        "answer_ids": [f"{E}{a.replace(' ', '%20')}" for a in answers],
        "sparql": query,
    }
    for toolset in ("knowcoder", "isp"):
        rows, rejected, stats = _oracle([row], KGGraph(big), toolset)
        assert rows == [] and stats["rejects"] == {"answers_not_observed": 1}
        assert rejected[0]["reject_reason"] == "answers_not_observed"


def test_a_row_without_its_sparql_is_rejected(kg, questions):
    row = {**_first(questions, "chain-1"), "sparql": None}
    for toolset in ("knowcoder", "isp"):
        _rows, rejected, _ = _oracle([row], KGGraph(kg), toolset)
        assert [r["reject_reason"] for r in rejected] == ["no_sparql"]


def test_the_sparql_column_is_required_for_the_sparql_tool_sets():
    from kgsynth.synthesize.trajectories import TrajectoryConfig, input_columns

    assert "sparql" in input_columns(TrajectoryConfig(agent=AgentConfig(toolset="isp")))
    assert "sparql" in input_columns(
        TrajectoryConfig(agent=AgentConfig(toolset="knowcoder"), mode="referenced")
    )
    assert "sparql" not in input_columns(
        TrajectoryConfig(agent=AgentConfig(toolset="isp"), mode="free")
    )
    assert "sparql" not in input_columns(TrajectoryConfig())
