"""The ``focus`` relation ranking's word accounting: which of the question's words an episode has
not used yet, how near each stands to the topic's name, and BM25 over those words alone
(:func:`rank_relations_focused`). The strategy that keeps an episode's state for it is
:class:`kgsynth.agent.strategies.ranking.FocusRanking`."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple

from kgsynth.agent.stemming import joins, stem
from kgsynth.agent.toolkit import name_span, ranking_terms, tokenize
from kgsynth.kg.graph import Relation

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
        # fallback (kgsynth.agent.strategies.first_hop), which shows shorter words, reads them here too
        *("a", "an", "the", "of", "in", "on", "at", "to", "by", "for", "and", "or", "is"),
        *("are", "was", "be", "did", "do", "has", "had", "who", "how", "why", "its", "his"),
        *("her", "can", "you", "me", "my", "i", "it", "as", "if", "so", "no", "not", "all"),
        *("any", "one"),
    ]
)


def is_function_word(word: str) -> bool:
    """A word that names nothing a relation could be about (never shown as a match)."""
    return word.lower() in _FUNCTION_WORDS


def _says(word: str, word_stem: str, round_trip: Collection[str]) -> bool:
    """Whether a question word is one of the ``round_trip`` words or an inflection of one
    ("shared" where the run's questions said "share"): the same stem and no shorter, so that
    the name "Sam" is not "same"."""
    word = word.lower()
    return any(word == r or (len(word) >= len(r) and word_stem == stem(r)) for r in round_trip)


class FocusWord(NamedTuple):
    """A question word the episode has not used yet (see :func:`focus_words`)."""

    weight: float  # 1 / (1 + the words between it and the anchor)
    word: str  # as the question writes it, at its nearest occurrence
    position: int  # that occurrence's index among the question's words


def focus_words(
    question: str,
    anchor: str | None,
    followed: Sequence[str],
    used: Sequence[str] = (),
    round_trip: Collection[str] = (),
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
    relation where the question has one of the ``round_trip`` words (which those are, the run's
    synthesized questions say: :mod:`kgsynth.agent.strategies.round_trips`; "the films with the
    same director as X" goes out along ``directed_by`` and back along it)."""
    words = tokenize(question)
    stems = [stem(w) for w in words]
    span = name_span(words, anchor) if anchor else None

    inside = set(range(span[0], span[1] + 1)) if span else set()
    # a round-trip word ("the same director as X") says the relation twice: out to what X has,
    # and back to what else has it; so the first relation followed leaves its words for the
    # second hop
    shared = [
        i for i in range(len(words)) if i not in inside and _says(words[i], stems[i], round_trip)
    ]
    back = bool(shared)

    def distance(i: int) -> int:
        if span is None:
            return 0
        start, end = span
        near = start - i - 1 if i < start else i - end - 1 if i > end else 0
        if shared and not followed:
            # the relation a round-trip word names ("share directors with X") is the one the
            # question goes out on: from the topic it stands as near as the topic's own words
            near = min(near, *(max(abs(i - j) - 1, 0) for j in shared))
        return near

    left = [i for i in range(len(stems)) if i not in inside]
    using = followed[1:] if back else followed
    for rel in using:
        for term in dict.fromkeys(ranking_terms(rel)):
            spots = [i for i in left if joins(stems[i], term)]
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


# the words that open a question by naming the kind of thing asked for ("which films"): the
# noun after them types the answer, it names no relation to follow
_WH_DETERMINERS = frozenset({"which", "what", "whose"})


def content_words(
    question: str,
    found: dict[str, FocusWord],
    topics: Sequence[str] = (),
    keep_typed: bool = False,
) -> dict[str, FocusWord]:
    """Of ``found`` (stem -> an unused question word), the words that can name a relation: not
    a function word, three letters or more, not inside a topic's name, and (unless
    ``keep_typed``) not the noun after an opening which/what/whose ("which films did X direct":
    the films are the answer; a sentence encoder finds a relation near any word, but "what
    genres ..." names ``has_genre`` in so many letters)."""
    words = tokenize(question)
    in_topics: set[int] = set()
    for name in topics:
        span = name_span(words, name)
        if span is not None:
            in_topics.update(range(span[0], span[1] + 1))
    typed_at: set[int] = set()
    if not keep_typed:
        typed_at = {
            i + 1
            for i, w in enumerate(words[:-1])
            if w in _WH_DETERMINERS and all(is_function_word(x) for x in words[:i])
        }
    return {
        t: w
        for t, w in found.items()
        if not is_function_word(w.word)
        and len(w.word) >= 3
        and w.position not in in_topics
        and w.position not in typed_at
    }


def joined(found: dict[str, FocusWord], terms: Iterable[Iterable[str]]) -> dict[str, FocusWord]:
    """``found`` with each compound word also under the relation word it ends in, among
    ``terms`` (the relations' stemmed words; :func:`~kgsynth.agent.stemming.joins`), so that
    "screenwriter" counts as "writ" where ``written_by`` is listed."""
    vocab = sorted({t for doc in terms for t in doc}, key=lambda t: (-len(t), t))
    out = dict(found)
    for key, word in found.items():
        term = next((t for t in vocab if t != key and joins(key, t)), None)
        if term is not None and term not in out:
            out[term] = word
    return out


def focus_weights(
    question: str, anchor: str | None, followed: Sequence[str], round_trip: Collection[str] = ()
) -> dict[str, float]:
    """:func:`focus_words`' weights alone."""
    found = focus_words(question, anchor, followed, round_trip=round_trip)
    return {term: w.weight for term, w in found.items()}


def rank_relations_focused(
    question: str,
    relations: Sequence[Relation],
    anchor: str | None,
    followed: Sequence[str],
    used: Sequence[str] = (),
    round_trip: Collection[str] = (),
) -> list[tuple[Relation, tuple[str, ...]]]:
    """Relations sorted by BM25 over :func:`focus_words`, each word's score times its weight
    (stable on ties), each with the question's unused words it matches (words of four letters
    or more that are not function words; in question order). The relation a question names
    nearest its topic comes first, and after a hop the one it names next; a list where no
    relation matches a word shows the agent that the question asks for nothing more.

    The idf is Lucene's, ln(1 + (N - n + 0.5) / (n + 0.5)), which stays positive where a word
    is in half the relations or more (an entity with two relations)."""
    docs = [ranking_terms(r.name) for r in relations]
    found = joined(focus_words(question, anchor, followed, used, round_trip), docs)
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
