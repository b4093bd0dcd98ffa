"""Two runs on one page (``kgsynth report RUN_A RUN_B``): the headline numbers of both with
the difference (each evaluated model by its label: A's row, B's row and B − A, overall and by
hops), the data funnels side by side (outputs paired by kind, in the order they ran: A's first
walk with B's first walk, whatever their folders are called) and each training run's curves
from ``metrics.jsonl`` drawn over each other. Both runs are collected with
:func:`~kgsynth.report.collect.collect_run`, so any layout reads; :func:`render_comparison`
draws the page, which loads nothing, like the one-run page."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kgsynth.report.contents import DATA_KINDS, KINDS, TRAINING_KINDS, RunReport, Stage
from kgsynth.report.elements import esc, fmt_num, html_table, slug, svg_lines
from kgsynth.report.headline import (
    METRIC,
    eval_rows,
    funnel_cells,
    hop_keys,
    metric_cells,
    training_cells,
)
from kgsynth.report.page import generated_line, page_head
from kgsynth.report.sections import render_funnel


def run_names(a: RunReport, b: RunReport) -> tuple[str, str]:
    """What the page calls the runs: their folders' names, or whole paths when those agree."""
    if a.run_dir.name != b.run_dir.name:
        return a.run_dir.name, b.run_dir.name
    return str(a.run_dir), str(b.run_dir)


def pair_stages(a: list[Stage], b: list[Stage]) -> list[tuple[str, Stage | None, Stage | None]]:
    """``(kind, A's, B's)``: the n-th output of a kind in A with the n-th of that kind in B
    (each run in the order its stages ran); an output the other run lacks is paired with
    None. A's order first, then what only B has."""
    by_kind: dict[str, list[Stage]] = defaultdict(list)
    for s in b:
        by_kind[s.kind].append(s)
    seen: dict[str, int] = defaultdict(int)
    pairs: list[tuple[str, Stage | None, Stage | None]] = []
    for s in a:
        i = seen[s.kind]
        seen[s.kind] += 1
        others = by_kind.get(s.kind, [])
        pairs.append((s.kind, s, others[i] if i < len(others) else None))
    for kind, others in by_kind.items():
        pairs += [(kind, None, o) for o in others[seen.get(kind, 0) :]]
    return pairs


def _title(kind: str, sa: Stage | None, sb: Stage | None) -> str:
    stage = sa if sa is not None else sb
    return stage.title if stage is not None else kind


def _delta(a: Any, b: Any) -> str:
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b)):
        return '<span class="na">–</span>'
    d = b - a
    cls = "up" if d > 0 else "down" if d < 0 else "same"
    return f'<span class="delta {cls}" data-delta="{d:.6g}">{d:+.3f}</span>'


def _hits(row: dict[str, Any] | None, hop: str | None) -> Any:
    if row is None:
        return None
    if hop is None:
        return row.get(METRIC)
    return ((row.get("by_hops") or {}).get(hop) or {}).get(METRIC)


def _eval_table(a: RunReport, b: RunReport, names: tuple[str, str]) -> str:
    rows_a = {r.get("label"): (s, r) for s, r in eval_rows(a)}
    rows_b = {r.get("label"): (s, r) for s, r in eval_rows(b)}
    if not rows_a and not rows_b:
        return '<p class="note" data-headline="no-eval">no evaluation in either run</p>'
    hops = hop_keys([r for _, r in (*rows_a.values(), *rows_b.values())])
    labels = list(rows_a) + [k for k in rows_b if k not in rows_a]
    body = []
    for label in labels:
        sides = (rows_a.get(label), rows_b.get(label))
        for name, side in zip(names, sides, strict=True):
            if side is None:
                cells = ['<span class="na">not evaluated</span>'] + [""] * (len(hops) + 2)
            else:
                s, r = side
                cells = [f"<code>{esc(s.key)}</code>", esc(r.get("questions")),
                         *metric_cells(r, hops)]  # fmt: skip
            body.append([f"<strong>{esc(label)}</strong>", esc(name), *cells])
        rows = [None if side is None else side[1] for side in sides]
        deltas = [_delta(_hits(rows[0], h), _hits(rows[1], h)) for h in (None, *hops)]
        body.append([f"<strong>{esc(label)}</strong>", "Δ B − A", "", "", *deltas])
    head = ["model", "run", "output", "questions", "Hits@1 (95 % CI)", *(f"{h}-hop" for h in hops)]
    return html_table(head, body, cls="rows headline compare", ident="headline-evals")


def _accepted(stage: Stage | None) -> int | None:
    funnel = next((p.funnel for p in stage.parts if p.funnel), None) if stage else None
    return funnel.accepted if funnel else None


