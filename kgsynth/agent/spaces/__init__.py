"""The agent's action spaces, one package each: ``graphwalker`` (GraphWalker), ``kgr1``
(KG-R1), ``knowcoder`` (KnowCoder-A1), ``isp`` (ISP-KGR) and ``sexpr`` (KBQA-R1). A space is an
:class:`~kgsynth.agent.spaces.base.ActionSpace`: its tools, its turn format, its system prompt
and its oracle, behind the one interface synthesis, the filter, eval and RL call; code outside
a space's package asks :func:`space` for it by the config's ``toolset`` and never tests the
name. Shared pieces: :mod:`.paths` (the walk-replay oracle of graphwalker and kgr1),
:mod:`.sparql` and :mod:`.sparql_oracle` (what the SPARQL-writing spaces share),
:mod:`.oracle_call`. A new space is a package with a ``SPACE`` object, registered with
:func:`~kgsynth.agent.spaces.registry.register` (ARCHITECTURE.md, "Adding an action space").
"""

from __future__ import annotations

from typing import Any

from kgsynth.agent.protocol import Turn
from kgsynth.agent.spaces.registry import names, register, space
from kgsynth.agent.topics import in_mention_order


def parse_turn(text: str, toolset: str | None = None) -> Turn:
    """One assistant message parsed in the turn format of ``toolset`` (None: graphwalker's)."""
    return space(toolset).turns.parse_turn(text)


def close_action(text: str, toolset: str | None = None) -> str:
    """A generation cut after its first action, in the turn format of ``toolset``."""
    return space(toolset).turns.close_action(text)


def stop_sequences(toolset: str | None = None) -> tuple[str, ...]:
    """What a policy of ``toolset`` is sampled until."""
    return space(toolset).turns.stop_sequences


def oracle_calls(row: dict[str, Any], toolset: str, graph: Any = None) -> list[Any]:
    """The gold action sequence of a synthesized question in the space ``toolset`` (a
    conjunction's branches in the order the question names their topics)."""
    return space(toolset).oracle_calls(in_mention_order(row), graph)


def reference_text(row: dict[str, Any], toolset: str, graph: Any = None) -> str:
    """The numbered gold actions a referenced rollout in ``toolset`` is shown (in the order of
    :func:`oracle_calls`)."""
    return space(toolset).reference_text(in_mention_order(row), graph)


def replay(row: dict[str, Any], env: Any, **options: Any) -> list[tuple[Any, Any]]:
    """The oracle's calls run in ``env`` (its space's ``replay``, in the order of
    :func:`oracle_calls`)."""
    return env.space.replay(in_mention_order(row), env, **options)


__all__ = [
    "close_action",
    "names",
    "oracle_calls",
    "parse_turn",
    "reference_text",
    "register",
    "replay",
    "space",
    "stop_sequences",
]
