"""Stage configuration: frozen dataclasses, optional YAML files, CLI overrides.

Precedence: dataclass defaults < ``--config file.yaml`` < flags given on the command line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kgsynth.errors import ConfigError

C = TypeVar("C")


def load_yaml(path: str | Path, section: str | None = None) -> dict[str, Any]:
    """A YAML mapping (or one section of it); errors name the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config: {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {path} must hold a mapping of option: value")
    if section and isinstance(data.get(section), dict):
        data = data[section]
    return data


def build_config(
    cls: type[C],
    config_file: str | Path | None,
    overrides: dict[str, Any],
    section: str | None = None,
) -> C:
    """``cls`` from its defaults, then the YAML file, then the non-None ``overrides``."""
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    if config_file:
        raw = load_yaml(config_file, section)
        for key, value in raw.items():
            name = str(key).replace("-", "_")
            if name not in fields:
                raise ConfigError(
                    f"--config: {config_file}: unknown option {key!r}; valid: {', '.join(sorted(fields))}"
                )
            values[name] = value
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
