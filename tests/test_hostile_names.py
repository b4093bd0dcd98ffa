"""Property tests: hostile entity names either resolve to the right entity or come back as
"entity not found" — never a SPARQL error, never anything but a read-only SELECT."""

import pyoxigraph as ox
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kgsynth.agent.tools import ErrorType, ToolEnvironment
from kgsynth.kg import sparql
from kgsynth.kg.embedded import EmbeddedKG
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
    env = ToolEnvironment(kg.graph(), "question?")
    result = env.execute(f"get_relations({name!r})")
    if result.error is None:
        assert kg.graph().resolve(name).entity.iri == "http://x/target"
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
