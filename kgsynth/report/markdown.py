"""A small markdown subset as HTML (what ``kgsynth eval --compare`` writes): headings, pipe
tables, images, list items, paragraphs, ``code``."""

from __future__ import annotations

import re
from pathlib import Path

from kgsynth.report.elements import esc, figure, html_table

_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def md_images(text: str) -> set[str]:
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
                out.append(figure(local, image.group(1)))
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
                    html_table(
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
