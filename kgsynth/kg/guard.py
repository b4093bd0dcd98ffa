"""The read-only guard: every query text -> the checked text a backend runs, or a refusal.

:func:`checked_query` admits exactly one SPARQL 1.1 SELECT, ASK, CONSTRUCT or DESCRIBE query
with no ``SERVICE`` anywhere (subqueries, ``OPTIONAL``, ``EXISTS`` included) and no update
operation; anything else raises :class:`~kgsynth.core.errors.QueryRejectedError`. It works in three
steps:

1. **Lex** the text with the SPARQL 1.1 terminals (comments end at ``\\r`` or ``\\n``, as the
   grammar says; long and short strings; IRIs; numbers; prefixed names; variables).
   Backslashes outside strings and IRIs, characters the grammar has no terminal for (U+2028,
   U+0085, controls) and relative IRIs are refused.
2. **Rewrite** it into a canonical text: comments dropped, every string re-written as one
   short ``"…"`` literal with every quote and line break escaped (:func:`sparql.literal`),
   every IRI re-written from its decoded value (:func:`sparql.iri`). The canonical text is
   what the backend sends or runs, so an engine whose lexer differs from this one on a comment
   or a string (rdflib ends comments at ``\\n`` only; Oxigraph at ``\\r`` too) still reads the
   text the parser checked: there are no comments or multi-line strings left to disagree on.
   kgsynth's own queries come out unchanged.
3. **Parse** it with rdflib's SPARQL 1.1 query grammar (``parseQuery``: an update, or a
   ``;``-chain, does not parse as a query) and walk the parse tree for ``SERVICE``. What is
   parsed is the query's *shape*: the canonical tokens with each IRI, string, language tag and
   number replaced by a placeholder of the same terminal, and the rows of each ``VALUES``
   block deduplicated. A terminal swapped for another of the same kind cannot change the
   parse, and ``VALUES`` rows hold only terms, so the shape parses, and has ``SERVICE``, exactly
   when the query does. kgsynth's builders write a few shapes many times (a look-up for
   another entity, a batch of another size), so the parser (pure Python, milliseconds) runs
   once per shape; both verdicts are kept in bounded LRU caches (text -> canonical text,
   shape -> verdict).

As belt and braces, a token that is not a variable, string or IRI and starts with
``SERVICE`` (case-insensitive) is refused before parsing: rdflib and Oxigraph both read
``SERVICE:{…}`` as a ``SERVICE`` call to the empty prefix, where a lexer reads a prefixed name.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

from kgsynth.core.errors import QueryRefusedError, QueryRejectedError
from kgsynth.kg import sparql

TEXT_CACHE_SIZE = 4_096  # query text -> canonical text
SHAPE_CACHE_SIZE = 1_024  # shape -> verdict (None: admitted, else the refusal message)
MAX_QUERY_CHARS = 10_000_000

# PN_CHARS_BASE of the SPARQL 1.1 grammar (production [164])
_BASE = (
    "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u02ff\u0370-\u037d\u037f-\u1fff\u200c-\u200d"
    "\u2070-\u218f\u2c00-\u2fef\u3001-\ud7ff\uf900-\ufdcf\ufdf0-\ufffd\U00010000-\U000effff"
)
_CHARS_U = _BASE + "_"
_CHARS = _CHARS_U + r"\-0-9\u00b7\u0300-\u036f\u203f-\u2040"
_PREFIX = f"[{_BASE}](?:[{_CHARS}.]*[{_CHARS}])?"
_LOCAL_CHAR = f"[{_CHARS_U}:0-9]|%[0-9A-Fa-f]{{2}}"
_LOCAL_MORE = f"[{_CHARS}.:]|%[0-9A-Fa-f]{{2}}"
_LOCAL = f"(?:{_LOCAL_CHAR})(?:(?:{_LOCAL_MORE})*(?:[{_CHARS}:]|%[0-9A-Fa-f]{{2}}))?"
_ESCAPE = r"\\(?:[tbnrf\\\"']|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8})"

_GAP = r"(?P<gap>[ \t\r\n]*(?:#[^\r\n]*[ \t\r\n]*)*)"  # whitespace and comments before a token
# Alternatives in the order that is cheapest for the texts kgsynth sends (IRIs, variables and
# braces first: Python's regex engine tries them one by one); the order only matters between
# alternatives that can start with the same character, and there it is the grammar's.
_TOKEN_RE = re.compile(
    _GAP + r"(?:"
    r"(?P<iri><[A-Za-z][A-Za-z0-9+.\-]*:(?:[^<>\"{}|^`\\\x00-\x20]++|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8})*+>)"
    rf"|(?P<var>[?$][{_CHARS_U}0-9][{_CHARS_U}0-9\u00b7\u0300-\u036f\u203f-\u2040]*)"
    r"|(?P<punct>\^\^|&&|\|\||!=|[{}()\[\];,*/=!|^])"
    r"|(?P<string>"
    rf'"""(?:(?:"|"")?(?:[^"\\]|{_ESCAPE}))*"""'
    rf"|'''(?:(?:'|'')?(?:[^'\\]|{_ESCAPE}))*'''"
    rf'|"(?:[^"\\\r\n]++|{_ESCAPE})*+"'
    rf"|'(?:[^'\\\r\n]++|{_ESCAPE})*+')"
    r"|(?P<reliri><(?:[^<>\"{}|^`\\\x00-\x20]++|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8})*+>)"
    r"|(?P<lang>@[A-Za-z]+(?:-[A-Za-z0-9]+)*)"
    rf"|(?P<bnode>_:[{_CHARS_U}0-9](?:[{_CHARS}.]*[{_CHARS}])?)"
    rf"|(?P<pname>(?:{_PREFIX})?:(?:{_LOCAL})?)"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<double>[+-]?(?:[0-9]+\.[0-9]*[eE][+-]?[0-9]+|\.[0-9]+[eE][+-]?[0-9]+|[0-9]+[eE][+-]?[0-9]+))"
    r"|(?P<decimal>[+-]?[0-9]*\.[0-9]+)"
    r"|(?P<integer>[+-]?[0-9]+)"
    r"|(?P<op><=|>=|[.+\-<>?])"
    r"|(?P<end>\Z)"
    r"|(?P<bad>.))",
    re.DOTALL,
)
_COMMENT_RE = re.compile(r"#[^\r\n]*")
# placeholders of the shape: another terminal of the same kind
_FORM = {
    "iri": "<x:>",
    "string": '""',
    "lang": "@x",
    "double": "0e0",
    "decimal": "0.0",
    "integer": "0",
}
_QUERY_FORMS = {"SelectQuery", "AskQuery", "ConstructQuery", "DescribeQuery"}
_ECHAR_VALUES = {"t": "\t", "b": "\b", "n": "\n", "r": "\r", "f": "\f"}
_ESCAPE_RE = re.compile(_ESCAPE)


def _unescape(match: re.Match[str]) -> str:
    text = match.group(0)
    if text[1] in "uU":
        code = int(text[2:], 16)
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise _reject(f"invalid escape {text} in the query")
        return chr(code)
    return _ECHAR_VALUES.get(text[1], text[1])


def _string_value(token: str) -> str:
    body = token[3:-3] if token[:3] in ('"""', "'''") else token[1:-1]
    return _ESCAPE_RE.sub(_unescape, body) if "\\" in body else body


