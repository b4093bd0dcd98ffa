"""Several evaluations side by side (``kgsynth eval --compare``): their ``metrics.json`` read
back into one table row per evaluation and baseline, and that table in markdown."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError, InputFileError
from kgsynth.core.stage import StageResult
from kgsynth.eval.config import METRIC_LEGEND, METRIC_NAMES, SHOWN_METRICS, UNION_LABEL
from kgsynth.eval.paired import MODEL_SYSTEM, paired_markdown, paired_rows
from kgsynth.eval.scoring import sorted_groups


def find_metrics(path: str | Path) -> Path:
    """``DIR/metrics.json``, ``DIR/eval/metrics.json``, or the file itself."""
    path = Path(path)
    for candidate in (path, path / "metrics.json", path / "eval" / "metrics.json"):
        if candidate.is_file():
            return candidate
    raise InputFileError(
        path, "no metrics.json here nor in eval/ (run `kgsynth eval --out DIR` first)"
    )


def load_metrics(path: str | Path) -> dict[str, Any]:
    found = find_metrics(path)
    try:
        data = json.loads(found.read_text())
    except (OSError, ValueError) as exc:
        raise InputFileError(found, f"not a readable metrics.json: {exc}") from None
    if not isinstance(data, dict) or "overall" not in data:
        raise InputFileError(found, "not a metrics.json of `kgsynth eval` (no overall metrics)")
    return data


def _shown_ci(ci: dict[str, Any] | None) -> dict[str, list[float]]:
    """The shown metrics' intervals; empty for a metrics.json written before intervals."""
    return {k: list(ci[k]) for k in SHOWN_METRICS if k in (ci or {})}


def _table_row(label: str, m: dict[str, Any], source: str, system: str) -> dict[str, Any]:
    hops = m.get("breakdowns", {}).get("hops", {})
    return {
        "label": label,
        "source": source,
        "system": system,
        "questions": m["counts"]["questions"],
        "runs": m["counts"]["runs"],
        **{k: m["overall"].get(k) for k in SHOWN_METRICS},
        "ci95": _shown_ci(m.get("ci95")),
        "ci95_method": m.get("ci95_method"),
        "union_hits_at_1": m["union"].get("hits_at_1") if m["counts"]["runs"] > 1 else None,
        "by_hops": {
            h: {**{k: v.get(k) for k in SHOWN_METRICS}, "ci95": _shown_ci(v.get("ci95"))}
            for h, v in hops.items()
        },
        "questions_per_s": (m.get("speed") or {}).get("questions_per_s"),
    }


def compare_runs(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """One table row per evaluation (and per baseline it ran): label, source (its
    metrics.json), system (``model``, or the baseline's name), every shown metric
    overall with its 95 % interval (``ci95``, empty for an older metrics.json without them;
    a metric that file lacks is None), KG-R1's N-run union Hits@1 where there were several
    runs, and the shown metrics (with ``ci95``) by hops."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        m = load_metrics(path)
        label = m.get("label") or Path(path).name
        if any(r["label"] == label for r in rows):
            label = f"{label} ({path})"
        rows.append(_table_row(label, m, str(find_metrics(path)), MODEL_SYSTEM))
        for name, base in (m.get("baselines") or {}).items():
            rows.append(_table_row(f"{label} · {name}", base, str(find_metrics(path)), name))
    return rows


def run_compare(folders: Sequence[Path]) -> StageResult[list[dict[str, Any]]]:
    """The ``eval --compare`` stage: ``accepted`` holds one table row per evaluation folder
    (and per baseline it ran, see :func:`compare_runs`); ``stats["paired"]`` each evaluation
    against the one before it and each baseline against its model, on the same questions
    (:mod:`kgsynth.eval.paired`)."""
    if not folders:
        raise ConfigError("--compare needs evaluation folders: kgsynth eval --compare DIR DIR …")
    for d in folders:
        if not d.exists():
            raise InputFileError(d, "no such folder")
    rows = compare_runs(folders)
    return StageResult(accepted=rows, stats={"rows": len(rows), "paired": paired_rows(rows)})


def hop_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    return sorted_groups(h for r in rows for h in r["by_hops"])


def fmt_value(value: float | None, digits: int = 3) -> str:
    """A metric cell: the value with ``digits`` decimals, ``–`` without a value."""
    return "–" if value is None else f"{value:.{digits}f}"


def ci_cell(value: float | None, ci: Sequence[float] | None = None) -> str:
    """``0.620 [0.523, 0.708]``; the value alone without an interval; ``–`` without a value."""
    if value is None:
        return "–"
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{value:.3f}"


def _md_table(head: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in body]


def compare_markdown(rows: Sequence[dict[str, Any]], paired: Sequence[dict[str, Any]] = ()) -> str:
    """The comparison in markdown: every shown metric overall as a ``mean [95 % CI]`` cell
    (and KG-R1's N-run union Hits@1), then Hits@1 by hops with its 95 % CI, then every shown
    metric by hops, then how the intervals were computed and what each metric means, then the
    ``paired`` differences (:mod:`kgsynth.eval.paired`). Rows from a metrics.json without
    intervals show the mean alone."""
    hops = hop_columns(rows)
    with_union = any(r["union_hits_at_1"] is not None for r in rows)
    head = ["run", "questions", "runs", *(METRIC_NAMES[k] for k in SHOWN_METRICS)]
    head += [f"{UNION_LABEL} Hits@1"] if with_union else []
    body = []
    for r in rows:
        cells = [r["label"], str(r["questions"]), str(r["runs"])]
        cells += [ci_cell(r[k], r.get("ci95", {}).get(k)) for k in SHOWN_METRICS]
        cells += [fmt_value(r["union_hits_at_1"])] if with_union else []
        body.append(cells)
    lines = _md_table(head, body)
    if hops:
        hop_head = ["run", *(f"{h}-hop" for h in hops)]
        hits = []
        points = []
        for r in rows:
            by = [r["by_hops"].get(h) for h in hops]
            hits.append(
                [
                    r["label"],
                    *(
                        ci_cell(v.get("hits_at_1"), v.get("ci95", {}).get("hits_at_1"))
                        if v
                        else "–"
                        for v in by
                    ),
                ]
            )
            points.append(
                [
                    r["label"],
                    *(" / ".join(fmt_value(v[k]) for k in SHOWN_METRICS) if v else "–" for v in by),
                ]
            )
        lines += ["", "## Hits@1 by hops with 95 % CI", "", *_md_table(hop_head, hits)]
        shown = " / ".join(METRIC_NAMES[k] for k in SHOWN_METRICS)
        lines += ["", f"## {shown} by hops", "", *_md_table(hop_head, points)]
    methods = list(dict.fromkeys(r["ci95_method"] for r in rows if r.get("ci95_method")))
    if methods:
        lines += ["", "`mean [lo, hi]`: the mean and its 95 % CI; " + "; ".join(methods) + "."]
    lines += ["", METRIC_LEGEND]
    if any(not r.get("ci95") for r in rows):
        lines += ["", "A mean without an interval: its metrics.json predates intervals."]
    if paired:
        lines += ["", *paired_markdown(paired)]
    return "\n".join(lines) + "\n"
