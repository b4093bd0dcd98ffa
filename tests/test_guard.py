"""The read-only guard (kgsynth.kg.guard) against hostile queries on real backends.

Property tests generate updates smuggled past comments (ended by \\r, \\r\\n, U+2028, U+0085…),
inside and around strings (\"\"\", ''' with keywords inside), in ``;``-chains and in lower
case, and SERVICE calls in subqueries, OPTIONAL, EXISTS, MINUS, UNION and GRAPH, each sent
through the KG protocol of the embedded store, ``oxigraph serve`` and Virtuoso (when
installed). After every case the store holds the triples it held before, and a recording
HTTP server on 127.0.0.1, named in every SERVICE and LOAD, has received nothing (a positive
control shows that an unguarded engine does call it).
"""

from __future__ import annotations

import collections
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pyoxigraph as ox
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgsynth.core.errors import KGError, QueryRefusedError, QueryRejectedError
from kgsynth.kg import guard
from kgsynth.kg.base import KG
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.endpoint import SparqlEndpointKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from tests.servers import FIXTURE_NT, sparql_json

CASES: collections.Counter[str] = collections.Counter()  # generated cases per backend
EXAMPLES = 150


# --- a recording HTTP server: what SERVICE or LOAD would call -------------------------------


class Recorder:
    def __init__(self) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def _record(self) -> None:
                hits.append(f"{self.command} {self.path}")
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _record

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/sparql"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.close()


def test_the_recorder_hears_an_unguarded_service_call(recorder: Recorder) -> None:
    """Positive control: pyoxigraph does call a SERVICE endpoint when nothing stops it."""
    before = len(recorder.hits)
    with pytest.raises(OSError):
        list(ox.Store().query(f"SELECT * WHERE {{ SERVICE <{recorder.url}> {{ ?s ?p ?o }} }}"))
    assert len(recorder.hits) == before + 1
    del recorder.hits[before:]


# --- hostile queries --------------------------------------------------------------------------

