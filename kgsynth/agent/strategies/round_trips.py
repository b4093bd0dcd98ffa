"""The words that say a question comes back along the relation it went out on, read from the
run's own synthesized questions (``round_trip_words``).

"The films with the same director as X" goes out from X along ``directed_by`` and back along
it to the other films: the relation is named once and followed twice. The focus ranking uses a
relation's words up when the episode follows it (:func:`~kgsynth.agent.strategies.focus.
focus_words`), so on the way back the list would show no mark and the agent would stop at the
director. Where the question has one of the round-trip words, the first relation followed
leaves its words for the second hop.

Which words those are depends on who wrote the questions (the template backend, an LLM, a
language), not on a list kept here: every synthesized question carries its walk, so the words
are those that come, in the run's own questions, almost only with walks that follow a relation
and then the same relation the other way (:func:`round_trip_words`). On the template backend's
MetaQA questions that reads "same", "together", "sharing", "share" (2,323 of 11,692 walks
come back); on PathQuestion's KBs "share", "sharing", "same". ``synthesize trajectories`` reads
them from its questions when the agent config leaves ``round_trip_words`` unset
(:func:`with_round_trip_words`), its manifest records them, and every model trained on its
trajectories carries them (:mod:`kgsynth.agent.carried`). Evaluation questions are never read.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kgsynth.agent.strategies.focus import is_function_word
from kgsynth.agent.toolkit import tokenize

log = logging.getLogger(__name__)

MIN_SHARE = 0.9  # of a word's questions, those whose walk comes back
MIN_QUESTIONS = 5  # questions a word must be in, at the least
MIN_FRACTION = 0.01  # ... and at least this fraction of the walks that come back
CHANCE = 1e-3  # the most a word's share may be explained by the walks' share that comes back


def comes_back(branches: Sequence[Sequence[Mapping[str, Any]]] | None) -> bool:
    """Whether a walk (its branches, each a list of ``{relation, inverse}`` steps) follows a
    relation and next the same relation in the other direction."""
    for steps in branches or ():
        for a, b in itertools.pairwise(steps):
            if a["relation"] == b["relation"] and bool(a["inverse"]) != bool(b["inverse"]):
                return True
    return False


def _content_words(question: str, topics: Iterable[str]) -> set[str]:
    """The question's words (lower case) that are neither function words nor a topic's name's."""
    names = {w.lower() for t in topics for w in tokenize(t)}
    words = (w.lower() for w in tokenize(question))
    return {w for w in words if w not in names and not is_function_word(w)}


def _tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), 0 < p (a word is tested only where walks come back)."""
    if p >= 1.0:
        return 1.0

    def log_pmf(i: int) -> float:
        return (
            math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
            + i * math.log(p) + (n - i) * math.log1p(-p)
        )  # fmt: skip

    return min(1.0, sum(math.exp(log_pmf(i)) for i in range(k, n + 1)))


def round_trip_words(rows: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The words of ``rows`` (synthesized questions: ``question``, ``topic_names``,
    ``branches``) that say the walk comes back (:func:`comes_back`): each in at least
    :data:`MIN_QUESTIONS` questions and :data:`MIN_FRACTION` of those whose walk comes back,
    in a walk that comes back in :data:`MIN_SHARE` of its questions or more, and so often that
    the share of all walks that come back explains it with a chance under :data:`CHANCE` (a
    one-sided binomial test: on a KG where most walks come back, a common word is in mostly
    such questions by chance). Most questions first; empty where no walk comes back."""
    return _read(rows)[0]


def _read(rows: Iterable[Mapping[str, Any]]) -> tuple[tuple[str, ...], int]:
    """:func:`round_trip_words` of ``rows``, and how many of their walks come back."""
    back: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    trips = total = 0
    for row in rows:
        total += 1
        words = _content_words(str(row.get("question") or ""), row.get("topic_names") or ())
        trip = comes_back(row.get("branches"))
        trips += trip
        seen.update(words)
        if trip:
            back.update(words)
    floor = max(MIN_QUESTIONS, MIN_FRACTION * trips)
    base = trips / max(1, total)
    kept = [
        w
        for w, n in back.items()
        if n >= floor and n >= MIN_SHARE * seen[w] and _tail(n, seen[w], base) < CHANCE
    ]
    return tuple(sorted(kept, key=lambda w: (-back[w], w))), trips


def with_round_trip_words(cfg: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
    """``cfg`` (a config nesting an ``agent``) with ``agent.round_trip_words`` read from
    ``rows`` where the focus ranking is on and the words are unset and the rows carry their
    walks; else ``cfg`` itself."""
    agent = cfg.agent
    if agent.relation_ranking != "focus" or agent.round_trip_words is not None:
        return cfg
    if not rows or any("branches" not in r for r in rows):
        return cfg
    words, trips = _read(rows)
    log.info("round-trip words from %d questions (%d come back): %s", len(rows), trips,
             ", ".join(words) or "none")  # fmt: skip
    return dataclasses.replace(cfg, agent=dataclasses.replace(agent, round_trip_words=words))


__all__ = ["comes_back", "round_trip_words", "with_round_trip_words"]
