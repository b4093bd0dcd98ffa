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

Tree rollouts (``--rollout tree``, ISP-KGR)
-------------------------------------------
The same spec scores every node (agent step) of a rollout tree: :func:`score_tree` in
:mod:`kgsynth.agent.rewards.tree` gives a node its step's format (+1/-1) and turn-level
components (``distance``: the per-step progress above) plus the best trajectory-level outcome
(``f1``...) among the leaves of its subtree; ``isp`` there is ISP's composite.
"""

from __future__ import annotations

# every public name, from the module that defines it (spec.py imports some of the same names
# from components.py: this list is the package's face, that one what the weighted sum uses)
from kgsynth.agent.rewards.components import (
    ANSWER_COMPONENTS,
    FBETA_EARLY,
    FBETA_LATE,
    TURN_ACTION_WEIGHT,
    TURN_FORMAT_WEIGHT,
    Gold,
    assistant_turns,
    em_strict_reward,
    f1_reward,
    fbeta_reward,
    format_reward,
    hit_reward,
    retrieval_reward,
    turn_reward,
    turn_rewards_kgr1,
)
from kgsynth.agent.rewards.distance import GraphDistance, distance_progress, distance_reward
from kgsynth.agent.rewards.spec import (
    DEFAULT_SPEC,
    OUTCOME_MEAN_DECAY,
    PRESETS,
    REWARDS,
    TURN_REWARDS,
    RewardResult,
    RewardSpec,
    RewardState,
    pooled_turn_advantages,
    turn_returns,
)
from kgsynth.agent.rewards.tree import TREE_VALUES, TreeScores, score_tree

__all__ = [
    "ANSWER_COMPONENTS",
    "DEFAULT_SPEC",
    "FBETA_EARLY",
    "FBETA_LATE",
    "OUTCOME_MEAN_DECAY",
    "PRESETS",
    "REWARDS",
    "TREE_VALUES",
    "TURN_ACTION_WEIGHT",
    "TURN_FORMAT_WEIGHT",
    "TURN_REWARDS",
    "Gold",
    "GraphDistance",
    "RewardResult",
    "RewardSpec",
    "RewardState",
    "TreeScores",
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
    "score_tree",
    "turn_returns",
    "turn_reward",
    "turn_rewards_kgr1",
]
