"""The KG protocol every backend implements: read-only SPARQL 1.1 SELECT/ASK over one KG."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kgsynth.kg.profiles import KGProfile

if TYPE_CHECKING:
    from kgsynth.kg.graph import KGGraph

TermKind = Literal["iri", "literal", "bnode"]


@dataclass(frozen=True, slots=True)
class Term:
    """One RDF term of a result row, the same whichever backend produced it."""

    kind: TermKind
    value: str
    datatype: str | None = None
    lang: str | None = None

    @property
    def is_iri(self) -> bool:
        return self.kind == "iri"

    def n3(self) -> str:
        """The term written as SPARQL/N-Triples text (IRIs and literals only)."""
        from kgsynth.kg import sparql

        if self.kind == "iri":
            return sparql.iri(self.value)
        if self.kind == "bnode":
            return f"_:{self.value}"
        if self.lang:
            return sparql.literal(self.value, self.lang)
        if self.datatype and not self.datatype.endswith("#string"):
            return f"{sparql.literal(self.value)}^^{sparql.iri(self.datatype)}"
        return sparql.literal(self.value)


Row = dict[str, Term]


class KG(abc.ABC):
    """A knowledge graph reachable through read-only SPARQL.

    Backends implement :meth:`_select` and :meth:`_ask`; the public methods run the read-only
    guard first, so nothing a caller passes can become an UPDATE.
    """

    profile: KGProfile
    location: str

    def select(self, query: str, *, timeout: float | None = None) -> list[Row]:
        """Run a SELECT query; unbound variables are absent from a row."""
        from kgsynth.kg.sparql import ensure_read_only

        ensure_read_only(query)
        return self._select(query, timeout)

    def select_iter(self, query: str, *, timeout: float | None = None) -> Iterator[Row]:
        """Run a SELECT query and yield its rows; a backend that evaluates lazily (embedded)
        stops working when the caller stops reading, others fetch the whole result first."""
        from kgsynth.kg.sparql import ensure_read_only

        ensure_read_only(query)
        return self._select_iter(query, timeout)

    def ask(self, query: str, *, timeout: float | None = None) -> bool:
        """Run an ASK query."""
        from kgsynth.kg.sparql import ensure_read_only

        ensure_read_only(query)
        return self._ask(query, timeout)

    @abc.abstractmethod
    def _select(self, query: str, timeout: float | None) -> list[Row]: ...

    @abc.abstractmethod
    def _ask(self, query: str, timeout: float | None) -> bool: ...

    def _select_iter(self, query: str, timeout: float | None) -> Iterator[Row]:
        return iter(self._select(query, timeout))

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """What this KG is, for manifests: backend, location, profile, counts when known."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's resources."""

    def graph(self, **kwargs: Any) -> KGGraph:
        """Cached entity/relation access over this KG (see :class:`KGGraph`)."""
        from kgsynth.kg.graph import KGGraph

        return KGGraph(self, **kwargs)

    def __enter__(self) -> KG:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
