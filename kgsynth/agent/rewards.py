"""Rewards for GRPO on the live KG: named pure functions, a weighted sum, and turn-level rewards.

Input: one finished :class:`~kgsynth.agent.loop.Episode` (a rollout) and its :class:`Gold`
(answers, question, topic entities). Output: a :class:`RewardResult` with the weighted total,
every component's raw value by name (each is logged separately) and one turn-level reward per
assistant turn. Use::

    spec = RewardSpec.parse("kbqa-r1")          # or "f1:1,format:0.1", "em:1,retrieval:0.5"
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
``em`` (GraphWalker): 1.0 when the normalized predicted answer set equals the gold set
    (:func:`kgsynth.metrics.exact_match`), else 0.0.
``f1`` (KBQA-R1; Interactive Semantic Parsing): set F1 of prediction against gold
    (:func:`kgsynth.metrics.f1`).
``fbeta`` (KnowCoder-A1 §4.3.2): set F-beta with a curriculum: beta 0.5 (precision-leaning)
    while ``state.step < fbeta_switch_step`` and ``state.reward_mean < fbeta_switch_reward``,
    beta 1.0 as soon as either threshold is reached (an unset threshold never triggers; by
    default only the reward level 0.5 is set; a level above 1 turns the reward switch off). The beta used is reported as
    ``RewardResult.fbeta_beta``. The switch follows the state the trainer passes in, so a
    reward mean that falls back under the threshold switches back.
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
``distance`` (Interactive Semantic Parsing, progress): for each query turn, +1 when the
    smallest graph distance (hops, :class:`GraphDistance`) from that turn's observed entities
    to the gold answer set is smaller than the best so far, 0 when not, -1 for a tool error or
    an observation that names no entity. "Best so far" starts at the topic entities' distance;
    a distance beyond the search bound is "unknown" and beats nothing, while any known distance
    beats an unknown best. The reward is the **mean** over query turns (so it lies in [-1, 1];
    0.0 with no query turn). Per-turn values: :func:`distance_progress`.

Turn-level rewards (``TURN_REWARDS``, ``fn(episode, gold) -> list[float]``, one per assistant turn)
------------------------------------------------------------------------------------------
``turn`` (KG-R1): ``0.5 * format_ok + 0.5 * action_ok`` where ``format_ok`` is 1 when the turn
    has no ``format_error``; ``action_ok`` is 1 for a query the environment ran without a tool
    error, or for a parsed answer, else 0. A query repeating an earlier query of the episode
    (same tool, same arguments up to case, whitespace and relation-list order; the raw text
    when the call did not parse) earns 0 for the whole turn, valid or not.
KG-R1's turn-wise group-normalized advantage: :func:`turn_group_advantages`.

The weighted sum
----------------
``total = sum(weight * value)`` over the configured components, the format term left out under
``gate_format`` when the outcome reward (the first of ``em``/``f1``/``fbeta`` configured) is
<= 0, then ``min(total, cap)`` when a cap is set. ``turn_rewards[i]`` is the weighted sum of the
turn-level components at assistant turn i (zeros when none is configured).

Presets (:data:`PRESETS`; the default is GraphWalker's, EM only)
--------------------------------------------------------------
``graphwalker`` = ``em:1``; ``kbqa-r1`` = ``f1:1,format:0.1`` with format gating;
``knowcoder-a1`` = ``fbeta:1,format:0.1`` with the total capped at 1;
``kg-r1`` = ``f1:1,retrieval:0.5,turn:0.2``; ``isp`` = ``f1:1,distance:0.1``. The weights of
the secondary terms in ``kg-r1`` and ``isp`` are kgsynth's choices, not the papers'.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kgsynth.agent.loop import Episode, TurnRecord
from kgsynth.errors import ConfigError
from kgsynth.kg.graph import LRU, KGGraph
from kgsynth.metrics import answer_set, exact_match, f1, f_beta, normalize_answer

FBETA_EARLY = 0.5
FBETA_LATE = 1.0
TURN_FORMAT_WEIGHT = 0.5
TURN_ACTION_WEIGHT = 0.5
ANSWER_COMPONENTS = ("em", "f1", "fbeta")


@dataclass(frozen=True)
class Gold:
    """What a rollout is scored against."""

    answers: Sequence[str]
    question: str = ""
    topic_names: Sequence[str] = ()


@dataclass
class RewardState:
    """Training progress that curricula read; the trainer updates it between steps.

    ``reward_mean`` is the running mean of the outcome reward (``RewardResult.outcome``), None
    before the first batch.
    """

    step: int = 0
    reward_mean: float | None = None


@dataclass(frozen=True)
class RewardResult:
    """One rollout's rewards. ``outcome`` is the raw answer reward (the first of em/f1/fbeta
    configured, 0.0 when none is); ``fbeta_beta`` the beta ``fbeta`` used (None without it)."""

    total: float
    components: dict[str, float]
    turn_rewards: list[float]
    outcome: float = 0.0
    fbeta_beta: float | None = None


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


def _retrieved(turn: TurnRecord) -> set[str]:
    """Normalized names a successful observation returned, the call's own subject excluded."""
    if not _is_query_turn(turn) or turn.tool_error is not None:
        return set()
    found = answer_set(turn.entities)
    if turn.args and isinstance(turn.args[0], str):
        found.discard(normalize_answer(turn.args[0]))
    return found


# --- outcome components ----------------------------------------------------------------------


