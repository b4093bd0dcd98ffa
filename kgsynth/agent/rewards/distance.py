"""ISP's progress reward: hop distances to the gold answers by a bounded search over the KG
(:class:`GraphDistance`), and the per-step progress they give (:func:`distance_progress`).

Two rules, the distance's ``progress`` (``--progress-rule``): ``previous``, ISP-KGR's own
(Alg. 2, App. F.8: each step against the step before, in
:mod:`kgsynth.agent.spaces.isp.progress`), and ``best``, kgsynth's earlier rule (each query
against the best distance reached so far, :func:`best_so_far_progress`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kgsynth.agent.loop import Episode
from kgsynth.agent.rewards.components import (
    Gold,
    _is_query_turn,
    _query_key,
    _returned_names,
    assistant_turns,
)
from kgsynth.core.errors import ConfigError
from kgsynth.kg.graph import LRU, KGGraph
from kgsynth.metrics import answer_set, normalize_answer

PROGRESS_RULES = ("previous", "best")
"""How a step's progress is judged: against the step before (ISP-KGR Alg. 2) or against the
best distance reached so far (kgsynth's earlier rule)."""


class GraphDistance:
    """Hop distances to a gold answer set by bounded breadth-first search over the KG.

    The search starts at the gold answers (names resolved to entities through the graph),
    follows relations in both directions, stops at ``max_depth`` hops or after ``max_nodes``
    entities, and is cached per gold set. Literal values are reached but not expanded. A gold
    answer that resolves to no entity (a literal value) still matches by name at distance 0.
    """

    def __init__(
        self,
        graph: KGGraph,
        max_depth: int = 3,
        *,
        max_nodes: int = 100_000,
        answers: Iterable[str] | None = None,
        cache_size: int = 4_096,
        progress: str = "best",
    ) -> None:
        if max_depth < 0:
            raise ConfigError(f"max_depth must be >= 0, got {max_depth}")
        if progress not in PROGRESS_RULES:
            raise ConfigError(
                f"progress rule must be one of {', '.join(PROGRESS_RULES)} (got {progress!r})"
            )
        self.progress = progress
        self.graph = graph
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.answers = tuple(answers) if answers is not None else None
        self._fields = LRU(cache_size)

    def with_answers(self, answers: Iterable[str]) -> GraphDistance:
        """A view bound to one gold set, sharing this instance's cache."""
        view = GraphDistance(
            self.graph,
            self.max_depth,
            max_nodes=self.max_nodes,
            answers=answers,
            progress=self.progress,
        )
        view._fields = self._fields
        return view

    def field(self, answers: Iterable[str]) -> dict[str, int]:
        """Entity IRI -> hops to the nearest answer, for every entity within ``max_depth``."""
        names = tuple(sorted(set(answers)))
        return self._fields.get_or_compute(names, lambda: self._search(names))

    def _search(self, answers: tuple[str, ...]) -> dict[str, int]:
        dist: dict[str, int] = {}
        for name in answers:
            resolution = self.graph.resolve(name)
            if resolution is not None:
                dist.setdefault(resolution.entity.iri, 0)
        frontier = list(dist)
        for depth in range(1, self.max_depth + 1):
            if not frontier or len(dist) >= self.max_nodes:
                break
            self.graph.prefetch(frontier, max_targets=1_000)
            nxt: list[str] = []
            for iri in frontier:
                for rel in self.graph.relations(iri):
                    for term in self.graph.targets(iri, rel):
                        if term.kind == "iri" and term.value not in dist:
                            dist[term.value] = depth
                            nxt.append(term.value)
                if len(dist) >= self.max_nodes:
                    break
            frontier = nxt
        return dist

    def distance(self, names: Iterable[str], answers: Iterable[str] | None = None) -> int | None:
        """The fewest hops from any of ``names`` to the answer set (None: none within
        ``max_depth``, or no name resolves). ``answers`` defaults to the bound gold set."""
        if answers is None:
            if self.answers is None:
                raise ValueError("no answer set: pass answers or use with_answers()")
            answers = self.answers
        answers = tuple(answers)
        gold_keys = answer_set(answers)
        field_ = self.field(answers)
        best: int | None = None
        for name in names:
            if normalize_answer(name) in gold_keys:
                return 0
            resolution = self.graph.resolve(name)
            d = field_.get(resolution.entity.iri) if resolution is not None else None
            if d is not None and (best is None or d < best):
                best = d
        return best


def distance_progress(
    episode: Episode, gold: Gold, distance: GraphDistance | None = None
) -> list[float]:
    """ISP's per-step progress, one value per assistant turn, by the distance's ``progress``
    rule (see the module doc)."""
    if distance is None:
        raise ConfigError("the distance reward needs a GraphDistance over the KG (distance=...)")
    if distance.progress == "previous":
        from kgsynth.agent.spaces.isp.progress import previous_step_progress

        return previous_step_progress(episode, gold, distance)
    return best_so_far_progress(episode, gold, distance)


def best_so_far_progress(episode: Episode, gold: Gold, distance: GraphDistance) -> list[float]:
    """kgsynth's earlier progress rule (``--progress-rule best``): on a query the environment
    ran, -1 for a tool or format error or a repeated query, +1 when the entities the
    environment returned (the call's own subject excluded) come closer to the gold answers than
    any step before, else 0; 0.0 on answer turns and unrun queries."""
    topics = list(gold.topic_names) or list(episode.task.topic_names)
    best = distance.distance(topics, gold.answers) if topics else None
    seen: set[tuple[Any, ...]] = set()
    out: list[float] = []
    for t in assistant_turns(episode):
        if not _is_query_turn(t):
            out.append(0.0)
            continue
        key = _query_key(t)
        repeated = key in seen
        seen.add(key)
        if t.tool_error is not None or t.format_error is not None or repeated:
            out.append(-1.0)
            continue
        found = _returned_names(t)
        d = distance.distance(found, gold.answers) if found else None
        if d is not None and (best is None or d < best):
            best = d
            out.append(1.0)
        else:
            out.append(0.0)
    return out


def _mean_over_queries(episode: Episode, steps: Sequence[float]) -> float:
    """The mean of per-turn values over the queries the environment ran (0.0 with none)."""
    values = [v for v, t in zip(steps, assistant_turns(episode), strict=True) if _is_query_turn(t)]
    return sum(values) / len(values) if values else 0.0


def distance_reward(episode: Episode, gold: Gold, distance: GraphDistance | None = None) -> float:
    """ISP progress as one number (logged; the trajectory-level fallback): the mean of
    :func:`distance_progress` over the queries the environment ran."""
    return _mean_over_queries(episode, distance_progress(episode, gold, distance))
