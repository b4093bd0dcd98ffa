"""Embedded backend: a pyoxigraph store on disk (the default) or in memory.

A store directory made by ``kgsynth kg import`` holds ``oxigraph/`` (the store),
``names.sqlite`` (the case-insensitive name index), ``kg.json`` (profile, counts, source) and
``fanouts/`` (per-entity relation counts for the walker, :mod:`kgsynth.kg.fanouts`; stores
imported before it existed lack it and are queried instead).

Queries are bounded two ways. In-process (the default: kgsynth's own look-ups, thousands a
second) rows are read lazily with the deadline checked between rows and the row cap applied
while reading, so a query that streams rows stops at either; pyoxigraph has no way to
interrupt a query that computes before its next row, so one blocked inside the engine runs to
its end. With ``isolate=True`` (``kgsynth kg query`` uses it) a store directory's queries run
in a child process that is killed at the deadline, its memory freed
(:mod:`kgsynth.kg.query_process`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyoxigraph as ox

from kgsynth.errors import ConfigError, KGError, KGTimeoutError, QueryRejectedError
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
    ) -> EmbeddedKG:
        """Open a store directory read-only (several processes may read it at once)."""
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
        from kgsynth.kg import guard

        text = guard.ensure_read_only(query)
        cap = self._row_cap(max_rows)
        # the child sends one row past the cap, so that the cap is seen to be passed
        return self._capped(self._isolated_rows(text, timeout, cap + 1), cap)

    def _isolated(
        self, query: str, form: str, timeout: float | None, max_rows: int
    ) -> list[tuple[Any, ...]]:
        assert self._process is not None
        try:
            return self._process.run(query, form, timeout or self.timeout, max_rows)
        except QueryProcessError as exc:
            if exc.kind == "timeout":
                raise self._timed_out(timeout) from None
            if exc.kind == "syntax":
                raise QueryRejectedError(f"SPARQL syntax error: {exc}") from None
            raise KGError(f"store error: {exc}") from None

    def _isolated_rows(self, query: str, timeout: float | None, max_rows: int) -> Iterator[Row]:
        names: list[str] = []
        for frame in self._isolated(query, "select", timeout, max_rows):
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
            frames = self._isolated(query, "ask", timeout, 1)
            if not frames or frames[0][0] != "bool":
                raise KGError("store error: no ASK result")
            return bool(frames[0][1])
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
