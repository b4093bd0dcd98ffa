"""Flags made from a stage's config dataclass: one ``--flag`` per field, named as the field, with
the help text from the field's metadata and the field's own default (the pattern of TRL's
``GRPOConfig`` with ``TrlParser``).

::

    @command(app, "walk")
    @config_command(WalkConfig, section="walk", panel=WALKS)
    def walk_cmd(cfg: WalkConfig, out_path: OutOption, kg: KGOption = None,
                 config: ConfigOption = None, overwrite: OverwriteOption = False) -> None:
        result = run(None, cfg, graph=open_kg_option(kg, None))  # then write and print

A field's flag goes in the help panel its ``option(panel=...)`` names, else the command's
``panel``; ``option(advanced=True)`` hides it from ``--help`` (``--help-all`` shows it; see
:mod:`kgsynth.cli.panels`). ``cfg`` is built from the field defaults, then the ``--config``
file's section, then the flags the user gave; a bad value ends the command with the config's
one-line error.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING
from pathlib import Path
from typing import Annotated, Any

import typer

from kgsynth.cli.common import fail, stderr
from kgsynth.cli.panels import INPUTS
from kgsynth.core.config import (
    build_config,
    field_help,
    file_options,
    flat_fields,
    load_yaml,
    nested_default,
)
from kgsynth.core.errors import ConfigError, KGSynthError

if typing.TYPE_CHECKING:
    from kgsynth.agent.carried import CarriedAgent

_LAST = ("config", "overwrite")
# a parameter of the command that config_command fills (with what its model carries), no flag
_CARRIED = "carried_agent"
# a parameter of the command that config_command fills with the config fields given as flags
_GIVEN = "given_flags"


def _cli_type(hint: Any) -> Any:
    """The type a flag parses: optional and literal types become their base, a tuple of
    strings is given as one comma-separated string."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in typing.get_args(hint) if a is not type(None)]
        return _cli_type(arms[0]) if len(arms) == 1 else str
    if origin is typing.Literal:
        return type(typing.get_args(hint)[0])
    if origin is tuple or hint is Path:
        return str
    return hint if hint in (int, float, str, bool) else str


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def field_params(
    cls: type, skip: typing.Iterable[str] = (), panel: str | None = None
) -> list[inspect.Parameter]:
    """One keyword parameter per CLI field of ``cls`` (and of the configs it nests), defaulting
    to None (= not given), in the help panel the field names (else ``panel``), hidden from
    ``--help`` where the field is ``advanced``."""
    params = []
    for owner, f, hint in flat_fields(cls).values():
        if f.name in skip or not f.metadata.get("cli", True):
            continue
        kind = _cli_type(hint)
        if f.metadata.get("multiple"):  # a tuple field given as a flag repeated once per value
            kind = list[str]
        decls = [flag_name(f.name)]
        if kind is bool:
            decls = [f"{flag_name(f.name)}/--no-{f.name.replace('_', '-')}"]
        info = typer.Option(
            *decls,
            help=field_help(f, nested_default(cls, owner, f.name) if owner else MISSING),
            metavar=f.metadata.get("metavar") or ("<str>" if f.metadata.get("multiple") else None),
            rich_help_panel=f.metadata.get("panel") or panel,
            hidden=f.metadata.get("advanced", False),
        )
        params.append(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[kind | None, info],
            )
        )
        if kind is not bool:
            aliases = f.metadata.get("aliases", ())
            params.extend(_alias_params(f.name, aliases, kind, f.metadata.get("panel") or panel))
    return params


# an older flag spelling's parameter: FIELD__old__N; the command reads it as FIELD and says so
_OLD = "__old__"


def _alias_params(
    name: str, aliases: typing.Iterable[str], kind: Any, panel: str | None
) -> list[inspect.Parameter]:
    """A hidden parameter per older spelling of field ``name``'s flag (``--tools`` for
    ``--toolset``): it still works, and the command prints a deprecation line."""
    out = []
    for i, alias in enumerate(aliases):
        info = typer.Option(
            alias, help=f"Deprecated: use {flag_name(name)}.", hidden=True, rich_help_panel=panel
        )
        out.append(
            inspect.Parameter(
                f"{name}{_OLD}{i}",
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[kind | None, info],
            )
        )
    return out