def _reject(message: str) -> QueryRefusedError:
    return QueryRefusedError(f"refused: {message}")


def _lex(query: str) -> tuple[str, list[str], list[str], bool]:
    """The canonical text; the shape as alternating separators (``" "`` or ``""``) and
    placeholders; each token's kind; and whether a ``VALUES`` keyword was seen."""
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) on the query text
    shape: list[str] = []
    kinds: list[str] = []
    has_values = False
    form_of = _FORM.get
    for match in _TOKEN_RE.finditer(query):
        kind = match.lastgroup
        gap = match.group(1)
        if gap:
            if "#" in gap:  # comments go: no engine can read them differently from us
                edits.append((match.start(1), match.end(1), _COMMENT_RE.sub(" ", gap)))
            shape.append(" ")
        else:
            shape.append("")
        if kind == "end":
            shape.pop()
            break
        text = match.group(kind)  # type: ignore[arg-type]
        form = form_of(kind, text)  # type: ignore[arg-type]
        if kind == "string":
            try:
                canon = sparql.literal(_string_value(text))
            except ValueError as exc:
                raise _reject(f"a string that cannot be sent ({exc})") from None
            if canon != text:
                edits.append((match.start(kind), match.end(kind), canon))
        elif kind == "iri":
            if "\\" in text:
                try:
                    canon = sparql.iri(_ESCAPE_RE.sub(_unescape, text[1:-1]))
                except ValueError as exc:
                    raise _reject(str(exc)) from None
                edits.append((match.start(kind), match.end(kind), canon))
        elif kind == "word" or kind == "pname":
            head = text[:7].upper()
            if head == "SERVICE":
                raise _reject("SERVICE (a query that calls another endpoint)")
            if head[:6] == "VALUES":
                has_values = True
        elif form is not text:  # a number: its sign stays
            if text[0] in "+-":
                form = text[0] + form
        elif kind == "reliri":
            raise _reject(f"relative IRI {text[:80]!r}: write absolute IRIs")
        elif kind == "bad":
            if text == "\\":
                raise _reject("a backslash outside a string or an IRI")
            raise _reject(f"character {text!r} (U+{ord(text):04X}) outside a string or an IRI")
        shape.append(form)
        kinds.append(kind)  # type: ignore[arg-type]
    if not edits:
        return query, shape, kinds, has_values
    parts: list[str] = []
    last = 0
    for start, end, text in edits:
        parts.append(query[last:start])
        parts.append(text)
        last = end
    parts.append(query[last:])
    return "".join(parts), shape, kinds, has_values


