"""``kgsynth report``: one self-contained HTML page for a run folder (see :mod:`kgsynth.report`).

Parses options, collects the run, renders the page and writes it (all at once, refusing to
replace an existing file without ``--overwrite``)::

    kgsynth report runs/x                      # runs/x/report.html
    kgsynth report runs/x --out /tmp/x.html --samples 12 --overwrite
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kgsynth.cli.common import fail, stderr, stdout
from kgsynth.cli.options import OverwriteOption
from kgsynth.cli.panels import OUTPUT
from kgsynth.core.errors import ConfigError, KGSynthError


def report_cmd(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="The run folder (kg/, walks/, questions/, …, eval/, summary/).", show_default=False
        ),
    ],
    out_path: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="The HTML file to write. \\[default: RUN_DIR/report.html]",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    samples: Annotated[
        int,
        typer.Option(
            help="Rows shown per data file (accepted and rejected each).", rich_help_panel=OUTPUT
        ),
    ] = 24,
    seed: Annotated[int, typer.Option(help="Seed of the row picks.", rich_help_panel=OUTPUT)] = 0,
    overwrite: OverwriteOption = False,
) -> None:
    """Write one self-contained HTML page for a run: each stage's manifest summary, funnel
    and plots, samples of walks, questions and trajectories (accepted and rejected), training
    curves and the evaluation comparison. The page loads nothing from the network."""
    try:
        _report(run_dir, out_path, samples, seed, overwrite)
    except KGSynthError as exc:
        fail(exc)


def _report(run_dir: Path, out_path: Path | None, samples: int, seed: int, overwrite: bool) -> None:
    from kgsynth.core.stage_io import StagedOutput
    from kgsynth.report import collect_run, render_html

    if samples < 1:
        raise ConfigError(f"--samples must be >= 1 (got {samples})")
    target = out_path if out_path is not None else run_dir / "report.html"
    if target.suffix.lower() not in (".html", ".htm"):
        # the report never replaces a stage's own files, whatever --overwrite says
        raise ConfigError(f"--out: {target} must name an .html file")
    with stderr.status(f"reading {run_dir}…"):
        report = collect_run(run_dir, samples=samples, seed=seed)
        page = render_html(report)
    with StagedOutput(target, overwrite=overwrite) as staged:
        staged.path().write_text(page, encoding="utf-8")
        staged.commit()
    found = len(report.stages)
    missing = f", {len(report.missing)} missing" if report.missing else ""
    stdout.print(
        f"→ {target} ({len(page.encode()) / 1e6:.2f} MB; {found} stages{missing})",
        highlight=False,
    )


__all__ = ["report_cmd"]
