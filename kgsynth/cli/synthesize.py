"""``kgsynth synthesize``: questions from walks, trajectories from questions."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer

from kgsynth.cli.common import (
    check_count,
    check_fraction,
    check_llm_failures,
    err,
    fail,
    make_stage_llm,
    open_graph_option,
    out,
    progress_bar,
)
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
    MaxTurnsOption,
    ModelOption,
    NoCacheOption,
    OverwriteOption,
    ProfileOption,
    RelationRankingOption,
    RerankOption,
    TimeoutOption,
    ToolsOption,
    TurnTokensOption,
)
from kgsynth.errors import KGSynthError
from kgsynth.stage_io import read_rows, write_rows

synth_app = typer.Typer(
    help="Synthesize questions (and trajectories) from walks.", no_args_is_help=True
)


@synth_app.command("questions")
def synthesize_questions_cmd(
    walks: Annotated[Path, typer.Option("--walks", help="walks.parquet from `kgsynth walk`.")],
    out_path: Annotated[Path, typer.Option("--out", help="Output questions.parquet.")],
    llm: LLMOption = "template",
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    concurrency: ConcurrencyOption = 16,
    timeout: TimeoutOption = 120.0,
    max_retries: MaxRetriesOption = 5,
    cache: CacheOption = None,
    no_cache: NoCacheOption = False,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature. \\[default: 0.7]")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option(help="Tokens per question. \\[default: 128]")
    ] = None,
    min_quality: Annotated[
        float | None,
        typer.Option(
            help="Keep questions whose mean judge score is at least this (0-10). \\[default: 9]"
        ),
    ] = None,
    judge: Annotated[
        bool | None,
        typer.Option(
            "--judge/--no-judge", help="Score questions with the LLM judge. \\[default: judge]"
        ),
    ] = None,
    benchmark: Annotated[
        list[Path] | None,
        typer.Option(
            help="Benchmark question file(s) (MetaQA txt, JSONL, Parquet) for the contamination guard; repeatable."
        ),
    ] = None,
    contamination_threshold: Annotated[
        float | None,
        typer.Option(help="Drop questions at or above this cosine similarity. \\[default: 0.85]"),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Use only the first K walks.")] = None,
    max_failed_fraction: MaxFailedFractionOption = 0.5,
    seed: Annotated[
        int | None, typer.Option(help="Sampling seed sent with requests. \\[default: 0]")
    ] = None,
    config: ConfigOption = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Write one question per walk (intermediates masked), then parse, leakage, quality and
    contamination filters."""

    from kgsynth.config import build_config
    from kgsynth.manifest import sha256_file, write_manifest
    from kgsynth.schema import QUESTION_SCHEMA, REJECTED_QUESTION_SCHEMA, WALK_SCHEMA
    from kgsynth.stage_io import StagedOutput
    from kgsynth.synthesize.questions import QuestionConfig, synthesize_questions

    started = time.perf_counter()
    try:
        cfg = build_config(
            QuestionConfig,
            config,
            dict(
                temperature=temperature,
                max_tokens=max_tokens,
                min_quality=min_quality,
                judge=judge,
                contamination_threshold=contamination_threshold,
                seed=seed,
            ),
            section="questions",
        )
        staged = StagedOutput(
            out_path,
            overwrite=overwrite,
            inputs=[
                ("--walks", walks),
                ("--cache", cache),
                ("--config", config),
                *(("--benchmark", b) for b in benchmark or []),
            ],
        )
        with staged:
            check_count("--limit", limit)
            check_fraction("--max-failed-fraction", max_failed_fraction)
            rows = read_rows(
                walks,
                "--walks",
                {"walk_id", "branches", "topic_names", "answer_names", "merge_at", "structure"},
                "kgsynth walk",
                WALK_SCHEMA,
            )
            if limit is not None:
                rows = rows[:limit]
            client = make_stage_llm(
                llm, out_path, cache=cache, no_cache=no_cache, model=model, base_url=base_url,
                api_key=api_key, concurrency=concurrency, timeout=timeout, max_retries=max_retries,
            )  # fmt: skip
            guard_fn = None
            bench_count = 0
            if benchmark:
                from kgsynth.contamination import ContaminationGuard
                from kgsynth.qafiles import read_question_texts

                texts = read_question_texts(benchmark)
                bench_count = len(texts)
                with err.status(
                    f"embedding {len(texts):,} benchmark questions (cached after the first run)…"
                ):
                    guard = ContaminationGuard(texts)
                guard_fn = guard.max_similarity
            with progress_bar() as bar:
                tasks: dict[str, int] = {}
                counts = {"errors": 0}
                t0 = time.perf_counter()

                def progress(stage: str, i: int, c) -> None:
                    if stage not in tasks:
                        tasks[stage] = bar.add_task(stage, total=len(rows), info="")
                    counts["errors"] += c.error is not None
                    st = client.stats
                    rate = st.requests / max(1e-6, time.perf_counter() - t0)
                    bar.update(
                        tasks[stage],
                        advance=1,
                        info=(
                            f"{rate:.1f} req/s, cache hits {st.cache_hits}, errors {counts['errors']}"
                        ),
                    )

                accepted, rejected, stats = synthesize_questions(
                    rows, cfg, llm=client, max_similarity=guard_fn, progress=progress
                )
            rejected_path = write_rows(
                staged, accepted, QUESTION_SCHEMA, rejected, REJECTED_QUESTION_SCHEMA
            )
            manifest = write_manifest(
                staged.sidecar("manifest.json"),
                stage="synthesize questions",
                config=dataclasses.asdict(cfg),
                input={"walks": str(walks), "sha256": sha256_file(walks), "rows": len(rows)},
                output={
                    "path": str(out_path),
                    "rows": len(accepted),
                    "rejected_path": str(rejected_path),
                    "rejected_rows": len(rejected),
                },
                llm=client.describe(),
                max_failed_fraction=max_failed_fraction,
                made_by_templates=client.backend == "template",
                benchmarks={"files": [str(b) for b in benchmark or []], "questions": bench_count},
                elapsed_s=round(time.perf_counter() - started, 3),
                **stats,
            )
            staged.commit()
            client.close()
    except KGSynthError as exc:
        fail(exc)
    out.print(
        f"{manifest['accepted']:,} questions from {manifest['walks']:,} walks → {out_path} "
        f"({manifest['rejected']:,} rejected: {manifest['rejects']}); "
        f"LLM {manifest['llm']['backend']}: {manifest['llm']['stats']['cache_hits']} cache hits, "
        f"{manifest['llm']['stats']['cache_misses']} requests; "
        + (f"contamination {manifest['contamination']}; " if manifest["contamination"] else "")
        + f"{manifest['elapsed_s']:.1f}s",
        highlight=False,
    )
    try:
        check_llm_failures(client, max_failed_fraction, out_path)
    except KGSynthError as exc:
        fail(exc)


