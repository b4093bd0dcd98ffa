"""GrailQA's S-expressions as text (see :mod:`kgsynth.kg.sexpr`, which re-exports all of this):
parsing and printing, the atoms that name entities, relations and literals, and the lexical
forms of typed values. A leaf of :mod:`kgsynth.kg.sexpr` and :mod:`kgsynth.kg.sexpr_compile`.
"""

from __future__ import annotations

import re
from typing import TypeAlias

from kgsynth.kg import sparql
from kgsynth.kg.profiles import FREEBASE_NS, KGProfile

SExpr: TypeAlias = str | tuple["SExpr", ...]
"""An atom, or a tuple whose first item is the operator."""

XSD = "http://www.w3.org/2001/XMLSchema#"
MAX_DEPTH = 64  # nesting deeper than any benchmark's logical form (GrailQA's deepest is ~6)

# operator (canonical spelling) -> number of operands
OPERATORS: dict[str, int] = {
    "AND": 2,
    "ARGMAX": 2,
    "ARGMIN": 2,
    "COUNT": 1,
    "JOIN": 2,
    "R": 1,
    "TC": 3,
    "ge": 2,
    "gt": 2,
    "le": 2,
    "lt": 2,
}
_CANONICAL = {op.lower(): op for op in OPERATORS}
_KNOWN = ", ".join(OPERATORS)

_LANG = r"@[A-Za-z]+(?:-[A-Za-z0-9]+)*"
_DATATYPE = r"\^\^(?:<[^\s<>]*>|[^\s()\"<>]+)"
_STRING = rf'"(?:[^"\\]|\\.)*"(?:{_LANG}|{_DATATYPE})?'
_IRI = r"<[^\s<>]*>"
_BARE = r"[^\s()\"<>]+(?:<[^\s<>]*>)?"
_TOKEN_RE = re.compile(
    rf"(?P<ws>\s+)|(?P<open>\()|(?P<close>\))|(?P<atom>{_STRING}|{_IRI}|{_BARE})", re.DOTALL
)
_ATOM_RE = re.compile(rf"{_STRING}|{_IRI}|{_BARE}", re.DOTALL)
QUOTED_RE = re.compile(
    rf'"(?P<body>(?:[^"\\]|\\.)*)"(?:(?P<lang>{_LANG})|\^\^(?P<dt>.+))?', re.DOTALL
)
_UNESCAPES = {"t": "\t", "b": "\b", "n": "\n", "r": "\r", "f": "\f", '"': '"', "'": "'", "\\": "\\"}
_ESCAPES = {v: f"\\{k}" for k, v in _UNESCAPES.items() if k != "'"}
_ESCAPE_RE = re.compile(r"\\(u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)", re.DOTALL)
FREEBASE_ID_RE = re.compile(r"[mg]\.[A-Za-z0-9_]+")
_SAFE_VALUE_RE = re.compile(r"[A-Za-z0-9+\-.:]+")
_SAFE_NAME_RE = re.compile(r"[^\s()\"<>]+")


class SExprError(ValueError):
    """An S-expression that does not parse or cannot be compiled; the message names the
    problem and where it is (a character offset, or the sub-expression)."""


# --- text -> tree --------------------------------------------------------------------------


def parse(text: str) -> SExpr:
    """The tree of ``text``: atoms as written, operators in their canonical spelling.

    Raises :class:`SExprError` naming the offset of an unbalanced parenthesis, an unknown
    operator, a wrong number of operands, an unterminated string or IRI, or trailing text.
    """
    if not isinstance(text, str):
        raise SExprError(f"an S-expression must be text, not {type(text).__name__}")
    # a stack of open lists: (offset of its "(", its items)
    stack: list[tuple[int, list[SExpr]]] = []
    result: SExpr | None = None
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise SExprError(_bad_char(text, pos))
        kind = m.lastgroup
        end = m.end()
        if kind == "atom" and end < len(text) and not (text[end] in "()" or text[end].isspace()):
            raise SExprError(
                f"atom {text[pos:end]!r} at offset {pos} runs into {text[end]!r} at offset "
                f"{end}: separate atoms with a space"
            )
        if kind != "ws" and result is not None:
            raise SExprError(
                f"unexpected text after the expression at offset {pos}: {text[pos : pos + 20]!r}"
            )
        if kind == "open":
            if len(stack) >= MAX_DEPTH:
                raise SExprError(f"nested deeper than {MAX_DEPTH} lists at offset {pos}")
            stack.append((pos, []))
        elif kind == "close":
            if not stack:
                raise SExprError(f"unbalanced parenthesis: ')' at offset {pos} closes nothing")
            start, items = stack.pop()
            node = _make_list(items, start)
            if stack:
                stack[-1][1].append(node)
            else:
                result = node
        elif kind == "atom":
            atom = m.group("atom")
            if stack:
                stack[-1][1].append(atom)
            else:
                result = atom
        pos = end
    if stack:
        raise SExprError(f"unbalanced parenthesis: '(' at offset {stack[-1][0]} is never closed")
    if result is None:
        raise SExprError("an empty S-expression")
    return result


