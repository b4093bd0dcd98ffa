"""The filter stage end to end: the ``--in`` files read as one table (:func:`read_inputs`), the
stage (:func:`run`: the contamination guard built from ``cfg.benchmark``, then
:func:`~kgsynth.filter.filters.run_filters`), and the corpus folder written into a
:class:`~kgsynth.core.stage_io.StagedOutput` (:func:`write_corpus`)::

    table, inputs = read_inputs(paths)
    result = run(table, cfg, source=inputs.source)
    manifest = write_corpus(staged, inputs, result, cfg)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kgsynth.core.errors import InputFileError
from kgsynth.core.manifest import sha256_file
from kgsynth.core.schema import TRAJECTORY_SCHEMA
from kgsynth.core.stage import Progress, StageResult
from kgsynth.core.stage_io import StagedOutput, recover_input
from kgsynth.filter.card import CARD_NAME, write_card
from kgsynth.filter.columns import missing_columns
from kgsynth.filter.config import FilterConfig, MaxSimilarity
from kgsynth.filter.figure import filter_stats_png
from kgsynth.filter.filters import run_filters

CORPUS_FILES = frozenset(
    {"accepted.parquet", "rejected.parquet", "filter_stats.png", "manifest.json", "README.md"}
)
"""What a corpus folder holds."""


def _say(progress: Progress | None, info: str) -> None:
    if progress is not None:
        progress(0, 0, info)


@dataclass
class CorpusInputs:
    """The ``--in`` files a table was read from: their row counts, the seconds the read took,
    and their SHA-256 digests (computed in the background while the stage runs)."""

    paths: list[Path]
    rows: list[int]
    seconds: float
    started: float
    hashes: list[Future[str]]

    @property
    def source(self) -> str:
        """The files, as errors about the rows name them."""
        return ", ".join(str(p) for p in self.paths)

    def manifest_entry(self, rows_in: int) -> dict[str, Any]:
        """The manifest's ``input``: path(s), digest(s), rows (and one entry per file when
        there are several)."""
        shas = [h.result() for h in self.hashes]
        entry: dict[str, Any] = {
            "path": self.source,
            "sha256": shas[0] if len(shas) == 1 else shas,
            "rows": rows_in,
        }
        if len(self.paths) > 1:
            entry["files"] = [
                {"path": str(p), "sha256": h, "rows": n}
                for p, h, n in zip(self.paths, shas, self.rows, strict=True)
            ]
        return entry


def read_inputs(
    paths: Sequence[str | Path], progress: Progress | None = None
) -> tuple[pa.Table, CorpusInputs]:
    """The trajectory files as one table (their :data:`TRAJECTORY_SCHEMA` columns, in file
    order). Every file is checked (exists, is Parquet, has every column) before any is read;
    errors name the file and the missing columns."""
    started = time.perf_counter()
    paths = [Path(p) for p in paths]
    for in_path in paths:
        recover_input(in_path)
        if not in_path.is_file():
            raise InputFileError(
                in_path, "no such file (run `kgsynth synthesize trajectories` first)"
            )
        try:
            names = pq.read_schema(in_path).names
        except (pa.ArrowException, OSError) as exc:
            raise InputFileError(in_path, f"not a readable Parquet file: {exc}") from None
        missing = missing_columns(names)
        if missing:
            raise InputFileError(
                in_path, f"missing column(s) {', '.join(missing)}; found {', '.join(names)}"
            )
    pool = ThreadPoolExecutor(2)
    hashes = [pool.submit(sha256_file, p) for p in paths]  # hashlib frees the GIL
    pool.shutdown(wait=False)  # the digests are awaited when the manifest is written
    clock = time.perf_counter()
    tables = []
    for in_path in paths:
        _say(progress, f"reading {in_path}")
        try:
            tables.append(pq.read_table(in_path, columns=TRAJECTORY_SCHEMA.names))
        except (pa.ArrowException, OSError) as exc:
            raise InputFileError(in_path, f"cannot read the rows: {exc}") from None
    rows = [t.num_rows for t in tables]
    try:
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    except pa.ArrowException as exc:
        raise InputFileError(paths[1], f"does not fit {paths[0]}'s schema: {exc}") from None
    return table, CorpusInputs(paths, rows, time.perf_counter() - clock, started, hashes)


def run(
    inputs: Any,
    cfg: FilterConfig,
    *,
    graph: None = None,
    llm: None = None,
    progress: Progress | None = None,
    max_similarity: MaxSimilarity | None = None,
    source: str = "input rows",
) -> StageResult[pa.Table]:
    """Filter trajectories; the stage contract of :mod:`kgsynth.core.stage`.

    ``inputs``: an Arrow table, a polars DataFrame or row dicts with every trajectory column.
    ``accepted`` is in :data:`~kgsynth.core.schema.ACCEPTED_SCHEMA`; ``rejected`` is a table in
    :data:`~kgsynth.core.schema.REJECTED_SCHEMA` with each row's ``reject_reason``. ``stats``:
    ``benchmarks`` (files, questions), ``seconds_by_phase`` (``benchmark_embeddings``,
    ``filter``), then the counts per reason and the rest of :func:`run_filters`' stats.

    With ``cfg.benchmark`` (and no ``max_similarity`` given) the benchmark questions are read
    and embedded (:class:`~kgsynth.datasets.contamination.ContaminationGuard`) for the contamination
    filter. ``progress`` gets ``(0, 0, what is being done)``. The filter reads neither a graph
    nor an LLM."""
    del graph, llm
    phases: dict[str, float] = {}
    benchmarks = {"files": list(cfg.benchmark), "questions": 0}
    if max_similarity is None and cfg.benchmark:
        from kgsynth.datasets.contamination import benchmark_guard

        clock = time.perf_counter()
        max_similarity, benchmarks["questions"] = benchmark_guard(
            cfg.benchmark, lambda info: _say(progress, info)
        )
        phases["benchmark_embeddings"] = time.perf_counter() - clock
    n = len(inputs)
    _say(progress, f"filtering {n:,} trajectories")
    accepted, rejected, stats = run_filters(
        inputs,
        cfg,
        max_similarity=max_similarity,
        progress=lambda step: _say(progress, f"filtering {n:,} trajectories: {step}"),
        source=source,
    )
    phases["filter"] = stats.pop("elapsed_s")
    return StageResult(
        accepted, rejected, {"benchmarks": benchmarks, "seconds_by_phase": phases, **stats}
    )


def write_corpus(
    staged: StagedOutput,
    inputs: CorpusInputs,
    result: StageResult[pa.Table],
    cfg: FilterConfig,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``accepted.parquet``, ``rejected.parquet``, ``filter_stats.png``, ``manifest.json`` and
    the dataset card ``README.md`` (:mod:`kgsynth.filter.card`) into the staged folder output;
    returns the manifest."""
    out_dir = staged.out
    tables = {"accepted.parquet": result.accepted, "rejected.parquet": result.rejected}
    _say(progress, f"writing {out_dir}")

    def write(name: str) -> None:
        # row groups of 64k rows, so readers of the corpus decode them in parallel
        pq.write_table(tables[name], staged.path(name), row_group_size=1 << 16)

    stats = dict(result.stats)
    phases = {"read": inputs.seconds, **stats.pop("seconds_by_phase")}
    clock = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(write, tables))
    phases["write"] = time.perf_counter() - clock
    clock = time.perf_counter()
    png = out_dir / "filter_stats.png"
    filter_stats_png(stats, staged.path(png.name))
    phases["png"] = time.perf_counter() - clock
    manifest = staged.write_manifest(
        "filter",
        cfg,
        input=inputs.manifest_entry(stats["rows_in"]),
        output={
            "accepted_path": str(out_dir / "accepted.parquet"),
            "accepted_rows": result.accepted.num_rows,
            "rejected_path": str(out_dir / "rejected.parquet"),
            "rejected_rows": result.rejected.num_rows,
            "stats_png": str(png),
        },
        benchmarks=stats.pop("benchmarks"),
        elapsed_s=round(time.perf_counter() - inputs.started, 3),
        seconds_by_phase={k: round(v, 3) for k, v in phases.items()},
        **stats,
    )
    files = {name: staged.path(name) for name in tables}
    write_card(staged.path(CARD_NAME), files, manifest, inputs.paths)
    return manifest
