"""Whole-chain runs (`make all` / `make learn`): the final agent's dev Hits@1 against the
chain's wall minutes on the 2-core machine, from `learning_sweep/chain_runs.json` (figures
copied from each run's `summary/compare.md` and its `make all: Ns` line).

    python benchmarks/plot_chain_runs.py   # writes chain_runs.md and chain_runs.png beside it
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent / "learning_sweep"


def table(runs: list[dict]) -> str:
    lines = [
        "| run | recipe | processes | wall (min) | final Hits@1 | 1-hop | 2-hop | 3-hop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: r["wall_s"]):
        wall = f"{r['wall_s'] / 60:.1f}" + (" (shared machine)" if r["shared"] else "")
        hops = " | ".join(f"{h:.2f}" for h in r["hop"])
        lines.append(
            f"| {r['run']} | {r['recipe']} | {r['processes']} | {wall} | "
            f"{r['hits_at_1']:.3f} | {hops} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for procs, marker in ((2, "o"), (1, "s")):
        sub = [r for r in runs if r["processes"] == procs]
        ax.scatter(
            [r["wall_s"] / 60 for r in sub],
            [r["hits_at_1"] for r in sub],
            marker=marker,
            label=f"{procs} process{'es' if procs > 1 else ''}",
        )
        for r in sub:
            ax.annotate(
                r["run"],
                (r["wall_s"] / 60, r["hits_at_1"]),
                fontsize=7,
                xytext=tuple(r.get("label_offset", (4, 3))),  # points; set where labels meet
                textcoords="offset points",
            )
    ax.axvline(20, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("wall minutes of the whole chain, 2-core CPU")
    ax.set_ylabel("final agent, dev Hits@1 (300 questions)")
    ax.set_ylim(0, 0.6)
    ax.legend(loc="lower right")
    ax.set_title("make all / make learn runs, 2026-11-26 and 27")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    runs = json.loads((HERE / "chain_runs.json").read_text())
    (HERE / "chain_runs.md").write_text(
        "# Whole-chain runs: the final agent against wall minutes\n\n" + table(runs)
    )
    plot(runs, HERE / "chain_runs.png")


if __name__ == "__main__":
    main()
