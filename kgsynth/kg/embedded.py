"""Embedded backend: a pyoxigraph store on disk (the default) or in memory.

A store directory made by ``kgsynth kg import`` holds ``oxigraph/`` (the store),
``names.sqlite`` (the case-insensitive name index) and ``kg.json`` (profile, counts, source).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyoxigraph as ox

from kgsynth.errors import KGError, QueryRejectedError
from kgsynth.kg.base import KG, Row, Term
from kgsynth.kg.names import NameIndex
from kgsynth.kg.profiles import KGProfile, get_profile

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
    ) -> None:
        self.store = store
        self.profile = profile
        self.location = location
        self.meta = meta or {}
        self.name_index = name_index
        # pyoxigraph term -> Term: reading a term's parts costs ~5x a dict look-up, and look-ups
        # return the same relations, entities and counts over and over
        self._terms: dict[Any, Term] = {}

    @classmethod
    def open(cls, path: str | Path, profile: KGProfile | None = None) -> EmbeddedKG:
        """Open a store directory read-only (several processes may read it at once)."""
        path = Path(path)
        if not is_store_dir(path):
            raise KGError(f"{path}: not a kgsynth store (expected {META_FILE} and {STORE_SUBDIR}/)")
        meta = json.loads((path / META_FILE).read_text())
        store = ox.Store.read_only(str(path / STORE_SUBDIR))
        names = path / NAMES_FILE
        return cls(
            store,
            profile or get_profile(meta.get("profile", "generic")),
            location=str(path),
            meta=meta,
            name_index=NameIndex(names) if names.is_file() else None,
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

    def _select(self, query: str, timeout: float | None) -> list[Row]:
        return list(self._rows(self._solutions(query)))

    def _select_iter(self, query: str, timeout: float | None) -> Iterator[Row]:
        return self._rows(self._solutions(query))

    def _solutions(self, query: str) -> ox.QuerySolutions:
        result = self._run(query)
        if not isinstance(result, ox.QuerySolutions):
            raise QueryRejectedError("expected a SELECT query")
        return result

    def _rows(self, result: ox.QuerySolutions) -> Iterator[Row]:
        """Rows as the engine produces them (it evaluates lazily: a caller that stops reading
        stops the evaluation). Solutions are read by position: by name costs ~10x more."""
        names = [v.value for v in result.variables]
        terms = self._terms
        try:
            for solution in result:
                row: Row = {}
                for name, node in zip(names, solution, strict=True):
                    if node is not None:
                        term = terms.get(node)
                        if term is None:
                            if len(terms) >= TERM_CACHE_SIZE:
                                terms.clear()
                            term = terms[node] = to_term(node)
                        row[name] = term
                yield row
        except OSError as exc:
            raise KGError(f"store error: {exc}") from None

    def _ask(self, query: str, timeout: float | None) -> bool:
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
