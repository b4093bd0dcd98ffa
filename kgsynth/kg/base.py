"""The KG protocol every backend implements: read-only SPARQL 1.1 SELECT/ASK over one KG."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

from kgsynth.core.errors import ConfigError, RowLimitError
from kgsynth.kg.profiles import KGProfile
from kgsynth.kg.terms import Row

DEFAULT_MAX_ROWS = 100_000  # the row cap of every query unless a caller or the config says
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 365 * 24 * 3600.0
"""The longest timeout a query may be given (a year): a deadline much further off overflows
the clock."""


class KG(abc.ABC):
    """A knowledge graph store reachable through read-only SPARQL (the embedded Oxigraph store
    or an endpoint). Stages that think in entities and relations use the
    :class:`~kgsynth.kg.graph.KGGraph` built over it.

    Backends implement :meth:`_select_iter` (or :meth:`_select`) and :meth:`_ask`; the public
    methods run the read-only guard first and send the text it checked, so nothing a caller
    passes can become an UPDATE or reach another endpoint. Every query is bounded: by a
    timeout (``timeout`` per call, else the backend's ``timeout``) and by a row cap
    (``max_rows`` per call, else :attr:`max_rows`); a result past the cap raises
    :class:`~kgsynth.core.errors.RowLimitError` as soon as its first extra row arrives.
    """

    profile: KGProfile
    location: str
    max_rows: int = DEFAULT_MAX_ROWS
    timeout: float = DEFAULT_TIMEOUT_S

    def select(
        self, query: str, *, timeout: float | None = None, max_rows: int | None = None
    ) -> list[Row]:
        """Run a SELECT query; unbound variables are absent from a row."""
        return list(self.select_iter(query, timeout=timeout, max_rows=max_rows))

    def select_iter(
        self, query: str, *, timeout: float | None = None, max_rows: int | None = None
    ) -> Iterator[Row]:
        """Run a SELECT query and yield its rows; a backend that evaluates lazily (embedded)
        stops working when the caller stops reading, others fetch the whole result first."""
        from kgsynth.kg import guard

        text = guard.ensure_read_only(query)
        return self._capped(self._select_iter(text, timeout), self._row_cap(max_rows))

    def ask(self, query: str, *, timeout: float | None = None) -> bool:
        """Run an ASK query."""
        from kgsynth.kg import guard

        return self._ask(guard.ensure_read_only(query), timeout)

    def agent_select_iter(
        self, query: str, *, timeout: float | None = None, max_rows: int | None = None
    ) -> Iterator[Row]:
        """:meth:`select_iter` for a query whose text an agent wrote, which may run as long and
        take as much memory as the engine lets it. A backend whose queries cannot be stopped
        in-process runs it where it can be (the embedded store: a child process); an endpoint
        is bounded by its HTTP timeout, so by default this is :meth:`select_iter`."""
        return self.select_iter(query, timeout=timeout, max_rows=max_rows)

    def agent_ask(self, query: str, *, timeout: float | None = None) -> bool:
        """:meth:`ask` for a query whose text an agent wrote (see :meth:`agent_select_iter`)."""
        return self.ask(query, timeout=timeout)

    def _row_cap(self, max_rows: int | None) -> int:
        cap = self.max_rows if max_rows is None else max_rows
        if cap < 1:
            raise ConfigError(f"max_rows: {cap} is not a row cap (use 1 or more)")
        return cap

    @staticmethod
    def _capped(rows: Iterator[Row], cap: int) -> Iterator[Row]:
        for n, row in enumerate(rows):
            if n == cap:
                close = getattr(rows, "close", None)
                if close is not None:  # stop the engine's evaluation now
                    close()
                raise RowLimitError(
                    f"the query returned more than {cap:,} rows (the row cap, max_rows); "
                    "add a LIMIT or raise the cap"
                )
            yield row

    @abc.abstractmethod
    def _select(self, query: str, timeout: float | None) -> list[Row]: ...

    @abc.abstractmethod
    def _ask(self, query: str, timeout: float | None) -> bool: ...

    def _select_iter(self, query: str, timeout: float | None) -> Iterator[Row]:
        """The rows of an already-checked query (what :meth:`select` reads)."""
        return iter(self._select(query, timeout))

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """What this KG is, for manifests: backend, location, profile, counts when known."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's resources."""

    def __enter__(self) -> KG:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
