"""What every tool set is made of: the typed result a tool call returns (:class:`ToolResult`,
:class:`ErrorType`, :class:`ToolFailure`), and the relation and neighbour ranking the tools share
(BM25 over relation words, optionally with a dense scorer; the seeded neighbour order; the
observation cap). A leaf of the agent layer: the tool environment
(:mod:`kgsynth.agent.tools`) and the SPARQL-writing tool sets (:mod:`kgsynth.agent.toolsets`)
both build on it."""

from __future__ import annotations

import hashlib
import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from rank_bm25 import BM25Okapi

from kgsynth.agent.stemming import stem
from kgsynth.kg.graph import Entity, KGGraph, Neighbor, Relation
from kgsynth.kg.relnames import relation_phrase


class DenseScorer(Protocol):
    def scores(self, question: str, relation_texts: Sequence[str]) -> Any: ...


class ErrorType(StrEnum):
    """Why a tool call produced no usable result."""

    BAD_SYNTAX = "bad_syntax"
    UNKNOWN_TOOL = "unknown_tool"
    WRONG_ARGUMENTS = "wrong_arguments"
    ENTITY_NOT_FOUND = "entity_not_found"
    RELATION_NOT_FOUND = "relation_not_found"
    NO_RESULTS = "no_results"
    TIMEOUT = "timeout"
    KG_UNAVAILABLE = "kg_unavailable"
    QUERY_REFUSED = "query_refused"  # agent-written SPARQL the guard (or the form check) refused


@dataclass(frozen=True)
class ToolResult:
    """One tool call's outcome: the observation text, a typed error (None on success), the
    names of entities that appear in the result, and notes (e.g. ambiguous names)."""

    text: str
    error: ErrorType | None = None
    tool: str | None = None
    args: tuple = ()
    entities: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


_CHUNK_RE = re.compile(r"[^\W_]+", re.UNICODE)  # letters and digits: split at the rest
# an ASCII chunk's words: an acronym before a capitalized word ("NBA" of "NBAPlayer"), a word
# in any case ("Player", "player", "USA"), a number
_ASCII_WORD_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def _words(chunk: str) -> list[str]:
    """A chunk of letters and digits in words: split between a letter and a digit, before an
    upper-case letter that follows a lower-case one (camelCase), and before the last capital
    of a run that a lower-case letter follows ("NBAPlayer": NBA, Player); a word in capitals
    ("USA", "SHARED") and one with accents ("Pépé") stay whole."""
    if chunk.isascii():
        return _ASCII_WORD_RE.findall(chunk)
    out, start = [], 0
    for i in range(1, len(chunk)):
        a, b = chunk[i - 1], chunk[i]
        after = chunk[i + 1] if i + 1 < len(chunk) else ""
        if (
            a.isdigit() != b.isdigit()
            or (a.islower() and b.isupper())
            or (a.isupper() and b.isupper() and after.islower())
        ):
            out.append(chunk[start:i])
            start = i
    out.append(chunk[start:])
    return out


def tokenize(text: str) -> list[str]:
    """Words of a relation name or question, in lower case: split on punctuation, ``_``,
    ``.``, between letters and digits and at camelCase (:func:`_words`)."""
    if text.isascii():  # the same words in one pass: punctuation, _ and spaces match nothing
        return [w.lower() for w in _ASCII_WORD_RE.findall(text)]
    return [w.lower() for chunk in _CHUNK_RE.findall(text) for w in _words(chunk)]


def ranking_terms(text: str) -> list[str]:
    """The words BM25 ranks relations by: :func:`tokenize`'s, stemmed
    (:func:`~kgsynth.agent.stemming.stem`), so "directors" meets ``directed_by``."""
    return [stem(t) for t in tokenize(text)]


def relation_words(rel: Relation) -> str:
    """A relation's name as words: its property, with its type as context
    (:func:`~kgsynth.kg.relnames.relation_phrase`: ``film.film.directed_by`` -> ``directed by
    film``, ``/people/person/nationality`` -> ``nationality person``)."""
    return relation_phrase(rel.name)


def rank_relations(
    question: str, relations: Sequence[Relation], dense: DenseScorer | None = None
) -> list[Relation]:
    """Relations sorted by BM25 score of their name against the question (stable on ties),
    both as stemmed words (:func:`ranking_terms`).
    With ``dense`` (``hybrid`` ranking), each score is BM25 scaled to [0, 1] by the best one
    plus the cosine of the question and the relation's words (see ``kgsynth.agent.relrank``)."""
    query = ranking_terms(question)
    if not query or len(relations) < 2:
        return list(relations)
    bm25 = BM25Okapi([ranking_terms(r.name) or ["_"] for r in relations])
    scores = [float(s) for s in bm25.get_scores(query)]
    if dense is not None:
        top = max(scores)
        cos = dense.scores(question, [relation_words(r) for r in relations])
        scores = [
            (s / top if top > 0 else 0.0) + float(c) for s, c in zip(scores, cos, strict=True)
        ]
    order = sorted(range(len(relations)), key=lambda i: -scores[i])
    return [relations[i] for i in order]


