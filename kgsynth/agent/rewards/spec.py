"""The reward registry (:data:`REWARDS`, :data:`TURN_REWARDS`), the presets, and the weighted sum
of one rollout's components (:class:`RewardSpec`), with the training state its curricula read
(:class:`RewardState`) and KG-R1's turn returns and pooled advantages."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kgsynth.agent.loop import Episode
from kgsynth.agent.rewards.components import (
    ANSWER_COMPONENTS,
    FBETA_EARLY,
    FBETA_LATE,
    Gold,
    assistant_turns,
    em_strict_reward,
    f1_reward,
    fbeta_reward,
    format_reward,
    hit_reward,
    hits_at_1_reward,
    retrieval_reward,
    turn_reward,
    turn_rewards_kgr1,
)
from kgsynth.agent.rewards.distance import (
    GraphDistance,
    _mean_over_queries,
    distance_progress,
    distance_reward,
)
from kgsynth.core.errors import ConfigError
from kgsynth.metrics import check_metric_name

REWARDS: dict[str, Callable[..., float]] = {
    "em_strict": em_strict_reward,
    "hit": hit_reward,
    "hits_at_1": hits_at_1_reward,
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
