"""KnowCoder-A1's action space: ``SearchTypes``, ``SearchGraphPatterns``, ``ExecuteSPARQL``
(:mod:`.tools`; ``SearchGraphPatterns`` as §4.1 defines it: :mod:`.patterns`), its answers in
``\\boxed{}`` (:mod:`.turns`, §4.3.2) and its own system prompt (``prompts/knowcoder_system.j2``).
Its oracle searches the answers' type (:mod:`.oracle`), the walk's graph
pattern and runs the walk's SPARQL (:mod:`kgsynth.agent.spaces.sparql_oracle`); with
``trial_and_error`` a seeded share of questions gets a failed try and its fix first
(:mod:`.trial`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

from kgsynth.agent.spaces.base import ActionSpace
from kgsynth.agent.spaces.knowcoder import drills
from kgsynth.agent.spaces.knowcoder.oracle import answer_type, pattern_call
from kgsynth.agent.spaces.knowcoder.patterns import search_variable_patterns
from kgsynth.agent.spaces.knowcoder.thoughts import knowcoder_thought
from kgsynth.agent.spaces.knowcoder.tools import (
    TOOL_HELP,
    execute_sparql,
    search_graph_patterns,
    search_types,
)
from kgsynth.agent.spaces.knowcoder.trial import trial_steps
from kgsynth.agent.spaces.knowcoder.turns import KnowCoderFormat
from kgsynth.agent.spaces.observed import Observed
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.sparql import ToolTable
from kgsynth.agent.spaces.sparql_oracle import (
    SparqlSpace,
    check_syntax,
    knowcoder_oracle_calls,
)
from kgsynth.agent.toolkit import ToolResult
from kgsynth.kg.graph import KGGraph


class KnowCoder(SparqlSpace, ActionSpace):
    name = "knowcoder"
    tool_help: ClassVar[list[dict[str, str]]] = TOOL_HELP
    trial_and_error = True
    cold_start = True
    turns = KnowCoderFormat()
    prompt = "knowcoder_system"

    def make_tools(self, env: Any) -> ToolTable:
        """The tool table over ``env``; ``SearchGraphPatterns`` as the agent's
        ``knowcoder_patterns`` says (``variable``: :mod:`.patterns`, the paper's; ``entities``:
        :func:`.tools.search_graph_patterns`)."""
        patterns = search_graph_patterns
        if getattr(env.config, "knowcoder_patterns", "variable") == "variable":
            patterns = search_variable_patterns
        return {
            "SearchTypes": (1, lambda text: search_types(env, text)),
            "SearchGraphPatterns": (2, lambda sketch, hint: patterns(env, sketch, hint)),
            "ExecuteSPARQL": (1, lambda query: execute_sparql(env, query)),
        }

    def oracle_calls(self, row: dict[str, Any], graph: KGGraph | None = None) -> list[OracleCall]:
        """Without ``graph`` the ``SearchTypes`` step is left out (it needs the KG)."""
        calls = knowcoder_oracle_calls(row, answer_type(graph, row) if graph is not None else None)
        # the sketch binds ?x to the topic entities (§4.1, App. F); the question ranks them
        sketch = pattern_call(row)
        return [replace(c, call=sketch) if c.kind == "patterns" else c for c in calls]

    def run_oracle_call(self, env: Any, call: OracleCall) -> ToolResult:
        check_syntax(call)
        return env.execute(call.call)

    def trial(
        self, row: dict[str, Any], env: Any, steps: list[Any], rng: random.Random
    ) -> list[Any] | None:
        """A wrong ``ExecuteSPARQL`` before the gold one (:mod:`.trial`)."""
        return trial_steps(row, env, steps, rng)

    # before a type search, a pattern search, a query or a correction
    space_thought = staticmethod(knowcoder_thought)

    # --- copy drills in the space's own calls (:mod:`.drills`) --------------------------

    def observed_line(self, line: str, seen: Observed) -> None:
        """A pattern search's heading or row; a result table is read by the shared reader."""
        drills.observed_line(line, seen)

    def drill_call(self, topic: str, relations: Sequence[str], rng: random.Random) -> str:
        return drills.drill_call(topic)


SPACE = KnowCoder()
