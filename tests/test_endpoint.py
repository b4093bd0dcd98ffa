"""The SPARQL endpoint backend against real servers, a scripted fake server, and the embedded KG.

- Backend parity: the same queries and KGGraph look-ups give the same answers on the embedded
  store, a real Oxigraph server and a real Virtuoso 7.2 (``-m virtuoso`` selects only those).
- Fault handling: a tiny local HTTP server answers with scripted statuses, bodies and delays,
  and counts the requests that reach it.
- The read-only guard stops updates before any request is sent.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyoxigraph as ox
import pytest

from kgsynth.core.errors import KGError, KGTimeoutError, KGUnavailableError, QueryRejectedError
from kgsynth.kg import guard
from kgsynth.kg.base import KG
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.endpoint import SparqlEndpointKG, binding_to_term
from kgsynth.kg.graph import Entity, KGGraph, Neighbor, Relation, Resolution
from kgsynth.kg.profiles import get_profile
from kgsynth.kg.terms import Term
from tests.servers import (
    ENTITY,
    FIXTURE_NT,
    NAME_BACKSLASH,
    NAME_FRENCH,
    NAME_QUOTES,
    OWL_SAME_AS,
    RDFS_LABEL,
    RELATION,
    XSD_INTEGER,
    free_port,
)

XSD_STRING = "http://www.w3.org/2001/XMLSchema#string"
RDF_LANG_STRING = "http://www.w3.org/1999/02/22-rdf-syntax-ns#langString"
GENERIC = get_profile("generic")

BACKENDS = ["embedded", "oxigraph", pytest.param("virtuoso", marks=pytest.mark.virtuoso)]


def e(local: str) -> str:
    return ENTITY + local


def r(local: str) -> str:
    return RELATION + local


def iri_term(local: str) -> Term:
    return Term("iri", e(local))


def year(value: str) -> Term:
    return Term("literal", value, XSD_INTEGER)


def plain(value: str) -> Term:
    return Term("literal", value, XSD_STRING)


def as_set(rows: list[dict[str, Term]]) -> set[frozenset[tuple[str, Term]]]:
    return {frozenset(row.items()) for row in rows}


# --- backends -------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def kg(request: pytest.FixtureRequest, embedded_kg: EmbeddedKG) -> KG:
    """The fixture KG behind each backend (servers start once per session)."""
    if request.param == "embedded":
        return embedded_kg
    url = request.getfixturevalue(f"{request.param}_endpoint")
    return SparqlEndpointKG(url, GENERIC, timeout=30, retries=1, backoff=0.01)


@pytest.fixture(scope="module")
def graph(kg: KG) -> KGGraph:
    return KGGraph(kg)


def _term_from_oxigraph(node: Any) -> Term:
    """Independent of kgsynth's converters: what an RDF 1.1 term is."""
    if isinstance(node, ox.NamedNode):
        return Term("iri", node.value)
    return Term("literal", node.value, node.datatype.value, node.language)


def fixture_triples(*, with_lang: bool) -> set[frozenset[tuple[str, Term]]]:
    rows = set()
    for triple in ox.parse(FIXTURE_NT.encode(), format=ox.RdfFormat.N_TRIPLES):
        terms = {
            "s": _term_from_oxigraph(triple.subject),
            "p": _term_from_oxigraph(triple.predicate),
            "o": _term_from_oxigraph(triple.object),
        }
        if with_lang or terms["o"].lang is None:
            rows.add(frozenset(terms.items()))
    return rows


# --- SELECT / ASK parity --------------------------------------------------------------------


def test_select_all_fixture_triples(kg: KG) -> None:
    rows = kg.select(
        "SELECT ?s ?p ?o WHERE { ?s ?p ?o "
        f'FILTER(STRSTARTS(STR(?s), "{ENTITY}") && (!isLiteral(?o) || LANG(?o) = "")) }}'
    )
    assert len(rows) == 33
    assert as_set(rows) == fixture_triples(with_lang=False)


