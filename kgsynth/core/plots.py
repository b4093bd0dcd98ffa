"""Stats figures written next to stage outputs (matplotlib, Agg backend, imported lazily)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa


def walk_stats_png(
    table: pa.Table, path: str | Path, relations_available: int | None = None
) -> None:
    """Structure mix, hop counts, relation coverage and answer-set sizes of a walks table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table.select(["structure", "hops", "branches", "answer_names"]).to_pylist()
    structures = Counter(r["structure"] for r in rows)
    hops = Counter(r["hops"] for r in rows)
    relations = Counter(
        h["relation"] + ("⁻¹" if h["inverse"] else "")
        for r in rows
        for b in r["branches"]
        for h in b
    )
    sizes = Counter(len(r["answer_names"]) for r in rows)

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    names = sorted(structures)
    ax.bar(names, [structures[n] for n in names], color="#4477aa")
    ax.set_title(f"structures ({len(rows)} walks)")
    ax = axes[0][1]
    ks = sorted(hops)
    ax.bar([str(k) for k in ks], [hops[k] for k in ks], color="#66ccee")
    ax.set_title("edges per walk")
    ax = axes[1][0]
    top = relations.most_common(25)
    ax.barh([t[0] for t in top][::-1], [t[1] for t in top][::-1], color="#228833")
    used = len({k.rstrip("⁻¹") for k in relations})
    cover = f"{used} relations used" + (f" of {relations_available}" if relations_available else "")
    ax.set_title(f"relation coverage (hops per relation; {cover})")
    ax.tick_params(axis="y", labelsize=7)
    ax = axes[1][1]
    ss = sorted(sizes)
    ax.bar([str(s) for s in ss], [sizes[s] for s in ss], color="#ccbb44")
    ax.set_title("answer-set size")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
