"""ISP-KGR's template thoughts (:meth:`~kgsynth.agent.spaces.base.ActionSpace.thought`): before
a step that explores a node, one that merges branches, and one that queries (the decomposed
cold start's hop steps, kind ``triples``, take the path spaces' thought)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kgsynth.agent.spaces.sparql_oracle import query_thought


def isp_thought(
    kind: str,
    entity: str,
    hop: dict[str, Any] | None,
    relations: Sequence[str],
    mistake: dict[str, str] | None,
) -> str | None:
    """The thought before an isp step of ``kind``; None for a kind it has none for."""
    if kind == "node":
        return f"I explore the relations around {entity}."
    if kind == "merge":
        return f"Both conditions must hold: I keep what {entity} have in common."
    if kind == "sparql":
        return query_thought(entity, relations)
    return None
