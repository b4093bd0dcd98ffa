"""KG profiles: how names, namespaces, meta relations and unnamed nodes look in a KG.

A profile turns IRIs into the names an agent reads (``directed_by``,
``people.person.nationality``, ``P57``) and says which predicates carry entity names, which
relations are hidden from agents (meta relations) and whether unnamed intermediate nodes
(Freebase CVTs) are crossed as one flattened hop ``r1.r2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote

from kgsynth.core.errors import ConfigError

RDFS_LABEL = "http://www.w3.org/2000/01/rdf-schema#label"
RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
FREEBASE_NS = "http://rdf.freebase.com/ns/"
WIKIDATA_ENTITY = "http://www.wikidata.org/entity/"
WIKIDATA_DIRECT = "http://www.wikidata.org/prop/direct/"
SCHEMA_NAME = "http://schema.org/name"
KGSYNTH_ENTITY = "http://kgsynth.org/entity/"
KGSYNTH_RELATION = "http://kgsynth.org/relation/"


@dataclass(frozen=True)
class KGProfile:
    """What kgsynth needs to know about one KG's conventions."""

    name: str
    label_predicates: tuple[str, ...]
    # Language tags a label may carry to count as a name ("" = no tag).
    label_langs: tuple[str, ...] = ("", "en")
    # Relations whose IRI starts with one of these are meta relations, hidden from agents.
    hidden_relation_prefixes: tuple[str, ...] = ()
    hidden_relations: frozenset[str] = field(default_factory=frozenset)
    # Only relations under these prefixes are shown (empty: all).
    relation_prefixes: tuple[str, ...] = ()
    # Cross unnamed intermediate nodes as one flattened hop "r1.r2".
    flatten_unnamed: bool = False
    entity_namespace: str = KGSYNTH_ENTITY
    relation_namespace: str = KGSYNTH_RELATION
    # Language tag import writes names with (None: plain literal).
    label_lang: str | None = None
    # Predicates whose objects are the entity's types (classes): rdf:type, Freebase's
    # type.object.type, Wikidata's P31 (instance of).
    type_predicates: tuple[str, ...] = (RDF_TYPE,)

    @property
    def label_predicate(self) -> str:
        """The predicate import writes names with."""
        return self.label_predicates[0]

    def is_hidden(self, relation_iri: str) -> bool:
        """True for meta relations (names, types, keys …) that agents never see."""
        if relation_iri in self.hidden_relations:
            return True
        if any(relation_iri.startswith(p) for p in self.hidden_relation_prefixes):
            return True
        return bool(self.relation_prefixes) and not any(
            relation_iri.startswith(p) for p in self.relation_prefixes
        )

    def relation_name(self, relation_iri: str) -> str:
        """The name an agent reads and writes for a relation IRI."""
        for ns in (self.relation_namespace, FREEBASE_NS, WIKIDATA_DIRECT):
            if relation_iri.startswith(ns) and len(relation_iri) > len(ns):
                return _unquote(relation_iri[len(ns) :])
        return _local_name(relation_iri)

    def entity_iri(self, entity_id: str) -> str:
        """Deterministic IRI for an entity id or name from a delimited triple file."""
        if self.name == "freebase":
            return FREEBASE_NS + freebase_id(entity_id)
        return self.entity_namespace + quote(entity_id, safe="")

    def relation_iri(self, relation: str) -> str:
        """Deterministic IRI for a relation name from a delimited triple file."""
        if self.name == "freebase":
            return FREEBASE_NS + freebase_id(relation)
        return self.relation_namespace + quote(relation, safe="")


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


def _local_name(iri: str) -> str:
    for sep in ("#", "/", ":"):
        head, _, tail = iri.rstrip("/").rpartition(sep)
        if head and tail:
            return _unquote(tail)
    return iri


def freebase_id(path: str) -> str:
    """Freebase path syntax to the dotted RDF local name.

    ``/m/027rn`` -> ``m.027rn``; ``/people/person/nationality`` -> ``people.person.nationality``;
    FB15k-237's CVT-collapsed ``/film/film/release_date_s./film/film_regional_release_date/x``
    -> ``film.film.release_date_s.film.film_regional_release_date.x``, which is exactly the name
    kgsynth gives a flattened two-hop relation ``r1.r2`` over a CVT node.
    """
    if not path.startswith("/"):
        return path
    parts = path.split("./")
    return ".".join(p.strip("/").replace("/", ".") for p in parts)


GENERIC = KGProfile(
    name="generic",
    label_predicates=(RDFS_LABEL,),
    hidden_relation_prefixes=("http://www.w3.org/2000/01/rdf-schema#",),
    hidden_relations=frozenset({"http://www.w3.org/2002/07/owl#sameAs"}),
)

FREEBASE = KGProfile(
    name="freebase",
    label_predicates=(FREEBASE_NS + "type.object.name", RDFS_LABEL),
    hidden_relation_prefixes=(
        FREEBASE_NS + "type.",
        FREEBASE_NS + "common.",
        FREEBASE_NS + "freebase.",
        FREEBASE_NS + "kg.",
        FREEBASE_NS + "base.ontologies.",
        FREEBASE_NS + "dataworld.",
        FREEBASE_NS + "user.",
        "http://www.w3.org/",
    ),
    relation_prefixes=(FREEBASE_NS,),
    flatten_unnamed=True,
    entity_namespace=FREEBASE_NS,
    relation_namespace=FREEBASE_NS,
    label_lang="en",
    type_predicates=(FREEBASE_NS + "type.object.type",),
)

WIKIDATA = KGProfile(
    name="wikidata",
    label_predicates=(RDFS_LABEL, SCHEMA_NAME),
    label_langs=("en",),
    relation_prefixes=(WIKIDATA_DIRECT,),
    entity_namespace=WIKIDATA_ENTITY,
    relation_namespace=WIKIDATA_DIRECT,
    label_lang="en",
    type_predicates=(WIKIDATA_DIRECT + "P31",),
)

PROFILES: dict[str, KGProfile] = {p.name: p for p in (GENERIC, FREEBASE, WIKIDATA)}


def get_profile(name: str) -> KGProfile:
    """The profile called ``name``; a :class:`ConfigError` lists the valid ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"--profile: unknown profile {name!r}; choose one of {', '.join(PROFILES)}"
        ) from None


def guess_profile_from_relations(relations: list[str]) -> str:
    """Profile implied by the relation strings of a triple file or KG."""
    freebase = sum(
        r.startswith(FREEBASE_NS) or (r.startswith("/") and r.count("/") >= 3) for r in relations
    )
    wikidata = sum(r.startswith(WIKIDATA_DIRECT) for r in relations)
    if relations and freebase >= 0.5 * len(relations):
        return "freebase"
    if relations and wikidata >= 0.5 * len(relations):
        return "wikidata"
    return "generic"
