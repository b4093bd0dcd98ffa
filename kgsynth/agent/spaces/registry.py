"""The action spaces by name: the five built in (loaded on first use) and any a plug-in
registers (:func:`register`). A leaf: it imports no space, so the agent config can check a
tool set's name against it."""

from __future__ import annotations

import importlib
from typing import Any

# the built-in spaces: name -> the module whose ``SPACE`` is the space
BUILTIN = {
    "graphwalker": "kgsynth.agent.spaces.graphwalker",
    "kgr1": "kgsynth.agent.spaces.kgr1",
    "knowcoder": "kgsynth.agent.spaces.knowcoder",
    "isp": "kgsynth.agent.spaces.isp",
    "sexpr": "kgsynth.agent.spaces.sexpr",
}
DEFAULT = "graphwalker"
_loaded: dict[str, Any] = {}


def register(space: Any) -> Any:
    """Make ``space`` (a :class:`~kgsynth.agent.spaces.base.ActionSpace`) available under its
    ``name``; returns it."""
    _loaded[space.name] = space
    return space


def names() -> tuple[str, ...]:
    """Every space's name: the built-in ones, then the registered ones."""
    return tuple(dict.fromkeys([*BUILTIN, *_loaded]))


def space(name: str | None = None) -> Any:
    """The space called ``name`` (None: the default, graphwalker)."""
    name = name or DEFAULT
    if name not in _loaded:
        if name not in BUILTIN:
            raise ValueError(f"unknown tool set {name!r}; known: {', '.join(names())}")
        _loaded[name] = importlib.import_module(BUILTIN[name]).SPACE
    return _loaded[name]
