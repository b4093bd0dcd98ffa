"""``kgsynth kg``: import, inspect, query and call the tools on a knowledge graph."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from kgsynth.cli.common import check_count, fail, open_graph_option, open_kg_option, stderr, stdout
from kgsynth.cli.fields import warn_deprecated
from kgsynth.cli.options import (
    KGOption,
    ProfileOption,
    RelationRankingOption,
)
from kgsynth.cli.panels import AGENT, INPUTS, OUTPUT, command
from kgsynth.core.errors import ConfigError, KGSynthError
from kgsynth.kg.base import MAX_TIMEOUT_S

kg_app = typer.Typer(help="Import, inspect and query knowledge graphs.", no_args_is_help=True)


@command(kg_app, "import")
def kg_import(
    src: Annotated[
        Path,
        typer.Argument(help="Triple file: .nt, .ttl, or delimited s|r|o / TSV (optionally .gz)."),
    ],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Store directory to create.", rich_help_panel=OUTPUT)
    ],
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="nt, ttl or tsv (default: from the file name).",
            rich_help_panel=INPUTS,
        ),
    ] = None,
    delimiter: Annotated[
        str | None,
        typer.Option(
            help="Field separator of a delimited file (default: sniffed, | or tab).",
            rich_help_panel=INPUTS,
        ),
    ] = None,
    profile: ProfileOption = None,
    names: Annotated[
        Path | None,
        typer.Option(
            help="id<TAB>name file that labels an id-based triple file (FB15k-237).",
            rich_help_panel=INPUTS,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            "--force",
            help="Replace an existing store (only a folder that is a kgsynth store).",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON.", rich_help_panel=OUTPUT)
    ] = False,
) -> None:
    """Import a triple file into an embedded store directory."""
    from kgsynth.core.stage_io import OutputLock, check_overlap
    from kgsynth.kg.importer import import_kg

    try:
        check_overlap([out_dir], [("SRC", src), ("--names", names)])
        with OutputLock(out_dir), stderr.status(f"importing {src}…"):
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
        stdout.print_json(json.dumps(report.as_dict()))
        return
    stdout.print(
        f"imported {report.triples:,} triples ({report.facts:,} facts + names): "
        f"{report.entities:,} entities ({report.named_entities:,} named), "
        f"{report.relations:,} relations; profile {report.profile}; "
        f"{report.seconds:.1f}s; store {report.store_bytes / 1e6:.1f} MB at {report.store}",
        highlight=False,
    )


@command(kg_app, "stats")
def kg_stats_cmd(
    kg: KGOption = None,
    profile: ProfileOption = None,
    top: Annotated[
        int, typer.Option(help="How many relations to list.", rich_help_panel=OUTPUT)
    ] = 20,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the statistics as JSON.", rich_help_panel=OUTPUT)
    ] = False,
) -> None:
    """Triples, entities, relations, top relations by count and the degree distribution."""
    from kgsynth.kg.stats import kg_stats

    try:
        check_count("--top", top)
        graph = open_kg_option(kg, profile)
        with stderr.status("counting…"):
            stats = kg_stats(graph, top=top)
    except KGSynthError as exc:
        fail(exc)
    if json_out:
        stdout.print_json(json.dumps(stats))
        return
    stdout.print(
        f"{stats['kg']['location']} ({stats['kg']['profile']} profile): "
        f"{stats['triples']:,} triples, {stats['facts']:,} facts, "
        f"{stats['entities']:,} entities, {stats['relations']:,} relations",
        highlight=False,
    )
    table = Table("relation", "count", "hidden", title="top relations")
    for r in stats["top_relations"]:
        table.add_row(r["relation"], f"{r['count']:,}", "yes" if r["hidden"] else "")
    stdout.print(table)
    deg = stats["degree"]
    stdout.print(
        f"degree (facts per entity): min {deg['min']}, median {deg['median']}, "
        f"mean {deg['mean']}, p90 {deg['p90']}, p99 {deg['p99']}, max {deg['max']}",
        highlight=False,
    )
    table = Table("degree", "entities")
    for b in deg["histogram"]:
        table.add_row(b["degree"], f"{b['entities']:,}")
    stdout.print(table)


def _old_flag(old: str, new: str) -> Any:
    """An older spelling of ``kg tool``'s flag ``new``: hidden, read as ``new`` with a
    deprecation line (:func:`_new_flag`)."""
    return typer.Option(old, help=f"Deprecated: use {new}.", hidden=True, rich_help_panel=AGENT)


EntityMatchingOption = Annotated[
    str | None,
    typer.Option(
        help="exact (a name of the KG) or near (a name the KG lacks is read as the most "
        "similar word span of --question). \\[default: exact]",
        rich_help_panel=AGENT,
    ),
]
FirstHopFallbackOption = Annotated[
    str | None,
    typer.Option(
        help="focus ranking: none, or dense (a first relation list with no match mark marks "
        "the relation nearest the question). \\[default: none]",
        rich_help_panel=AGENT,
    ),
]


@command(kg_app, "tool")
def kg_tool(
    call: Annotated[str, typer.Argument(help="A tool call, e.g. 'get_relations(\"Kismet\")'.")],
    kg: KGOption = None,
    profile: ProfileOption = None,
    question: Annotated[
        str, typer.Option(help="Question used to rank the relations.", rich_help_panel=INPUTS)
    ] = "",
    agent_from: Annotated[
        Path | None,
        typer.Option(
            "--agent-from",
            help="A checkpoint folder: its tools show what they showed the model in training "
            "(the agent settings it carries, agent_config.json); the flags below override them.",
            rich_help_panel=AGENT,
        ),
    ] = None,
    toolset: Annotated[
        str | None,
        typer.Option(
            help="Tool set: graphwalker, kgr1, knowcoder, isp or sexpr. \\[default: graphwalker]",
            rich_help_panel=AGENT,
        ),
    ] = None,
    top_k_relations: Annotated[
        int | None,
        typer.Option(
            help="Relations shown by get_relations. \\[default: 10]", rich_help_panel=AGENT
        ),
    ] = None,
    max_triples_per_relation: Annotated[
        int | None,
        typer.Option(help="Triples shown per relation. \\[default: 5]", rich_help_panel=AGENT),
    ] = None,
    tools: Annotated[str | None, _old_flag("--tools", "--toolset")] = None,
    top_k: Annotated[int | None, _old_flag("--top-k", "--top-k-relations")] = None,
    max_triples: Annotated[
        int | None, _old_flag("--max-triples", "--max-triples-per-relation")
    ] = None,
    relation_ranking: RelationRankingOption = None,
    entity_matching: EntityMatchingOption = None,
    first_hop_fallback: FirstHopFallbackOption = None,
    query_timeout_s: Annotated[
        float | None,
        typer.Option(
            help="Seconds a query the agent wrote (knowcoder, isp, sexpr) may run before its "
            "child process is killed. \\[default: 10]",
            rich_help_panel=AGENT,
        ),
    ] = None,
) -> None:
    """Run one agent tool call and print the observation the agent would see."""
    from kgsynth.agent.protocol import render_observation
    from kgsynth.agent.tools import ToolConfig, ToolEnvironment
    from kgsynth.core.text import clean_text

    toolset, top_k_relations, max_triples_per_relation = (
        _new_flag(toolset, tools, "--tools", "--toolset"),
        _new_flag(top_k_relations, top_k, "--top-k", "--top-k-relations"),
        _new_flag(max_triples_per_relation, max_triples, "--max-triples", "--max-triples-per-relation"),
    )  # fmt: skip
    _check_tool_names(toolset, relation_ranking)
    # argv holds a non-UTF-8 byte as a lone surrogate
    call, question = clean_text(call), clean_text(question)
    # each flag: (the setting it gives, its value, its name); a flag not given leaves the
    # checkpoint's setting (--agent-from), else the default
    flags = [
        ("toolset", toolset, "--toolset"),
        ("top_k_relations", top_k_relations, "--top-k-relations"),
        ("max_triples_per_relation", max_triples_per_relation, "--max-triples-per-relation"),
        ("relation_ranking", relation_ranking, "--relation-ranking"),
        ("entity_matching", entity_matching, "--entity-matching"),
        ("first_hop_fallback", first_hop_fallback, "--first-hop-fallback"),
        ("query_timeout_s", query_timeout_s, "--query-timeout-s"),
    ]
    given = [(name, value, f"{flag} {value}") for name, value, flag in flags if value is not None]
    try:
        for _, value, flag in flags[1:3]:
            check_count(flag, value)
        settings = _tool_settings(agent_from, given)
        graph = open_graph_option(kg, profile)
        env = ToolEnvironment(graph, question, ToolConfig(**settings))
        result = env.execute(call)
    except KGSynthError as exc:
        fail(exc)
    stdout.print(render_observation(result.text), highlight=False, markup=False, soft_wrap=True)
    if result.error:
        stderr.print(f"tool error type: {result.error.value}", highlight=False)
        raise typer.Exit(1)


def _new_flag(value: Any, old_value: Any, old: str, new: str) -> Any:
    """The value of flag ``new``, else the one given under its older spelling ``old`` (with a
    deprecation line on stderr)."""
    if old_value is None:
        return value
    warn_deprecated(old, new)
    return old_value if value is None else value


def _check_tool_names(toolset: str | None, relation_ranking: str | None) -> None:
    """End ``kg tool`` with a one-line error on an unknown tool set or relation ranking."""
    from kgsynth.agent.config import RELATION_RANKINGS
    from kgsynth.agent.spaces.registry import names

    if toolset not in (None, *names()):
        known = ", ".join(names())
        fail(KGSynthError(f"--toolset: unknown tool set {toolset!r}; choose {known}"))
    if relation_ranking not in (None, *RELATION_RANKINGS):
        fail(
            KGSynthError(
                f"--relation-ranking must be bm25, hybrid or focus (got {relation_ranking!r})"
            )
        )


def _tool_settings(agent_from: Path | None, given: list[tuple[str, Any, str]]) -> dict[str, Any]:
    """The agent settings ``kg tool`` runs with: what ``--agent-from``'s checkpoint carries
    (a warning line names each one a flag overrides), then the flags ``given``."""
    from kgsynth.agent.carried import model_agent, override_line

    carried = model_agent(agent_from) if agent_from is not None else None
    if agent_from is not None and carried is None:
        raise ConfigError(
            f"--agent-from: {agent_from} carries no agent settings (no agent_config.json: "
            "a model from before they were kept, or not a kgsynth checkpoint)"
        )
    if carried is not None:
        warning = override_line(carried, given)
        if warning:
            stderr.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False,
                         soft_wrap=True)  # fmt: skip
    return {**(carried.values if carried else {}), **{n: v for n, v, _ in given}}


@command(kg_app, "query")
def kg_query(
    query: Annotated[
        str, typer.Argument(help="A read-only SPARQL query (SELECT or ASK); '-' reads stdin.")
    ],
    kg: KGOption = None,
    profile: ProfileOption = None,
    fmt: Annotated[
        str, typer.Option("--format", help="tsv or json.", rich_help_panel=OUTPUT)
    ] = "tsv",
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds; an embedded store's query runs in a child process killed at the "
            "deadline.",
            rich_help_panel=INPUTS,
        ),
    ] = 30.0,
    max_rows: Annotated[
        int,
        typer.Option(help="Row cap: a result with more rows is an error.", rich_help_panel=INPUTS),
    ] = 100_000,
) -> None:
    """Run a read-only SPARQL query and print the rows."""
    from kgsynth.core.text import clean_text

    if query == "-":
        query = sys.stdin.read()
    query = clean_text(query)  # argv holds a non-UTF-8 byte as a lone surrogate
    if fmt not in ("tsv", "json"):
        fail(KGSynthError(f"--format: unknown format {fmt!r}; choose tsv or json"))
    try:
        if not 0 < timeout <= MAX_TIMEOUT_S:  # NaN fails too; past a year a deadline overflows
            from kgsynth.core.errors import ConfigError

            raise ConfigError(
                f"--timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}] (got {timeout})"
            )
        graph = open_kg_option(kg, profile, timeout, max_rows=max_rows, isolate=True)
        import re

        if re.search(r"(?i)^\s*(PREFIX\s+\S*\s*<[^>]*>\s*|BASE\s*<[^>]*>\s*)*ASK\b", query):
            answer = graph.ask(query, timeout=timeout)
            stdout.print(json.dumps({"boolean": answer}) if fmt == "json" else str(answer).lower())
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
