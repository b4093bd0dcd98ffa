"""The whole page: the headline numbers first (:mod:`kgsynth.report.headline`), then the
overview of every output's counts, each output's section (notes, KG facts, parts, evaluation
rows, the comparison's markdown, plots, curves) and the inline CSS and JS; it loads nothing
from the network."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from kgsynth.report.contents import RunReport, Stage
from kgsynth.report.elements import esc, figure, fmt_num, html_table, kv_table, slug, svg_curve
from kgsynth.report.headline import render_headline
from kgsynth.report.markdown import render_markdown
from kgsynth.report.sections import render_eval_rows, render_funnel, render_manifest, render_sample


def _stage_counts(stage: Stage) -> tuple[str, str, str, str]:
    """(in, accepted, rejected, seconds) for the overview table."""
    funnels = [p.funnel for p in stage.parts if p.funnel]
    manifests = [p.manifest for p in stage.parts if p.manifest]
    seconds = sum(m["elapsed_s"] for m in manifests if isinstance(m.get("elapsed_s"), int | float))
    secs = f"{seconds:,.1f}" if manifests else ""
    if not funnels:
        return "", "", "", secs
    return (
        fmt_num(sum(f.attempted for f in funnels)),
        fmt_num(sum(f.accepted for f in funnels)),
        fmt_num(sum(sum(f.rejects.values()) for f in funnels)),
        secs,
    )


def render_stage(stage: Stage, run_dir: Path) -> str:
    out = [
        f'<section class="stage" id="{esc(slug(stage.key))}" data-stage="{esc(stage.key)}">',
        f"<h2>{esc(stage.title)} <code>{esc(stage.key)}</code></h2>",
    ]
    out += [f'<p class="note">{esc(n)}</p>' for n in stage.notes]
    if stage.info:
        relations = stage.info.get("top_relations")
        out.append(
            kv_table((k, v) for k, v in stage.info.items() if not isinstance(v, dict | list))
        )
        if isinstance(relations, list):
            out.append(
                html_table(
                    ["relation", "triples"],
                    ([esc(r.get("relation")), esc(fmt_num(r.get("count", 0)))] for r in relations
                     if isinstance(r, dict)),
                )
            )  # fmt: skip
    for part in stage.parts:
        if part.name:
            out.append(f"<h3>{esc(part.name)}</h3>")
        if part.error:
            out.append(f'<p class="note">{esc(part.error)}</p>')
        if part.funnel:
            out.append(render_funnel(part.funnel))
        if part.manifest and part.manifest_path:
            out.append(render_manifest(part.manifest, part.manifest_path))
        elif part.manifest_path is None:
            out.append('<p class="note">no manifest for this output</p>')
        if part.samples:
            out.append('<div class="samples">')
            out += [render_sample(s, run_dir) for s in part.samples]
            out.append("</div>")
    if stage.eval_rows:
        out.append(render_eval_rows(stage.eval_rows))
    if stage.compare_markdown is not None:
        out.append(
            f'<div class="markdown">{render_markdown(stage.compare_markdown, stage.folder)}</div>'
        )
    for plot in stage.plots:
        out.append(figure(plot, f"{stage.key}: {plot.name}"))
    if stage.curves:
        out.append('<div class="curves"><h3>training curves (metrics.jsonl)</h3>')
        out += [svg_curve(c) for c in stage.curves]
        out.append("</div>")
    out.append("</section>")
    return "\n".join(out)


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:16px;color:#222}
h1{font-size:22px}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:36px}
code,pre{font-family:ui-monospace,monospace;font-size:12px}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:6px;margin:4px 0}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#f3f3f3}
table.funnel{min-width:640px}table.funnel td.n{text-align:right;width:90px}
table.funnel td.bar{width:420px}table.funnel td.bar span{display:block;height:12px;
background:#4a90d9}table.funnel tr.accepted td.bar span{background:#38a169}
table.funnel tr.reject td.bar span{background:#e53e3e}table.funnel tr.zero{color:#999}
table.kv th{font-weight:normal;color:#555}
table.rows{font-size:12px;width:100%}.rel{color:#805ad5}.more,.note{color:#777;font-style:italic}
.missing{color:#a0522d}.reason{background:#fed7d7;color:#822;border-radius:3px;padding:0 4px;
font-size:12px}
details.traj{border:1px solid #ddd;border-radius:4px;margin:4px 0;padding:2px 6px}
details.traj>summary{cursor:pointer}.q{font-weight:600;margin:0 6px}.ans{color:#555;font-size:12px}
.metas{margin:4px 0}.meta{font-size:11px;background:#eee;border-radius:3px;padding:0 4px;
margin-right:4px}.chat{display:flex;flex-direction:column;gap:4px;margin:6px 0}
.msg{border-radius:6px;padding:4px 8px;max-width:92%}.msg .role{font-size:11px;font-weight:700;
text-transform:uppercase;color:#555}.msg .content{white-space:pre-wrap;word-break:break-word}
.msg.system{background:#f0f0f0;color:#555;font-style:italic}
.msg.user{background:#e6f0ff;align-self:flex-start}
.msg.assistant{background:#e6ffed;align-self:flex-end}
.msg.tool{background:#fff8e1;font-family:ui-monospace,monospace;font-size:12px}
.msg.other{background:#fbe9ff}.t-think{color:#777}.t-kg-query{color:#2b6cb0;font-weight:600}
.t-answer{color:#276749;font-weight:700}
figure{margin:8px 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:11px;color:#777}svg.curve text{font-size:11px;fill:#444}
nav ol{columns:2}.toolbar button{margin-right:6px}
h1.title{font-size:18px;margin:4px 0}p.sub{margin:0 0 4px;font-size:12px}
#headline h2{margin-top:8px}#headline h3{font-size:14px;margin:10px 0 2px}
table.headline{font-size:13px;width:auto}table.headline td{white-space:nowrap}
.ci{color:#666;font-size:11px}.n{color:#888;font-size:11px}.na{color:#aaa}
table.funnels,table.training{font-size:12px;width:auto}table.funnels td,table.training td{
white-space:nowrap}
.delta.up{color:#276749;font-weight:700}.delta.down{color:#c53030;font-weight:700}
tr.run-b td{border-top:none}tr.delta-row td{border-bottom:2px solid #ccc}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:16px}.pair table.funnel{min-width:0}
.legend span{margin-right:12px}.legend .a{color:#2b6cb0}.legend .b{color:#dd6b20}
"""

