"""``kgsynth synthesize``: questions from walks, trajectories from questions.

Each command builds its config (one flag per field of :class:`QuestionConfig` /
:class:`TrajectoryConfig`), reads its input through :mod:`kgsynth.core.stage_io`, opens the LLM (and
the KG), calls the stage's ``run``, writes the rows, their rejects and the manifest, and prints
one summary line."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from kgsynth.cli.common import (
    check_fraction,
    check_llm_failures,
    fail,
    make_stage_llm,
    model_carries,
    open_graph_option,
    progress_bar,
    stderr,
    stdout,
)
from kgsynth.cli.fields import config_command
from kgsynth.cli.options import (
    ApiKeyOption,
    BaseUrlOption,
    CacheOption,
    ConcurrencyOption,
    ConfigOption,
    DeviceOption,
    KGOption,
    LLMOption,
    MaxFailedFractionOption,
    MaxRetriesOption,
    ModelOption,
    NoCacheOption,
    OverwriteOption,
    ProfileOption,
    TimeoutOption,
)
from kgsynth.cli.panels import INPUTS, OUTPUT, SYNTHESIS, command
from kgsynth.core.errors import KGSynthError
from kgsynth.core.stage import StageResult
from kgsynth.core.stage_io import StagedOutput
from kgsynth.core.stage_rows import read_rows, write_rows
from kgsynth.synthesize.questions import QuestionConfig
from kgsynth.synthesize.trajectory_config import TrajectoryConfig

synth_app = typer.Typer(
    help="Synthesize questions (and trajectories) from walks.", no_args_is_help=True
)


def _bench_guard(benchmark: list[Path] | None) -> tuple[Any, int]:
    """The contamination guard's score function over the ``--benchmark`` questions (None
    without any), and how many benchmark questions there are."""
    from kgsynth.datasets.contamination import benchmark_guard

    return benchmark_guard(benchmark or [], lambda text: stderr.print(f"{text}…"))


def _write(
    staged: StagedOutput,
    stage: str,
    cfg: Any,
    result: StageResult,
    schemas: tuple[Any, Any],
    source: tuple[str, Path, int],
    client: Any,
    max_failed_fraction: float,
    started: float,
    *,
    kg: dict[str, Any] | None = None,
    benchmarks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The stage's rows, its rejects and its manifest into ``staged``, committed; returns the
    manifest. ``source``: the input's name, path and the rows the stage used."""
    from kgsynth.core.manifest import sha256_file

    rejected = result.rejected_rows()
    rejected_path = write_rows(staged, result.accepted, schemas[0], rejected, schemas[1])
    name, path, rows = source
    fields: dict[str, Any] = {
        "input": {name: str(path), "sha256": sha256_file(path), "rows": rows},
        "output": {
            "path": str(staged.out),
            "rows": len(result.accepted),
            "rejected_path": str(rejected_path),
            "rejected_rows": len(rejected),
        },
    }
    if kg is not None:
        fields["kg"] = kg
    fields["llm"] = client.describe()
    fields["max_failed_fraction"] = max_failed_fraction
    fields["made_by_templates"] = client.backend == "template"
    if benchmarks is not None:
        fields["benchmarks"] = benchmarks
    fields["elapsed_s"] = round(time.perf_counter() - started, 3)
    manifest = staged.write_manifest(stage, cfg, **fields, **result.stats)
    staged.commit()
    client.close()
    return manifest