def name_span(words: Sequence[str], name: str) -> tuple[int, int] | None:
    """Where ``name``'s words stand in ``words`` (first and last index), or None."""
    target = tokenize(name)
    n = len(target)
    if n == 0:
        return None
    return next(
        ((i, i + n - 1) for i in range(len(words) - n + 1) if list(words[i : i + n]) == target),
        None,
    )


_QUOTED_CHARS = 80  # a name longer than this is quoted cut, ending in "..."


def quoted_name(name: str) -> str:
    """``name`` as an observation quotes it: cut to 80 characters ("...") when longer."""
    return name if len(name) <= _QUOTED_CHARS else name[: _QUOTED_CHARS - 3] + "..."


def read_as_note(name: str, candidate: str) -> str:
    """The note a tool shows first when ``entity_matching="near"`` read ``name`` as
    ``candidate`` (:data:`READ_AS_NOTE` reads it back)."""
    return f'(no entity named "{quoted_name(name)}": read as "{candidate}")'


# :func:`read_as_note`'s line as an observation shows it, with its newline; ``said`` is the
# quoted name (cut when it ends in "..." at 80 characters), ``read`` the KG's name
READ_AS_NOTE = re.compile(r'\(no entity named "(?P<said>[^\n]*)": read as "(?P<read>[^\n]*)"\)\n?')


def quoted_cut(said: str) -> bool:
    """Whether a quoted name is :func:`quoted_name`'s cut of a longer one."""
    return len(said) == _QUOTED_CHARS and said.endswith("...")


MATCH_MARK = " <- "  # the focus ranking's "(X, r, ?) <- words" (the question's words r matches)
# ``conjunction_hints``: a triple whose entity an earlier get_triples call from another entity reached
SHARED_MARK = MATCH_MARK + "both"


def unmarked(line: str) -> str:
    """A relation line without the focus ranking's match mark: the bare triple pattern."""
    return line if line.endswith(")") else line.rsplit(MATCH_MARK, 1)[0]


def relation_pattern(entity: str, rel: Relation) -> str:
    """How a relation of ``entity`` is shown: ``(entity, rel, ?)`` or ``(?, rel, entity)``."""
    return f"({entity}, {rel.name}, ?)" if rel.direction == "out" else f"(?, {rel.name}, {entity})"


def _seeded_key(*parts: str) -> bytes:
    return hashlib.blake2b("\x00".join(parts).encode("utf-8"), digest_size=8).digest()


def order_neighbors(
    question: str,
    entity_iri: str,
    relation: Relation,
    neighbors: Sequence[Neighbor],
    limit: int | None = None,
    anchor: str | None = None,
) -> list[Neighbor]:
    """Neighbours whose names share more words with the question first, ties in a seeded
    order: a hash of (question, entity, relation, neighbour), the same on every call and in
    every process. With ``limit``, only the first ``limit`` of that order (a partial sort:
    an entity with thousands of films shows five).

    ``anchor`` is the topic entity's name as the question writes it. Its words do not count
    as shared, and the topic itself comes last: a question does not ask for the entity it
    starts from (walks' answer sets leave topics out, as KGQA benchmarks do), so on the way
    back of a round trip ("the other films of X's director") X is not what is listed first."""
    all_words = tokenize(question)
    span = name_span(all_words, anchor) if anchor else None
    words = {w for i, w in enumerate(all_words) if span is None or not span[0] <= i <= span[1]}

    def key(n: Neighbor) -> tuple[bool, int, bytes]:
        overlap = len(words & set(tokenize(n.name))) if words else 0
        seeded = _seeded_key(question, entity_iri, relation.name, relation.direction, n.term.value)
        return (span is not None and n.name == anchor, -overlap, seeded)

    if limit is not None and limit < len(neighbors):
        return heapq.nsmallest(limit, neighbors, key=key)
    return sorted(neighbors, key=key)


def truncate(text: str, limit: int) -> str:
    """Cut ``text`` at a line boundary under ``limit`` characters, with a visible marker."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    cut = cut if cut > 0 else limit
    rest = text[cut:].count("\n") + (0 if text[cut:].startswith("\n") else 1)
    return f"{text[:cut]}\n[... truncated: {rest} more lines]"


class ToolFailure(Exception):
    """Raised inside a tool: the call fails with ``error`` and the agent reads ``text``."""

    def __init__(self, error: ErrorType, text: str) -> None:
        super().__init__(text)
        self.error = error
        self.text = text


class ToolHost(Protocol):
    """What a tool set reads from the :class:`~kgsynth.agent.tools.ToolEnvironment` that runs it."""

    graph: KGGraph
    question: str
    config: Any  # the agent's AgentConfig
    dense: DenseScorer | None

    def _entity(self, name: str) -> tuple[Entity, tuple[str, ...]]: ...
