"""KG-R1's action space (kg-r1.txt §3.2): four one-way tools.

``get_tail_relations(e)`` relations with ``e`` as head (``e -r-> ?``), ``get_head_relations(e)``
relations with ``e`` as tail (``? -r-> e``), ``get_tail_entities(e, r)`` the tails of
``(e, r, ?)``, ``get_head_entities(e, r)`` the heads of ``(?, r, e)``. As in the paper, each
returns the full set: relations by name, entities in the environment's neighbour order, in the
paper's flat lists (:mod:`.observe`; ``kgr1_observation``). ``kgr1_max_relations`` /
``kgr1_max_entities`` cap them; a cap that applies says so. With ``kgr1_subgraph_hops`` the
tools answer from the question's subgraph alone (:mod:`.subgraph`, §4.1). Answers are read as
the paper writes them, comma-separated (:mod:`.answers`). The oracle is the path oracle
(:mod:`kgsynth.agent.spaces.paths`) with the one-way calls.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any, ClassVar

from kgsynth.agent.spaces.base import ActionSpace
from kgsynth.agent.spaces.kgr1 import drills
from kgsynth.agent.spaces.kgr1.answers import Kgr1Format
from kgsynth.agent.spaces.kgr1.observe import SIDES, entities_one_way, relations_one_way
from kgsynth.agent.spaces.kgr1.subgraph import QuestionSubgraph, WholeKG
from kgsynth.agent.spaces.observed import Observed
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.paths import PathSpace
from kgsynth.agent.spaces.sparql import ToolTable

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


def kg_view(env: Any) -> QuestionSubgraph | WholeKG:
    """What the episode's tools read: the question's subgraph (``kgr1_subgraph_hops``) or the
    whole KG."""
    hops = env.config.kgr1_subgraph_hops
    if hops is None:
        return WholeKG(env.graph)
    return QuestionSubgraph(env.graph, env.topics, hops)


class KgR1(PathSpace, ActionSpace):
    name = "kgr1"
    tool_help: ClassVar[list[dict[str, str]]] = TOOL_HELP
    turns: ClassVar[Kgr1Format] = Kgr1Format()

    def make_tools(self, env: Any) -> ToolTable:
        view = kg_view(env)  # one per episode: the subgraph is the question's
        return {
            "get_head_relations": (1, lambda e: relations_one_way(env, view, e, "in")),
            "get_tail_relations": (1, lambda e: relations_one_way(env, view, e, "out")),
            "get_head_entities": (2, lambda e, r: entities_one_way(env, view, e, r, "in")),
            "get_tail_entities": (2, lambda e, r: entities_one_way(env, view, e, r, "out")),
        }

    def hop_calls(self, entity: str, hop: dict[str, Any]) -> tuple[OracleCall, OracleCall]:
        side = "head" if hop["inverse"] else "tail"
        q = json.dumps(entity, ensure_ascii=False)
        rel = json.dumps(hop["relation"], ensure_ascii=False)
        return (
            OracleCall("relations", f"get_{side}_relations({q})", entity, hop),
            OracleCall("triples", f"get_{side}_entities({q}, {rel})", entity, hop),
        )

    # --- copy drills (kgsynth.train.drills) ------------------------------------------------

    def observed_line(self, line: str, seen: Observed) -> None:
        """The flat lists' triples and relations, or a triple line (:mod:`.drills`)."""
        drills.observed_line(line, seen)

    def drill_call(self, topic: str, relations: Sequence[str], rng: random.Random) -> str:
        """``get_tail_relations`` or ``get_tail_entities``, half and half."""
        q = json.dumps(topic, ensure_ascii=False)
        if rng.random() < 0.5:
            return f"get_tail_relations({q})"
        return f"get_tail_entities({q}, {json.dumps(rng.choice(relations), ensure_ascii=False)})"

    # --- the path oracle reading the flat lists ----------------------------------------------

    def shows_relation(self, env: Any, result: Any, call: OracleCall) -> bool:
        """Whether the flat relation list names the hop's relation (it lists one direction,
        the hop's); the ``triples`` form is read as graphwalker's."""
        if env.config.kgr1_observation == "triples":
            return super().shows_relation(env, result, call)
        hop = call.hop
        assert hop is not None
        side = SIDES["in" if hop["inverse"] else "out"].capitalize()
        for line in result.text.splitlines():
            if line.startswith(f"{side} relations for entity "):
                return hop["relation"] in line.split(": ", 1)[1].split(", ")
        return False

    def triples_shown(self, env: Any, result: Any, call: OracleCall) -> int | None:
        """How many entities the flat list shows, None where a cap or the length cut left
        some out."""
        if env.config.kgr1_observation == "triples":
            return super().triples_shown(env, result, call)
        if "capped): " in result.text or result.text.endswith(" more)"):
            return None
        return len([e for e in result.entities if e != call.entity])


SPACE = KgR1()
