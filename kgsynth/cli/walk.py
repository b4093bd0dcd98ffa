"""``kgsynth walk``: constrained random walks with exact answer sets (GraphWalker CRW)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from kgsynth.cli.common import (
    err,
    fail,
    open_kg_option,
    out,
    progress_bar,
)
from kgsynth.cli.fields import config_command
from kgsynth.cli.options import (
    ConfigOption,
    KGOption,
    ProfileOption,
)
from kgsynth.errors import KGSynthError
from kgsynth.walk import WalkConfig


@config_command(WalkConfig, section="walk")
def walk_cmd(
    cfg: WalkConfig,
    out_path: Annotated[Path, typer.Option("--out", help="Output Parquet file (walks.parquet).")],
    kg: KGOption = None,
    profile: ProfileOption = None,
    config: ConfigOption = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Replace an existing output, and discard chunks of an interrupted run "
            "instead of resuming."
        ),
    ] = False,
) -> None:
    """Sample constrained random walks with exact answer sets (GraphWalker CRW)."""
    from kgsynth.manifest import sha256_file, write_manifest
    from kgsynth.plots import walk_stats_png
    from kgsynth.stage_io import StagedOutput, stats_png
    from kgsynth.walk import parts_dir, run_walks

    try:
        staged = StagedOutput(
            out_path,
            overwrite=overwrite,
            inputs={
                "--kg": kg,
                "--relations": cfg.relations,
                "--exclude-relations": cfg.exclude_relations,
                "--seeds": cfg.seeds,
                "--config": config,
            },
            cleanup=[parts_dir(out_path)],
        )
        with staged:
            graph = open_kg_option(kg, profile)
            with progress_bar("walks") as bar:
                task = bar.add_task("walk", total=cfg.n, info="")

                def progress(state, accepted: int) -> None:
                    if state.next_attempt % 25 == 0 or accepted == cfg.n:
                        rejected = sum(state.rejects.values())
                        bar.update(
                            task,
                            completed=accepted,
                            info=f"accepted {accepted} rejected {rejected}",
                        )

                result = run_walks(
                    graph,
                    cfg,
                    out_path,
                    write_to=staged.path(),
                    overwrite=overwrite,
                    progress=progress,
                )
            table = result.pop("table")
            walk_stats_png(table, staged.stats_png(), result["relations_available"])
            relation_use: dict[str, int] = {}
            for branch_list in table.column("branches").to_pylist():
                for branch in branch_list:
                    for hop in branch:
                        relation_use[hop["relation"]] = relation_use.get(hop["relation"], 0) + 1
            manifest = write_manifest(
                staged.sidecar("manifest.json"),
                stage="walk",
                config=dataclasses.asdict(cfg),
                kg=graph.describe(),
                output={
                    "path": str(out_path),
                    "rows": table.num_rows,
                    "sha256": sha256_file(staged.path()),
                    "stats_png": str(stats_png(out_path)),
                },
                relation_coverage={
                    "used": len(relation_use),
                    "hops_per_relation": dict(sorted(relation_use.items())),
                },
                **result,
            )
            staged.commit()
    except KGSynthError as exc:
        fail(exc)
    out.print(
        f"{manifest['accepted']:,} walks in {manifest['elapsed_s']:.1f}s from {manifest['attempts']:,} attempts "
        f"→ {out_path}; by structure {manifest['accepted_by_structure']}; rejects {manifest['rejects']}",
        highlight=False,
    )
    if manifest["exhausted_structures"]:
        err.print(
            f"[yellow]warning:[/yellow] gave up on {', '.join(manifest['exhausted_structures'])}: "
            "this KG rarely satisfies them under the current constraints",
            highlight=False,
        )
