"""The curves a training run draws into its folder: SFT's ``loss.png`` and RL's ``rl.png``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def loss_curve_png(metrics: Sequence[dict[str, Any]], path: str | Path, title: str) -> None:
    """Training loss (and learning rate) against the optimizer step."""
    plt = _pyplot()
    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, [m["loss"] for m in metrics], color="#4477aa", marker=".", label="loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (mean over assistant tokens)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if metrics and "learning_rate" in metrics[0]:
        lr_ax = ax.twinx()
        lr_ax.plot(
            steps,
            [m.get("learning_rate", math.nan) for m in metrics],
            color="#ccbb44",
            linewidth=1,
            label="learning rate",
        )
        lr_ax.set_ylabel("learning rate")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_rl(history: Sequence[dict[str, Any]], path: Path) -> None:
    """Reward (and each component) and KL against the step."""
    plt = _pyplot()
    if not history:
        return
    steps = [h["step"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(steps, [h["reward"] for h in history], label="reward (total)", lw=2)
    for key in sorted(k for k in history[0] if k.startswith("reward/")):
        a.plot(steps, [h.get(key, 0.0) for h in history], label=key[7:], lw=1, alpha=0.8)
    a.set_xlabel("step")
    a.set_ylabel("mean reward")
    a.legend(fontsize=7)
    a.set_title("reward")
    b.plot(steps, [h["kl"] for h in history], color="tab:red")
    b.set_xlabel("step")
    b.set_ylabel("KL (k3) to the init model")
    b.set_title("KL")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