JS = """
function setAll(open){document.querySelectorAll('details').forEach(function(d){d.open=open;});}
"""


def page_head(title: str) -> list[str]:
    """The document's head: its title, the inline CSS and script."""
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title>",
        f"<style>{CSS}</style><script>{JS}</script></head><body>",
    ]


def generated_line(samples: str) -> str:
    from kgsynth import __version__

    generated = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        f'<p class="note sub">generated {esc(generated)} by kgsynth {esc(__version__)}'
        f"{esc(samples)}.</p>"
    )


def render_html(report: RunReport) -> str:
    """The whole page: title, the headline numbers, overview (every output's counts, the
    kinds of stage the run lacks), each output in the order it was written and the
    evaluation comparison."""
    run = str(report.run_dir)
    nav = []
    overview = []
    for stage in report.stages:
        nav.append(f'<li><a href="#{esc(slug(stage.key))}">{esc(stage.title)}</a></li>')
        overview.append([esc(stage.title), f"<code>{esc(stage.key)}</code>",
                         *(esc(c) for c in _stage_counts(stage))])  # fmt: skip
    missing = "".join(
        f'<p class="missing" data-missing="{esc(kind)}">{esc(title)} (<code>{esc(kind)}</code>): '
        "not in this run, skipped.</p>"
        for kind, title in report.missing
    )
    comparison = ""
    if report.comparison:
        comparison = (
            '<section class="stage" id="stage-comparison" data-stage="comparison">'
            "<h2>Evaluation comparison (from each evaluation's metrics.json)</h2>"
            + render_eval_rows(report.comparison)
            + "</section>"
        )
    elif report.comparison_error:
        comparison = f'<p class="note">evaluation comparison: {esc(report.comparison_error)}</p>'
    samples = f"; samples: up to {report.samples} rows per file, picked with seed {report.seed}"
    return "\n".join(
        [
            *page_head(f"kgsynth run report: {run}"),
            f'<h1 class="title">kgsynth run report: <code>{esc(run)}</code></h1>',
            generated_line(samples),
            render_headline(report),
            '<div class="toolbar"><button type="button" onclick="setAll(true)">expand all'
            '</button><button type="button" onclick="setAll(false)">collapse all</button></div>',
            f"<nav><ol>{''.join(nav)}</ol></nav>",
            '<section id="overview"><h2>Pipeline overview</h2>',
            html_table(
                ["stage", "output", "in", "accepted", "rejected", "seconds"],
                overview,
                cls="rows overview",
            ),
            missing,
            "</section>",
            *(render_stage(s, report.run_dir) for s in report.stages),
            comparison,
            "</body></html>",
        ]
    )
