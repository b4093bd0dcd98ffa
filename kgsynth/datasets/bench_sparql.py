"""Benchmark SPARQL read as triple patterns.

WebQSP, CWQ, GrailQA and GraphQuestions give each question its gold SPARQL over Freebase::

    PREFIX ns: <http://rdf.freebase.com/ns/>
    SELECT DISTINCT ?x WHERE {
    FILTER (?x != ns:m.0x)
    FILTER (!isLiteral(?x) OR lang(?x) = '' OR langMatches(lang(?x), 'en'))
    ns:m.0x ns:film.actor.film ?y .
    ?y ns:film.performance.film ?x .
    }

:func:`parse_sparql` reads such a query (PREFIX declarations, prefixed names and full IRIs,
``;``/``,`` lists, nested groups and GrailQA's sub-select, ``VALUES``) into its triple patterns
and notes every feature beyond a basic graph pattern (ORDER BY, LIMIT, COUNT, OPTIONAL, UNION,
FILTER EXISTS …). :func:`entity_constants` lists a query's entities (CWQ's topic entities),
:func:`predicate_paths` the relations it uses (GraphWalker's predicate set P);
:mod:`kgsynth.synthesize.benchmark_refs` turns a path or conjunction query into a walk.

A leaf module: no KG access.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
XSD = "http://www.w3.org/2001/XMLSchema#"


class SparqlSyntaxError(ValueError):
    """Text this reader cannot parse as a SPARQL query (the message names the offset)."""


@dataclass(frozen=True)
class Term:
    """A variable (``value`` its name, no ``?``), an IRI, or a literal."""

    kind: Literal["var", "iri", "literal"]
    value: str
    datatype: str | None = None
    lang: str | None = None

    def __str__(self) -> str:
        if self.kind == "var":
            return f"?{self.value}"
        if self.kind == "iri":
            return f"<{self.value}>"
        return f'"{self.value}"' + (f"^^<{self.datatype}>" if self.datatype else "")


@dataclass(frozen=True)
class Pattern:
    s: Term
    p: Term
    o: Term


@dataclass
class ParsedQuery:
    """What :func:`parse_sparql` read. ``select``: the projected variables (``(?x AS ?v)``
    projects ``x``; a sub-select's projection when the outer query only renames it);
    ``patterns``: every triple pattern of every group, in order; ``filters``: each FILTER's
    expression as text; ``values``: ``VALUES ?v { … }`` of one variable; ``features``: what
    goes beyond a basic graph pattern."""

    select: list[str] = field(default_factory=list)
    patterns: list[Pattern] = field(default_factory=list)
    filters: list[str] = field(default_factory=list)
    values: dict[str, list[Term]] = field(default_factory=dict)
    features: list[str] = field(default_factory=list)


_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|\#[^\n]*)
    |(?P<iri><[^<>"{}|^`\\\s]*>)
    |(?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    |(?P<var>[?$][A-Za-z0-9_]+)
    |(?P<lang>@[A-Za-z]+(?:-[A-Za-z0-9]+)*)
    |(?P<dtype>\^\^)
    |(?P<number>[+-]?(?:[0-9]+\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?)
    |(?P<pname>(?:[A-Za-z][\w\-.]*)?:(?:[\w\-%:]+(?:[\w\-.%:]*[\w\-%:])?)?)
    |(?P<word>[A-Za-z_]\w*)
    |(?P<op>!=|<=|>=|&&|\|\||[{}().;,=<>!*+/\-])
    """,
    re.VERBOSE,
)
_AGGREGATES = {"count", "sum", "min", "max", "avg", "sample", "group_concat"}
_BLOCKS = {"optional": "OPTIONAL", "minus": "MINUS", "graph": "GRAPH", "service": "SERVICE"}


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SparqlSyntaxError(f"unexpected {text[pos : pos + 12]!r} at offset {pos}")
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append((kind, m.group(), pos))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.prefixes: dict[str, str] = {}
        self.q = ParsedQuery()

    # --- tokens ---------------------------------------------------------------------------

    def peek(self, k: int = 0) -> tuple[str, str, int]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ("eof", "", -1)

    def next(self) -> tuple[str, str, int]:
        tok = self.peek()
        if tok[0] == "eof":
            raise SparqlSyntaxError("unexpected end of query")
        self.i += 1
        return tok

    def word(self, k: int = 0) -> str:
        kind, text, _ = self.peek(k)
        return text.lower() if kind == "word" else ""

    def expect(self, text: str) -> None:
        _, got, pos = self.next()
        if got != text:
            raise SparqlSyntaxError(f"expected {text!r} at offset {pos}, found {got!r}")

    def balanced(self) -> list[str]:
        """The tokens of a parenthesised expression, parentheses included."""
        self.expect("(")
        out, depth = ["("], 1
        while depth:
            _, text, _ = self.next()
            depth += {"(": 1, ")": -1}.get(text, 0)
            out.append(text)
        return out

    # --- query ----------------------------------------------------------------------------

    def parse(self) -> ParsedQuery:
        while self.word() in ("prefix", "base"):
            if self.word() == "base":
                self.i += 2
                continue
            self.i += 1
            kind, name, pos = self.next()
            if kind != "pname" or not name.endswith(":"):
                raise SparqlSyntaxError(f"expected a prefix name at offset {pos}")
            kind, iri, pos = self.next()
            if kind != "iri":
                raise SparqlSyntaxError(f"expected the prefix's IRI at offset {pos}")
            self.prefixes[name[:-1]] = iri[1:-1]
        form = self.word()
        if form != "select":
            raise SparqlSyntaxError(
                f"only SELECT queries are read (found {form or self.peek()[1]!r})"
            )
        self.q.select = self.select_query()
        if self.peek()[0] != "eof":
            raise SparqlSyntaxError(f"unexpected {self.peek()[1]!r} at offset {self.peek()[2]}")
        return self.q

    def select_query(self) -> list[str]:
        self.expect_word("select")
        projected: list[str] = []
        renamed = False
        while self.peek()[1] not in ("{", "") and self.word() != "where":
            kind, text, _ = self.peek()
            if kind == "var":
                projected.append(self.next()[1][1:])
            elif text == "(":
                expr = self.balanced()
                words = {t.lower() for t in expr}
                if words & _AGGREGATES:
                    self.q.features.append("aggregate (" + " ".join(expr[1:-1]) + ")")
                inner = [t[1:] for t in expr if t.startswith(("?", "$"))]
                if len(expr) == 5 and expr[2].lower() == "as":  # ( ?x AS ?v )
                    projected.append(inner[0])
                    renamed = True
                else:
                    projected.extend(inner[:1])
            elif text == "*":
                self.next()
                projected.append("*")
            else:  # DISTINCT, REDUCED
                self.next()
        if self.word() == "where":
            self.next()
        sub = self.group()
        self.modifiers()
        # GrailQA: SELECT (?x0 AS ?value) WHERE { SELECT DISTINCT ?x0 WHERE { ... } }
        if renamed and sub:
            return sub
        return projected

    def expect_word(self, word: str) -> None:
        if self.word() != word:
            raise SparqlSyntaxError(f"expected {word.upper()} at offset {self.peek()[2]}")
        self.next()

    def modifiers(self) -> None:
        while True:
            w = self.word()
            if w in ("group", "order"):
                self.next()
                self.expect_word("by")
                keys: list[str] = []
                while True:
                    kind, text, _ = self.peek()
                    if kind == "var":
                        keys.append(self.next()[1])
                    elif text == "(":
                        keys.extend(self.balanced())
                    elif kind in ("word", "pname") and self.peek(1)[1] == "(":
                        keys.append(self.next()[1])  # DESC(?x), xsd:datetime(?x)
                        keys.extend(self.balanced())
                    else:
                        break
                self.q.features.append(f"{w.upper()} BY {' '.join(keys)}")
            elif w == "having":
                self.next()
                self.q.features.append("HAVING " + " ".join(self.balanced()))
            elif w in ("limit", "offset"):
                self.next()
                self.q.features.append(f"{w.upper()} {self.next()[1]}")
            else:
                return

    # --- groups ---------------------------------------------------------------------------

    def group(self) -> list[str]:
        """A ``{ … }`` group; returns a sub-select's projection when the group is one."""
        self.expect("{")
        sub: list[str] = []
        while self.peek()[1] != "}":
            w = self.word()
            text = self.peek()[1]
            if w == "select":
                sub = self.select_query()
            elif text == "{":
                sub = self.group() or sub
                if self.word() == "union":
                    self.q.features.append("UNION")
                    self.next()
            elif w == "filter":
                self.filter()
            elif w in _BLOCKS:
                self.next()
                self.q.features.append(_BLOCKS[w])
                if w in ("graph", "service"):
                    self.next()
                self.group()
            elif w == "values":
                self.next()
                self.values()
            elif w == "bind":
                self.next()
                self.q.features.append("BIND " + " ".join(self.balanced()))
            elif text == ".":
                self.next()
            else:
                self.triples()
        self.expect("}")
        return sub

    def filter(self) -> None:
        self.next()
        if (self.word() == "not" and self.word(1) == "exists") or self.word() == "exists":
            negated = self.word() == "not"
            self.i += 2 if negated else 1
            self.q.features.append("FILTER NOT EXISTS" if negated else "FILTER EXISTS")
            self.group()
            return
        if self.peek()[1] == "(":
            self.q.filters.append(" ".join(self.balanced()))
            return
        name = self.next()[1]  # a function call: FILTER regex(...)
        self.q.filters.append(name + " " + " ".join(self.balanced()))

    def values(self) -> None:
        if self.peek()[1] == "(":
            self.balanced()
            self.q.features.append("VALUES over several variables")
            self.group_tokens()
            return
        kind, var, pos = self.next()
        if kind != "var":
            raise SparqlSyntaxError(f"expected a variable after VALUES at offset {pos}")
        self.expect("{")
        terms = []
        while self.peek()[1] != "}":
            terms.append(self.term())
        self.expect("}")
        self.q.values[var[1:]] = terms

    def group_tokens(self) -> None:
        self.expect("{")
        depth = 1
        while depth:
            text = self.next()[1]
            depth += {"{": 1, "}": -1}.get(text, 0)

    def triples(self) -> None:
        subject = self.term()
        while True:
            if self.word() == "a":
                self.next()
                pred = Term("iri", RDF_TYPE)
            else:
                pred = self.term()
            while True:
                self.q.patterns.append(Pattern(subject, pred, self.term()))
                if self.peek()[1] != ",":
                    break
                self.next()
            if self.peek()[1] != ";":
                break
            self.next()
            if self.peek()[1] in (".", "}"):
                break
        if self.peek()[1] == ".":
            self.next()

    def term(self) -> Term:
        kind, text, pos = self.next()
        if kind == "var":
            return Term("var", text[1:])
        if kind == "iri":
            return Term("iri", text[1:-1])
        if kind == "pname":
            prefix, _, local = text.partition(":")
            if prefix not in self.prefixes:
                raise SparqlSyntaxError(f"undeclared prefix {prefix + ':'!r} at offset {pos}")
            return Term("iri", self.prefixes[prefix] + local)
        if kind == "string":
            value = text[1:-1]
            if self.peek()[0] == "lang":
                return Term("literal", value, lang=self.next()[1][1:])
            if self.peek()[0] == "dtype":
                self.next()
                return Term("literal", value, datatype=self.term().value)
            return Term("literal", value)
        if kind == "number":
            dtype = "integer" if re.fullmatch(r"[+-]?[0-9]+", text) else "decimal"
            return Term("literal", text, datatype=XSD + dtype)
        if kind == "word" and text.lower() in ("true", "false"):
            return Term("literal", text.lower(), datatype=XSD + "boolean")
        raise SparqlSyntaxError(f"expected a term at offset {pos}, found {text!r}")


