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

:func:`write_fanout_table` builds it in bulk (one sort of packed integers, no Python step per
fact); :class:`FanoutTable` reads it memory-mapped. With it the walker reads a fan-out, picks
the ``k``-th target of a hub's relation and names an entity without a query. Stores imported
before the table existed have none; the graph then sends the queries as before.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import polars as pl
import pyarrow as pa

log = logging.getLogger(__name__)

FANOUTS_DIR = "fanouts"
FORMAT_VERSION = 3
_ARRAYS = ("offsets", "row_key", "loops", "count", "target_start", "targets", "named")
_DIRECTIONS = ("out", "in")
_SQL_BATCH = 500
_ID_CACHE = 200_000  # IRIs whose id and name are kept (cleared when full)


def _bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


def _run_starts(values: np.ndarray) -> np.ndarray:
    """True where a sorted array's value differs from the one before."""
    first = np.ones(len(values), dtype=bool)
    np.not_equal(values[1:], values[:-1], out=first[1:])
    return first


def write_fanout_table(
    dest: Path,
    facts: Mapping[str, np.ndarray] | pl.DataFrame,
    terms: list[str],
    predicates: list[str],
    *,
    profile: str,
    iri_terms: int | None = None,
    labels: pl.Series | None = None,
) -> dict[str, Any] | None:
    """Write the table for ``facts`` (columns ``s``, ``p``, ``o``: ids into ``terms`` and
    ``predicates``; repeats allowed) into the folder ``dest``. The first ``iri_terms`` terms
    are IRIs (default: all); the others (literals, blank nodes) are counted as neighbours but
    get no row of their own. ``labels``: each IRI term's name (null: unnamed), when the
    import knows every name. Returns the meta written, or None (logged) for a KG whose ids do
    not fit the table's 64-bit packing (the graph then uses queries)."""
    n_terms = len(terms)
    n_iri = n_terms if iri_terms is None else iri_terms
    b_x, b_p = _bits(n_terms), _bits(len(predicates))
    if 2 * b_x + b_p + 1 > 64:
        log.warning("fan-out table not built: %d terms, %d predicates", n_terms, len(predicates))
        return None
    # ids in sorted IRI order: a row's targets sorted by id are then sorted by IRI, the order
    # the targets query returns them in
    order = pl.Series(terms[:n_iri], dtype=pl.String).arg_sort().to_numpy()
    rank = np.empty(n_terms, dtype=np.uint32)
    rank[order] = np.arange(n_iri, dtype=np.uint32)
    rank[n_iri:] = np.arange(n_iri, n_terms, dtype=np.uint32)
    s = rank[np.asarray(facts["s"])]
    o = rank[np.asarray(facts["o"])]
    p = np.asarray(facts["p"]).astype(np.uint16)
    del rank
    # one edge per direction packed as entity | predicate | direction | neighbour: one sort
    # groups the rows, orders their targets, and puts repeated facts side by side
    sh_d, sh_p = b_x, b_x + 1
    sh_e = sh_p + b_p
    loop = s == o  # the fan-out query leaves e itself out
    out = ~loop & (s < n_iri)  # blank-node subjects have no row
    inn = ~loop & (o < n_iri)
    n_out = int(out.sum())
    packed = np.empty(n_out + int(inn.sum()), dtype=np.uint64)
    # filled in place, one column at a time: the memory of one packed array and one column
    for part, (head, tail, mask, direction) in (
        (packed[:n_out], (s, o, out, 0)),
        (packed[n_out:], (o, s, inn, 1)),
    ):
        part[:] = head[mask]
        part <<= np.uint64(sh_e - sh_p)
        part |= p[mask]
        part <<= np.uint64(1)
        part |= np.uint64(direction)
        part <<= np.uint64(sh_d)
        part |= tail[mask]
    loops = np.unique(
        (s[loop].astype(np.uint64) << np.uint64(sh_e - sh_d))
        | (p[loop].astype(np.uint64) << np.uint64(1))
    )
    del s, o, p, loop, out, inn
    packed.sort()
    packed = packed[_run_starts(packed)]
    row_key = packed >> sh_d
    starts = np.flatnonzero(_run_starts(row_key))
    keys = row_key[starts]
    del row_key
    count = np.diff(np.append(starts, len(packed))).astype(np.uint32)
    targets = (packed & ((1 << b_x) - 1)).astype(np.uint32)
    del packed
    last = targets[starts + count.astype(np.int64) - 1] if len(starts) else targets[:0]
    target_start = np.where(last < n_iri, starts, -1).astype(np.int64)
    entity = (keys >> (sh_e - sh_d)).astype(np.int64)
    arrays = {
        "offsets": np.searchsorted(entity, np.arange(n_iri + 1, dtype=np.int64)),
        "row_key": keys,
        "loops": loops,
        "count": count,
        "target_start": target_start,
        "targets": targets,
        "named": np.zeros(0, dtype=np.uint32),
    }
    sorted_labels = None
    if labels is not None:
        sorted_labels = labels[:n_iri].gather(order)
        arrays["named"] = np.flatnonzero(sorted_labels.is_not_null().to_numpy()).astype(np.uint32)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, arr in arrays.items():
        np.save(tmp / f"{name}.npy", arr)
    _write_entities(tmp, pl.Series(terms[:n_iri], dtype=pl.String).gather(order), sorted_labels)
    meta = {
        "format": FORMAT_VERSION,
        "profile": profile,
        "labels": labels is not None,
        "predicate_bits": b_p,
        "predicates": predicates,
        "entities": n_iri,
        "rows": len(keys),
        "edges": len(targets),
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return meta


def _write_entities(dest: Path, sorted_iris: pl.Series, labels: pl.Series | None) -> None:
    """``entities.arrow`` (id -> IRI and name, memory-mapped) and ``entities.sqlite`` (IRI ->
    id)."""
    names = labels if labels is not None else pl.Series([None] * len(sorted_iris), dtype=pl.String)
    frame = pa.table(
        {
            "iri": sorted_iris.to_arrow().cast(pa.large_string()),
            "label": names.to_arrow().cast(pa.large_string()),
        }
    )
    with (
        pa.OSFile(str(dest / "entities.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, frame.schema) as writer,
    ):
        writer.write_table(frame, max_chunksize=len(frame) or None)
    con = sqlite3.connect(dest / "entities.sqlite")
    try:
        # built once, then only read: no journal, no syncs while it is written
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("CREATE TABLE entity (iri TEXT PRIMARY KEY, id INTEGER NOT NULL) WITHOUT ROWID")
        # in key order: each insert appends to the B-tree
        con.executemany(
            "INSERT INTO entity VALUES (?, ?)",
            zip(sorted_iris.to_list(), range(len(sorted_iris)), strict=True),
        )
        con.commit()
    finally:
        con.close()


def table_from_store(store: Any, dest: Path, *, profile: str) -> dict[str, Any] | None:
    """Build the table by reading every triple of a pyoxigraph ``store`` (for imports that
    are not converted in Arrow batches: N-Triples, Turtle, files read line by line). One
    Python step per triple: slower than the batched build, but the same counts and targets
    (names are left to the store: ``labels`` false)."""
    import pyoxigraph as ox

    iri_ids: dict[str, int] = {}
    other_ids: dict[Any, int] = {}
    pred_ids: dict[str, int] = {}
    parts: list[pl.DataFrame] = []
    cols: tuple[list[int], list[int], list[int]] = ([], [], [])

    def term_id(node: Any) -> int:
        if type(node) is ox.NamedNode:
            return iri_ids.setdefault(node.value, len(iri_ids))
        return -1 - other_ids.setdefault(node, len(other_ids))

    def flush() -> None:
        parts.append(
            pl.DataFrame(dict(zip("spo", cols, strict=True)), schema=dict.fromkeys("spo", pl.Int64))
        )
        for col in cols:
            col.clear()

    for quad in store.quads_for_pattern(None, None, None, ox.DefaultGraph()):
        cols[0].append(term_id(quad.subject))
        cols[1].append(pred_ids.setdefault(quad.predicate.value, len(pred_ids)))
        cols[2].append(term_id(quad.object))
        if len(cols[0]) >= 1_000_000:
            flush()
    flush()
    n_iri = len(iri_ids)
    # literals and blank nodes after the IRIs
    facts = pl.concat(parts).with_columns(
        pl.when(pl.col(c) < 0).then(n_iri - 1 - pl.col(c)).otherwise(pl.col(c)).alias(c)
        for c in "so"
    )
    terms = list(iri_ids) + [""] * len(other_ids)
    return write_fanout_table(dest, facts, terms, list(pred_ids), profile=profile, iri_terms=n_iri)


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
        self._predicate_mask = np.uint64((1 << self._key_shift) - 2)
        self.profile: str = self.meta["profile"]
        self.has_labels: bool = bool(self.meta["labels"])
        self._con = sqlite3.connect(
            f"file:{path / 'entities.sqlite'}?mode=ro", uri=True, check_same_thread=False
        )
        self._con.execute("SELECT 1 FROM entity LIMIT 1")
        frame = pa.ipc.open_file(pa.memory_map(str(path / "entities.arrow"))).read_all()
        self._iris = frame.column("iri").combine_chunks()
        self._labels = frame.column("label").combine_chunks()
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
            for iri, eid in self._con.execute(
                f"SELECT iri, id FROM entity WHERE iri IN ({marks})", chunk
            ):
                out[iri] = known[iri] = (eid, self._labels[eid].as_py())
        return out

    def iri(self, eid: int) -> str:
        return str(self._iris[eid].as_py())

    def named_iris(self) -> NamedIRIs:
        """The named entities' IRIs in sorted order (only when ``has_labels``)."""
        if not self.has_labels:
            raise ValueError("this table does not hold the names")
        return NamedIRIs(self)

    def rows(
        self, iris: Iterable[str]
    ) -> dict[str, tuple[list[tuple[str, str, int, int]], str | None] | None]:
        """For each of ``iris``: its rows ``(predicate IRI, direction, count, row)`` in table
        order (row -1: its targets are not held, see :meth:`has_targets`), and its name (None: unnamed, or names not held); None for an IRI the table does
        not hold (one in no fact)."""
        iris = list(dict.fromkeys(iris))
        found = self.entities(iris)
        preds, dirs = self.predicates, _DIRECTIONS
        out: dict[str, tuple[list[tuple[str, str, int, int]], str | None] | None] = {}
        for iri in iris:
            if iri not in found:
                out[iri] = None
                continue
            eid, label = found[iri]
            lo, hi = int(self._offsets[eid]), int(self._offsets[eid + 1])
            keys = self._row_key[lo:hi]
            p = ((keys & self._predicate_mask) >> 1).tolist()
            d = (keys & 1).tolist()
            n = self._count[lo:hi].tolist()
            held = (self._target_start[lo:hi] >= 0).tolist()
            out[iri] = (
                [
                    (preds[p[i]], dirs[d[i]], n[i], lo + i if held[i] else -1)
                    for i in range(hi - lo)
                ],
                label,
            )
        return out

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
        if len(ids) <= 16:  # most hops start from a few entities: no array arithmetic
            parts = []
            for eid in np.asarray(ids).tolist():
                part = self._follow_one(eid, pid, direction == "in", more_than)
                if part is None:
                    return None
                parts.append(part)
            return parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))
        if more_than is not None and len(ids) > 256:
            # a growing union, chunk by chunk: too many shows after the first chunks (what a
            # query read row by row stops at), and the result is the same union otherwise
            reached = np.zeros(0, dtype=np.uint32)
            start, size = 0, 256
            while start < len(ids):
                part = self.follow(ids[start : start + size], predicate, direction)
                if part is None:
                    return None
                reached = np.union1d(reached, part)
                if len(reached) > more_than:
                    raise TooMany
                start, size = start + size, size * 4
            return reached
        ids = np.asarray(ids, dtype=np.uint64)
        base = (ids << np.uint64(self._key_shift)) | np.uint64(pid << 1)
        keys = base | np.uint64(direction == "in")
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
        return np.unique(np.concatenate([found, looped]))

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
            return np.unique(np.append(found, np.uint32(eid)))
        return found  # a row's targets are sorted and distinct

    def iris(self, ids: np.ndarray) -> list[tuple[str, str | None]]:
        """``(IRI, name)`` of entity ids, in their order."""
        take = pa.array(np.asarray(ids, dtype=np.int64))
        return list(
            zip(self._iris.take(take).to_pylist(), self._labels.take(take).to_pylist(), strict=True)
        )

    def close(self) -> None:
        self._con.close()
