"""A walk as the sampler builds it (:class:`Walk`, :class:`Hop`), its row in ``walks.parquet``,
and what a run has done so far (:class:`WalkState`)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from kgsynth.kg.graph import Relation


@dataclass(frozen=True)
class Hop:
    relation: Relation
    entity: str  # IRI (or literal value for a final literal answer)
    name: str
    is_iri: bool = True


@dataclass
class Walk:
    structure: str
    topics: list[tuple[str, str]]  # (iri, name)
    branches: list[list[Hop]]
    merge_at: list[int]
    sampled_answer: str = ""
    answers: list[tuple[str, str]] = field(default_factory=list)
    sparql: str = ""
    sexpr: str = ""  # constraint walks: their S-expression (and their answers come with it)

    def key(self) -> str:
        paths = [
            [(h.relation.name, h.relation.direction, h.relation.path) for h in b]
            for b in self.branches
        ]
        topics = [t[0] for t in self.topics]
        if self.structure == "2I":  # the two branches are interchangeable
            pairs = sorted(zip(topics, [json.dumps(p) for p in paths], strict=True))
            topics, paths = [p[0] for p in pairs], [json.loads(p[1]) for p in pairs]
        # a constraint walk is also told apart by its constraint (chains keep their old ids)
        extra = [self.sexpr] if self.sexpr else []
        return json.dumps([self.structure, topics, paths, *extra], sort_keys=True)


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big")


def walk_id_of(walk: Walk) -> str:
    """Stable id from the duplicate key (structure, topic entities, relation paths)."""
    return "w-" + hashlib.sha1(walk.key().encode()).hexdigest()[:16]


def walk_to_row(walk: Walk, seed: int, attempt: int) -> dict[str, Any]:
    return {
        "walk_id": walk_id_of(walk),
        "structure": walk.structure,
        "hops": sum(len(b) for b in walk.branches),
        "topic_names": [t[1] for t in walk.topics],
        "topic_ids": [t[0] for t in walk.topics],
        "branches": [
            [
                {"relation": h.relation.name, "inverse": h.relation.inverse, "entity": h.name}
                for h in b
            ]
            for b in walk.branches
        ],
        "merge_at": walk.merge_at,
        "answer_names": [a[1] for a in walk.answers],
        "answer_ids": [a[0] for a in walk.answers],
        "sampled_answer": walk.sampled_answer,
        "sparql": walk.sparql,
        "sexpr": walk.sexpr,
        "seed": seed,
        "attempt": attempt,
    }


@dataclass
class WalkState:
    """What a run has done so far (restored from the chunks when resuming)."""

    next_attempt: int = 0
    accepted: Counter = field(default_factory=Counter)  # per structure
    attempts: Counter = field(default_factory=Counter)  # per structure
    rejects: Counter = field(default_factory=Counter)  # per reason
    # structure -> reason -> attempts
    rejects_by_structure: defaultdict = field(default_factory=lambda: defaultdict(Counter))
    keys: set[str] = field(default_factory=set)  # walk_ids accepted so far
    exhausted: set[str] = field(default_factory=set)
    relations_available: int = 0