def em_reward(episode: Episode, gold: Gold) -> float:
    """GraphWalker: exact match of the predicted answer set."""
    return exact_match(episode.predicted_answers, gold.answers)


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


def distance_progress(episode: Episode, gold: Gold, distance: GraphDistance) -> list[float]:
    """ISP progress per assistant turn: +1 / 0 / -1 on query turns, 0.0 on other turns."""
    topics = list(gold.topic_names) or list(episode.task.topic_names)
    best = distance.distance(topics, gold.answers) if topics else None
    out: list[float] = []
    for t in assistant_turns(episode):
        if not _is_query_turn(t):
            out.append(0.0)
            continue
        if t.tool_error is not None or not t.entities:
            out.append(-1.0)
            continue
        d = distance.distance(t.entities, gold.answers)
        if d is not None and (best is None or d < best):
            best = d
            out.append(1.0)
        else:
            out.append(0.0)
    return out


def distance_reward(episode: Episode, gold: Gold, distance: GraphDistance | None = None) -> float:
    """ISP progress reward: the mean of :func:`distance_progress` over query turns."""
    if distance is None:
        raise ConfigError("the distance reward needs a GraphDistance over the KG (distance=...)")
    steps = distance_progress(episode, gold, distance)
    values = [v for v, t in zip(steps, assistant_turns(episode), strict=True) if _is_query_turn(t)]
    return sum(values) / len(values) if values else 0.0


REWARDS: dict[str, Callable[..., float]] = {
    "em": em_reward,
    "f1": f1_reward,
    "fbeta": fbeta_reward,
    "format": format_reward,
    "retrieval": retrieval_reward,
    "turn": turn_reward,
    "distance": distance_reward,
}
TURN_REWARDS: dict[str, Callable[..., list[float]]] = {"turn": turn_rewards_kgr1}


def turn_group_advantages(
    turn_rewards_per_rollout: list[list[float]], eps: float = 1e-6
) -> list[list[float]]:
    """KG-R1's turn-wise group-normalized advantage.

    For each turn index t, the rewards at t of the rollouts that have a turn t (a rollout
    lacking it is skipped for that index) are normalized: ``(r - mean) / (std + eps)``, with
    the population standard deviation. Returns the advantages in the input's shape.
    """
    depth = max((len(r) for r in turn_rewards_per_rollout), default=0)
    out = [[0.0] * len(r) for r in turn_rewards_per_rollout]
    for t in range(depth):
        idx = [i for i, r in enumerate(turn_rewards_per_rollout) if len(r) > t]
        values = [turn_rewards_per_rollout[i][t] for i in idx]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        for i, v in zip(idx, values, strict=True):
            out[i][t] = (v - mean) / (std + eps)
    return out


# --- the weighted sum ------------------------------------------------------------------------

PRESETS: dict[str, dict[str, Any]] = {
    "graphwalker": {"weights": (("em", 1.0),)},
    "kbqa-r1": {"weights": (("f1", 1.0), ("format", 0.1)), "gate_format": True},
    "knowcoder-a1": {"weights": (("fbeta", 1.0), ("format", 0.1)), "cap": 1.0},
    "kg-r1": {"weights": (("f1", 1.0), ("retrieval", 0.5), ("turn", 0.2))},
    "isp": {"weights": (("f1", 1.0), ("distance", 0.1))},
}
DEFAULT_SPEC = "graphwalker"


def _valid_names() -> str:
    return f"components {', '.join(REWARDS)}; presets {', '.join(PRESETS)}"


@dataclass(frozen=True)
class RewardSpec:
    """Which rewards, with what weights, and the options of the presets (see module doc)."""

    weights: tuple[tuple[str, float], ...] = (("em", 1.0),)
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
        """The curriculum's beta at ``state``: 0.5 until a switch threshold is reached, then 1."""
        if state is None:
            return FBETA_EARLY
        by_step = self.fbeta_switch_step is not None and state.step >= self.fbeta_switch_step
        by_reward = (
            self.fbeta_switch_reward is not None
            and state.reward_mean is not None
            and state.reward_mean >= self.fbeta_switch_reward
        )
        return FBETA_LATE if by_step or by_reward else FBETA_EARLY

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
        beta = self.fbeta_beta(state) if "fbeta" in self.components else None
        components: dict[str, float] = {}
        for name, _ in self.weights:
            if name == "fbeta":
                components[name] = fbeta_reward(episode, gold, beta=self.fbeta_beta(state))
            elif name == "distance":
                components[name] = distance_reward(episode, gold, distance)
            else:
                components[name] = REWARDS[name](episode, gold)
        outcome = next((components[n] for n in self.components if n in ANSWER_COMPONENTS), 0.0)
        total = 0.0
        for name, weight in self.weights:
            if name == "format" and self.gate_format and outcome <= 0.0:
                continue
            total += weight * components[name]
        if self.cap is not None:
            total = min(total, self.cap)
        turn = [0.0] * len(assistant_turns(episode))
        for name, weight in self.weights:
            if name in TURN_REWARDS:
                for i, value in enumerate(TURN_REWARDS[name](episode, gold)):
                    turn[i] += weight * value
        return RewardResult(total, components, turn, outcome, beta)


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
    "em_reward",
    "f1_reward",
    "fbeta_reward",
    "format_reward",
    "retrieval_reward",
    "turn_group_advantages",
    "turn_reward",
    "turn_rewards_kgr1",
]
