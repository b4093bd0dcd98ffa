"""The ``kgsynth`` command line. It parses options, loads inputs, calls a stage, writes
outputs and turns domain errors into one-line messages with exit codes; no logic lives here."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from kgsynth.cli_eval import eval_cmd
from kgsynth.cli_options import (
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
    TimeoutOption,
    ToolsOption,
    TurnTokensOption,
)
from kgsynth.cli_train import train_app
from kgsynth.errors import InputFileError, KGSynthError
from kgsynth.kg.graph import KGGraph

if TYPE_CHECKING:
    from rich.progress import Progress

app = typer.Typer(
    name="kgsynth",
    help="Turn a knowledge graph into training data for KG-tool-calling LLM agents, and train them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
kg_app = typer.Typer(help="Import, inspect and query knowledge graphs.", no_args_is_help=True)
app.add_typer(kg_app, name="kg")
synth_app = typer.Typer(
    help="Synthesize questions (and trajectories) from walks.", no_args_is_help=True
)
app.add_typer(synth_app, name="synthesize")
app.add_typer(train_app, name="train")
app.command("eval")(eval_cmd)

out = Console()
err = Console(stderr=True)


def fail(exc: KGSynthError) -> NoReturn:
    """Print ``exc`` as one line (secrets redacted) and exit with its code."""
    from rich.markup import escape

    from kgsynth.text import clean_text, redact_text

    message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    message = escape(redact_text(clean_text(message)))
    err.print(f"[red]error:[/red] {message}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(exc.exit_code)


def check_count(flag: str, value: int | None, minimum: int = 1) -> None:
    """A count option below ``minimum`` is a :class:`ConfigError` naming the flag."""
    if value is not None and value < minimum:
        from kgsynth.errors import ConfigError

        raise ConfigError(f"{flag} must be >= {minimum} (got {value})")


def check_fraction(flag: str, value: float) -> None:
    """A fraction outside [0, 1] (or NaN) is a :class:`ConfigError` naming the flag."""
    if not 0.0 <= value <= 1.0:
        from kgsynth.errors import ConfigError

        raise ConfigError(f"{flag} must be within [0, 1] (got {value})")


def check_llm_failures(client, max_failed_fraction: float, written: Path) -> None:
    """Raise :class:`LLMFailuresError` when more than ``max_failed_fraction`` of the stage's
    LLM requests failed (after the outputs and manifest were written)."""
    from kgsynth.errors import LLMFailuresError

    st = client.stats
    if st.requests and st.errors / st.requests > max_failed_fraction:
        raise LLMFailuresError(
            f"{st.errors} of {st.requests} LLM requests failed "
            f"({st.errors / st.requests:.0%} > --max-failed-fraction {max_failed_fraction}); "
            f"what succeeded is in {written} (its manifest counts them under llm.stats.errors); "
            "check --base-url, --model and --api-key"
        )


def progress_bar(
    title: str = "{task.description}", *, console: Console = err, count: bool = True
) -> Progress:
    """The commands' progress bar: bold title, bar, done/total (unless ``count`` is off, for
    work of unknown size), the task's ``info`` field and the elapsed time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns: list[Any] = [TextColumn(f"[bold]{title}"), BarColumn()]
    if count:
        columns.append(MofNCompleteColumn())
    columns += [TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
    return Progress(*columns, console=console)


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")] = False,
) -> None:
    from kgsynth.text import RedactingFilter

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:  # no key or token reaches a log
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def _open(kg: str | None, profile: str | None, timeout: float = 30.0, **bounds: Any):
    from kgsynth.kg import open_kg

    with err.status("opening the KG (a triple file is imported on first use)…"):
        return open_kg(kg, profile=profile, timeout=timeout, **bounds)


