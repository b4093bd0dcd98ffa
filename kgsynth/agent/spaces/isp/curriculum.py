"""ISP-KGR's question curriculum (§5.1, App. E.1): questions bucketed easy, medium and hard by
the reasoning steps of their gold SPARQL, and introduced in that order.

Input: each question's gold SPARQL (None where a file has none). Output: the order RL draws the
questions in (:func:`curriculum_order`), read by ``kgsynth train rl --question-curriculum
difficulty``::

    order = curriculum_order([q.sparql for q in questions], random.Random(0))

Difficulty (App. E.1: a hop of the logical form is counted only where it is a step the agent
takes): :func:`reasoning_steps` counts the query's relation hops, a hop across an unnamed
intermediate node (kgsynth's ``?cN`` variables, a flattened Freebase CVT) once (a pattern with a
variable predicate, and a constraint's attribute look-up, are no hop), plus one step
per extra topic entity (merging two branches), plus one for an aggregation or a constraint
(COUNT, MAX/MIN or ORDER BY … LIMIT, a FILTER comparing values); the label look-ups in
``OPTIONAL`` blocks and a superlative's inner sub-select (the same hops again) are not counted.
These are the steps of the cold start's decomposition (:mod:`kgsynth.agent.spaces.isp.oracle`).
Buckets: one step is easy, two medium, three or more hard; a question without SPARQL is
medium.

When the stage changes: each bucket is shuffled on its own and the buckets are laid end to end,
so training draws every easy question once before the first medium one and every medium one
before the first hard one; after that first pass the whole set is reshuffled (every stage has
been introduced), as a run without the curriculum reshuffles after each pass.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

STAGES = ("easy", "medium", "hard")
CURRICULA = ("none", "difficulty")

_TRIPLE_TERM = r"(?:<[^>\s]*>|\?\w+|[\w-]*:[\w.-]*|\"[^\"]*\"(?:\^\^\S+|@[\w-]+)?)"
_TRIPLE_RE = re.compile(
    rf"({_TRIPLE_TERM})\s+({_TRIPLE_TERM})\s+({_TRIPLE_TERM})\s*(?:\.|$|(?=\}}))"
)
_CONSTRAINT_RE = re.compile(
    r"\bCOUNT\s*\(|\b(?:MAX|MIN)\s*\(|ORDER\s+BY\b|FILTER\s*\([^)]*(?:\s[<>]=?\s|\s=\s|\bYEAR\s*\()",
    re.IGNORECASE,
)


def _drop_blocks(text: str, opener: re.Pattern[str]) -> str:
    """``text`` without every block ``opener`` starts (through its matching ``}`` or ``)``)."""
    out, i = [], 0
    for m in opener.finditer(text):
        if m.start() < i:
            continue
        close = {"{": "}", "(": ")"}[text[m.end() - 1]]
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {text[m.end() - 1]: 1, close: -1}.get(text[j], 0)
            j += 1
        out.append(text[i : m.start()])
        i = j
    out.append(text[i:])
    return " ".join(out)


_BIND_RE = re.compile(r"\bBIND\s*\(([^)]*)", re.IGNORECASE)
_OPTIONAL = re.compile(r"OPTIONAL\s*\{", re.IGNORECASE)
_SUBSELECT = re.compile(r"\{\s*SELECT\b[^{]*\{", re.IGNORECASE)
_CALLS = re.compile(r"\b(?:FILTER|BIND)\s*\(|\bVALUES\s+\??\w*\s*\{", re.IGNORECASE)


def reasoning_steps(sparql: str) -> int:
    """The reasoning steps of a gold query (see the module doc); at least 1."""
    body = sparql[sparql.find("{") + 1 :] if "{" in sparql else sparql
    body = _drop_blocks(body, _OPTIONAL)
    superlative = _SUBSELECT.search(body) is not None
    # a sub-select's braces: the one opened by "{ SELECT" closes after its WHERE block
    body = _drop_blocks(body, _SUBSELECT) if superlative else body
    body = _drop_blocks(body, _CALLS)
    triples = [t for t in _TRIPLE_RE.findall(body) if not t[1].startswith("?")]
    # a constraint's attribute look-up (the object read as a value: BIND, or its label) is
    # part of the constraint step, not a hop
    values = {v for b in _BIND_RE.findall(sparql) for v in re.findall(r"\?\w+", b)}
    values |= {s for s, p, _ in _TRIPLE_RE.findall(body) if p.startswith("?")}
    triples = [t for t in triples if t[2] not in values]
    mids = {t for triple in triples for t in (triple[0], triple[2]) if re.fullmatch(r"\?c\d+", t)}
    constants = {
        t for s, _, o in triples for t in (s, o) if not t.startswith("?") and not t.startswith('"')
    }
    hops = max(len(triples) - len(mids), 1)
    merges = max(len(constants) - 1, 0)
    constraint = 1 if superlative or _CONSTRAINT_RE.search(sparql) else 0
    return hops + merges + constraint


def stage(sparql: str | None) -> str:
    """easy (1 step), medium (2, or no SPARQL), hard (3 or more)."""
    if not sparql:
        return "medium"
    steps = reasoning_steps(sparql)
    return STAGES[min(steps, 3) - 1]


def curriculum_order(sparqls: Sequence[str | None], rng: random.Random) -> list[int]:
    """Question indices: the easy ones shuffled, then the medium, then the hard."""
    buckets: dict[str, list[int]] = {s: [] for s in STAGES}
    for i, q in enumerate(sparqls):
        buckets[stage(q)].append(i)
    order: list[int] = []
    for s in STAGES:
        rng.shuffle(buckets[s])
        order += buckets[s]
    return order


__all__ = ["CURRICULA", "STAGES", "curriculum_order", "reasoning_steps", "stage"]
