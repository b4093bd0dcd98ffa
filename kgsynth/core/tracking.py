"""Experiment tracking: ``--report-to none|tensorboard|wandb`` for training and eval.

``tensorboard`` writes event files into ``RUN/tensorboard/`` (``tensorboard --logdir RUN``);
``wandb`` logs to Weights & Biases (``pip install wandb``; offline with ``WANDB_MODE=offline``).
SFT goes through transformers' own integrations (its ``TensorBoardCallback`` and
``report_to="wandb"``); GRPO and eval log the same scalars they write to ``metrics.jsonl`` /
``metrics.json`` through :class:`Tracker`. Files stay the source of truth: a tracker only
mirrors them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError

REPORT_TO = ("none", "tensorboard", "wandb")
TB_DIR = "tensorboard"


def check_report_to(value: str) -> str:
    if value not in REPORT_TO:
        raise ConfigError(f"--report-to must be one of {', '.join(REPORT_TO)} (got {value!r})")
    if value == "tensorboard":
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--report-to tensorboard needs the tensorboard package: pip install tensorboard"
            ) from None
    if value == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--report-to wandb needs the wandb package: pip install wandb"
            ) from None
    return value


def scalars(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a metrics row (booleans as 0/1), keys prefixed."""
    out = {}
    for key, value in row.items():
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, int | float) and math.isfinite(value) and key not in ("step", "time"):
            out[prefix + key] = float(value)
    return out


class Tracker:
    """Mirrors scalars to TensorBoard or W&B (no-op for ``none``)."""

    def __init__(
        self, report_to: str, run_dir: str | Path, *, name: str, config: dict | None = None
    ):
        self.kind = check_report_to(report_to)
        self._tb = None
        self._wandb = None
        if self.kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / TB_DIR))
        elif self.kind == "wandb":
            import wandb

            self._wandb = wandb.init(name=name, dir=str(run_dir), config=config or {}, reinit=True)

    def log(self, step: int, values: dict[str, float]) -> None:
        if self._tb is not None:
            for tag, v in values.items():
                self._tb.add_scalar(tag, v, step)
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_tensorboard(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of ``RUN/tensorboard`` (the event files read back), by tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(run_dir) / TB_DIR), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
