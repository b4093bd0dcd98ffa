"""What the action spaces whose agents write SPARQL share: ``knowcoder`` (KnowCoder-A1's
``SearchTypes``, ``SearchGraphPatterns``, ``ExecuteSPARQL``) and ``isp`` (ISP-KGR's node
exploration and SPARQL execution); and ``sexpr`` (KBQA-R1's S-expression actions), whose
expressions compile to SPARQL. A space's tool table (:data:`ToolTable`) maps a tool's name to
its arity and a function returning a ``ToolResult``; a function raises
:class:`~kgsynth.agent.toolkit.ToolFailure` to fail a call.
The first two run agent queries through :func:`sparql_result`, which adds the guard, the timeout and the
row cap of :mod:`kgsynth.agent.sparql_exec`; ``sexpr`` runs its compiled queries the same way
(the KG's agent path: on a store directory a child process killed at the timeout or past its
memory limit). A query stopped at its memory limit fails as :func:`memory_failure` says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kgsynth.agent import sparql_exec
from kgsynth.agent.toolkit import ErrorType, ToolFailure, ToolHost, ToolResult
from kgsynth.core.errors import KGMemoryError

ToolTable = dict[str, tuple[int, Callable[..., ToolResult]]]


def memory_failure(exc: KGMemoryError) -> ToolFailure:
    """How a query stopped past its memory limit fails the call: as a ``timeout`` (the query
    was stopped at one of its bounds, and the agent's remedy is the same: a narrower query),
    with a text that names the bound."""
    return ToolFailure(ErrorType.TIMEOUT, f"{exc} and was stopped; try a narrower query.")


def sparql_result(env: ToolHost, query: str, tool: str, **bounds: Any) -> ToolResult:
    """Run an agent's query (guarded, bounded: :func:`~kgsynth.agent.sparql_exec.run_agent_query`)
    as the result of tool ``tool``; a refused query fails the call as ``query_refused``.
    ``bounds`` (``timeout``, ``max_rows``) override the agent's config; without a ``timeout``
    the query gets ``env.config.query_timeout_s``."""
    try:
        answer = sparql_exec.run_agent_query(env.graph, query, config=env.config, **bounds)
    except sparql_exec.QueryRefused as exc:
        raise ToolFailure(ErrorType.QUERY_REFUSED, f"{exc}.") from None
    except KGMemoryError as exc:
        raise memory_failure(exc) from None
    return ToolResult(answer.text, None, tool, (query,), answer.names)
