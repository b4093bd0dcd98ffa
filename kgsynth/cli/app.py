"""The ``kgsynth`` command: one Typer app with a sub-app or command per stage. Each command
builds its stage's config, calls the stage and prints; :mod:`kgsynth.cli.common` holds what
they share."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from kgsynth.cli.eval import eval_cmd
from kgsynth.cli.filter import filter_cmd
from kgsynth.cli.kg import kg_app
from kgsynth.cli.report import report_cmd
from kgsynth.cli.synthesize import synth_app
from kgsynth.cli.train import train_app
from kgsynth.cli.walk import walk_cmd

app = typer.Typer(
    name="kgsynth",
    help="Turn a knowledge graph into training data for KG-tool-calling LLM agents, and train them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(kg_app, name="kg")
app.command("walk")(walk_cmd)
app.add_typer(synth_app, name="synthesize")
app.command("filter")(filter_cmd)
app.add_typer(train_app, name="train")
app.command("eval")(eval_cmd)
app.command("report")(report_cmd)


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
