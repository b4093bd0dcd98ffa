"""Typer option declarations that several ``kgsynth`` commands share, so that a flag that
means the same thing everywhere is declared (and documented) once.

Only options whose type, default and help fit every command that uses them live here; a
command whose flag differs (the eval policy's ``--llm hf|openai``, the SFT ``--config``
sections) keeps its own declaration. Imports stay cheap: this module is read on every
``kgsynth`` start."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kgsynth.cli.panels import AGENT, INPUTS, MODEL, OUTPUT

# the knowledge graph
KGOption = Annotated[
    str | None,
    typer.Option(
        "--kg",
        help="A store directory, a triple file (imported to a cache on first use) or an "
        "http(s)://…/sparql endpoint URL. Default: the shipped MetaQA movie KB.",
        rich_help_panel=INPUTS,
    ),
]
ProfileOption = Annotated[
    str | None,
    typer.Option(
        help="KG profile: generic, freebase or wikidata (auto-detected when omitted).",
        rich_help_panel=INPUTS,
    ),
]

# the LLM client
LLMOption = Annotated[
    str, typer.Option("--llm", help="LLM backend: openai, hf or template.", rich_help_panel=MODEL)
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        help="Model name (openai) or checkpoint folder (hf); not used by template.",
        rich_help_panel=MODEL,
    ),
]
BaseUrlOption = Annotated[
    str | None,
    typer.Option(
        help="OpenAI-compatible base URL (default: $OPENAI_BASE_URL, else OpenAI).",
        rich_help_panel=MODEL,
    ),
]
# the request settings below are advanced: --help leaves them out, --help-all shows them
ApiKeyOption = Annotated[
    str | None,
    typer.Option(help="API key (default: $OPENAI_API_KEY).", rich_help_panel=MODEL, hidden=True),
]
ConcurrencyOption = Annotated[
    int, typer.Option(help="Requests in flight (openai).", rich_help_panel=MODEL, hidden=True)
]
TimeoutOption = Annotated[
    float, typer.Option(help="Seconds per request (openai).", rich_help_panel=MODEL, hidden=True)
]
MaxRetriesOption = Annotated[
    int,
    typer.Option(
        help="Retries per request on 429/5xx/timeouts (openai).",
        rich_help_panel=MODEL,
        hidden=True,
    ),
]
CacheOption = Annotated[
    Path | None,
    typer.Option(
        help="Request cache (SQLite). \\[default: llm_cache.sqlite beside --out]",
        rich_help_panel=MODEL,
        hidden=True,
    ),
]
NoCacheOption = Annotated[
    bool,
    typer.Option("--no-cache", help="Do not cache requests.", rich_help_panel=MODEL, hidden=True),
]
MaxFailedFractionOption = Annotated[
    float,
    typer.Option(
        help="Exit non-zero (after writing the outputs) when more than this share of the LLM "
        "requests failed (when all of them failed, at any value).",
        rich_help_panel=OUTPUT,
        hidden=True,
    ),
]
DeviceOption = Annotated[
    str | None,
    typer.Option(
        help="hf backend device (cpu, cuda). \\[default: cuda if available]",
        rich_help_panel=MODEL,
        hidden=True,
    ),
]

# the agent loop (synthesize trajectories, eval): None leaves the stage config's value
MaxTurnsOption = Annotated[
    int | None,
    typer.Option(help="Turn limit, then one forced answer. \\[default: 10]", rich_help_panel=AGENT),
]
TurnTokensOption = Annotated[
    int | None, typer.Option(help="Tokens per turn. \\[default: 512]", rich_help_panel=AGENT)
]
RerankOption = Annotated[
    str | None,
    typer.Option(
        "--rerank",
        help="none, or llm: the LLM (--llm) reorders get_relations' BM25 top 20 before the top "
        "k is kept (GraphWalker, Table 8); cached like every request. \\[default: none]",
        rich_help_panel=AGENT,
    ),
]

ReportToOption = Annotated[
    str | None,
    typer.Option(
        "--report-to",
        help="Mirror the metrics to tensorboard (RUN/tensorboard; `tensorboard --logdir RUN`) "
        "or wandb (needs `pip install wandb`), or none. \\[default: none]",
        rich_help_panel=OUTPUT,
    ),
]

RelationRankingOption = Annotated[
    str | None,
    typer.Option(
        "--relation-ranking",
        help="How get_relations ranks an entity's relations: bm25 (GraphWalker); hybrid: "
        "BM25 plus the question's similarity to the relation's words under the bundled "
        "all-MiniLM-L6-v2 encoder; or focus: BM25 over the question words the episode's "
        "earlier hops have not used, nearest the topic entity first. Use the same in "
        "synthesis, RL and eval. \\[default: bm25]",
        rich_help_panel=AGENT,
    ),
]

# the stage config file (walk, synthesize, filter, eval; the train commands declare their own)
ConfigOption = Annotated[
    Path | None,
    typer.Option(help="YAML file with these options (flags override it).", rich_help_panel=INPUTS),
]

# every command that writes an output: refuse an existing one unless this is given
OverwriteOption = Annotated[
    bool,
    typer.Option(
        help="Replace an existing output (its file with its sidecars, or its folder if "
        "kgsynth wrote it); without it an existing output is refused.",
        rich_help_panel=OUTPUT,
    ),
]
