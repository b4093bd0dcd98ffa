"""``--help`` a person can read: every option in a named panel, the common ones shown, the
advanced ones behind ``--help-all``.

A config field names its panel and whether it is advanced where it is declared
(``option(..., panel="Model", advanced=True)``, :func:`kgsynth.core.config.option`); a typer option
declared in a command says the same with ``rich_help_panel=`` and ``hidden=``. An advanced
option works as any other when given; only ``--help`` leaves it out. Each command is registered
with :func:`command`, which gives it ``--help-all`` and prints its panels in :data:`PANELS`
order::

    @command(train_app, "rl")
    @config_command(GRPOConfig, section="rl", panel=OPTIMIZATION)
    def rl_cmd(cfg: GRPOConfig, ...) -> None: ...

Only typer's public API is used (``cls=``, ``hidden``, ``rich_help_panel``, an eager option's
callback): typer vendors its own click from 0.2x on, so neither ``click`` nor typer's private
modules are reached into.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

INPUTS = "Inputs"
AGENT = "Agent"
MODEL = "Model"
WALKS = "Walks"
SYNTHESIS = "Synthesis"
FILTERS = "Filters"
EVALUATION = "Evaluation"
OPTIMIZATION = "Optimization"
REWARDS = "Rewards"
ROLLOUTS = "Rollouts"
EARLY_STOPPING = "Early stopping"
LAUNCH = "Launch"
OUTPUT = "Output"
HELP = "Help"
PANELS = (
    INPUTS,
    AGENT,
    MODEL,
    WALKS,
    SYNTHESIS,
    FILTERS,
    EVALUATION,
    OPTIMIZATION,
    REWARDS,
    ROLLOUTS,
    EARLY_STOPPING,
    LAUNCH,
    OUTPUT,
    HELP,
)
"""The panels, in the order ``--help`` prints them."""


def _rank(param: Any) -> int:
    """Where ``param`` goes: arguments and unpanelled options first (typer prints them first
    anyway; their order among themselves is kept), then :data:`PANELS` order, unknown panels
    just before Help."""
    panel = getattr(param, "rich_help_panel", None)
    if panel is None or param.param_type_name == "argument":
        return -1
    return PANELS.index(panel) if panel in PANELS else len(PANELS) - 1


@contextmanager
def _everything_shown(command: Any) -> Iterator[None]:
    """``command``'s advanced options shown, and no note about them, for one help text."""
    hidden = [p for p in command.params if getattr(p, "hidden", False)]
    epilog = command.epilog
    for param in hidden:
        param.hidden = False
    command.epilog = None
    try:
        yield
    finally:
        for param in hidden:
            param.hidden = True
        command.epilog = epilog


def _print_every_option(ctx: typer.Context, value: bool) -> None:
    """``--help-all``: the help text with every option, then exit (as ``--help`` does)."""
    if not value or ctx.resilient_parsing:
        return
    with _everything_shown(ctx.command):
        typer.echo(ctx.get_help(), color=ctx.color)
    raise typer.Exit()


HelpAllOption = Annotated[
    bool,
    typer.Option(
        "--help-all",
        is_eager=True,
        expose_value=False,
        callback=_print_every_option,
        help="Show every option, the advanced ones too, and exit.",
        rich_help_panel=HELP,
    ),
]


class PanelledCommand(TyperCommand):
    """A command whose help prints its panels in :data:`PANELS` order, ``--help`` and
    ``--help-all`` last, and ends saying how many advanced options ``--help-all`` adds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a stable sort: the order within a panel is the command's; values go by name
        self.params.sort(key=_rank)
        advanced = sum(1 for p in self.params if getattr(p, "hidden", False))
        if advanced and not self.epilog:
            what = "option is" if advanced == 1 else "options are"
            self.epilog = f"{advanced} advanced {what} not shown: --help-all shows every option."

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.rich_help_panel = HELP
        return option

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # ends with --help
        first = [p for p in params if getattr(p, "rich_help_panel", None) != HELP]
        return first + [p for p in params if p not in first][::-1]  # --help, then --help-all


def with_help_all(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with a ``--help-all`` flag (typer passes the flag's unused value; it is dropped)."""
    signature = inspect.signature(fn, eval_str=True)

    @functools.wraps(fn)
    def command(*args: Any, help_all: bool = False, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    flag = inspect.Parameter(
        "help_all", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=HelpAllOption
    )
    command.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), flag]
    )
    return command


def command(app: typer.Typer, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as ``app``'s command ``name``, with its options in
    panels and ``--help-all``; returns the function unchanged."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        app.command(name, cls=PanelledCommand)(with_help_all(fn))
        return fn

    return register
