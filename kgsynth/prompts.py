"""Prompt templates (the package's ``kgsynth/resources/prompts/*.j2``), rendered with Jinja2 and
``StrictUndefined``: a missing variable is an error, never an empty string."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from kgsynth.core.errors import ConfigError
from kgsynth.resources import prompts_dir


@cache
def _env(directory: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        autoescape=False,
    )


def render(name: str, directory: str | Path | None = None, **variables: Any) -> str:
    """Render the packaged template ``<name>.j2`` (or ``directory/<name>.j2``)."""
    directory = str(directory or prompts_dir())
    try:
        return _env(directory).get_template(f"{name}.j2").render(**variables).strip()
    except jinja2.TemplateNotFound:
        raise ConfigError(f"prompt template {name}.j2 not found in {directory}") from None
    except jinja2.UndefinedError as exc:
        raise ConfigError(f"prompt template {name}.j2: {exc}") from None


def prompt_hash(*names: str, directory: str | Path | None = None) -> str:
    """A short hash of the templates' sources (recorded as the generator's prompt version)."""
    digest = hashlib.sha256()
    for name in names:
        digest.update((Path(directory or prompts_dir()) / f"{name}.j2").read_bytes())
    return digest.hexdigest()[:12]
