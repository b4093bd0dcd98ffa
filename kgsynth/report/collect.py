"""Collecting a run: each stage folder's manifests, funnels, plots, training curves, seeded
samples of its data files and evaluation rows, into a :class:`~kgsynth.report.contents.RunReport`.
Pure apart from reading."""

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
    FOLDER_OUTPUT_FILES,
    PIPELINE,
    TRAINING,
    Curve,
    Funnel,
    Part,
    RunReport,
    Sample,
    Stage,
)
from kgsynth.report.markdown import md_images

log = logging.getLogger(__name__)


def _read_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except (OSError, ValueError) as exc:
        return None, f"{path.name}: not readable JSON ({exc})"


def _has_manifest(folder: Path) -> bool:
    return (folder / "manifest.json").is_file() or any(folder.glob("*.manifest.json"))


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a kgsynth run: one of the pipeline's folders with a manifest
    (or the KG's ``kg/kg.json``)."""
    if not path.is_dir():
        return False
    if (path / "kg" / "kg.json").is_file():
        return True
    for key, _ in PIPELINE:
        folder = path / key
        if folder.is_dir() and (
            _has_manifest(folder) or any(_has_manifest(d) for d in folder.iterdir() if d.is_dir())
        ):
            return True
    return False


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


def _data_parts(folder: Path) -> list[tuple[str, Path | None, list[Path]]]:
    """(name, manifest, data files) for each output in ``folder``: ``manifest.json`` with
    ``accepted``/``rejected``/``predictions.parquet``, and ``NAME.manifest.json`` with
    ``NAME.parquet`` and ``NAME.rejected.parquet``."""
    parts: dict[str, tuple[Path | None, list[Path]]] = {}
    top = folder / "manifest.json"
    top_files = [folder / f"{n}.parquet" for n in FOLDER_OUTPUT_FILES]
    if top.is_file() or any(p.is_file() for p in top_files):
        parts[""] = (top if top.is_file() else None, [p for p in top_files if p.is_file()])
    stems = {p.name.removesuffix(".manifest.json") for p in folder.glob("*.manifest.json")}
    stems |= {
        p.stem
        for p in folder.glob("*.parquet")
        if not p.name.endswith(".rejected.parquet") and p.stem not in FOLDER_OUTPUT_FILES
    }
    for stem in sorted(stems):
        manifest = folder / f"{stem}.manifest.json"
        files = [folder / f"{stem}.parquet", folder / f"{stem}.rejected.parquet"]
        parts[stem] = (manifest if manifest.is_file() else None, [p for p in files if p.is_file()])
    return [(name, m, files) for name, (m, files) in parts.items()]


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


def _collect_stage(key: str, title: str, folder: Path, samples: int, seed: int) -> Stage:
    plots = sorted(p for p in folder.glob("*.png") if p.is_file())
    curves: list[Curve] = []
    if (folder / "metrics.jsonl").is_file() and not plots:
        curves = read_curves(folder / "metrics.jsonl")
    stage = Stage(key, title, folder, [], plots, curves)
    for name, manifest_path, files in _data_parts(folder):
        manifest, error = (None, None)
        if manifest_path is not None:
            manifest, error = _read_json(manifest_path)
            if manifest is not None and not isinstance(manifest, dict):
                manifest, error = None, f"{manifest_path.name}: not a JSON object"
        part = Part(name, manifest_path, manifest, funnel_of(manifest) if manifest else None)
        part.error = error
        for path in files:
            n = samples // 2 if path.name == "predictions.parquet" else samples
            part.samples.append(pick_rows(path, max(n, 1), seed))
        stage.parts.append(part)
    if key == "kg":
        for name in ("kg.json", "../kg_stats.json"):
            data, _ = _read_json(folder / name)
            if isinstance(data, dict):
                stage.info.update({k: v for k, v in data.items() if k != "kg"})
    if key == "summary" and (folder / "compare.md").is_file():
        stage.compare_markdown = (folder / "compare.md").read_text(encoding="utf-8")
        # compare.png is shown where compare.md places it, not again below
        stage.plots = [p for p in stage.plots if p.name not in md_images(stage.compare_markdown)]
    if (folder / "metrics.json").is_file() and key.startswith("eval/"):
        from kgsynth.eval.compare import compare_runs

        try:
            stage.eval_rows = compare_runs([folder])
        except (KGSynthError, KeyError, TypeError, ValueError) as exc:
            stage.notes.append(f"metrics.json could not be read: {exc}")
    if key != "kg" and not any(p.manifest_path for p in stage.parts):
        what = "training" if key in TRAINING else "the stage"
        stage.notes.append(f"no manifest: {what} has not finished (or did not run)")
    return stage


def collect_run(run_dir: str | Path, *, samples: int = 24, seed: int = 0) -> RunReport:
    """Gather the stages of the run in ``run_dir`` (pipeline order, then any other folder
    holding a manifest), with ``samples`` rows per data file picked by ``Random(seed)``.
    Raises :class:`ConfigError` (naming the path) when ``run_dir`` is not a run folder."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise ConfigError(f"RUN_DIR: {run_dir} does not exist")
    if not is_run_dir(run_dir):
        raise ConfigError(
            f"RUN_DIR: {run_dir} is not a kgsynth run folder (none of "
            f"{', '.join(k + '/' for k, _ in PIPELINE)} holds a manifest)"
        )
    if samples < 1:
        raise ConfigError(f"--samples must be >= 1 (got {samples})")
    stages: list[Stage] = []
    missing: list[tuple[str, str]] = []
    known = {k for k, _ in PIPELINE}
    for key, title in PIPELINE:
        folder = run_dir / key
        if not folder.is_dir():
            missing.append((key, title))
            continue
        if key == "eval":
            labels = sorted(
                d for d in folder.iterdir() if d.is_dir() and not d.name.startswith(".")
            )
            if not labels:
                missing.append((key, title))
            for d in labels:
                stages.append(
                    _collect_stage(f"eval/{d.name}", f"Evaluation: {d.name}", d, samples, seed)
                )
            continue
        stages.append(_collect_stage(key, title, folder, samples, seed))
    for folder in sorted(run_dir.iterdir()):
        if folder.is_dir() and folder.name not in known and _has_manifest(folder):
            stages.append(_collect_stage(folder.name, folder.name, folder, samples, seed))
    report = RunReport(run_dir, stages, missing, samples, seed)
    evals = [s.folder for s in stages if s.key.startswith("eval/") and s.eval_rows]
    summary = next((s for s in stages if s.key == "summary"), None)
    if evals and (summary is None or summary.compare_markdown is None):
        from kgsynth.eval.compare import compare_runs

        try:
            report.comparison = compare_runs(evals)
        except (KGSynthError, KeyError, TypeError, ValueError) as exc:
            report.comparison_error = str(exc)
    log.info("report of %s: %d stages, %d missing", run_dir, len(stages), len(missing))
    return report
