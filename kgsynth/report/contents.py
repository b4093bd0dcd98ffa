"""What a run report holds: the run's folders in pipeline order, and one record per stage,
output, funnel, sample and training curve (filled by :mod:`kgsynth.report.collect`, drawn by
:mod:`kgsynth.report.page`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PIPELINE: tuple[tuple[str, str], ...] = (
    ("kg", "Knowledge graph"),
    ("walks", "Walks"),
    ("questions", "Questions"),
    ("trajectories", "Trajectories (stage-1 data)"),
    ("corpus", "Filter: stage-1 corpus"),
    ("stage1", "Stage 1: SFT"),
    ("stage2_data", "Stage-2 data (rejection sampling)"),
    ("corpus_stage2", "Filter: stage-2 corpus"),
    ("val", "Validation questions (early stopping of stage 2 and RL)"),
    ("stage2", "Stage 2: SFT"),
    ("rl", "RL (GRPO)"),
    ("eval", "Evaluations"),
    ("summary", "Evaluation comparison"),
)
"""The folders of a run in pipeline order, with their titles (the ``make all`` layout)."""

FOLDER_OUTPUT_FILES = ("accepted", "rejected", "predictions")
"""Data files of folder outputs (``filter``, ``eval``): one part with ``manifest.json``."""

MAX_MESSAGE_CHARS = 4000
MAX_LIST_ITEMS = 10
TRAINING = {"stage1", "stage2", "rl"}
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
class Stage:
    """One stage folder of the run (``walks``, ``eval/stage1``, …)."""

    key: str
    title: str
    folder: Path
    parts: list[Part]
    plots: list[Path]
    curves: list[Curve]
    eval_rows: list[dict[str, Any]] = field(default_factory=list)
    compare_markdown: str | None = None
    notes: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunReport:
    """Everything the page shows: found stages in pipeline order, and the missing ones."""

    run_dir: Path
    stages: list[Stage]
    missing: list[tuple[str, str]]
    samples: int
    seed: int
    comparison: list[dict[str, Any]] = field(default_factory=list)
    comparison_error: str | None = None
