"""Stage configuration: frozen dataclasses, optional YAML files, CLI overrides.

Precedence: dataclass defaults < ``--config file.yaml`` < flags given on the command line.
Every value is checked against its field's type before the dataclass sees it: YAML's
``n: 10.7``, ``n: true`` or ``structures: [a, b]`` and a flag's ``nan`` or ``inf`` are refused
with a message naming the file and field, never coerced or left to fail deeper down.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kgsynth.core.errors import ConfigError

C = TypeVar("C")

# A seed reaches numpy's generator (through transformers' set_seed), which takes 0..2**32-1;
# torch and the OpenAI API take more. Half of that leaves room for the offsets added per run,
# sample or retry (seed + r), so a seed that passes here passes everywhere; one that did not
# used to fail inside the run, or make every request fail.
SEED_RANGE = (0, 2**31 - 1)
_RANGES = {"seed": SEED_RANGE}


def range_problem(name: str, value: Any) -> str | None:
    """Why the integer ``value`` is outside option ``name``'s range (None when it is within,
    or the option has none)."""
    bounds = _RANGES.get(name)
    if bounds is None or not isinstance(value, int) or isinstance(value, bool):
        return None
    low, high = bounds
    return None if low <= value <= high else f"must be within [{low}, {high}]"


def load_yaml(path: str | Path, section: str | None = None) -> dict[str, Any]:
    """A YAML mapping (or one section of it); errors name the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--config: {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start})"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config: {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {path} must hold a mapping of option: value")
    if section and isinstance(data.get(section), dict):
        data = data[section]
    return data


def _yaml_repr(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def type_problem(value: Any, hint: Any) -> str | None:
    """Why ``value`` does not fit the field type ``hint`` (None when it fits). Floats must be
    finite; a bool is not an int; a path is a str; a list of strings fits ``tuple[str, ...]``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        arms = [a for a in args if a is not type(None)]
        problems = [type_problem(value, a) for a in arms]
        if any(p is None for p in problems):
            return None
        return problems[0] if len(arms) == 1 else "has the wrong type"
    if hint is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and not -(2**63) <= value < 2**63:
            # every count and seed ends in an int64 (Parquet, numpy, torch): say so up front
            return "must be an integer within a signed 64-bit range (|value| < 2**63)"
        return None if ok else "must be an integer"
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "must be a number"
        return None if math.isfinite(value) else "must be a finite number"
    if hint is str:
        return None if isinstance(value, (str, os.PathLike)) else "must be a string"
    if typing.get_origin(hint) is tuple and args[-1:] == (Ellipsis,) and args[0] is str:
        if isinstance(value, (str, os.PathLike)):
            return None
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, (str, os.PathLike)) for v in value
        )
        return None if ok else "must be a list of strings"
    return None  # a type this check does not know: the dataclass checks it


def nested_configs(cls: type) -> dict[str, type]:
    """The fields of ``cls`` that are config dataclasses themselves (an ``AgentConfig`` a stage
    config nests), by field name."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if dataclasses.is_dataclass(hints.get(f.name))
    }


