"""What every tool set is made of: the typed result a tool call returns (:class:`ToolResult`,
:class:`ErrorType`, :class:`ToolFailure`), and the relation and neighbour ranking the tools share
(BM25 over relation words, optionally with a dense scorer; the seeded neighbour order; the
observation cap). A leaf of the agent layer: the tool environment
(:mod:`kgsynth.agent.tools`) and the SPARQL-writing tool sets (:mod:`kgsynth.agent.toolsets`)
both build on it."""

from __future__ import annotations

import difflib
import hashlib
import heapq
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

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


_TOKEN_RE = re.compile(r"[A-Za-z][a-z]*|[0-9]+|[^\W\d_]+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Words of a relation name or question: split on punctuation, ``_``, ``.`` and camelCase."""
    return [t.lower() for t in _TOKEN_RE.findall(text)]


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


NEAR_NAME_CUTOFF = 0.6  # the least similarity (difflib ratio, case-folded) a near name needs
_SPAN_WORDS = 12  # the longest word span of the question taken as a name
_EDGE_PUNCTUATION = "?!.,;:\"'()[]"


def near_names(
    name: str, question: str, shown: Sequence[str], cutoff: float = NEAR_NAME_CUTOFF
) -> list[str]:
    """Names from an episode's context that read like ``name``, most similar first: the word
    spans of the question and the names its observations showed (``shown``), scored by
    difflib's ratio on case-folded text, those at ``cutoff`` or above. Ties go to the longer
    name, then the alphabetically first, so the order is the same every time."""
    target = " ".join(name.casefold().split())
    if not target:
        return []
    words = question.split()
    spans = {
        " ".join(words[i:j]).strip(_EDGE_PUNCTUATION)
        for i in range(len(words))
        for j in range(i + 1, min(len(words), i + _SPAN_WORDS) + 1)
    }
    scored: list[tuple[float, str]] = []
    for candidate in spans | set(shown):
        folded = " ".join(candidate.casefold().split())
        if not folded or folded == target:
            continue
        matcher = difflib.SequenceMatcher(None, target, folded, autojunk=False)
        if matcher.real_quick_ratio() < cutoff or matcher.quick_ratio() < cutoff:
            continue
        ratio = matcher.ratio()
        if ratio >= cutoff:
            scored.append((ratio, candidate))
    scored.sort(key=lambda s: (-s[0], -len(s[1]), s[1]))
    return [candidate for _, candidate in scored]


def read_answers(answers: Sequence[str], shown: Sequence[str]) -> list[str]:
    """``answer_matching="near"``: each answer the episode's observations never showed (in
    any case) read as the most similar name they showed (:func:`near_names` over ``shown``
    alone, ratio 0.6 or more), else kept as written; a name read twice counts once. A small
    policy copies long names with slips ("maria_of_austria_the_yonger"); the name it meant is
    the one on the page."""
    exact = {" ".join(n.casefold().split()): n for n in shown}
    out: dict[str, None] = {}
    for name in answers:
        key = " ".join(name.casefold().split())
        read = exact.get(key) or next(iter(near_names(name, "", shown)), name)
        out.setdefault(read, None)
    return list(out)


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


# question words of four letters or more that say nothing a relation could be named for:
# they are weighed in the focus ranking like any word, but never shown as a relation's match
_FUNCTION_WORDS = frozenset(
    [
        "what",
        "which",
        "when",
        "where",
        "whose",
        "does",
        "were",
        "there",
        "their",
        "that",
        "this",
        "with",
        "from",
        "into",
        "about",
        "have",
        "also",
        "than",
        "been",
        # shorter ones: the four-letter rule already hides them from the marks; the first-hop
        # fallback (kgsynth.agent.first_hop), which shows shorter words, reads them here too
        *("a", "an", "the", "of", "in", "on", "at", "to", "by", "for", "and", "or", "is"),
        *("are", "was", "be", "did", "do", "has", "had", "who", "how", "why", "its", "his"),
        *("her", "can", "you", "me", "my", "i", "it", "as", "if", "so", "no", "not", "all"),
        *("any", "one"),
    ]
)


def is_function_word(word: str) -> bool:
    """A word that names nothing a relation could be about (never shown as a match)."""
    return word.lower() in _FUNCTION_WORDS


# words that say two things stand in one relation to a third: "the films that share the director
# of X", "the things with the same tags as X", "who starred together with X" (the words of the
# template backend's shared forms, kgsynth.llm.rule_questions.shared_forms). Not "also", which
# joins two conditions as often ("what is X and also Y"), nor the prefix "co-": "the co-founders
# of X" is one hop where X is a company and a round trip where X is a person
SHARING_WORDS = frozenset({"same", "share", "shares", "shared", "sharing", "together"})


class FocusWord(NamedTuple):
    """A question word the episode has not used yet (see :func:`focus_words`)."""

    weight: float  # 1 / (1 + the words between it and the anchor)
    word: str  # as the question writes it, at its nearest occurrence
    position: int  # that occurrence's index among the question's words


def focus_words(
    question: str, anchor: str | None, followed: Sequence[str], used: Sequence[str] = ()
) -> dict[str, FocusWord]:
    """The question's stemmed words that the episode has not yet used, each with a weight for
    how near it stands to ``anchor`` (the topic entity's name in the question): 1 / (1 + the
    number of words between them), 1 for every word where the anchor is not in the question;
    and the word as the question writes it (its nearest occurrence).

    Each relation in ``followed`` (in the order the episode followed them) uses up one
    occurrence of each of its words, the one nearest the anchor: in "who starred in the films
    written by X", following ``written_by`` from X uses "written" and "by", and "starred" is
    what is left for the next hop. A word said twice ("whose directors also directed X")
    stays for a second hop along the same relation, and so does every word of the first
    relation where the question has a sharing word (:data:`SHARING_WORDS`: "the films with
    the same director as X" goes out along ``directed_by`` and back along it)."""
    words = tokenize(question)
    stems = [stem(w) for w in words]
    span = name_span(words, anchor) if anchor else None

    def distance(i: int) -> int:
        if span is None:
            return 0
        start, end = span
        return start - i - 1 if i < start else i - end - 1 if i > end else 0

    inside = set(range(span[0], span[1] + 1)) if span else set()
    left = [i for i in range(len(stems)) if i not in inside]
    # a sharing word ("the same director as X") says the relation twice: out to what X has,
    # and back to what else has it; so the first relation followed leaves its words for the
    # second hop
    using = followed[1:] if SHARING_WORDS.intersection(words) else followed
    for rel in using:
        for term in dict.fromkeys(ranking_terms(rel)):
            spots = [i for i in left if stems[i] == term]
            if spots:
                left.remove(min(spots, key=lambda i: (distance(i), i)))
    # a word a fallback mark showed beside a relation the episode then followed ("father" on
    # ``parents``) is used up like the relation's own words
    for word in used:
        spots = [i for i in left if words[i] == word.lower()]
        if spots:
            left.remove(min(spots, key=lambda i: (distance(i), i)))
    out: dict[str, FocusWord] = {}
    for i in sorted(left, key=lambda i: (distance(i), i)):
        out.setdefault(stems[i], FocusWord(1.0 / (1 + distance(i)), words[i], i))
    return out


def focus_weights(question: str, anchor: str | None, followed: Sequence[str]) -> dict[str, float]:
    """:func:`focus_words`' weights alone."""
    return {term: w.weight for term, w in focus_words(question, anchor, followed).items()}


def rank_relations_focused(
    question: str,
    relations: Sequence[Relation],
    anchor: str | None,
    followed: Sequence[str],
    used: Sequence[str] = (),
) -> list[tuple[Relation, tuple[str, ...]]]:
    """Relations sorted by BM25 over :func:`focus_words`, each word's score times its weight
    (stable on ties), each with the question's unused words it matches (words of four letters
    or more that are not function words; in question order). The relation a question names
    nearest its topic comes first, and after a hop the one it names next; a list where no
    relation matches a word shows the agent that the question asks for nothing more.

    The idf is Lucene's, ln(1 + (N - n + 0.5) / (n + 0.5)), which stays positive where a word
    is in half the relations or more (an entity with two relations)."""
    found = focus_words(question, anchor, followed, used)
    docs = [ranking_terms(r.name) for r in relations]
    avg = sum(len(d) for d in docs) / max(len(docs), 1) or 1.0
    k1, b = 1.5, 0.75
    df = Counter(term for d in docs for term in set(d) & found.keys())
    idf = {t: math.log(1 + (len(docs) - n + 0.5) / (n + 0.5)) for t, n in df.items()}
    scored = []
    for i, doc in enumerate(docs):
        score = 0.0
        shared = set(doc) & found.keys()
        for term in shared:
            tf = doc.count(term)
            norm = tf + k1 * (1 - b + b * len(doc) / avg)
            score += found[term].weight * idf[term] * tf * (k1 + 1) / norm
        # the word as the question writes it, not its stem: "actors" and "tags" stem to three
        # letters ("act", "tag") and are what the question names the relation for
        shown = [
            t for t in shared if len(found[t].word) >= 4 and found[t].word not in _FUNCTION_WORDS
        ]
        marks = tuple(found[t].word for t in sorted(shown, key=lambda t: found[t].position))
        scored.append((-score, i, (relations[i], marks)))
    return [item for _, _, item in sorted(scored, key=lambda x: (x[0], x[1]))]


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
