"""Agent-written SPARQL (kgsynth.agent.sparql_exec) against real backends: the embedded store,
``oxigraph serve`` and Virtuoso (when installed).

Hostile queries (updates smuggled past comments and strings, SERVICE anywhere, CONSTRUCT and
DESCRIBE, runaway joins) are sent the way an agent's ``ExecuteSPARQL``/``sparql`` call sends
them, through a tool environment: every refusal and timeout comes back as a typed tool error
the agent reads, the store keeps the triples it had, and the recording server named in every
SERVICE hears nothing.
"""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings

from kgsynth.agent.spaces.sparql import sparql_result
from kgsynth.agent.sparql_exec import AGENT_MAX_ROWS, QueryRefused, query_form, run_agent_query
from kgsynth.agent.toolcall import ToolCall
from kgsynth.agent.tools import ErrorType, ToolEnvironment, ToolResult
from kgsynth.kg.base import KG
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.importer import import_kg
from tests.servers import FIXTURE_NT
from tests.test_guard import SETTINGS as GUARD_SETTINGS
from tests.test_guard import (  # noqa: F401  (backend and recorder: the guard tests' fixtures)
    Recorder,
    backend,
    count,
    recorder,
    service_calls,
    smuggled_updates,
    writable_embedded,
)

# the guard's own tests send 150 cases per family and backend; these check that what it refuses
# reaches the agent as a typed error, on fewer
SETTINGS = settings(GUARD_SETTINGS, max_examples=25)
REFUSALS: collections.Counter[str] = collections.Counter()  # refusals per backend and kind
E = "http://kgsynth.org/entity/"
R = "http://kgsynth.org/relation/"
# six copies of every triple joined: far more rows than any timeout lets through
RUNAWAY = (
    "SELECT (COUNT(*) AS ?n) WHERE { " + " ".join(f"?s{i} ?p{i} ?o{i} ." for i in range(6)) + " }"
)


@pytest.fixture
def store(backend: KG) -> KG:  # noqa: F811  (the imported fixture, by name)
    """Each of the guard tests' backends (embedded, oxigraph serve, Virtuoso), writable, so a
    query that changed it would show."""
    return backend


@pytest.fixture
def listener(recorder: Recorder) -> Recorder:  # noqa: F811  (the imported fixture)
    """The guard tests' recording server, named in every SERVICE."""
    return recorder


def agent_env(kg: KG, timeout: float = 10.0) -> ToolEnvironment:
    """A tool environment whose one tool runs the agent's query as ExecuteSPARQL does."""
    env = ToolEnvironment(KGGraph(kg), "who directed Amelie")
    env.tools = {"sparql": (1, lambda q: sparql_result(env, q, "sparql", timeout=timeout))}
    return env


def call(env: ToolEnvironment, query: str) -> ToolResult:
    return env.call(ToolCall("sparql", (query,)))


def test_answers_are_shown_by_name_and_capped(store: KG):
    graph = KGGraph(store)
    ans = run_agent_query(graph, f"SELECT ?d WHERE {{ <{E}Amelie> <{R}directed_by> ?d }}")
    assert ans.text == "?d\nJean-Pierre Jeunet" and ans.names == ("Jean-Pierre Jeunet",)
    assert run_agent_query(graph, f"ASK {{ <{E}Amelie> ?p ?o }}").text == "true"
    capped = run_agent_query(graph, "SELECT ?s ?p ?o WHERE { ?s ?p ?o }", max_rows=3)
    assert capped.capped and capped.text.count("\n") == 4  # header, 3 rows, the marker
    assert "showing the first 3" in capped.text
    assert run_agent_query(graph, f"SELECT ?x WHERE {{ <{E}Nobody> ?p ?x }}").text == "no rows"
    assert AGENT_MAX_ROWS == 50


def test_smuggled_updates_are_refused_as_typed_errors(store: KG, listener: Recorder):
    env, before = agent_env(store), count(store)
    name = store.backend_name  # type: ignore[attr-defined]

    @SETTINGS
    @given(query=smuggled_updates(listener.url))
    def check(query: str) -> None:
        result = call(env, query)
        if result.error is not None:
            assert result.error == ErrorType.QUERY_REFUSED, (result, query)
            assert result.text.startswith("Error (query refused): the query was refused")
            REFUSALS[f"{name}: update"] += 1
        assert count(store) == before
        assert listener.hits == []

    check()


def test_service_anywhere_is_refused_and_calls_nothing(store: KG, listener: Recorder):
    env, before = agent_env(store), count(store)
    name = store.backend_name  # type: ignore[attr-defined]

    @SETTINGS
    @given(query=service_calls(listener.url))
    def check(query: str) -> None:
        result = call(env, query)
        assert result.error == ErrorType.QUERY_REFUSED, query
        REFUSALS[f"{name}: service"] += 1
        assert listener.hits == [] and count(store) == before

    check()


@pytest.mark.parametrize(
    "query",
    [
        "CONSTRUCT { ?s ?p ?o } WHERE { ?s ?p ?o }",
        "DESCRIBE <http://kgsynth.org/entity/Amelie>",
        "PREFIX e: <http://kgsynth.org/entity/> construct { ?s ?p ?o } WHERE { ?s ?p ?o }",
    ],
)
def test_only_select_and_ask_are_run(store: KG, query: str):
    result = call(agent_env(store), query)
    assert result.error == ErrorType.QUERY_REFUSED
    assert "write a SELECT or an ASK query" in result.text
    REFUSALS[f"{store.backend_name}: form"] += 1  # type: ignore[attr-defined]


def test_a_runaway_query_times_out_as_a_typed_error_and_the_store_answers_after(
    store: KG, tmp_path
):
    if store.backend_name == "embedded":  # type: ignore[attr-defined]
        # an embedded store stops a query at its deadline only when its queries run in a child
        # process (isolate=True, a store directory); in process the timeout waits for the end
        src = tmp_path / "fixture.nt"
        src.write_text(FIXTURE_NT)
        import_kg(src, tmp_path / "kg", profile="generic", force=True)
        store = EmbeddedKG.open(tmp_path / "kg", isolate=True)
        store.backend_name = "embedded"  # type: ignore[attr-defined]
    env, before = agent_env(store, timeout=0.5), count(store)
    result = call(env, RUNAWAY)
    assert result.error == ErrorType.TIMEOUT, result
    REFUSALS[f"{store.backend_name}: timeout"] += 1  # type: ignore[attr-defined]
    follow_up = call(agent_env(store), f"ASK {{ <{E}Amelie> ?p ?o }}")
    assert follow_up.ok and follow_up.text == "true"
    assert count(store) == before


def test_query_form_and_refusal_text():
    assert query_form("PREFIX a: <http://x/>\nselect * WHERE { ?s ?p ?o }") == "SELECT"
    assert query_form("  ask { ?s ?p ?o }") == "ASK"
    assert query_form("INSERT DATA { <a> <b> <c> }") is None
    graph = KGGraph(writable_embedded())
    with pytest.raises(QueryRefused, match="SERVICE"):
        run_agent_query(graph, "SELECT * WHERE { SERVICE <http://127.0.0.1:9/> { ?s ?p ?o } }")


def test_refusals_per_backend() -> None:
    """Reports how many refusals each store gave, by kind (shown with -rP / -s)."""
    for key in sorted(REFUSALS):
        print(f"{key}: {REFUSALS[key]}")