def nested_default(cls: type, owner: str, name: str) -> Any:
    """The default of option ``name`` of the config nested in field ``owner`` of ``cls``, as the
    outer config sets it (its default instance may differ from the nested class's own)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == owner)  # type: ignore[arg-type]
    if f.default_factory is not dataclasses.MISSING:
        return getattr(f.default_factory(), name)
    if f.default is not dataclasses.MISSING:
        return getattr(f.default, name)
    return dataclasses.MISSING


def flat_fields(cls: type) -> dict[str, tuple[str | None, dataclasses.Field, Any]]:
    """Every option of ``cls`` by its one name: ``name -> (nesting field or None, field, type)``.
    A nested config's fields are options of the outer config under their own names (a flag,
    a YAML key or a preset value names ``max_turns``, not ``agent.max_turns``)."""
    hints = typing.get_type_hints(cls)
    nested = nested_configs(cls)
    flat: dict[str, tuple[str | None, dataclasses.Field, Any]] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in nested:
            inner_hints = typing.get_type_hints(nested[f.name])
            for g in dataclasses.fields(nested[f.name]):
                flat[g.name] = (f.name, g, inner_hints[g.name])
        else:
            flat[f.name] = (None, f, hints[f.name])
    return flat


def alias_names(cls: type) -> dict[str, str]:
    """Older names of options (a field's ``aliases`` flags, e.g. ``--max-tokens``) -> the
    option's name, so that a YAML file or preset written with the old name still works."""
    names: dict[str, str] = {}
    for name, (_, f, _) in flat_fields(cls).items():
        for alias in f.metadata.get("aliases", ()):
            names[alias.lstrip("-").replace("-", "_")] = name
    return names


AGENT_BLOCK = "agent"
"""The key that groups the agent's settings: in a section (``agent: {toolset: kgr1}``), or at
the top of a recipe file, where they apply to every step whose config has them."""


def section_values(
    cls: type, config_file: str | Path, section: str | None = None
) -> dict[str, Any]:
    """The values the ``--config`` file sets for ``cls``, by the keys the file writes: the
    recipe-level ``agent:`` block's (those ``cls`` has; a section is being read), then the
    section's own, an ``agent:`` mapping in it read as its keys."""
    whole = load_yaml(config_file)
    sectioned = section is not None and isinstance(whole.get(section), dict)
    part = whole[section] if sectioned else whole
    values: dict[str, Any] = {}
    shared = whole.get(AGENT_BLOCK) if sectioned else None
    if isinstance(shared, dict):
        agents = {n for n, (owner, _, _) in flat_fields(cls).items() if owner == AGENT_BLOCK}
        known = agents | {a for a, n in alias_names(cls).items() if n in agents}
        values.update({k: v for k, v in shared.items() if str(k).replace("-", "_") in known})
    for key, value in part.items():
        if key == AGENT_BLOCK and isinstance(value, dict):
            values.update(value)
        else:
            values[key] = value
    return values


def file_options(cls: type, config_file: str | Path, section: str | None = None) -> dict[str, Any]:
    """The options the ``--config`` file (its ``section``) sets, by their one names (older
    names resolved); unchecked: :func:`build_config` checks them and refuses unknown ones."""
    aliases = alias_names(cls)
    options = {}
    for key, value in section_values(cls, config_file, section).items():
        name = str(key).replace("-", "_")
        options[aliases.get(name, name)] = value
    return options


def build_config(
    cls: type[C],
    config_file: str | Path | None,
    overrides: dict[str, Any],
    section: str | None = None,
    base: dict[str, Any] | None = None,
) -> C:
    """``cls`` from its defaults, then ``base`` (a preset), then the YAML file, then the
    non-None ``overrides``. Options of a nested config are given by their own names."""
    fields = flat_fields(cls)
    aliases = alias_names(cls)
    values: dict[str, Any] = {}
    for name, value in (base or {}).items():
        name = aliases.get(name, name)
        if name not in fields:
            raise ConfigError(f"preset sets unknown option {name!r}")
        values[name] = value
    if config_file:
        raw = section_values(cls, config_file, section)
        for key, value in raw.items():
            name = str(key).replace("-", "_")
            name = aliases.get(name, name)
            if name not in fields:
                raise ConfigError(
                    f"--config: {config_file}: unknown option {key!r}; valid: {', '.join(sorted(fields))}"
                )
            problem = type_problem(value, fields[name][2]) or range_problem(name, value)
            if problem:
                raise ConfigError(
                    f"--config: {config_file}: {key} {problem} (got {_yaml_repr(value)})"
                )
            values[name] = value
    for name, value in overrides.items():
        if value is None:
            continue
        problem = type_problem(value, fields[name][2] if name in fields else Any)
        problem = problem or range_problem(name, value)
        if problem:
            raise ConfigError(f"--{name.replace('_', '-')} {problem} (got {value!r})")
        values[name] = value
    try:
        return _assemble(cls, values)
    except TypeError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None


def _assemble(cls: type[C], values: dict[str, Any]) -> C:
    """``cls`` from option values by their one names (a nested config's, or a mapping under a
    nested config's field), each nested config built over the default the outer one sets."""
    fields = flat_fields(cls)
    nested = nested_configs(cls)
    outer: dict[str, Any] = {}
    inner: dict[str, dict[str, Any]] = {name: {} for name in nested}
    for name, value in values.items():
        if name in nested and isinstance(value, dict):
            inner[name].update(value)
            continue
        owner = fields[name][0] if name in fields else None
        (inner[owner] if owner else outer)[name] = value
    defaults = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for owner, kwargs in inner.items():
        f = defaults[owner]
        if f.default_factory is not dataclasses.MISSING:
            outer[owner] = dataclasses.replace(f.default_factory(), **kwargs)
        elif f.default is not dataclasses.MISSING:
            outer[owner] = dataclasses.replace(f.default, **kwargs)
        else:
            outer[owner] = nested[owner](**kwargs)
    return cls(**outer)


def option(default: Any = dataclasses.MISSING, help: str = "", **meta: Any) -> Any:
    """A config field that documents itself: ``help`` is its ``--flag``'s help text, and the
    flag's help shows ``default`` as the field holds it (no second copy to drift). ``meta`` may
    hold ``aliases`` (older flag names that still work), ``cli=False`` (a field only a YAML file
    or a preset sets), ``metavar``, ``panel`` (the ``--help`` panel of its flag, e.g. "Model";
    default: the command's, :mod:`kgsynth.cli.panels`) or ``advanced=True`` (a flag ``--help``
    leaves out and ``--help-all`` shows; it works as any other). A mutable default is passed as
    ``default_factory``."""
    factory = meta.pop("default_factory", dataclasses.MISSING)
    return dataclasses.field(
        default=default, default_factory=factory, metadata={"help": help, **meta}
    )


def field_help(f: dataclasses.Field, default: Any = dataclasses.MISSING) -> str:
    """A field's help text with its default (``default`` where the config nesting it sets
    another), as ``--help`` shows it."""
    text = f.metadata.get("help", "")
    if default is not dataclasses.MISSING:
        pass
    elif f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        return text
    if default is None:
        return text
    if isinstance(default, bool):
        default = "true" if default else "false"
    elif isinstance(default, (tuple, list)):
        default = ",".join(map(str, default)) or "none"
    return f"{text} \\[default: {default}]".strip()


def config_record(cfg: Any) -> dict[str, Any]:
    """``cfg`` as a manifest records it: every option under its one name (a nested config's
    options among the outer ones, as flags and YAML name them), leaving out fields marked
    ``record=False`` (recorded elsewhere in the manifest)."""
    record: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            record.update(config_record(value))
        elif f.metadata.get("record", True):
            record[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return record


def config_from_record(cls: type[C], record: dict[str, Any]) -> C:
    """``cls`` from what :func:`config_record` wrote (a spec or resume file): a nested config's
    options by their one names, or (as ``dataclasses.asdict`` writes them) as a mapping under
    its field. A key ``cls`` does not know is a :class:`ConfigError` naming it."""
    known = set(flat_fields(cls)) | set(nested_configs(cls))
    unknown = sorted(set(record) - known)
    if unknown:
        raise ConfigError(f"unknown option(s) for {cls.__name__}: {', '.join(unknown)}")
    return _assemble(cls, record)


def option_value(cfg: Any, name: str) -> Any:
    """Option ``name`` of ``cfg`` by its one name (a nested config's too: ``max_turns`` of a
    config nesting an ``agent``)."""
    owner = flat_fields(type(cfg))[name][0]
    return getattr(getattr(cfg, owner) if owner else cfg, name)


def replace_options(cfg: C, **values: Any) -> C:
    """``dataclasses.replace`` by option names: a nested config's options are replaced in it."""
    fields = flat_fields(type(cfg))
    outer: dict[str, Any] = {}
    inner: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        owner = fields[name][0]
        if owner:
            inner.setdefault(owner, {})[name] = value
        else:
            outer[name] = value
    for owner, kwargs in inner.items():
        outer[owner] = dataclasses.replace(getattr(cfg, owner), **kwargs)
    return dataclasses.replace(cfg, **outer)  # type: ignore[type-var]
