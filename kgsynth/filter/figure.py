"""``filter_stats.png``: rejects by reason, and acceptance by structure, hops and turns."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def filter_stats_png(stats: dict[str, Any], path: str | Path) -> None:
    """Rejects by reason, and acceptance by structure, hops and turns, from ``stats``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    labels = ["accepted", *stats["rejects"]]
    values = [stats["accepted"], *stats["rejects"].values()]
    colors = ["#228833"] + ["#cc6677"] * len(stats["rejects"])
    ax.barh(labels[::-1], values[::-1], color=colors[::-1])
    ax.set_title(f"{stats['rows_in']:,} trajectories: accepted and rejects by reason (in order)")
    ax.tick_params(axis="y", labelsize=8)
    for ax, col, title in (
        (axes[0][1], "structure", "structure"),
        (axes[1][0], "hops", "hops"),
        (axes[1][1], "num_turns", "assistant turns"),
    ):
        groups = stats["acceptance"][col]
        names = list(groups)
        kept = [groups[k]["accepted"] for k in names]
        dropped = [groups[k]["rows"] - groups[k]["accepted"] for k in names]
        ax.bar(names, kept, color="#228833", label="accepted")
        ax.bar(names, dropped, bottom=kept, color="#cc6677", label="rejected")
        for x, name in enumerate(names):
            ax.annotate(
                f"{groups[name]['rate']:.0%}",
                (x, groups[name]["rows"]),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.set_title(f"by {title} (share accepted on top)")
        ax.legend(fontsize=8)
        if len(names) > 8:
            ax.tick_params(axis="x", labelsize=7, rotation=90)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
