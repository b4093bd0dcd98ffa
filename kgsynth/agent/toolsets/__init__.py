"""The tool sets whose agents write SPARQL (issue 17): ``knowcoder`` (KnowCoder-A1's
``SearchTypes``, ``SearchGraphPatterns``, ``ExecuteSPARQL``) and ``isp`` (ISP-KGR's node
exploration and SPARQL execution); and ``sexpr`` (KBQA-R1's S-expression actions, issue 18),
whose expressions compile to SPARQL. Each module's ``make_tools(env)`` returns the tool table of
a :class:`~kgsynth.agent.tools.ToolEnvironment`: name -> (arity, function returning a
``ToolResult``); a function raises :class:`~kgsynth.agent.toolkit.ToolFailure` to fail a call.
Both run agent queries through :func:`sparql_result`, which adds the guard, the timeout and the
row cap of :mod:`kgsynth.agent.sparql_exec`; ``sexpr`` runs its compiled queries the same way
(the KG's agent path: on a store directory a child process killed at the timeout or past its
memory limit). A query stopped at its memory limit fails as :func:`memory_failure` says."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kgsynth.agent.toolkit import ToolFailure, ToolHost, ToolResult
    from kgsynth.errors import KGMemoryError

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


def memory_failure(exc: KGMemoryError) -> ToolFailure:
    """How a query stopped past its memory limit fails the call: as a ``timeout`` (the query
    was stopped at one of its bounds, and the agent's remedy is the same: a narrower query),
    with a text that names the bound."""
    from kgsynth.agent.toolkit import ErrorType, ToolFailure

    return ToolFailure(ErrorType.TIMEOUT, f"{exc} and was stopped; try a narrower query.")


def sparql_result(env: ToolHost, query: str, tool: str, **bounds: Any) -> ToolResult:
    """Run an agent's query (guarded, bounded: :func:`~kgsynth.agent.sparql_exec.run_agent_query`)
    as the result of tool ``tool``; a refused query fails the call as ``query_refused``.
    ``bounds`` (``timeout``, ``max_rows``) override the agent's config; without a ``timeout``
    the query gets ``env.config.query_timeout_s``."""
    from kgsynth.agent.sparql_exec import QueryRefused, run_agent_query
    from kgsynth.agent.toolkit import ErrorType, ToolFailure, ToolResult
    from kgsynth.errors import KGMemoryError

    try:
        answer = run_agent_query(env.graph, query, config=env.config, **bounds)
    except QueryRefused as exc:
        raise ToolFailure(ErrorType.QUERY_REFUSED, f"{exc}.") from None
    except KGMemoryError as exc:
        raise memory_failure(exc) from None
    return ToolResult(answer.text, None, tool, (query,), answer.names)
