"""GraphWalker's action space: two tools over entity names.

- ``get_relations("Entity")``: the entity's outgoing and incoming relations, ranked against
  the question by the configured strategy (BM25 in the paper; :mod:`kgsynth.agent.strategies`),
  top-k.
- ``get_triples("Entity", ["rel", …])``: the triples along those relations (either direction),
  at most n per relation and direction, shown by name.

Its oracle replays a walk's hops as one ``get_relations`` and one ``get_triples`` call each
(:mod:`kgsynth.agent.spaces.paths`), optionally ending with a look-ahead ``get_relations``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

from kgsynth.agent.spaces.base import ActionSpace
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.paths import PathSpace
from kgsynth.agent.spaces.sparql import ToolTable
from kgsynth.agent.toolkit import ToolResult

TOOL_HELP = [
    {
        "usage": 'get_relations("Entity Name")',
        "description": "the entity's relations (outgoing and incoming), most relevant first",
    },
    {
        "usage": 'get_triples("Entity Name", ["relation", ...])',
        "description": "the facts along those relations, by name",
    },
]


def get_relations(env: Any, name: str) -> ToolResult:
    entity, notes = env._entity(name)
    return env.relation_list(entity, env.graph.relations(entity.iri), notes)


def get_triples(env: Any, name: str, relations: str | Sequence[str]) -> ToolResult:
    entity, notes = env._entity(name)
    wanted = [relations] if isinstance(relations, str) else list(relations)
    rels, missing = env.select_relations(
        entity, wanted, unknown="no relation {listed}; call get_relations first"
    )
    result = env.triple_list(entity, rels, notes, missing)
    env.strategies.ranking.follow(rels)
    return result


class GraphWalker(PathSpace, ActionSpace):
    name = "graphwalker"
    tool_help: ClassVar[list[dict[str, str]]] = TOOL_HELP
    look_ahead = True
    ranks_relations = True

    def make_tools(self, env: Any) -> ToolTable:
        return {
            "get_relations": (1, lambda e: get_relations(env, e)),
            "get_triples": (2, lambda e, r: get_triples(env, e, r)),
        }

    def hop_calls(self, entity: str, hop: dict[str, Any]) -> tuple[OracleCall, OracleCall]:
        q = json.dumps(entity, ensure_ascii=False)
        rel = json.dumps(hop["relation"], ensure_ascii=False)
        return (
            OracleCall("relations", f"get_relations({q})", entity, hop),
            OracleCall("triples", f"get_triples({q}, [{rel}])", entity, hop),
        )

    def look_ahead_call(self, entity: str) -> OracleCall:
        q = json.dumps(entity, ensure_ascii=False)
        return OracleCall("check", f"get_relations({q})", entity, None)


SPACE = GraphWalker()
