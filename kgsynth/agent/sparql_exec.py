"""Agent-written SPARQL, run safely: the tool that KnowCoder-A1's ``ExecuteSPARQL`` and ISP's
``<SPARQL>`` action share.

Every query goes through the KG's read-only guard (:mod:`kgsynth.kg.guard`: one query, no
update, no SERVICE, text that parses), must be a SELECT or an ASK, and runs under a timeout and
a row cap. A refused query raises :class:`QueryRefused`, a timeout or an unreachable KG the
KG's typed errors, and the tool environment turns each into a typed result the agent reads, so
nothing an agent writes escapes the tool. A result past the row cap shows its
first rows and says that more were cut.

The query runs through the KG's agent path (:meth:`kgsynth.kg.base.KG.agent_select_iter`):
on a store directory, in a child process that is killed at the timeout or past its memory
limit (:mod:`kgsynth.kg.embedded`), because pyoxigraph cannot stop a query in-process, and a
``COUNT`` over a cross product or a ``(p|^p)*`` path would otherwise hold the episode (and
the eval, RL or synthesis run around it) for as long as it computes. The timeout is the
agent's ``query_timeout_s`` setting (:class:`~kgsynth.agent.config.AgentConfig`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kgsynth.agent.config import AGENT_QUERY_TIMEOUT_S, AgentConfig
from kgsynth.core.errors import QueryRejectedError, RowLimitError
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.terms import Term

__all__ = [
    "AGENT_MAX_ROWS",
    "AGENT_QUERY_TIMEOUT_S",
    "QueryAnswer",
    "QueryRefused",
    "agent_timeout",
    "query_form",
    "run_agent_query",
]

AGENT_MAX_ROWS = 50
"""Rows an agent's query may show; the query stops at the next one."""

_FORM = re.compile(
    r"(?is)^\s*(?:(?:PREFIX\s+[^\s:]*:\s*<[^>]*>|BASE\s*<[^>]*>)\s*)*(SELECT|ASK|CONSTRUCT|DESCRIBE)\b"
)


class QueryRefused(Exception):
    """The agent's query was refused before it ran (the guard, or a form other than SELECT and
    ASK); the message says why, in words the agent can act on."""


@dataclass(frozen=True)
class QueryAnswer:
    """What an agent's query returned, rendered: the text, the entity names in it, and
    whether rows past the cap were cut."""

    text: str
    names: tuple[str, ...]
    capped: bool


def query_form(query: str) -> str | None:
    """SELECT, ASK, CONSTRUCT or DESCRIBE (after any PREFIX/BASE lines); None if none."""
    m = _FORM.match(query)
    return m.group(1).upper() if m else None


def agent_timeout(timeout: float | None, config: AgentConfig | None) -> float:
    """The seconds an agent's query gets: ``timeout`` when given (a tool set's own bound),
    else the agent's ``query_timeout_s``, else :data:`AGENT_QUERY_TIMEOUT_S`."""
    if timeout is not None:
        return timeout
    return config.query_timeout_s if config is not None else AGENT_QUERY_TIMEOUT_S


def run_agent_query(
    graph: KGGraph,
    query: str,
    *,
    timeout: float | None = None,
    max_rows: int = AGENT_MAX_ROWS,
    config: AgentConfig | None = None,
) -> QueryAnswer:
    """Run ``query`` (guarded, bounded: the KG's agent path, see the module doc) and render
    the rows with entity names. ``timeout`` defaults to ``config.query_timeout_s``
    (:func:`agent_timeout`); the tool sets pass the environment's config, and a timeout only
    where a caller sets one.

    Raises :class:`QueryRefused` for a query the agent must rewrite, and the KG's own
    :class:`~kgsynth.core.errors.KGTimeoutError` / :class:`~kgsynth.core.errors.KGUnavailableError` /
    :class:`~kgsynth.core.errors.KGMemoryError`, which the tool sets and the tool environment map
    to typed results."""
    form = query_form(query)
    if form in ("CONSTRUCT", "DESCRIBE"):
        raise QueryRefused(f"{form} queries are not allowed; write a SELECT or an ASK query")
    kg = graph.kg
    seconds = agent_timeout(timeout, config)
    try:
        if form == "ASK":
            answer = kg.agent_ask(query, timeout=seconds)
            return QueryAnswer("true" if answer else "false", (), False)
        rows: list[dict[str, Term]] = []
        capped = False
        try:
            for row in kg.agent_select_iter(query, timeout=seconds, max_rows=max_rows):
                rows.append(row)
        except RowLimitError:
            capped = True
    except QueryRejectedError as exc:
        reason = str(exc).removeprefix("refused: ")
        raise QueryRefused(f"the query was refused: {reason}") from None
    variables = list(dict.fromkeys(v for r in rows for v in r))
    if not rows:
        return QueryAnswer("no rows", (), False)
    names: dict[str, None] = {}
    lines = ["\t".join(f"?{v}" for v in variables)]
    for row in rows:
        cells = []
        for v in variables:
            term = row.get(v)
            if term is None:
                cells.append("")
                continue
            shown = graph.display_name(term)
            if term.kind == "iri":
                names.setdefault(shown, None)
            cells.append(shown.replace("\t", " ").replace("\n", " "))
        lines.append("\t".join(cells))
    if capped:
        lines.append(
            f"[... more rows; showing the first {len(rows)}: add a LIMIT or narrow the query]"
        )
    return QueryAnswer("\n".join(lines), tuple(names), capped)
