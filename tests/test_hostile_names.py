"""Property tests: hostile entity names either resolve to the right entity or come back as
"entity not found" — never a SPARQL error, never anything but a read-only SELECT."""

import pyoxigraph as ox
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kgsynth.agent.tools import ErrorType, ToolEnvironment
from kgsynth.kg import sparql
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile

HOSTILE = [
    '"} ; DROP ALL ; #',
    "INSERT DATA { <http://x> <http://y> <http://z> }",
    '\\" } DELETE WHERE { ?s ?p ?o } #',
    "O'Brien's \"Film\"",
    "back\\slash\\",
    "{braces} and <angles>",
    "new\nline",
    "tab\there",
    "Ōkami — 東京 ☃",
    "'''triple''' \"\"\"quotes\"\"\"",
    "?var $var <http://iri> _:b0",
    "x" * 3000,
]
DECOY = "decoy entity"
LABEL = "http://www.w3.org/2000/01/rdf-schema#label"


class RecordingKG(EmbeddedKG):
    """Records every query the tool layer sends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    def _select(self, query, timeout):
        self.sent.append(query)
        return super()._select(query, timeout)


def kg_with(name: str) -> RecordingKG:
    store = ox.Store()
    for iri, label in (("http://x/target", name), ("http://x/decoy", DECOY)):
        store.add(ox.Quad(ox.NamedNode(iri), ox.NamedNode(LABEL), ox.Literal(label)))
        store.add(
            ox.Quad(ox.NamedNode(iri), ox.NamedNode("http://x/rel"), ox.NamedNode("http://x/o"))
        )
    return RecordingKG(store, get_profile("generic"))


names = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(min_size=1, max_size=60),
    st.builds(lambda a, b: a + b, st.sampled_from(HOSTILE), st.text(max_size=20)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=names)
def test_hostile_names_on_embedded(name):
    assume(sparql.normalize_name(name) != sparql.normalize_name(DECOY))
    kg = kg_with(name)
    before = len(kg.store)
    env = ToolEnvironment(KGGraph(kg), "question?")
    result = env.execute(f"get_relations({name!r})")
    if result.error is None:
        assert KGGraph(kg).resolve(name).entity.iri == "http://x/target"
        assert result.text.endswith(", rel, ?)")
    else:
        assert result.error == ErrorType.ENTITY_NOT_FOUND, result.text
        # only text no KG name can match (controls, blank, over-long) may be "not found"
        plainly_findable = sparql.is_sendable(name) and name.strip() and len(name) <= 2000
        assert not plainly_findable, name
    assert len(kg.store) == before
    for query in kg.sent:
        sparql.ensure_read_only(query)
        assert query.lstrip().startswith("SELECT")


def hostile_ntriples() -> str:
    lines = []
    for i, name in enumerate([*HOSTILE, DECOY]):
        iri = f"<http://kgsynth.org/entity/h{i}>"
        lines.append(f"{iri} <{LABEL}> {sparql.literal(name)} .")
        lines.append(
            f"{iri} <http://kgsynth.org/relation/rel> <http://kgsynth.org/entity/target> ."
        )
    lines.append(f'<http://kgsynth.org/entity/target> <{LABEL}> "target" .')
    return "\n".join(lines) + "\n"


@pytest.fixture(
    scope="module", params=["oxigraph", pytest.param("virtuoso", marks=pytest.mark.virtuoso)]
)
def hostile_endpoint(request, tmp_path_factory):
    from tests import servers

    tmp = tmp_path_factory.mktemp(f"hostile-{request.param}")
    nt = tmp / "kg.nt"
    nt.write_text(hostile_ntriples(), encoding="utf-8")
    if request.param == "oxigraph":
        ctx = servers.start_oxigraph(nt, tmp / "db")
    else:
        reason = servers.virtuoso_missing_reason()
        if reason:
            pytest.skip(reason)
        ctx = servers.start_virtuoso(nt, tmp / "db")
    with ctx as server:
        yield server.url


_SIZES: dict[str, int] = {}


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=names)
def test_hostile_names_on_servers(hostile_endpoint, name):
    from kgsynth.kg.open import open_kg

    kg = open_kg(hostile_endpoint, profile="generic", retries=0)
    graph = KGGraph(kg)
    result = ToolEnvironment(graph, "question?").execute(f"get_relations({name!r})")
    if result.error is None:
        resolved = graph.resolve(name).entity
        assert sparql.normalize_name(resolved.name) == sparql.normalize_name(name.strip())
        assert ", rel, ?)" in result.text
    else:
        assert result.error == ErrorType.ENTITY_NOT_FOUND, result.text
        assert name not in HOSTILE or not (sparql.is_sendable(name) and len(name) <= 2000)
    # nothing was written: the store's size never changes (Virtuoso also counts its own graphs)
    count = int(kg.select("SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }")[0]["n"].value)
    assert _SIZES.setdefault(hostile_endpoint, count) == count
