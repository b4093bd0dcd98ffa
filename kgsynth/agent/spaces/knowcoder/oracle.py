"""KnowCoder-A1's oracle: the answers' type for ``SearchTypes`` (:func:`answer_type`) and the
``SearchGraphPatterns`` sketch that binds ``?x`` to the topic entities (:func:`values_sketch`,
the form of ``knowcoder-a1.txt`` App. F); the other calls and their replay are the SPARQL
oracle's (:mod:`kgsynth.agent.spaces.sparql_oracle`)."""

from __future__ import annotations

from typing import Any

from kgsynth.agent.spaces.knowcoder.tools import type_catalogue
from kgsynth.agent.spaces.sparql_oracle import _sketch_node
from kgsynth.kg import sparql
from kgsynth.kg.graph import KGGraph

MAX_TYPED_ANSWERS = 20


def answer_type(graph: KGGraph, row: dict[str, Any]) -> str | None:
    """The name of the type most of the gold answers have (the text of ``SearchTypes``), or
    None when the KG has no types (its type catalogue is empty) or no answer has one."""
    types, _ = type_catalogue(graph)
    if not types:
        return None
    values = []
    for a in (row.get("answer_ids") or [])[:MAX_TYPED_ANSWERS]:
        try:
            values.append(sparql.iri(a))
        except ValueError:
            continue  # a literal answer has no type
    if not values:
        return None
    prof = graph.profile
    has = " UNION ".join(f"{{ ?a {sparql.iri(p)} ?t }}" for p in prof.type_predicates)
    query = (
        f"SELECT ?t (COUNT(DISTINCT ?a) AS ?n) WHERE {{ VALUES ?a {{ {' '.join(values)} }} "
        f"{has} FILTER(isIRI(?t)) }} GROUP BY ?t ORDER BY DESC(?n) ?t LIMIT 1"
    )
    rows = graph.kg.select(query)
    if not rows or "t" not in rows[0]:
        return None
    iri = rows[0]["t"].value
    named = next((t.name for t in types if t.iri == iri), None)
    return " ".join((named or prof.relation_name(iri)).split()) or None


def values_sketch(row: dict[str, Any]) -> str:
    """The sketch of the oracle's ``SearchGraphPatterns``: ``?x`` bound to the walk's topic
    entities, ``SELECT DISTINCT ?x WHERE { VALUES ?x { "Kismet" } }`` (a name the quoted form
    cannot carry is written as its IRI). Both readings of the tool (``knowcoder_patterns``
    ``variable`` and ``entities``) expand it around the same entities."""
    ids = list(row.get("topic_ids") or [None] * len(row["topic_names"]))
    nodes = dict.fromkeys(_sketch_node(n, i) for n, i in zip(row["topic_names"], ids, strict=True))
    return f"SELECT DISTINCT ?x WHERE {{ VALUES ?x {{ {' '.join(nodes)} }} }}"


def pattern_call(row: dict[str, Any]) -> str:
    """The oracle's ``SearchGraphPatterns`` call: the sketch of :func:`values_sketch` and an
    empty semantic text, so the tool ranks the patterns by the question's words (§4.1: the
    text is optional). A tiny policy copies the names and the question ranks the patterns; the
    walk's relation words as text were what it could not guess from a question's phrasing
    (stage 1 wrote "tags" for "what does Adam Arkin star in": benchmarks/README.md, issue 42
    item 4)."""
    return f'SearchGraphPatterns({values_sketch(row)!r}, "")'
