"""Finding a run's outputs by what their manifests say, in any layout.

Every stage writes a manifest with its output (``manifest.json`` inside a folder output,
``NAME.manifest.json`` beside a file output ``NAME.parquet``) whose ``stage`` field names the
stage (``walk``, ``synthesize questions``, ``filter``, ``train stage1``, ``eval``, …). The run
folder is walked to :data:`MAX_DEPTH` levels, and each output found is identified by that field,
so the ``make all`` layout (``walks/walks.parquet``, ``corpus/``, ``eval/stage1/``), a recipe's
own step names and a hand-made layout (``runs/x/walks.parquet``, ``runs/x/s1/``) read alike.
Three outputs carry no manifest and are told by their files: a KG store (``kg.json``), a
training run not finished yet (``train_config.json``, ``rl_spec.json`` or ``metrics.jsonl``) and
an evaluation's ``metrics.json`` alone. A folder output is not searched further (its
checkpoints and stores hold no stage); hidden folders (staging areas) and logs are skipped.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

from kgsynth.report.contents import KINDS, Found

log = logging.getLogger(__name__)

MAX_DEPTH = 6
"""How deep below the run folder outputs are looked for (``runs/x/eval/stage1`` is 2)."""

MAX_FOLDERS = 20_000
"""Folders looked at, at most: a run folder is not a file system."""

SKIP_FOLDERS = frozenset(
    {"checkpoints", "oxigraph", "fanouts", "logs", "tensorboard", "wandb", "init-tiny",
     "__pycache__", "node_modules"}
)  # fmt: skip
"""Folders that hold no stage output."""

UNFINISHED = "no manifest: training has not finished (or did not run)"


def read_json(path: Path) -> tuple[Any, str | None]:
    """``path``'s JSON, or None and a line saying why not."""
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except (OSError, ValueError) as exc:
        return None, f"{path.name}: not readable JSON ({exc})"


def _file_time(*paths: Path) -> str:
    """The newest modification time of ``paths`` as a manifest writes its time (UTC)."""
    stamps = []
    for p in paths:
        try:
            stamps.append(p.stat().st_mtime)
        except OSError:
            continue
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(max(stamps, default=0.0)))


def manifest_kind(manifest: Any) -> str:
    """The stage a manifest says wrote it (its ``stage`` field); for a manifest written before
    that field, what its counts show; ``unknown`` otherwise."""
    if not isinstance(manifest, dict):
        return "unknown"
    stage = manifest.get("stage")
    if isinstance(stage, str) and stage.strip():
        return " ".join(stage.split())
    for key, kind in (("rows_in", "filter"), ("attempts", "walk"),
                      ("trajectories", "synthesize trajectories"), ("walks", "synthesize questions")):  # fmt: skip
        if key in manifest:
            return kind
    return "unknown"


def _from_manifest(path: Path, output: Path, folder: bool) -> Found:
    data, error = read_json(path)
    written = data.get("written") if isinstance(data, dict) else None
    if not isinstance(written, str):
        written = _file_time(path)
    manifest = data if isinstance(data, dict) else None
    return Found(manifest_kind(data), output, folder, path, written, manifest, error)


def _training_kind(folder: Path) -> str | None:
    """The stage of a training folder without its manifest (written last, so not finished)."""
    spec, _ = read_json(folder / "train_config.json")
    if isinstance(spec, dict) and spec.get("stage") in ("stage1", "stage2"):
        return f"train {spec['stage']}"
    if (folder / "rl_spec.json").is_file():
        return "train rl"
    if (folder / "train_config.json").is_file() or (folder / "metrics.jsonl").is_file():
        return "training"
    return None


def _without_manifest(folder: Path) -> Found | None:
    """A KG store, an unfinished training run or a lone ``metrics.json`` of ``kgsynth eval``."""
    meta_path = folder / "kg.json"
    if meta_path.is_file() and ((folder / "oxigraph").is_dir() or (folder / "store").is_dir()):
        meta, _ = read_json(meta_path)
        created = meta.get("created") if isinstance(meta, dict) else None
        written = created if isinstance(created, str) else _file_time(meta_path)
        return Found("kg import", folder, True, None, written)
    kind = _training_kind(folder)
    if kind is not None:
        files = [p for p in folder.iterdir() if p.is_file()]
        return Found(kind, folder, True, None, _file_time(*files), None, UNFINISHED)
    metrics, _ = read_json(folder / "metrics.json") if (folder / "metrics.json").is_file() else (None, None)  # fmt: skip
    if isinstance(metrics, dict) and "overall" in metrics:
        note = "no manifest: metrics.json alone"
        return Found("eval", folder, True, None, _file_time(folder / "metrics.json"), None, note)
    return None


def _outputs_in(folder: Path) -> tuple[list[Found], bool]:
    """The outputs ``folder`` holds, and whether it is an output itself (not searched on)."""
    if (folder / "manifest.json").is_file():
        return [_from_manifest(folder / "manifest.json", folder, True)], True
    alone = _without_manifest(folder)
    if alone is not None:
        return [alone], True
    found = []
    for path in sorted(folder.glob("*.manifest.json")):
        stem = path.name.removesuffix(".manifest.json")
        found.append(_from_manifest(path, folder / f"{stem}.parquet", False))
    return found, False


def _subfolders(folder: Path) -> list[Path]:
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        log.warning("report: %s: not readable (%s)", folder, exc)
        return []
    return [
        d
        for d in entries
        if d.is_dir() and not d.is_symlink() and not d.name.startswith(".")
        and d.name not in SKIP_FOLDERS
    ]  # fmt: skip


def discover(run_dir: Path, max_depth: int = MAX_DEPTH) -> list[Found]:
    """Every output under ``run_dir`` (itself included, ``max_depth`` levels down), in the
    order the stages ran: by the time written, then by the pipeline's order, then by path."""
    found: list[Found] = []
    queue: deque[tuple[Path, int]] = deque([(run_dir, 0)])
    seen = 0
    while queue and seen < MAX_FOLDERS:
        folder, depth = queue.popleft()
        seen += 1
        outputs, is_output = _outputs_in(folder)
        found += outputs
        if not is_output and depth < max_depth:
            queue.extend((d, depth + 1) for d in _subfolders(folder))
    if queue:
        log.warning("report: stopped after %d folders under %s", MAX_FOLDERS, run_dir)
    return sorted(found, key=_order)


def _order(f: Found) -> tuple[str, int, str]:
    return (f.written, KINDS.get(f.kind, (99, ""))[0], str(f.path))


def external_kg(found: list[Found]) -> Found | None:
    """The KG store the run's manifests name (``kg.location``) when the run folder holds none
    (a hand-made run over ``runs/kg``); None when none is named or it is gone."""
    if any(f.kind == "kg import" for f in found):
        return None
    for f in found:
        kg = (f.manifest or {}).get("kg")
        location = kg.get("location") if isinstance(kg, dict) else None
        if isinstance(location, str) and location:
            store = _without_manifest(Path(location)) if Path(location).is_dir() else None
            if store is not None and store.kind == "kg import":
                store.note = "outside the run folder, named by the stages' manifests"
                return store
    return None