@kg_app.command("import")
def kg_import(
    src: Annotated[
        Path,
        typer.Argument(help="Triple file: .nt, .ttl, or delimited s|r|o / TSV (optionally .gz)."),
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="Store directory to create.")],
    fmt: Annotated[
        str | None, typer.Option("--format", help="nt, ttl or tsv (default: from the file name).")
    ] = None,
    delimiter: Annotated[
        str | None,
        typer.Option(help="Field separator of a delimited file (default: sniffed, | or tab)."),
    ] = None,
    profile: ProfileOption = None,
    names: Annotated[
        Path | None,
        typer.Option(help="id<TAB>name file that labels an id-based triple file (FB15k-237)."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            "--force",
            help="Replace an existing store (only a folder that is a kgsynth store).",
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Import a triple file into an embedded store directory."""
    from kgsynth.kg.importer import import_kg
    from kgsynth.stage_io import OutputLock, check_overlap

    try:
        check_overlap([out_dir], [("SRC", src), ("--names", names)])
        with OutputLock(out_dir), err.status(f"importing {src}…"):
            report = import_kg(
                src,
                out_dir,
                fmt=fmt,
                delimiter=delimiter,
                profile=profile,  # type: ignore[arg-type]
                names_file=names,
                force=force,
            )
    except KGSynthError as exc:
        fail(exc)
    if json_out:
        out.print_json(json.dumps(report.as_dict()))
        return
    out.print(
        f"imported {report.triples:,} triples ({report.facts:,} facts + names): "
        f"{report.entities:,} entities ({report.named_entities:,} named), "
        f"{report.relations:,} relations; profile {report.profile}; "
        f"{report.seconds:.1f}s; store {report.store_bytes / 1e6:.1f} MB at {report.store}",
        highlight=False,
    )


@kg_app.command("stats")
def kg_stats_cmd(
    kg: KGOption = None,
    profile: ProfileOption = None,
    top: Annotated[int, typer.Option(help="How many relations to list.")] = 20,
    json_out: Annotated[bool, typer.Option("--json", help="Print the statistics as JSON.")] = False,
) -> None:
    """Triples, entities, relations, top relations by count and the degree distribution."""
    from kgsynth.kg.stats import kg_stats

    try:
        check_count("--top", top)
        graph = _open(kg, profile)
        with err.status("counting…"):
            stats = kg_stats(graph, top=top)
    except KGSynthError as exc:
        fail(exc)
    if json_out:
        out.print_json(json.dumps(stats))
        return
    out.print(
        f"{stats['kg']['location']} ({stats['kg']['profile']} profile): "
        f"{stats['triples']:,} triples, {stats['facts']:,} facts, "
        f"{stats['entities']:,} entities, {stats['relations']:,} relations",
        highlight=False,
    )
    table = Table("relation", "count", "hidden", title="top relations")
    for r in stats["top_relations"]:
        table.add_row(r["relation"], f"{r['count']:,}", "yes" if r["hidden"] else "")
    out.print(table)
    deg = stats["degree"]
    out.print(
        f"degree (facts per entity): min {deg['min']}, median {deg['median']}, "
        f"mean {deg['mean']}, p90 {deg['p90']}, p99 {deg['p99']}, max {deg['max']}",
        highlight=False,
    )
    table = Table("degree", "entities")
    for b in deg["histogram"]:
        table.add_row(b["degree"], f"{b['entities']:,}")
    out.print(table)


@kg_app.command("tool")
def kg_tool(
    call: Annotated[str, typer.Argument(help="A tool call, e.g. 'get_relations(\"Kismet\")'.")],
    kg: KGOption = None,
    profile: ProfileOption = None,
    question: Annotated[str, typer.Option(help="Question used to rank relations (BM25).")] = "",
    tools: Annotated[str, typer.Option(help="Tool set: graphwalker or kgr1.")] = "graphwalker",
    top_k: Annotated[int, typer.Option(help="Relations shown by get_relations.")] = 10,
    max_triples: Annotated[int, typer.Option(help="Triples shown per relation.")] = 5,
) -> None:
    """Run one agent tool call and print the observation the agent would see."""
    from kgsynth.agent.protocol import render_observation
    from kgsynth.agent.tools import ToolConfig, ToolEnvironment
    from kgsynth.text import clean_text

    if tools not in ("graphwalker", "kgr1"):
        fail(KGSynthError(f"--tools: unknown tool set {tools!r}; choose graphwalker or kgr1"))
    # argv holds a non-UTF-8 byte as a lone surrogate
    call, question = clean_text(call), clean_text(question)
    try:
        check_count("--top-k", top_k)
        check_count("--max-triples", max_triples)
        graph = KGGraph(_open(kg, profile))
        env = ToolEnvironment(
            graph,
            question,
            ToolConfig(toolset=tools, top_k_relations=top_k, max_triples_per_relation=max_triples),  # type: ignore[arg-type]
        )
        result = env.execute(call)
    except KGSynthError as exc:
        fail(exc)
    out.print(render_observation(result.text), highlight=False, markup=False, soft_wrap=True)
    if result.error:
        err.print(f"tool error type: {result.error.value}", highlight=False)
        raise typer.Exit(1)


@kg_app.command("query")
def kg_query(
    query: Annotated[
        str, typer.Argument(help="A read-only SPARQL query (SELECT or ASK); '-' reads stdin.")
    ],
    kg: KGOption = None,
    profile: ProfileOption = None,
    fmt: Annotated[str, typer.Option("--format", help="tsv or json.")] = "tsv",
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds; an embedded store's query runs in a child process killed at the deadline."
        ),
    ] = 30.0,
    max_rows: Annotated[
        int, typer.Option(help="Row cap: a result with more rows is an error.")
    ] = 100_000,
) -> None:
    """Run a read-only SPARQL query and print the rows."""
    from kgsynth.text import clean_text

    if query == "-":
        query = sys.stdin.read()
    query = clean_text(query)  # argv holds a non-UTF-8 byte as a lone surrogate
    if fmt not in ("tsv", "json"):
        fail(KGSynthError(f"--format: unknown format {fmt!r}; choose tsv or json"))
    try:
        if not (timeout > 0 and timeout != float("inf")):
            from kgsynth.errors import ConfigError

            raise ConfigError(f"--timeout must be a number of seconds > 0 (got {timeout})")
        graph = _open(kg, profile, timeout, max_rows=max_rows, isolate=True)
        import re

        if re.search(r"(?i)^\s*(PREFIX\s+\S*\s*<[^>]*>\s*|BASE\s*<[^>]*>\s*)*ASK\b", query):
            answer = graph.ask(query, timeout=timeout)
            out.print(json.dumps({"boolean": answer}) if fmt == "json" else str(answer).lower())
            return
        rows = graph.select(query, timeout=timeout)
    except KGSynthError as exc:
        fail(exc)
    variables: list[str] = list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "json":
        data = [{k: v.value for k, v in r.items()} for r in rows]
        sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
        return
    sys.stdout.write("\t".join(variables) + "\n")
    for r in rows:
        sys.stdout.write(
            "\t".join(
                r[v].value.replace("\t", " ").replace("\n", " ") if v in r else ""
                for v in variables
            )
            + "\n"
        )


@app.command("walk")
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
            graph = _open(kg, profile)
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


def _read_rows(path: Path, flag: str, need: set[str], produced_by: str, schema) -> list[dict]:
    """A stage's input Parquet as rows; errors name the file and the missing column, the
    column of the wrong type, or the row and field that is null or does not fit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kgsynth.schema import check_columns
    from kgsynth.stage_io import recover_input

    recover_input(path)  # a commit of it that a crash interrupted is finished first
    if not path.is_file():
        raise InputFileError(path, f"{flag}: no such file (run `{produced_by}` first)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputFileError(path, f"{flag}: not a readable Parquet file: {exc}") from None
    missing = need - set(table.column_names)
    if missing:
        raise InputFileError(path, f"{flag}: missing column(s) {', '.join(sorted(missing))}")
    check_columns(table, path, flag, schema, need)
    rows = table.to_pylist()
    if {"topic_names", "branches", "merge_at"} <= need:
        for i, row in enumerate(rows):
            sizes = {len(row["topic_names"]), len(row["branches"]), len(row["merge_at"])}
            if len(sizes) != 1 or not row["branches"]:
                raise InputFileError(
                    path,
                    f"{flag}: row {i}: topic_names, branches and merge_at need one entry per "
                    f"branch (found {len(row['topic_names'])}, {len(row['branches'])}, "
                    f"{len(row['merge_at'])})",
                )
            for b, (hops, merge) in enumerate(zip(row["branches"], row["merge_at"], strict=True)):
                if not hops or not 0 < merge <= len(hops):
                    raise InputFileError(
                        path,
                        f"{flag}: row {i}: merge_at[{b}] = {merge} does not fit branch {b} "
                        f"of {len(hops)} hop(s)",
                    )
    return rows


def _make_llm(
    llm: str,
    out_path: Path,
    *,
    cache: Path | None,
    no_cache: bool,
    **options,
):
    """The stage's LLM, wrapped in the request cache (``llm_cache.sqlite`` beside ``--out``
    unless ``--cache`` names another or ``--no-cache``)."""
    from kgsynth.llm import make_llm

    cache_path = None if no_cache else (cache or out_path.with_name("llm_cache.sqlite"))
    return make_llm(llm, cache=cache_path, **options)


def _write_outputs(staged, accepted: list, schema, rejected: list, rejected_schema) -> Path:
    """The stage's rows and its rejects (``NAME.rejected.parquet``), into the staged output;
    returns where the rejects will be once committed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kgsynth.stage_io import sidecar

    pq.write_table(pa.Table.from_pylist(accepted, schema=schema), staged.path())
    pq.write_table(
        pa.Table.from_pylist(rejected, schema=rejected_schema), staged.sidecar("rejected.parquet")
    )
    return sidecar(staged.out, "rejected.parquet")


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
    import time

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
            rows = _read_rows(
                walks,
                "--walks",
                {"walk_id", "branches", "topic_names", "answer_names", "merge_at", "structure"},
                "kgsynth walk",
                WALK_SCHEMA,
            )
            if limit is not None:
                rows = rows[:limit]
            out_path.parent.mkdir(parents=True, exist_ok=True)
            client = _make_llm(
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
            rejected_path = _write_outputs(
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
        str,
        typer.Option(
            help="all, train or heldout: a stable split by question_id hash, so stage 1 and the "
            "stage-2 rollouts can use disjoint questions."
        ),
    ] = "all",
    heldout_fraction: Annotated[
        float, typer.Option(help="Share of questions in the heldout split.")
    ] = 0.1,
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
    config: ConfigOption = None,
) -> None:
    """Agent trajectories from questions: oracle replays, referenced rejection sampling, or
    free rollouts, through the real KG tools."""
    import dataclasses
    import time

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
            rows = _read_rows(
                questions, "--questions", need, "kgsynth synthesize questions", QUESTION_SCHEMA
            )
            if split != "all":
                from kgsynth.errors import ConfigError
                from kgsynth.synthesize.trajectories import split_of

                if split not in ("train", "heldout"):
                    raise ConfigError(f"--split must be all, train or heldout (got {split!r})")
                if not 0 < heldout_fraction < 1:
                    raise ConfigError(
                        f"--heldout-fraction must be in (0, 1) (got {heldout_fraction})"
                    )
                rows = [r for r in rows if split_of(r["question_id"], heldout_fraction) == split]
            if limit is not None:
                rows = rows[:limit]
            out_path.parent.mkdir(parents=True, exist_ok=True)
            client = _make_llm(
                llm, out_path, cache=cache, no_cache=no_cache, model=model, base_url=base_url,
                api_key=api_key, concurrency=concurrency, timeout=timeout, max_retries=max_retries,
                device=device,
            )  # fmt: skip
            graph = KGGraph(_open(kg, profile))
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
            rejected_path = _write_outputs(
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


@app.command("filter")
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
            help="em (EM = 1), f1 (EM = 1 or F1 >= --f1-threshold) or none. \\[default: f1]"
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
    import dataclasses
    import time
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kgsynth.config import build_config
    from kgsynth.errors import InputFileError
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


if __name__ == "__main__":
    app()
