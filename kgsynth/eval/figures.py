"""The evaluation's figures: ``eval.png`` (one evaluation with its baselines) and
``compare.png`` (several evaluations); matplotlib with the Agg backend, imported lazily."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kgsynth.eval.compare import hop_columns
from kgsynth.eval.config import METRIC_NAMES, MODEL_SUBJECT, SHOWN_METRICS, UNION_LABEL
from kgsynth.eval.scoring import sorted_groups

_COLORS = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb")


def _grouped_bars(
    ax: Any,
    groups: list[str],
    series: dict[str, list[float]],
    intervals: dict[str, list[Sequence[float] | None]] | None = None,
) -> None:
    """Bars per group and series; ``intervals[name][i]`` (``[lo, hi]`` or None) draws an
    error bar on that bar."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(groups))]
        cis = (intervals or {}).get(name)
        yerr = None
        if cis and any(cis):
            yerr = [
                # max(0, …): a percentile interval need not contain a rounded mean exactly
                [max(0.0, v - ci[0]) if ci else 0.0 for v, ci in zip(values, cis, strict=True)],
                [max(0.0, ci[1] - v) if ci else 0.0 for v, ci in zip(values, cis, strict=True)],
            ]
        bars = ax.bar(
            xs,
            values,
            width,
            yerr=yerr,
            capsize=2 if yerr else 0,
            label=name,
            color=_COLORS[i % len(_COLORS)],
        )
        ax.bar_label(bars, fmt="%.2f", fontsize=6)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)


def eval_png(metrics: dict[str, Any], path: str | Path) -> None:
    """Overall metrics per system (model, N-run aggregates, baselines), EM and F1 by hops per
    system, and F1 by question type (or structure) for the model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems: dict[str, dict[str, Any]] = {metrics.get("label") or MODEL_SUBJECT: metrics}
    systems.update(metrics.get("baselines") or {})
    runs = metrics["counts"]["runs"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    ax = axes[0][0]
    series = {name: [m["overall"][k] for k in SHOWN_METRICS] for name, m in systems.items()}
    if runs > 1:
        series["majority"] = [metrics["majority"][k] for k in SHOWN_METRICS]
        series[UNION_LABEL] = [metrics["union"][k] for k in SHOWN_METRICS]
    _grouped_bars(ax, [METRIC_NAMES[k] for k in SHOWN_METRICS], series)
    ax.set_title(
        f"{metrics['counts']['questions']} questions × {runs} run(s)"
        + (" (bars: mean over runs)" if runs > 1 else "")
    )
    for ax, metric in ((axes[0][1], "hits_at_1"), (axes[1][0], "f1")):
        hop_groups = sorted_groups(
            h for m in systems.values() for h in m.get("breakdowns", {}).get("hops", {})
        )
        if not hop_groups:
            ax.text(0.5, 0.5, "the questions carry no hop counts", ha="center", va="center")
            ax.set_axis_off()
            continue
        series = {
            name: [
                m.get("breakdowns", {}).get("hops", {}).get(h, {}).get(metric, 0.0)
                for h in hop_groups
            ]
            for name, m in systems.items()
        }
        _grouped_bars(ax, [f"{h}-hop" for h in hop_groups], series)
        ax.set_title(f"{METRIC_NAMES[metric]} by hops")
    ax = axes[1][1]
    kinds = metrics.get("breakdowns", {})
    col = "qtype" if "qtype" in kinds else "structure" if "structure" in kinds else None
    if col is None:
        ax.text(0.5, 0.5, "the questions carry no type or structure", ha="center", va="center")
        ax.set_axis_off()
    else:
        top = sorted(kinds[col].items(), key=lambda kv: -kv[1]["questions"])[:20][::-1]
        bars = ax.barh([k for k, _ in top], [v["f1"] for _, v in top], color=_COLORS[0])
        ax.bar_label(bars, fmt="%.2f", fontsize=6)
        ax.set_xlim(0, 1.05)
        ax.tick_params(axis="y", labelsize=6)
        ax.set_title(f"F1 by {col} ({metrics.get('label') or MODEL_SUBJECT}; top 20 by count)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def compare_png(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Overall EM/F1/Hits@1 per evaluation, and Hits@1 by hops per evaluation; error bars
    are the 95 % intervals (none for an older metrics.json without them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    _grouped_bars(
        axes[0],
        labels,
        {METRIC_NAMES[k]: [r[k] or 0.0 for r in rows] for k in SHOWN_METRICS},
        {METRIC_NAMES[k]: [r.get("ci95", {}).get(k) for r in rows] for k in SHOWN_METRICS},
    )
    axes[0].set_title("overall (mean over runs; bars: 95 % CI)")
    axes[0].tick_params(axis="x", labelsize=7, rotation=20)
    hops = hop_columns(rows)
    if hops:
        by = {r["label"]: [r["by_hops"].get(h, {}) for h in hops] for r in rows}
        _grouped_bars(
            axes[1],
            [f"{h}-hop" for h in hops],
            {name: [v.get("hits_at_1", 0.0) for v in vs] for name, vs in by.items()},
            {name: [v.get("ci95", {}).get("hits_at_1") for v in vs] for name, vs in by.items()},
        )
        axes[1].set_title("Hits@1 by hops (bars: 95 % CI)")
    else:
        axes[1].set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