def parse_sparql(text: str) -> ParsedQuery:
    """The query's projection, triple patterns, filters, ``VALUES`` and extra features.
    Raises :class:`SparqlSyntaxError` on text it cannot read."""
    return _Parser(text).parse()


def entity_constants(query: ParsedQuery) -> list[str]:
    """The IRIs in subject or object position of the triple patterns (and single-variable
    ``VALUES``), in order of first appearance: a query's entities."""
    seen: dict[str, None] = {}
    for pat in query.patterns:
        for t in (pat.s, pat.o):
            if t.kind == "iri":
                seen.setdefault(t.value)
    for terms in query.values.values():
        for t in terms:
            if t.kind == "iri":
                seen.setdefault(t.value)
    return list(seen)


def predicate_paths(query: ParsedQuery) -> list[tuple[str, ...]]:
    """The predicate IRIs of the triple patterns, each as a 1-tuple, and every two-edge path
    ``(p1, p2)`` that crosses an unprojected variable ``?c`` as ``a p1 ?c . ?c p2 b`` (what a
    Freebase CVT hop is, flattened)."""
    out: dict[tuple[str, ...], None] = {}
    into: dict[str, list[str]] = defaultdict(list)
    out_of: dict[str, list[str]] = defaultdict(list)
    for pat in query.patterns:
        if pat.p.kind != "iri":
            continue
        out[(pat.p.value,)] = None
        if pat.o.kind == "var":
            into[pat.o.value].append(pat.p.value)
        if pat.s.kind == "var":
            out_of[pat.s.value].append(pat.p.value)
    for var, heads in into.items():
        if var in query.select:
            continue
        for p1 in heads:
            for p2 in out_of.get(var, ()):
                out[(p1, p2)] = None
    return list(out)
