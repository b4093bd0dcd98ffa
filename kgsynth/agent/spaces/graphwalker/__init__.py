"""GraphWalker's action space: two tools over entity names.

- ``get_relations("Entity")``: the entity's outgoing and incoming relations, ranked against
  the question by the configured strategy (BM25 in the paper; :mod:`kgsynth.agent.strategies`),
  top-k.
- ``get_triples("Entity", ["rel", …])``: the triples along those relations (either direction),
  at most n per relation and direction, shown by name.

How the results read is ``graphwalker_observations``: ``kgsynth`` (above: a header and one
``(X, r, ?)`` line a relation, one ``(X, r, Y)`` line a triple with a count of those left out)
or ``paper`` (GraphWalker App. E.3 and App. H: a flat list of relation names, ``[h, r, t]``
triples, only the first 4 relations of a get_triples call followed;
:mod:`kgsynth.agent.spaces.graphwalker.paper`).

Its oracle replays a walk's hops as one ``get_relations`` and one ``get_triples`` call each
(:mod:`kgsynth.agent.spaces.paths`), optionally ending with a look-ahead ``get_relations``; the
calls run through the same tools, so the oracle's observations are in the style the agent
reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

from kgsynth.agent.spaces.base import ActionSpace
from kgsynth.agent.spaces.graphwalker import drills, paper
from kgsynth.agent.spaces.observed import Observed
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


def _paper(env: Any) -> bool:
    return env.config.graphwalker_observations == "paper"


def get_relations(env: Any, name: str) -> ToolResult:
    entity, notes = env._entity(name)
    rels = env.graph.relations(entity.iri)
    if _paper(env):
        return paper.relation_list(env, entity, rels, notes)
    return env.relation_list(entity, rels, notes)


def get_triples(env: Any, name: str, relations: str | Sequence[str]) -> ToolResult:
    entity, notes = env._entity(name)
    if _paper(env):
        wanted = paper.capped_relations(relations)
    else:
        wanted = [relations] if isinstance(relations, str) else list(relations)
    rels, missing = env.select_relations(
        entity, wanted, unknown="no relation {listed}; call get_relations first"
    )
    if _paper(env):
        result = paper.triple_list(env, entity, rels, notes, missing)
    else:
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

    def shows_relation(self, env: Any, result: Any, call: OracleCall) -> bool:
        if _paper(env):
            return paper.shows_relation(result, call)
        return super().shows_relation(env, result, call)

    def triples_shown(self, env: Any, result: Any, call: OracleCall) -> int | None:
        if _paper(env):
            return paper.triples_shown(result, call)
        return super().triples_shown(env, result, call)

    def look_ahead_call(self, entity: str) -> OracleCall:
        q = json.dumps(entity, ensure_ascii=False)
        return OracleCall("check", f"get_relations({q})", entity, None)

    def observed_line(self, line: str, seen: Observed) -> None:
        """A kgsynth-style ``(h, r, t)`` line or a paper-style line of ``[h, r, t]`` triples
        (:mod:`.drills`)."""
        drills.observed_line(line, seen)


SPACE = GraphWalker()
