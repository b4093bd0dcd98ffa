"""The page's first screen: the run's headline numbers.

One table of every evaluated model (and baseline): Hits@1 with its 95 % interval, overall and
by hops (``metrics.json``), then Hits@1 by question type where the evaluation has types (the
interval computed from ``predictions.parquet`` the way ``kgsynth eval`` computes it, questions
as the unit), then the data funnel's key counts (each walk, question, trajectory and filter
output: in → accepted; the filter's accepted rows are the corpus) beside the training runs'
steps, loss, reward and validation Hits@1. :func:`render_headline` draws it;
:mod:`kgsynth.report.compare` reuses the cells for two runs.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

from kgsynth.report.contents import DATA_KINDS, TRAINING_KINDS, RunReport, Stage
from kgsynth.report.elements import esc, fmt_num, html_table

log = logging.getLogger(__name__)

METRIC = "hits_at_1"


def type_rows(folder: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """``{column: {group: {questions, hits_at_1, ci95}}}`` for the evaluated model's
    breakdowns other than hops (``qtype``, ``structure``) in ``folder/metrics.json``; the
    interval comes from ``predictions.parquet`` (missing when that file cannot be read)."""
    try:
        metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    breakdowns = metrics.get("breakdowns") if isinstance(metrics, dict) else None
    if not isinstance(breakdowns, dict):
        return {}
    out = {
        col: {
            str(g): {"questions": cell.get("questions"), METRIC: cell.get(METRIC)}
            for g, cell in groups.items()
            if isinstance(cell, dict)
        }
        for col, groups in breakdowns.items()
        if col != "hops" and isinstance(groups, dict) and groups
    }
    if out:
        _add_intervals(folder / "predictions.parquet", out)
    return out


def _add_intervals(path: Path, rows: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Each group's 95 % interval of Hits@1 over its questions (the model's rows only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kgsynth.eval.config import CI_LEVEL, CI_RESAMPLES, CI_SEED, MODEL_SUBJECT
    from kgsynth.metrics import mean_interval

    try:
        table = pq.read_table(path, columns=["question_id", "system", METRIC, *rows])
    except (pa.ArrowException, OSError, KeyError) as exc:
        log.info("report: %s: no intervals by type (%s)", path, exc)
        return
    data = table.to_pydict()
    for col, groups in rows.items():
        scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for qid, system, score, group in zip(data["question_id"], data["system"], data[METRIC],
                                             data[col], strict=True):  # fmt: skip
            if system == MODEL_SUBJECT and score is not None:
                key = "unknown" if group is None else str(group)
                scores[key][str(qid)].append(float(score))
        for group, cell in groups.items():
            by_question = list(scores.get(group, {}).values())
            if by_question:
                lo, hi = mean_interval(by_question, resamples=CI_RESAMPLES, seed=CI_SEED,
                                       level=CI_LEVEL)  # fmt: skip
                cell["ci95"] = [lo, hi]


def ci_html(value: Any, ci: Any = None) -> str:
    """``0.563 [0.507, 0.618]`` with the value in bold, its number in ``data-value``."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return '<span class="na">–</span>'
    interval = ""
    if isinstance(ci, list | tuple) and len(ci) == 2:
        interval = f' <span class="ci">[{ci[0]:.3f}, {ci[1]:.3f}]</span>'
    return f'<strong data-value="{value:.6g}">{value:.3f}</strong>{interval}'


def hop_keys(rows: list[dict[str, Any]]) -> list[str]:
    from kgsynth.eval.scoring import sorted_groups

    return sorted_groups(h for r in rows for h in (r.get("by_hops") or {}))


def eval_rows(report: RunReport) -> list[tuple[Stage, dict[str, Any]]]:
    """Every evaluated model and baseline of the run, with the output it comes from."""
    return [(s, row) for s in report.of_kind("eval") for row in s.eval_rows]


def metric_cells(row: dict[str, Any], hops: list[str]) -> list[str]:
    """Hits@1 with its interval, overall and by each of ``hops``."""
    by_hops = row.get("by_hops") or {}
    cells = [ci_html(row.get(METRIC), (row.get("ci95") or {}).get(METRIC))]
    for h in hops:
        cell = by_hops.get(h) or {}
        cells.append(ci_html(cell.get(METRIC), (cell.get("ci95") or {}).get(METRIC)))
    return cells


def _evals_table(report: RunReport) -> str:
    rows = eval_rows(report)
    if not rows:
        return '<p class="note" data-headline="no-eval">no evaluation in this run</p>'
    hops = hop_keys([r for _, r in rows])
    body = [
        [f"<strong>{esc(r.get('label'))}</strong>", f"<code>{esc(s.key)}</code>",
         esc(fmt_num(r["questions"]) if isinstance(r.get("questions"), int) else r.get("questions")),
         *metric_cells(r, hops)]
        for s, r in rows
    ]  # fmt: skip
    head = ["model", "output", "questions", "Hits@1 (95 % CI)", *(f"{h}-hop" for h in hops)]
    return html_table(head, body, cls="rows headline", ident="headline-evals")


