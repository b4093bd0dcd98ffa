"""ISP-KGR's composite reward on a rollout tree: one value per node (an agent step).

Input: a rollout tree as plain data (each node's parent, -1 for the root; the finished
:class:`~kgsynth.agent.loop.Episode` of every leaf), its :class:`Gold` and a
:class:`RewardSpec`. Output (:func:`score_tree`): each node's value, the step-level signal
that :mod:`kgsynth.train.grpo_tree` normalises among siblings, with its parts. Node ``i`` at
depth ``d`` is the ``d``-th assistant step of every leaf under it (the root, depth 0, is the
prompt); the steps before it are the same on every path through it, so every per-step value
below is the same whichever leaf it is read from.

Where it comes from. Interactive Semantic Parsing (Song, Shen, Yu and Xia, Findings of ACL
2026; code github.com/NUSTM/ISP-KGR) trains on trees: each step samples K continuations, every
parent's children form a GRPO group, and each step is scored by a dense *distance-aware process
reward* (how close, in hops over the KG, the step's result comes to the gold answers) next to
a format score and the final answer's F1. In the authors' released scorer
(``slime_plugins/kg_rl/reward_fn.py``) a step on one root-to-leaf path scores
``0.1 * format + 0.3 * progress + 0.6 * F1(the leaf's answer)``, ``format`` being +1 for a
well-formed step and -1 otherwise, the F1 term withheld (0) from a step whose format or
progress is -1, and a node's reward is the *maximum* over the paths through it. Because format
and progress belong to the node itself, that maximum is the node's own format and progress plus
the best F1 among the leaves of its subtree: the "max-subtree F1".

What kgsynth computes, for node ``n`` (weights from the spec, e.g. ``isp`` = ``f1:0.6,
distance:0.3, format:0.1`` as in the authors' code; the issue's ``0.6`` progress and ``0.3`` F1
is ``--reward f1:0.3,distance:0.6,format:0.1``)::

    value(n) = w_format * format(n) + progress(n) + [format(n) > 0 and progress(n) >= 0] * best(n)

- ``format(n)``: +1 when step n broke no rule of the turn protocol (``format_error`` is None),
  -1 when it did (ISP's per-step format score; the flat ``format`` reward is per episode).
- ``progress(n)``: the weighted turn-level components at step n. For ``distance`` this is
  the per-step progress of :func:`~kgsynth.agent.rewards.distance.distance_progress`, by the
  distance's rule: ``previous`` is ISP-KGR's Alg. 2 (App. F.9) with App. F.8's COUNT and
  superlative handling (:mod:`kgsynth.agent.spaces.isp.progress`: each step against the step
  before; an exploration of an entity neither mentioned nor returned -1; a query that fails,
  returns nothing or repeats -1); ``best`` is kgsynth's earlier rule (+1 when the entities a
  query returned, its own subject left out, come closer to the gold answers than anything
  reached on this path before, 0 when not, -1 for an error or a repeated query). 0 on an
  answer step.
- ``best(n)``: the weighted trajectory-level components (``f1``, ``fbeta`` with its
  curriculum, ``hit``, ``retrieval``...; not ``format``) of each leaf under n, aggregated over
  the subtree by ``max`` (ISP) or ``mean``. A failed branch (tool error, format error, no
  answer) is a leaf whose F1 is 0.
- ``gate_format`` drops the format term where ``best(n) <= 0``; ``cap`` bounds the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kgsynth.agent.loop import Episode
from kgsynth.agent.rewards.components import Gold, assistant_turns
from kgsynth.agent.rewards.distance import GraphDistance
from kgsynth.agent.rewards.spec import TURN_REWARDS, RewardResult, RewardSpec, RewardState
from kgsynth.core.errors import ConfigError

TREE_VALUES = ("max", "mean")
"""How a node's subtree outcome is aggregated over its leaves (ISP: max)."""


