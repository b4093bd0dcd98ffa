"""Collecting a run: each output's manifest, funnel, plots, training curves, seeded samples of
its data files and evaluation rows, into a :class:`~kgsynth.report.contents.RunReport`. The
outputs are found by their manifests (:mod:`kgsynth.report.discover`), in any layout. Pure
apart from reading."""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError, KGSynthError
from kgsynth.report.contents import (
    EXPECTED_KINDS,
    FOLDER_OUTPUT_FILES,
    KINDS,
    TRAINING_KINDS,
    Curve,
    Found,
    Funnel,
    Part,
    RunReport,
    Sample,
    Stage,
)
from kgsynth.report.discover import discover, external_kg, read_json
from kgsynth.report.headline import type_rows
from kgsynth.report.markdown import md_images

log = logging.getLogger(__name__)


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a kgsynth run: at least one output a stage wrote (a manifest, a
    KG store, a training run under way), at any depth the report looks."""
    return path.is_dir() and bool(discover(path))


def _first_int(*values: Any) -> int | None:
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def funnel_of(manifest: dict[str, Any]) -> Funnel | None:
    """The funnel a stage manifest records: ``walk`` (attempts), ``synthesize questions``
    (walks in), ``synthesize trajectories`` (trajectories + rejected) and ``filter`` (rows in)
    all store ``accepted``/``rejects``; None for a manifest without rejects (training, eval)."""
    rejects = manifest.get("rejects")
    if not isinstance(rejects, dict):
        return None
    rejects = {str(k): int(v) for k, v in rejects.items() if isinstance(v, int)}
    output = manifest.get("output") if isinstance(manifest.get("output"), dict) else {}
    accepted = _first_int(
        manifest.get("accepted"), manifest.get("trajectories"), output.get("rows")
    )
    if accepted is None:
        return None
    for key, label in (("attempts", "attempts"), ("rows_in", "rows in"), ("walks", "walks in")):
        attempted = _first_int(manifest.get(key))
        if attempted is not None:
            return Funnel(label, attempted, accepted, rejects)
    return Funnel("attempted", accepted + sum(rejects.values()), accepted, rejects)


def _kind(columns: Sequence[str]) -> str | None:
    cols = set(columns)
    if "messages" in cols:
        return "predictions" if "predicted" in cols else "trajectories"
    if "question" in cols:
        return "questions"
    if "branches" in cols:
        return "walks"
    return None


def _round_robin(groups: dict[str, list[int]], n: int, rng: random.Random) -> list[int]:
    """Up to ``n`` indices taking one from each group in turn (so every reason appears)."""
    queues = []
    for key in sorted(groups):
        idx = list(groups[key])
        rng.shuffle(idx)
        queues.append(idx)
    picked: list[int] = []
    while len(picked) < n and any(queues):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop())
    return sorted(picked)


def pick_rows(path: Path, n: int, seed: int) -> Sample:
    """``n`` rows of a Parquet file, picked with ``random.Random(seed)``; rejected rows are
    picked reason by reason in turn, so rare reasons are shown too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rejected = path.name == "rejected.parquet" or path.name.endswith(".rejected.parquet")
    try:
        schema = pq.read_schema(path)
        kind = _kind(schema.names)
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        return Sample(path, "unknown", rejected, 0, [], f"not a readable Parquet file: {exc}")
    if kind is None:
        return Sample(path, "unknown", rejected, table.num_rows, [], "unknown columns")
    rng = random.Random(seed)
    total = table.num_rows
    if rejected and "reject_reason" in table.column_names:
        groups: dict[str, list[int]] = {}
        for i, reason in enumerate(table.column("reject_reason").to_pylist()):
            groups.setdefault(str(reason), []).append(i)
        idx = _round_robin(groups, n, rng)
    else:
        idx = sorted(rng.sample(range(total), min(n, total)))
    return Sample(path, kind, rejected, total, table.take(idx).to_pylist() if idx else [])


def read_curves(path: Path) -> list[Curve]:
    """The ``loss`` and ``reward`` series of a ``metrics.jsonl`` (unreadable lines skipped)."""
    series: dict[str, list[tuple[float, float]]] = {"loss": [], "reward": []}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        step = row.get("step", i)
        for name, points in series.items():
            value = row.get(name)
            if (
                isinstance(value, int | float)
                and isinstance(step, int | float)
                and math.isfinite(value)
            ):
                points.append((float(step), float(value)))
    return [Curve(name, points) for name, points in series.items() if points]


def _key(found: Found, run_dir: Path) -> str:
    """Where the output lies in the run folder (``walks/walks.parquet``, ``eval/stage1``)."""
    try:
        rel = found.path.relative_to(run_dir)
    except ValueError:
        return str(found.path)
    return str(rel) if str(rel) != "." else run_dir.name


