"""KnowCoder-A1's tool set (kgsynth.agent.spaces.knowcoder.tools): SearchTypes, SearchGraphPatterns
and ExecuteSPARQL on tiny KGs, with exact observations, the caps, typed errors, and hostile
queries that leave the store as it was."""

from __future__ import annotations

import functools
from urllib.parse import quote

import numpy as np
import pytest

from kgsynth.agent import sparql_exec
from kgsynth.agent.config import AgentConfig
from kgsynth.agent.spaces.knowcoder import tools as knowcoder
from kgsynth.agent.toolcall import ToolCall
from kgsynth.agent.tools import ErrorType, ToolEnvironment, ToolResult
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import RDF_TYPE, get_profile
from kgsynth.kg.sparql import literal
from tests.kgfixtures import LABEL, NS, E, R, freebase_kg, movie_kg, movie_ntriples

T = "http://kgsynth.org/type/"
TYPES = {
    "Film": ["Kismet", "Juarez", "Jezebel"],
    "Person": [
        "William Dieterle",
        "William Wyler",
        "Bette Davis",
        "Marlene Dietrich",
        "Ronald Colman",
    ],
    "FilmDirector": ["William Dieterle", "William Wyler"],
    "Genre": ["Drama"],  # no name: shown by its IRI's local name
}
TYPE_NAMES = {"Film": "Film", "Person": "Person", "FilmDirector": "Film director"}


def ent(name: str) -> str:
    return f"{E}{quote(name, safe='')}"


def typed_kg() -> EmbeddedKG:
    lines = [movie_ntriples()]
    for t, members in TYPES.items():
        lines += [f"<{ent(m)}> <{RDF_TYPE}> <{T}{t}> ." for m in members]
        if t in TYPE_NAMES:
            lines.append(f"<{T}{t}> {LABEL} {literal(TYPE_NAMES[t])} .")
    return EmbeddedKG.from_ntriples("\n".join(lines) + "\n", get_profile("generic"))


def env_for(kg: EmbeddedKG, question: str = "", **config) -> ToolEnvironment:
    # the patterns tests here read the ``entities`` reading; the paper's: test_knowcoder_paper
    config.setdefault("knowcoder_patterns", "entities")
    return ToolEnvironment(KGGraph(kg), question, AgentConfig(toolset="knowcoder", **config))


def call(env: ToolEnvironment, tool: str, *args: object) -> ToolResult:
    return env.call(ToolCall(tool, args))  # type: ignore[arg-type]


class FakeDense:
    """A dense scorer that finds ``word`` similar and nothing else."""

    def __init__(self, word: str) -> None:
        self.word = word

    def scores(self, question: str, texts: list[str]) -> np.ndarray:
        return np.array([0.9 if self.word in t else 0.1 for t in texts])


@pytest.fixture(scope="module")
def typed() -> EmbeddedKG:
    return typed_kg()


@pytest.fixture(scope="module")
def movies() -> EmbeddedKG:
    return movie_kg()


def test_the_tool_table_and_its_help():
    env = env_for(movie_kg())
    assert {n: a for n, (a, _) in env.tools.items()} == {
        "SearchTypes": 1,
        "SearchGraphPatterns": 2,
        "ExecuteSPARQL": 1,
    }
    assert [h["usage"].split("(")[0] for h in knowcoder.TOOL_HELP] == list(env.tools)
    assert all(set(h) == {"usage", "description"} for h in knowcoder.TOOL_HELP)


# --- SearchTypes ---------------------------------------------------------------------------


def test_search_types_by_name(typed):
    env = env_for(typed)
    result = env.execute('SearchTypes("film")')
    assert result.ok, result
    assert result.text == (
        'Types matching "film" (showing 2 of 2, best first):\n'
        f"<{T}Film> Film (3 instances)\n"
        f"<{T}FilmDirector> Film director (2 instances)"
    )
    assert result.entities == ("Film", f"{T}Film", "Film director", f"{T}FilmDirector")
    assert call(env, "SearchTypes", "director").text.splitlines()[1:] == [
        f"<{T}FilmDirector> Film director (2 instances)"
    ]
    # an unnamed type is found and shown by its local name
    assert call(env, "SearchTypes", "Genre").text.splitlines()[1:] == [
        f"<{T}Genre> Genre (1 instance)"
    ]


