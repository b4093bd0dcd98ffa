"""The resumable run: accepted walks kept in chunks beside the output, a re-run continuing after
the last complete chunk (:func:`run`, and :func:`run_walks` that also writes the file)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kgsynth.core.errors import ConfigError
from kgsynth.core.schema import WALK_SCHEMA, fill_missing
from kgsynth.core.stage import Progress, StageResult
from kgsynth.core.stage_io import absolute
from kgsynth.kg.base import KG
from kgsynth.kg.graph import KGGraph
from kgsynth.walk.config import WalkConfig, WalkError
from kgsynth.walk.records import WalkState
from kgsynth.walk.sampling import sample_walks


def _config_fingerprint(cfg: WalkConfig, kg: KG) -> str:
    data = dataclasses.asdict(cfg)
    data.pop("chunk_size")  # chunking does not change the walks
    data.pop("workers")  # nor does the number of processes
    desc = kg.describe()
    data["kg"] = {k: desc.get(k) for k in ("location", "profile", "source_sha256", "triples")}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def parts_dir(out: Path) -> Path:
    """Where a walk run into ``out`` keeps its resumable chunks (beside it: ``walks.parquet``
    gives ``walks.parquet.parts``; a relative ``out`` is taken from the current folder)."""
    out = absolute(out)
    if not out.name:  # the root folder, which the output refuses as a file target anyway
        return out / ".parts"
    return out.with_name(out.name + ".parts")


def _write_chunk(parts: Path, index: int, rows: list[dict[str, Any]], state: WalkState) -> None:
    """A chunk of rows and the state after it, each written atomically (rows first)."""
    table = pa.Table.from_pylist(rows, schema=WALK_SCHEMA)
    name = f"chunk-{index:05d}"
    tmp = parts / f".{name}.parquet.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, parts / f"{name}.parquet")
    st = {
        "next_attempt": state.next_attempt,
        "accepted": dict(state.accepted),
        "attempts": dict(state.attempts),
        "rejects": dict(state.rejects),
        "rejects_by_structure": {k: dict(v) for k, v in state.rejects_by_structure.items()},
        "exhausted": sorted(state.exhausted),
    }
    tmp = parts / f".{name}.json.tmp"
    tmp.write_text(json.dumps(st))
    os.replace(tmp, parts / f"{name}.json")


def _restore(parts: Path, fingerprint: str) -> tuple[WalkState, list[pa.Table]]:
    state = WalkState()
    tables: list[pa.Table] = []
    info = parts / "run.json"
    if not info.is_file():
        return state, tables
    complete = (parts / "chunk-00000.json").is_file() and (parts / "chunk-00000.parquet").is_file()
    if not complete:
        # a run that failed before its first chunk left nothing to resume: start afresh
        for stale in parts.glob("*"):
            if stale.is_file():
                stale.unlink()
        return state, tables
    if json.loads(info.read_text()).get("fingerprint") != fingerprint:
        raise ConfigError(
            f"{parts} holds chunks of a run with other options; remove it (or use --overwrite)"
        )
    index = 0
    while (parts / f"chunk-{index:05d}.json").is_file() and (
        parts / f"chunk-{index:05d}.parquet"
    ).is_file():
        # cast: Parquet names list items "element", the schema names them "item"
        chunk = fill_missing(pq.read_table(parts / f"chunk-{index:05d}.parquet"), WALK_SCHEMA)
        tables.append(chunk.select(WALK_SCHEMA.names).cast(WALK_SCHEMA))
        st = json.loads((parts / f"chunk-{index:05d}.json").read_text())
        index += 1
    if tables:
        state.next_attempt = st["next_attempt"]
        state.accepted = Counter(st["accepted"])
        state.attempts = Counter(st["attempts"])
        state.rejects = Counter(st["rejects"])
        for structure, counts in st.get("rejects_by_structure", {}).items():
            state.rejects_by_structure[structure] = Counter(counts)
        state.exhausted = set(st["exhausted"])
        state.keys = {k for t in tables for k in t.column("walk_id").to_pylist()}
    # anything past the last complete chunk (a half-written chunk) is dropped
    for stale in parts.glob("chunk-*"):
        if int(stale.name[6:11]) >= index:
            stale.unlink()
    return state, tables


def relation_coverage(table: pa.Table) -> dict[str, Any]:
    """How many relations the walks use, and the hops along each."""
    relation_use: dict[str, int] = {}
    for branch_list in table.column("branches").to_pylist():
        for branch in branch_list:
            for hop in branch:
                relation_use[hop["relation"]] = relation_use.get(hop["relation"], 0) + 1
    return {"used": len(relation_use), "hops_per_relation": dict(sorted(relation_use.items()))}


def run(
    inputs: None,
    cfg: WalkConfig,
    *,
    graph: KGGraph | KG,
    chunks: Path,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> StageResult[pa.Table]:
    """Sample walks on ``graph``; the stage contract of :mod:`kgsynth.core.stage`.

    ``inputs`` is None: walk reads only the graph (a :class:`KGGraph`, or a :class:`KG` to
    walk through a fresh one). ``accepted`` is the walks as one table in
    :data:`~kgsynth.core.schema.WALK_SCHEMA`; ``rejected`` stays empty, because a rejected walk is
    an attempt, not a row: ``stats["rejects"]`` counts the attempts per reason, and the rest of
    ``stats`` is the manifest's (``relation_coverage``, attempts and acceptance by structure,
    quotas, ``elapsed_s``, …).

    Why the stage writes files after all: ``chunks`` (:func:`parts_dir` of the output) is the
    folder where the accepted walks are kept in chunks of ``cfg.chunk_size`` as they come, so
    that a killed run continues after the last complete chunk with the same state and gives the
    same table. A run with other options is refused; ``overwrite`` discards the chunks and
    starts afresh. The folder stays for the caller to remove once the output is committed
    (:class:`kgsynth.core.stage_io.StagedOutput`'s ``cleanup``). ``progress`` gets ``(accepted, n,
    "accepted A rejected R")`` every 25 attempts and at the end.

    Raises :class:`WalkError` when no walk satisfied the constraints."""
    del inputs

    def tick(st: WalkState) -> None:
        accepted = sum(st.accepted.values())
        if progress and (st.next_attempt % 25 == 0 or accepted == cfg.n):
            progress(accepted, cfg.n, f"accepted {accepted} rejected {sum(st.rejects.values())}")

    table, stats = _run(graph, cfg, chunks, overwrite, tick)
    return StageResult(table, [], stats)


def _run(
    graph: KGGraph | KG,
    cfg: WalkConfig,
    chunks: Path,
    overwrite: bool,
    tick: Callable[[WalkState], None],
) -> tuple[pa.Table, dict[str, Any]]:
    """:func:`run`'s work; ``tick`` is called with the state after every attempt."""
    started = time.perf_counter()
    kg = graph.kg if isinstance(graph, KGGraph) else graph
    walker = graph if isinstance(graph, KGGraph) else None
    chunks.parent.mkdir(parents=True, exist_ok=True)
    if overwrite:
        shutil.rmtree(chunks, ignore_errors=True)
    chunks.mkdir(exist_ok=True)
    fingerprint = _config_fingerprint(cfg, kg)
    state, tables = _restore(chunks, fingerprint)
    try:
        (chunks / "run.json").write_text(json.dumps({"fingerprint": fingerprint}))
    except OSError:  # a full disk: a folder with no chunk in it is not left behind
        if not tables:
            shutil.rmtree(chunks, ignore_errors=True)
        raise
    resumed = sum(t.num_rows for t in tables)
    buffer: list[dict[str, Any]] = []
    index = len(tables)

    for row in sample_walks(kg, cfg, state=state, on_attempt=tick, graph=walker):
        buffer.append(row)
        if len(buffer) >= cfg.chunk_size:
            _write_chunk(chunks, index, buffer, state)
            tables.append(pa.Table.from_pylist(buffer, schema=WALK_SCHEMA))
            buffer, index = [], index + 1
    if buffer:
        _write_chunk(chunks, index, buffer, state)
        tables.append(pa.Table.from_pylist(buffer, schema=WALK_SCHEMA))
    # one contiguous table, so the file's bytes do not depend on where a run was interrupted
    table = (pa.concat_tables(tables) if tables else WALK_SCHEMA.empty_table()).combine_chunks()
    if table.num_rows == 0:
        raise WalkError(
            f"no walk satisfied the constraints after {state.next_attempt} attempts; rejects: "
            + ", ".join(f"{k}={v}" for k, v in state.rejects.most_common())
            + " (try a wider --max-fanout, more --max-answers, other --structures or relations)"
        )
    stats = {
        "relation_coverage": relation_coverage(table),
        "accepted": table.num_rows,
        "resumed_rows": resumed,
        "attempts": state.next_attempt,
        "accepted_by_structure": dict(sorted(state.accepted.items())),
        "attempts_by_structure": dict(sorted(state.attempts.items())),
        "rejects": dict(state.rejects.most_common()),
        "rejects_by_structure": {
            k: dict(v.most_common()) for k, v in sorted(state.rejects_by_structure.items())
        },
        "quotas": cfg.quotas(),
        "exhausted_structures": sorted(state.exhausted),
        "relations_available": state.relations_available,
        "elapsed_s": round(time.perf_counter() - started, 3),
    }
    return table, stats


def run_walks(
    kg: KG,
    cfg: WalkConfig,
    out: str | Path,
    *,
    overwrite: bool = False,
    progress: Callable[[WalkState, int], None] | None = None,
) -> dict[str, Any]:
    """:func:`run`, then the table written to ``out`` (Parquet, atomically) and the chunks
    removed; returns the stats with the ``table``. ``progress`` gets the state and the walks
    accepted so far after every attempt. For library callers and tests; the CLI writes through
    :class:`kgsynth.core.stage_io.StagedOutput` instead."""
    out = Path(out)

    def tick(st: WalkState) -> None:
        if progress:
            progress(st, sum(st.accepted.values()))

    table, stats = _run(kg, cfg, parts_dir(out), overwrite, tick)
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, out)
    shutil.rmtree(parts_dir(out), ignore_errors=True)
    return {**stats, "table": table}
