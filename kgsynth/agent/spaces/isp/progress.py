"""ISP-KGR's distance-guided progress reward, step by step as the paper's Algorithm 2 (App. F.9)
computes it, with the aggregation rules of App. F.8.

Input: a finished :class:`~kgsynth.agent.loop.Episode`, its :class:`Gold` and a
:class:`~kgsynth.agent.rewards.distance.GraphDistance` over the KG. Output: one value per
assistant turn (:func:`previous_step_progress`), what ``--reward distance`` gives each step when
the distance's ``progress`` rule is ``previous`` (the paper's; ``best`` is kgsynth's earlier
best-so-far rule, :func:`kgsynth.agent.rewards.distance.best_so_far_progress`).

The rule (ISP-KGR §4.3.2 and Alg. 2). The episode keeps a map of *known* nodes to their hop
distance to the answers: at the start the question's topic entities; after every query that
ran, each entity it returned (at the query's distance). It also keeps ``d_prev``, the distance
of the step before (unset at the start). A step's operations are read in order:

- ``<node>e``: 0 when ``e`` is known (its distance becomes the current one), else -1 (the
  current distance unset);
- ``<SPARQL>q``: -1 when the query fails, returns nothing, or repeats a query of this episode;
  else ``d_post``, the distance of what it returned, and +1 when ``d_post < d_prev`` (or
  ``d_prev`` is unset and ``d_post`` is known), 0 otherwise;
- after an operation that did not score -1, ``d_prev`` becomes its distance: the comparison is
  always with the step before, never with the best so far.

A step scores -1 when any of its operations does (or the step broke the format, its tool
failed, or it held no executable action), else +1 when one of its queries made progress,
else 0; an answer step scores 0. A
tool set without ``<node>``/``<SPARQL>`` operations (one call per turn) reads each call as a
query.

Aggregation questions (App. F.8), read from the gold SPARQL (``Gold.sparql``):

- a COUNT question's distances are to the entities the gold query counts (the gold query run
  with its COUNT removed), and an agent's COUNT query is scored by the entities its own query
  returns with the COUNT removed;
- a superlative question (the gold query takes a MAX/MIN or orders and keeps the first rows):
  a result that holds every gold answer and other entities besides (the candidates, the
  constraint not yet applied) is one hop away (``d_post = 1``); exactly the answers is 0.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from kgsynth.agent.protocol import NODE, OPERATION_RE, SPARQL
from kgsynth.metrics import answer_set, normalize_answer

if TYPE_CHECKING:
    from kgsynth.agent.loop import Episode
    from kgsynth.agent.rewards.components import Gold

log = logging.getLogger(__name__)


class GraphDistance(Protocol):
    """What the progress rule needs of :class:`kgsynth.agent.rewards.distance.GraphDistance`
    (which calls this module): the KG, and hops between two sets of names."""

    graph: Any

    def distance(self, names: Sequence[str], answers: Any) -> int | None: ...


# SELECT (COUNT(DISTINCT ?x) AS ?n): the counted variable, or * for COUNT(*)
_COUNT_RE = re.compile(
    r"\(\s*COUNT\s*\(\s*(?:DISTINCT\s+)?(\?\w+|\*)\s*\)\s*AS\s+\?\w+\s*\)", re.IGNORECASE
)
_SUPERLATIVE_RE = re.compile(r"\b(MAX|MIN)\s*\(|ORDER\s+BY\b[\s\S]*\bLIMIT\s+\d+", re.IGNORECASE)
QUERY_TIMEOUT_S = 10.0
"""Bound on a query the reward runs itself (a COUNT query without its COUNT)."""


def is_count_query(query: str | None) -> bool:
    return bool(query) and _COUNT_RE.search(query or "") is not None


def is_superlative_query(query: str | None) -> bool:
    return bool(query) and _SUPERLATIVE_RE.search(query or "") is not None


def strip_count(query: str) -> str:
    """``query`` with its COUNT aggregate replaced by the counted variable (App. F.8):
    ``SELECT (COUNT(DISTINCT ?a) AS ?n) WHERE …`` -> ``SELECT DISTINCT ?a WHERE …``."""
    m = _COUNT_RE.search(query)
    if m is None:
        raise ValueError("the query holds no COUNT(...) AS ?var aggregate")
    var = m.group(1)
    head = query[: m.start()]
    head = re.sub(
        r"\bSELECT\s+(DISTINCT\s+)?$", "SELECT DISTINCT ", head.rstrip() + " ", flags=re.I
    )
    return head + var + query[m.end() :]


def entity_names(distance: GraphDistance, query: str) -> list[str] | None:
    """The names of the entities ``query`` returns (an IRI by its label, a literal by its
    value); None when it fails."""
    graph = distance.graph
    try:
        rows = graph.kg.select(query, timeout=QUERY_TIMEOUT_S)
    except Exception as exc:  # a failed query scores as one that returned nothing
        log.debug("progress reward: query failed (%s)", exc)
        return None
    names: dict[str, None] = {}
    for row in rows:
        for term in row.values():
            name = graph.label(term.value) if term.kind == "iri" else term.value
            if name:
                names.setdefault(name, None)
    return list(names)


class Targets:
    """What a question's distances are measured to (see the module doc)."""

    def __init__(self, gold: Gold, distance: GraphDistance) -> None:
        self.answers: tuple[str, ...] = tuple(gold.answers)
        self.count = is_count_query(gold.sparql)
        self.superlative = not self.count and is_superlative_query(gold.sparql)
        if self.count and gold.sparql:
            counted = entity_names(distance, strip_count(gold.sparql))
            self.answers = tuple(counted) if counted else self.answers
        self.keys = answer_set(self.answers)

    def distance(self, distance: GraphDistance, names: Sequence[str]) -> int | None:
        d = distance.distance(names, self.answers) if names else None
        if d == 0 and self.superlative:
            found = answer_set(names)
            if self.keys <= found and found - self.keys:
                return 1  # the candidates, the constraint not yet applied
        return d


