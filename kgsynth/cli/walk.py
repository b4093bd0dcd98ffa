"""``kgsynth walk``: constrained random walks with exact answer sets (GraphWalker CRW)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kgsynth.cli.common import fail, open_kg_option, progress_bar, stderr, stdout
from kgsynth.cli.fields import config_command
from kgsynth.cli.options import (
    ConfigOption,
    KGOption,
    ProfileOption,
)
from kgsynth.cli.panels import OUTPUT, WALKS
from kgsynth.core.errors import KGSynthError
from kgsynth.walk import WalkConfig


@config_command(WalkConfig, section="walk", panel=WALKS)
def walk_cmd(
    cfg: WalkConfig,
    out_path: Annotated[
        Path,
        typer.Option("--out", help="Output Parquet file (walks.parquet).", rich_help_panel=OUTPUT),
    ],
    kg: KGOption = None,
    profile: ProfileOption = None,
    config: ConfigOption = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Replace an existing output, and discard chunks of an interrupted run "
            "instead of resuming.",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
) -> None:
    """Sample constrained random walks with exact answer sets (GraphWalker CRW)."""
    import pyarrow.parquet as pq

    from kgsynth.core.manifest import sha256_file
    from kgsynth.core.plots import walk_stats_png
    from kgsynth.core.stage_io import StagedOutput, stats_png
    from kgsynth.walk import parts_dir, run

    inputs = {
        "--kg": kg,
        "--relations": cfg.relations,
        "--exclude-relations": cfg.exclude_relations,
    }
    inputs |= {"--seeds": cfg.seeds, "--config": config}
    inputs |= {"--relations-from": cfg.relations_from, "--seeds-from": cfg.seeds_from}
    staged = StagedOutput(
        out_path, overwrite=overwrite, inputs=inputs, cleanup=[parts_dir(out_path)]
    )
    try:
        with staged:
            graph = open_kg_option(kg, profile)
            with progress_bar("walks") as bar:
                task = bar.add_task("walk", total=cfg.n, info="")
                result = run(
                    None,
                    cfg,
                    graph=graph,
                    chunks=parts_dir(out_path),
                    overwrite=overwrite,
                    progress=lambda done, _, info: bar.update(task, completed=done, info=info),
                )
            pq.write_table(result.accepted, staged.path())
            walk_stats_png(result.accepted, staged.stats_png(), result.stats["relations_available"])
            output = {"path": str(out_path), "rows": result.accepted.num_rows}
            output |= {"sha256": sha256_file(staged.path()), "stats_png": str(stats_png(out_path))}
            manifest = staged.write_manifest(
                "walk", cfg, kg=graph.describe(), output=output, **result.stats
            )
            staged.commit()
    except KGSynthError as exc:
        fail(exc)
    stdout.print(
        f"{manifest['accepted']:,} walks in {manifest['elapsed_s']:.1f}s from {manifest['attempts']:,} attempts "
        f"→ {out_path}; by structure {manifest['accepted_by_structure']}; rejects {manifest['rejects']}",
        highlight=False,
    )
    if manifest["exhausted_structures"]:
        stderr.print(
            f"[yellow]warning:[/yellow] gave up on {', '.join(manifest['exhausted_structures'])}: "
            "this KG rarely satisfies them under the current constraints",
            highlight=False,
        )
