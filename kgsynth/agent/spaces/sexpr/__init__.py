"""KBQA-R1's action space: S-expression actions (``Find_relation``, ``Merge``, ``Order``,
``Compare``, ``Time_constraint``, ``Count``) in its bracket syntax (:mod:`.syntax`), with
relation gating (:mod:`.gate`), over compiled SPARQL (:mod:`.tools`), in its turn format
(:mod:`.turns`: ``<action>`` blocks of one or more actions, space-separated answers). Its
oracle builds the actions from the question's S-expression (:mod:`.oracle`); with
``trial_and_error`` a seeded share of questions also gets a relation guessed wrong, the gate's
answer and the fix (:mod:`.trial`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar

from kgsynth.agent.protocol import Turn
from kgsynth.agent.spaces.base import ActionSpace
from kgsynth.agent.spaces.observed import Observed
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.sexpr import drills
from kgsynth.agent.spaces.sexpr.oracle import replay_sexpr, sexpr_oracle_calls, sexpr_reference
from kgsynth.agent.spaces.sexpr.syntax import TOOL_HELP, parse_action
from kgsynth.agent.spaces.sexpr.thoughts import sexpr_thought
from kgsynth.agent.spaces.sexpr.tools import make_tools
from kgsynth.agent.spaces.sexpr.trial import trial_steps
from kgsynth.agent.spaces.sexpr.turns import SEXPR_FORMAT, run_actions
from kgsynth.agent.spaces.sparql import ToolTable
from kgsynth.agent.toolcall import ToolCall
from kgsynth.agent.toolkit import ToolResult
from kgsynth.kg.graph import KGGraph


class SExpr(ActionSpace):
    name = "sexpr"
    tool_help: ClassVar[list[dict[str, str]]] = TOOL_HELP
    turns = SEXPR_FORMAT
    prompt = "agent_system_sexpr"
    oracle_from = "sexpr"
    trial_and_error = True

    def make_tools(self, env: Any) -> ToolTable:
        return make_tools(env)

    def parse_action(self, text: str) -> ToolCall:
        return parse_action(text)

    def run_turn(self, env: Any, turn: Turn) -> ToolResult:
        """The turn's ``<action>`` block: its actions in order, observed together."""
        assert turn.query is not None
        return run_actions(env, turn.query)

    def oracle_calls(self, row: dict[str, Any], graph: KGGraph | None = None) -> list[OracleCall]:
        """Actions naming entities the row does not name take ``graph``'s labels."""
        return sexpr_oracle_calls(row, graph)

    def reference_text(self, row: dict[str, Any], graph: KGGraph | None = None) -> str:
        """Numbered as KBQA-R1 shows it: ``Action1: Find_relation [ … ]``."""
        return sexpr_reference(self.oracle_calls(row, graph))

    def reference_progress(self, env: Any, episode: Any) -> int:
        """Gold action i makes expression i: the next is the one after those made so far (a
        failed action makes none, a turn of several actions makes several)."""
        return len(env.session.expressions)

    def replay(self, row: dict[str, Any], env: Any, **options: Any) -> list[tuple[OracleCall, Any]]:
        return replay_sexpr(row, env)

    def trial(
        self, row: dict[str, Any], env: Any, steps: list[Any], rng: random.Random
    ) -> list[Any] | None:
        """A ``Find_relation`` first tried along a wrong relation, then the gold one
        (:mod:`.trial`)."""
        return trial_steps(row, env, steps, rng)

    # before one of KBQA-R1's actions
    space_thought = staticmethod(sexpr_thought)

    def observed_line(self, line: str, seen: Observed) -> None:
        """An expression's results, a relation list, a triple (:mod:`.drills`)."""
        drills.observed_line(line, seen)

    def drill_observation(self, head: str, relation: str, tails: Sequence[str]) -> str:
        return drills.drill_observation(tails)

    def drill_call(self, topic: str, relations: Sequence[str], rng: random.Random) -> str:
        return drills.drill_call(topic, relations, rng)


SPACE = SExpr()
