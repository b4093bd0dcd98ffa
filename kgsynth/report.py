"""Run report: a run folder → one self-contained HTML page.

Reads what the stages of a run wrote (``kg/``, ``walks/``, ``questions/``, ``trajectories/``,
``corpus/``, ``stage1/``, ``stage2_data/``, ``corpus_stage2/``, ``stage2/``, ``rl/``,
``eval/<label>/``, ``summary/``) and renders, in pipeline order, each stage's manifest summary,
its funnel (attempted → accepted, rejects by reason), its plots (PNG files embedded as base64
data URIs), training curves (the stage's PNG, else an inline SVG drawn from ``metrics.jsonl``),
seeded samples of walks, questions and trajectories (accepted and rejected, with their reasons;
trajectories as chat turns inside ``<details>``) and the evaluation comparison. The page loads
nothing: CSS and JS are inline, and every text from the run is escaped with
:func:`html.escape`. Missing stages get one line saying so::

    kgsynth report runs/x                        # writes runs/x/report.html
    kgsynth report runs/x --out /tmp/x.html --samples 12 --seed 1

:func:`collect_run` gathers a :class:`RunReport` (raising :class:`ConfigError` for a folder that
is not a run); :func:`render_html` turns it into the page. Both are pure apart from reading.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

from kgsynth.errors import ConfigError, KGSynthError

log = logging.getLogger(__name__)

PIPELINE: tuple[tuple[str, str], ...] = (
    ("kg", "Knowledge graph"),
    ("walks", "Walks"),
    ("questions", "Questions"),
    ("trajectories", "Trajectories (stage-1 data)"),
    ("corpus", "Filter: stage-1 corpus"),
    ("stage1", "Stage 1: SFT"),
    ("stage2_data", "Stage-2 data (rejection sampling)"),
    ("corpus_stage2", "Filter: stage-2 corpus"),
    ("stage2", "Stage 2: SFT"),
    ("rl", "RL (GRPO)"),
    ("eval", "Evaluations"),
    ("summary", "Evaluation comparison"),
)
"""The folders of a run in pipeline order, with their titles (the ``make all`` layout)."""

FOLDER_OUTPUT_FILES = ("accepted", "rejected", "predictions")
"""Data files of folder outputs (``filter``, ``eval``): one part with ``manifest.json``."""

MAX_MESSAGE_CHARS = 4000
MAX_LIST_ITEMS = 10
TRAINING = {"stage1", "stage2", "rl"}
SKIP_SUMMARY_KEYS = {"versions", "kg", "config", "command"}


# ---------------------------------------------------------------------------------------------
# what a run holds


@dataclass
class Funnel:
    """A stage's counts: ``attempted`` (named ``attempted_label`` in the manifest) →
    ``accepted``, and the rejects by reason."""

    attempted_label: str
    attempted: int
    accepted: int
    rejects: dict[str, int]

    @property
    def unattributed(self) -> int:
        """Attempts neither accepted nor counted under a reason (0 in a consistent manifest)."""
        return self.attempted - self.accepted - sum(self.rejects.values())


@dataclass
class Sample:
    """Rows picked (seeded) from one Parquet file: ``kind`` is walks, questions, trajectories
    or predictions; ``total`` the file's row count."""

    path: Path
    kind: str
    rejected: bool
    total: int
    rows: list[dict[str, Any]]
    error: str | None = None


@dataclass
class Part:
    """One output of a stage: its manifest (``manifest.json`` or ``NAME.manifest.json``),
    funnel and samples of its data files."""

    name: str
    manifest_path: Path | None
    manifest: dict[str, Any] | None
    funnel: Funnel | None
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None


@dataclass
class Curve:
    """One training series from ``metrics.jsonl``: (step, value) points."""

    name: str
    points: list[tuple[float, float]]


@dataclass
class Stage:
    """One stage folder of the run (``walks``, ``eval/stage1``, …)."""

    key: str
    title: str
    folder: Path
    parts: list[Part]
    plots: list[Path]
    curves: list[Curve]
    eval_rows: list[dict[str, Any]] = field(default_factory=list)
    compare_markdown: str | None = None
    notes: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunReport:
    """Everything the page shows: found stages in pipeline order, and the missing ones."""

    run_dir: Path
    stages: list[Stage]
    missing: list[tuple[str, str]]
    samples: int
    seed: int
    comparison: list[dict[str, Any]] = field(default_factory=list)
    comparison_error: str | None = None