SELECT_CASES = [
    pytest.param(
        f"SELECT ?film ?year WHERE {{ ?film <{r('release_year')}> ?year }}",
        [
            {"film": iri_term("Amelie"), "year": year("2001")},
            {"film": iri_term("The_Matrix"), "year": year("1999")},
            {"film": iri_term("Kismet_1955"), "year": year("1955")},
        ],
        id="typed-literals",
    ),
    pytest.param(
        f"SELECT ?film ?year WHERE {{ ?film <{r('directed_by')}> ?d "
        f"OPTIONAL {{ ?film <{r('release_year')}> ?year }} }}",
        [
            {"film": iri_term("Amelie"), "year": year("2001")},
            {"film": iri_term("The_Matrix"), "year": year("1999")},
            {"film": iri_term("Kismet_1955"), "year": year("1955")},
            {"film": iri_term("Kismet_1944")},
            {"film": iri_term("Okami")},
        ],
        id="optional-unbound",
    ),
    pytest.param(
        f"SELECT (COUNT(*) AS ?n) WHERE {{ ?s <{RDFS_LABEL}> ?l }}",
        [{"n": Term("literal", "17", XSD_INTEGER)}],
        id="count",
    ),
    pytest.param(
        f'SELECT ?e WHERE {{ ?e <{RDFS_LABEL}> "Ōkami" }}',
        [{"e": iri_term("Okami")}],
        id="unicode-literal",
    ),
    pytest.param(
        f'SELECT ?e WHERE {{ ?e <{RDFS_LABEL}> "Tom \\"Tiger\\" O\'Neil" }}',
        [{"e": iri_term("Tom_ONeil")}],
        id="quotes-literal",
    ),
    pytest.param(
        f'SELECT ?e WHERE {{ ?e <{RDFS_LABEL}> "back\\\\slash" }}',
        [{"e": iri_term("Back_Slash")}],
        id="backslash-literal",
    ),
    pytest.param(
        f"SELECT ?l WHERE {{ <{e('Tom_ONeil')}> <{RDFS_LABEL}> ?l }}",
        [{"l": plain(NAME_QUOTES)}],
        id="quotes-in-results",
    ),
    pytest.param(
        f"SELECT ?l WHERE {{ <{e('Back_Slash')}> <{RDFS_LABEL}> ?l }}",
        [{"l": plain(NAME_BACKSLASH)}],
        id="backslash-in-results",
    ),
    pytest.param(
        f'SELECT ?e WHERE {{ ?e <{RDFS_LABEL}> "DROP ALL" }}',
        [],
        id="no-rows",
    ),
]


@pytest.mark.parametrize(("query", "expected"), SELECT_CASES)
def test_select_rows(kg: KG, query: str, expected: list[dict[str, Term]]) -> None:
    rows = kg.select(query)
    assert len(rows) == len(expected)
    assert as_set(rows) == as_set(expected)


def test_language_tagged_literal_is_the_same_term(kg: KG) -> None:
    """RDF 1.1: a language-tagged literal's datatype is rdf:langString, on every backend."""
    rows = kg.select(
        f'SELECT ?l WHERE {{ <{e("Amelie")}> <{RDFS_LABEL}> ?l FILTER(LANG(?l) = "fr") }}'
    )
    assert rows == [{"l": Term("literal", NAME_FRENCH, RDF_LANG_STRING, "fr")}]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (f"ASK {{ <{e('Amelie')}> <{r('directed_by')}> <{e('Jean-Pierre_Jeunet')}> }}", True),
        (f"ASK {{ <{e('Amelie')}> <{r('directed_by')}> <{e('Hideki_Kamiya')}> }}", False),
        (f'ASK {{ ?e <{RDFS_LABEL}> "Amélie" }}', True),
        (f'ASK {{ ?e <{RDFS_LABEL}> "amélie" }}', False),
    ],
)
def test_ask(kg: KG, query: str, expected: bool) -> None:
    assert kg.ask(query) is expected


