"""The fan-out table: per-entity relation counts and the targets of hub relations, stored
beside an embedded store at import time, so the walker's look-ups cost the same on any KG size.

A store's facts (as term ids) -> ``STORE/fanouts/``::

    entities.sqlite   entity(id, iri): every IRI subject or object; ids in sorted IRI order
    offsets.npy       the rows of entity id e are rows offsets[e] .. offsets[e + 1]
    predicate.npy, direction.npy, count.npy
                      one row per (entity, predicate, direction): |N(e, r)|, the distinct
                      neighbours other than e (what the fan-out query counts)
    target_start.npy  for a row with more than LISTED_TARGETS targets, all of them IRIs, where
                      its targets start in targets.npy (-1 otherwise)
    targets.npy       entity ids of those targets, sorted (= sorted by IRI)
    meta.json         format version, profile, predicate IRIs, counts

:func:`write_fanout_table` builds it in bulk (polars and numpy, no Python loop per fact);
:class:`FanoutTable` reads it memory-mapped. A row's count is the walker's fan-out of
``(entity, predicate, direction)``; a hub row's targets let the walker pick its ``k``-th target
(in the order the listing query sorts them) without listing tens of thousands. Stores imported
before the table existed have none; the graph then sends today's queries.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

log = logging.getLogger(__name__)

FANOUTS_DIR = "fanouts"
FORMAT_VERSION = 1
# rows with at most this many targets are listed by a query (cheap, bounded); larger ones are
# read from targets.npy
LISTED_TARGETS = 256
_ARRAYS = ("offsets", "predicate", "direction", "count", "target_start", "targets")
_DIRECTIONS = ("out", "in")
_SQL_BATCH = 500


def write_fanout_table(
    dest: Path,
    facts: pl.DataFrame,
    terms: list[str],
    predicates: list[str],
    *,
    profile: str,
    iri_terms: int | None = None,
) -> dict[str, Any]:
    """Write the table for ``facts`` (columns ``s``, ``p``, ``o``: ids into ``terms`` and
    ``predicates``; repeats allowed) into the folder ``dest``. The first ``iri_terms`` terms
    are IRIs (default: all); the others (literals, blank nodes) are counted as neighbours but
    get no row of their own. Returns the meta written."""
    n_terms = len(terms)
    n_iri = n_terms if iri_terms is None else iri_terms
    if n_terms >= 2**32 or len(predicates) >= 2**16:
        raise ValueError("fan-out table: more than 2**32 terms or 2**16 predicates")
    # ids in sorted IRI order: then a row's targets sorted by id are sorted by IRI, the order
    # the targets query returns them in
    order = pl.Series(terms[:n_iri], dtype=pl.String).arg_sort().to_numpy()
    rank = np.empty(n_terms, dtype=np.uint32)
    rank[order] = np.arange(n_iri, dtype=np.uint32)
    rank[n_iri:] = np.arange(n_iri, n_terms, dtype=np.uint32)
    facts = facts.select(
        pl.col("s").cast(pl.UInt32), pl.col("p").cast(pl.UInt16), pl.col("o").cast(pl.UInt32)
    ).unique()
    facts = facts.filter(pl.col("s") != pl.col("o"))  # the fan-out query leaves e itself out
    s = rank[facts["s"].to_numpy()]
    o = rank[facts["o"].to_numpy()]
    p = facts["p"].to_numpy().astype(np.uint64)
    del facts
    # one edge per direction: (entity, predicate, direction) packed in a key, and the neighbour
    key = np.concatenate(
        [
            (s.astype(np.uint64) << 17) | (p << 1),
            (o.astype(np.uint64) << 17) | (p << 1) | 1,
        ]
    )
    other = np.concatenate([o, s])
    del s, o, p
    keep = (key >> 17) < n_iri  # blank-node subjects have no row
    edges = pl.DataFrame({"key": key[keep], "x": other[keep]})
    del key, other, keep
    rows = edges.group_by("key").agg(
        pl.len().alias("n"), (pl.col("x") >= n_iri).any().alias("non_iri")
    )
    rows = rows.sort("key")
    keys = rows["key"].to_numpy()
    count = rows["n"].to_numpy().astype(np.uint32)
    entity = (keys >> 17).astype(np.int64)
    offsets = np.searchsorted(entity, np.arange(n_iri + 1, dtype=np.int64)).astype(np.int64)
    hub = (count > LISTED_TARGETS) & ~rows["non_iri"].to_numpy()
    hub_keys = pl.Series("key", keys[hub])
    hub_edges = edges.filter(pl.col("key").is_in(hub_keys.implode())).sort(["key", "x"])
    del edges
    target_start = np.full(len(keys), -1, dtype=np.int64)
    # hub rows in key order; their targets are laid out one after another in that order
    starts = np.concatenate([[0], np.cumsum(count[hub], dtype=np.int64)[:-1]])
    target_start[hub] = starts
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    arrays = {
        "offsets": offsets,
        "predicate": ((keys >> 1) & 0xFFFF).astype(np.uint16),
        "direction": (keys & 1).astype(np.uint8),
        "count": count,
        "target_start": target_start,
        "targets": hub_edges["x"].to_numpy().astype(np.uint32),
    }
    for name, arr in arrays.items():
        np.save(tmp / f"{name}.npy", arr)
    _write_entities(tmp / "entities.sqlite", pl.Series(terms[:n_iri])[order])
    meta = {
        "format": FORMAT_VERSION,
        "profile": profile,
        "listed_targets": LISTED_TARGETS,
        "predicates": predicates,
        "entities": n_iri,
        "rows": len(keys),
        "hub_rows": int(hub.sum()),
        "hub_targets": len(arrays["targets"]),
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return meta


def _write_entities(path: Path, sorted_iris: pl.Series) -> None:
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("CREATE TABLE entity (id INTEGER PRIMARY KEY, iri TEXT NOT NULL)")
        con.executemany("INSERT INTO entity VALUES (?, ?)", enumerate(sorted_iris.to_list()))
        con.execute("CREATE UNIQUE INDEX entity_iri ON entity(iri)")
        con.commit()
    finally:
        con.close()


def table_from_store(store: Any, dest: Path, *, profile: str) -> dict[str, Any]:
    """Build the table by reading every triple of a pyoxigraph ``store`` (for imports that
    are not converted in Arrow batches: N-Triples, Turtle, files read line by line). One
    Python step per triple: slower than the batched build, but the same table."""
    import pyoxigraph as ox

    iri_ids: dict[str, int] = {}
    other_ids: dict[Any, int] = {}
    pred_ids: dict[str, int] = {}
    cols: dict[str, list[int]] = {"s": [], "p": [], "o": []}
    parts: list[pl.DataFrame] = []
    pending = 0

    def term_id(node: Any) -> int:
        if type(node) is ox.NamedNode:
            return iri_ids.setdefault(node.value, len(iri_ids))
        return -1 - other_ids.setdefault(node, len(other_ids))

    for quad in store.quads_for_pattern(None, None, None, ox.DefaultGraph()):
        cols["s"].append(term_id(quad.subject))
        cols["p"].append(pred_ids.setdefault(quad.predicate.value, len(pred_ids)))
        cols["o"].append(term_id(quad.object))
        pending += 1
        if pending >= 1_000_000:
            parts.append(pl.DataFrame(cols, schema={c: pl.Int64 for c in "spo"}))
            cols = {"s": [], "p": [], "o": []}
            pending = 0
    parts.append(pl.DataFrame(cols, schema={c: pl.Int64 for c in "spo"}))
    n_iri = len(iri_ids)
    # literals and blank nodes after the IRIs
    facts = pl.concat(parts).with_columns(
        pl.when(pl.col(c) < 0).then(n_iri - 1 - pl.col(c)).otherwise(pl.col(c)).alias(c)
        for c in "so"
    )
    terms = list(iri_ids) + [""] * len(other_ids)
    return write_fanout_table(dest, facts, terms, list(pred_ids), profile=profile, iri_terms=n_iri)


class FanoutTable:
    """The read side: fan-outs of entities and the targets of hub rows, memory-mapped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        if self.meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {self.meta.get('format')!r}, expected {FORMAT_VERSION}")
        arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in _ARRAYS}
        self._offsets = arrays["offsets"]
        self._predicate = arrays["predicate"]
        self._direction = arrays["direction"]
        self._count = arrays["count"]
        self._target_start = arrays["target_start"]
        self._targets = arrays["targets"]
        self.predicates: list[str] = list(self.meta["predicates"])
        self.profile: str = self.meta["profile"]
        self._con = sqlite3.connect(
            f"file:{path / 'entities.sqlite'}?mode=ro", uri=True, check_same_thread=False
        )
        self._con.execute("SELECT 1 FROM entity LIMIT 1")

    @classmethod
    def open(cls, store_dir: Path) -> FanoutTable | None:
        """The table of a store directory, or None when it has none (or an unreadable one,
        logged)."""
        path = store_dir / FANOUTS_DIR
        if not (path / "meta.json").is_file():
            return None
        try:
            return cls(path)
        except (OSError, ValueError, KeyError, sqlite3.Error) as exc:
            log.warning("%s: fan-out table not used (%s); import the KG again", path, exc)
            return None

    def ids(self, iris: Iterable[str]) -> dict[str, int]:
        """Entity ids of those ``iris`` that have one."""
        todo = list(dict.fromkeys(iris))
        out: dict[str, int] = {}
        for start in range(0, len(todo), _SQL_BATCH):
            chunk = todo[start : start + _SQL_BATCH]
            marks = ",".join("?" * len(chunk))
            for iri, eid in self._con.execute(
                f"SELECT iri, id FROM entity WHERE iri IN ({marks})", chunk
            ):
                out[iri] = eid
        return out

    def iri(self, eid: int) -> str:
        row = self._con.execute("SELECT iri FROM entity WHERE id = ?", (eid,)).fetchone()
        if row is None:
            raise KeyError(eid)
        return str(row[0])

    def rows(self, iris: Iterable[str]) -> dict[str, list[tuple[str, str, int, int]]]:
        """For each of ``iris``: ``(predicate IRI, direction, count, row)`` of its rows, in
        table order; an IRI the table does not hold has no fact (an empty list)."""
        iris = list(dict.fromkeys(iris))
        ids = self.ids(iris)
        preds, dirs = self.predicates, _DIRECTIONS
        out: dict[str, list[tuple[str, str, int, int]]] = {}
        for iri in iris:
            eid = ids.get(iri)
            if eid is None:
                out[iri] = []
                continue
            lo, hi = int(self._offsets[eid]), int(self._offsets[eid + 1])
            p = self._predicate[lo:hi].tolist()
            d = self._direction[lo:hi].tolist()
            n = self._count[lo:hi].tolist()
            out[iri] = [(preds[p[i]], dirs[d[i]], n[i], lo + i) for i in range(hi - lo)]
        return out

    def has_targets(self, row: int) -> bool:
        """Whether ``row``'s targets are stored (a hub row whose targets are all IRIs)."""
        return int(self._target_start[row]) >= 0

    def pick_target(self, row: int, exclude: Iterable[str], choose: Any) -> str | None:
        """The IRI ``choose(range(m))`` picks among ``row``'s targets sorted by IRI, those in
        ``exclude`` left out (m of them remain): what ``choose`` picks from the list of those
        targets (``random.Random.choice`` draws the same). None when none remain."""
        start = int(self._target_start[row])
        if start < 0:
            raise ValueError(f"row {row} has no stored targets")
        targets = self._targets[start : start + int(self._count[row])]
        skipped = []
        for eid in self.ids(exclude).values():
            pos = int(np.searchsorted(targets, eid))
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

    def close(self) -> None:
        self._con.close()
