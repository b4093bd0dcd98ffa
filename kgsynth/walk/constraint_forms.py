"""A constraint walk's two logical forms: its S-expression (the issue-18 contract's grammar,
GrailQA's) and a SPARQL query written here independently of the S-expression compiler, so that
the compiler's answers can be checked against the walk's.

The base set is the topic entity followed along one or two hops, written as plain triple
patterns (no filter), which is exactly what ``(JOIN …)`` means; a flattened hop across an
unnamed node (``r1.r2``) is two joins. Constraints:

- ``count``: ``(COUNT B)`` and ``SELECT (COUNT(DISTINCT ?answer) AS ?count)``;
- ``superlative``: ``(ARGMAX B attr)`` / ``(ARGMIN B attr)``; the members whose value equals the
  largest (smallest) value any member has;
- ``comparative``: ``(AND B (gt attr v))`` (``lt``, ``ge``, ``le``): members with a value
  ``op v``;
- ``time``: ``(TC B attr year)``: members with a value in that year.

Atoms are written by :mod:`kgsynth.kg.sexpr`'s ``entity_atom``, ``relation_atom`` and
``literal_atom``; an entity named by a number is compared with a bare number. Values in SPARQL:
numbers as ``xsd:double`` (a number literal, or the name of an entity named
by a number), dates as their ISO text (``STR``), a date's year as its first four characters:
the same comparisons :mod:`kgsynth.walk.values` makes in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kgsynth.kg import sparql
from kgsynth.kg.profiles import KGProfile
from kgsynth.kg.sexpr import entity_atom, literal_atom, relation_atom
from kgsynth.walk.records import Hop
from kgsynth.walk.values import XSD, AttributeKind, Value


@dataclass(frozen=True)
class Constraint:
    """What a constraint walk asks of its base set: ``op`` (``count``; ``argmax``/``argmin``;
    ``gt``/``lt``/``ge``/``le``; ``tc``), the attribute's predicate IRI and kind, and the value
    compared with (comparative) or the year (time)."""

    op: str
    attribute: str = ""
    kind: AttributeKind | None = None
    value: Value | None = None
    year: int | None = None


def base_sexpr(topic: str, hops: Sequence[Hop], profile: KGProfile) -> str:
    """``(JOIN …)`` of the base set: the topic followed along ``hops``."""
    expr = entity_atom(topic, profile)
    for hop in hops:
        rel = hop.relation
        atoms = [relation_atom(p, profile) for p in rel.path]
        if len(atoms) == 1:
            expr = f"(JOIN {atoms[0]} {expr})" if rel.inverse else f"(JOIN (R {atoms[0]}) {expr})"
        elif rel.inverse:  # answer r1 node . node r2 topic
            expr = f"(JOIN {atoms[0]} (JOIN {atoms[1]} {expr}))"
        else:  # topic r1 node . node r2 answer
            expr = f"(JOIN (R {atoms[1]}) (JOIN (R {atoms[0]}) {expr}))"
    return expr


def value_atom(value: Value) -> str:
    """A compared value: a bare number for an entity's name, else a typed literal."""
    return value.text if value.datatype is None else literal_atom(value.text, value.datatype)


def to_sexpr(base: str, c: Constraint, profile: KGProfile) -> str:
    """The whole S-expression of a constraint walk over the base ``base``."""
    if c.op == "count":
        return f"(COUNT {base})"
    attr = relation_atom(c.attribute, profile)
    if c.op in ("argmax", "argmin"):
        return f"({c.op.upper()} {base} {attr})"
    if c.op == "tc":
        return f"(TC {base} {attr} {c.year})"
    assert c.value is not None
    return f"(AND {base} ({c.op} {attr} {value_atom(c.value)}))"


def base_pattern(topic: str, hops: Sequence[Hop], var: str, tag: str) -> str:
    """Triple patterns binding ``var`` to the base set; ``tag`` keeps the variables of one copy
    apart from another's."""
    prev = sparql.iri(topic)
    parts = []
    for i, hop in enumerate(hops):
        out = var if i == len(hops) - 1 else f"?m{tag}{i}"
        rel = hop.relation
        head, tail = (out, prev) if rel.inverse else (prev, out)
        if len(rel.path) == 1:
            parts.append(f"{head} {sparql.iri(rel.path[0])} {tail} .")
        else:
            node = f"?c{tag}{i}"
            r1, r2 = (sparql.iri(p) for p in rel.path)
            parts.append(f"{head} {r1} {node} . {node} {r2} {tail} .")
        prev = out
    return " ".join(parts)


def value_pattern(
    member: str, c: Constraint, profile: KGProfile, tag: str, out: str | None = None
) -> str:
    """Patterns binding ``out`` (default ``?v{tag}``) to each value of ``member``'s attribute:
    a double for numbers, the ISO text for dates."""
    assert c.kind is not None
    obj, out = f"?o{tag}", out or f"?v{tag}"
    head = f"{member} {sparql.iri(c.attribute)} {obj} ."
    if c.kind.source == "name":
        labels = " ".join(sparql.iri(p) for p in profile.label_predicates)
        return (
            f"{head} VALUES ?lp{tag} {{ {labels} }} {obj} ?lp{tag} ?l{tag} . "
            f"BIND(xsd:double(STR(?l{tag})) AS {out})"
        )
    if c.kind.kind == "date":
        return f"{head} BIND(STR({obj}) AS {out})"
    return f"{head} BIND(xsd:double({obj}) AS {out})"


def _constant(c: Constraint) -> str:
    assert c.value is not None and c.kind is not None
    if c.kind.kind == "date":
        return sparql.literal(c.value.text)
    return f'"{float(c.value.key)!r}"^^xsd:double'


def to_sparql(topic: str, hops: Sequence[Hop], c: Constraint, profile: KGProfile) -> str:
    """One SELECT whose result is the walk's exact answer set: ``?answer ?name`` rows, or one
    ``?count`` row for ``count``."""
    base = base_pattern(topic, hops, "?answer", "")
    if c.op == "count":
        return f"SELECT (COUNT(DISTINCT ?answer) AS ?count) WHERE {{ {base} }}"
    prefix = f"PREFIX xsd: <{XSD}> "
    labels = " ".join(sparql.iri(p) for p in profile.label_predicates)
    names = f"OPTIONAL {{ VALUES ?np {{ {labels} }} ?answer ?np ?name }}"
    value = value_pattern("?answer", c, profile, "")
    if c.op in ("argmax", "argmin"):
        inner = base_pattern(topic, hops, "?x0", "0") + " " + value_pattern("?x0", c, profile, "0")
        best = f"{{ SELECT ({c.op[3:].upper()}(?v0) AS ?best) WHERE {{ {inner} }} }}"
        return (
            f"{prefix}SELECT DISTINCT ?answer ?name WHERE {{ {best} {base} {value} "
            f"FILTER(?v = ?best) {names} }}"
        )
    if c.op == "tc":
        assert c.kind is not None
        year = "?v" if c.kind.kind != "date" else "xsd:integer(SUBSTR(?v, 1, 4))"
        test = f"{year} = {c.year}"
    else:
        symbol = {"gt": ">", "lt": "<", "ge": ">=", "le": "<="}[c.op]
        test = f"?v {symbol} {_constant(c)}"
    return (
        f"{prefix}SELECT DISTINCT ?answer ?name WHERE {{ {base} {value} FILTER({test}) {names} }}"
    )
