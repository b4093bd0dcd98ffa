"""KG-R1's action space: four one-way tools.

``get_tail_relations(e)`` relations with ``e`` as head (``e -r-> ?``), ``get_head_relations(e)``
relations with ``e`` as tail (``? -r-> e``), ``get_tail_entities(e, r)`` the tails of
``(e, r, ?)``, ``get_head_entities(e, r)`` the heads of ``(?, r, e)``. As in the paper, each
returns the full set: relations by name, entities in the environment's neighbour order.
``kgr1_max_relations`` / ``kgr1_max_entities`` cap them; a cap that applies says so in the
observation ("showing 10 of 37 (capped)"). The oracle is the path oracle
(:mod:`kgsynth.agent.spaces.paths`) with the one-way calls.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from kgsynth.agent.spaces.base import ActionSpace
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.paths import PathSpace
from kgsynth.agent.spaces.sparql import ToolTable
from kgsynth.agent.toolkit import ErrorType, ToolFailure, ToolResult

TOOL_HELP = [
    {
        "usage": 'get_tail_relations("Entity Name")',
        "description": "relations r with (entity, r, ?)",
    },
    {
        "usage": 'get_head_relations("Entity Name")',
        "description": "relations r with (?, r, entity)",
    },
    {
        "usage": 'get_tail_entities("Entity Name", "relation")',
        "description": "the tails of (entity, relation, ?)",
    },
    {
        "usage": 'get_head_entities("Entity Name", "relation")',
        "description": "the heads of (?, relation, entity)",
    },
]


def relations_one_way(env: Any, name: str, direction: str) -> ToolResult:
    """The relations of ``name`` going ``direction``: the full set by name, capped by
    ``kgr1_max_relations``."""
    entity, notes = env._entity(name)
    rels = [r for r in env.graph.relations(entity.iri) if r.direction == direction]
    cap = env.config.kgr1_max_relations
    ranked = sorted(rels, key=lambda r: (r.name, r.direction))[:cap]
    head = f'Relations of "{entity.name}"'
    if len(ranked) < len(rels):
        head += f" (showing {len(ranked)} of {len(rels)} (capped))"
    return env.relation_list(entity, rels, notes, listed=(ranked, head + ":"))


def entities_one_way(env: Any, name: str, relation: object, direction: str) -> ToolResult:
    """The entities one relation reaches from ``name`` going ``direction``, capped by
    ``kgr1_max_entities``."""
    if not isinstance(relation, str):
        raise ToolFailure(ErrorType.WRONG_ARGUMENTS, "give one relation name as a string.")
    entity, notes = env._entity(name)
    rels, _ = env.select_relations(entity, [relation], direction)
    return env.triple_list(entity, rels, notes, limit=env.config.kgr1_max_entities, capped=True)


class KgR1(PathSpace, ActionSpace):
    name = "kgr1"
    tool_help: ClassVar[list[dict[str, str]]] = TOOL_HELP

    def make_tools(self, env: Any) -> ToolTable:
        return {
            "get_head_relations": (1, lambda e: relations_one_way(env, e, "in")),
            "get_tail_relations": (1, lambda e: relations_one_way(env, e, "out")),
            "get_head_entities": (2, lambda e, r: entities_one_way(env, e, r, "in")),
            "get_tail_entities": (2, lambda e, r: entities_one_way(env, e, r, "out")),
        }

    def hop_calls(self, entity: str, hop: dict[str, Any]) -> tuple[OracleCall, OracleCall]:
        side = "head" if hop["inverse"] else "tail"
        q = json.dumps(entity, ensure_ascii=False)
        rel = json.dumps(hop["relation"], ensure_ascii=False)
        return (
            OracleCall("relations", f"get_{side}_relations({q})", entity, hop),
            OracleCall("triples", f"get_{side}_entities({q}, {rel})", entity, hop),
        )


SPACE = KgR1()
