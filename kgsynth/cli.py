"""The ``kgsynth`` command line. It parses options, loads inputs, calls a stage, writes
outputs and turns domain errors into one-line messages with exit codes; no logic lives here."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from kgsynth.errors import KGSynthError

app = typer.Typer(
    name="kgsynth",
    help="Turn a knowledge graph into training data for KG-tool-calling LLM agents, and train them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
kg_app = typer.Typer(help="Import, inspect and query knowledge graphs.", no_args_is_help=True)
app.add_typer(kg_app, name="kg")

out = Console()
err = Console(stderr=True)

KGOption = Annotated[
    str | None,
    typer.Option(
        "--kg",
        help="A store directory, a triple file (imported to a cache on first use) or an "
        "http(s)://…/sparql endpoint URL. Default: the shipped MetaQA movie KB.",
    ),
]
ProfileOption = Annotated[
    str | None,
    typer.Option(help="KG profile: generic, freebase or wikidata (auto-detected when omitted)."),
]


def fail(exc: KGSynthError) -> NoReturn:
    err.print(f"[red]error:[/red] {exc}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(exc.exit_code)


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _open(kg: str | None, profile: str | None, timeout: float = 30.0):
    from kgsynth.kg import open_kg

    with err.status("opening the KG (a triple file is imported on first use)…"):
        return open_kg(kg, profile=profile, timeout=timeout)


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
    force: Annotated[bool, typer.Option(help="Replace an existing store.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Import a triple file into an embedded store directory."""
    from kgsynth.kg.importer import import_kg

    try:
        with err.status(f"importing {src}…"):
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

    if tools not in ("graphwalker", "kgr1"):
        fail(KGSynthError(f"--tools: unknown tool set {tools!r}; choose graphwalker or kgr1"))
    try:
        graph = _open(kg, profile).graph()
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
    timeout: Annotated[float, typer.Option(help="Seconds (endpoints).")] = 30.0,
) -> None:
    """Run a read-only SPARQL query and print the rows."""
    if query == "-":
        query = sys.stdin.read()
    if fmt not in ("tsv", "json"):
        fail(KGSynthError(f"--format: unknown format {fmt!r}; choose tsv or json"))
    try:
        graph = _open(kg, profile, timeout)
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
        typer.Option(help="i/N: this run's share; shards merge without duplicates. \\[default: 0/1]"),
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
    config: Annotated[
        Path | None, typer.Option(help="YAML file with these options (flags override it).")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Discard chunks of an interrupted run instead of resuming.")
    ] = False,
) -> None:
    """Sample constrained random walks with exact answer sets (GraphWalker CRW)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kgsynth.config import build_config
    from kgsynth.manifest import sha256_file, write_manifest
    from kgsynth.plots import walk_stats_png
    from kgsynth.walk import WalkConfig, run_walks

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
        graph = _open(kg, profile)
        with Progress(
            TextColumn("[bold]walks"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=err,
        ) as bar:
            task = bar.add_task("walk", total=cfg.n, info="")

            def progress(state, accepted: int) -> None:
                if state.next_attempt % 25 == 0 or accepted == cfg.n:
                    rejected = sum(state.rejects.values())
                    bar.update(
                        task, completed=accepted, info=f"accepted {accepted} rejected {rejected}"
                    )

            result = run_walks(graph, cfg, out_path, overwrite=overwrite, progress=progress)
        table = result.pop("table")
        png = out_path.with_name(out_path.stem + "_stats.png")
        walk_stats_png(table, png, result["relations_available"])
        import dataclasses

        relation_use: dict[str, int] = {}
        for branch_list in table.column("branches").to_pylist():
            for branch in branch_list:
                for hop in branch:
                    relation_use[hop["relation"]] = relation_use.get(hop["relation"], 0) + 1
        manifest = write_manifest(
            out_path.with_name("manifest.json")
            if out_path.name == "walks.parquet"
            else out_path.with_name(out_path.stem + ".manifest.json"),
            stage="walk",
            config=dataclasses.asdict(cfg),
            kg=graph.describe(),
            output={
                "path": str(out_path),
                "rows": table.num_rows,
                "sha256": sha256_file(out_path),
                "stats_png": str(png),
            },
            relation_coverage={
                "used": len(relation_use),
                "hops_per_relation": dict(sorted(relation_use.items())),
            },
            **result,
        )
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


if __name__ == "__main__":
    app()
