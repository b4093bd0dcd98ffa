"""ISP-KGR's action space: a step explores entities (``<node>``) and runs queries
(``<SPARQL>``), several at once, and answers in ``\\boxed{}`` (:class:`~kgsynth.agent.protocol.IspFormat`);
the tools are :mod:`.tools`. Its oracle takes the walk's SPARQL apart into progressive and
compositional steps, each exploring a node and running a sub-query, the last the gold query
(ISP-KGR App. E.2, :mod:`.oracle`), replayed by :mod:`kgsynth.agent.spaces.sparql_oracle`."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar

from kgsynth.agent.protocol import MAX_OPERATIONS, IspFormat, Turn
from kgsynth.agent.spaces.base import ActionSpace
from kgsynth.agent.spaces.isp import drills
from kgsynth.agent.spaces.isp.oracle import decomposed_calls
from kgsynth.agent.spaces.isp.thoughts import isp_thought
from kgsynth.agent.spaces.isp.tools import TOOL_HELP, make_tools, run_step
from kgsynth.agent.spaces.observed import Observed
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.sparql import ToolTable
from kgsynth.agent.spaces.sparql_oracle import SparqlSpace, isp_operations
from kgsynth.agent.toolkit import ToolResult
from kgsynth.kg.graph import KGGraph


class Isp(SparqlSpace, ActionSpace):
    name = "isp"
    tool_help: ClassVar[list[dict[str, str]]] = TOOL_HELP
    turns = IspFormat()
    prompt = "agent_system_isp"

    def prompt_values(self) -> dict[str, Any]:
        return {"max_operations": MAX_OPERATIONS}

    def make_tools(self, env: Any) -> ToolTable:
        return make_tools(env)

    def run_turn(self, env: Any, turn: Turn) -> ToolResult:
        """A step's operations run in order, observed together."""
        return run_step(env, turn.ops)

    def oracle_calls(self, row: dict[str, Any], graph: KGGraph | None = None) -> list[OracleCall]:
        return decomposed_calls(row, graph)

    def run_oracle_call(self, env: Any, call: OracleCall) -> ToolResult:
        return run_step(env, isp_operations(call))

    # before a step that explores a node, merges branches or queries
    space_thought = staticmethod(isp_thought)

    # --- copy drills in the space's own steps (:mod:`.drills`) --------------------------

    def observed(self, text: str) -> Observed:
        """Explored names, template relations and result rows, under operation lines."""
        return drills.observed(text)

    def drill_call(self, topic: str, relations: Sequence[str], rng: random.Random) -> str:
        return drills.drill_call(topic)

    def drill_action(self, call: str) -> str:
        """The step's operations as they are, as the oracle writes a step."""
        return call


SPACE = Isp()