def _data_table(pairs: list[tuple[str, Stage | None, Stage | None]]) -> str:
    body = []
    for kind, sa, sb in pairs:
        cells = [esc(_title(kind, sa, sb))]
        for s in (sa, sb):
            if s is None:
                cells += ['<span class="na">none</span>', "", ""]
            else:
                fin, acc, _ = funnel_cells(s)
                cells += [f"<code>{esc(s.key)}</code>", fin, acc]
        n_a, n_b = _accepted(sa), _accepted(sb)
        delta = f"{n_b - n_a:+,}" if n_a is not None and n_b is not None else "–"
        body.append([*cells, esc(delta)])
    head = ["data", "A output", "A in", "A accepted", "B output", "B in", "B accepted",
            "Δ accepted"]  # fmt: skip
    return html_table(head, body, cls="rows funnels", ident="headline-data")


def _training_table(pairs: list[tuple[str, Stage | None, Stage | None]], names: tuple[str, str]) -> str:  # fmt: skip
    body = []
    for kind, sa, sb in pairs:
        for name, s in zip(names, (sa, sb), strict=True):
            title = esc(_title(kind, sa, sb))
            if s is None:
                body.append([title, esc(name), '<span class="na">none</span>', "", "", "", ""])
            else:
                body.append([title, esc(name), f"<code>{esc(s.key)}</code>", *training_cells(s)])
    head = ["training", "run", "output", "steps", "loss", "reward", "val Hits@1"]
    return html_table(head, body, cls="rows training", ident="headline-training")


def _funnels(pairs: list[tuple[str, Stage | None, Stage | None]], names: tuple[str, str]) -> str:
    out = ['<section class="stage" id="funnels" data-stage="funnels"><h2>Funnels, A | B</h2>']
    for kind, sa, sb in pairs:
        title = _title(kind, sa, sb)
        cols = []
        for name, s in zip(names, (sa, sb), strict=True):
            funnel = next((p.funnel for p in s.parts if p.funnel), None) if s else None
            where = f" <code>{esc(s.key)}</code>" if s else ""
            body = render_funnel(funnel) if funnel else '<p class="note">not in this run</p>'
            cols.append(f'<div data-run="{esc(name)}"><h4>{esc(name)}{where}</h4>{body}</div>')
        out.append(f'<h3>{esc(title)}</h3><div class="pair" data-kind="{esc(kind)}">'
                   + "".join(cols) + "</div>")  # fmt: skip
    return "".join(out) + "</section>"


def _curves(pairs: list[tuple[str, Stage | None, Stage | None]], names: tuple[str, str]) -> str:
    out = ['<section class="stage" id="curves" data-stage="curves">'
           "<h2>Training curves, overlaid (metrics.jsonl)</h2>",
           f'<p class="legend"><span class="a">━ A: {esc(names[0])}</span>'
           f'<span class="b">━ B: {esc(names[1])}</span></p>']  # fmt: skip
    drawn = 0
    for kind, sa, sb in pairs:
        title = _title(kind, sa, sb)
        series: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        for tag, s in zip(("A", "B"), (sa, sb), strict=True):
            for curve in s.series if s else []:
                series[curve.name].append((tag, curve))
        if not series:
            continue
        out.append(f'<h3 id="{esc(slug("curves-" + title))}">{esc(title)}</h3>')
        for name, lines in series.items():
            out.append(svg_lines(name, lines))
            drawn += 1
    if not drawn:
        out.append('<p class="note">neither run has a metrics.jsonl to draw</p>')
    return "\n".join(out) + "</section>"


def render_comparison(a: RunReport, b: RunReport) -> str:
    """The comparison page of runs ``a`` and ``b``: headline numbers of both and their
    difference first, then the funnels side by side and the training curves overlaid."""
    names = run_names(a, b)
    pairs = pair_stages(a.stages, b.stages)
    data = [p for p in pairs if p[0] in DATA_KINDS]
    training = [p for p in pairs if p[0] in TRAINING_KINDS]
    training.sort(key=lambda p: KINDS.get(p[0], (99, ""))[0])
    return "\n".join(
        [
            *page_head(f"kgsynth runs compared: {a.run_dir} | {b.run_dir}"),
            f'<h1 class="title">kgsynth runs compared: A <code>{esc(names[0])}</code> | '
            f"B <code>{esc(names[1])}</code></h1>",
            generated_line(f"; A: {a.run_dir}, B: {b.run_dir}"),
            '<section id="headline" data-stage="headline">'
            "<h2>Evaluation: Hits@1 with 95 % CI, A, B and B − A</h2>",
            _eval_table(a, b, names),
            "<h3>Data: in → accepted (the filter's accepted rows are the corpus)</h3>",
            _data_table(data) if data else '<p class="note">no data stage in either run</p>',
            "<h3>Training</h3>",
            _training_table(training, names) if training else
            '<p class="note">no training in either run</p>',
            "</section>",
            _funnels(data, names),
            _curves(training, names),
            f'<p class="note">{esc(fmt_num(len(a.stages)))} outputs in A, '
            f"{esc(fmt_num(len(b.stages)))} in B; each run's own page: "
            "<code>kgsynth report RUN</code>.</p>",
            "</body></html>",
        ]
    )  # fmt: skip
