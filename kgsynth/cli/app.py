"""The ``kgsynth`` command: one Typer app with a sub-app or command per stage. Each command
builds its stage's config, calls the stage and prints; :mod:`kgsynth.cli.common` holds what
they share."""

from __future__ import annotations

import logging
import os
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from kgsynth.cli.common import fail, fail_line, os_error_line
from kgsynth.cli.eval import eval_cmd
from kgsynth.cli.filter import filter_cmd
from kgsynth.cli.kg import kg_app
from kgsynth.cli.panels import command
from kgsynth.cli.recipes import recipes_cmd
from kgsynth.cli.report import report_cmd
from kgsynth.cli.run import run_cmd
from kgsynth.cli.synthesize import synth_app
from kgsynth.cli.train import train_app
from kgsynth.cli.walk import walk_cmd
from kgsynth.core.errors import KGSynthError

# the commands as ``kgsynth --help`` lists them: the runner, then a run's steps in order
PIPELINE_ORDER = ["run", "recipes", "kg", "walk", "synthesize", "filter", "train", "eval", "report"]


class _OneLineErrors(TyperGroup):
    """The top command: whatever escapes a command ends as one ``error:`` line and an exit
    code, never a traceback. Commands already turn kgsynth's own errors into lines; this
    catches what reaches here anyway: the disk filling up, Ctrl-C, and (as a last resort,
    saying so) a bug, whose traceback ``KGSYNTH_TRACEBACK=1`` shows."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The commands in the order a run takes them (Typer lists groups last)."""
        rank = {name: i for i, name in enumerate(PIPELINE_ORDER)}
        return sorted(super().list_commands(ctx), key=lambda n: rank.get(n, len(rank)))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (
            click.exceptions.Exit,
            click.ClickException,
            click.exceptions.Abort,
            typer.Exit,
            typer.Abort,
            typer.TyperException,  # typer's own click's usage errors: click prints them
        ):
            raise
        except KGSynthError as exc:
            fail(exc)
        except KeyboardInterrupt:
            fail_line("interrupted; outputs are as they were before this run", 130)
        except OSError as exc:
            fail_line(os_error_line(exc), 7)
        except MemoryError:
            fail_line("out of memory; use a smaller --batch-size, --n or --workers", 7)
        except Exception as exc:
            if os.environ.get("KGSYNTH_TRACEBACK"):
                raise
            fail_line(
                f"internal error: {type(exc).__name__}: {exc} (a bug in kgsynth: please report "
                "it; KGSYNTH_TRACEBACK=1 shows where)",
                70,
            )


app = typer.Typer(
    cls=_OneLineErrors,
    name="kgsynth",
    help="Turn a knowledge graph into training data for KG-tool-calling LLM agents, and train them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(kg_app, name="kg")
command(app, "walk")(walk_cmd)
app.add_typer(synth_app, name="synthesize")
command(app, "filter")(filter_cmd)
app.add_typer(train_app, name="train")
command(app, "eval")(eval_cmd)
command(app, "report")(report_cmd)
command(app, "run")(run_cmd)
command(app, "recipes")(recipes_cmd)


@app.callback()
def main(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Log progress details, and let the libraries' warnings, logs and progress bars "
            "show (kgsynth run passes it to its steps).",
        ),
    ] = False,
) -> None:
    from kgsynth.core.quiet import configure_output, verbose_from_environment
    from kgsynth.core.text import RedactingFilter

    # a step of `kgsynth -v run` is a kgsynth process: -v reaches it through the environment
    verbose = verbose or verbose_from_environment()
    configure_output(verbose)  # quiet libraries unless -v, here and in what kgsynth starts
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:  # no key or token reaches a log
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
