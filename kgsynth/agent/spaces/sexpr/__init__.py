"""KBQA-R1's action space: S-expression actions (``Find_relation``, ``Merge``, ``Order``,
``Compare``, ``Time_constraint``, ``Count``) in its bracket syntax (:mod:`.syntax`), with
relation gating (:mod:`.gate`), over compiled SPARQL (:mod:`.tools`). Its oracle builds the
actions from the question's S-expression (:mod:`.oracle`)."""

from __future__ import annotations

from typing import Any, ClassVar

from kgsynth.agent.spaces.base import ActionSpace
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.sexpr.oracle import replay_sexpr, sexpr_oracle_calls, sexpr_reference
from kgsynth.agent.spaces.sexpr.syntax import TOOL_HELP, parse_action
from kgsynth.agent.spaces.sexpr.tools import make_tools
from kgsynth.agent.spaces.sparql import ToolTable
from kgsynth.agent.toolcall import ToolCall
from kgsynth.kg.graph import KGGraph


class SExpr(ActionSpace):
    name = "sexpr"
    tool_help: ClassVar[list[dict[str, str]]] = TOOL_HELP
    prompt = "agent_system_sexpr"
    oracle_from = "sexpr"

    def make_tools(self, env: Any) -> ToolTable:
        return make_tools(env)

    def parse_action(self, text: str) -> ToolCall:
        return parse_action(text)

    def oracle_calls(self, row: dict[str, Any], graph: KGGraph | None = None) -> list[OracleCall]:
        """Actions naming entities the row does not name take ``graph``'s labels."""
        return sexpr_oracle_calls(row, graph)

    def reference_text(self, row: dict[str, Any], graph: KGGraph | None = None) -> str:
        """Numbered as KBQA-R1 shows it: ``Action1: Find_relation [ … ]``."""
        return sexpr_reference(self.oracle_calls(row, graph))

    def replay(self, row: dict[str, Any], env: Any, **options: Any) -> list[tuple[OracleCall, Any]]:
        return replay_sexpr(row, env)


SPACE = SExpr()
