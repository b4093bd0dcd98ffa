"""One part of a stage on the page: its funnel, its manifest, and the samples of its walks,
questions, trajectories and predictions (trajectories as chat turns inside ``<details>``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kgsynth.report.contents import SKIP_SUMMARY_KEYS, Funnel, Sample
from kgsynth.report.elements import (
    clip,
    esc,
    fmt_num,
    html_list,
    html_table,
    kv_table,
    rel_path,
)


def render_funnel(funnel: Funnel) -> str:
    """Attempted → accepted as bars, then one bar per reject reason (largest first); the
    counts are also in ``data-`` attributes."""
    top = max(funnel.attempted, 1)
    rate = funnel.accepted / funnel.attempted if funnel.attempted else 0.0

    def bar(label: str, n: int, cls: str, attr: str) -> str:
        pct = 100 * n / top
        return (
            f'<tr class="{cls}" {attr}><th>{label}</th><td class="n">{fmt_num(n)}</td>'
            f'<td class="bar"><span style="width:{pct:.2f}%"></span></td></tr>'
        )

    rows = [
        bar(esc(funnel.attempted_label), funnel.attempted, "attempted", 'data-role="attempted" '
            f'data-count="{funnel.attempted}"'),
        bar(f"accepted ({rate:.1%})", funnel.accepted, "accepted",
            f'data-role="accepted" data-count="{funnel.accepted}"'),
    ]  # fmt: skip
    for reason, n in sorted(funnel.rejects.items(), key=lambda kv: (-kv[1], kv[0])):
        rows.append(
            bar(
                f"rejected: {esc(reason)}",
                n,
                "reject zero" if n == 0 else "reject",
                f'data-role="reject" data-reason="{esc(reason)}" data-count="{n}"',
            )
        )
    if funnel.unattributed:
        rows.append(
            bar(
                "not attributed to a reason",
                funnel.unattributed,
                "reject",
                f'data-role="unattributed" data-count="{funnel.unattributed}"',
            )
        )
    return f'<table class="funnel">{"".join(rows)}</table>'


def render_manifest(manifest: dict[str, Any], path: Path) -> str:
    """The manifest's scalar fields and output paths, the command, the config and the whole
    file (collapsed)."""
    scalars = [
        (k, v)
        for k, v in manifest.items()
        if k not in SKIP_SUMMARY_KEYS and not isinstance(v, dict | list)
    ]
    output = manifest.get("output")
    if isinstance(output, dict):
        scalars += [(f"output.{k}", v) for k, v in output.items() if not isinstance(v, dict | list)]
    parts = [kv_table(scalars)]
    if manifest.get("command"):
        parts.append(f'<pre class="cmd">{esc(manifest["command"])}</pre>')
    config = manifest.get("config")
    if isinstance(config, dict):
        parts.append(
            "<details><summary>config</summary>"
            + kv_table((k, json.dumps(v) if isinstance(v, dict | list) else v) for k, v in config.items())
            + "</details>"
        )  # fmt: skip
    parts.append(
        f"<details><summary>{esc(path.name)} (whole file)</summary>"
        f"<pre>{esc(json.dumps(manifest, indent=2, ensure_ascii=False))}</pre></details>"
    )
    return "".join(parts)


def _walk_path(row: dict[str, Any]) -> str:
    lines = []
    topics = row.get("topic_names") or []
    for b, hops in enumerate(row.get("branches") or []):
        text = esc(topics[b] if b < len(topics) else "?")
        for hop in hops or []:
            rel = esc(hop.get("relation"))
            arrow = f" ←{rel}— " if hop.get("inverse") else f" —{rel}→ "
            text += f'<span class="rel">{arrow}</span>{esc(hop.get("entity"))}'
        lines.append(text)
    return "<br>".join(lines)


def _reason(row: dict[str, Any]) -> str:
    reason = row.get("reject_reason")
    return f'<span class="reason">{esc(reason)}</span>' if reason else ""


def render_walks(rows: list[dict[str, Any]], rejected: bool) -> str:
    head = ["walk_id", "structure", "hops", "path", "answers"]
    body = [
        [
            esc(r.get("walk_id")),
            esc(r.get("structure")),
            esc(r.get("hops")),
            _walk_path(r),
            html_list(r.get("answer_names")),
        ]
        + ([_reason(r)] if rejected else [])
        for r in rows
    ]
    return html_table(head + (["reject_reason"] if rejected else []), body)


def render_questions(rows: list[dict[str, Any]], rejected: bool) -> str:
    head = ["question_id", "structure", "hops", "question", "topic", "answers"]
    if rejected:
        head += ["reject_reason", "raw output"]
    body = []
    for r in rows:
        cells = [
            esc(r.get("question_id")),
            esc(r.get("structure")),
            esc(r.get("hops")),
            esc(r.get("question")),
            html_list(r.get("topic_names")),
            html_list(r.get("answer_names")),
        ]
        if rejected:
            cells += [_reason(r), f"<code>{esc(clip(str(r.get('raw_output') or ''))[0])}</code>"]
        body.append(cells)
    return html_table(head, body)


_TAG = re.compile(r"(&lt;(think|kg-query|answer|information)&gt;)(.*?)(&lt;/\2&gt;)", re.DOTALL)


def _message_html(content: str) -> str:
    """Escaped message text with the agent's tags (think, kg-query, answer, information)
    highlighted; the highlighting runs on escaped text, so it adds no markup from the run."""
    text, cut = clip(content)
    body = _TAG.sub(r'<span class="t-\2">\1\3\4</span>', esc(text))
    if cut:
        body += f'<span class="more"> … [{cut:,} more characters]</span>'
    return body


def render_chat(messages: list[dict[str, Any]] | None) -> str:
    """Chat turns, one block per message, styled by role (system, user, assistant, tool)."""
    if not messages:
        return '<p class="note">no messages (rejected before the agent ran)</p>'
    out = []
    for m in messages:
        role = str(m.get("role") or "unknown")
        cls = role if role in {"system", "user", "assistant", "tool"} else "other"
        label = "tool observation" if role == "tool" else role
        out.append(
            f'<div class="msg {cls}"><div class="role">{esc(label)}</div>'
            f'<div class="content">{_message_html(str(m.get("content") or ""))}</div></div>'
        )
    return f'<div class="chat">{"".join(out)}</div>'


def render_trajectories(rows: list[dict[str, Any]], kind: str) -> str:
    """Each trajectory (or eval prediction) as a ``<details>``: the question, answers and
    reject reason in its summary, the chat turns inside."""
    out = []
    for r in rows:
        gold = r.get("gold_answers", r.get("gold"))
        predicted = r.get("predicted_answers", r.get("predicted"))
        ident = r.get("trajectory_id") or r.get("question_id") or ""
        score = r.get("f1")
        meta = [
            ("id", ident),
            ("system", r.get("system")),
            ("mode", r.get("mode")),
            ("structure", r.get("structure")),
            ("hops", r.get("hops")),
            ("turns", r.get("num_turns")),
            ("tool errors", r.get("tool_errors")),
            ("format errors", r.get("format_errors")),
            ("f1", f"{score:.3f}" if isinstance(score, float) else None),
        ]
        meta_html = " ".join(
            f'<span class="meta">{esc(k)}: {esc(v)}</span>' for k, v in meta if v is not None
        )
        out.append(
            f'<details class="traj" data-kind="{esc(kind)}"><summary>{_reason(r)} '
            f'<span class="q">{esc(r.get("question"))}</span>'
            f'<span class="ans">predicted: {html_list(predicted)} · gold: {html_list(gold)}</span>'
            f'</summary><div class="metas">{meta_html}</div>'
            f"{render_chat(r.get('messages'))}</details>"
        )
    return "".join(out)


def render_sample(sample: Sample, run_dir: Path) -> str:
    where = rel_path(sample.path, run_dir)
    state = "rejected" if sample.rejected else "accepted"
    if sample.path.name == "predictions.parquet":
        state = "predictions"
    head = (
        f'<h4 class="sample {state}" data-kind="{esc(sample.kind)}" data-total="{sample.total}" '
        f'data-shown="{len(sample.rows)}">{esc(state)}: <code>{esc(where)}</code> — '
        f"{len(sample.rows):,} of {sample.total:,} rows</h4>"
    )
    if sample.error:
        return head + f'<p class="note">{esc(sample.error)}</p>'
    if not sample.rows:
        return head + '<p class="note">no rows</p>'
    if sample.kind == "walks":
        body = render_walks(sample.rows, sample.rejected)
    elif sample.kind == "questions":
        body = render_questions(sample.rows, sample.rejected)
    else:
        body = render_trajectories(sample.rows, sample.kind)
    return head + body


def render_eval_rows(rows: list[dict[str, Any]]) -> str:
    """Evaluation rows (``kgsynth.eval.compare_runs``) as a table: every shown metric with its
    95 % interval."""
    from kgsynth.eval.compare import ci_cell
    from kgsynth.eval.config import METRIC_NAMES, SHOWN_METRICS

    head = ["run", "questions", "runs", *(METRIC_NAMES[k] for k in SHOWN_METRICS)]
    body = [
        [esc(r.get("label")), esc(r.get("questions")), esc(r.get("runs"))]
        + [esc(ci_cell(r.get(k), (r.get("ci95") or {}).get(k))) for k in SHOWN_METRICS]
        for r in rows
    ]
    return html_table(head, body, cls="rows metrics")
