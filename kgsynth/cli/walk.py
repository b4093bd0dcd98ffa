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
from kgsynth.cli.options import (
    ConfigOption,
    KGOption,
    ProfileOption,
)
from kgsynth.errors import KGSynthError


def walk_cmd(
    out_path: Annotated[Path, typer.Option("--out", help="Output Parquet file (walks.parquet).")],
    kg: KGOption = None,
    profile: ProfileOption = None,
    n: Annotated[int | None, typer.Option("--n", help="Walks to accept. \\[default: 1000]")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed. \\[default: 0]")] = None,
    structures: Annotated[
        str | None,
        typer.Option(
            help="Structure mix name:weight,… of chain-1..chain-5, 2I, IP, PI. "
            "[default: chain-1:0.1,chain-2:0.25,chain-3:0.25,2I:0.2,IP:0.1,PI:0.1]"
        ),
    ] = None,
    min_fanout: Annotated[
        int | None,
        typer.Option(help="d_min: fewest neighbours along a hop's relation. \\[default: 1]"),
    ] = None,
    max_fanout: Annotated[
        int | None,
        typer.Option(help="d_max: most neighbours along a hop's relation. \\[default: 20]"),
    ] = None,
    max_answers: Annotated[
        int | None, typer.Option(help="Reject walks with more answers. \\[default: 10]")
    ] = None,
    relation_balance: Annotated[
        float | None,
        typer.Option(
            help="Relation weight = frequency ** -balance (0: uniform over relation types). \\[default: 0.5]"
        ),
    ] = None,
    relations: Annotated[
        str | None, typer.Option(help="Whitelist file: relation names, one per line.")
    ] = None,
    exclude_relations: Annotated[
        str | None, typer.Option(help="Blacklist file: relation names, one per line.")
    ] = None,
    seeds: Annotated[
        str | None, typer.Option(help="File of entity names to start walks from.")
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="i/N: this run's share; shards merge without duplicates. \\[default: 0/1]"
        ),
    ] = None,
    chunk_size: Annotated[
        int | None, typer.Option(help="Walks per resumable chunk. \\[default: 250]")
    ] = None,
    max_attempts_per_walk: Annotated[
        int | None,
        typer.Option(
            help="Give a structure up when its attempts exceed this many per accepted walk (+1). \\[default: 500]"
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Processes sampling attempts side by side; the output is the same as with 1. "
            "\\[default: 1]"
        ),
    ] = None,
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
    from kgsynth.config import build_config
    from kgsynth.manifest import sha256_file, write_manifest
    from kgsynth.plots import walk_stats_png
    from kgsynth.stage_io import StagedOutput, stats_png
    from kgsynth.walk import WalkConfig, parts_dir, run_walks

    try:
        cfg = build_config(
            WalkConfig,
            config,
            dict(
                n=n,
                seed=seed,
                structures=structures,
                min_fanout=min_fanout,
                max_fanout=max_fanout,
                max_answers=max_answers,
                relation_balance=relation_balance,
                relations=relations,
                exclude_relations=exclude_relations,
                seeds=seeds,
                shard=shard,
                chunk_size=chunk_size,
                max_attempts_per_walk=max_attempts_per_walk,
                workers=workers,
            ),
            section="walk",
        )
        staged = StagedOutput(
            out_path,
            overwrite=overwrite,
            inputs={
                "--kg": kg,
                "--relations": relations,
                "--exclude-relations": exclude_relations,
                "--seeds": seeds,
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
