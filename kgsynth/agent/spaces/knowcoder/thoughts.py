"""KnowCoder-A1's template thoughts (:meth:`~kgsynth.agent.spaces.base.ActionSpace.thought`):
before a type search, a graph-pattern search, a query, and a trial-and-error correction
(:mod:`.trial`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kgsynth.agent.spaces.sparql_oracle import query_thought


def knowcoder_thought(
    kind: str,
    entity: str,
    hop: dict[str, Any] | None,
    relations: Sequence[str],
    mistake: dict[str, str] | None,
) -> str | None:
    """The thought before a knowcoder step of ``kind`` (``entity``: the type name for
    ``types``); None for a kind it has none for."""
    if kind == "types":
        return f"The answers are of type {entity}: I look it up among the KG's types."
    if kind == "patterns":  # the question ranks the patterns (.oracle.pattern_call)
        return f"I look for graph patterns around {entity} that match the question."
    if kind == "execute":
        return query_thought(entity, relations)
    if kind == "retry" and mistake:
        seen = "The query returned no rows" if mistake["rows"] == "0" else "Those rows do not fit"
        if mistake["kind"] == "direction":
            return f"{seen}: {mistake['right']} runs the other way. I reverse it and query again."
        return (
            f"{seen}: {mistake['wrong']} is the wrong relation. I query {mistake['right']} instead."
        )
    return None
