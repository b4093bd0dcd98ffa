"""The records :class:`~kgsynth.kg.graph.KGGraph` hands out (entities, relations,
neighbours), and the bounded cache it keeps them in."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from kgsynth.kg.terms import Term

Direction = Literal["out", "in"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Entity:
    """A resolved entity: its IRI and the name it is shown under."""

    iri: str
    name: str


@dataclass(frozen=True, slots=True)
class Resolution:
    """How a name was resolved: ``exact`` or ``case-insensitive``; ``candidates`` > 1 means the
    name was ambiguous and the entity with the most facts (then the smallest IRI) was taken."""

    entity: Entity
    match: Literal["exact", "case-insensitive"]
    candidates: int


@dataclass(frozen=True, slots=True)
class Relation:
    """A relation as agents see it: its name, its direction from the entity, and the IRIs it
    follows (one, or two across an unnamed node)."""

    name: str
    direction: Direction
    path: tuple[str, ...]

    @property
    def inverse(self) -> bool:
        return self.direction == "in"


@dataclass(frozen=True, slots=True)
class Neighbor:
    """An entity (or literal value) reached along a relation."""

    term: Term
    name: str

    @property
    def key(self) -> str:
        return self.term.value


def term_value(term: Term) -> str:
    return term.value


class LRU:
    """A small bounded least-recently-used cache, counting its hits and misses.

    Kept rather than ``cachetools.LRUCache``, which took 1.2 to 2.3 times as long per
    ``get_or_compute`` over a million Zipf-distributed keys (benchmarks/bench_libraries.py);
    ``functools.lru_cache`` cannot be filled from outside (``put``: the prefetch does)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, object] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def put(self, key: Hashable, value: object) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def get_or_compute(self, key: Hashable, compute: Callable[[], T]) -> T:
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]  # type: ignore[return-value]
        self.misses += 1
        value = compute()
        self._data[key] = value
        if len(self._data) > self.maxsize:
            self._data.popitem(last=False)
        return value


def cache_dir() -> Path:
    """kgsynth's user cache (``$KGSYNTH_CACHE`` or ``~/.cache/kgsynth``)."""
    return Path(os.environ.get("KGSYNTH_CACHE") or Path.home() / ".cache" / "kgsynth")
