"""The fan-out table: per-entity relation counts, each relation's targets and the entities'
names, stored beside an embedded store at import time, so that the walker's look-ups cost the
same on a KG of any size.

A store's facts (as term ids) -> ``STORE/fanouts/``::

    entities.arrow    iri, label by id: every IRI subject or object, ids in sorted IRI order;
                      its name when the import wrote the names (meta "labels")
    entities.sqlite   entity(iri, id): the id of an IRI
    offsets.npy       the rows of entity id e are rows offsets[e] .. offsets[e + 1]
    row_key.npy, count.npy
                      one row per (entity, predicate, direction), keyed (e << bits + 1) |
                      (predicate << 1) | direction, sorted: |N(e, r)|, the distinct
                      neighbours other than e (what the walker's fan-out query counts)
    loops.npy         the keys (direction 0) of the self loops e -r-> e, which the counts and
                      targets leave out and a walk's answer query follows
    target_start.npy  where a row's targets start in targets.npy (-1: a row with a literal or
                      blank-node target, whose targets a query lists)
    targets.npy       entity ids of the targets, sorted within a row (= sorted by IRI, the
                      order the targets query gives)
    named.npy         ids of the named entities (when meta "labels")
    meta.json         format version, profile, predicate IRIs, counts

:func:`kgsynth.kg.fanout_build.write_fanout_table` builds it in bulk (one sort of packed
integers, no Python step per fact); :class:`FanoutTable` reads it memory-mapped. With it the
walker reads a fan-out, picks the ``k``-th target of a hub's relation, names an entity and
follows a walk's hops without a query. Stores imported before the table existed have none; the
graph then sends the queries as before.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import overload

import numpy as np
import pyarrow as pa

log = logging.getLogger(__name__)

FANOUTS_DIR = "fanouts"
FORMAT_VERSION = 3
_ARRAYS = ("offsets", "row_key", "loops", "count", "target_start", "targets", "named")
DIRECTIONS = ("out", "in")
_SQL_BATCH = 500
_ID_CACHE = 200_000  # IRIs whose id and name are kept (cleared when full)


class TooMany(Exception):
    """A hop reaches more entities than asked for (:meth:`FanoutTable.follow`)."""


class NamedIRIs(Sequence[str]):
    """The named entities' IRIs, sorted, read from the table as they are asked for (a
    million-entity KG's list is never built to draw seeds from it)."""

    def __init__(self, table: FanoutTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table._named)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._table.iri(int(self._table._named[index]))

    def __iter__(self) -> Iterator[str]:
        named = self._table._named
        for start in range(0, len(named), 100_000):
            yield from self._table._iris.take(pa.array(named[start : start + 100_000])).to_pylist()


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its only chunk as it lies in the memory-mapped file (the
    import writes one), not a copy (``combine_chunks`` copied 74 MB of IRIs and names onto
    the heap at 10 M facts)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