CASE_STYLES = (str, str.lower, str.upper, str.title)
TERMINATORS = ("\n", "\r", "\r\n", "\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "")
BASES = (
    "SELECT ?s WHERE { ?s ?p ?o }",
    "SELECT * WHERE { ?s ?p ?o } LIMIT 1",
    "ASK { ?s ?p ?o }",
)


def updates(rec: str) -> list[str]:
    return [
        "DROP ALL",
        "DROP DEFAULT",
        "CLEAR ALL",
        "CLEAR SILENT DEFAULT",
        "INSERT DATA { <http://x.test/a> <http://x.test/b> <http://x.test/c> }",
        "DELETE WHERE { ?s ?p ?o }",
        "DELETE { ?s ?p ?o } WHERE { ?s ?p ?o }",
        "WITH <http://x.test/g> INSERT { ?s ?p ?o } WHERE { ?s ?p ?o }",
        f"LOAD <{rec}>",
        f"LOAD SILENT <{rec}> INTO GRAPH <http://x.test/g>",
        "CREATE GRAPH <http://x.test/g>",
        "COPY DEFAULT TO <http://x.test/g>",
        "MOVE DEFAULT TO <http://x.test/g>",
        "ADD DEFAULT TO <http://x.test/g>",
    ]


@st.composite
def smuggled_updates(draw: st.DrawFn, rec: str) -> str:
    """An update hidden after a comment, in a ;-chain, after a string, or behind an escape."""
    base = draw(st.sampled_from(BASES))
    update = draw(st.sampled_from(CASE_STYLES))(draw(st.sampled_from(updates(rec))))
    junk = draw(st.text(alphabet="x #\"'}{;", max_size=6))
    end = draw(st.sampled_from(TERMINATORS))
    form = draw(st.integers(0, 7))
    if form == 0:  # a comment that an engine may end sooner than the guard does
        return f"{base} #{junk}{end}; {update}"
    if form == 1:
        return f"#{junk}{end}{update} ;{end}{base}"
    if form == 2:  # a plain ;-chain
        return draw(st.sampled_from([f"{base} ; {update}", f"{update} ; {base}"]))
    if form == 3:  # quotes that a naive scanner pairs wrongly
        quote = draw(st.sampled_from(['"', "'", '"""', "'''", '""', "''"]))
        return f"SELECT ?s WHERE {{ ?s ?p {quote}x{quote}{quote} }} ; {update} ; #{quote}"
    if form == 4:  # an escape that a spec pre-pass turns into ; or }
        esc = draw(st.sampled_from(["\\u003B", "\\u007D", "\\u0022", "\\U0000003B"]))
        return f"SELECT ?s WHERE {{ ?s ?p ?o }} {esc} {update}"
    if form == 5:  # a string escape that ends the string early for a sloppy lexer
        return f'SELECT ?s WHERE {{ ?s ?p "a\\\\" }} ; {update} ; #" }}'
    if form == 6:
        return update
    return f"{base}{end}{update}"


@st.composite
def service_calls(draw: st.DrawFn, rec: str) -> str:
    """SERVICE to the recorder, anywhere in a query."""
    keyword = draw(st.sampled_from(CASE_STYLES))("SERVICE")
    silent = draw(st.sampled_from(["", " SILENT", " silent"]))
    prefix = f"PREFIX r: <{rec}> PREFIX : <{rec}> "
    target = draw(st.sampled_from([f"<{rec}>", "r:", ":", "?svc"]))
    spacing = draw(st.sampled_from([" ", "\n", "\r", "\t", " #c\r\n "]))
    call = f"{keyword}{silent}{spacing}{target} {{ ?s ?p ?o }}"
    if target == ":" and not silent and draw(st.booleans()):
        call = f"{keyword}:{{ ?s ?p ?o }}"  # read as SERVICE by rdflib and Oxigraph alike
    wrap = draw(
        st.sampled_from(
            [
                "{c}",
                "OPTIONAL {{ {c} }}",
                "{{ SELECT * WHERE {{ {c} }} }}",
                "{{ SELECT ?s WHERE {{ OPTIONAL {{ {c} }} }} LIMIT 1 }}",
                "FILTER EXISTS {{ {c} }}",
                "FILTER NOT EXISTS {{ {c} }}",
                "MINUS {{ {c} }}",
                "{{ ?s ?p ?o }} UNION {{ {c} }}",
                "GRAPH ?g {{ {c} }}",
            ]
        )
    )
    body = wrap.format(c=call)
    values = f" VALUES ?svc {{ <{rec}> }}" if target == "?svc" else ""
    form = draw(st.sampled_from(["SELECT * WHERE", "ASK", "CONSTRUCT { ?s ?p ?o } WHERE"]))
    return f"{prefix}{form} {{ ?s ?p ?o . {body}{values} }}"


LONG_QUOTES = ('"""', "'''", '"', "'")


@st.composite
def strings_with_keywords(draw: st.DrawFn) -> tuple[str, str]:
    """(query, value): ``BIND(<a string literal> AS ?x)`` whose value holds keywords, quotes
    and comment marks, written in one of the four string forms."""
    parts = st.sampled_from(
        ["DROP ALL", "; INSERT DATA {", "}", "#", '"', "'", '"""', "'''", "SERVICE", "\\", " "]
    )
    value = "".join(draw(st.lists(parts, min_size=1, max_size=6)))
    quote = draw(st.sampled_from(LONG_QUOTES))
    body = value.replace("\\", "\\\\").replace(quote[0], "\\" + quote[0])
    if len(quote) == 1:
        body = body.replace("\n", "\\n")
    return f"SELECT ?x WHERE {{ BIND({quote}{body}{quote} AS ?x) }}", value


# --- backends ---------------------------------------------------------------------------------


def writable_embedded() -> EmbeddedKG:
    return EmbeddedKG.from_ntriples(FIXTURE_NT, get_profile("generic"))


def count(kg: KG) -> int:
    if isinstance(kg, EmbeddedKG):
        return len(kg.store)
    data = sparql_json(kg.location, "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }")
    return int(data["results"]["bindings"][0]["n"]["value"])


def send(kg: KG, query: str) -> str:
    """Send ``query`` the way kgsynth does; the outcome: ``refused``, ``rejected`` (the
    backend said no) or ``answered``."""
    form = "ask" if query.lstrip().upper().startswith("ASK") else "select"
    try:
        if form == "ask":
            kg.ask(query, timeout=10)
        else:
            kg.select(query, timeout=10)
    except QueryRefusedError:
        return "refused"
    except KGError:
        return "rejected"
    return "answered"


@pytest.fixture(params=["embedded", "oxigraph", "virtuoso"])
def backend(request: pytest.FixtureRequest) -> Iterator[KG]:
    if request.param == "embedded":
        kg: KG = writable_embedded()
    else:
        url = request.getfixturevalue(f"{request.param}_endpoint")
        kg = SparqlEndpointKG(url, get_profile("generic"), timeout=10, retries=0)
    kg.backend_name = request.param  # type: ignore[attr-defined]
    yield kg
    kg.close()


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_smuggled_updates_are_refused_and_change_nothing(backend: KG, recorder: Recorder):
    before = count(backend)
    name = backend.backend_name  # type: ignore[attr-defined]

    @SETTINGS
    @given(query=smuggled_updates(recorder.url))
    def check(query: str) -> None:
        CASES[f"{name}: updates"] += 1
        outcome = send(backend, query)
        assert outcome in ("refused", "answered"), (outcome, query)
        if outcome == "answered":  # the update was in a comment: the text sent has none
            sent = guard.ensure_read_only(query).upper()
            assert not any(w in sent for w in ("DROP", "INSERT", "DELETE", "LOAD", "CLEAR"))
        assert count(backend) == before
        assert recorder.hits == []

    check()


def test_service_is_refused_anywhere(backend: KG, recorder: Recorder):
    before = count(backend)
    name = backend.backend_name  # type: ignore[attr-defined]

    @SETTINGS
    @given(query=service_calls(recorder.url))
    def check(query: str) -> None:
        CASES[f"{name}: service"] += 1
        assert send(backend, query) == "refused", query
        assert recorder.hits == []
        assert count(backend) == before

    check()


def test_keywords_inside_strings_are_answered_with_the_exact_value(backend: KG):
    name = backend.backend_name  # type: ignore[attr-defined]
    before = count(backend)

    @SETTINGS
    @given(case=strings_with_keywords())
    def check(case: tuple[str, str]) -> None:
        query, value = case
        CASES[f"{name}: strings"] += 1
        rows = backend.select(query, timeout=10)
        assert [r["x"].value for r in rows] == [value], query
        assert count(backend) == before

    check()


def test_guard_cases_per_backend(request: pytest.FixtureRequest) -> None:
    """Reports how many cases ran per backend and family (shown with -rP / -s)."""
    for key in sorted(CASES):
        print(f"{key}: {CASES[key]}")


# --- admitted texts are not updates to any parser --------------------------------------------


@settings(max_examples=300, deadline=None)
@given(query=st.text(alphabet="SELECTWHR{}?sp o;#\r\n\u2028\u0085\"'DROPAL<>:x", max_size=60))
def test_whatever_is_admitted_is_one_query_to_oxigraph(query: str) -> None:
    """Fuzz: text the guard admits parses as a query, and never as an update, in Oxigraph;
    the canonical text it returns does too."""
    try:
        canon = guard.checked_query(query)
    except QueryRejectedError:
        return
    for text in (query, canon):
        with pytest.raises(SyntaxError):
            ox.Store().update(text)
    ox.Store().query(canon)


# --- fixed cases ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * WHERE { ?s ?p ?o } #x\r; DROP ALL",
        "#x\rDROP ALL ; INSERT DATA { <http://a/b> <http://a/b> <http://a/b> }",
        "SELECT * WHERE { ?s ?p ?o } #x\u2028 LIMIT 1\n; DROP ALL",
        "SELECT * WHERE { ?s ?p ?o \\u007D ; DROP ALL",
        "PREFIX : <http://127.0.0.1:9/> SELECT * WHERE { SERVICE:{ ?s ?p ?o } }",
        "SELECT * WHERE { OPTIONAL { SERVICE <http://127.0.0.1:9/> { ?s ?p ?o } } }",
        "select * { { select ?s { service silent <http://127.0.0.1:9/> { ?s ?p ?o } } } }",
        "SELECT * WHERE { ?s ?p ?o } ;",
        "SELECT * WHERE { ?s ?p <relative> }",
        "SELECT * WHERE { ?s ?p ?o }\u0085",
        "   # only a comment",
        'DEFINE get:soft "replace" SELECT * FROM <http://127.0.0.1:9/x> WHERE { ?s ?p ?o }',
    ],
)
def test_refused(query: str) -> None:
    with pytest.raises(QueryRefusedError, match=r"^refused: "):
        guard.ensure_read_only(query)