def test_search_types_without_a_match_lists_the_common_types(typed):
    result = call(env_for(typed), "SearchTypes", "spaceship")
    assert result.error == ErrorType.NO_RESULTS
    assert result.text == (
        'Error (no results): no type matches "spaceship"; the most common types: '
        "Person, Film, Film director, Genre."
    )


def test_search_types_by_similarity_when_hybrid(typed):
    env = env_for(typed, relation_ranking="hybrid")
    env.dense = FakeDense("person")
    result = call(env, "SearchTypes", "human being")
    assert result.ok
    assert result.text.splitlines()[:2] == [
        'Types matching "human being" (showing 4 of 4, best first):',
        f"<{T}Person> Person (5 instances)",
    ]
    # bm25 ranking: no shared word, no type
    assert call(env_for(typed), "SearchTypes", "human being").error == ErrorType.NO_RESULTS


def test_search_types_shows_at_most_ten():
    lines = []
    for k in range(12):
        lines.append(f"<{T}Kind{k}> {LABEL} {literal(f'Kind {k}')} .")
        lines += [f"<{E}e{k}_{i}> <{RDF_TYPE}> <{T}Kind{k}> ." for i in range(k + 1)]
    kg = EmbeddedKG.from_ntriples("\n".join(lines) + "\n", get_profile("generic"))
    text = call(env_for(kg), "SearchTypes", "kind").text.splitlines()
    assert text[0] == 'Types matching "kind" (showing 10 of 12, best first):'
    assert text[1:3] == [
        f"<{T}Kind11> Kind 11 (12 instances)",
        f"<{T}Kind10> Kind 10 (11 instances)",
    ]
    assert len(text) == 11


def test_a_kg_without_types_says_so(movies):
    result = call(env_for(movies), "SearchTypes", "film")
    assert result.error == ErrorType.NO_RESULTS
    assert result.text == (
        "Error (no results): this KG has no types (no entity has a type fact); search graph "
        "patterns around the question's entities instead."
    )


# --- SearchGraphPatterns -------------------------------------------------------------------

KISMET_PATTERNS = [
    f"Graph patterns around Kismet <{E}Kismet> (showing 4 of 4, best match first):",
    f"<{E}Kismet> <{R}directed_by> ?x .  # Kismet directed_by ?x; e.g. ?x = William Dieterle",
    f"<{E}Kismet> <{R}directed_by> ?m . ?x <{R}directed_by> ?m .  # Kismet directed_by ?m . "
    "?x directed_by ?m; e.g. ?m = William Dieterle, ?x = Juarez",
    f"<{E}Kismet> <{R}release_year> ?x .  # Kismet release_year ?x; e.g. ?x = 1944",
    f"<{E}Kismet> <{R}starred_actors> ?x .  # Kismet starred_actors ?x; e.g. ?x = Marlene Dietrich",
]


def test_patterns_around_a_named_entity_ranked_by_the_hint(movies):
    env = env_for(movies)
    # two-hop patterns that only lead back to Kismet (release_year, starred_actors) are left out
    result = env.execute(
        """SearchGraphPatterns('SELECT ?x WHERE { "Kismet" ?r ?x }', "who directed")"""
    )
    assert result.ok, result
    assert result.text.splitlines() == KISMET_PATTERNS
    assert result.entities == (
        "Kismet", f"{E}Kismet", "William Dieterle", ent("William Dieterle"), "Juarez",
        f"{E}Juarez", "1944", f"{E}1944", "Marlene Dietrich", ent("Marlene Dietrich"),
    )  # fmt: skip


def test_every_pattern_line_runs_as_sparql(movies):
    env = env_for(movies)
    for line in KISMET_PATTERNS[1:]:
        result = call(env, "ExecuteSPARQL", f"SELECT ?x WHERE {{ {line.split('  #')[0]} }}")
        assert result.ok and result.text.startswith("?x\n"), (line, result)
    assert call(env, "ExecuteSPARQL", f"SELECT ?x WHERE {{ {KISMET_PATTERNS[2]}\n}}").ok