def warn_deprecated(old: str, new: str) -> None:
    """The one line an older flag spelling prints."""
    stderr.print(f"[yellow]warning:[/yellow] {old} is deprecated; use {new}", highlight=False)


def _read_old_spellings(cls: type, overrides: dict[str, Any]) -> None:
    """Move the values given under an older flag spelling to their field (the field's own
    flag wins where both are given), with one deprecation line on stderr each."""
    fields = flat_fields(cls)
    for key in [k for k in overrides if _OLD in k]:
        value = overrides.pop(key)
        if value is None:
            continue
        name, i = key.split(_OLD)
        warn_deprecated(fields[name][1].metadata["aliases"][int(i)], flag_name(name))
        if overrides.get(name) is None:
            overrides[name] = value


def config_command(
    cls: type,
    *,
    section: str | None = None,
    skip: typing.Iterable[str] = (),
    base: Callable[[dict[str, Any], Any, str | None], dict[str, Any] | None] | None = None,
    carried: Callable[[dict[str, Any], dict[str, Any]], CarriedAgent | None] | None = None,
    panel: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command one flag per field of ``cls`` and call it with the built ``cfg``.

    A flag goes in the help panel its field names (``option(panel=...)``), else ``panel``.

    A parameter of the command itself that is also a field of ``cls`` (rl's required
    ``--init``) keeps the command's declaration and reaches both the command and the config.
    ``base(given, config_file, section)`` returns the values layered under the file and the flags (rl's
    ``--preset``); ``given`` holds the flags as given (None where not).

    ``carried(given, params)`` names the agent settings the command's model carries
    (:mod:`kgsynth.agent.carried`: eval's ``--model``, rl's ``--init``, an SFT corpus's
    trajectories), from ``given`` (the options the preset, the file and the flags set, by
    name) and ``params`` (the command's own parameters). They are layered under the preset, the
    file and the flags (defaults < carried < preset < file < flags), and one warning line on
    stderr names every setting given there that overrides a different carried one. A command
    with a ``carried_agent`` parameter gets them (None where there are none); one with a
    ``given_flags`` parameter gets the names of the fields given as flags."""
    skip = set(skip)

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(fn, eval_str=True).parameters.values()
            if p.name not in ("cfg", _CARRIED, _GIVEN)
        ]
        wants_carried = _CARRIED in inspect.signature(fn).parameters
        wants_given = _GIVEN in inspect.signature(fn).parameters
        names = {p.name for p in own}
        fields = field_params(cls, skip | names, panel)
        field_names = [p.name for p in fields]
        shared = [n for n in flat_fields(cls) if n in names]
        first = [p for p in own if p.name not in _LAST]
        last = [p for p in own if p.name in _LAST]
        if "config" in names:  # which part of the --config file this command reads, after it
            last.insert([p.name for p in last].index("config") + 1, _section_param(section))

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            overrides = {name: kwargs.pop(name) for name in field_names}
            _read_old_spellings(cls, overrides)
            for name, value in overrides.items():  # a repeated flag: a tuple, or not given
                if isinstance(value, list):
                    overrides[name] = tuple(value) or None
            overrides.update({name: kwargs[name] for name in shared})
            asked = kwargs.pop("config_section", None)
            part = asked or section
            try:
                if kwargs.get("config") is not None:  # also a packaged recipe's name
                    kwargs["config"] = _config_file(kwargs["config"])
                if asked and kwargs.get("config") is not None:
                    sections = load_yaml(kwargs["config"])
                    if not isinstance(sections.get(asked), dict):
                        raise ConfigError(
                            f"--section: {kwargs['config']} has no section {asked!r} "
                            f"(it has: {', '.join(sorted(map(str, sections))) or 'none'})"
                        )
                layer = base(overrides, kwargs.get("config"), part) if base else None
                agent, warning, kept = None, None, ()
                if carried is not None:
                    agent, layer, warning, kept = _carried_layer(
                        cls, carried, layer, overrides, kwargs, part
                    )
                try:
                    cfg = build_config(
                        cls, kwargs.get("config"), overrides, section=part, base=layer
                    )
                except ConfigError as exc:
                    raise _carried_hint(exc, agent, kept) from None
            except KGSynthError as exc:
                fail(exc)
            if warning:
                from rich.markup import escape

                stderr.print(
                    f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True
                )
            if wants_carried:
                kwargs[_CARRIED] = agent
            if wants_given:
                kwargs[_GIVEN] = frozenset(n for n, v in overrides.items() if v is not None)
            return fn(cfg=cfg, **kwargs)

        command.__signature__ = inspect.Signature([*first, *fields, *last])  # type: ignore[attr-defined]
        return command

    return wrap


def _config_file(value: Path) -> Path:
    """``--config``: a YAML file, or a packaged recipe by name (``metaqa_default``; the old
    ``pipelines/NAME.yaml`` of a checkout names it too, with a note)."""
    from kgsynth.resources import find_recipe

    def note(line: str) -> None:
        stderr.print(f"note: {line}", highlight=False, markup=False, soft_wrap=True)

    return find_recipe(value, note, flag="--config")


def _section_param(section: str | None) -> inspect.Parameter:
    """``--section``: which part of the ``--config`` file the command reads."""
    help_ = "The --config file's section to read (a file with one section per step)."
    if section:
        help_ += f" \\[default: {section}]"
    option = typer.Option("--section", help=help_, rich_help_panel=INPUTS)
    return inspect.Parameter(
        "config_section",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[str | None, option],
    )


def _carried_layer(
    cls: type,
    carried: Callable[[dict[str, Any], dict[str, Any]], CarriedAgent | None],
    preset: dict[str, Any] | None,
    overrides: dict[str, Any],
    params: dict[str, Any],
    section: str | None,
) -> tuple[CarriedAgent | None, dict[str, Any] | None, str | None, tuple[str, ...]]:
    """What the command's model carries, the base layer with it under ``preset``, the
    warning naming the settings the preset, the file or the flags override (None: none), and
    the carried settings the command takes as they are."""
    from kgsynth.agent.carried import SAVED_FIELDS, override_line, shown

    config = params.get("config")
    in_file = file_options(cls, config, section) if config is not None else {}
    flags = {k: v for k, v in overrides.items() if v is not None}
    given = {**(preset or {}), **in_file, **flags}
    agent = carried(given, params)
    if agent is None:
        return None, preset, None, ()
    fields = flat_fields(cls)
    layer = {**{k: v for k, v in agent.values.items() if k in fields}, **(preset or {})}
    sectioned = config is not None and isinstance(load_yaml(config).get(section), dict)
    where = f"--config {config}" + (f", section {section}" if sectioned else "")
    how = []
    for name in agent.values:
        if name in flags:
            how.append((name, flags[name], f"{flag_name(name)} {shown(flags[name])}"))
        elif name in in_file:
            how.append((name, in_file[name], f"{name} {shown(in_file[name])} ({where})"))
        elif name in (preset or {}):
            label = f"--preset {given['preset']}" if given.get("preset") else "the preset"
            how.append((name, preset[name], f"{name} {shown(preset[name])} ({label})"))  # type: ignore[index]
    kept = tuple(name for name in layer if name not in given)
    agent = dataclasses.replace(agent, given=tuple(n for n in given if n in SAVED_FIELDS))
    return agent, layer, override_line(agent, how), kept


def _carried_hint(exc: ConfigError, agent: CarriedAgent | None, kept: tuple[str, ...]) -> Exception:
    """``exc`` naming the carried settings it is about: a check between two settings
    (``--relation-ranking bm25`` with the ``first_hop_fallback dense`` a model carries) fails on
    a value the user never typed, so the message says where it came from and what to give."""
    from kgsynth.agent.carried import shown

    names = [n for n in kept if agent is not None and n in str(exc)]
    if agent is None or not names:
        return exc
    held = ", ".join(f"{n} {shown(agent.values[n])}" for n in names)
    flags = ", ".join(flag_name(n) for n in names)
    return ConfigError(f"{exc} ({held}: what {agent.origin}; give {flags} too)")