# --- KGGraph parity -------------------------------------------------------------------------

RESOLVE_CASES = [
    ("Amélie", "Amelie", "Amélie", "exact", 1),
    ("  Amélie ", "Amelie", "Amélie", "exact", 1),
    ("AMÉLIE", "Amelie", "Amélie", "case-insensitive", 1),
    (unicodedata.normalize("NFD", "Amélie"), "Amelie", "Amélie", "case-insensitive", 1),
    ("The Matrix", "The_Matrix", "The Matrix", "exact", 1),
    ("the matrix", "The_Matrix", "The Matrix", "case-insensitive", 1),
    ("Kismet", "Kismet_1955", "Kismet", "exact", 2),
    ("KISMET", "Kismet_1955", "Kismet", "case-insensitive", 2),
    ("Ōkami", "Okami", "Ōkami", "exact", 1),
    ("ōkami", "Okami", "Ōkami", "case-insensitive", 1),
    (NAME_QUOTES, "Tom_ONeil", NAME_QUOTES, "exact", 1),
    (NAME_QUOTES.upper(), "Tom_ONeil", NAME_QUOTES, "case-insensitive", 1),
    (NAME_BACKSLASH, "Back_Slash", NAME_BACKSLASH, "exact", 1),
    ("BACK\\SLASH", "Back_Slash", NAME_BACKSLASH, "case-insensitive", 1),
]


@pytest.mark.parametrize(("name", "local", "shown", "match", "candidates"), RESOLVE_CASES)
def test_resolve(
    graph: KGGraph, name: str, local: str, shown: str, match: str, candidates: int
) -> None:
    assert graph.resolve(name) == Resolution(Entity(e(local), shown), match, candidates)


@pytest.mark.parametrize(
    "name",
    [
        "Nonexistent Film",
        NAME_FRENCH,  # a French label is not a name in the generic profile
        "Paris",  # an entity without a label
        "",
        "   ",
        "Kis\x00met",
        "back\\\\slash",  # two backslashes: not the name with one
        '"Kismet"',
        'Kismet" } UNION { ?e ?p ?o } #',
    ],
)
def test_resolve_unknown(graph: KGGraph, name: str) -> None:
    assert graph.resolve(name) is None


def rel(name: str, direction: str) -> Relation:
    return Relation(name, direction, (r(name),))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("local", "expected"),
    [
        (
            "Amelie",
            [
                rel("directed_by", "out"),
                rel("filmed_in", "out"),
                rel("release_year", "out"),
                rel("starred_actors", "out"),
            ],
        ),
        (
            "Tom_ONeil",
            [rel("influenced_by", "in"), rel("influenced_by", "out"), rel("starred_actors", "in")],
        ),
        (
            "The_Matrix",  # owl:sameAs is hidden
            [rel("directed_by", "out"), rel("release_year", "out"), rel("starred_actors", "out")],
        ),
        ("Paris", [rel("filmed_in", "in")]),
        ("Nobody", []),
    ],
)
def test_relations(graph: KGGraph, local: str, expected: list[Relation]) -> None:
    assert graph.relations(e(local)) == expected


@pytest.mark.parametrize(
    ("local", "relation", "expected"),
    [
        (
            "Tom_ONeil",
            rel("influenced_by", "out"),
            [Neighbor(iri_term("Back_Slash"), NAME_BACKSLASH)],
        ),
        (
            "Tom_ONeil",
            rel("influenced_by", "in"),
            [Neighbor(iri_term("Keanu_Reeves"), "Keanu Reeves")],
        ),
        (
            "The_Matrix",
            rel("starred_actors", "out"),
            [
                Neighbor(iri_term("Keanu_Reeves"), "Keanu Reeves"),
                Neighbor(iri_term("Tom_ONeil"), NAME_QUOTES),
            ],
        ),
        ("Amelie", rel("release_year", "out"), [Neighbor(year("2001"), "2001")]),
        ("Amelie", rel("filmed_in", "out"), [Neighbor(iri_term("Paris"), "Paris")]),
        ("Jean-Pierre_Jeunet", rel("directed_by", "in"), [Neighbor(iri_term("Amelie"), "Amélie")]),
        ("Musical", rel("has_genre", "in"), [Neighbor(iri_term("Kismet_1955"), "Kismet")]),
        ("Musical", rel("has_genre", "out"), []),
    ],
)
def test_neighbors(
    graph: KGGraph, local: str, relation: Relation, expected: list[Neighbor]
) -> None:
    assert graph.neighbors(e(local), relation) == expected


