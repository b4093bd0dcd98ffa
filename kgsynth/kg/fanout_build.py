"""Building the fan-out table (:mod:`kgsynth.kg.fanouts` says what it holds) at import time.

Facts as term ids -> ``STORE/fanouts/``: :func:`write_fanout_table` from the ids the Arrow
conversion of a delimited file collects (:mod:`kgsynth.kg.arrow_import`), or
:func:`table_from_store` from a loaded store's triples (N-Triples, Turtle, files read line by
line). ``kg import`` calls one of them before (or right after) ``bulk_load``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from kgsynth.kg.fanouts import FORMAT_VERSION

log = logging.getLogger(__name__)


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
    rows = _rows(facts, order, n_terms, n_iri, b_x, b_p)
    predicate_facts = _predicate_facts(rows, b_p, len(predicates))
    arrays = {
        "offsets": np.searchsorted(rows.entity, np.arange(n_iri + 1, dtype=np.int64)),
        "row_key": rows.keys,
        "loops": rows.loops,
        "count": rows.count,
        "target_start": rows.target_start,
        "targets": rows.targets,
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
        "rows": len(rows.keys),
        "edges": len(rows.targets),
        "predicate_facts": [int(n) for n in predicate_facts],
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return meta


@dataclass(frozen=True)
class _Rows:
    """The table's rows (one per entity, predicate and direction) and their targets."""

    keys: np.ndarray  # each row's entity | predicate | direction, sorted
    loops: np.ndarray  # entity | predicate of each distinct self loop
    count: np.ndarray  # each row's distinct targets
    target_start: np.ndarray  # where a row's targets start in ``targets`` (-1: not all IRIs)
    targets: np.ndarray
    entity: np.ndarray  # each row's entity


def _rows(
    facts: Mapping[str, np.ndarray] | pl.DataFrame,
    order: np.ndarray,
    n_terms: int,
    n_iri: int,
    b_x: int,
    b_p: int,
) -> _Rows:
    """Group ``facts`` into rows, their ids renumbered so that the IRIs are in ``order``."""
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
    packed, loops = _packed_edges(s, o, p, n_iri, sh_d, sh_p, sh_e)
    del s, o, p
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
    return _Rows(keys, loops, count, target_start, targets, entity)


def _packed_edges(
    s: np.ndarray, o: np.ndarray, p: np.ndarray, n_iri: int, sh_d: int, sh_p: int, sh_e: int
) -> tuple[np.ndarray, np.ndarray]:
    """The facts' edges, unsorted, and their distinct self loops (entity | predicate), packed
    with the shifts ``sh_d`` (direction), ``sh_p`` (predicate) and ``sh_e`` (entity)."""
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
    return packed, loops


def _predicate_facts(rows: _Rows, b_p: int, n_predicates: int) -> np.ndarray:
    """Distinct facts per predicate: each outgoing row counts its distinct objects, each self
    loop one (the store's own count of the predicate's triples, without scanning it)."""
    pred_mask = np.uint64((1 << b_p) - 1)
    outgoing = (rows.keys & np.uint64(1)) == 0
    return np.bincount(
        ((rows.keys[outgoing] >> np.uint64(1)) & pred_mask).astype(np.int64),
        weights=rows.count[outgoing],
        minlength=n_predicates,
    ) + np.bincount(
        ((rows.loops >> np.uint64(1)) & pred_mask).astype(np.int64), minlength=n_predicates
    )


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
    """Build the table from the triples of a pyoxigraph ``store`` (for imports that are not
    converted in Arrow batches: N-Triples, Turtle, files read line by line): the store's
    default graph is dumped as N-Triples beside ``dest`` (one triple a line; the engine writes
    an IRI as it stores it and escapes line breaks in literals), read back in blocks and split
    with polars; a term is its N-Triples text, so two terms are one exactly when the store
    says so. Names are left to the store (``labels`` false)."""
    import pyoxigraph as ox

    dump = dest.with_name(dest.name + f".dump{os.getpid()}.nt")
    term_ids: dict[str, int] = {}
    pred_ids: dict[str, int] = {}
    parts: list[dict[str, np.ndarray]] = []
    try:
        store.dump(str(dump), ox.RdfFormat.N_TRIPLES, from_graph=ox.DefaultGraph())
        with open(dump, encoding="utf-8") as fh:
            while lines := fh.readlines(4 << 20):
                spo = (
                    pl.Series("line", lines, dtype=pl.String)
                    .str.strip_suffix("\n")
                    .str.strip_suffix(" .")
                    .str.splitn(" ", 3)
                    .struct.rename_fields(["s", "p", "o"])
                    .struct.unnest()
                )
                terms = pl.concat([spo["s"], spo["o"]]).unique(maintain_order=True).to_list()
                block = pl.DataFrame(
                    {"t": terms, "id": [term_ids.setdefault(t, len(term_ids)) for t in terms]},
                    schema={"t": pl.String, "id": pl.UInt32},
                )
                for pred in spo["p"].unique(maintain_order=True).to_list():
                    pred_ids.setdefault(pred, len(pred_ids))
                parts.append(
                    {
                        c: spo.select(pl.col(c).alias("t"))
                        .join(block, on="t", how="left", maintain_order="left")["id"]
                        .to_numpy()
                        for c in "so"
                    }
                    | {"p": spo["p"].replace_strict(pred_ids, return_dtype=pl.UInt16).to_numpy()}
                )
    finally:
        dump.unlink(missing_ok=True)
    # IRIs first (ids 0 .. n_iri - 1), then literals and blank nodes
    texts = pl.Series(list(term_ids), dtype=pl.String)
    is_iri = texts.str.starts_with("<").to_numpy()
    new_id = np.empty(len(texts), dtype=np.uint32)
    n_iri = int(is_iri.sum())
    new_id[is_iri] = np.arange(n_iri, dtype=np.uint32)
    new_id[~is_iri] = np.arange(n_iri, len(texts), dtype=np.uint32)
    facts = {
        c: new_id[np.concatenate([part[c] for part in parts] or [np.zeros(0, np.uint32)])]
        for c in "so"
    }
    facts["p"] = np.concatenate([part["p"] for part in parts] or [np.zeros(0, np.uint16)])
    iris = texts.filter(pl.Series(is_iri)).str.slice(1).str.strip_suffix(">").to_list()
    predicates = [p[1:-1] for p in pred_ids]
    terms = iris + [""] * (len(texts) - n_iri)
    return write_fanout_table(dest, facts, terms, predicates, profile=profile, iri_terms=n_iri)