def _closer(d: int | None, before: int | None) -> bool:
    return d is not None and (before is None or d < before)


def _subject(turn: Any) -> str | None:
    return turn.args[0] if turn.args and isinstance(turn.args[0], str) else None


def _operations(turn: Any) -> list[tuple[str, str]]:
    """A turn's operations as (tag, text). A tool set with one call per turn: a call that
    returned no entity but its own subject (a relation listing) reads as exploring that
    subject, any other call as a query."""
    ops = [(m.group(1), m.group(2).strip()) for m in OPERATION_RE.finditer(turn.query or "")]
    if ops:
        return ops
    subject = _subject(turn)
    if subject is not None and all(
        normalize_answer(e) == normalize_answer(subject) for e in turn.entities
    ):
        return [(NODE, subject)]
    return [(SPARQL, turn.query or "")]


class _Walk:
    """The state Alg. 2 carries along one episode."""

    def __init__(self, gold: Gold, episode: Episode, distance: GraphDistance) -> None:
        self.distance = distance
        self.targets = Targets(gold, distance)
        topics = list(gold.topic_names) or list(episode.task.topic_names)
        self.known: dict[str, int | None] = {
            normalize_answer(t): self.targets.distance(distance, [t]) for t in topics
        }
        self.before: int | None = None  # d_prev: unset until a node or query sets it
        self.seen: set[str] = set()

    def node(self, name: str) -> float:
        key = normalize_answer(name)
        if key not in self.known:
            return -1.0
        self.before = self.known[key]
        return 0.0

    def query(self, text: str, returned: Iterable[str]) -> float:
        key = " ".join(text.split()).casefold()
        if key in self.seen:
            return -1.0
        self.seen.add(key)
        names = list(returned)
        if self.targets.count and is_count_query(text):
            names = entity_names(self.distance, strip_count(text)) or []
        if not names:
            return -1.0
        d = self.targets.distance(self.distance, names)
        for n in names:
            self.known.setdefault(normalize_answer(n), d)
        value = 1.0 if _closer(d, self.before) else 0.0
        self.before = d
        return value

    def step(self, turn: Any) -> float:
        ops = _operations(turn)
        explored = {normalize_answer(text) for tag, text in ops if tag == NODE}
        if not OPERATION_RE.search(turn.query or "") and _subject(turn) is not None:
            explored.add(normalize_answer(_subject(turn) or ""))  # the call's own subject
        returned = [e for e in turn.entities if normalize_answer(e) not in explored]
        values = []
        for tag, text in ops:
            values.append(self.node(text) if tag == NODE else self.query(text, returned))
        if min(values) < 0:
            return -1.0
        return 1.0 if max(values) > 0 else 0.0


def previous_step_progress(episode: Episode, gold: Gold, distance: GraphDistance) -> list[float]:
    """ISP-KGR's per-step progress (Alg. 2, App. F.8; see the module doc): one value per
    assistant turn."""
    from kgsynth.agent.rewards.components import _is_query_turn, assistant_turns

    walk = _Walk(gold, episode, distance)
    out: list[float] = []
    for t in assistant_turns(episode):
        if t.query is None:
            # an answer scores 0; a step with no executable action is an error (App. F.2, F.7)
            out.append(0.0 if t.action == "answer" else -1.0)
        elif not _is_query_turn(t) or t.tool_error is not None or t.format_error is not None:
            out.append(-1.0)
        else:
            out.append(walk.step(t))
    return out


__all__ = [
    "Targets",
    "entity_names",
    "is_count_query",
    "is_superlative_query",
    "previous_step_progress",
    "strip_count",
]
