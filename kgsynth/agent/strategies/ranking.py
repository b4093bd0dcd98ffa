"""Relation ranking, a strategy of the tool environment: the order a relation list is shown in
and the question words shown beside a relation (``(X, r, ?) <- words``).

- ``bm25`` (:class:`Bm25Ranking`, GraphWalker): BM25 of the relation's words against the
  question's; no episode state.
- ``hybrid``: the same plus a sentence encoder's similarity (:mod:`kgsynth.agent.relrank`).
- ``focus`` (:class:`FocusRanking`): BM25 over the question words the episode's
  ``get_triples`` calls have not used yet, nearest the topic's name first, each relation shown
  with the words it matches (:mod:`kgsynth.agent.strategies.focus`); optionally with the
  first- and later-hop fallbacks of :mod:`kgsynth.agent.strategies.first_hop` and the
  way-back marks of :mod:`kgsynth.agent.strategies.next_hop`. Its state is the topic name it
  measures nearness from, the relations followed (and the last), the fallback words used up
  and the marks of the last list.
- ``rerank="llm"`` (:class:`LLMReranked`) wraps any of them: an LLM reorders the list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.agent.stemming import stem
from kgsynth.agent.strategies.first_hop import first_hop_marks, later_hop_marks
from kgsynth.agent.strategies.focus import (
    FocusWord,
    content_words,
    focus_words,
    rank_relations_focused,
)
from kgsynth.agent.strategies.next_hop import Reach, way_back_marks
from kgsynth.agent.toolkit import DenseScorer, name_span, rank_relations, ranking_terms, tokenize
from kgsynth.kg.graph import Entity, Relation

Ranked = list[tuple[Relation, tuple[str, ...]]]  # relations in display order, each with its marks
Encoder = Callable[[], Any]  # the sentence encoder's scorer, loaded on first call


@dataclass
class Bm25Ranking:
    """``bm25``, or ``hybrid`` where ``encoder`` is given."""

    encoder: Encoder | None = None

    @property
    def anchor(self) -> str | None:
        """The topic's name as the question writes it, where the ranking knows it."""
        return None

    def rank(self, question: str, entity: Entity, rels: Sequence[Relation]) -> Ranked:
        dense: DenseScorer | None = self.encoder() if self.encoder and question else None
        return [(r, ()) for r in rank_relations(question, rels, dense)]

    def next_words(self, question: str, rels: Sequence[Relation]) -> dict[str, FocusWord]:
        """No word accounting: nothing for the lead-on order."""
        return {}

    def follow(self, rels: Sequence[Relation]) -> None:
        """The episode followed ``rels`` (a get_triples call)."""

    def snapshot(self) -> tuple:
        return ()

    def restore(self, state: tuple) -> None:
        pass


@dataclass
class FocusRanking:
    """``focus``; ``first_hop`` and ``later_hop`` turn on the dense fallbacks."""

    encoder: Encoder
    topics: Sequence[str] = ()  # the topic entities' names (the later-hop fallback skips them)
    first_hop: bool = False
    later_hop: bool = False
    round_trip: frozenset[str] = frozenset()  # words that say the question comes back
    anchor: str | None = None  # the topic name nearness is measured from
    followed: tuple[str, ...] = ()  # the relations followed so far (their words are used up)
    used: tuple[str, ...] = ()  # fallback words used up by following the relation they marked
    marks: tuple[tuple[str, tuple[str, ...]], ...] = ()  # the last list's (relation, words)
    # way_back_marks: the relations of the entities reached along a relation (None: off)
    reach: Reach | None = None
    arrived: Relation | None = None  # the relation the last hop followed

    def rank(self, question: str, entity: Entity, rels: Sequence[Relation]) -> Ranked:
        if not question:
            return [(r, ()) for r in rels]
        named = name_span(tokenize(question), entity.name) is not None  # a topic's name
        if named:
            self.anchor = entity.name
        ranked = rank_relations_focused(
            question, rels, self.anchor, self.followed, self.used, self.round_trip
        )
        if self.first_hop and not self.followed and self.anchor == entity.name:
            ranked = first_hop_marks(question, entity.name, ranked, self.encoder())
        elif self.followed and not named and (self.later_hop or self.reach is not None):
            found = focus_words(question, self.anchor, self.followed, self.used, self.round_trip)
            if self.reach is not None:
                words = content_words(question, found, self.topics, keep_typed=True)
                ranked = way_back_marks(ranked, entity, self.arrived, words, self.reach)
            if self.later_hop:
                ranked = later_hop_marks(
                    question, entity.name, ranked, self.encoder(), found, self.topics
                )
        if self.later_hop:
            self.marks = tuple((r.name, w) for r, w in ranked if w)
        return ranked

    def next_words(self, question: str, rels: Sequence[Relation]) -> dict[str, FocusWord]:
        """The content words (:func:`~kgsynth.agent.strategies.focus.content_words`) nothing
        will have used once the episode follows ``rels``: what the next hop can be named by."""
        followed = self.followed + tuple(dict.fromkeys(r.name for r in rels))
        found = focus_words(question, self.anchor, followed, self.used, self.round_trip)
        return content_words(question, found, self.topics, keep_typed=True)

    def follow(self, rels: Sequence[Relation]) -> None:
        names = tuple(dict.fromkeys(r.name for r in rels))
        self.followed += names
        self.arrived = rels[-1] if rels else self.arrived
        # following a relation uses up a later-hop fallback mark's word on it (the first-hop
        # fallback's alone can be the next hop's word: "X's darling's ethnicity")
        if self.later_hop:
            marks = dict(self.marks)
            self.used += tuple(
                w
                for name in names
                for w in marks.get(name, ())
                if stem(w.lower()) not in ranking_terms(name)
            )

    def snapshot(self) -> tuple:
        return (self.anchor, self.followed, self.used, self.marks, self.arrived)

    def restore(self, state: tuple) -> None:
        self.anchor, self.followed, self.used, self.marks, self.arrived = state


# (question, entity name, ranked relations) -> reordered (kgsynth.agent.rerank.LLMReranker)
Reranker = Callable[[str, str, Sequence[Relation]], list[Relation]]


@dataclass
class LLMReranked:
    """``rerank="llm"`` (GraphWalker Table 8): ``inner``'s list reordered by an LLM, each
    relation keeping the words ``inner`` marked it with."""

    inner: Bm25Ranking | FocusRanking
    reranker: Reranker

    @property
    def anchor(self) -> str | None:
        return self.inner.anchor

    def rank(self, question: str, entity: Entity, rels: Sequence[Relation]) -> Ranked:
        ranked = self.inner.rank(question, entity, rels)
        marks = dict(ranked)
        return [(r, marks.get(r, ())) for r in self.reranker(question, entity.name, list(marks))]

    def next_words(self, question: str, rels: Sequence[Relation]) -> dict[str, FocusWord]:
        return self.inner.next_words(question, rels)

    def follow(self, rels: Sequence[Relation]) -> None:
        self.inner.follow(rels)

    def snapshot(self) -> tuple:
        return self.inner.snapshot()

    def restore(self, state: tuple) -> None:
        self.inner.restore(state)


RelationRanking = Bm25Ranking | FocusRanking | LLMReranked
