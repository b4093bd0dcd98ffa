"""``kgsynth filter``: outcome, grounding, format, leak, length, contamination, duplicate,
cap and balance filters over trajectories; the accepted corpus and the rejects."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer

from kgsynth.cli.common import (
    err,
    fail,
    out,
)
from kgsynth.cli.options import (
    ConfigOption,
    OverwriteOption,
)
from kgsynth.errors import InputFileError, KGSynthError


def filter_cmd(
    in_paths: Annotated[
        list[Path],
        typer.Option(
            "--in",
            help="trajectories.parquet from `synthesize trajectories`; repeat to filter several "
            "files as one pool (e.g. free rollouts and expert trajectories).",
        ),
    ],
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Output folder: accepted.parquet, rejected.parquet, manifest.json, filter_stats.png.",
        ),
    ],
    outcome: Annotated[
        str | None,
        typer.Option(
            help="The answer check: em_strict (predicted set = gold set), hit (some predicted "
            "answer is gold; KnowCoder-A1), f1 (em_strict or F1 >= --f1-threshold; KBQA-R1) or "
            "none. \\[default: f1]"
        ),
    ] = None,
    f1_threshold: Annotated[
        float | None, typer.Option(help="F1 needed with --outcome f1. \\[default: 0.9]")
    ] = None,
    grounding: Annotated[
        bool | None,
        typer.Option(
            "--grounding/--no-grounding",
            help="Every answer must be among the entities the environment returned. \\[default: grounding]",
        ),
    ] = None,
    check_format: Annotated[
        bool | None,
        typer.Option(
            "--check-format/--no-check-format",
            help="Every assistant turn parses (<think> + one action); the last is an <answer>. \\[default: check-format]",
        ),
    ] = None,
    reference_leak: Annotated[
        bool | None,
        typer.Option(
            "--reference-leak/--no-reference-leak",
            help="Reject referenced trajectories whose messages contain the hint text. \\[default: reference-leak]",
        ),
    ] = None,
    leak_min_chars: Annotated[
        int | None,
        typer.Option(
            help="Hint lines at least this long (stripped) count as leaks. \\[default: 12]"
        ),
    ] = None,
    max_chars: Annotated[
        int | None,
        typer.Option(help="Most characters in all messages; 0 for no limit. \\[default: 16000]"),
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option(help="Most assistant turns; 0 for no limit. \\[default: 0]")
    ] = None,
    benchmark: Annotated[
        list[Path] | None,
        typer.Option(
            help="Benchmark question file(s) (MetaQA txt, JSONL, Parquet) for the contamination filter; repeatable."
        ),
    ] = None,
    contamination_threshold: Annotated[
        float | None,
        typer.Option(help="Reject questions at or above this cosine similarity. \\[default: 0.85]"),
    ] = None,
    dedup_actions: Annotated[
        bool | None,
        typer.Option(
            "--dedup-actions/--no-dedup-actions",
            help="Reject a repeat of a question's tool-call sequence. \\[default: dedup-actions]",
        ),
    ] = None,
    max_per_question: Annotated[
        int | None,
        typer.Option(help="Trajectories kept per question; 0 for no cap. \\[default: 3]"),
    ] = None,
    max_per_structure: Annotated[
        int | None,
        typer.Option(help="Trajectories kept per structure; 0 for no cap. \\[default: 0]"),
    ] = None,
    balance: Annotated[
        str | None,
        typer.Option(
            help="structure, hops or none: cap every group at --balance-factor x the smallest. \\[default: none]"
        ),
    ] = None,
    balance_factor: Annotated[
        float | None,
        typer.Option(
            help="Group cap = floor(factor x smallest group), factor >= 1. \\[default: 2]"
        ),
    ] = None,
    config: ConfigOption = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Keep trajectories that answer right from observed evidence in a clean format; write
    the rejects with their reason (outcome, grounding, format, reference leak, length,
    contamination, duplicates, per-question cap, balance)."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kgsynth.config import build_config
    from kgsynth.filter import FilterConfig, filter_stats_png, missing_columns, run_filters
    from kgsynth.manifest import sha256_file, write_manifest
    from kgsynth.schema import TRAJECTORY_SCHEMA
    from kgsynth.stage_io import StagedOutput, recover_input

    started = time.perf_counter()
    try:
        cfg = build_config(
            FilterConfig,
            config,
            dict(
                outcome=outcome,
                f1_threshold=f1_threshold,
                grounding=grounding,
                check_format=check_format,
                reference_leak=reference_leak,
                leak_min_chars=leak_min_chars,
                max_chars=max_chars,
                max_turns=max_turns,
                benchmark=tuple(str(b) for b in benchmark) if benchmark else None,
                contamination_threshold=contamination_threshold,
                dedup_actions=dedup_actions,
                max_per_question=max_per_question,
                max_per_structure=max_per_structure,
                balance=balance,
                balance_factor=balance_factor,
            ),
            section="filter",
        )
        staged = StagedOutput(
            out_dir,
            folder=True,
            overwrite=overwrite,
            names={"accepted.parquet", "rejected.parquet", "filter_stats.png", "manifest.json"},
            inputs=[
                *(("--in", p) for p in in_paths),
                *(("--benchmark", b) for b in cfg.benchmark or ()),
                ("--config", config),
            ],
        )
        with staged:
            for in_path in in_paths:
                recover_input(in_path)
                if not in_path.is_file():
                    raise InputFileError(
                        in_path, "no such file (run `kgsynth synthesize trajectories` first)"
                    )
                try:
                    names = pq.read_schema(in_path).names
                except (pa.ArrowException, OSError) as exc:
                    raise InputFileError(in_path, f"not a readable Parquet file: {exc}") from None
                missing = missing_columns(names)
                if missing:
                    raise InputFileError(
                        in_path, f"missing column(s) {', '.join(missing)}; found {', '.join(names)}"
                    )
            with ThreadPoolExecutor(2) as pool:
                input_shas = [
                    pool.submit(sha256_file, p) for p in in_paths
                ]  # hashlib frees the GIL
                phases: dict[str, float] = {}
                clock = time.perf_counter()
                tables = []
                for in_path in in_paths:
                    with err.status(f"reading {in_path}…"):
                        try:
                            tables.append(pq.read_table(in_path, columns=TRAJECTORY_SCHEMA.names))
                        except (pa.ArrowException, OSError) as exc:
                            raise InputFileError(in_path, f"cannot read the rows: {exc}") from None
                input_rows = [t.num_rows for t in tables]
                try:
                    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
                except pa.ArrowException as exc:
                    raise InputFileError(
                        in_paths[1], f"does not fit {in_paths[0]}'s schema: {exc}"
                    ) from None
                del tables
                phases["read"] = time.perf_counter() - clock
                max_similarity = None
                bench_count = 0
                if cfg.benchmark:
                    from kgsynth.contamination import ContaminationGuard
                    from kgsynth.qafiles import read_question_texts

                    texts = read_question_texts(cfg.benchmark)
                    bench_count = len(texts)
                    with err.status(
                        f"embedding {len(texts):,} benchmark questions (cached after the first run)…"
                    ):
                        clock = time.perf_counter()
                        max_similarity = ContaminationGuard(texts).max_similarity
                        phases["benchmark_embeddings"] = time.perf_counter() - clock
                n_rows = table.num_rows
                with err.status(f"filtering {n_rows:,} trajectories…") as status:
                    accepted, rejected, stats = run_filters(
                        table,
                        cfg,
                        max_similarity=max_similarity,
                        progress=lambda step: status.update(
                            f"filtering {n_rows:,} trajectories: {step}…"
                        ),
                        source=", ".join(str(p) for p in in_paths),
                    )
                del table
                phases["filter"] = stats.pop("elapsed_s")
                paths = {
                    "accepted": out_dir / "accepted.parquet",
                    "rejected": out_dir / "rejected.parquet",
                }

                def write(name: str) -> None:
                    # row groups of 64k rows, so readers of the corpus decode them in parallel
                    rows = accepted if name == "accepted" else rejected
                    pq.write_table(rows, staged.path(paths[name].name), row_group_size=1 << 16)

                with err.status(f"writing {out_dir}…"):
                    clock = time.perf_counter()
                    list(pool.map(write, paths))
                    phases["write"] = time.perf_counter() - clock
                    clock = time.perf_counter()
                    png = out_dir / "filter_stats.png"
                    filter_stats_png(stats, staged.path(png.name))
                    phases["png"] = time.perf_counter() - clock
                    shas = [f.result() for f in input_shas]
            manifest = write_manifest(
                staged.path("manifest.json"),
                stage="filter",
                config=dataclasses.asdict(cfg),
                input={
                    "path": ", ".join(str(p) for p in in_paths),
                    "sha256": shas[0] if len(shas) == 1 else shas,
                    "rows": stats["rows_in"],
                    **(
                        {
                            "files": [
                                {"path": str(p), "sha256": h, "rows": n}
                                for p, h, n in zip(in_paths, shas, input_rows, strict=True)
                            ]
                        }
                        if len(in_paths) > 1
                        else {}
                    ),
                },
                output={
                    "accepted_path": str(paths["accepted"]),
                    "accepted_rows": accepted.num_rows,
                    "rejected_path": str(paths["rejected"]),
                    "rejected_rows": rejected.num_rows,
                    "stats_png": str(png),
                },
                benchmarks={"files": list(cfg.benchmark), "questions": bench_count},
                elapsed_s=round(time.perf_counter() - started, 3),
                seconds_by_phase={k: round(v, 3) for k, v in phases.items()},
                **stats,
            )
            staged.commit()
    except KGSynthError as exc:
        fail(exc)
    rejects = {k: v for k, v in manifest["rejects"].items() if v}
    out.print(
        f"{manifest['accepted']:,} of {manifest['rows_in']:,} trajectories accepted "
        f"→ {paths['accepted']} ({manifest['rejected']:,} rejected: {rejects}); "
        f"{manifest['elapsed_s']:.1f}s",
        highlight=False,
    )
