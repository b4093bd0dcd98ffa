"""The focus ranking's first-hop fallback (``first_hop_fallback="dense"``).

The focus ranking marks each relation line with the question words it matches
(:func:`~kgsynth.agent.strategies.focus.rank_relations_focused`), and a list with no mark tells the agent
that the question asks for nothing more: after the last hop it answers. At the first hop that
reading is always wrong (the topic entity is not its own answer), yet it is what an agent
trained on the marks does when the question names the relation in words the KG does not use:
"what does X appear in" shares no word with ``starred_actors``, and the agent answers X. On
2026-11-26 that was 31 of the 34 one-hop dev questions `make all`'s stage-1 agent got wrong
(run R; 1 of the 32 with an unmarked first list was right, 65 of the 68 with a mark).

With the fallback, a first-hop list of the topic entity that would show no mark marks one
relation instead, with a question word, the way a word match is shown:

1. the best word match whose word the mark hides (a word of three letters: "act" meets
   ``starred_actors``), else
2. the relation whose question, as the template backend words it ("What is the genre of X?",
   :func:`~kgsynth.llm.rule_questions.path_question`), is nearest the question under the
   sentence encoder the ``hybrid`` ranking uses (:mod:`kgsynth.agent.relrank`), marked with the
   question word nearest the relation's words, and listed first.

Nothing is fitted and there is no threshold: the encoder is used as shipped, on any KG's
relation names. Later hops are left as they are, where no mark still means "answer", unless
``later_hop_fallback="dense"`` (:func:`later_hop_marks`): there a list after a hop marks the
relation nearest a question word nothing has used yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from kgsynth.agent.strategies.focus import (
    FocusWord,
    content_words,
    focus_words,
    is_function_word,
    joined,
)
from kgsynth.agent.toolkit import ranking_terms
from kgsynth.kg.graph import Relation
from kgsynth.llm.relation_forms import relation_words
from kgsynth.llm.rule_questions import path_question

Ranked = list[tuple[Relation, tuple[str, ...]]]


class SentenceScorer(Protocol):
    """A sentence encoder's cosine of a text with each of several
    (:class:`kgsynth.agent.relrank.DenseRelationScorer`)."""

    def sentence_scores(self, question: str, sentences: Sequence[str]) -> Any: ...


def relation_question(entity: str, rel: Relation) -> str:
    """The template backend's canonical question for one hop along ``rel`` from ``entity``."""
    hop = {"relation": rel.name, "inverse": rel.direction == "in"}
    return path_question({"topic_names": [entity], "branches": [[hop]], "merge_at": [None]})


def first_hop_marks(
    question: str, entity: str, ranked: Ranked, encoder: SentenceScorer | None
) -> Ranked:
    """``ranked`` (the focus ranking of the relations of ``entity``, the topic the question
    names, with nothing followed yet) with one relation marked where none is; unchanged where
    one is, or where the question has no word left to mark with."""
    if not ranked or any(marks for _, marks in ranked):
        return ranked
    found = focus_words(question, entity, ())
    by_stem = {t: w for t, w in found.items() if not is_function_word(w.word)}
    matched = _word_match(ranked, by_stem)
    if matched is not None:
        return matched
    content = list(by_stem.values())
    if encoder is None or not content:
        return ranked
    asked = [relation_question(entity, rel) for rel, _ in ranked]
    cos = [float(c) for c in encoder.sentence_scores(question, asked)]
    best = max(range(len(ranked)), key=lambda i: (cos[i], -i))
    near = encoder.sentence_scores(relation_words(ranked[best][0].name), [w.word for w in content])
    word = max(range(len(content)), key=lambda i: (float(near[i]), -content[i].position))
    return _marked_first(ranked, best, (content[word].word,))


def _word_match(ranked: Ranked, words: dict[str, FocusWord]) -> Ranked | None:
    """``ranked`` with the first relation (in BM25 order: the best match first) whose words
    meet one of ``words`` (stem -> word) marked with them and listed first (a match the
    focus ranking's mark hid: a three-letter word); None where no relation meets one."""
    words = joined(words, [ranking_terms(rel.name) for rel, _ in ranked])
    for i, (rel, _) in enumerate(ranked):
        shared = [words[t] for t in set(ranking_terms(rel.name)) & words.keys()]
        if shared:
            return _marked_first(ranked, i, _shown(shared))
    return None


def _marked_first(ranked: Ranked, i: int, words: tuple[str, ...]) -> Ranked:
    """``ranked`` with its ``i``-th relation marked with ``words`` and moved first."""
    return [(ranked[i][0], words), *ranked[:i], *ranked[i + 1 :]]


def _shown(words: Iterable[FocusWord]) -> tuple[str, ...]:
    """The words as the question writes them, in question order."""
    return tuple(w.word for w in sorted(words, key=lambda w: w.position))


def later_hop_marks(
    question: str,
    entity: str,
    ranked: Ranked,
    encoder: SentenceScorer | None,
    found: dict[str, FocusWord],
    topics: Sequence[str] = (),
) -> Ranked:
    """``later_hop_fallback="dense"``: ``ranked`` (the focus ranking of the relations of
    ``entity``, an entity a hop reached, ``found`` the question words the episode has not
    used) with one relation marked where none is and the question still has a content word
    nothing has used: not a function word, not a word of a topic entity's name, and not the
    noun a wh-determiner opens the question with ("which films did X direct": the films are
    the answer). "the race of X's father" follows ``parents`` for "father", and "race" is
    left: the relation whose words are nearest a left word under the sentence encoder
    (``ethnicity``) is marked with that word and listed first. Unchanged where a relation is
    marked, or no such word is left."""
    if not ranked or any(marks for _, marks in ranked):
        return ranked
    by_stem = content_words(question, found, topics)
    if not by_stem:
        return ranked
    matched = _word_match(ranked, by_stem)
    if matched is not None:
        return matched
    if encoder is None:
        return ranked
    left = list(by_stem.values())
    best, word, top = 0, 0, float("-inf")
    for i, (rel, _) in enumerate(ranked):
        near = encoder.sentence_scores(relation_words(rel.name), [w.word for w in left])
        for j, score in enumerate(near):
            if float(score) > top:
                best, word, top = i, j, float(score)
    return _marked_first(ranked, best, (left[word].word,))