# ---------------------------------------------------------------------------------------------
# collecting


def _read_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except (OSError, ValueError) as exc:
        return None, f"{path.name}: not readable JSON ({exc})"


def _has_manifest(folder: Path) -> bool:
    return (folder / "manifest.json").is_file() or any(folder.glob("*.manifest.json"))


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a kgsynth run: one of the pipeline's folders with a manifest
    (or the KG's ``kg/kg.json``)."""
    if not path.is_dir():
        return False
    if (path / "kg" / "kg.json").is_file():
        return True
    for key, _ in PIPELINE:
        folder = path / key
        if folder.is_dir() and (
            _has_manifest(folder) or any(_has_manifest(d) for d in folder.iterdir() if d.is_dir())
        ):
            return True
    return False


def _first_int(*values: Any) -> int | None:
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def funnel_of(manifest: dict[str, Any]) -> Funnel | None:
    """The funnel a stage manifest records: ``walk`` (attempts), ``synthesize questions``
    (walks in), ``synthesize trajectories`` (trajectories + rejected) and ``filter`` (rows in)
    all store ``accepted``/``rejects``; None for a manifest without rejects (training, eval)."""
    rejects = manifest.get("rejects")
    if not isinstance(rejects, dict):
        return None
    rejects = {str(k): int(v) for k, v in rejects.items() if isinstance(v, int)}
    output = manifest.get("output") if isinstance(manifest.get("output"), dict) else {}
    accepted = _first_int(
        manifest.get("accepted"), manifest.get("trajectories"), output.get("rows")
    )
    if accepted is None:
        return None
    for key, label in (("attempts", "attempts"), ("rows_in", "rows in"), ("walks", "walks in")):
        attempted = _first_int(manifest.get(key))
        if attempted is not None:
            return Funnel(label, attempted, accepted, rejects)
    return Funnel("attempted", accepted + sum(rejects.values()), accepted, rejects)


def _kind(columns: Sequence[str]) -> str | None:
    cols = set(columns)
    if "messages" in cols:
        return "predictions" if "predicted" in cols else "trajectories"
    if "question" in cols:
        return "questions"
    if "branches" in cols:
        return "walks"
    return None


def _round_robin(groups: dict[str, list[int]], n: int, rng: random.Random) -> list[int]:
    """Up to ``n`` indices taking one from each group in turn (so every reason appears)."""
    queues = []
    for key in sorted(groups):
        idx = list(groups[key])
        rng.shuffle(idx)
        queues.append(idx)
    picked: list[int] = []
    while len(picked) < n and any(queues):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop())
    return sorted(picked)


