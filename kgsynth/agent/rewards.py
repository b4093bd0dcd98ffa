"""Rewards for GRPO on the live KG: named pure functions, a weighted sum, and turn-level rewards.

Input: one finished :class:`~kgsynth.agent.loop.Episode` (a rollout) and its :class:`Gold`
(answers, question, topic entities). Output: a :class:`RewardResult` with the weighted total,
every component's raw value by name (each is logged separately) and one turn-level reward per
assistant turn. Use::

    spec = RewardSpec.parse("kbqa-r1")          # or "f1:1,format:0.1", "hit:1,retrieval:0.5"
    res = spec.score(episode, Gold(answers=["A"], topic_names=["X"]), RewardState(step=10))
    res.total, res.components, res.turn_rewards

An *assistant turn* is one :class:`~kgsynth.agent.loop.TurnRecord` without ``llm_error``. A
query turn is an assistant turn whose query the environment ran (its ``observation`` is set);
a query written at the forced final turn is not run and is no query turn.

Rewards read only what the environment produced: ``TurnRecord.observation``/``entities`` and
the typed ``tool_error`` (an :class:`~kgsynth.agent.tools.ErrorType` value). ``<information>``
that a model writes itself is stripped by the parser and never reaches those fields, so it can
earn no retrieval or progress credit. Model text is read only to take credit away (a repeated
query, the query's own argument echoed back).

Components (``REWARDS``, each ``fn(episode, gold, **params) -> float``)
--------------------------------------------------------------------------------------------
``em_strict``: 1.0 when the normalized predicted answer set equals the gold set
    (:func:`kgsynth.metrics.em_strict`), else 0.0.
``hit`` (GraphWalker's and KnowCoder-A1's "EM"): 1.0 when some predicted answer is gold
    (:func:`kgsynth.metrics.hit`). Plain ``em`` is refused as ambiguous.
``f1`` (KBQA-R1; Interactive Semantic Parsing): set F1 of prediction against gold
    (:func:`kgsynth.metrics.f1`).
``fbeta`` (KnowCoder-A1 §4.3.2): set F-beta with a curriculum: beta 0.5 (precision-leaning)
    until the switch, beta 1.0 from then on. The switch comes at step ``fbeta_switch_step``, or
    from the step after the running mean of the *outcome* reward (``RewardState.outcome_mean``)
    reached ``fbeta_switch_reward`` (an unset threshold never triggers; by default only the
    level 0.5 is set; a level above 1 turns it off). It is monotone: once switched
    (``RewardState.fbeta_switched_at``), a mean that falls back does not switch back
    (:meth:`RewardSpec.advance`). The beta used is reported as ``RewardResult.fbeta_beta``.
``format``: 1.0 when the episode ended with a parsed ``<answer>`` and no assistant turn broke
    the protocol (``format_error`` is None on every one; an LLM error also leaves it 0), else
    0.0. KBQA-R1 variant (``gate_format``): the weighted format reward is added to the total
    only when the outcome reward is > 0 (its raw value is still logged).
``retrieval`` (KG-R1 global retrieval reward): 1.0 when some gold answer (normalized) is among
    the entities that a successful environment observation returned, else 0.0. The query's own
    subject (the entity the model named as the call's first argument) does not count: the
    environment echoing a guessed name back is not retrieval.
``turn`` (KG-R1 turn-level, see ``TURN_REWARDS``): the mean of the per-turn rewards below
    (0.0 for an episode with no assistant turn).
``distance`` (Interactive Semantic Parsing, progress per step; turn-level, see below): for
    each query the environment ran, +1 when the smallest graph distance (hops,
    :class:`GraphDistance`) from the entities the environment returned (the call's own subject
    excluded) to the gold answer set is smaller than the best so far, 0 when not, -1 for a tool
    or format error or a repeated query. "Best so far" starts at the topic entities' distance;
    a distance beyond the search bound is "unknown" and beats nothing, while any known distance
    beats an unknown best. Its component value is the mean over the queries run (in [-1, 1];
    0.0 with none). Per-turn values: :func:`distance_progress`.

Turn-level rewards (``TURN_REWARDS``, ``fn(episode, gold) -> list[float]``, one per assistant turn)
------------------------------------------------------------------------------------------
``turn`` (KG-R1): ``0.5 * format_ok + 0.5 * action_ok`` where ``format_ok`` is 1 when the turn
    has no ``format_error``; ``action_ok`` is 1 for a query the environment ran without a tool
    error, or for a parsed answer, else 0. A query repeating an earlier query of the episode
    (same tool, same arguments up to case, whitespace and relation-list order; the raw text
    when the call did not parse) earns 0 for the whole turn, valid or not.
``distance`` (ISP): the per-step progress above.
KG-R1's turn-wise returns and their pooled group advantage: :func:`turn_returns`,
:func:`pooled_turn_advantages`.

The weighted sum
----------------
``total = sum(weight * value)`` over the configured components, the format term left out under
``gate_format`` when the outcome reward (the first of ``em_strict``/``hit``/``f1``/``fbeta``
configured) is <= 0, then ``min(total, cap)`` when a cap is set; ``trajectory_total`` is the
same sum without the turn-level components. ``turn_rewards[i]`` is the weighted sum of the
turn-level components at assistant turn i (zeros when none is configured).

Presets (:data:`PRESETS`; the default is GraphWalker's, its EM being ``hit``)
--------------------------------------------------------------
``graphwalker`` = ``hit:1``; ``kbqa-r1`` = ``f1:1,format:0.1`` with format gating;
``knowcoder-a1`` = ``fbeta:1,format:0.1`` with the total capped at 1;
``kg-r1`` = ``f1:1,retrieval:1,turn:1`` (KG-R1 v2 App. D: the turn reward is 0.5 format +
0.5 validity); ``isp`` = ``f1:0.6,distance:0.3,format:0.1`` (the authors' reward_fn.py). The
whole RL recipe of each paper (advantage, KL, clip, group, turns, lr, warm-up) is
:mod:`kgsynth.train.presets` (``kgsynth train rl --preset``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kgsynth.agent.loop import Episode, TurnRecord
from kgsynth.errors import ConfigError
from kgsynth.kg.graph import LRU, KGGraph
from kgsynth.metrics import (
    answer_set,
    check_metric_name,
    em_strict,
    f1,
    f_beta,
    hit,
    normalize_answer,
)

FBETA_EARLY = 0.5
FBETA_LATE = 1.0
TURN_FORMAT_WEIGHT = 0.5
TURN_ACTION_WEIGHT = 0.5
ANSWER_COMPONENTS = ("em_strict", "hit", "f1", "fbeta")


@dataclass(frozen=True)
class Gold:
    """What a rollout is scored against."""

    answers: Sequence[str]
    question: str = ""
    topic_names: Sequence[str] = ()


OUTCOME_MEAN_DECAY = 0.9
"""The running mean of the outcome reward: ``m <- 0.9 m + 0.1 * (the step's mean outcome)``."""


@dataclass(frozen=True)
class RewardState:
    """Training progress that curricula read; :meth:`RewardSpec.advance` makes the next one
    after each step.

    ``outcome_mean`` is the running mean of the outcome reward (``RewardResult.outcome``, never
    the weighted total), None before the first step. ``fbeta_switched_at`` is the step from
    which the F-beta curriculum uses beta 1; once set it stays set (the switch is monotone).
    """

    step: int = 0
    outcome_mean: float | None = None
    fbeta_switched_at: int | None = None


@dataclass(frozen=True)
class RewardResult:
    """One rollout's rewards.

    ``total``: the weighted sum of every component (turn-level ones by their mean), the one
    number a trajectory-level advantage uses. ``trajectory_total``: the same without the
    turn-level components, KG-R1's global ``R`` in ``G_t = r_t + lam * R``. ``turn_rewards``:
    the weighted turn-level components at each assistant turn (``r_t``). ``outcome``: the raw
    answer reward (the first of em_strict/hit/f1/fbeta configured, 0.0 when none is);
    ``fbeta_beta`` the beta ``fbeta`` used (None without it)."""

    total: float
    components: dict[str, float]
    turn_rewards: list[float]
    outcome: float = 0.0
    fbeta_beta: float | None = None
    trajectory_total: float = 0.0


# --- helpers ---------------------------------------------------------------------------------


def assistant_turns(episode: Episode) -> list[TurnRecord]:
    """The turns the policy produced text for (an LLM error is no assistant turn)."""
    return [t for t in episode.turns if not t.llm_error]


def _is_query_turn(turn: TurnRecord) -> bool:
    return turn.query is not None and turn.observation is not None


def _norm_arg(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    if isinstance(value, (list, tuple)):
        # relation lists: the order of the relations does not change the call
        return tuple(sorted((_norm_arg(v) for v in value), key=repr))
    return value


def _query_key(turn: TurnRecord) -> tuple[Any, ...]:
    if turn.tool:
        return (turn.tool, tuple(_norm_arg(a) for a in turn.args))
    return ("", " ".join((turn.query or "").split()))


def _returned_names(turn: TurnRecord) -> list[str]:
    """Entity names a successful observation returned, the call's own subject excluded: the
    environment echoing a name the model wrote (a guess) is no evidence of anything."""
    if not _is_query_turn(turn) or turn.tool_error is not None:
        return []
    subject = (
        normalize_answer(turn.args[0]) if turn.args and isinstance(turn.args[0], str) else None
    )
    return [e for e in turn.entities if normalize_answer(e) != subject]


def _retrieved(turn: TurnRecord) -> set[str]:
    """Normalized names a successful observation returned, the call's own subject excluded."""
    return answer_set(_returned_names(turn))


# --- outcome components ----------------------------------------------------------------------


def em_strict_reward(episode: Episode, gold: Gold) -> float:
    """The predicted answer set equals the gold set."""
    return em_strict(episode.predicted_answers, gold.answers)


def hit_reward(episode: Episode, gold: Gold) -> float:
    """GraphWalker's EM: some predicted answer is gold."""
    return hit(episode.predicted_answers, gold.answers)


def f1_reward(episode: Episode, gold: Gold) -> float:
    """KBQA-R1 / ISP: set F1 of the predicted answers."""
    return f1(episode.predicted_answers, gold.answers)


def fbeta_reward(episode: Episode, gold: Gold, beta: float = FBETA_LATE) -> float:
    """KnowCoder-A1: set F-beta (the curriculum picks ``beta``, see :meth:`RewardSpec.fbeta_beta`)."""
    return f_beta(episode.predicted_answers, gold.answers, beta)


def format_reward(episode: Episode, gold: Gold) -> float:
    """1.0 when the episode answered and every assistant turn was well-formed."""
    turns = assistant_turns(episode)
    if not episode.answered or len(turns) != len(episode.turns):
        return 0.0
    return float(all(t.format_error is None for t in turns))


def retrieval_reward(episode: Episode, gold: Gold) -> float:
    """KG-R1 global retrieval reward: a gold answer was returned by the environment."""
    wanted = answer_set(gold.answers)
    return float(any(_retrieved(t) & wanted for t in assistant_turns(episode)))


def turn_rewards_kgr1(episode: Episode, gold: Gold) -> list[float]:
    """KG-R1 per-turn reward: format and action validity; a repeated query earns 0."""
    seen: set[tuple[Any, ...]] = set()
    out: list[float] = []
    for t in assistant_turns(episode):
        format_ok = float(t.format_error is None)
        if t.query is not None:
            key = _query_key(t)
            if key in seen:
                out.append(0.0)
                continue
            seen.add(key)
            action_ok = float(_is_query_turn(t) and t.tool_error is None)
        else:
            action_ok = float(t.action == "answer")
        out.append(TURN_FORMAT_WEIGHT * format_ok + TURN_ACTION_WEIGHT * action_ok)
    return out


def turn_reward(episode: Episode, gold: Gold) -> float:
    """The mean KG-R1 turn reward over assistant turns (0.0 with none)."""
    values = turn_rewards_kgr1(episode, gold)
    return sum(values) / len(values) if values else 0.0


# --- graph distance --------------------------------------------------------------------------


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
    ) -> None:
        if max_depth < 0:
            raise ConfigError(f"max_depth must be >= 0, got {max_depth}")
        self.graph = graph
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.answers = tuple(answers) if answers is not None else None
        self._fields = LRU(cache_size)

    def with_answers(self, answers: Iterable[str]) -> GraphDistance:
        """A view bound to one gold set, sharing this instance's cache."""
        view = GraphDistance(self.graph, self.max_depth, max_nodes=self.max_nodes, answers=answers)
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
    """ISP's per-step progress, one value per assistant turn (see the module doc): on a query
    the environment ran, -1 for a tool or format error or a repeated query, +1 when the
    entities the environment returned (the call's own subject excluded) come closer to the
    gold answers than any step before, else 0; 0.0 on answer turns and unrun queries."""
    if distance is None:
        raise ConfigError("the distance reward needs a GraphDistance over the KG (distance=...)")
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


REWARDS: dict[str, Callable[..., float]] = {
    "em_strict": em_strict_reward,
    "hit": hit_reward,
    "f1": f1_reward,
    "fbeta": fbeta_reward,
    "format": format_reward,
    "retrieval": retrieval_reward,
    "turn": turn_reward,
    "distance": distance_reward,
}
TURN_REWARDS: dict[str, Callable[..., list[float]]] = {
    "turn": turn_rewards_kgr1,
    "distance": distance_progress,
}
"""The turn-level components: one value per assistant turn (their component value is the mean)."""


def turn_returns(
    turn_rewards: Sequence[float], trajectory_reward: float, lam: float = 1.0
) -> list[float]:
    """KG-R1's turn-wise return of one rollout: ``G_t = r_t + lam * R`` for each assistant turn
    t, with ``r_t`` the turn's reward and ``R`` the rollout's trajectory-level reward."""
    return [r + lam * trajectory_reward for r in turn_rewards]


def pooled_turn_advantages(
    returns_per_rollout: Sequence[Sequence[float]], *, scale: bool = True, eps: float = 1e-6
) -> list[list[float]]:
    """Advantages of the turn returns of one group with one baseline pooled over every turn of
    every rollout (KG-R1; ISP's step-level GRPO): ``A = G - mean(all G)``, divided by the
    population std of all G (+ ``eps``) when ``scale``. A rollout without turns gets []."""
    pool = [g for returns in returns_per_rollout for g in returns]
    if not pool:
        return [[] for _ in returns_per_rollout]
    mean = sum(pool) / len(pool)
    std = math.sqrt(sum((g - mean) ** 2 for g in pool) / len(pool))
    div = std + eps if scale else 1.0
    return [[(g - mean) / div for g in returns] for returns in returns_per_rollout]


# --- the weighted sum ------------------------------------------------------------------------

PRESETS: dict[str, dict[str, Any]] = {
    "graphwalker": {"weights": (("hit", 1.0),)},
    "kbqa-r1": {"weights": (("f1", 1.0), ("format", 0.1)), "gate_format": True},
    "knowcoder-a1": {"weights": (("fbeta", 1.0), ("format", 0.1)), "cap": 1.0},
    # KG-R1 v2 App. D Table 8: global 1.0 F1 + 1.0 retrieval; turn = 0.5 format + 0.5 validity
    "kg-r1": {"weights": (("f1", 1.0), ("retrieval", 1.0), ("turn", 1.0))},
    # ISP-KGR's reward_fn.py: 0.1 format + 0.3 progress + 0.6 outcome F1
    "isp": {"weights": (("f1", 0.6), ("distance", 0.3), ("format", 0.1))},
}
DEFAULT_SPEC = "graphwalker"


def _valid_names() -> str:
    return f"components {', '.join(REWARDS)}; presets {', '.join(PRESETS)}"


@dataclass(frozen=True)
class RewardSpec:
    """Which rewards, with what weights, and the options of the presets (see module doc)."""

    weights: tuple[tuple[str, float], ...] = (("hit", 1.0),)
    gate_format: bool = False
    cap: float | None = None
    fbeta_switch_step: int | None = None
    fbeta_switch_reward: float | None = 0.5
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.weights:
            raise ConfigError(f"reward spec: no component given; valid: {_valid_names()}")
        names = [n for n, _ in self.weights]
        for n, w in self.weights:
            if n not in REWARDS:
                raise ConfigError(f"reward spec: unknown component {n!r}; valid: {_valid_names()}")
            if not math.isfinite(w):
                raise ConfigError(f"reward spec: weight of {n!r} must be a finite number, got {w}")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"reward spec: component {', '.join(dupes)} given more than once")
        if self.gate_format and not any(n in ANSWER_COMPONENTS for n in names):
            raise ConfigError(
                "reward spec: gate_format needs an answer component (em, f1 or fbeta) to gate on"
            )
        if self.cap is not None and not (math.isfinite(self.cap) and self.cap > 0):
            raise ConfigError(f"reward spec: cap must be a number > 0, got {self.cap}")
        if self.fbeta_switch_step is not None and self.fbeta_switch_step < 0:
            raise ConfigError(
                f"reward spec: fbeta_switch_step must be >= 0, got {self.fbeta_switch_step}"
            )
        r = self.fbeta_switch_reward
        if r is not None and not r >= 0.0:
            raise ConfigError(f"reward spec: fbeta_switch_reward must be >= 0, got {r}")

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        gate_format: bool | None = None,
        cap: float | None = None,
        fbeta_switch_step: int | None = None,
        fbeta_switch_reward: float | None = None,
    ) -> RewardSpec:
        """A preset name (``kbqa-r1``) or ``name[:weight],…`` (weight 1 when left out).

        Keyword options override the preset's or the defaults; None keeps them (a
        ``fbeta_switch_reward`` above 1 is never reached: it turns the reward switch off).
        Raises ConfigError naming the bad component and listing the valid ones.
        """
        key = text.strip().lower()
        opts: dict[str, Any]
        if key in PRESETS:
            opts = dict(PRESETS[key])
        else:
            weights = []
            for part in text.split(","):
                part = part.strip()
                if not part:
                    raise ConfigError(
                        f"reward spec {text!r}: empty component; valid: {_valid_names()}"
                    )
                name, sep, weight = part.partition(":")
                name = name.strip().lower()
                if name == "em":
                    check_metric_name(name, f"reward spec {text!r}")
                if name not in REWARDS:
                    raise ConfigError(
                        f"reward spec {text!r}: unknown component {name!r}; valid: {_valid_names()}"
                    )
                try:
                    w = float(weight) if sep else 1.0
                except ValueError:
                    raise ConfigError(
                        f"reward spec {text!r}: weight of {name!r} is not a number: {weight!r}"
                    ) from None
                weights.append((name, w))
            opts = {"weights": tuple(weights)}
        overrides = {
            "gate_format": gate_format,
            "cap": cap,
            "fbeta_switch_step": fbeta_switch_step,
            "fbeta_switch_reward": fbeta_switch_reward,
        }
        opts.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**opts, name=key if key in PRESETS else None)

    def __str__(self) -> str:
        return ",".join(f"{n}:{w:g}" for n, w in self.weights)

    @property
    def components(self) -> list[str]:
        return [n for n, _ in self.weights]

    @property
    def needs_distance(self) -> bool:
        """True when a ``distance`` component is configured (score needs a GraphDistance)."""
        return "distance" in self.components

    def fbeta_beta(self, state: RewardState | None) -> float:
        """The curriculum's beta at ``state``: 0.5 until the switch, then 1 for good. The
        switch comes at step ``fbeta_switch_step``, or after the first step at whose end the
        outcome's running mean reached ``fbeta_switch_reward`` (see :meth:`advance`)."""
        if state is None:
            return FBETA_EARLY
        if state.fbeta_switched_at is not None:
            return FBETA_LATE
        if self.fbeta_switch_step is not None and state.step >= self.fbeta_switch_step:
            return FBETA_LATE
        return FBETA_EARLY

    def advance(self, state: RewardState, outcomes: Sequence[float]) -> RewardState:
        """The state for the step after ``state.step``, given the outcome rewards of that
        step's rollouts: the running mean updated, the F-beta switch set when it is reached
        (and never unset), the step counted."""
        step_mean = sum(outcomes) / len(outcomes) if outcomes else 0.0
        mean = (
            step_mean
            if state.outcome_mean is None
            else OUTCOME_MEAN_DECAY * state.outcome_mean + (1 - OUTCOME_MEAN_DECAY) * step_mean
        )
        switched = state.fbeta_switched_at
        if switched is None and "fbeta" in self.components:
            if self.fbeta_beta(state) == FBETA_LATE:
                switched = state.step
            elif self.fbeta_switch_reward is not None and mean >= self.fbeta_switch_reward:
                switched = state.step + 1
        return RewardState(step=state.step + 1, outcome_mean=mean, fbeta_switched_at=switched)

    def score(
        self,
        episode: Episode,
        gold: Gold,
        state: RewardState | None = None,
        distance: GraphDistance | None = None,
    ) -> RewardResult:
        """Every component, the weighted total and the per-turn rewards of one rollout."""
        if self.needs_distance and distance is None:
            raise ConfigError(
                f"reward spec {self}: the distance component needs a GraphDistance (distance=...)"
            )
        curriculum_beta = self.fbeta_beta(state)
        beta = curriculum_beta if "fbeta" in self.components else None
        n_turns = len(assistant_turns(episode))
        components: dict[str, float] = {}
        turn = [0.0] * n_turns
        for name, weight in self.weights:
            if name == "fbeta":
                components[name] = fbeta_reward(episode, gold, beta=curriculum_beta)
            elif name in TURN_REWARDS:
                extra = {"distance": distance} if name == "distance" else {}
                values = TURN_REWARDS[name](episode, gold, **extra)
                for i, value in enumerate(values):
                    turn[i] += weight * value
                if name == "distance":  # the mean over the queries run, as distance_reward
                    components[name] = _mean_over_queries(episode, values)
                else:
                    components[name] = sum(values) / len(values) if values else 0.0
            else:
                components[name] = REWARDS[name](episode, gold)
        outcome = next((components[n] for n in self.components if n in ANSWER_COMPONENTS), 0.0)
        trajectory = 0.0
        turn_level = 0.0
        for name, weight in self.weights:
            if name == "format" and self.gate_format and outcome <= 0.0:
                continue
            if name in TURN_REWARDS:
                turn_level += weight * components[name]
            else:
                trajectory += weight * components[name]
        total = trajectory + turn_level
        if self.cap is not None:
            total, trajectory = min(total, self.cap), min(trajectory, self.cap)
        return RewardResult(total, components, turn, outcome, beta, trajectory)


__all__ = [
    "DEFAULT_SPEC",
    "PRESETS",
    "REWARDS",
    "TURN_REWARDS",
    "Gold",
    "GraphDistance",
    "RewardResult",
    "RewardSpec",
    "RewardState",
    "assistant_turns",
    "distance_progress",
    "distance_reward",
    "em_strict_reward",
    "f1_reward",
    "fbeta_reward",
    "format_reward",
    "hit_reward",
    "pooled_turn_advantages",
    "retrieval_reward",
    "turn_returns",
    "turn_reward",
    "turn_rewards_kgr1",
]
