"""Column helpers of the filter: the input as a table in the trajectory schema, and the
vectorised pieces (threads over Arrow compute, regex match, list flattening, counts per row)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from kgsynth.core.errors import InputFileError
from kgsynth.core.schema import TRAJECTORY_SCHEMA

_WORKERS = max(1, min(4, pa.cpu_count()))


def missing_columns(names: Sequence[str]) -> list[str]:
    """The :data:`TRAJECTORY_SCHEMA` columns not among ``names``, in schema order."""
    have = set(names)
    return [f.name for f in TRAJECTORY_SCHEMA if f.name not in have]


def as_trajectory_table(data: Any, source: str = "input rows") -> pa.Table:
    """``data`` (an Arrow table, a polars DataFrame or a sequence of row dicts) as a table in
    :data:`TRAJECTORY_SCHEMA`; extra columns are dropped.

    Raises :class:`InputFileError` naming ``source`` and the missing or mistyped column(s).
    """
    if isinstance(data, pl.DataFrame):
        data = data.to_arrow()
    if not isinstance(data, pa.Table):
        rows = list(data)
        for i, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                raise InputFileError(source, f"expected a mapping, got {type(row).__name__}", i)
            missing = missing_columns(list(row))
            if missing:
                raise InputFileError(source, f"missing column(s) {', '.join(missing)}", i)
        try:
            return pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise InputFileError(source, f"rows do not fit the trajectory schema: {exc}") from None
    missing = missing_columns(data.column_names)
    if missing:
        raise InputFileError(
            source,
            f"missing column(s) {', '.join(missing)}; found {', '.join(data.column_names)}",
        )
    table = data.select(TRAJECTORY_SCHEMA.names)
    if table.schema.equals(TRAJECTORY_SCHEMA):
        return table
    columns = []
    for f in TRAJECTORY_SCHEMA:
        col = table.column(f.name)
        try:
            columns.append(col if col.type == f.type else col.cast(f.type))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise InputFileError(
                source, f"column {f.name} is {col.type}, expected {f.type}: {exc}"
            ) from None
    return pa.Table.from_arrays(columns, schema=TRAJECTORY_SCHEMA)


def _parallel(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]``; Arrow compute releases the GIL, so threads run it at once."""
    if len(items) <= 1 or _WORKERS == 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(_WORKERS) as pool:
        return list(pool.map(fn, items))


def _match(strings: pa.ChunkedArray, pattern: str) -> np.ndarray:
    """Regex match per string (RE2, in ``_WORKERS`` threads); null strings do not match."""
    pieces = _pieces(strings)
    if not pieces:
        return np.zeros(0, dtype=bool)
    parts = _parallel(lambda s: pc.fill_null(pc.match_substring_regex(s, pattern), False), pieces)
    return np.concatenate([np.asarray(p, dtype=bool) for p in parts])


def _flat(column: pa.ChunkedArray) -> tuple[pa.ChunkedArray, np.ndarray]:
    """A list column's values and, for each value, the index of its row."""
    values = pc.list_flatten(column)
    parents = np.asarray(pc.list_parent_indices(column), dtype=np.int64)
    return values, parents


def _counts(rows: np.ndarray, n: int, weights: np.ndarray | None = None) -> np.ndarray:
    out = np.bincount(rows, weights=weights, minlength=n)
    return out if weights is not None else out.astype(np.int64)


def _pieces(values: pa.ChunkedArray, parts: int = _WORKERS) -> list[pa.Array]:
    """``values`` as at least ``parts`` zero-copy pieces (so threads can share the work)."""
    chunks = [c for c in values.chunks if len(c)]
    if len(chunks) >= parts:
        return chunks
    out = []
    for chunk in chunks:
        step = max(1, -(-len(chunk) // parts))
        out.extend(chunk.slice(i, step) for i in range(0, len(chunk), step))
    return out


def _rank_within(frame: pl.DataFrame, by: str, order: list[str]) -> pl.Series:
    """0-based position of each row within its ``by`` group, ordered by ``order``; in the
    frame's row order."""
    return (
        frame.with_row_index("_pos")
        .sort(order, maintain_order=True)
        .with_columns(pl.int_range(pl.len()).over(by).alias("_rank"))
        .sort("_pos")["_rank"]
    )


def _filter_rows(table: pa.Table, mask: np.ndarray) -> pa.Table:
    """``table.filter(mask)``, batch by batch in threads (the copy is most of the cost)."""
    batches = table.to_batches(max_chunksize=1 << 16)
    bounds = np.cumsum([0, *(b.num_rows for b in batches)])

    def one(i: int) -> pa.RecordBatch:
        return batches[i].filter(pa.array(mask[bounds[i] : bounds[i + 1]]))

    return pa.Table.from_batches(_parallel(one, range(len(batches))), schema=table.schema)
