"""``kgsynth filter``: outcome, grounding, format, leak, length, contamination, duplicate,
cap and balance filters over trajectories; the accepted corpus and the rejects.

The command builds its :class:`~kgsynth.filter.FilterConfig` (one flag per field), reads the
``--in`` files, calls :func:`kgsynth.filter.run`, writes the corpus folder through
:class:`~kgsynth.core.stage_io.StagedOutput` and prints one summary line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kgsynth.cli.common import fail, stderr, stdout
from kgsynth.cli.fields import config_command
from kgsynth.cli.options import ConfigOption, OverwriteOption
from kgsynth.cli.panels import FILTERS, INPUTS, OUTPUT
from kgsynth.core.errors import KGSynthError
from kgsynth.filter.config import FilterConfig


@config_command(FilterConfig, section="filter", panel=FILTERS)
def filter_cmd(
    cfg: FilterConfig,
    in_paths: Annotated[
        list[Path],
        typer.Option(
            "--in",
            help="trajectories.parquet from `synthesize trajectories`; repeat to filter several "
            "files as one pool (e.g. free rollouts and expert trajectories).",
            rich_help_panel=INPUTS,
        ),
    ],
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Output folder: accepted.parquet, rejected.parquet, manifest.json, filter_stats.png, README.md (a dataset card).",
            rich_help_panel=OUTPUT,
        ),
    ],
    config: ConfigOption = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Keep trajectories that answer right from observed evidence in a clean format; write
    the rejects with their reason (outcome, grounding, format, reference leak, length,
    contamination, duplicates, per-question cap, balance)."""
    from kgsynth.core.stage_io import StagedOutput
    from kgsynth.filter import CORPUS_FILES, read_inputs, run, write_corpus

    try:
        inputs = [("--in", p) for p in in_paths] + [("--benchmark", b) for b in cfg.benchmark]
        inputs.append(("--config", config))
        staged = StagedOutput(
            out_dir, folder=True, overwrite=overwrite, names=CORPUS_FILES, inputs=inputs
        )
        with staged, stderr.status("reading…") as status:

            def progress(done: int, total: int, info: str) -> None:
                status.update(f"{info}…")

            table, read = read_inputs(in_paths, progress)
            result = run(table, cfg, progress=progress, source=read.source)
            del table  # the input's memory, before the outputs are written
            manifest = write_corpus(staged, read, result, cfg, progress)
            staged.commit()
    except KGSynthError as exc:
        fail(exc)
    rejects = {k: v for k, v in manifest["rejects"].items() if v}
    copies = manifest.get("upsampled_rows") or 0
    extra = f" + {copies:,} upsampled copies" if copies else ""
    stdout.print(
        f"{manifest['accepted']:,} of {manifest['rows_in']:,} trajectories accepted{extra} "
        f"→ {out_dir / 'accepted.parquet'} ({manifest['rejected']:,} rejected: {rejects}); "
        f"{manifest['elapsed_s']:.1f}s",
        highlight=False,
    )