def pick_rows(path: Path, n: int, seed: int) -> Sample:
    """``n`` rows of a Parquet file, picked with ``random.Random(seed)``; rejected rows are
    picked reason by reason in turn, so rare reasons are shown too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rejected = path.name == "rejected.parquet" or path.name.endswith(".rejected.parquet")
    try:
        schema = pq.read_schema(path)
        kind = _kind(schema.names)
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        return Sample(path, "unknown", rejected, 0, [], f"not a readable Parquet file: {exc}")
    if kind is None:
        return Sample(path, "unknown", rejected, table.num_rows, [], "unknown columns")
    rng = random.Random(seed)
    total = table.num_rows
    if rejected and "reject_reason" in table.column_names:
        groups: dict[str, list[int]] = {}
        for i, reason in enumerate(table.column("reject_reason").to_pylist()):
            groups.setdefault(str(reason), []).append(i)
        idx = _round_robin(groups, n, rng)
    else:
        idx = sorted(rng.sample(range(total), min(n, total)))
    return Sample(path, kind, rejected, total, table.take(idx).to_pylist() if idx else [])


def _data_parts(folder: Path) -> list[tuple[str, Path | None, list[Path]]]:
    """(name, manifest, data files) for each output in ``folder``: ``manifest.json`` with
    ``accepted``/``rejected``/``predictions.parquet``, and ``NAME.manifest.json`` with
    ``NAME.parquet`` and ``NAME.rejected.parquet``."""
    parts: dict[str, tuple[Path | None, list[Path]]] = {}
    top = folder / "manifest.json"
    top_files = [folder / f"{n}.parquet" for n in FOLDER_OUTPUT_FILES]
    if top.is_file() or any(p.is_file() for p in top_files):
        parts[""] = (top if top.is_file() else None, [p for p in top_files if p.is_file()])
    stems = {p.name.removesuffix(".manifest.json") for p in folder.glob("*.manifest.json")}
    stems |= {
        p.stem
        for p in folder.glob("*.parquet")
        if not p.name.endswith(".rejected.parquet") and p.stem not in FOLDER_OUTPUT_FILES
    }
    for stem in sorted(stems):
        manifest = folder / f"{stem}.manifest.json"
        files = [folder / f"{stem}.parquet", folder / f"{stem}.rejected.parquet"]
        parts[stem] = (manifest if manifest.is_file() else None, [p for p in files if p.is_file()])
    return [(name, m, files) for name, (m, files) in parts.items()]


def read_curves(path: Path) -> list[Curve]:
    """The ``loss`` and ``reward`` series of a ``metrics.jsonl`` (unreadable lines skipped)."""
    series: dict[str, list[tuple[float, float]]] = {"loss": [], "reward": []}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        step = row.get("step", i)
        for name, points in series.items():
            value = row.get(name)
            if (
                isinstance(value, int | float)
                and isinstance(step, int | float)
                and math.isfinite(value)
            ):
                points.append((float(step), float(value)))
    return [Curve(name, points) for name, points in series.items() if points]


def _collect_stage(key: str, title: str, folder: Path, samples: int, seed: int) -> Stage:
    plots = sorted(p for p in folder.glob("*.png") if p.is_file())
    curves: list[Curve] = []
    if (folder / "metrics.jsonl").is_file() and not plots:
        curves = read_curves(folder / "metrics.jsonl")
    stage = Stage(key, title, folder, [], plots, curves)
    for name, manifest_path, files in _data_parts(folder):
        manifest, error = (None, None)
        if manifest_path is not None:
            manifest, error = _read_json(manifest_path)
            if manifest is not None and not isinstance(manifest, dict):
                manifest, error = None, f"{manifest_path.name}: not a JSON object"
        part = Part(name, manifest_path, manifest, funnel_of(manifest) if manifest else None)
        part.error = error
        for path in files:
            n = samples // 2 if path.name == "predictions.parquet" else samples
            part.samples.append(pick_rows(path, max(n, 1), seed))
        stage.parts.append(part)
    if key == "kg":
        for name in ("kg.json", "../kg_stats.json"):
            data, _ = _read_json(folder / name)
            if isinstance(data, dict):
                stage.info.update({k: v for k, v in data.items() if k != "kg"})
    if key == "summary" and (folder / "compare.md").is_file():
        stage.compare_markdown = (folder / "compare.md").read_text(encoding="utf-8")
        # compare.png is shown where compare.md places it, not again below
        stage.plots = [p for p in stage.plots if p.name not in _md_images(stage.compare_markdown)]
    if (folder / "metrics.json").is_file() and key.startswith("eval/"):
        from kgsynth.eval import compare_runs

        try:
            stage.eval_rows = compare_runs([folder])
        except (KGSynthError, KeyError, TypeError, ValueError) as exc:
            stage.notes.append(f"metrics.json could not be read: {exc}")
    if key != "kg" and not any(p.manifest_path for p in stage.parts):
        what = "training" if key in TRAINING else "the stage"
        stage.notes.append(f"no manifest: {what} has not finished (or did not run)")
    return stage


def collect_run(run_dir: str | Path, *, samples: int = 24, seed: int = 0) -> RunReport:
    """Gather the stages of the run in ``run_dir`` (pipeline order, then any other folder
    holding a manifest), with ``samples`` rows per data file picked by ``Random(seed)``.
    Raises :class:`ConfigError` (naming the path) when ``run_dir`` is not a run folder."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise ConfigError(f"RUN_DIR: {run_dir} does not exist")
    if not is_run_dir(run_dir):
        raise ConfigError(
            f"RUN_DIR: {run_dir} is not a kgsynth run folder (none of "
            f"{', '.join(k + '/' for k, _ in PIPELINE)} holds a manifest)"
        )
    if samples < 1:
        raise ConfigError(f"--samples must be >= 1 (got {samples})")
    stages: list[Stage] = []
    missing: list[tuple[str, str]] = []
    known = {k for k, _ in PIPELINE}
    for key, title in PIPELINE:
        folder = run_dir / key
        if not folder.is_dir():
            missing.append((key, title))
            continue
        if key == "eval":
            labels = sorted(
                d for d in folder.iterdir() if d.is_dir() and not d.name.startswith(".")
            )
            if not labels:
                missing.append((key, title))
            for d in labels:
                stages.append(
                    _collect_stage(f"eval/{d.name}", f"Evaluation: {d.name}", d, samples, seed)
                )
            continue
        stages.append(_collect_stage(key, title, folder, samples, seed))
    for folder in sorted(run_dir.iterdir()):
        if folder.is_dir() and folder.name not in known and _has_manifest(folder):
            stages.append(_collect_stage(folder.name, folder.name, folder, samples, seed))
    report = RunReport(run_dir, stages, missing, samples, seed)
    evals = [s.folder for s in stages if s.key.startswith("eval/") and s.eval_rows]
    summary = next((s for s in stages if s.key == "summary"), None)
    if evals and (summary is None or summary.compare_markdown is None):
        from kgsynth.eval import compare_runs

        try:
            report.comparison = compare_runs(evals)
        except (KGSynthError, KeyError, TypeError, ValueError) as exc:
            report.comparison_error = str(exc)
    log.info("report of %s: %d stages, %d missing", run_dir, len(stages), len(missing))
    return report


