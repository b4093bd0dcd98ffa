"""The RDF terms of query result rows, the same whichever backend produced them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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

__all__ = ["Row", "Term", "TermKind"]