def test_hidden_relation_is_not_listed(graph: KGGraph) -> None:
    paths = {p for rel_ in graph.relations(e("The_Matrix")) for p in rel_.path}
    assert OWL_SAME_AS not in paths
    assert RDFS_LABEL not in paths


def test_graph_matches_embedded_on_every_entity(graph: KGGraph, embedded_kg: EmbeddedKG) -> None:
    """Every entity's relations and every relation's neighbours equal the embedded store's."""
    reference = KGGraph(embedded_kg)
    entities = sorted(
        {
            t.value
            for triple in ox.parse(FIXTURE_NT.encode(), format=ox.RdfFormat.N_TRIPLES)
            for t in (triple.subject, triple.object)
            if isinstance(t, ox.NamedNode) and t.value.startswith(ENTITY)
        }
    )
    assert len(entities) == 17
    for entity in entities:
        relations = reference.relations(entity)
        assert relations, entity
        assert graph.relations(entity) == relations, entity
        assert graph.label(entity) == reference.label(entity), entity
        for relation in relations:
            assert graph.neighbors(entity, relation) == reference.neighbors(entity, relation)


def test_batched_lookups_match_one_by_one(
    kg: KG, embedded_kg: EmbeddedKG, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``prefetch_lookups`` fetches in batched queries (fan-outs, targets, names) equals
    the embedded store's one-by-one look-ups, in the same order, and the look-ups then send no
    query (on Virtuoso the default graph is the union of the named graphs)."""
    reference = KGGraph(embedded_kg, cache_size=0)
    entities = sorted(
        {
            t.value
            for triple in ox.parse(FIXTURE_NT.encode(), format=ox.RdfFormat.N_TRIPLES)
            for t in (triple.subject, triple.object)
            if isinstance(t, ox.NamedNode) and t.value.startswith(ENTITY)
        }
    )
    fanouts = {e: list(reference.fanouts(e).items()) for e in entities}
    targets = {(e, rel): reference.targets(e, rel) for e in entities for rel, _ in fanouts[e]}
    labels = {e: reference.label(e) for e in entities}
    graph = KGGraph(kg)
    graph.prefetch_lookups(entities, list(targets), entities)
    sent: list[str] = []
    monkeypatch.setattr(kg, "_select", lambda query, timeout: sent.append(query) or [])
    assert {e: list(graph.fanouts(e).items()) for e in entities} == fanouts
    assert {pair: graph.targets(*pair) for pair in targets} == targets
    assert {e: graph.label(e) for e in entities} == labels
    assert sent == []


def test_select_iter_gives_the_rows_of_select(kg: KG) -> None:
    query = f"SELECT ?film ?d WHERE {{ ?film <{r('directed_by')}> ?d }} ORDER BY ?film"
    rows = kg.select_iter(query)
    assert next(rows) == kg.select(query)[0]
    assert [next(rows), *rows] == kg.select(query)[1:]
    with pytest.raises(QueryRejectedError):
        kg.select_iter("DROP ALL")


# --- a scripted fake endpoint ---------------------------------------------------------------

SELECT_JSON = {
    "head": {"vars": ["film", "year"]},
    "results": {
        "bindings": [
            {
                "film": {"type": "uri", "value": e("Amelie")},
                "year": {"type": "typed-literal", "datatype": XSD_INTEGER, "value": "2001"},
            }
        ]
    },
}
SELECT_ROWS = [{"film": iri_term("Amelie"), "year": year("2001")}]
QUERY = f"SELECT ?film ?year WHERE {{ ?film <{r('release_year')}> ?year }}"


@dataclass(frozen=True)
class Reply:
    """One scripted answer: HTTP status, body, a delay before answering, and whether to hang
    up right after it (as a server does with an idle keep-alive connection), unannounced."""

    status: int = 200
    body: bytes = json.dumps(SELECT_JSON).encode()
    delay: float = 0.0
    hang_up: bool = False


@dataclass
class FakeEndpoint:
    """Answers request *i* with ``replies[i]`` (the last reply repeats) and records requests,
    the client port each came from and the request target. ``keep_alive``: speak HTTP/1.1
    (connections stay open) instead of HTTP/1.0."""

    replies: list[Reply]
    keep_alive: bool = False
    url: str = ""
    requests: list[dict[str, list[str]]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_reply(self, form: dict[str, list[str]], port: int = 0, target: str = "") -> Reply:
        with self.lock:
            self.requests.append(form)
            self.ports.append(port)
            self.targets.append(target)
            return self.replies[min(len(self.requests), len(self.replies)) - 1]


def _handler(fake: FakeEndpoint) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if fake.keep_alive else "HTTP/1.0"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode()
            reply = fake.next_reply(urllib.parse.parse_qs(body), self.client_address[1], self.path)
            if reply.delay and fake.stop.wait(reply.delay):
                return
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/sparql-results+json")
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            if reply.hang_up:
                self.close_connection = True

        def do_GET(self) -> None:
            query = urllib.parse.urlsplit(self.path).query
            fake.next_reply(urllib.parse.parse_qs(query))
            self.send_error(405)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and hung up is expected here


@pytest.fixture
def fake_endpoint() -> Iterator[Callable[..., FakeEndpoint]]:
    """``fake_endpoint(Reply(...), ...)`` starts a scripted endpoint on 127.0.0.1."""
    running: list[tuple[FakeEndpoint, _QuietServer, threading.Thread]] = []

    def start(*replies: Reply, keep_alive: bool = False) -> FakeEndpoint:
        fake = FakeEndpoint(list(replies) or [Reply()], keep_alive)
        server = _QuietServer(("127.0.0.1", 0), _handler(fake))
        fake.url = f"http://127.0.0.1:{server.server_address[1]}/sparql"
        thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
        thread.start()
        running.append((fake, server, thread))
        return fake

    yield start
    for fake, server, thread in running:
        fake.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def endpoint(url: str, **kwargs: Any) -> SparqlEndpointKG:
    kwargs.setdefault("retries", 3)
    kwargs.setdefault("backoff", 0.01)
    kwargs.setdefault("timeout", 5)
    return SparqlEndpointKG(url, GENERIC, **kwargs)


def test_fake_endpoint_success(fake_endpoint: Callable[..., FakeEndpoint]) -> None:
    fake = fake_endpoint(Reply())
    assert endpoint(fake.url).select(QUERY) == SELECT_ROWS
    assert len(fake.requests) == 1
    assert fake.requests[0]["query"] == [QUERY]


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_transient_error_then_success_is_retried(
    fake_endpoint: Callable[..., FakeEndpoint], status: int
) -> None:
    fake = fake_endpoint(Reply(status, b"busy"), Reply())
    kg = endpoint(fake.url)
    assert kg.select(QUERY) == SELECT_ROWS
    assert len(fake.requests) == 2
    assert kg.stats == {"queries": 2, "retries": 1}


@pytest.mark.parametrize("status", [500, 503, 429])
def test_persistent_error_is_unavailable_after_retries(
    fake_endpoint: Callable[..., FakeEndpoint], status: int
) -> None:
    fake = fake_endpoint(Reply(status, b"down"))
    with pytest.raises(KGUnavailableError, match="after 4 attempts"):
        endpoint(fake.url, retries=3).select(QUERY)
    assert len(fake.requests) == 4


def test_ask_is_retried(fake_endpoint: Callable[..., FakeEndpoint]) -> None:
    fake = fake_endpoint(Reply(503, b"down"), Reply(body=b'{"head": {}, "boolean": true}'))
    assert endpoint(fake.url).ask("ASK { ?s ?p ?o }") is True
    assert len(fake.requests) == 2


def test_connection_refused_is_unavailable() -> None:
    kg = endpoint(f"http://127.0.0.1:{free_port()}/sparql", retries=2)
    started = time.monotonic()
    with pytest.raises(KGUnavailableError, match="after 3 attempts"):
        kg.select(QUERY)
    assert kg.stats["queries"] == 3
    assert time.monotonic() - started < 5


# 0.5 s: SPARQLWrapper.setTimeout() would round it down to 0 (no timeout)
@pytest.mark.parametrize(("kg_timeout", "call_timeout"), [(1.0, None), (30.0, 1.0), (30.0, 0.5)])
def test_slow_server_times_out_quickly(
    fake_endpoint: Callable[..., FakeEndpoint], kg_timeout: float, call_timeout: float | None
) -> None:
    fake = fake_endpoint(Reply(delay=20))
    kg = endpoint(fake.url, timeout=kg_timeout)
    started = time.monotonic()
    with pytest.raises(KGTimeoutError):
        kg.select(QUERY, timeout=call_timeout)
    assert time.monotonic() - started < 3
    assert len(fake.requests) == 1


@pytest.mark.parametrize("body", [b"{not json", b"", b"<html>502 Bad Gateway</html>", b"[]"])
def test_malformed_json_is_retried_then_unavailable(
    fake_endpoint: Callable[..., FakeEndpoint], body: bytes
) -> None:
    fake = fake_endpoint(Reply(200, body))
    with pytest.raises(KGUnavailableError, match="malformed JSON"):
        endpoint(fake.url, retries=2).select(QUERY)
    assert len(fake.requests) == 3


def test_malformed_json_then_success(fake_endpoint: Callable[..., FakeEndpoint]) -> None:
    fake = fake_endpoint(Reply(200, b"{not json"), Reply())
    assert endpoint(fake.url).select(QUERY) == SELECT_ROWS
    assert len(fake.requests) == 2


def test_http_400_is_rejected_without_retry(fake_endpoint: Callable[..., FakeEndpoint]) -> None:
    fake = fake_endpoint(Reply(400, b"Parse error: unexpected token"))
    kg = endpoint(fake.url)
    with pytest.raises(QueryRejectedError):
        kg.select(QUERY)
    assert len(fake.requests) == 1
    assert kg.stats["retries"] == 0


def test_queries_share_one_keep_alive_connection(
    fake_endpoint: Callable[..., FakeEndpoint],
) -> None:
    fake = fake_endpoint(Reply(), keep_alive=True)
    kg = endpoint(fake.url)
    for _ in range(5):
        assert kg.select(QUERY) == SELECT_ROWS
    assert len(fake.requests) == 5
    assert len(set(fake.ports)) == 1
    kg.close()


def test_sparqlwrapper_builds_every_request(
    fake_endpoint: Callable[..., FakeEndpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPARQLWrapper is the client: each request is the one its ``_createRequest`` builds (form
    POST, its format parameters), and its QueryResult converts the answer; only the transport
    is the keep-alive connection, never urllib's urlopen."""
    import SPARQLWrapper.Wrapper as wrapper_module

    from kgsynth.kg.endpoint import KeepAliveSPARQLWrapper

    built: list[bytes] = []
    original = KeepAliveSPARQLWrapper._createRequest

    def spy(self: Any) -> Any:
        request = original(self)
        built.append(request.data)
        return request

    def no_urlopen(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("urlopen used: a new connection per query")

    monkeypatch.setattr(KeepAliveSPARQLWrapper, "_createRequest", spy)
    monkeypatch.setattr(wrapper_module, "urlopener", no_urlopen)
    fake = fake_endpoint(Reply(), keep_alive=True)
    kg = endpoint(fake.url)
    assert issubclass(KeepAliveSPARQLWrapper, wrapper_module.SPARQLWrapper)
    for _ in range(3):
        assert kg.select(QUERY) == SELECT_ROWS
    assert len(built) == 3 and len(set(fake.ports)) == 1
    form = fake.requests[0]
    assert form["query"] == [QUERY] and form["format"] == ["json"] and form["output"] == ["json"]
    kg.close()


def test_query_form_is_the_callers_not_a_guess(
    fake_endpoint: Callable[..., FakeEndpoint],
) -> None:
    """SPARQLWrapper's ``setQuery`` reads this SELECT as an ADD update (its regex skips upper-case
    ``PREFIX`` lines only and finds ``add`` in the IRI) and would send it as ``update=``."""
    from SPARQLWrapper import SPARQLWrapper

    query = "prefix ex: <http://example.org/address#> select ?film ?year where { ?film ex:y ?year }"
    guessed = SPARQLWrapper("http://127.0.0.1/sparql")
    guessed.setQuery(query)
    assert guessed.isSparqlUpdateRequest()  # the trap is real in this SPARQLWrapper
    fake = fake_endpoint(Reply(), Reply(body=b'{"head": {}, "boolean": true}'))
    kg = endpoint(fake.url)
    assert kg.select(query) == SELECT_ROWS
    assert kg.ask(query.replace("select ?film ?year where", "ask")) is True
    assert [sorted(form) for form in fake.requests] == [
        ["format", "output", "query", "results"]
    ] * 2
    assert fake.requests[0]["query"] == [query]


def test_a_query_is_one_write(
    fake_endpoint: Callable[..., FakeEndpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Head and body go out in one ``send`` (http.client alone writes them apart)."""
    from kgsynth.kg import endpoint as endpoint_module

    writes: list[bytes] = []
    send = endpoint_module._HTTPConnection.send

    def counting_send(self: Any, data: bytes) -> None:
        writes.append(data)
        send(self, data)

    monkeypatch.setattr(endpoint_module._HTTPConnection, "send", counting_send)
    fake = fake_endpoint(Reply(), keep_alive=True)
    kg = endpoint(fake.url)
    for _ in range(3):
        assert kg.select(QUERY) == SELECT_ROWS
    assert len(writes) == 3
    head, body = writes[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /sparql HTTP/1.1\r\n")
    assert urllib.parse.parse_qs(body.decode())["query"] == [QUERY]
    kg.close()


def test_connection_the_server_closed_is_reopened(
    fake_endpoint: Callable[..., FakeEndpoint],
) -> None:
    fake = fake_endpoint(Reply(hang_up=True), Reply(), keep_alive=True)
    kg = endpoint(fake.url)
    assert kg.select(QUERY) == SELECT_ROWS
    time.sleep(0.05)  # the server has hung up by now
    assert kg.select(QUERY) == SELECT_ROWS
    assert len(fake.requests) == 2
    assert len(set(fake.ports)) == 2
    assert kg.stats == {"queries": 2, "retries": 0}


def test_threads_use_their_own_connections(fake_endpoint: Callable[..., FakeEndpoint]) -> None:
    fake = fake_endpoint(Reply(delay=0.01), keep_alive=True)
    kg = endpoint(fake.url)
    results: list[bool] = []

    def work() -> None:
        results.extend(kg.select(QUERY) == SELECT_ROWS for _ in range(10))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 40
    assert len(set(fake.ports)) == 4
    kg.close()


def test_http_proxy_from_the_environment(
    fake_endpoint: Callable[..., FakeEndpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = fake_endpoint(Reply())
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy.url.rsplit("/", 1)[0])
    kg = endpoint("http://sparql.example.invalid:8890/sparql")
    assert kg.select(QUERY) == SELECT_ROWS
    assert proxy.targets == ["http://sparql.example.invalid:8890/sparql"]
    assert proxy.requests[0]["query"] == [QUERY]


def test_real_server_rejects_bad_syntax(oxigraph_endpoint: str) -> None:
    kg = endpoint(oxigraph_endpoint)
    with pytest.raises(QueryRejectedError):
        kg.select("SELECT ?s WHERE { ?s ?p }")
    assert kg.stats["retries"] == 0


# --- read-only guard ------------------------------------------------------------------------

UPDATES = [
    "INSERT DATA { <http://a> <http://b> <http://c> }",
    "DROP ALL",
    "drop all",
    "SELECT * WHERE { ?s ?p ?o } ; DELETE WHERE { ?s ?p ?o }",
    "PREFIX ex: <http://example.org/> INSERT DATA { ex:a ex:b ex:c }",
    "WITH <http://g> DELETE { ?s ?p ?o } WHERE { ?s ?p ?o }",
    "CLEAR DEFAULT",
    "LOAD <http://example.org/kg.nt>",
    "ASK { ?s ?p ?o } ; DROP ALL",
    "",
]


@pytest.mark.parametrize("method", ["select", "ask"])
@pytest.mark.parametrize("update", UPDATES)
def test_update_is_refused_before_sending(
    fake_endpoint: Callable[..., FakeEndpoint], update: str, method: str
) -> None:
    fake = fake_endpoint(Reply())
    kg = endpoint(fake.url)
    with pytest.raises(QueryRejectedError):
        getattr(kg, method)(update)
    assert fake.requests == []
    assert kg.stats["queries"] == 0


@pytest.mark.parametrize(
    "query",
    [
        'SELECT ?s WHERE { ?s ?p "DROP ALL" }',
        "SELECT ?s WHERE { ?s ?p 'INSERT DATA { <http://a> <http://b> <http://c> }' }",
        'SELECT ?s WHERE { ?s ?p "say \\"DROP ALL\\" now" }',
        'SELECT ?s WHERE { ?s ?p """multi\nline DELETE WHERE""" }',
        "# DROP ALL\nSELECT ?s WHERE { ?s <http://kgsynth.org/relation/DROP> ?o }",
    ],
)
def test_update_words_inside_literals_are_allowed(
    fake_endpoint: Callable[..., FakeEndpoint], embedded_kg: EmbeddedKG, query: str
) -> None:
    fake = fake_endpoint(Reply())
    assert endpoint(fake.url).select(query) == SELECT_ROWS
    # what is sent is the text the guard parsed: comments dropped, strings re-escaped
    sent = fake.requests[0]["query"][0]
    assert sent == guard.ensure_read_only(query)
    assert "#" not in sent and "'" not in sent.replace("\\'", "")
    assert embedded_kg.select(query) == []


# --- SPARQL-JSON bindings -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("binding", "term"),
    [
        (
            {"type": "typed-literal", "datatype": XSD_INTEGER, "value": "2001"},
            Term("literal", "2001", XSD_INTEGER),
        ),
        (
            {"type": "literal", "datatype": XSD_INTEGER, "value": "2001"},
            Term("literal", "2001", XSD_INTEGER),
        ),
        ({"type": "literal", "value": "Amélie"}, Term("literal", "Amélie", XSD_STRING)),
        (
            {"type": "literal", "xml:lang": "fr", "value": "Le Destin"},
            Term("literal", "Le Destin", RDF_LANG_STRING, "fr"),
        ),
        ({"type": "uri", "value": e("Amelie")}, Term("iri", e("Amelie"))),
        ({"type": "bnode", "value": "nodeID://b10001"}, Term("bnode", "nodeID://b10001")),
    ],
)
def test_binding_to_term(binding: dict[str, str], term: Term) -> None:
    assert binding_to_term(binding) == term


def test_binding_to_term_unknown_type() -> None:
    with pytest.raises(KGError, match="unexpected binding type"):
        binding_to_term({"type": "triple", "value": "x"})
