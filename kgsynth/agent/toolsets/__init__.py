"""The tool sets whose agents write SPARQL (issue 17): ``knowcoder`` (KnowCoder-A1's
``SearchTypes``, ``SearchGraphPatterns``, ``ExecuteSPARQL``) and ``isp`` (ISP-KGR's node
exploration and SPARQL execution); and ``sexpr`` (KBQA-R1's S-expression actions, issue 18),
whose expressions compile to SPARQL. Each module's ``make_tools(env)`` returns the tool table of
a :class:`~kgsynth.agent.tools.ToolEnvironment`: name -> (arity, function returning a
``ToolResult``); a function raises :class:`~kgsynth.agent.toolkit.ToolFailure` to fail a call.
Both run agent queries through :func:`sparql_result`, which adds the guard, the timeout and the
row cap of :mod:`kgsynth.agent.sparql_exec`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kgsynth.agent.toolkit import ToolHost, ToolResult

ToolTable = dict[str, tuple[int, Callable[..., "ToolResult"]]]


def make_tools(env: ToolHost) -> ToolTable:
    """The tool table of ``env.config.toolset``."""
    name = env.config.toolset
    if name == "knowcoder":
        from kgsynth.agent.toolsets.knowcoder import make_tools as knowcoder_tools

        return knowcoder_tools(env)
    if name == "isp":
        from kgsynth.agent.toolsets.isp import make_tools as isp_tools

        return isp_tools(env)
    if name == "sexpr":
        from kgsynth.agent.toolsets.sexpr import make_tools as sexpr_tools

        return sexpr_tools(env)
    raise ValueError(f"unknown tool set {name!r}")


def sparql_result(env: ToolHost, query: str, tool: str, **bounds: Any) -> ToolResult:
    """Run an agent's query (guarded, bounded: :func:`~kgsynth.agent.sparql_exec.run_agent_query`)
    as the result of tool ``tool``; a refused query fails the call as ``query_refused``."""
    from kgsynth.agent.sparql_exec import QueryRefused, run_agent_query
    from kgsynth.agent.toolkit import ErrorType, ToolFailure, ToolResult

    try:
        answer = run_agent_query(env.graph, query, **bounds)
    except QueryRefused as exc:
        raise ToolFailure(ErrorType.QUERY_REFUSED, f"{exc}.") from None
    return ToolResult(answer.text, None, tool, (query,), answer.names)
