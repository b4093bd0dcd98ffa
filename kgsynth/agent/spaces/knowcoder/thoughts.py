"""KnowCoder-A1's template thoughts (:meth:`~kgsynth.agent.spaces.base.ActionSpace.thought`):
before a type search, a graph-pattern search, a query, and a trial-and-error correction
(:mod:`.trial`).

A query's thought names the ``SearchGraphPatterns`` row it follows, as that row shows it
(:func:`query_thought_from`): "Pattern 1 fits the question (^starred_actors): I query the KG
from Adam Arkin along it." The question ranks the rows, and the row a chain's query follows is
the first for most (on a cold-start corpus of the shipped KB: 260 of 280 chain-1, 274 of 280
chain-2), so the query's shape is read off a row the observation shows rather than guessed
from the question's wording (a 2-layer policy wrote two-hop queries for 43 of 78 one-hop
questions; benchmarks/README.md, issue 42 item 4)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kgsynth.agent.spaces.knowcoder.patterns import ARROW
from kgsynth.agent.spaces.sparql_oracle import query_thought

_QUOTED = r'"(?:[^"\\]|\\.)*"'
_ROW_OUT = re.compile(r"^\(\?\w+, (.+), " + _QUOTED + r"\)$")
_ROW_IN = re.compile(r"^\(" + _QUOTED + r", (.+), \?\w+\)$")
_STEP = re.compile(r"^(\^?)<([^<>\s]+)>$")


def _row_path(line: str) -> list[tuple[str, bool]] | None:
    """A pattern row's hops from ``?x`` outwards: (predicate IRI, forward)."""
    out, into = _ROW_OUT.match(line), _ROW_IN.match(line)
    row = out or into
    if row is None:
        return None
    steps = [_STEP.match(s.strip()) for s in row.group(1).split(ARROW)]
    if not all(steps):
        return None
    path = [(m.group(2), not m.group(1)) for m in steps if m]
    # ("value", <r2> -> <r1>, ?x): every hop points at ?x, written from the value's end
    return path if out else [(iri, False) for iri, _ in reversed(path)]


def _names(iri: str, relation: str) -> bool:
    return iri == relation or iri.endswith(("/" + relation, "#" + relation))


def fitting_pattern(shown: str, path: Sequence[str]) -> int | None:
    """The number (1 = the first) of the first row of a ``SearchGraphPatterns`` observation
    whose hops from ``?x`` are ``path`` (``r`` out of the node, ``^r`` into it), or None."""
    rows = [line.strip() for line in shown.splitlines() if line.strip().startswith("(")]
    for number, line in enumerate(rows, 1):
        hops = _row_path(line) or []
        if len(hops) == len(path) and all(
            _names(iri, step.removeprefix("^")) and forward == (not step.startswith("^"))
            for (iri, forward), step in zip(hops, path, strict=True)
        ):
            return number
    return None


def chain_path(row: dict[str, Any]) -> tuple[str, ...] | None:
    """A one-branch walk's hops from its topic as a pattern row writes them (``^r`` for a
    hop the walk took backwards); None for a walk of several branches."""
    branches = row.get("branches") or []
    if len(branches) != 1:
        return None
    return tuple(("^" if h["inverse"] else "") + h["relation"] for h in branches[0])


def query_thought_from(
    shown: str, entity: str, relations: Sequence[str], path: Sequence[str]
) -> str:
    """The thought before the query along ``path`` from ``entity``: the pattern row it follows
    when ``shown`` (the patterns observation) has one, else the relations."""
    number = fitting_pattern(shown, path)
    if number is None:
        return query_thought(entity, relations)
    hops = " -> ".join(path)
    return f"Pattern {number} fits the question ({hops}): I query the KG from {entity} along it."


def knowcoder_thought(
    kind: str,
    entity: str,
    hop: dict[str, Any] | None,
    relations: Sequence[str],
    mistake: dict[str, str] | None,
) -> str | None:
    """The thought before a knowcoder step of ``kind`` (``entity``: the type name for
    ``types``); None for a kind it has none for."""
    if kind == "types":
        return f"The answers are of type {entity}: I look it up among the KG's types."
    if kind == "patterns":  # the question ranks the patterns (.oracle.pattern_call)
        return f"I look for graph patterns around {entity} that match the question."
    if kind == "execute":
        return query_thought(entity, relations)
    if kind == "retry" and mistake:
        seen = "The query returned no rows" if mistake["rows"] == "0" else "Those rows do not fit"
        if mistake["kind"] == "direction":
            return f"{seen}: {mistake['right']} runs the other way. I reverse it and query again."
        return (
            f"{seen}: {mistake['wrong']} is the wrong relation. I query {mistake['right']} instead."
        )
    return None