# ---------------------------------------------------------------------------------------------
# rendering helpers


def esc(value: Any) -> str:
    """Any value as HTML text, quotes included (safe in attributes too)."""
    return escape("" if value is None else str(value), quote=True)


def _num(n: int | float) -> str:
    return f"{n:,}" if isinstance(n, int) else f"{n:,.4g}"


def _scalar(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return esc(value)
    if isinstance(value, int | float):
        return esc(_num(value))
    return esc(value)


def _slug(text: str) -> str:
    return "stage-" + re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")


def data_uri(path: Path) -> str:
    """A PNG file as a ``data:`` URI."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _img(path: Path, alt: str) -> str:
    try:
        uri = data_uri(path)
    except OSError as exc:
        return f'<p class="note">{esc(path.name)}: not readable ({esc(exc)})</p>'
    return (
        f'<figure><img src="{uri}" alt="{esc(alt)}" loading="lazy">'
        f"<figcaption>{esc(path.name)}</figcaption></figure>"
    )


def _list(values: Any, limit: int = MAX_LIST_ITEMS) -> str:
    if not isinstance(values, list | tuple):
        return esc(values)
    shown = ", ".join(esc(v) for v in values[:limit])
    more = f' <span class="more">… {len(values) - limit} more</span>' if len(values) > limit else ""
    return shown + more


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> tuple[str, int]:
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)


_TAG = re.compile(r"(&lt;(think|kg-query|answer|information)&gt;)(.*?)(&lt;/\2&gt;)", re.DOTALL)


def _message_html(content: str) -> str:
    """Escaped message text with the agent's tags (think, kg-query, answer, information)
    highlighted; the highlighting runs on escaped text, so it adds no markup from the run."""
    text, cut = _clip(content)
    body = _TAG.sub(r'<span class="t-\2">\1\3\4</span>', esc(text))
    if cut:
        body += f'<span class="more"> … [{cut:,} more characters]</span>'
    return body


def svg_curve(curve: Curve, width: int = 640, height: int = 200) -> str:
    """An inline SVG line chart of one series (no scripts, no external references)."""
    pts = curve.points
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    left, right, top, bottom = 56, 12, 20, 28
    w, h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * h

    line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    return (
        f'<svg class="curve" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{esc(curve.name)} by step</title>"
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>'
        f'<polyline fill="none" stroke="#2b6cb0" stroke-width="1.5" points="{line}"/>'
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{esc(f"{y1:.4g}")}</text>'
        f'<text x="{left - 4}" y="{top + h}" text-anchor="end">{esc(f"{y0:.4g}")}</text>'
        f'<text x="{left}" y="{height - 8}">{esc(f"step {x0:g}")}</text>'
        f'<text x="{left + w}" y="{height - 8}" text-anchor="end">{esc(f"{x1:g}")}</text>'
        f'<text x="{left + w / 2}" y="14" text-anchor="middle">{esc(curve.name)} '
        f"({len(pts)} points)</text></svg>"
    )


# ---------------------------------------------------------------------------------------------
# rendering sections


def render_funnel(funnel: Funnel) -> str:
    """Attempted → accepted as bars, then one bar per reject reason (largest first); the
    counts are also in ``data-`` attributes."""
    top = max(funnel.attempted, 1)
    rate = funnel.accepted / funnel.attempted if funnel.attempted else 0.0

    def bar(label: str, n: int, cls: str, attr: str) -> str:
        pct = 100 * n / top
        return (
            f'<tr class="{cls}" {attr}><th>{label}</th><td class="n">{_num(n)}</td>'
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


def _kv_table(items: Iterable[tuple[str, Any]]) -> str:
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{_scalar(v)}</td></tr>" for k, v in items)
    return f'<table class="kv">{rows}</table>' if rows else ""


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
    parts = [_kv_table(scalars)]
    if manifest.get("command"):
        parts.append(f'<pre class="cmd">{esc(manifest["command"])}</pre>')
    config = manifest.get("config")
    if isinstance(config, dict):
        parts.append(
            "<details><summary>config</summary>"
            + _kv_table((k, json.dumps(v) if isinstance(v, dict | list) else v) for k, v in config.items())
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


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "rows") -> str:
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


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
            _list(r.get("answer_names")),
        ]
        + ([_reason(r)] if rejected else [])
        for r in rows
    ]
    return _table(head + (["reject_reason"] if rejected else []), body)


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
            _list(r.get("topic_names")),
            _list(r.get("answer_names")),
        ]
        if rejected:
            cells += [_reason(r), f"<code>{esc(_clip(str(r.get('raw_output') or ''))[0])}</code>"]
        body.append(cells)
    return _table(head, body)


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
            f'<span class="ans">predicted: {_list(predicted)} · gold: {_list(gold)}</span>'
            f'</summary><div class="metas">{meta_html}</div>'
            f"{render_chat(r.get('messages'))}</details>"
        )
    return "".join(out)


def render_sample(sample: Sample, run_dir: Path) -> str:
    where = _rel(sample.path, run_dir)
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


def _rel(path: Path, run_dir: Path) -> str:
    try:
        return str(path.relative_to(run_dir))
    except ValueError:
        return str(path)


def render_eval_rows(rows: list[dict[str, Any]]) -> str:
    """Evaluation rows (``kgsynth.eval.compare_runs``) as a table: every shown metric with its
    95 % interval."""
    from kgsynth.eval import METRIC_NAMES, SHOWN_METRICS, ci_cell

    head = ["run", "questions", "runs", *(METRIC_NAMES[k] for k in SHOWN_METRICS)]
    body = [
        [esc(r.get("label")), esc(r.get("questions")), esc(r.get("runs"))]
        + [esc(ci_cell(r.get(k), (r.get("ci95") or {}).get(k))) for k in SHOWN_METRICS]
        for r in rows
    ]
    return _table(head, body, cls="rows metrics")


# --- a small markdown subset (what ``kgsynth eval --compare`` writes): headings, pipe tables,
# images, list items, paragraphs, `code`


_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def _md_images(text: str) -> set[str]:
    return {m.group(2) for m in _IMAGE.finditer(text)}


def _md_inline(text: str) -> str:
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(
        f"<code>{esc(p[1:-1])}</code>" if p.startswith("`") and p.endswith("`") and len(p) > 1
        else esc(p)
        for p in parts
    )  # fmt: skip


def render_markdown(text: str, folder: Path) -> str:
    """The markdown subset as HTML; a local image (``![x](compare.png)``) is embedded from
    ``folder``, anything else is shown as its alt text."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    para: list[str] = []

    def flush() -> None:
        if para:
            out.append(f"<p>{_md_inline(' '.join(para))}</p>")
            para.clear()

    while i < len(lines):
        line = lines[i].rstrip()
        if not line.strip():
            flush()
            i += 1
            continue
        heading = re.match(r"^(#{1,6})\s+(.*)$", line)
        image = _IMAGE.fullmatch(line.strip())
        if heading:
            flush()
            level = min(len(heading.group(1)) + 2, 6)
            out.append(f"<h{level}>{_md_inline(heading.group(2))}</h{level}>")
        elif image:
            flush()
            name = image.group(2)
            local = folder / name
            if "/" not in name and "://" not in name and local.is_file():
                out.append(_img(local, image.group(1)))
            else:
                out.append(f'<p class="note">[image: {esc(image.group(1))}]</p>')
        elif line.lstrip().startswith("|"):
            flush()
            block = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                block.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            rows = [r for r in block if not all(re.fullmatch(r":?-+:?", c) for c in r)]
            if rows:
                out.append(
                    _table(
                        [c for c in rows[0]],
                        ([_md_inline(c) for c in r] for r in rows[1:]),
                        cls="rows metrics",
                    )
                )
            continue
        elif line.lstrip().startswith("- "):
            flush()
            items = []
            while i < len(lines) and lines[i].lstrip().startswith("- "):
                items.append(f"<li>{_md_inline(lines[i].lstrip()[2:])}</li>")
                i += 1
            out.append(f"<ul>{''.join(items)}</ul>")
            continue
        else:
            para.append(line.strip())
        i += 1
    flush()
    return "".join(out)


def _stage_counts(stage: Stage) -> tuple[str, str, str, str]:
    """(in, accepted, rejected, seconds) for the overview table."""
    funnels = [p.funnel for p in stage.parts if p.funnel]
    manifests = [p.manifest for p in stage.parts if p.manifest]
    seconds = sum(m["elapsed_s"] for m in manifests if isinstance(m.get("elapsed_s"), int | float))
    secs = f"{seconds:,.1f}" if manifests else ""
    if not funnels:
        return "", "", "", secs
    return (
        _num(sum(f.attempted for f in funnels)),
        _num(sum(f.accepted for f in funnels)),
        _num(sum(sum(f.rejects.values()) for f in funnels)),
        secs,
    )


def render_stage(stage: Stage, run_dir: Path) -> str:
    out = [
        f'<section class="stage" id="{esc(_slug(stage.key))}" data-stage="{esc(stage.key)}">',
        f"<h2>{esc(stage.title)} <code>{esc(stage.key)}/</code></h2>",
    ]
    out += [f'<p class="note">{esc(n)}</p>' for n in stage.notes]
    if stage.info:
        relations = stage.info.get("top_relations")
        out.append(
            _kv_table((k, v) for k, v in stage.info.items() if not isinstance(v, dict | list))
        )
        if isinstance(relations, list):
            out.append(
                _table(
                    ["relation", "triples"],
                    ([esc(r.get("relation")), esc(_num(r.get("count", 0)))] for r in relations
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
        out.append(_img(plot, f"{stage.key}: {plot.name}"))
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
"""

JS = """
function setAll(open){document.querySelectorAll('details').forEach(function(d){d.open=open;});}
"""


def render_html(report: RunReport) -> str:
    """The whole page: title, overview (every stage's counts, the missing stages), each stage
    in order and the evaluation comparison."""
    from kgsynth import __version__

    run = str(report.run_dir)
    nav = []
    overview = []
    for stage in report.stages:
        nav.append(f'<li><a href="#{esc(_slug(stage.key))}">{esc(stage.title)}</a></li>')
        overview.append([esc(stage.title), f"<code>{esc(stage.key)}/</code>",
                         *(esc(c) for c in _stage_counts(stage))])  # fmt: skip
    missing = "".join(
        f'<p class="missing" data-missing="{esc(key)}">{esc(title)} (<code>{esc(key)}/</code>): '
        "not in this run, skipped.</p>"
        for key, title in report.missing
    )
    comparison = ""
    if report.comparison:
        comparison = (
            '<section class="stage" id="stage-comparison" data-stage="comparison">'
            "<h2>Evaluation comparison (from eval/*/metrics.json)</h2>"
            + render_eval_rows(report.comparison)
            + "</section>"
        )
    elif report.comparison_error:
        comparison = f'<p class="note">evaluation comparison: {esc(report.comparison_error)}</p>'
    generated = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>kgsynth run report: {esc(run)}</title>",
            f"<style>{CSS}</style><script>{JS}</script></head><body>",
            f"<h1>kgsynth run report: <code>{esc(run)}</code></h1>",
            f'<p class="note">generated {esc(generated)} by kgsynth {esc(__version__)}; '
            f"samples: up to {report.samples} rows per file, picked with seed {report.seed}.</p>",
            '<div class="toolbar"><button type="button" onclick="setAll(true)">expand all'
            '</button><button type="button" onclick="setAll(false)">collapse all</button></div>',
            f"<nav><ol>{''.join(nav)}</ol></nav>",
            '<section id="overview"><h2>Pipeline overview</h2>',
            _table(
                ["stage", "folder", "in", "accepted", "rejected", "seconds"],
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


__all__ = [
    "PIPELINE",
    "Curve",
    "Funnel",
    "Part",
    "RunReport",
    "Sample",
    "Stage",
    "collect_run",
    "data_uri",
    "funnel_of",
    "is_run_dir",
    "pick_rows",
    "read_curves",
    "render_chat",
    "render_funnel",
    "render_html",
    "render_markdown",
    "svg_curve",
]