def test_patterns_from_iris_and_prefixed_names(movies):
    env = env_for(movies)
    # the predicate IRI of the sketch is no entity and is skipped
    text = call(
        env, "SearchGraphPatterns", f"SELECT ?x WHERE {{ <{E}Juarez> <{R}has_genre> ?x }}", "genre"
    ).text
    assert text.splitlines()[:2] == [
        f"Graph patterns around Juarez <{E}Juarez> (showing 7 of 7, best match first):",
        f"<{E}Juarez> <{R}has_genre> ?x .  # Juarez has_genre ?x; e.g. ?x = Drama",
    ]
    sketch = f"PREFIX e: <{E}> SELECT ?x WHERE {{ e:Jezebel ?r ?x . ?x ?q e:Juarez }}"
    head = call(env, "SearchGraphPatterns", sketch, "").text.splitlines()[0]
    assert (
        head
        == f"Graph patterns around Jezebel <{E}Jezebel>, Juarez <{E}Juarez> (showing 10 of 13):"
    )


def test_patterns_by_similarity_when_hybrid(movies):
    env = env_for(movies, relation_ranking="hybrid")
    env.dense = FakeDense("starred")
    lines = call(env, "SearchGraphPatterns", "'Kismet'", "who acted in it").text.splitlines()
    assert lines[1] == KISMET_PATTERNS[4]


def test_at_most_ten_patterns_and_twenty_relations_expanded():
    lines = []
    for i in range(25):
        hub, t, u = f"{E}Hub", f"{E}T{i}", f"{E}U{i}"
        lines += [f"<{hub}> <{R}rel_{i:02d}> <{t}> .", f"<{t}> <{R}next> <{u}> ."]
        lines += [f"<{t}> {LABEL} {literal(f'T{i}')} .", f"<{u}> {LABEL} {literal(f'U{i}')} ."]
    lines.append(f"<{E}Hub> {LABEL} {literal('Hub')} .")
    kg = EmbeddedKG.from_ntriples("\n".join(lines) + "\n", get_profile("generic"))
    env = env_for(kg)
    text = call(env, "SearchGraphPatterns", '"Hub"', "").text.splitlines()
    assert text[0] == f"Graph patterns around Hub <{E}Hub> (showing 10 of 45):"  # 25 + 20
    assert text[1:] == [
        f"<{E}Hub> <{R}rel_{i:02d}> ?x .  # Hub rel_{i:02d} ?x; e.g. ?x = T{i}" for i in range(10)
    ]
    hub = env.graph.resolve("Hub").entity
    expanded = [p.first.name for p in knowcoder.graph_patterns(env.graph, hub, list) if p.second]
    assert expanded == [f"rel_{i:02d}" for i in range(20)]
    two_hop = call(env, "SearchGraphPatterns", '"Hub"', "next").text.splitlines()
    assert two_hop[1] == (
        f"<{E}Hub> <{R}rel_00> ?m . ?m <{R}next> ?x .  # Hub rel_00 ?m . ?m next ?x; "
        "e.g. ?m = T0, ?x = U0"
    )


def test_freebase_types_and_patterns_across_unnamed_nodes():
    env = env_for(freebase_kg())
    assert call(env, "SearchTypes", "person").text.splitlines()[1:] == [
        f"<{NS}people.person> people.person (1 instance)"
    ]
    sketch = f"PREFIX ns: <{NS}> SELECT ?x WHERE {{ ns:m.irons ?r ?x }}"
    first = call(env, "SearchGraphPatterns", sketch, "character").text.splitlines()[1]
    assert first == (
        f"<{NS}m.irons> <{NS}film.actor.film> ?c1 . ?c1 <{NS}film.performance.character> ?x .  "
        "# Jeremy Irons film.actor.film.film.performance.character ?x; e.g. ?x = Elliot Mantle"
    )
    pasted = call(env, "ExecuteSPARQL", f"SELECT ?x WHERE {{ {first} \n}}")
    assert pasted.text == "?x\nElliot Mantle"


def test_a_sketch_without_entities_is_entity_not_found(movies):
    env = env_for(movies)
    result = call(env, "SearchGraphPatterns", 'SELECT ?x WHERE { "Nobody Here" ?r ?x }', "x")
    assert result.error == ErrorType.ENTITY_NOT_FOUND
    assert result.text.endswith("in double quotes (no entity named 'Nobody Here').")
    no_names = call(env, "SearchGraphPatterns", "SELECT ?x WHERE { ?x ?r ?y }", "x")
    assert no_names.error == ErrorType.ENTITY_NOT_FOUND