def _bad_char(text: str, pos: int) -> str:
    ch = text[pos]
    if ch == '"':
        return f"unterminated string starting at offset {pos}"
    if ch == "<":
        shown = text[pos : pos + 40].split()[0] if text[pos:].strip() else "<"
        return (
            f"unterminated IRI {shown!r} at offset {pos} (an IRI ends with '>' and holds no spaces)"
        )
    return f"unexpected {ch!r} at offset {pos}"


def _make_list(items: list[SExpr], start: int) -> tuple[SExpr, ...]:
    if not items:
        raise SExprError(f"an empty list '()' at offset {start}")
    head = items[0]
    if not isinstance(head, str):
        raise SExprError(f"the list at offset {start} starts with a list, not an operator")
    op = _operator(head, f"at offset {start + 1}")
    _check_arity(op, len(items) - 1, f"at offset {start}")
    return (op, *items[1:])


def _operator(head: str, where: str) -> str:
    op = _CANONICAL.get(head.lower())
    if op is None:
        raise SExprError(f"unknown operator {head!r} {where} (known: {_KNOWN})")
    return op


def _check_arity(op: str, got: int, where: str) -> None:
    want = OPERATORS[op]
    if got != want:
        raise SExprError(f"wrong number of operands for {op} {where}: {op} takes {want}, got {got}")


# --- tree -> text --------------------------------------------------------------------------


def to_text(expr: SExpr) -> str:
    """The canonical text of ``expr``: single spaces, operators in their canonical spelling;
    ``parse(to_text(e)) == e`` for every tree :func:`parse` returns."""
    if isinstance(expr, str):
        if not _ATOM_RE.fullmatch(expr):
            raise SExprError(f"{expr!r} is not one atom (quote text with spaces or parentheses)")
        return expr
    if not isinstance(expr, tuple) or not expr:
        raise SExprError(f"not an S-expression: {expr!r}")
    head = expr[0]
    if not isinstance(head, str):
        raise SExprError(f"a list starts with a list, not an operator: {expr!r}"[:200])
    op = _operator(head, f"in {expr!r}"[:200])
    _check_arity(op, len(expr) - 1, f"in {expr!r}"[:200])
    return "(" + " ".join([op, *(to_text(e) for e in expr[1:])]) + ")"


def operator(expr: SExpr) -> str | None:
    """The operator of a list, None for an atom."""
    return expr[0] if isinstance(expr, tuple) else None  # type: ignore[return-value]


# --- atoms ---------------------------------------------------------------------------------


def entity_atom(iri: str, profile: KGProfile) -> str:
    """How an entity is written: ``m.0abc`` / ``g.11x`` for a Freebase id, else ``<IRI>``.

    Raises :class:`SExprError` for a value that is not a valid IRI (a space, a quote, a brace)."""
    del profile  # a Freebase id means the same IRI whatever the profile
    if iri.startswith(FREEBASE_NS) and FREEBASE_ID_RE.fullmatch(iri[len(FREEBASE_NS) :]):
        return iri[len(FREEBASE_NS) :]
    return _iri_atom(iri)


def relation_atom(iri: str, profile: KGProfile) -> str:
    """How a relation (or a class) is written: its name (``film.film.directed_by``,
    ``directed_by``) when ``profile.relation_iri`` maps that name back to ``iri``, else
    ``<IRI>``."""
    name = profile.relation_name(iri)
    # a name that could read as a literal (1990, +x, 2.5, a^^b) is written as its IRI
    if (
        _SAFE_NAME_RE.fullmatch(name)
        and name[0] not in "0123456789+-."
        and "^^" not in name
        and profile.relation_iri(name) == iri
    ):
        return name
    return _iri_atom(iri)