@synth_app.command("trajectories")
def synthesize_trajectories_cmd(
    questions: Annotated[
        Path, typer.Option("--questions", help="questions.parquet from `synthesize questions`.")
    ],
    out_path: Annotated[Path, typer.Option("--out", help="Output trajectories.parquet.")],
    kg: KGOption = None,
    profile: ProfileOption = None,
    mode: Annotated[
        str,
        typer.Option(
            help="oracle (replayed walks + thoughts), referenced (policy sees the gold actions) or free."
        ),
    ] = "oracle",
    llm: LLMOption = "template",
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    concurrency: ConcurrencyOption = 16,
    timeout: TimeoutOption = 120.0,
    max_retries: MaxRetriesOption = 5,
    cache: CacheOption = None,
    no_cache: NoCacheOption = False,
    samples: Annotated[
        int | None, typer.Option(help="Episodes per question (free/referenced). \\[default: 1]")
    ] = None,
    temperature: Annotated[
        float | None, typer.Option(help="Policy temperature. \\[default: 0.7]")
    ] = None,
    max_turns: MaxTurnsOption = None,
    max_tokens: TurnTokensOption = None,
    tools: ToolsOption = None,
    limit: Annotated[int | None, typer.Option(help="Use only the first K questions.")] = None,
    max_failed_fraction: MaxFailedFractionOption = 0.5,
    split: Annotated[
        str | None,
        typer.Option(
            help="all, train or heldout: a stable split by question_id hash, so stage 1 and the "
            "stage-2 rollouts can use disjoint questions. \\[default: all]"
        ),
    ] = None,
    heldout_fraction: Annotated[
        float | None,
        typer.Option(help="Share of questions in the heldout split. \\[default: 0.1]"),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Sampling seed (sample i uses seed + i). \\[default: 0]")
    ] = None,
    device: DeviceOption = None,
    overwrite: OverwriteOption = False,
    system_prompt: Annotated[
        str | None,
        typer.Option(
            help="The agent's system prompt: full or short (one line, for small models trained "
            "from scratch). An --llm hf checkpoint that stores the prompt it was trained with "
            "uses that one. \\[default: full]"
        ),
    ] = None,
    fan_out: Annotated[
        int | None,
        typer.Option(
            help="oracle: follow a chain's next hop from up to this many of the entities the "
            "hop before reached, so the replay observes the whole answer set. \\[default: 1]"
        ),
    ] = None,
    rerank: RerankOption = None,
    relation_ranking: RelationRankingOption = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="oracle with --llm template: replay the questions in N processes over "
            "contiguous shards (each opens the KG itself); the output is the same as with one. "
            "\\[default: 1]"
        ),
    ] = None,
    reflection: Annotated[
        bool | None,
        typer.Option(
            "--reflection/--no-reflection",
            help="free/referenced: sample with reflection instructions added to the system "
            "prompt (GraphRoll-style: notice a failed step, go back, check the answer before "
            "giving it; prompts/reflection.j2); the stored trajectories keep the plain "
            "prompt. \\[default: no-reflection]",
        ),
    ] = None,
    stratify: Annotated[
        str | None,
        typer.Option(
            help="With --limit: draw the K questions stratified by structure or hops (equal "
            "shares, seeded; GraphRoll's sampling for expert rollouts) instead of the first K; "
            "none takes the first K. \\[default: none]"
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Agent trajectories from questions: oracle replays, referenced rejection sampling, or
    free rollouts, through the real KG tools."""
    import dataclasses

    from kgsynth.config import build_config
    from kgsynth.manifest import sha256_file, write_manifest
    from kgsynth.schema import QUESTION_SCHEMA, REJECTED_TRAJECTORY_SCHEMA, TRAJECTORY_SCHEMA
    from kgsynth.stage_io import StagedOutput
    from kgsynth.synthesize.trajectories import TrajectoryConfig, synthesize_trajectories

    started = time.perf_counter()
    try:
        cfg = build_config(
            TrajectoryConfig,
            config,
            dict(
                mode=mode,
                samples=samples,
                temperature=temperature,
                max_turns=max_turns,
                max_tokens=max_tokens,
                toolset=tools,
                seed=seed,
                system_prompt=system_prompt,
                fan_out=fan_out,
                rerank=rerank,
                relation_ranking=relation_ranking,
                reflection=reflection,
                workers=workers,
                stratify=stratify,
                split=split,
                heldout_fraction=heldout_fraction,
            ),
            section="trajectories",
        )
        need = {"question_id", "question", "topic_names", "answer_names"}
        if cfg.mode != "free":
            need |= {"branches", "merge_at"}
        staged = StagedOutput(
            out_path,
            overwrite=overwrite,
            inputs={
                "--questions": questions,
                "--kg": kg,
                "--model": model if llm == "hf" else None,
                "--cache": cache,
                "--config": config,
            },
        )
        with staged:
            check_count("--limit", limit)
            check_fraction("--max-failed-fraction", max_failed_fraction)
            rows = read_rows(
                questions, "--questions", need, "kgsynth synthesize questions", QUESTION_SCHEMA
            )
            if cfg.split != "all":
                from kgsynth.synthesize.trajectories import split_of

                rows = [
                    r for r in rows if split_of(r["question_id"], cfg.heldout_fraction) == cfg.split
                ]
            if limit is not None:
                from kgsynth.synthesize.trajectories import select_questions

                rows = select_questions(rows, limit, cfg.stratify, cfg.seed)
            client = make_stage_llm(
                llm, out_path, cache=cache, no_cache=no_cache, model=model, base_url=base_url,
                api_key=api_key, concurrency=concurrency, timeout=timeout, max_retries=max_retries,
                device=device,
            )  # fmt: skip
            graph = open_graph_option(kg, profile)
            with progress_bar(count=False) as bar:
                task = bar.add_task(cfg.mode, total=None, info="")

                def progress(stage: str, a: int, b: int) -> None:
                    st = client.stats
                    what = (
                        f"turn {a}, {b} episodes active" if stage == "turn" else f"thought {a + 1}"
                    )
                    bar.update(
                        task,
                        info=f"{what}; requests {st.requests}, cache hits {st.cache_hits}, errors {st.errors}",
                    )

                stored = None
                if llm == "hf" and system_prompt is None:
                    from kgsynth.agent.loop import stored_system_prompt

                    stored = stored_system_prompt(model)
                accepted, rejected, stats = synthesize_trajectories(
                    rows, cfg, graph=graph, llm=client, progress=progress, system_text=stored
                )
            rejected_path = write_rows(
                staged, accepted, TRAJECTORY_SCHEMA, rejected, REJECTED_TRAJECTORY_SCHEMA
            )
            manifest = write_manifest(
                staged.sidecar("manifest.json"),
                stage="synthesize trajectories",
                config=dataclasses.asdict(cfg),
                input={
                    "questions": str(questions),
                    "sha256": sha256_file(questions),
                    "rows": len(rows),
                },
                output={
                    "path": str(out_path),
                    "rows": len(accepted),
                    "rejected_path": str(rejected_path),
                    "rejected_rows": len(rejected),
                },
                kg=graph.kg.describe(),
                llm=client.describe(),
                max_failed_fraction=max_failed_fraction,
                made_by_templates=client.backend == "template",
                elapsed_s=round(time.perf_counter() - started, 3),
                **stats,
            )
            staged.commit()
            client.close()
    except KGSynthError as exc:
        fail(exc)
    out.print(
        f"{manifest['trajectories']:,} {cfg.mode} trajectories from {manifest['questions']:,} questions "
        f"→ {out_path} ({manifest['rejected']:,} rejected: {manifest['rejects']}); "
        f"mean turns {manifest['mean_turns']}, tool errors {manifest['tool_errors']}, "
        f"format errors {manifest['format_errors']}; {manifest['elapsed_s']:.1f}s",
        highlight=False,
    )
    try:
        check_llm_failures(client, max_failed_fraction, out_path)
    except KGSynthError as exc:
        fail(exc)
