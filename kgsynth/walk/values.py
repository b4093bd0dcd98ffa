"""Numeric and date attributes of a KG, read from the KG itself, for the constraint walks.

A relation is an *attribute* when every object of a sample of its facts has a value: a typed
literal (``xsd:integer``, ``xsd:decimal``, ``xsd:double`` … as a number; ``xsd:date``,
``xsd:dateTime``, ``xsd:gYear`` as a date), or an entity whose name is a number (MetaQA stores
release years as entities named "1944"). Its :class:`AttributeKind` says which, and whether its
numbers look like years (4-digit integers), which a time constraint needs. Nothing is known by
name: :class:`AttributeCatalog` samples each relation once and remembers the verdict.

Values compare as the S-expression contract says: numbers numerically, dates by their ISO text
(only 4-digit years without time zones are read, so text order is time order); the year of a
date is its first four characters, the year of a number is the number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kgsynth.kg import sparql
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.sexpr import NUMERIC_TYPES, XSD, SExprError, check_typed_value
from kgsynth.kg.terms import Term

DATE_FORMS = {
    XSD + "date": re.compile(r"\d{4}-\d{2}-\d{2}"),
    XSD + "dateTime": re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?"),
    XSD + "gYear": re.compile(r"\d{4}"),
}
# a plain decimal or scientific number: what Python's float() and SPARQL's xsd:double() both
# read the same way ("nan", "inf", "1_000" and "0x10" are not numbers here)
NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
YEAR = re.compile(r"\d{4}")

SAMPLE_FACTS = 400  # facts read per relation to decide whether it is an attribute


@dataclass(frozen=True)
class Value:
    """One attribute value: ``kind`` "number" (``key`` a float) or "date" (``key`` its ISO
    text); ``text`` as written (a literal's lexical form, an entity's name); ``datatype``: the
    literal's datatype IRI, None for an entity's name."""

    kind: str
    key: float | str
    text: str
    datatype: str | None

    @property
    def year(self) -> int | None:
        """The year a time constraint matches: a date's first four digits; a number that is
        a whole number."""
        if self.kind == "date":
            return int(str(self.key)[:4])
        key = float(self.key)
        return int(key) if key.is_integer() else None


def parse_value(term: Term, name: str | None) -> Value | None:
    """The value of an attribute's object: a numeric or date literal, or an entity whose
    ``name`` is a number; None for anything else."""
    if term.kind == "literal":
        text, dt = term.value, term.datatype
        if dt in NUMERIC_TYPES and NUMBER.fullmatch(text) and _valid(text, dt):
            return Value("number", float(text), text, dt)
        form = DATE_FORMS.get(dt or "")
        if form is not None and form.fullmatch(text):
            return Value("date", text, text, dt)
        return None
    if term.kind == "iri" and name is not None and NUMBER.fullmatch(name):
        return Value("number", float(name), name, None)
    return None


def _valid(text: str, datatype: str) -> bool:
    """A well-formed literal of its datatype ("5.0" is no xsd:integer): the S-expression's
    literal atoms are checked the same way."""
    try:
        check_typed_value(text, datatype)
    except SExprError:
        return False
    return True


@dataclass(frozen=True)
class AttributeKind:
    """What a relation's values are: ``kind`` "number", "year" (numbers that are all 4-digit
    whole years) or "date"; ``source`` "literal" or "name" (entities named by numbers);
    ``datatype`` the dates' one datatype (None for numbers)."""

    kind: str
    source: str
    datatype: str | None = None

    @property
    def timed(self) -> bool:
        """A time constraint (a year) applies."""
        return self.kind in ("year", "date")

    def admits(self, value: Value, is_literal: bool) -> bool:
        """``value`` is of this kind (a walk's values must all be: mixed values are refused)."""
        if is_literal != (self.source == "literal"):
            return False
        if self.kind == "date":
            return value.kind == "date" and value.datatype == self.datatype
        if value.kind != "number":
            return False
        return self.kind != "year" or bool(YEAR.fullmatch(value.text))


def classify(values: list[tuple[Term, Value | None]]) -> AttributeKind | None:
    """The kind of a relation from its sampled objects and their values, or None when one of
    them has none, they mix literals and entities, numbers and dates, or two date types, or
    fewer than two distinct values were seen."""
    if not values or any(v is None for _, v in values):
        return None
    sources = {t.kind == "literal" for t, _ in values}
    kinds = {v.kind for _, v in values if v is not None}
    if len(sources) != 1 or len(kinds) != 1:
        return None
    if len({v.key for _, v in values if v is not None}) < 2:
        return None
    source = "literal" if sources.pop() else "name"
    if kinds.pop() == "date":
        types = {v.datatype for _, v in values if v is not None}
        return AttributeKind("date", source, types.pop()) if len(types) == 1 else None
    years = all(YEAR.fullmatch(v.text) for _, v in values if v is not None)
    return AttributeKind("year" if years else "number", source)


class AttributeCatalog:
    """Which relations (predicate IRIs) of ``graph`` are attributes, each decided once from the
    first :data:`SAMPLE_FACTS` facts the store lists (the same store lists the same facts, so
    walks stay deterministic)."""

    def __init__(self, graph: KGGraph) -> None:
        self.graph = graph
        self._kinds: dict[str, AttributeKind | None] = {}

    def kind(self, predicate: str) -> AttributeKind | None:
        if predicate not in self._kinds:
            self._kinds[predicate] = self._detect(predicate)
        return self._kinds[predicate]

    def _detect(self, predicate: str) -> AttributeKind | None:
        if self.graph.profile.is_hidden(predicate):
            return None
        labels = " ".join(sparql.iri(p) for p in self.graph.profile.label_predicates)
        rows = self.graph.kg.select(
            f"SELECT ?o ?l WHERE {{ {{ SELECT ?o WHERE {{ ?s {sparql.iri(predicate)} ?o }} "
            f"LIMIT {SAMPLE_FACTS} }} OPTIONAL {{ VALUES ?lp {{ {labels} }} ?o ?lp ?l }} }}"
        )
        names: dict[Term, list[Term]] = {}
        for row in rows:
            if "o" in row:
                names.setdefault(row["o"], []).extend([row["l"]] if "l" in row else [])
        return classify(
            [
                (t, parse_value(t, self.graph.best_label(ls)))
                for t, ls in sorted(names.items(), key=_order)
            ]
        )


def _order(item: tuple[Term, list[Term]]) -> tuple[str, str]:
    return item[0].kind, item[0].value
