"""Trial-and-error demonstrations for the ``knowcoder`` oracle (KnowCoder-A1 samples its expert
trajectories with trial and error), written without an LLM from a walk's stored SPARQL.

The plain oracle replay (:func:`~kgsynth.agent.spaces.sparql_oracle.replay_sparql`: types,
patterns, execute) is kept up to its last step; then a first ``ExecuteSPARQL`` makes a mistake
an agent makes, the observation shows it, and the gold query corrects it. The mistakes
(:func:`mistakes`), tried in a seeded order until one really goes wrong:

- ``direction``: one hop of the stored query with its relation the wrong way round
  (``?x1 <directed_by> <Clive Donner>`` written ``<Clive Donner> <directed_by> ?x1``);
- ``relation``: one hop's relation replaced by a wrong but plausible one that the
  ``SearchGraphPatterns`` observation showed (its best-ranked other relations first).

A mistake counts only when its query runs without a tool error and its rows are not the gold
answer set (no rows, or other entities); a walk none of whose mistakes does so gets no
trial-and-error trajectory. Only hops written as one triple pattern (not a flattened CVT hop)
are changed. The correcting step is an :class:`OracleCall` of kind ``retry`` whose
``mistake`` says what went wrong (its thought names it: see :mod:`.thoughts`). Such
trajectories are written with ``mode``
:data:`~kgsynth.agent.spaces.oracle_call.TRIAL_MODE`, so they can be counted and filtered
apart.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from kgsynth.agent.spaces.knowcoder.patterns import row_predicates
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.sparql_oracle import check_syntax, query_answers, walk_relations
from kgsynth.agent.tools import ToolEnvironment, ToolResult
from kgsynth.core.stage import Reject
from kgsynth.kg.graph import KGGraph
from kgsynth.metrics import normalize_answer

MISTAKE_KINDS = ("direction", "relation")
MAX_ALTERNATIVES = 3
"""Other relations (best-ranked first) of the patterns observation a ``relation`` mistake uses."""

# one triple pattern of a stored query: subject, predicate IRI, object (variables or IRIs)
_TRIPLE = re.compile(r"(\?\w+|<[^<>\s]*>) (<[^<>\s]*>) (\?\w+|<[^<>\s]*>) \.")
_CLAUSE = re.compile(r"\s(FILTER|OPTIONAL)\b")

Step = tuple[OracleCall, ToolResult]


@dataclass(frozen=True)
class Mistake:
    """A wrong query: what is wrong (``kind``), the relation it uses (``wrong``) where it
    should use ``right`` (the same name for a ``direction`` mistake)."""

    kind: str
    query: str
    wrong: str
    right: str


def _where_end(query: str) -> int:
    m = _CLAUSE.search(query)
    return m.start() if m else len(query)


def mistakes(
    row: dict[str, Any], graph: KGGraph, patterns_text: str, rng: random.Random
) -> list[Mistake]:
    """The wrong versions of ``row``'s stored query, in the order to try them: the kind drawn
    with ``rng``, then the other; within a kind, the hops in a seeded order."""
    query = row["sparql"]
    prof = graph.profile
    wanted = set(walk_relations(row))
    hops = [
        m
        for m in _TRIPLE.finditer(query[: _where_end(query)])
        if prof.relation_name(m.group(2)[1:-1]) in wanted
    ]
    gold_predicates = {m.group(2) for m in hops}
    shown: dict[str, None] = {}
    for line in patterns_text.splitlines():  # the ``entities`` reading's SPARQL lines
        for t in _TRIPLE.finditer(line.split("  # ")[0]):
            if t.group(2) not in gold_predicates:
                shown.setdefault(t.group(2), None)
    for predicate in row_predicates(patterns_text):  # the paper's (?x, r1 -> r2, "v") rows
        if predicate not in gold_predicates:
            shown.setdefault(predicate, None)
    alternatives = list(shown)[:MAX_ALTERNATIVES]
    by_kind: dict[str, list[Mistake]] = {k: [] for k in MISTAKE_KINDS}
    for m in hops:
        subject, predicate, obj = m.groups()
        name = prof.relation_name(predicate[1:-1])

        def swap(text: str, m: re.Match[str] = m) -> str:
            return f"{query[: m.start()]}{text}{query[m.end() :]}"

        by_kind["direction"].append(
            Mistake("direction", swap(f"{obj} {predicate} {subject} ."), name, name)
        )
        for alt in alternatives:
            wrong = prof.relation_name(alt[1:-1])
            by_kind["relation"].append(
                Mistake("relation", swap(f"{subject} {alt} {obj} ."), wrong, name)
            )
    first = rng.choice(MISTAKE_KINDS)
    ordered = []
    for kind in (first, *(k for k in MISTAKE_KINDS if k != first)):
        found = by_kind[kind]
        rng.shuffle(found)
        ordered.extend(found)
    return ordered


def trial_steps(
    row: dict[str, Any], env: ToolEnvironment, steps: list[Step], rng: random.Random
) -> list[Step] | None:
    """The plain knowcoder replay ``steps`` (its last step the gold ``ExecuteSPARQL``) with a
    failing first attempt before the gold query, or None when no mistake goes wrong."""
    patterns = next((r for c, r in steps if c.kind == "patterns"), None)
    if patterns is None or not steps or steps[-1][0].kind != "execute":
        return None
    gold_call, gold_result = steps[-1]
    gold = {normalize_answer(a) for a in row["answer_names"]}
    for mk in mistakes(row, env.graph, patterns.text, rng):
        rels = tuple(mk.wrong if r == mk.right else r for r in gold_call.relations)
        call = OracleCall(
            "execute",
            f"ExecuteSPARQL({json.dumps(mk.query, ensure_ascii=False)})",
            gold_call.entity,
            None,
            rels,
        )
        try:
            check_syntax(call)
        except Reject:
            continue
        result = env.execute(call.call)
        if result.error is not None:
            continue
        rows = query_answers(result)
        if {normalize_answer(n) for n in rows} == gold:
            continue  # not a mistake on this KG
        note = {"kind": mk.kind, "wrong": mk.wrong, "right": mk.right, "rows": str(len(rows))}
        retry = OracleCall(
            "retry", gold_call.call, gold_call.entity, None, gold_call.relations, note
        )
        return [*steps[:-1], (call, result), (retry, gold_result)]
    return None