@pytest.mark.parametrize(
    ("query", "canonical"),
    [
        ("# c\nSELECT * WHERE { ?s ?p ?o }", " \nSELECT * WHERE { ?s ?p ?o }"),
        ("SELECT * WHERE { ?s ?p ?o } #x\r\n", "SELECT * WHERE { ?s ?p ?o }  \r\n"),
        (
            "SELECT * WHERE { ?s ?p '''it's \"x\"\n''' }",
            'SELECT * WHERE { ?s ?p "it\\\'s \\"x\\"\\n" }',
        ),
        ("SELECT * WHERE { ?s ?p '\\u0041' }", 'SELECT * WHERE { ?s ?p "A" }'),
        ("SELECT * WHERE { ?s <http://a/\\u0062> ?o }", "SELECT * WHERE { ?s <http://a/b> ?o }"),
    ],
)
def test_canonical_text(query: str, canonical: str) -> None:
    assert guard.ensure_read_only(query) == canonical


def test_refusals_are_cached_and_still_raised() -> None:
    query = "SELECT * WHERE { ?s ?p ?o } ; DROP ALL"
    for _ in range(2):
        with pytest.raises(QueryRefusedError):
            guard.ensure_read_only(query)


class RecordingKG(EmbeddedKG):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    def _select_iter(self, query: str, timeout: float | None):
        self.sent.append(query)
        return super()._select_iter(query, timeout)


def test_kgsynths_own_queries_pass_unchanged_and_share_few_shapes() -> None:
    source = writable_embedded()
    kg = RecordingKG(source.store, source.profile)
    graph = KGGraph(kg)
    for name in ("Kismet", "Amélie", 'Tom "Tiger" O\'Neil', "back\\slash", "nobody"):
        res = graph.resolve(name)
        if res is not None:
            for rel in graph.relations(res.entity.iri):
                graph.neighbors(res.entity.iri, rel)
    iris = [f"http://kgsynth.org/entity/{e}" for e in ("Amelie", "The_Matrix", "Kismet_1955")]
    graph.prefetch_lookups(fanouts=iris, labels=iris)
    assert kg.sent
    guard.clear_caches()
    for query in kg.sent:
        assert guard.ensure_read_only(query) == query
    shapes = {guard._shape_text(*guard._lex(q)[1:]) for q in kg.sent}
    assert len(shapes) < len(set(kg.sent))