@command(synth_app, "questions")
@config_command(QuestionConfig, section="questions", panel=SYNTHESIS)
def synthesize_questions_cmd(
    # The LLM client's flags are repeated in each command on purpose: typer reads a command's
    # flags from its own parameters; their declarations are shared (kgsynth.cli.options).
    cfg: QuestionConfig,
    walks: Annotated[
        Path,
        typer.Option("--walks", help="walks.parquet from `kgsynth walk`.", rich_help_panel=INPUTS),
    ],
    out_path: Annotated[
        Path, typer.Option("--out", help="Output questions.parquet.", rich_help_panel=OUTPUT)
    ],
    llm: LLMOption = "template",
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    concurrency: ConcurrencyOption = 16,
    timeout: TimeoutOption = 120.0,
    max_retries: MaxRetriesOption = 5,
    cache: CacheOption = None,
    no_cache: NoCacheOption = False,
    benchmark: Annotated[
        list[Path] | None,
        typer.Option(
            help="Benchmark question file(s) (MetaQA txt, JSONL, Parquet, or WebQSP/CWQ/GrailQA/"
            "GraphQuestions .json) for the contamination guard; repeatable.",
            rich_help_panel=INPUTS,
        ),
    ] = None,
    max_failed_fraction: MaxFailedFractionOption = 0.5,
    config: ConfigOption = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Write one question per walk (intermediates masked), then parse, leakage, quality and
    contamination filters."""
    from kgsynth.core.schema import QUESTION_SCHEMA, REJECTED_QUESTION_SCHEMA, WALK_SCHEMA
    from kgsynth.synthesize import questions

    started = time.perf_counter()
    inputs = [("--walks", walks), ("--cache", cache), ("--config", config)]
    inputs += [("--benchmark", b) for b in benchmark or []]
    try:
        with StagedOutput(out_path, overwrite=overwrite, inputs=inputs) as staged:
            check_fraction("--max-failed-fraction", max_failed_fraction)
            rows = read_rows(walks, "--walks", questions.WALK_COLUMNS, "kgsynth walk", WALK_SCHEMA)
            client = make_stage_llm(
                llm, out_path, cache=cache, no_cache=no_cache, model=model, base_url=base_url,
                api_key=api_key, concurrency=concurrency, timeout=timeout, max_retries=max_retries,
            )  # fmt: skip
            guard, bench_count = _bench_guard(benchmark)
            with progress_bar() as bar:
                tasks: dict[str, int] = {}
                t0 = time.perf_counter()

                def progress(done: int, total: int, phase: str) -> None:
                    if phase not in tasks:
                        tasks[phase] = bar.add_task(phase, total=total, info="")
                    st = client.stats
                    rate = st.requests / max(1e-6, time.perf_counter() - t0)
                    info = f"{rate:.1f} req/s, cache hits {st.cache_hits}, errors {st.errors}"
                    bar.update(tasks[phase], completed=done, info=info)

                result = questions.run(
                    rows, cfg, llm=client, max_similarity=guard, progress=progress
                )
            manifest = _write(
                staged,
                "synthesize questions",
                cfg,
                result,
                (QUESTION_SCHEMA, REJECTED_QUESTION_SCHEMA),
                ("walks", walks, result.stats["walks"]),
                client,
                max_failed_fraction,
                started,
                benchmarks={"files": [str(b) for b in benchmark or []], "questions": bench_count},
            )
        stdout.print(
            f"{manifest['accepted']:,} questions from {manifest['walks']:,} walks → {out_path} "
            f"({manifest['rejected']:,} rejected: {manifest['rejects']}); "
            f"LLM {manifest['llm']['backend']}: {manifest['llm']['stats']['cache_hits']} cache "
            f"hits, {manifest['llm']['stats']['cache_misses']} requests; "
            + (f"contamination {manifest['contamination']}; " if manifest["contamination"] else "")
            + f"{manifest['elapsed_s']:.1f}s",
            highlight=False,
        )
        check_llm_failures(client, max_failed_fraction, out_path, "synthesize questions")
    except KGSynthError as exc:
        fail(exc)


QuestionsOption = Annotated[
    Path,
    typer.Option(
        "--questions",
        help="questions.parquet from `synthesize questions`, or a benchmark's .json "
        "(WebQSP, CWQ, GrailQA, GraphQuestions: its gold logical forms are the oracle's "
        "and the references' actions).",
        rich_help_panel=INPUTS,
    ),
]


@command(synth_app, "trajectories")
@config_command(TrajectoryConfig, section="trajectories", carried=model_carries, panel=SYNTHESIS)
def synthesize_trajectories_cmd(
    cfg: TrajectoryConfig,
    questions: QuestionsOption,
    out_path: Annotated[
        Path, typer.Option("--out", help="Output trajectories.parquet.", rich_help_panel=OUTPUT)
    ],
    kg: KGOption = None,
    profile: ProfileOption = None,
    llm: LLMOption = "template",
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    concurrency: ConcurrencyOption = 16,
    timeout: TimeoutOption = 120.0,
    max_retries: MaxRetriesOption = 5,
    cache: CacheOption = None,
    no_cache: NoCacheOption = False,
    max_failed_fraction: MaxFailedFractionOption = 0.5,
    device: DeviceOption = None,
    config: ConfigOption = None,
    overwrite: OverwriteOption = False,
    given_flags: frozenset[str] = frozenset(),
) -> None:
    """Agent trajectories from questions: oracle replays, referenced rejection sampling, or
    free rollouts, through the real KG tools."""
    from kgsynth.agent.strategies import round_trips
    from kgsynth.core.schema import REJECTED_TRAJECTORY_SCHEMA, TRAJECTORY_SCHEMA

    started = time.perf_counter()
    inputs = {
        "--questions": questions,
        "--kg": kg,
        "--model": model if llm == "hf" else None,
        "--cache": cache,
        "--config": config,
    }
    try:
        with StagedOutput(out_path, overwrite=overwrite, inputs=inputs) as staged:
            check_fraction("--max-failed-fraction", max_failed_fraction)
            graph = open_graph_option(kg, profile)
            rows, bench_info = _question_rows(questions, graph, cfg)
            # the focus ranking's round-trip words, read from these questions' walks where the
            # agent config leaves them unset (recorded in the manifest, carried by the models)
            cfg = round_trips.with_round_trip_words(cfg, rows)
            client = make_stage_llm(
                llm, out_path, cache=cache, no_cache=no_cache, model=model, base_url=base_url,
                api_key=api_key, concurrency=concurrency, timeout=timeout, max_retries=max_retries,
                device=device, workers=cfg.workers,
            )  # fmt: skip
            stored = None  # the prompt an hf checkpoint was trained with, unless --system-prompt
            if llm == "hf" and "system_prompt" not in given_flags:
                from kgsynth.agent.loop import stored_system_prompt

                stored = stored_system_prompt(model)
            result = _sample_trajectories(rows, cfg, graph, client, stored)
            manifest = _write(
                staged,
                "synthesize trajectories",
                cfg,
                result,
                (TRAJECTORY_SCHEMA, REJECTED_TRAJECTORY_SCHEMA),
                ("questions", questions, result.stats["questions"]),
                client,
                max_failed_fraction,
                started,
                kg=graph.kg.describe(),
                benchmarks=bench_info,
            )
        stdout.print(
            f"{manifest['trajectories']:,} {cfg.mode} trajectories from "
            f"{manifest['questions']:,} questions → {out_path} ({manifest['rejected']:,} "
            f"rejected: {manifest['rejects']}); mean turns {manifest['mean_turns']}, tool errors "
            f"{manifest['tool_errors']}, format errors {manifest['format_errors']}; "
            f"{manifest['elapsed_s']:.1f}s",
            highlight=False,
        )
        check_llm_failures(client, max_failed_fraction, out_path, "synthesize trajectories")
    except KGSynthError as exc:
        fail(exc)


def _question_rows(
    questions: Path, graph: Any, cfg: TrajectoryConfig
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The questions to make trajectories for, and (for a benchmark's .json: WebQSP, CWQ,
    GrailQA or GraphQuestions) what the manifest records of the file; None otherwise."""
    from kgsynth.core.schema import QUESTION_SCHEMA
    from kgsynth.datasets.benchmarks import read_benchmark
    from kgsynth.synthesize import trajectories
    from kgsynth.synthesize.benchmark_questions import benchmark_question_rows, is_benchmark_file

    if not is_benchmark_file(questions):
        rows = read_rows(
            questions,
            "--questions",
            trajectories.input_columns(cfg),
            "kgsynth synthesize questions",
            QUESTION_SCHEMA,
        )
        return rows, None
    records = read_benchmark(questions)
    rows, left_out = benchmark_question_rows(records, graph, cfg.agent.toolset, cfg.mode)
    bench_info = {
        "file": str(questions),
        "format": records[0].source_format if records else None,
        "questions": len(records),
        "usable": len(rows),
        "left_out": dict(left_out),
    }
    stdout.print(
        f"{len(rows):,} of {len(records):,} benchmark questions usable in "
        f"{cfg.mode} mode with --toolset {cfg.agent.toolset} (left out: {dict(left_out)})",
        highlight=False,
    )
    return rows, bench_info


def _sample_trajectories(
    rows: list[dict[str, Any]],
    cfg: TrajectoryConfig,
    graph: Any,
    client: Any,
    system_text: str | None,
) -> StageResult:
    """The stage's trajectories, with a progress bar of turns, episodes and requests."""
    from kgsynth.synthesize import trajectories

    with progress_bar(count=False) as bar:
        task = bar.add_task(cfg.mode, total=None, info="")

        def progress(done: int, total: int, phase: str) -> None:
            st = client.stats
            what = f"turn {done}, {total} episodes active" if phase == "turn" else f"thought {done}"
            bar.update(
                task,
                info=f"{what}; requests {st.requests}, cache hits {st.cache_hits}, errors {st.errors}",
            )

        return trajectories.run(
            rows, cfg, graph=graph, llm=client, progress=progress, system_text=system_text
        )