_TERM_KINDS = frozenset(
    {"iri", "string", "lang", "pname", "double", "decimal", "integer", "word", "bnode"}
)


def _shape_text(shape: list[str], kinds: list[str], has_values: bool) -> str:
    """The shape as text, with the rows of each ``VALUES`` block deduplicated (the first of
    each kind kept, in order). A block is recognised only when it holds nothing but terms,
    ``UNDEF`` and parentheses between its braces; any other block is left as it is."""
    if not has_values:
        return "".join(shape)
    seps, forms = shape[0::2], shape[1::2]
    out: list[str] = []
    i, n = 0, len(forms)
    while i < n:
        out.append(seps[i] + forms[i])
        i += 1
        if kinds[i - 1] != "word" or forms[i - 1].upper() != "VALUES":
            continue
        j = i  # the header: one variable, or ( variables ), then "{"
        if j < n and kinds[j] == "var":
            j += 1
        elif j < n and forms[j] == "(":
            j += 1
            while j < n and kinds[j] == "var":
                j += 1
            if j >= n or forms[j] != ")":
                continue
            j += 1
        else:
            continue
        if j >= n or forms[j] != "{":
            continue
        rows: list[tuple[str, ...]] = []
        row: list[str] = []
        k, depth = j + 1, 0
        while k < n and forms[k] != "}":
            piece, form = seps[k] + forms[k], forms[k]
            if form == "(" and depth == 0:
                depth, row = 1, [piece]
            elif form == ")" and depth == 1:
                row.append(piece)
                rows.append(tuple(row))
                depth = 0
            elif kinds[k] in _TERM_KINDS or form == "^^":
                if depth:
                    row.append(piece)
                elif form in ("@x", "^^"):
                    break  # a tagged or typed literal of a one-variable block: left as it is
                else:
                    rows.append((piece,))
            else:
                break
            k += 1
        if k >= n or forms[k] != "}" or depth:
            continue
        out.extend(seps[m] + forms[m] for m in range(i, j + 1))
        for r in dict.fromkeys(rows):
            out.extend(r)
        out.append(seps[k] + "}")
        i = k + 1
    return "".join(out)