class FanoutTable:
    """The read side: fan-outs, targets and names of entities, memory-mapped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        if self.meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {self.meta.get('format')!r}, expected {FORMAT_VERSION}")
        # memory-mapped, as plain arrays: indexing a np.memmap costs ~10x more
        arrays = {
            name: np.asarray(np.load(path / f"{name}.npy", mmap_mode="r")) for name in _ARRAYS
        }
        self._offsets = arrays["offsets"]
        self._row_key = arrays["row_key"]
        self._loops = arrays["loops"]
        self._count = arrays["count"]
        self._target_start = arrays["target_start"]
        self._targets = arrays["targets"]
        self._named = arrays["named"]
        self.predicates: list[str] = list(self.meta["predicates"])
        self._predicate_id = {p: i for i, p in enumerate(self.predicates)}
        self._key_shift = int(self.meta["predicate_bits"]) + 1
        self.profile: str = self.meta["profile"]
        self.has_labels: bool = bool(self.meta["labels"])
        self._con = sqlite3.connect(
            f"file:{path / 'entities.sqlite'}?mode=ro", uri=True, check_same_thread=False
        )
        self._con.execute("SELECT 1 FROM entity LIMIT 1")
        frame = pa.ipc.open_file(pa.memory_map(str(path / "entities.arrow"))).read_all()
        self._iris = _one_array(frame.column("iri"))
        self._labels = _one_array(frame.column("label"))
        if len(self._iris) + 1 != len(self._offsets):
            raise ValueError("entities.arrow does not match offsets.npy")
        # entities looked up so far: a walk asks for the same ones again and again
        self._known: dict[str, tuple[int, str | None]] = {}

    @classmethod
    def open(cls, store_dir: Path) -> FanoutTable | None:
        """The table of a store directory, or None when it has none (or an unreadable one,
        logged)."""
        path = store_dir / FANOUTS_DIR
        if not (path / "meta.json").is_file():
            log.info("%s has no fan-out table (imported before it existed): walks query", store_dir)
            return None
        try:
            return cls(path)
        except (OSError, ValueError, KeyError, sqlite3.Error) as exc:
            log.warning("%s: fan-out table not used (%s); import the KG again", path, exc)
            return None

    def entities(self, iris: Iterable[str]) -> dict[str, tuple[int, str | None]]:
        """``(id, name)`` of those ``iris`` the table holds."""
        known = self._known
        out: dict[str, tuple[int, str | None]] = {}
        todo = []
        for iri in dict.fromkeys(iris):
            hit = known.get(iri)
            if hit is None:
                todo.append(iri)
            else:
                out[iri] = hit
        if len(known) + len(todo) > _ID_CACHE:
            known.clear()
        for start in range(0, len(todo), _SQL_BATCH):
            chunk = todo[start : start + _SQL_BATCH]
            marks = ",".join("?" * len(chunk))
            rows = self._con.execute(
                f"SELECT iri, id FROM entity WHERE iri IN ({marks})", chunk
            ).fetchall()
            # the names in one take: a scalar read each costs more than the query
            take = pa.array([eid for _, eid in rows], type=pa.int64())
            for (iri, eid), name in zip(rows, self._labels.take(take).to_pylist(), strict=True):
                out[iri] = known[iri] = (eid, name)
        return out

    def iri(self, eid: int) -> str:
        """The IRI of an entity id, remembered with its id and name: the walker asks for the
        entity a pick reached (its name, its fan-outs) next, and :meth:`entities` then needs
        no query."""
        iri = str(self._iris[eid].as_py())
        if iri not in self._known:
            if len(self._known) >= _ID_CACHE:
                self._known.clear()
            self._known[iri] = (eid, self._labels[eid].as_py())
        return iri

    def named_iris(self) -> NamedIRIs:
        """The named entities' IRIs in sorted order (only when ``has_labels``)."""
        if not self.has_labels:
            raise ValueError("this table does not hold the names")
        return NamedIRIs(self)

    def rows(
        self, iris: Iterable[str]
    ) -> dict[str, tuple[list[tuple[str, str, int, int]], str | None] | None]:
        """For each of ``iris``: its rows ``(predicate IRI, direction, count, row)`` in table
        order (row -1: its targets are not held, see :meth:`has_targets`), and its name (None:
        unnamed, or names not held); None for an IRI the table does not hold (one in no
        fact)."""
        iris = list(dict.fromkeys(iris))
        found = self.entities(iris)
        held = [i for i in iris if i in found]
        entity, code, count, row = (
            a.tolist() for a in self.relation_rows(np.array([found[i][0] for i in held]))
        )
        lists: list[list[tuple[str, str, int, int]]] = [[] for _ in held]
        for e, c, n, r in zip(entity, code, count, row, strict=True):
            lists[e].append((self.predicates[c >> 1], DIRECTIONS[c & 1], n, r))
        by_iri = dict(zip(held, lists, strict=True))
        return {i: (by_iri[i], found[i][1]) if i in found else None for i in iris}

    def relation_rows(self, ids: np.ndarray) -> tuple[np.ndarray, ...]:
        """The rows of entity ids, in table order, as arrays: ``(entity, code, count, row)``
        with ``entity`` the position in ``ids``, ``code`` ``predicate << 1 | direction``
        (direction 1: in) and ``row`` -1 where its targets are not held (:meth:`rows` lists
        the same per IRI)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        lo, hi = self._offsets[ids], self._offsets[ids + 1]
        n = hi - lo
        index = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()), dtype=np.int64)
        entity = np.repeat(np.arange(len(ids)), n)
        code = (self._row_key[index] & np.uint64((1 << self._key_shift) - 1)).astype(np.int64)
        row = np.where(self._target_start[index] >= 0, index, -1)
        return entity, code, np.asarray(self._count[index], dtype=np.int64), row

    def has_targets(self, row: int) -> bool:
        """Whether ``row``'s targets are held (all of them IRIs)."""
        return int(self._target_start[row]) >= 0

    def pick_target(
        self, row: int, exclude: Iterable[str], choose: Callable[[range], int]
    ) -> str | None:
        """The IRI ``choose(range(m))`` picks among ``row``'s targets sorted by IRI, those in
        ``exclude`` left out (m of them remain): what ``choose`` picks from the list of those
        targets (``random.Random.choice`` draws the same). None when none remain."""
        start = int(self._target_start[row])
        if start < 0:
            raise ValueError(f"row {row} holds no targets")
        targets = self._targets[start : start + int(self._count[row])]
        skipped = []
        for eid, _ in self.entities(exclude).values():
            pos = int(np.searchsorted(targets, np.uint32(eid)))
            if pos < len(targets) and int(targets[pos]) == eid:
                skipped.append(pos)
        m = len(targets) - len(skipped)
        if m <= 0:
            return None
        k = int(choose(range(m)))
        for pos in sorted(skipped):  # the k-th kept target: step over the left-out ones
            if pos <= k:
                k += 1
        return self.iri(int(targets[k]))

    def follow(
        self, ids: np.ndarray, predicate: str, direction: str, *, more_than: int | None = None
    ) -> np.ndarray | None:
        """The entity ids reached from ``ids`` along ``predicate`` in ``direction``, self
        loops included (what a SPARQL pattern ``?a <p> ?b`` binds), sorted and distinct; None
        when a row reaches a literal or a blank node (the table does not hold those).
        :class:`TooMany` as soon as more than ``more_than`` are reached (the whole union is
        then not built)."""
        pid = self._predicate_id.get(predicate)
        if pid is None or not len(ids):
            return np.zeros(0, dtype=np.uint32)
        inverse = direction == "in"
        if len(ids) <= 16:  # most hops start from a few entities: no array arithmetic
            parts = []
            for eid in np.asarray(ids).tolist():
                part = self._follow_one(eid, pid, inverse, more_than)
                if part is None:
                    return None
                parts.append(part)
            return parts[0] if len(parts) == 1 else _distinct(np.concatenate(parts))
        if more_than is not None and len(ids) > 256:
            # a growing union, chunk by chunk: too many shows after the first chunks (what a
            # query read row by row stops at), and the result is the same union otherwise
            reached = np.zeros(0, dtype=np.uint32)
            start, size = 0, 256
            while start < len(ids):
                # a chunk's row with more targets than more_than: the union would hold too
                # many, so it is not built (a chunk with a literal row still gives None first)
                part = self._follow_rows(ids[start : start + size], pid, inverse, more_than)
                if part is None:
                    return None
                reached = _distinct(np.concatenate([reached, part]))
                if len(reached) > more_than:
                    raise TooMany
                start, size = start + size, size * 4
            return reached
        return self._follow_rows(ids, pid, inverse, more_than)

    def _follow_rows(
        self, ids: np.ndarray, pid: int, inverse: bool, more_than: int | None
    ) -> np.ndarray | None:
        """:meth:`follow` from many ids at once, in array operations."""
        ids = np.asarray(ids, dtype=np.uint64)
        base = (ids << np.uint64(self._key_shift)) | np.uint64(pid << 1)
        keys = base | np.uint64(inverse)
        pos = np.searchsorted(self._row_key, keys)
        inside = pos < len(self._row_key)
        hit = np.zeros(len(keys), dtype=bool)
        hit[inside] = self._row_key[pos[inside]] == keys[inside]
        rows = pos[hit]
        starts = np.asarray(self._target_start[rows])
        if (starts < 0).any():
            return None
        counts = np.asarray(self._count[rows], dtype=np.int64)
        if more_than is not None and len(counts) and int(counts.max()) > more_than:
            raise TooMany
        before = np.cumsum(counts) - counts  # where each row's targets go in the result
        index = np.repeat(starts - before, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        found = np.asarray(self._targets[index], dtype=np.uint32)
        looped = ids[np.isin(base, self._loops)].astype(np.uint32) if len(self._loops) else ids[:0]
        return _distinct(np.concatenate([found, looped]))

    def _follow_one(
        self, eid: int, pid: int, inverse: bool, more_than: int | None
    ) -> np.ndarray | None:
        base = (eid << self._key_shift) | (pid << 1)
        key = base | int(inverse)
        lo, hi = int(self._offsets[eid]), int(self._offsets[eid + 1])
        # among the entity's own rows; a scalar of the array's type (another type makes numpy
        # convert the array)
        row = lo + int(np.searchsorted(self._row_key[lo:hi], np.uint64(key)))
        found = np.zeros(0, dtype=np.uint32)
        if row < hi and int(self._row_key[row]) == key:
            start, count = int(self._target_start[row]), int(self._count[row])
            if start < 0:
                return None
            if more_than is not None and count > more_than:
                raise TooMany
            found = np.asarray(self._targets[start : start + count])
        loop = int(np.searchsorted(self._loops, np.uint64(base)))
        if loop < len(self._loops) and int(self._loops[loop]) == base:
            return _distinct(np.append(found, np.uint32(eid)))
        return found  # a row's targets are sorted and distinct

    def iris(self, ids: np.ndarray) -> list[tuple[str, str | None]]:
        """``(IRI, name)`` of entity ids, in their order."""
        take = pa.array(np.asarray(ids, dtype=np.int64))
        return list(
            zip(self._iris.take(take).to_pylist(), self._labels.take(take).to_pylist(), strict=True)
        )

    def close(self) -> None:
        self._con.close()


def _distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` (sorted, distinct) by a sort and one comparison: 3-4x faster on
    the unions :meth:`FanoutTable.follow` builds, which np.unique hashes element by element
    before it sorts the distinct ones."""
    values = np.sort(values)
    if len(values) < 2:
        return values
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]