@dataclass(frozen=True)
class TreeScores:
    """The values of one tree's nodes (index 0, the root, scores 0) and their parts, and the
    flat reward of every leaf's episode (``leaves``: node index -> result; what the metrics log
    and the curriculum reads)."""

    values: list[float]
    format: list[float]
    progress: list[float]
    best: list[float]
    leaves: dict[int, RewardResult]


def _depths(parents: Sequence[int]) -> list[int]:
    depth = [0] * len(parents)
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError(f"node {i}: its parent {p} must come before it")
        depth[i] = depth[p] + 1 if p >= 0 else 0
    return depth


def _path(parents: Sequence[int], leaf: int) -> list[int]:
    """The non-root nodes from the root's child down to ``leaf``."""
    out = []
    node = leaf
    while parents[node] >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def score_tree(
    spec: RewardSpec,
    parents: Sequence[int],
    leaf_episodes: Mapping[int, Episode],
    gold: Gold,
    state: RewardState | None = None,
    distance: GraphDistance | None = None,
    *,
    aggregate: str = "max",
) -> TreeScores:
    """Every node's value (see the module doc). ``parents[i]`` is node i's parent (-1 for the
    root, node 0), parents before children; ``leaf_episodes`` maps each leaf to its finished
    episode, whose i-th assistant turn is the step of the i-th node on its path."""
    if aggregate not in TREE_VALUES:
        raise ConfigError(f"tree value must be one of {', '.join(TREE_VALUES)} (got {aggregate!r})")
    if spec.needs_distance and distance is None:
        raise ConfigError(f"reward spec {spec}: the distance component needs a GraphDistance")
    n = len(parents)
    _depths(parents)  # checks the order
    weights = dict(spec.weights)
    fmt = [0.0] * n
    progress = [0.0] * n
    outcome: dict[int, float] = {}
    leaves: dict[int, RewardResult] = {}
    for leaf, ep in leaf_episodes.items():
        result = spec.score(ep, gold, state, distance=distance)
        leaves[leaf] = result
        path = _path(parents, leaf)
        turns = assistant_turns(ep)
        if len(turns) != len(path):
            raise ValueError(f"leaf {leaf}: {len(turns)} assistant turns on a path of {len(path)}")
        steps = [0.0] * len(path)
        for name, w in spec.weights:
            if name in TURN_REWARDS:
                extra = {"distance": distance} if name == "distance" else {}
                for j, v in enumerate(TURN_REWARDS[name](ep, gold, **extra)):
                    steps[j] += w * v
        for j, node in enumerate(path):
            progress[node] = steps[j]
            fmt[node] = 1.0 if turns[j].format_error is None else -1.0
        # the leaf's trajectory-level part: the components the flat score gave, by weight
        # (fbeta at the curriculum's beta, as spec.score computed it)
        outcome[leaf] = sum(
            w * result.components[name]
            for name, w in spec.weights
            if name not in TURN_REWARDS and name != "format"
        )
    best = _subtree(parents, outcome, aggregate)
    values = [0.0] * n
    w_format = weights.get("format", 0.0)
    for i in range(1, n):
        ok = fmt[i] > 0 and progress[i] >= 0
        v = progress[i] + (best[i] if ok else 0.0)
        if not (spec.gate_format and best[i] <= 0.0):
            v += w_format * fmt[i]
        values[i] = min(v, spec.cap) if spec.cap is not None else v
    return TreeScores(values, fmt, progress, best, leaves)


def _subtree(parents: Sequence[int], outcome: Mapping[int, float], aggregate: str) -> list[float]:
    """Each node's leaves' outcomes, aggregated (0.0 for a node without scored leaves)."""
    n = len(parents)
    under: list[list[float]] = [[] for _ in range(n)]
    for leaf, value in outcome.items():
        node = leaf
        while node >= 0:
            under[node].append(value)
            node = parents[node]
    if aggregate == "max":
        return [max(v) if v else 0.0 for v in under]
    return [sum(v) / len(v) if v else 0.0 for v in under]


__all__ = ["TREE_VALUES", "TreeScores", "score_tree"]