def _types_table(report: RunReport) -> str:
    """Hits@1 by question type (and structure): one column per evaluation, collapsed."""
    evals = [s for s in report.of_kind("eval") if s.type_rows]
    out = []
    for col in sorted({c for s in evals for c in s.type_rows}):
        groups = sorted({g for s in evals for g in s.type_rows.get(col, {})})
        body = []
        for g in groups:
            cells = [f"<code>{esc(g)}</code>"]
            for s in evals:
                cell = s.type_rows.get(col, {}).get(g) or {}
                n = cell.get("questions")
                cells.append(ci_html(cell.get(METRIC), cell.get("ci95"))
                             + (f' <span class="n">n={esc(n)}</span>' if n is not None else ""))  # fmt: skip
            body.append(cells)
        head = [col, *(s.eval_rows[0].get("label") or s.key for s in evals)]
        out.append(
            f'<details class="types" data-breakdown="{esc(col)}"><summary>Hits@1 by {esc(col)} '
            f"({len(groups)} group{'s' if len(groups) != 1 else ''}; the evaluated model, 95 % CI "
            "over questions)</summary>" + html_table(head, body, cls="rows types") + "</details>"
        )
    return "".join(out)


def funnel_cells(stage: Stage) -> tuple[str, str, str]:
    """(in, accepted with its rate, largest reject reason) of a data output's funnel."""
    funnel = next((p.funnel for p in stage.parts if p.funnel), None)
    if funnel is None:
        return "", "", ""
    rate = f" ({funnel.accepted / funnel.attempted:.1%})" if funnel.attempted else ""
    top = max(funnel.rejects.items(), key=lambda kv: (kv[1], kv[0]), default=None)
    reason = f"{esc(top[0])} ({fmt_num(top[1])})" if top and top[1] else ""
    return (
        f'{fmt_num(funnel.attempted)} <span class="n">{esc(funnel.attempted_label)}</span>',
        f'<strong data-count="{funnel.accepted}">{fmt_num(funnel.accepted)}</strong>'
        f'<span class="n">{rate}</span>',
        reason,
    )


def _data_table(report: RunReport) -> str:
    stages = report.of_kind(*DATA_KINDS)
    if not stages:
        return '<p class="note">no data stage in this run</p>'
    body = [[esc(s.title), f"<code>{esc(s.key)}</code>", *funnel_cells(s)] for s in stages]
    return html_table(["data", "output", "in", "accepted", "top reject"], body,
                      cls="rows funnels", ident="headline-data")  # fmt: skip


def _pair(first: Any, last: Any, spec: str = ".3g") -> str:
    nums = [format(v, spec) for v in (first, last) if isinstance(v, int | float)]
    return " → ".join(nums)


def training_cells(stage: Stage) -> tuple[str, str, str, str]:
    """(steps, loss first → last, reward first → last, validation Hits@1 start → chosen)."""
    m = stage.manifest
    if not m and stage.series:
        series = {c.name: c.points for c in stage.series}
        steps = max((p[0] for pts in series.values() for p in pts), default=None)
        loss, reward = series.get("loss") or [], series.get("reward") or []
        return (
            f"{steps:g} (so far)" if steps is not None else "",
            _pair(loss[0][1], loss[-1][1]) if loss else "",
            _pair(reward[0][1], reward[-1][1], ".3f") if reward else "",
            "",
        )
    steps = m.get("steps")
    return (
        esc(fmt_num(steps)) if isinstance(steps, int) else "",
        _pair(m.get("loss_first"), m.get("loss_last")),
        _pair(m.get("reward_first"), m.get("reward_last"), ".3f"),
        _pair(m.get("start_val_hits_at_1"), m.get("selected_val_hits_at_1"), ".3f"),
    )


def _training_table(report: RunReport) -> str:
    stages = report.of_kind(*TRAINING_KINDS)
    if not stages:
        return '<p class="note">no training in this run</p>'
    body = [[esc(s.title), f"<code>{esc(s.key)}</code>", *training_cells(s)] for s in stages]
    head = ["training", "output", "steps", "loss", "reward", "val Hits@1"]
    return html_table(head, body, cls="rows training", ident="headline-training")


def render_headline(report: RunReport) -> str:
    """The headline section: evaluations (by hops, then by type, collapsed), the data
    funnel's key counts, the training runs."""
    return (
        '<section id="headline" data-stage="headline"><h2>Evaluation: Hits@1 with 95 % CI</h2>'
        + _evals_table(report)
        + _types_table(report)
        + "<h3>Data: in → accepted (the filter's accepted rows are the corpus)</h3>"
        + _data_table(report)
        + "<h3>Training</h3>"
        + _training_table(report)
        + "</section>"
    )