def _title(found: Found) -> str:
    title = KINDS.get(found.kind, (0, found.kind))[1]
    m = found.manifest or {}
    if found.kind == "synthesize trajectories" and isinstance(m.get("mode"), str):
        title += f" ({m['mode']})"
    if found.kind == "eval":
        label = m.get("label")
        if not isinstance(label, str) or not label:
            metrics, _ = read_json(found.path / "metrics.json")
            label = metrics.get("label") if isinstance(metrics, dict) else None
        title += f": {label or found.path.name}"
    if found.kind in TRAINING_KINDS and found.manifest_path is None:
        title += " (not finished)"
    return title


def _part(found: Found, samples: int, seed: int) -> Part:
    """The output's manifest, funnel and samples of its data files."""
    if found.folder:
        name = ""
        files = [found.path / f"{n}.parquet" for n in FOLDER_OUTPUT_FILES]
    else:
        name = found.path.name
        files = [found.path, found.path.with_name(f"{found.path.stem}.rejected.parquet")]
    manifest = found.manifest
    part = Part(name, found.manifest_path, manifest, funnel_of(manifest) if manifest else None)
    if found.manifest_path is not None and manifest is None:
        part.error = found.note or f"{found.manifest_path.name}: not a JSON object"
    for path in files if samples > 0 else []:
        if path.is_file():
            n = samples // 2 if path.name == "predictions.parquet" else samples
            part.samples.append(pick_rows(path, max(n, 1), seed))
    return part


def _kg_info(stage: Stage, run_dir: Path) -> None:
    """The store's ``kg.json`` and the ``kg_stats.json`` beside it or in the run folder."""
    for path in (stage.folder / "kg.json", stage.folder.parent / "kg_stats.json",
                 run_dir / "kg_stats.json"):  # fmt: skip
        data, _ = read_json(path)
        if isinstance(data, dict):
            stage.info.update({k: v for k, v in data.items() if k != "kg" and k not in stage.info})


def _eval_info(stage: Stage) -> None:
    from kgsynth.eval.compare import compare_runs

    try:
        stage.eval_rows = compare_runs([stage.folder])
    except (KGSynthError, KeyError, TypeError, ValueError) as exc:
        stage.notes.append(f"metrics.json could not be read: {exc}")
        return
    stage.type_rows = type_rows(stage.folder)


def _collect_stage(found: Found, run_dir: Path, samples: int, seed: int) -> Stage:
    folder = found.path if found.folder else found.path.parent
    if found.folder:
        plots = sorted(p for p in folder.glob("*.png") if p.is_file())
    else:
        stats = found.path.with_name(f"{found.path.stem}_stats.png")
        plots = [stats] if stats.is_file() else []
    stage = Stage(_key(found, run_dir), _title(found), folder, [], plots, [], kind=found.kind,
                  written=found.written)  # fmt: skip
    if found.note and found.manifest_path is None:
        stage.notes.append(found.note)
    if found.kind != "kg import":
        stage.parts.append(_part(found, samples, seed))
    if found.folder and (folder / "metrics.jsonl").is_file():
        stage.series = read_curves(folder / "metrics.jsonl")
        if not plots:  # the stage's own PNG draws them, else an SVG does
            stage.curves = stage.series
    if found.kind == "kg import":
        _kg_info(stage, run_dir)
    if found.kind == "eval compare" and (folder / "compare.md").is_file():
        stage.compare_markdown = (folder / "compare.md").read_text(encoding="utf-8")
        # compare.png is shown where compare.md places it, not again below
        stage.plots = [p for p in stage.plots if p.name not in md_images(stage.compare_markdown)]
    if found.kind == "eval" and (folder / "metrics.json").is_file():
        _eval_info(stage)
    return stage


def collect_run(run_dir: str | Path, *, samples: int = 24, seed: int = 0) -> RunReport:
    """Gather every output under ``run_dir``, found by its manifest in any layout, in the
    order the stages ran, with ``samples`` rows per data file picked by ``Random(seed)``
    (``samples=0``: none). Raises :class:`ConfigError` (naming the path) when ``run_dir`` is
    not a run folder."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise ConfigError(f"RUN_DIR: {run_dir} does not exist")
    if samples < 0:
        raise ConfigError(f"--samples must be >= 1 (got {samples})")
    found = discover(run_dir) if run_dir.is_dir() else []
    if not found:
        raise ConfigError(
            f"RUN_DIR: {run_dir} is not a kgsynth run folder (no stage manifest, KG store or "
            "training run in it or its subfolders)"
        )
    outside = external_kg(found)
    if outside is not None:
        found.insert(0, outside)
    stages = [_collect_stage(f, run_dir, samples, seed) for f in found]
    kinds = {s.kind for s in stages}
    missing = [(k, KINDS[k][1]) for k in EXPECTED_KINDS if k not in kinds]
    report = RunReport(run_dir, stages, missing, samples, seed)
    evals = [s.folder for s in stages if s.kind == "eval" and s.eval_rows]
    if evals and not any(s.compare_markdown for s in stages):
        from kgsynth.eval.compare import compare_runs

        try:
            report.comparison = compare_runs(evals)
        except (KGSynthError, KeyError, TypeError, ValueError) as exc:
            report.comparison_error = str(exc)
    log.info("report of %s: %d outputs, %d kinds missing", run_dir, len(stages), len(missing))
    return report
