"""``kgsynth kg stats``: size, relation counts and the degree distribution of a KG."""

from __future__ import annotations

from typing import Any

from kgsynth.kg import sparql
from kgsynth.kg.base import KG

DEGREE_BUCKETS = ((1, 1), (2, 5), (6, 10), (11, 100), (101, 1_000), (1_001, 10**18))


def _not_label(kg: KG, var: str = "?p") -> str:
    preds = ", ".join(sparql.iri(p) for p in kg.profile.label_predicates)
    return f"FILTER({var} NOT IN ({preds}))"


def kg_stats(kg: KG, *, top: int = 20) -> dict[str, Any]:
    """Counts over the facts (name triples excluded), the ``top`` relations and the degree
    distribution (facts per entity, both directions)."""
    not_label = _not_label(kg)
    triples = int(kg.select("SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }")[0]["n"].value)
    rel_rows = kg.select(
        f"SELECT ?p (COUNT(*) AS ?n) WHERE {{ ?s ?p ?o {not_label} }} GROUP BY ?p ORDER BY DESC(?n)"
    )
    relations = [
        {
            "relation": kg.profile.relation_name(r["p"].value),
            "iri": r["p"].value,
            "count": int(r["n"].value),
            "hidden": kg.profile.is_hidden(r["p"].value),
        }
        for r in rel_rows
    ]
    degree_rows = kg.select(
        "SELECT ?e (COUNT(*) AS ?d) WHERE { "
        f"{{ ?e ?p ?o {not_label} }} UNION {{ ?s ?p ?e {not_label} FILTER(!isLiteral(?e)) }} "
        "} GROUP BY ?e"
    )
    degrees = sorted(int(r["d"].value) for r in degree_rows)
    n = len(degrees)

    def quantile(q: float) -> int:
        return degrees[min(n - 1, int(q * n))] if n else 0

    buckets = []
    for lo, hi in DEGREE_BUCKETS:
        label = f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi < 10**18 else f">{lo - 1}")
        buckets.append({"degree": label, "entities": sum(lo <= d <= hi for d in degrees)})
    return {
        "kg": kg.describe(),
        "triples": triples,
        "facts": sum(r["count"] for r in relations),
        "entities": n,
        "relations": len(relations),
        "top_relations": relations[:top],
        "degree": {
            "min": degrees[0] if n else 0,
            "median": quantile(0.5),
            "p90": quantile(0.9),
            "p99": quantile(0.99),
            "max": degrees[-1] if n else 0,
            "mean": round(sum(degrees) / n, 2) if n else 0.0,
            "histogram": buckets,
        },
    }
