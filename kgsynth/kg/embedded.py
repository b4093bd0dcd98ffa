"""Embedded backend: a pyoxigraph store on disk (the default) or in memory.

A store directory made by ``kgsynth kg import`` holds ``oxigraph/`` (the store),
``names.sqlite`` (the case-insensitive name index), ``kg.json`` (profile, counts, source) and
``fanouts/`` (per-entity relation counts for the walker, :mod:`kgsynth.kg.fanouts`; stores
imported before it existed lack it and are queried instead).

Queries are bounded two ways. In-process (the default: kgsynth's own look-ups, thousands a
second) rows are read lazily with the deadline checked between rows and the row cap applied
while reading, so a query that streams rows stops at either; pyoxigraph has no way to
interrupt a query that computes before its next row, so one blocked inside the engine (a
``COUNT`` or ``ORDER BY`` over a cross product, a ``(p|^p)*`` path) runs to its end. With
``isolate=True`` (``kgsynth kg query`` uses it) a store directory's queries run in a child
process that is killed at the deadline, its memory freed (:mod:`kgsynth.kg.query_process`).

Queries an agent wrote (:meth:`EmbeddedKG.agent_select_iter`, :meth:`EmbeddedKG.agent_ask`:
``ExecuteSPARQL``, ``sparql(...)``, compiled S-expressions) always run in such a child when the
store is a directory, whatever ``isolate`` says, so that one query a policy writes cannot
stall synthesis, eval or RL: one persistent child per store (started on the first agent query,
started again after a kill, so normal agent queries cost a round trip of a pipe), bounded by
the query's timeout and by :attr:`EmbeddedKG.agent_memory` bytes of memory beyond the open
store (:data:`AGENT_MEMORY_BYTES`, 4 GiB, by default). kgsynth's own fixed-form look-ups stay
in-process. An in-memory store (``location`` ``:memory:``, tests) has no directory for a child
to open, so its agent queries run in-process with the in-process bounds above: a query blocked
inside the engine is not stopped there. Every store a user opens (``--kg``: a store directory,
or a triple file imported into one) is a directory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyoxigraph as ox

from kgsynth.core.errors import (
    ConfigError,
    KGError,
    KGMemoryError,
    KGTimeoutError,
    QueryRejectedError,
)
from kgsynth.kg.base import DEFAULT_MAX_ROWS, DEFAULT_TIMEOUT_S, KG
from kgsynth.kg.fanouts import FanoutTable
from kgsynth.kg.names import NameIndex
from kgsynth.kg.profiles import KGProfile, get_profile
from kgsynth.kg.query_process import QueryProcess, QueryProcessError
from kgsynth.kg.terms import Row, Term

META_FILE = "kg.json"
STORE_SUBDIR = "oxigraph"
NAMES_FILE = "names.sqlite"
TERM_CACHE_SIZE = 100_000  # converted terms kept per store (cleared when full)
AGENT_MEMORY_BYTES = 4 << 30
"""Memory an agent's query may use beyond the open store (its child process's address space
past what the store took to open): far more than a query whose shown rows are capped needs
(a normal agent query adds megabytes), small enough that a runaway join or sort is stopped
before it takes the memory of the machine a run shares with its model."""


def to_term(node: Any) -> Term:
    """A pyoxigraph term as a backend-neutral :class:`Term`."""
    kind = type(node)
    if kind is ox.NamedNode:
        return Term("iri", node.value)
    if kind is ox.Literal:
        return Term("literal", node.value, node.datatype.value, node.language)
    if kind is ox.BlankNode:
        return Term("bnode", node.value)
    raise KGError(f"unsupported RDF term in a result: {node!r}")


def is_store_dir(path: Path) -> bool:
    return path.is_dir() and (path / META_FILE).is_file() and (path / STORE_SUBDIR).is_dir()


class EmbeddedKG(KG):
    """A pyoxigraph :class:`~pyoxigraph.Store` behind the KG protocol."""

    def __init__(
        self,
        store: ox.Store,
        profile: KGProfile,
        *,
        location: str = ":memory:",
        meta: dict[str, Any] | None = None,
        name_index: NameIndex | None = None,
        fanout_table: FanoutTable | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_rows: int = DEFAULT_MAX_ROWS,
        isolate: bool = False,
        agent_memory: int | None = AGENT_MEMORY_BYTES,
    ) -> None:
        self.store = store
        self.profile = profile
        self.location = location
        self.meta = meta or {}
        self.name_index = name_index
        self.fanout_table = fanout_table
        self.timeout = timeout
        self.max_rows = max_rows
        self._process: QueryProcess | None = None
        if agent_memory is not None and agent_memory < 1:
            raise ConfigError(
                f"agent_memory: {agent_memory} is not a number of bytes (use 1 or more)"
            )
        self.agent_memory = agent_memory
        # agent-written queries' child (module doc), made on the first one; a store in memory
        # has no directory for it
        self._agent_store = Path(location) / STORE_SUBDIR if is_store_dir(Path(location)) else None
        self._agent_process: QueryProcess | None = None
        if isolate:
            if not is_store_dir(Path(location)):
                raise ConfigError(
                    "isolate: only a store directory's queries can run in a child process "
                    f"({location} is not one)"
                )
            self._process = QueryProcess(Path(location) / STORE_SUBDIR)
        # pyoxigraph term -> Term: reading a term's parts costs ~5x a dict look-up, and look-ups
        # return the same relations, entities and counts over and over
        self._terms: dict[Any, Term] = {}

    @classmethod
    def open(
        cls,
        path: str | Path,
        profile: KGProfile | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_rows: int = DEFAULT_MAX_ROWS,
        isolate: bool = False,
        agent_memory: int | None = AGENT_MEMORY_BYTES,
    ) -> EmbeddedKG:
        """Open a store directory read-only (several processes may read it at once);
        ``agent_memory`` bounds agent-written queries (module doc; None: no bound)."""
        path = Path(path)
        if not is_store_dir(path):
            raise KGError(f"{path}: not a kgsynth store (expected {META_FILE} and {STORE_SUBDIR}/)")
        try:
            meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
            store = ox.Store.read_only(str(path / STORE_SUBDIR))
        except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: RocksDB corruption
            raise KGError(
                f"{path}: a damaged kgsynth store ({exc}); import the triple file again "
                "(kgsynth kg import FILE --out DIR --force)"
            ) from None
        names = path / NAMES_FILE
        return cls(
            store,
            profile or get_profile(meta.get("profile", "generic")),
            location=str(path),
            meta=meta,
            name_index=NameIndex(names) if names.is_file() else None,
            fanout_table=FanoutTable.open(path),
            timeout=timeout,
            max_rows=max_rows,
            isolate=isolate,
            agent_memory=agent_memory,
        )

    @classmethod
    def from_ntriples(cls, data: str | bytes, profile: KGProfile) -> EmbeddedKG:
        """An in-memory store loaded from N-Triples text (tests, small KGs)."""
        store = ox.Store()
        store.bulk_load(data, ox.RdfFormat.N_TRIPLES)
        return cls(store, profile)

    def _run(self, query: str) -> Any:
        try:
            return self.store.query(query)
        except SyntaxError as exc:
            raise QueryRejectedError(f"SPARQL syntax error: {exc}") from None
        except OSError as exc:
            raise KGError(f"store error: {exc}") from None

    def _deadline(self, timeout: float | None) -> float:
        return time.monotonic() + (timeout or self.timeout)

    def _timed_out(self, timeout: float | None) -> KGTimeoutError:
        return KGTimeoutError(f"query timed out after {timeout or self.timeout:g}s on the store")

    def _select(self, query: str, timeout: float | None) -> list[Row]:
        return list(self._select_iter(query, timeout))

    def _select_iter(self, query: str, timeout: float | None) -> Iterator[Row]:
        if self._process is not None:
            return self._isolated_rows(query, timeout, self.max_rows + 1)
        deadline = self._deadline(timeout)
        return self._rows(self._solutions(query), deadline, timeout)

    def _solutions(self, query: str) -> ox.QuerySolutions:
        result = self._run(query)
        if not isinstance(result, ox.QuerySolutions):
            raise QueryRejectedError("expected a SELECT query")
        return result

    def _term(self, node: Any) -> Term:
        terms = self._terms
        term = terms.get(node)
        if term is None:
            if len(terms) >= TERM_CACHE_SIZE:
                terms.clear()
            term = terms[node] = to_term(node)
        return term

    def _rows(
        self, result: ox.QuerySolutions, deadline: float, timeout: float | None
    ) -> Iterator[Row]:
        """Rows as the engine produces them (it evaluates lazily: a caller that stops reading
        stops the evaluation), the deadline checked between rows. Solutions are read by
        position: by name costs ~10x more."""
        names = [v.value for v in result.variables]
        terms = self._terms
        clock = time.monotonic
        try:
            for solution in result:
                if clock() > deadline:
                    raise self._timed_out(timeout)
                row: Row = {}
                for name, node in zip(names, solution, strict=True):
                    if node is not None:
                        term = terms.get(node)
                        if term is None:
                            term = self._term(node)
                        row[name] = term
                yield row
        except OSError as exc:
            raise KGError(f"store error: {exc}") from None

    def select_iter(
        self, query: str, *, timeout: float | None = None, max_rows: int | None = None
    ) -> Iterator[Row]:
        if self._process is None:
            return super().select_iter(query, timeout=timeout, max_rows=max_rows)
        return self._isolated_select(query, timeout, max_rows, self._process)

    def _isolated_select(
        self, query: str, timeout: float | None, max_rows: int | None, process: QueryProcess
    ) -> Iterator[Row]:
        """A guarded SELECT run in ``process``, its rows capped."""
        from kgsynth.kg import guard

        text = guard.ensure_read_only(query)
        cap = self._row_cap(max_rows)
        # the child sends one row past the cap, so that the cap is seen to be passed
        return self._capped(self._isolated_rows(text, timeout, cap + 1, process), cap)

    # --- agent-written queries ---------------------------------------------------------------

    def agent_process(self) -> QueryProcess | None:
        """The child process that runs agent-written queries (started lazily by its first
        query; module doc), or None for a store that is not a directory."""
        if self._agent_process is None and self._agent_store is not None:
            self._agent_process = QueryProcess(self._agent_store, memory_limit=self.agent_memory)
        return self._agent_process

    def agent_select_iter(
        self, query: str, *, timeout: float | None = None, max_rows: int | None = None
    ) -> Iterator[Row]:
        """An agent's SELECT, run in :meth:`agent_process`: killed at the deadline
        (:class:`~kgsynth.core.errors.KGTimeoutError`) or past :attr:`agent_memory`
        (:class:`~kgsynth.core.errors.KGMemoryError`); in-process for a store in memory."""
        process = self.agent_process()
        if process is None:
            return self.select_iter(query, timeout=timeout, max_rows=max_rows)
        return self._isolated_select(query, timeout, max_rows, process)

    def agent_ask(self, query: str, *, timeout: float | None = None) -> bool:
        """An agent's ASK, run as :meth:`agent_select_iter` runs a SELECT."""
        process = self.agent_process()
        if process is None:
            return self.ask(query, timeout=timeout)
        from kgsynth.kg import guard

        return self._isolated_ask(guard.ensure_read_only(query), timeout, process)

    # --- queries in a child process --------------------------------------------------------

    def _isolated(
        self,
        query: str,
        form: str,
        timeout: float | None,
        max_rows: int,
        process: QueryProcess | None = None,
    ) -> list[tuple[Any, ...]]:
        process = process or self._process
        assert process is not None
        try:
            return process.run(query, form, timeout or self.timeout, max_rows)
        except QueryProcessError as exc:
            if exc.kind == "timeout":
                raise self._timed_out(timeout) from None
            if exc.kind == "memory":
                raise KGMemoryError(str(exc)) from None
            if exc.kind == "syntax":
                raise QueryRejectedError(f"SPARQL syntax error: {exc}") from None
            raise KGError(f"store error: {exc}") from None

    def _isolated_ask(
        self, query: str, timeout: float | None, process: QueryProcess | None = None
    ) -> bool:
        frames = self._isolated(query, "ask", timeout, 1, process)
        if not frames or frames[0][0] != "bool":
            raise KGError("store error: no ASK result")
        return bool(frames[0][1])

    def _isolated_rows(
        self,
        query: str,
        timeout: float | None,
        max_rows: int,
        process: QueryProcess | None = None,
    ) -> Iterator[Row]:
        names: list[str] = []
        for frame in self._isolated(query, "select", timeout, max_rows, process):
            if frame[0] == "vars":
                names = frame[1]
                continue
            for values in frame[1]:
                row: Row = {}
                for name, value in zip(names, values, strict=True):
                    if value is not None:
                        row[name] = self._decoded(value)
                yield row

    def _decoded(self, value: Any) -> Term:
        key = value if isinstance(value, str) else ("lit", *value)
        term = self._terms.get(key)
        if term is None:
            if len(self._terms) >= TERM_CACHE_SIZE:
                self._terms.clear()
            if isinstance(value, str):
                term = Term("iri", value)
            elif len(value) == 3:
                term = Term("literal", value[0], value[1], value[2])
            else:
                term = Term("bnode", value[0])
            self._terms[key] = term
        return term

    def _ask(self, query: str, timeout: float | None) -> bool:
        if self._process is not None:
            return self._isolated_ask(query, timeout)
        result = self._run(query)
        if not isinstance(result, ox.QueryBoolean):
            raise QueryRejectedError("expected an ASK query")
        return bool(result)

    def describe(self) -> dict[str, Any]:
        out = {"backend": "embedded", "location": self.location, "profile": self.profile.name}
        out.update({k: v for k, v in self.meta.items() if k not in out})
        return out

    def close(self) -> None:
        if self.name_index is not None:
            self.name_index.close()
        if self.fanout_table is not None:
            self.fanout_table.close()
        if self._process is not None:
            self._process.kill()
        if self._agent_process is not None:
            self._agent_process.kill()
