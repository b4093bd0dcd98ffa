"""``kgsynth report``: one self-contained HTML page for a run folder, or for two runs side by
side (see :mod:`kgsynth.report`).

Parses options, collects the run (or both), renders the page and writes it (all at once,
refusing to replace an existing file without ``--overwrite``)::

    kgsynth report runs/x                      # runs/x/report.html
    kgsynth report runs/x --out /tmp/x.html --samples 12 --overwrite
    kgsynth report runs/x runs/y               # runs/x/compare_y.html
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from kgsynth.cli.common import fail, stderr, stdout
from kgsynth.cli.options import OverwriteOption
from kgsynth.cli.panels import OUTPUT
from kgsynth.core.errors import ConfigError, KGSynthError


def report_cmd(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="The run folder (any layout: its stages are found by their manifests); a second "
            "run folder (RUN_B) compares the two side by side.",
            show_default=False,
            metavar="RUN_DIR",
        ),
    ],
    out_path: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="The HTML file to write. \\[default: RUN_DIR/report.html; for two runs "
            "RUN_DIR/compare_<RUN_B name>.html]",
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
    """Write one self-contained HTML page for a run: the headline numbers first (each
    evaluated model's Hits@1 with its 95 % CI, overall and by hops and type; the corpus and the
    data funnel's counts; training), then each stage's manifest summary, funnel and plots,
    samples of walks, questions and trajectories (accepted and rejected), training curves and
    the evaluation comparison. With two run folders: both runs' headline numbers and their
    difference, funnels side by side, training curves overlaid. The page loads nothing from
    the network."""
    try:
        _report(run_dirs, out_path, samples, seed, overwrite)
    except KGSynthError as exc:
        fail(exc)


def _default_out(run_dirs: list[Path]) -> Path:
    if len(run_dirs) == 1:
        return run_dirs[0] / "report.html"
    other = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_dirs[1].absolute().name).strip("._") or "b"
    return run_dirs[0] / f"compare_{other}.html"


def _report(
    run_dirs: list[Path], out_path: Path | None, samples: int, seed: int, overwrite: bool
) -> None:
    from kgsynth.core.stage_io import StagedOutput
    from kgsynth.report import collect_run, render_html
    from kgsynth.report.compare import render_comparison

    if not 1 <= len(run_dirs) <= 2:
        raise ConfigError(f"RUN_DIR: give one run folder, or two to compare (got {len(run_dirs)})")
    if samples < 1:
        raise ConfigError(f"--samples must be >= 1 (got {samples})")
    target = out_path if out_path is not None else _default_out(run_dirs)
    if target.suffix.lower() not in (".html", ".htm"):
        # the report never replaces a stage's own files, whatever --overwrite says
        raise ConfigError(f"--out: {target} must name an .html file")
    with stderr.status(f"reading {' and '.join(map(str, run_dirs))}…"):
        if len(run_dirs) == 1:
            report = collect_run(run_dirs[0], samples=samples, seed=seed)
            page = render_html(report)
            what = f"{len(report.stages)} outputs" + (
                f", {len(report.missing)} kinds of stage missing" if report.missing else ""
            )
        else:
            a, b = (collect_run(d, samples=0) for d in run_dirs)
            page = render_comparison(a, b)
            what = f"{len(a.stages)} outputs in A, {len(b.stages)} in B"
    with StagedOutput(target, overwrite=overwrite) as staged:
        staged.path().write_text(page, encoding="utf-8")
        staged.commit()
    stdout.print(f"→ {target} ({len(page.encode()) / 1e6:.2f} MB; {what})", highlight=False)


__all__ = ["report_cmd"]
