"""KnowCoder-A1's oracle: the answers' type for ``SearchTypes`` (:func:`answer_type`); the calls
and their replay are the SPARQL oracle's (:mod:`kgsynth.agent.spaces.sparql_oracle`)."""

from __future__ import annotations

from typing import Any

from kgsynth.agent.spaces.knowcoder.tools import type_catalogue
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
