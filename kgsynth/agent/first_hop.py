"""The focus ranking's first-hop fallback (``first_hop_fallback="dense"``).

The focus ranking marks each relation line with the question words it matches
(:func:`~kgsynth.agent.toolkit.rank_relations_focused`), and a list with no mark tells the agent
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
relation names. Later hops are left as they are, where no mark still means "answer".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from kgsynth.agent.toolkit import FocusWord, focus_words, is_function_word, ranking_terms
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
    for i, (rel, _) in enumerate(ranked):  # in BM25 order: the best word match first
        shared = [found[t] for t in set(ranking_terms(rel.name)) & found.keys()]
        words = _shown(w for w in shared if not is_function_word(w.word))
        if words:
            return [(rel, words), *ranked[:i], *ranked[i + 1 :]]
    content = [w for w in found.values() if not is_function_word(w.word)]
    if encoder is None or not content:
        return ranked
    asked = [relation_question(entity, rel) for rel, _ in ranked]
    cos = [float(c) for c in encoder.sentence_scores(question, asked)]
    best = max(range(len(ranked)), key=lambda i: (cos[i], -i))
    near = encoder.sentence_scores(relation_words(ranked[best][0].name), [w.word for w in content])
    word = max(range(len(content)), key=lambda i: (float(near[i]), -content[i].position))
    return [(ranked[best][0], (content[word].word,)), *ranked[:best], *ranked[best + 1 :]]


def _shown(words: Iterable[FocusWord]) -> tuple[str, ...]:
    """The words as the question writes them, in question order."""
    return tuple(w.word for w in sorted(words, key=lambda w: w.position))
