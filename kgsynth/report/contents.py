"""What a run report holds: the stage kinds a manifest can name, and one record per stage,
output, funnel, sample and training curve (found by :mod:`kgsynth.report.discover`, filled by
:mod:`kgsynth.report.collect`, drawn by :mod:`kgsynth.report.page`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS: dict[str, tuple[int, str]] = {
    "kg import": (0, "Knowledge graph"),
    "walk": (1, "Walks"),
    "synthesize questions": (2, "Questions"),
    "synthesize trajectories": (3, "Trajectories"),
    "filter": (4, "Filter: corpus"),
    "train stage1": (5, "Stage 1: SFT"),
    "train stage2": (6, "Stage 2: SFT"),
    "train rl": (7, "RL (GRPO)"),
    "train merge": (8, "LoRA merge"),
    "training": (8, "Training"),
    "eval": (9, "Evaluation"),
    "eval compare": (10, "Evaluation comparison"),
}
"""Each stage kind a manifest names (its ``stage`` field), with its place in the pipeline (the
tie-break of stages written in the same second) and its title on the page. ``training`` is a
training folder whose stage cannot be told (a ``metrics.jsonl`` alone)."""

EXPECTED_KINDS = (
    "kg import", "walk", "synthesize questions", "synthesize trajectories", "filter",
    "train stage1", "train stage2", "train rl", "eval", "eval compare",
)  # fmt: skip
"""The kinds a whole ``make all`` run holds; a run without one lists it as skipped."""

DATA_KINDS = ("walk", "synthesize questions", "synthesize trajectories", "filter")
TRAINING_KINDS = ("train stage1", "train stage2", "train rl", "training")

FOLDER_OUTPUT_FILES = ("accepted", "rejected", "predictions")
"""Data files of folder outputs (``filter``, ``eval``): one part with ``manifest.json``."""

MAX_MESSAGE_CHARS = 4000
MAX_LIST_ITEMS = 10
SKIP_SUMMARY_KEYS = {"versions", "kg", "config", "command"}


@dataclass
class Funnel:
    """A stage's counts: ``attempted`` (named ``attempted_label`` in the manifest) →
    ``accepted``, and the rejects by reason."""

    attempted_label: str
    attempted: int
    accepted: int
    rejects: dict[str, int]

    @property
    def unattributed(self) -> int:
        """Attempts neither accepted nor counted under a reason (0 in a consistent manifest)."""
        return self.attempted - self.accepted - sum(self.rejects.values())


@dataclass
class Sample:
    """Rows picked (seeded) from one Parquet file: ``kind`` is walks, questions, trajectories
    or predictions; ``total`` the file's row count."""

    path: Path
    kind: str
    rejected: bool
    total: int
    rows: list[dict[str, Any]]
    error: str | None = None


@dataclass
class Part:
    """One output of a stage: its manifest (``manifest.json`` or ``NAME.manifest.json``),
    funnel and samples of its data files."""

    name: str
    manifest_path: Path | None
    manifest: dict[str, Any] | None
    funnel: Funnel | None
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None


@dataclass
class Curve:
    """One training series from ``metrics.jsonl``: (step, value) points."""

    name: str
    points: list[tuple[float, float]]


@dataclass
class Found:
    """One output found in a run folder: its kind (what its manifest's ``stage`` says), where
    it lies (``path``: the folder of a folder output, the Parquet file of a file output), its
    manifest (None where the stage wrote none: a KG store, an unfinished training run) and when
    it was written (the manifest's ``written``, else the newest file's time)."""

    kind: str
    path: Path
    folder: bool
    manifest_path: Path | None
    written: str
    manifest: dict[str, Any] | None = None
    note: str | None = None


@dataclass
class Stage:
    """One output of the run (``walks/walks.parquet``, ``corpus``, ``eval/stage1``, …): ``key``
    is its path in the run folder, ``kind`` what its manifest says it is."""

    key: str
    title: str
    folder: Path
    parts: list[Part]
    plots: list[Path]
    curves: list[Curve]
    kind: str = ""
    written: str = ""
    series: list[Curve] = field(default_factory=list)
    eval_rows: list[dict[str, Any]] = field(default_factory=list)
    type_rows: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    compare_markdown: str | None = None
    notes: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def manifest(self) -> dict[str, Any]:
        """The output's own manifest (its first part's), empty without one."""
        return next((p.manifest for p in self.parts if p.manifest), {})


@dataclass
class RunReport:
    """Everything the page shows: the stages found, in the order they ran, and the kinds of
    stage a whole run has that this one lacks (``(kind, title)``)."""

    run_dir: Path
    stages: list[Stage]
    missing: list[tuple[str, str]]
    samples: int
    seed: int
    comparison: list[dict[str, Any]] = field(default_factory=list)
    comparison_error: str | None = None

    def of_kind(self, *kinds: str) -> list[Stage]:
        return [s for s in self.stages if s.kind in kinds]
