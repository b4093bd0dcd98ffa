"""GrailQA's S-expressions (the logical forms KBQA-R1's actions build): text <-> tree, the
atoms that name entities, relations and literals, and running one on a KG.

An S-expression is an atom (``m.0abc``, ``<http://x/Kismet>``, ``directed_by``,
``1990^^http://www.w3.org/2001/XMLSchema#gYear``, ``"text"``, ``2.5``) or a list whose first
item is an operator: ``JOIN``, ``AND``, ``R``, ``ARGMAX``, ``ARGMIN``, ``COUNT``, ``TC``,
``lt``, ``le``, ``gt``, ``ge`` (case-insensitive on input; written upper-case, the comparisons
lower-case)::

    expr = parse("(JOIN (R directed_by) <http://kgsynth.org/entity/Kismet>)")
    # ("JOIN", ("R", "directed_by"), "<http://kgsynth.org/entity/Kismet>")
    to_text(expr)                   # the same text, single spaces
    compile_sparql(expr, profile)   # SELECT DISTINCT ?x WHERE { ... }  (sexpr_compile.py)
    execute(graph, expr)            # [(iri, name), ...], or an int for COUNT

The semantics, and the SPARQL each operator becomes, are in :mod:`kgsynth.kg.sexpr_compile`;
parsing, printing and the atoms in :mod:`kgsynth.kg.sexpr_text`.
Quoted strings use SPARQL's escapes (``\\"``, ``\\\\``, ``\\n`` ...); an IRI ``<...>`` holds no
spaces and is one atom even when it holds a parenthesis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kgsynth.kg.profiles import KGProfile
from kgsynth.kg.sexpr_compile import compile_query
from kgsynth.kg.sexpr_text import (
    DATE_TYPES,
    FREEBASE_ID_RE,
    LEXICAL,
    MAX_DEPTH,
    NUMERIC_TYPES,
    OPERATORS,
    QUOTED_RE,
    XSD,
    SExpr,
    SExprError,
    check_typed_value,
    entity_atom,
    literal_atom,
    operator,
    parse,
    quote,
    relation_atom,
    to_text,
    unquote,
)

if TYPE_CHECKING:
    from kgsynth.kg.base import KG
    from kgsynth.kg.graph import KGGraph

__all__ = [
    "DATE_TYPES",
    "FREEBASE_ID_RE",
    "LEXICAL",
    "MAX_DEPTH",
    "NUMERIC_TYPES",
    "OPERATORS",
    "QUOTED_RE",
    "XSD",
    "SExpr",
    "SExprError",
    "check_typed_value",
    "compile_sparql",
    "entity_atom",
    "execute",
    "literal_atom",
    "operator",
    "parse",
    "quote",
    "relation_atom",
    "to_text",
    "unquote",
]

# --- running one ---------------------------------------------------------------------------


def compile_sparql(expr: SExpr, profile: KGProfile) -> str:
    """One SPARQL 1.1 SELECT for ``expr``: ``SELECT DISTINCT ?x WHERE {...}`` for a set,
    ``SELECT (COUNT(DISTINCT ?x) AS ?count) WHERE {...}`` for ``COUNT``
    (see :mod:`kgsynth.kg.sexpr_compile`). Raises :class:`SExprError`."""
    return compile_query(expr, profile)


def execute(
    source: KG | KGGraph,
    expr: SExpr,
    *,
    timeout: float | None = None,
    max_rows: int | None = None,
) -> list[tuple[str, str]] | int:
    """Run ``expr`` (a tree, or its text) on a KG, through the KG's read-only guard, timeout
    and row cap: the ``(id, name)`` of each answer, sorted by (name, id) (an entity's IRI and
    its name; a literal's value twice), or the number ``COUNT`` counts.

    Raises :class:`SExprError` for an expression that does not compile, and the KG's own
    errors (:class:`~kgsynth.core.errors.RowLimitError` past ``max_rows``, timeouts)."""
    from kgsynth.kg.graph import KGGraph

    graph = source if isinstance(source, KGGraph) else KGGraph(source)
    tree = parse(expr) if isinstance(expr, str) else expr
    rows = graph.kg.select(compile_sparql(tree, graph.profile), timeout=timeout, max_rows=max_rows)
    if operator(tree) == "COUNT":
        return int(rows[0]["count"].value) if rows and "count" in rows[0] else 0
    terms = [row["x"] for row in rows if "x" in row]
    graph.prefetch_labels(t.value for t in terms if t.kind == "iri")
    pairs = {(t.value, graph.display_name(t)) for t in terms}
    return sorted(pairs, key=lambda p: (p[1], p[0]))