def literal_atom(value: str, datatype: str | None) -> str:
    """How a literal is written: ``1990^^http://www.w3.org/2001/XMLSchema#integer``,
    ``"text"`` for a plain string (``None`` or ``xsd:string``), ``"two words"^^DATATYPE``
    when the value needs quoting. A value that is not valid for a numeric or date datatype
    raises :class:`SExprError`."""
    if datatype is None or datatype == XSD + "string":
        return quote(value)
    check_typed_value(value, datatype)
    written = _iri_atom(datatype)  # checks it is an IRI
    dt = datatype if _SAFE_NAME_RE.fullmatch(datatype) else written
    body = value if _SAFE_VALUE_RE.fullmatch(value) else quote(value)
    return f"{body}^^{dt}"


def quote(value: str) -> str:
    """``value`` as a quoted S-expression string (SPARQL's escapes)."""
    return '"' + re.sub(r'[\\"\t\b\n\r\f]', lambda m: _ESCAPES[m.group(0)], value) + '"'


def unquote(body: str) -> str:
    """The value of a quoted string's body (between the quotes)."""

    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        if len(code) > 1:
            point = int(code[1:], 16)
            if point > 0x10FFFF:
                raise SExprError(f"the escape '\\{code}' is not a character")
            return chr(point)
        if code not in _UNESCAPES:
            raise SExprError(f"unknown escape '\\{code}' in the string \"{body[:60]}\"")
        return _UNESCAPES[code]

    return _ESCAPE_RE.sub(one, body)


def _iri_atom(iri: str) -> str:
    try:
        return sparql.iri(iri)
    except ValueError as exc:
        raise SExprError(str(exc)) from None


# Lexical forms of the datatypes whose values are checked (XSD 1.1); other datatypes take any
# text. A month or day out of range is refused too.
_TZ = r"(?:Z|[+-]\d{2}:\d{2})?"
_YEAR = r"-?\d{4,}"
_MONTH = r"(?:0[1-9]|1[0-2])"
_DAY = r"(?:0[1-9]|[12]\d|3[01])"
_INTEGER = r"[+-]?\d+"
_DECIMAL = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_DOUBLE = rf"{_DECIMAL}(?:[eE][+-]?\d+)?|[+-]?INF|NaN"
LEXICAL: dict[str, re.Pattern[str]] = {
    **{
        XSD + t: re.compile(_INTEGER)
        for t in [
            "integer",
            "int",
            "long",
            "short",
            "byte",
            "nonNegativeInteger",
            "positiveInteger",
            "negativeInteger",
            "nonPositiveInteger",
            "unsignedLong",
            "unsignedInt",
            "unsignedShort",
            "unsignedByte",
        ]
    },
    XSD + "decimal": re.compile(_DECIMAL),
    XSD + "double": re.compile(_DOUBLE),
    XSD + "float": re.compile(_DOUBLE),
    XSD + "boolean": re.compile(r"true|false|1|0"),
    XSD + "gYear": re.compile(_YEAR + _TZ),
    XSD + "gYearMonth": re.compile(rf"{_YEAR}-{_MONTH}{_TZ}"),
    XSD + "date": re.compile(rf"{_YEAR}-{_MONTH}-{_DAY}{_TZ}"),
    XSD + "dateTime": re.compile(
        rf"{_YEAR}-{_MONTH}-{_DAY}T\d{{2}}:\d{{2}}:\d{{2}}(?:\.\d+)?{_TZ}"
    ),
}
DATE_TYPES = frozenset(XSD + t for t in ("gYear", "gYearMonth", "date", "dateTime"))
NUMERIC_TYPES = frozenset(LEXICAL) - DATE_TYPES - {XSD + "boolean"}


def check_typed_value(value: str, datatype: str) -> None:
    """Raise :class:`SExprError` when ``value`` is not a valid ``datatype`` value (numbers,
    dates, booleans; other datatypes accept any text)."""
    pattern = LEXICAL.get(datatype)
    if pattern is not None and not pattern.fullmatch(value):
        raise SExprError(
            f"{value!r} is not a valid {datatype.removeprefix(XSD)} value "
            f"(the literal {value[:60]!r}^^{datatype})"
        )
