"""The page's building blocks: escaped text, numbers, lists, tables, embedded PNG figures
and inline SVG curves. Every text from the run goes through :func:`esc`."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

from kgsynth.report.contents import MAX_LIST_ITEMS, MAX_MESSAGE_CHARS, Curve


def esc(value: Any) -> str:
    """Any value as HTML text, quotes included (safe in attributes too)."""
    return escape("" if value is None else str(value), quote=True)


def fmt_num(n: int | float) -> str:
    return f"{n:,}" if isinstance(n, int) else f"{n:,.4g}"


def fmt_scalar(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return esc(value)
    if isinstance(value, int | float):
        return esc(fmt_num(value))
    return esc(value)


def slug(text: str) -> str:
    return "stage-" + re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")


def data_uri(path: Path) -> str:
    """A PNG file as a ``data:`` URI."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def figure(path: Path, alt: str) -> str:
    try:
        uri = data_uri(path)
    except OSError as exc:
        return f'<p class="note">{esc(path.name)}: not readable ({esc(exc)})</p>'
    return (
        f'<figure><img src="{uri}" alt="{esc(alt)}" loading="lazy">'
        f"<figcaption>{esc(path.name)}</figcaption></figure>"
    )


def html_list(values: Any, limit: int = MAX_LIST_ITEMS) -> str:
    if not isinstance(values, list | tuple):
        return esc(values)
    shown = ", ".join(esc(v) for v in values[:limit])
    more = f' <span class="more">… {len(values) - limit} more</span>' if len(values) > limit else ""
    return shown + more


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> tuple[str, int]:
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)


def html_table(
    head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "rows", ident: str = ""
) -> str:
    """A table of ``head`` (escaped here) over ``rows`` (cells already HTML)."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    attr = f' id="{esc(ident)}"' if ident else ""
    return f'<table class="{cls}"{attr}><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def kv_table(items: Iterable[tuple[str, Any]]) -> str:
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{fmt_scalar(v)}</td></tr>" for k, v in items)
    return f'<table class="kv">{rows}</table>' if rows else ""


CURVE_COLOURS = ("#2b6cb0", "#dd6b20")


def svg_curve(curve: Curve, width: int = 640, height: int = 200) -> str:
    """An inline SVG line chart of one series (no scripts, no external references)."""
    return svg_lines(curve.name, [("", curve)], width, height)


def svg_lines(
    name: str, series: Sequence[tuple[str, Curve]], width: int = 640, height: int = 200
) -> str:
    """One chart of several ``(label, curve)`` series over shared axes, each in its colour
    (:data:`CURVE_COLOURS`, in turn), labelled in the title when there are several."""
    pts = [p for _, c in series for p in c.points]
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

    lines, legend = [], []
    for i, (label, curve) in enumerate(series):
        colour = CURVE_COLOURS[i % len(CURVE_COLOURS)]
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in curve.points)
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
            f'data-series="{esc(label or curve.name)}" points="{line}"/>'
        )
        legend.append(f"{label}: {len(curve.points)} points" if label else "")
    caption = (
        f"{name} ({len(series[0][1].points)} points)"
        if len(series) == 1
        else f"{name} ({'; '.join(legend)})"
    )
    return (
        f'<svg class="curve" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{esc(name)} by step</title>"
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>'
        + "".join(lines)
        + f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{esc(f"{y1:.4g}")}</text>'
        f'<text x="{left - 4}" y="{top + h}" text-anchor="end">{esc(f"{y0:.4g}")}</text>'
        f'<text x="{left}" y="{height - 8}">{esc(f"step {x0:g}")}</text>'
        f'<text x="{left + w}" y="{height - 8}" text-anchor="end">{esc(f"{x1:g}")}</text>'
        f'<text x="{left + w / 2}" y="14" text-anchor="middle">{esc(caption)}</text></svg>'
    )


def rel_path(path: Path, run_dir: Path) -> str:
    try:
        return str(path.relative_to(run_dir))
    except ValueError:
        return str(path)
