"""The tool environment's strategies: what the KG tools do beyond the paper's tool set, each a
named strategy with its own episode state, chosen by the agent config.

| setting | strategies | module |
|---|---|---|
| ``relation_ranking`` | ``bm25``, ``hybrid``, ``focus`` (with ``first_hop_fallback``, ``later_hop_fallback`` and ``way_back_marks``) | :mod:`.ranking`, :mod:`.focus`, :mod:`.first_hop`, :mod:`.next_hop` |
| ``rerank`` | ``none``, ``llm`` | :mod:`.ranking` |
| ``entity_matching`` | ``exact``, ``near`` | :mod:`.entities` |
| ``conjunction_hints`` | off, on | :mod:`.conjunctions` |

The tool sets (:mod:`kgsynth.agent.tools`, :mod:`kgsynth.agent.toolsets`) never import this
package: the :class:`~kgsynth.agent.tools.ToolEnvironment` that runs them builds one
:class:`EpisodeStrategies` per episode (:func:`episode_strategies`) and calls its parts at
fixed points (an entity name read, a relation list ranked, a relation followed, triples
listed, an observation shown). A new strategy is a class with those methods and a
``snapshot``/``restore`` pair for its state (tree rollouts keep each branch's), and a name in
the table that builds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kgsynth.agent.strategies.conjunctions import ConjunctionHints, NoHints
from kgsynth.agent.strategies.entities import ENTITY_MATCHINGS, ExactNames
from kgsynth.agent.strategies.next_hop import Reach
from kgsynth.agent.strategies.ranking import (
    Bm25Ranking,
    Encoder,
    FocusRanking,
    LLMReranked,
    RelationRanking,
    Reranker,
)


@dataclass
class EpisodeStrategies:
    """One episode's strategies and their state."""

    ranking: RelationRanking
    entities: ExactNames
    hints: NoHints
    _start: tuple = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self._start = self._state()

    def _state(self) -> tuple:
        return (self.ranking.snapshot(), self.entities.snapshot(), self.hints.snapshot())

    def snapshot(self) -> tuple | None:
        """The strategies' state, None where it is still the episode's start."""
        state = self._state()
        return None if state == self._start else state

    def restore(self, state: tuple | None) -> None:
        """Go back to a :meth:`snapshot` (None: the episode's start)."""
        ranking, entities, hints = self._start if state is None else state
        self.ranking.restore(ranking)
        self.entities.restore(entities)
        self.hints.restore(hints)


def episode_strategies(
    config: Any,
    topics: Sequence[str],
    encoder: Encoder,
    reranker: Reranker | None = None,
    reach: Reach | None = None,
) -> EpisodeStrategies:
    """The strategies ``config`` (an AgentConfig) names, for one episode: ``topics`` are the
    question's topic entities, ``encoder`` loads the sentence encoder on first use,
    ``reranker`` reorders lists where ``rerank="llm"``, ``reach`` reads the KG for
    ``way_back_marks``."""
    ranking: RelationRanking
    if config.relation_ranking == "focus":
        ranking = FocusRanking(
            encoder,
            topics,
            first_hop=config.first_hop_fallback == "dense",
            later_hop=config.later_hop_fallback == "dense",
            round_trip=frozenset(config.round_trip_words or ()),
            reach=reach if config.way_back_marks else None,
        )
    else:
        ranking = Bm25Ranking(encoder if config.relation_ranking == "hybrid" else None)
    if config.rerank == "llm" and reranker is not None:
        ranking = LLMReranked(ranking, reranker)
    hints = ConjunctionHints(topics=topics) if config.conjunction_hints else NoHints()
    matching = ENTITY_MATCHINGS[config.entity_matching](topics=tuple(topics))
    return EpisodeStrategies(ranking, matching, hints)


__all__ = ["EpisodeStrategies", "episode_strategies"]