# --- ExecuteSPARQL -------------------------------------------------------------------------


def test_execute_sparql_shows_rows_by_name(typed):
    env = env_for(typed)
    result = env.execute(f'ExecuteSPARQL("SELECT ?d WHERE {{ <{E}Kismet> <{R}directed_by> ?d }}")')
    assert result.ok and result.text == "?d\nWilliam Dieterle"
    assert result.entities == ("William Dieterle",)
    typed_query = f"SELECT ?f WHERE {{ ?f <{RDF_TYPE}> <{T}Film> }} ORDER BY ?f"
    assert call(env, "ExecuteSPARQL", typed_query).text == "?f\nJezebel\nJuarez\nKismet"
    capped = call(env, "ExecuteSPARQL", "SELECT ?a WHERE { ?a ?b ?c . ?d ?e ?f }")
    assert capped.ok and capped.text.count("\n") == 51  # header, 50 rows, the marker
    assert capped.text.endswith(
        "[... more rows; showing the first 50: add a LIMIT or narrow the query]"
    )


HOSTILE = [
    "DELETE WHERE { ?s ?p ?o }",
    "INSERT DATA { <http://x/a> <http://x/b> <http://x/c> }",
    "DROP ALL",
    "SELECT * WHERE { ?s ?p ?o } ; DELETE WHERE { ?s ?p ?o }",
    "SELECT * WHERE { ?s ?p ?o } # \n DELETE WHERE { ?s ?p ?o }",
    "SELECT * WHERE { SERVICE <http://127.0.0.1:9/> { ?s ?p ?o } }",
    "SELECT * WHERE { OPTIONAL { SERVICE <http://127.0.0.1:9/> { ?s ?p ?o } } }",
    "CONSTRUCT { ?s ?p ?o } WHERE { ?s ?p ?o }",
    f"DESCRIBE <{E}Kismet>",
    "not sparql at all",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_are_refused_and_change_nothing(query):
    kg = typed_kg()
    before = sorted(map(str, kg.store))
    result = call(env_for(kg), "ExecuteSPARQL", query)
    assert result.error == ErrorType.QUERY_REFUSED, result
    assert result.text.startswith("Error (query refused): ")
    assert sorted(map(str, kg.store)) == before


def test_a_runaway_cross_join_times_out_as_a_typed_error(monkeypatch):
    kg = typed_kg()
    before = sorted(map(str, kg.store))
    tight = functools.partial(sparql_exec.run_agent_query, timeout=1e-6)
    monkeypatch.setattr(sparql_exec, "run_agent_query", tight)
    env = env_for(kg)
    runaway = "SELECT * WHERE { " + " ".join(f"?s{i} ?p{i} ?o{i} ." for i in range(5)) + " }"
    result = call(env, "ExecuteSPARQL", runaway)
    assert result.error == ErrorType.TIMEOUT, result
    monkeypatch.undo()
    assert call(env, "ExecuteSPARQL", f"ASK {{ <{E}Kismet> ?p ?o }}").text == "true"
    assert sorted(map(str, kg.store)) == before


# --- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("SearchTypes", ("  ",)),
        ("SearchGraphPatterns", ("", "hint")),
        ("SearchGraphPatterns", ('"Kismet"', ("a", "b"))),
        ("ExecuteSPARQL", ("\n",)),
    ],
)
def test_bad_arguments_are_wrong_arguments(movies, tool, args):
    result = call(env_for(movies), tool, *args)
    assert result.error == ErrorType.WRONG_ARGUMENTS
    assert result.text == f"Error (wrong arguments): wrong arguments; use {knowcoder.USAGE[tool]}."


def test_a_wrong_number_of_arguments_is_wrong_arguments(movies):
    result = env_for(movies).execute('SearchTypes("film", "extra")')
    assert result.error == ErrorType.WRONG_ARGUMENTS
    assert result.text.endswith(f"use {knowcoder.USAGE['SearchTypes']}.")