def _walk(node: Any) -> bool:
    """True when the parse tree under ``node`` holds a SERVICE pattern."""
    from rdflib.plugins.sparql.parserutils import CompValue

    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, CompValue):
            if item.name == "ServiceGraphPattern":
                return True
            stack.extend(item.values())
        elif isinstance(item, list | tuple) or type(item).__name__ == "ParseResults":
            stack.extend(item)
    return False


_parse_lock = threading.Lock()


def _verdict(shape: str) -> str | None:
    """None when ``shape`` is one read-only query without SERVICE, else why not."""
    from pyparsing import ParseException
    from rdflib.plugins.sparql.parser import parseQuery

    with _parse_lock:  # pyparsing's packrat cache is shared
        try:
            tree = parseQuery(shape)
        except ParseException as exc:
            return (
                "kgsynth sends only read-only queries, one SELECT, ASK, CONSTRUCT or DESCRIBE "
                f"(no update): this one does not parse as one: {' '.join(str(exc.msg).split())}"
            )
        except Exception as exc:  # rdflib raises plain exceptions for some grammar errors
            return f"the query does not parse: {' '.join(str(exc).split())[:300]}"
    form = getattr(tree[1], "name", None)
    if form not in _QUERY_FORMS:
        return "not a SELECT, ASK, CONSTRUCT or DESCRIBE query"
    if _walk(tree):
        return "SERVICE (a query that calls another endpoint)"
    return None


class _LRU(OrderedDict[str, Any]):
    """The guard's bounded, thread-safe verdict caches. Kept rather than a locked
    ``cachetools.LRUCache``, which took 1.4 to 2.4 times as long per look-up
    (benchmarks/bench_libraries.py); ``functools.lru_cache`` would cache an exception
    neither as a value nor per shape."""

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize
        self.lock = threading.Lock()

    def lookup(self, key: str) -> Any:
        with self.lock:
            try:
                self.move_to_end(key)
            except KeyError:
                return None
            return self[key]

    def store(self, key: str, value: Any) -> None:
        with self.lock:
            self[key] = value
            if len(self) > self.maxsize:
                self.popitem(last=False)


_texts = _LRU(TEXT_CACHE_SIZE)
_shapes = _LRU(SHAPE_CACHE_SIZE)
stats = {"texts_hit": 0, "shapes_hit": 0, "parsed": 0}


def ensure_read_only(query: str) -> str:
    """The text to send for ``query``, or :class:`~kgsynth.core.errors.QueryRefusedError`: what
    every backend calls on every query (looked up through this module at each call, so a
    benchmark can swap it). See :func:`checked_query`."""
    return checked_query(query)


def checked_query(query: str) -> str:
    """The canonical text of ``query`` to send, or :class:`QueryRejectedError` saying why not.

    Admits one SELECT, ASK, CONSTRUCT or DESCRIBE query without SERVICE; refuses updates,
    ``;``-chains, SERVICE anywhere, text that does not parse, and the lexical forms listed in
    the module docstring.
    """
    cached = _texts.lookup(query)
    if cached is not None:
        stats["texts_hit"] += 1
        if isinstance(cached, QueryRejectedError):
            raise QueryRefusedError(str(cached))
        return cached
    try:
        canon = _canonical(query)
    except QueryRejectedError as exc:
        _texts.store(query, exc)
        raise
    _texts.store(query, canon)
    return canon


def _canonical(query: str) -> str:
    if not isinstance(query, str):
        raise _reject("a query must be text")
    if len(query) > MAX_QUERY_CHARS:
        raise _reject(f"a query of {len(query):,} characters (at most {MAX_QUERY_CHARS:,})")
    canon, shape, kinds, has_values = _lex(query)
    if not kinds:
        raise _reject("an empty query")
    key = _shape_text(shape, kinds, has_values)
    verdict = _shapes.lookup(key)
    if verdict is None:
        stats["parsed"] += 1
        verdict = _verdict(key) or ""
        _shapes.store(key, verdict)
    else:
        stats["shapes_hit"] += 1
    if verdict:
        raise _reject(verdict)
    return canon


def clear_caches() -> None:
    """Forget every cached verdict (tests, benchmarks)."""
    for cache in (_texts, _shapes):
        with cache.lock:
            cache.clear()
