"""S-expression tree -> one SPARQL 1.1 SELECT: the compiler behind
:func:`kgsynth.kg.sexpr.compile_sparql`.

Each sub-expression becomes a graph pattern that binds one variable to its members, with
fresh variables of its own; the query selects ``?x`` (``SELECT DISTINCT ?x``) or counts it
(``SELECT (COUNT(DISTINCT ?x) AS ?count)``). Every IRI is written by
:func:`kgsynth.kg.sparql.iri` and every string by :func:`kgsynth.kg.sparql.literal`; nothing
else of the expression's text reaches the query.

Semantics (GrailQA's, as KBQA-R1 executes them):

- an entity ``m.0abc`` / ``g.11x`` (``FREEBASE_NS`` + id) or ``<IRI>``; a relation or class
  name goes through ``profile.relation_iri``; a class is matched with the profile's first type
  predicate; a relation operand may also be ``(R rel)`` (inverse) or ``(JOIN r1 r2)`` (the path
  r1 then r2, GrailQA's hop across a CVT node in ARGMAX). kgsynth's flattened names ``r1.r2``
  (:class:`~kgsynth.kg.graph.KGGraph` on Freebase) are not split: write the path.
- an atom where a set is expected: an entity or a literal is that one value, a name is the
  class's members (``(ARGMAX music.album ...)``); an atom operand of AND is a class (a name or
  an ``<IRI>``; a Freebase id ``m.0abc`` stays an entity).
- ``(JOIN rel X)`` = { s | s rel o, o in X }; ``(JOIN (R rel) X)`` = { o | s rel o, s in X }.
  A typed or quoted literal X matches that exact term (a plain string also with the profile's
  language tags); a bare number or date (``1944``, ``2004-05-01``) matches by value, like ``=``.
- ``(AND X Y)`` = X ∩ Y.
- ``(ARGMAX X rel)`` / ``(ARGMIN X rel)``: the members of X whose rel value is the largest /
  smallest, every tie kept (a MAX/MIN subquery, joined back on the value).
- ``(lt rel v)`` ``(le ...)`` ``(gt ...)`` ``(ge ...)`` = { s | s rel o, value(o) op v };
  ``(TC X rel year)`` = the members of X whose rel value falls in ``year`` (``NOW`` is
  refused: it needs a from/to pair this grammar does not carry).
- ``(COUNT X)``, outermost only, = the number of distinct members of X.

value(o) is o when o is a literal, else o's name (any of ``profile.label_predicates``:
MetaQA's years are entities named "1944"). Compared with a number v, a value is read as a
number (plain text "1800" too), and a date (``1944-05-01``, a dateTime, a gYearMonth) as its
year. Compared with a
date v, a date-like value (gYear ... dateTime, or text of that form) is compared on v's
precision: its digits (year, month, day, hour, minute, second) cut to as many as v has.
ARGMAX/ARGMIN order date-typed values (and text of the form ``1944-05``...) as dates, others
as numbers. Values that are neither (a name like "Drama") never match. The conversions use
only SPARQL 1.1 built-ins (``REGEX``, ``REPLACE``, ``SUBSTR``, ``xsd:double`` casts), which
Oxigraph and Virtuoso both run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kgsynth.kg import sparql
from kgsynth.kg.profiles import FREEBASE_NS, KGProfile
from kgsynth.kg.sexpr_text import (
    DATE_TYPES,
    FREEBASE_ID_RE,
    NUMERIC_TYPES,
    QUOTED_RE,
    XSD,
    SExpr,
    SExprError,
    check_typed_value,
    operator,
    parse,
    to_text,
    unquote,
)

_DOUBLE = sparql.iri(XSD + "double")
_DATE_TYPE_LIST = ", ".join(sparql.iri(t) for t in sorted(DATE_TYPES))
_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "="}

# Regular expressions the engine runs (XPath syntax: no backslashes, no (?:...) groups).
# A date whose year the number key takes: 1944-05..., or a gYear with a timezone.
_Q_YEAR_FIRST = "^[0-9]{4}(-[0-9]{2}|Z$|[+-][0-9]{2}:[0-9]{2}$)"
_Q_NUMBER = "^[+-]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][+-]?[0-9]+)?$"
_Q_DATE_LIKE = (
    "^[0-9]{4}(-[0-9]{2}(-[0-9]{2}(T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]+)?)?)?)?"
    "(Z|[+-][0-9]{2}:[0-9]{2})?$"
)
_Q_DASH_DATE = "^[0-9]{4}-[0-9]{2}"
_Q_TZ = "(Z|[+-][0-9]{2}:[0-9]{2})$"

# The same forms on the Python side (a value written in the expression).
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER_RE = re.compile(r"[+-]?\d+")
_DATE_LIKE_RE = re.compile(
    r"\d{4}(?:-\d{2}(?:-\d{2}(?:T\d{2}:\d{2}:\d{2}(?:\.\d+)?)?)?)?(?:Z|[+-]\d{2}:\d{2})?"
)
_BARE_DATE_RE = re.compile(r"\d{4}-\d{2}(?:-\d{2}(?:T\d{2}:\d{2}:\d{2}(?:\.\d+)?)?)?")
_TZ_RE = re.compile(r"(?:Z|[+-]\d{2}:\d{2})$")


@dataclass(frozen=True)
class _Literal:
    """A literal atom: its value, datatype or language, and whether it was written bare
    (``1944``, ``2004-05-01``: matched by value)."""

    value: str
    datatype: str | None = None
    lang: str | None = None
    bare: bool = False


@dataclass(frozen=True)
class _Value:
    """A value to compare with: a number, or a date of ``digits`` digits (4 = a year)."""

    key: float
    digits: int = 0  # 0: a number

    def term(self) -> str:
        return f"{sparql.literal(repr(self.key))}^^{_DOUBLE}"


def compile_query(expr: SExpr, profile: KGProfile) -> str:
    """The SELECT for ``expr`` (see the module docstring); raises :class:`SExprError`."""
    tree = parse(to_text(expr))  # checks every operator, arity and atom; canonical spellings
    compiler = _Compiler(profile)
    if operator(tree) == "COUNT":
        body = compiler.members(tree[1], "?x")
        return f"SELECT (COUNT(DISTINCT ?x) AS ?count) WHERE {{ {body} }}"
    return f"SELECT DISTINCT ?x WHERE {{ {compiler.members(tree, '?x')} }}"


def _shown(expr: SExpr) -> str:
    text = to_text(expr)
    return text if len(text) <= 120 else text[:117] + "..."


def literal_parts(atom: str) -> _Literal | None:
    """The literal an atom writes, or None when it is not one (an entity, a relation)."""
    if atom.startswith('"'):
        m = QUOTED_RE.fullmatch(atom)
        if m is None:
            raise SExprError(f"a malformed string {atom[:80]!r}")
        lang = m.group("lang")
        return _Literal(unquote(m.group("body")), _datatype(m.group("dt")), lang and lang[1:])
    if "^^" in atom:
        value, _, dt = atom.partition("^^")
        return _Literal(value, _datatype(dt))
    if _NUMBER_RE.fullmatch(atom) or _BARE_DATE_RE.fullmatch(atom):
        return _Literal(atom, bare=True)
    return None


def _bare_type(value: str) -> str:
    """The datatype of a number or date written without one (checked)."""
    if _INTEGER_RE.fullmatch(value):
        dt = "integer"
    elif _NUMBER_RE.fullmatch(value):
        dt = "double" if "e" in value.lower() else "decimal"
    else:
        dt = "dateTime" if "T" in value else "gYearMonth" if len(value) == 7 else "date"
    check_typed_value(value, XSD + dt)
    return XSD + dt


def _datatype(text: str | None) -> str | None:
    if text is None:
        return None
    if text.startswith("<") and text.endswith(">"):
        text = text[1:-1]
    if text.startswith("xsd:"):
        text = XSD + text[4:]
    if not text:
        raise SExprError("a literal with an empty datatype after '^^'")
    return text


def _iri(value: str) -> str:
    try:
        return sparql.iri(value)
    except ValueError as exc:
        raise SExprError(str(exc)) from None


def _string(value: str, lang: str | None = None) -> str:
    try:
        return sparql.literal(value, lang)
    except ValueError as exc:
        raise SExprError(f"the string {value[:60]!r} cannot be sent: {exc}") from None


def _entity_iri(atom: str) -> str | None:
    """The IRI an entity atom names (written as SPARQL), None when the atom is not one."""
    if atom.startswith("<"):
        return _iri(atom[1:-1])
    if FREEBASE_ID_RE.fullmatch(atom):
        return _iri(FREEBASE_NS + atom)
    return None


class _Compiler:
    def __init__(self, profile: KGProfile) -> None:
        self.profile = profile
        self.count = 0

    def var(self, stem: str = "v") -> str:
        self.count += 1
        return f"?{stem}{self.count}"

    # --- sets ----------------------------------------------------------------------------

    def members(self, expr: SExpr, out: str) -> str:
        """A graph pattern binding ``out`` to each member of ``expr``."""
        if isinstance(expr, str):
            if _entity_iri(expr) is None and literal_parts(expr) is None:
                return self._class(expr, out)  # (ARGMAX music.album ...): every album
            return f"VALUES {out} {{ {' '.join(self._atom_terms(expr))} }}"
        op = expr[0]
        if op == "JOIN":
            return self._join(expr, out)
        if op == "AND":
            exprs = [self.members(e, out) for e in expr[1:] if not isinstance(e, str)]
            atoms = [self._and_atom(e, out, expr) for e in expr[1:] if isinstance(e, str)]
            return " ".join(exprs + atoms)  # the classes last: the smaller sets bind first
        if op in ("ARGMAX", "ARGMIN"):
            return self._argmax(expr, out)
        if op in _COMPARE:
            value = self._compare_value(expr[2], expr)
            obj = self.var("o")
            return self._filtered(self.path(expr[1], out, obj), obj, value, op)
        if op == "TC":
            year = self._year(expr[3], expr)
            obj = self.var("o")
            return self._filtered(
                f"{self.members(expr[1], out)} {self.path(expr[2], out, obj)}", obj, year, "eq"
            )
        if op == "COUNT":
            raise SExprError(f"COUNT may only be the outermost operator: {_shown(expr)}")
        raise SExprError(
            f"(R rel) is a relation, not a set: write it as JOIN's first operand ({_shown(expr)})"
        )

    def _atom_terms(self, atom: str) -> list[str]:
        iri = _entity_iri(atom)
        if iri is not None:
            return [iri]
        lit = literal_parts(atom)
        if lit is None:
            raise SExprError(
                f"{atom!r} is not an entity (m.0abc, g.11x or <IRI>) or a literal "
                '(1990, 1990^^DATATYPE, "text")'
            )
        if lit.bare:
            return [self._bare_term(lit.value)]
        return self._literal_terms(lit)

    def _bare_term(self, value: str) -> str:
        return f"{_string(value)}^^{_iri(_bare_type(value))}"

    def _literal_terms(self, lit: _Literal) -> list[str]:
        """The exact terms a typed or quoted literal matches."""
        if lit.lang:
            return [_string(lit.value, lit.lang)]
        if lit.datatype and lit.datatype != XSD + "string":
            check_typed_value(lit.value, lit.datatype)
            return [f"{_string(lit.value)}^^{_iri(lit.datatype)}"]
        langs = dict.fromkeys(lang for lang in (*self.profile.label_langs, "") if lang)
        return [_string(lit.value)] + [_string(lit.value, lang) for lang in langs]

    def _and_atom(self, atom: str, out: str, expr: SExpr) -> str:
        if FREEBASE_ID_RE.fullmatch(atom):  # an entity: AND keeps it when the other side has it
            return f"VALUES {out} {{ {_entity_iri(atom)} }}"
        if literal_parts(atom) is not None:
            raise SExprError(
                f"AND's operands are classes and expressions, not the literal {atom!r}: "
                f"{_shown(expr)}"
            )
        return self._class(atom, out)

    def _class(self, atom: str, out: str) -> str:
        type_predicate = _iri(self.profile.type_predicates[0])
        return f"{out} {type_predicate} {self._relation_iri(atom)} ."

    def _join(self, expr: tuple[SExpr, ...], out: str) -> str:
        rel, target = expr[1], expr[2]
        if not isinstance(target, str):
            inner = self.var()
            return f"{self.members(target, inner)} {self.path(rel, out, inner)}"
        iri = _entity_iri(target)
        if iri is not None:
            return self.path(rel, out, iri)
        lit = literal_parts(target)
        if lit is None:
            raise SExprError(
                f"{target!r} is not an entity (m.0abc, g.11x or <IRI>), a literal "
                f'(1990, 1990^^DATATYPE, "text") or an expression: {_shown(expr)}'
            )
        if lit.bare:
            obj = self.var("o")
            value = self._compare_value(target, expr)
            return self._filtered(self.path(rel, out, obj), obj, value, "eq")
        terms = self._literal_terms(lit)
        if len(terms) == 1:
            return self.path(rel, out, terms[0])
        obj = self.var("o")
        return f"VALUES {obj} {{ {' '.join(terms)} }} {self.path(rel, out, obj)}"

    def _argmax(self, expr: tuple[SExpr, ...], out: str) -> str:
        aggregate = "MAX" if expr[0] == "ARGMAX" else "MIN"
        members, rel = expr[1], expr[2]
        inner, inner_obj, extreme = self.var(), self.var("o"), self.var("m")
        inner_pattern, inner_key = self._order_key(
            f"{self.members(members, inner)} {self.path(rel, inner, inner_obj)}", inner_obj
        )
        obj = self.var("o")
        pattern, key = self._order_key(
            f"{self.members(members, out)} {self.path(rel, out, obj)}", obj
        )
        # the members' group first, then the subquery: Virtuoso 7.2 fails to compile the
        # subquery first ("Bad dfe in sqlo_place_exp")
        return (
            f"{{ {{ {pattern} }} {{ SELECT ({aggregate}({inner_key}) AS {extreme}) WHERE "
            f"{{ {inner_pattern} FILTER(BOUND({inner_key})) }} }} FILTER({key} = {extreme}) }}"
        )

    # --- relations -----------------------------------------------------------------------

    def path(self, rel: SExpr, subject: str, obj: str) -> str:
        """The pattern ``subject --rel--> obj`` (both written SPARQL terms or variables)."""
        if isinstance(rel, str):
            return f"{subject} {self._relation_iri(rel)} {obj} ."
        if rel[0] == "R":
            return self.path(rel[1], obj, subject)
        if rel[0] == "JOIN":
            mid = self.var("c")
            return f"{self.path(rel[1], subject, mid)} {self.path(rel[2], mid, obj)}"
        raise SExprError(
            f"{_shown(rel)} is not a relation: write a relation name, <IRI>, (R relation) "
            "or (JOIN relation relation)"
        )

    def _relation_iri(self, atom: str) -> str:
        if atom.startswith("<"):
            return _iri(atom[1:-1])
        if literal_parts(atom) is not None:
            raise SExprError(f"{atom!r} is a literal where a relation or class was expected")
        return _iri(self.profile.relation_iri(atom))

    # --- values --------------------------------------------------------------------------

    def _compare_value(self, atom: SExpr, expr: SExpr) -> _Value:
        """The number or date an expression compares with."""
        lit = literal_parts(atom) if isinstance(atom, str) else None
        if lit is None or lit.lang:
            raise SExprError(
                f"{operator(expr)} compares with a number or a date (1990, 2.5, "
                f"2004-05-01^^{XSD}date), not {_shown(atom)}: {_shown(expr)}"
            )
        value, dt = lit.value, lit.datatype
        if dt is not None and dt != XSD + "string":
            check_typed_value(value, dt)
            if dt in NUMERIC_TYPES:
                return self._number(value, expr)
            if dt == XSD + "gYear":
                return self._number(_TZ_RE.sub("", value), expr)
            if dt in DATE_TYPES:
                return self._date(value, expr)
        if _NUMBER_RE.fullmatch(value):
            return self._number(value, expr)
        if _DATE_LIKE_RE.fullmatch(value):
            return self._date(value, expr)
        raise SExprError(
            f"{value!r} is neither a number nor a date (in {_shown(expr)}); "
            "comparisons take numbers and dates"
        )

    @staticmethod
    def _number(value: str, expr: SExpr) -> _Value:
        number = float(value) if _NUMBER_RE.fullmatch(value) else math.nan
        if not math.isfinite(number):
            raise SExprError(f"{value!r} is not a finite number: {_shown(expr)}")
        return _Value(number)

    @staticmethod
    def _date(value: str, expr: SExpr) -> _Value:
        if not _DATE_LIKE_RE.fullmatch(value):
            raise SExprError(
                f"{value!r}: only dates from year 0000 to 9999 compare: {_shown(expr)}"
            )
        _bare_type(_TZ_RE.sub("", value))  # a month or day out of range
        digits = re.sub(r"\D", "", _TZ_RE.sub("", value))[:14]
        return _Value(float(digits), len(digits))

    def _year(self, atom: SExpr, expr: SExpr) -> _Value:
        if isinstance(atom, str) and atom.upper() == "NOW":
            raise SExprError(f"TC with NOW is not supported; give a year: {_shown(expr)}")
        lit = literal_parts(atom) if isinstance(atom, str) else None
        year = lit.value if lit is not None and not lit.lang else ""
        if lit is not None and lit.datatype == XSD + "gYear":
            year = _TZ_RE.sub("", year)
        if not _INTEGER_RE.fullmatch(year):
            raise SExprError(f"TC takes a year (2004), not {_shown(atom)}: {_shown(expr)}")
        return _Value(float(int(year)))

    def _raw(self, obj: str) -> tuple[str, str, str]:
        """Patterns binding value(obj) (obj itself, else its name) and its text; the two
        variables."""
        label, raw, text = self.var("l"), self.var("r"), self.var("s")
        names = " UNION ".join(
            f"{{ {obj} {_iri(p)} {label} }}" for p in self.profile.label_predicates
        )
        pattern = (
            f"OPTIONAL {{ {names} }} BIND(IF(isLiteral({obj}), {obj}, {label}) AS {raw}) "
            f"BIND(STR({raw}) AS {text})"
        )
        return pattern, raw, text

    def _number_key(self, text: str) -> str:
        return (
            f"IF(REGEX({text}, {_string(_Q_YEAR_FIRST)}), {_DOUBLE}(SUBSTR({text}, 1, 4)), "
            f"IF(REGEX({text}, {_string(_Q_NUMBER)}), {_DOUBLE}({text}), {self.var('none')}))"
        )

    def _date_key(self, text: str, digits: int) -> str:
        stripped = f"REPLACE(REPLACE({text}, {_string(_Q_TZ)}, {_string('')}), {_string('[^0-9]')}, {_string('')})"
        padded = f"SUBSTR(CONCAT({stripped}, {_string('0' * 10)}), 1, {digits})"
        return (
            f"IF(REGEX({text}, {_string(_Q_DATE_LIKE)}), {_DOUBLE}({padded}), {self.var('none')})"
        )

    def _filtered(self, pattern: str, obj: str, value: _Value, op: str) -> str:
        """``pattern`` kept where value(obj) ``op`` value."""
        raw_pattern, _, text = self._raw(obj)
        key = self._date_key(text, value.digits) if value.digits else self._number_key(text)
        var = self.var("k")
        return (
            f"{pattern} {raw_pattern} BIND({key} AS {var}) "
            f"FILTER({var} {_COMPARE[op]} {value.term()})"
        )

    def _order_key(self, pattern: str, obj: str) -> tuple[str, str]:
        """``pattern`` with value(obj)'s ordering key bound (dates as dates, else numbers),
        and the key's variable."""
        raw_pattern, raw, text = self._raw(obj)
        is_date = (
            f"(DATATYPE({raw}) IN ({_DATE_TYPE_LIST}) || REGEX({text}, {_string(_Q_DASH_DATE)}))"
        )
        key = f"IF({is_date}, {self._date_key(text, 14)}, {self._number_key(text)})"
        var = self.var("k")
        return f"{pattern} {raw_pattern} BIND({key} AS {var})", var
