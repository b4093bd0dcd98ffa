"""References from benchmark SPARQL (issue 18, part 5b): the SPARQL reader, path and
conjunction queries as walk rows whose graphwalker/kgr1 actions replay through the real tools
to the gold answers on the Freebase-schema fixture KG, and the queries that are not paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from kgsynth.agent.spaces import replay
from kgsynth.agent.spaces.oracle_call import oracle_answers
from kgsynth.agent.tools import ToolConfig, ToolEnvironment
from kgsynth.datasets.bench_sparql import SparqlSyntaxError, parse_sparql, predicate_paths
from kgsynth.datasets.qafiles import read_questions
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.open import open_kg
from kgsynth.metrics import normalize_answer
from kgsynth.synthesize.benchmark_refs import (
    NotAPath,
    benchmark_reference,
    benchmark_walk_row,
    benchmark_walk_rows,
    sparql_walk_row,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "benchmarks"
NS = "http://rdf.freebase.com/ns/"


@pytest.fixture(scope="module")
def graph(fb_small_store) -> KGGraph:
    return KGGraph(open_kg(fb_small_store))


def questions(name: str) -> dict[str, object]:
    return {r.question_id: r for r in read_questions(FIXTURES / name)}


WEBQSP = questions("webqsp.json")
CWQ = questions("cwq.json")


# --- reading SPARQL -----------------------------------------------------------------------


def test_webqsp_sparql_reads_as_triple_patterns():
    q = parse_sparql(WEBQSP["WebQTest-9003"].sparql)
    assert q.select == ["x"] and q.features == [] and len(q.filters) == 2
    assert [(str(p.s), p.p.value.removeprefix(NS), str(p.o)) for p in q.patterns] == [
        (f"<{NS}m.016ywr>", "film.actor.film", "?y"),
        ("?y", "film.performance.film", "?x"),
        ("?x", "film.film.genre", f"<{NS}m.01jfsb>"),
    ]


def test_grailqa_subselect_values_and_features():
    grail = read_questions(FIXTURES / "grailqa.json")
    q = parse_sparql(grail[0].sparql)  # SELECT (?x0 AS ?value) WHERE { SELECT DISTINCT ?x0 ... }
    assert q.select == ["x0"] and q.values["x1"][0].value == NS + "m.01jfsb"
    assert parse_sparql(grail[2].sparql).features == ["aggregate (COUNT ( ?x0 ) AS ?value)"]
    assert parse_sparql(grail[4].sparql).features == ["ORDER BY DESC ( ?sk0 )", "LIMIT 1"]
    text = "PREFIX ns: <http://x/> SELECT ?x WHERE { ns:a ns:r ?x ; ns:s ?y , ?z . OPTIONAL { ?x ns:t ?w } }"
    q = parse_sparql(text)
    assert [p.p.value for p in q.patterns] == [
        "http://x/r",
        "http://x/s",
        "http://x/s",
        "http://x/t",
    ]
    assert q.features == ["OPTIONAL"]
    with pytest.raises(SparqlSyntaxError, match="undeclared prefix 'fb:'"):
        parse_sparql("SELECT ?x WHERE { fb:m.1 fb:r ?x }")
    with pytest.raises(SparqlSyntaxError, match="only SELECT"):
        parse_sparql("ASK { ?s ?p ?o }")


def test_predicate_paths_flatten_unreturned_variables():
    q = parse_sparql(CWQ["WebQTrn-9102_77af2c90"].sparql)
    paths = [tuple(p.removeprefix(NS) for p in path) for path in predicate_paths(q)]
    assert paths == [
        ("film.actor.film",),
        ("film.performance.film",),
        ("film.actor.film", "film.performance.film"),
    ]


# --- path and conjunction queries as references -------------------------------------------


def _replayed_answers(row: dict, graph: KGGraph, toolset: str) -> set[str]:
    env = ToolEnvironment(graph, row["question"], ToolConfig(toolset=toolset))
    observed = [e for _, result in replay(row, env) for e in result.entities]
    return {normalize_answer(a) for a in oracle_answers(row, observed, fallback=False)}


def test_chain_query_becomes_a_two_hop_reference(graph):
    rec = WEBQSP["WebQTest-9002"]  # ?y film.director.film <Dead Ringers> . ?y place_of_birth ?x
    row = benchmark_walk_row(rec, graph)
    assert row["structure"] == "chain-2" and row["merge_at"] == [2]
    assert row["topic_names"] == ["Dead Ringers"] and row["topic_ids"] == [NS + "m.03f7xg"]
    assert row["branches"] == [
        [
            {"relation": "film.director.film", "inverse": True, "entity": "David Cronenberg"},
            {"relation": "people.person.place_of_birth", "inverse": False, "entity": "Toronto"},
        ]
    ]
    assert benchmark_reference(rec, graph, "graphwalker") == "\n".join(
        [
            '1. get_relations("Dead Ringers")',
            '2. get_triples("Dead Ringers", ["film.director.film"])',
            '3. get_relations("David Cronenberg")',
            '4. get_triples("David Cronenberg", ["people.person.place_of_birth"])',
        ]
    )
    assert benchmark_reference(rec, graph, "kgr1").splitlines()[:2] == [
        '1. get_head_relations("Dead Ringers")',
        '2. get_head_entities("Dead Ringers", "film.director.film")',
    ]
    for toolset in ("graphwalker", "kgr1"):
        assert _replayed_answers(row, graph, toolset) == {"toronto"}


def test_conjunction_through_a_cvt_becomes_a_2i_reference(graph):
    rec = WEBQSP["WebQTest-9003"]  # Irons -film.actor.film-> CVT -performance.film-> ?x, genre
    row = benchmark_walk_row(rec, graph)
    assert row["structure"] == "2I" and row["merge_at"] == [1, 1]
    assert row["topic_names"] == ["Jeremy Irons", "Thriller"]
    (irons,), (genre,) = row["branches"]
    assert irons["relation"] == "film.actor.film.film.performance.film"  # CVT hop, flattened
    assert (irons["inverse"], genre["relation"], genre["inverse"]) == (
        False,
        "film.film.genre",
        True,
    )
    assert irons["entity"] == genre["entity"] == "Dead Ringers"  # a gold answer is bound
    assert benchmark_reference(rec, graph).splitlines() == [
        '1. get_relations("Jeremy Irons")',
        '2. get_triples("Jeremy Irons", ["film.actor.film.film.performance.film"])',
        '3. get_relations("Thriller")',
        '4. get_triples("Thriller", ["film.film.genre"])',
    ]
    gold = {normalize_answer(a) for a in rec.answer_names}
    for toolset in ("graphwalker", "kgr1"):
        assert _replayed_answers(row, graph, toolset) == gold == {"dead ringers", "margin call"}


def test_two_cvt_branches_and_a_literal_answer(graph):
    row = benchmark_walk_row(CWQ["WebQTrn-9102_77af2c90"], graph)
    assert row["structure"] == "2I" and row["topic_names"] == ["Jeremy Irons", "Liam Neeson"]
    assert _replayed_answers(row, graph, "graphwalker") == {"mission"}
    born = benchmark_walk_row(WEBQSP["WebQTest-9004"], graph)
    assert born["structure"] == "chain-1" and born["branches"][0][0]["entity"] == "1948-09-19"
    assert _replayed_answers(born, graph, "kgr1") == {"1948 09 19"}


def test_a_pi_shape_puts_the_longer_branch_first(graph):
    sparql = (
        "PREFIX ns: <http://rdf.freebase.com/ns/>\nSELECT DISTINCT ?x WHERE {\n"
        "ns:m.0dl9_4 ns:film.film.country ?x .\n"
        "?d ns:film.director.film ns:m.03f7xg .\n?d ns:people.person.nationality ?x .\n}"
    )
    row = sparql_walk_row(sparql, graph, question="which country made eastern promises and is "
                          "the nationality of dead ringers' director")  # fmt: skip
    assert row["structure"] == "PI" and row["merge_at"] == [2, 1]
    assert row["topic_names"] == ["Dead Ringers", "Eastern Promises"]
    assert row["answer_names"] == ["Canada"]  # no gold given: the query's own answers
    assert _replayed_answers(row, graph, "graphwalker") == {"canada"}


@pytest.mark.parametrize(
    ("source", "qid", "kind", "reason"),
    [
        ("webqsp.json", "WebQTest-9005", "ordering", "ORDER BY DESC ( xsd:datetime ( ?sk0 ) )"),
        ("cwq.json", "WebQTrn-9103_0c4d11e2", "value_filter", 'FILTER ( ?num > "2000"'),
        ("cwq.json", "WebQTrn-9104_e91f3a07", "ordering", "ORDER BY xsd:datetime"),
        ("grailqa.json", "9201000001000", "class_constraint", "type.object.type"),
        ("graphquestions.json", "930200000000", "aggregate", "COUNT"),
    ],
)
def test_queries_that_are_not_paths_say_why(graph, source, qid, kind, reason):
    rec = questions(source)[qid]
    with pytest.raises(NotAPath) as info:
        benchmark_walk_row(rec, graph)
    assert info.value.kind == kind and reason in info.value.reason


def test_shapes_that_are_not_paths(graph):
    head = "PREFIX ns: <http://rdf.freebase.com/ns/>\nSELECT DISTINCT ?x WHERE {\n"
    cases = {
        "?x ns:film.film.genre ns:m.01jfsb .\n?x ns:film.film.country ?c .\n": "dangling variable ?c",
        "ns:m.026fd ns:film.director.film ?x .\n?x ns:film.film.initial_release_date "
        '"1988-09-23"^^<http://www.w3.org/2001/XMLSchema#date> .\n': "initial_release_date",
        "ns:m.016ywr ns:film.actor.film ?x .\n": "unnamed node",
        "ns:m.016ywr ns:common.topic.alias ?x .\n": "hidden",
    }
    kinds = []
    for body, reason in cases.items():
        with pytest.raises(NotAPath) as info:
            sparql_walk_row(head + body + "}", graph)
        assert reason in info.value.reason
        kinds.append(info.value.kind)
    assert kinds == ["shape", "value_constraint", "unnamed_node", "hidden_relation"]


def test_reference_counts_over_a_benchmark_file(graph):
    rows, rejected = benchmark_walk_rows(read_questions(FIXTURES / "webqsp.json"), graph)
    assert [r["question_id"] for r in rows] == [
        "WebQTest-9001",
        "WebQTest-9002",
        "WebQTest-9003",
        "WebQTest-9004",
        "WebQTest-9006",
    ]
    assert rejected == {"ordering": 1}
    with pytest.raises(ValueError, match="toolset must be one of graphwalker, kgr1"):
        benchmark_reference(WEBQSP["WebQTest-9002"], graph, "isp")
