"""One GRPO step on tree rollouts (``kgsynth train rl --rollout tree``): ISP-KGR's step-level GRPO.

Each of the step's questions grows a rollout tree (:func:`kgsynth.agent.tree.run_tree_rollouts`:
``branches`` continuations per live step, equivalent branches pruned by ``tree_prune`` (ISP's
tree-wide state cache, or siblings only), failed branches kept as leaves, at most ``max_tree_nodes`` live nodes per question). Every node gets a value
(:func:`kgsynth.agent.rewards.tree.score_tree`: per-step format and progress plus the best
outcome among its subtree's leaves), and the children of each parent form one GRPO group: a
child's advantage is ``(V - mean(V siblings)) / (std + eps)`` (``scale_rewards``; else the
centred value), and it is carried by the tokens that child's step sampled, nothing else
(:func:`sibling_advantages`). A parent with one kept child, or whose children all tie, gives
no signal and its children are not trained (counted as skipped groups, like a flat group whose
rewards tie).

A step's tokens are trained once: every node is owned by the first leaf of its subtree, and each
leaf becomes one training sequence, its path's ids up to its last owned step, with the loss
mask on its owned steps only (:func:`tree_sequences`). The step's tokens see the same context in
any path through the node, so the log-probabilities equal those the step was sampled with.

The metrics row gets, beside the usual ones (``reward``: the mean flat reward of the leaves'
episodes; ``groups`` and ``skipped_groups``: sibling groups),
``tree/branches_sampled``, ``tree/branches_pruned``, ``tree/prune_rate``, ``tree/live_nodes``
(summed over agent steps and questions), ``tree/max_live_nodes``, ``tree/nodes``,
``tree/leaves``, ``tree/sibling_groups``, ``tree/skipped_sibling_groups``, ``tree/node_value``
and, per agent step, ``tree/sampled_by_turn``, ``tree/pruned_by_turn``, ``tree/live_by_turn``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kgsynth.train.grpo_dist import weights_checksum
from kgsynth.train.grpo_loss import degenerate, group_advantages
from kgsynth.train.grpo_run import RLQuestion
from kgsynth.train.grpo_step import LoopState, Run, scored_share, tree_row
from kgsynth.train.grpo_update import update


@dataclass(frozen=True)
class SiblingAdvantages:
    """Per node (index 0, the root, included): its advantage among its siblings (0.0 where its
    group gives no signal) and whether it is trained; the number of sibling groups (parents with
    children) and of those skipped (one child, or all tied)."""

    advantages: list[float]
    trained: list[bool]
    groups: int
    skipped: int


def sibling_advantages(
    parents: Sequence[int], values: Sequence[float], *, scale: bool = True
) -> SiblingAdvantages:
    """Step-level GRPO advantages: each parent's children normalised among themselves."""
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            groups.setdefault(p, []).append(i)
    adv = [0.0] * len(parents)
    trained = [False] * len(parents)
    skipped = 0
    for kids in groups.values():
        vals = [values[i] for i in kids]
        if len(kids) < 2 or degenerate(vals):
            skipped += 1
            continue
        for i, a in zip(kids, group_advantages(vals, scale=scale), strict=True):
            adv[i], trained[i] = a, True
    return SiblingAdvantages(adv, trained, len(groups), skipped)


@dataclass
class TrainSequence:
    """One training row: a path's ids, the loss mask on the steps this row trains, the
    log-probs they were sampled with, each token's advantage, and the token span of each step
    it trains (``segments``: each is one sequence for ``loss_agg seq-mean-token-mean``)."""

    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    advantages: list[float]
    segments: list[tuple[int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


def _first_leaf(tree: Any) -> list[int]:
    """For each node, the first leaf of its subtree (children in order)."""
    first = list(range(len(tree.nodes)))
    for node in reversed(tree.nodes):  # children come after their parent
        if node.children:
            first[node.index] = first[node.children[0]]
    return first


def tree_sequences(tree: Any, adv: SiblingAdvantages) -> list[TrainSequence]:
    """The training rows of one tree (see the module doc): one per leaf that owns a trained
    step; each trained step's tokens appear, masked in, in exactly one row."""
    first = _first_leaf(tree)
    owned: dict[int, list[int]] = {}
    for node in tree.nodes[1:]:
        if adv.trained[node.index]:
            owned.setdefault(first[node.index], []).append(node.index)
    rows = []
    for leaf, nodes in owned.items():
        r = tree.nodes[leaf].rollout
        end = max(tree.nodes[i].span[1] for i in nodes)
        mask = [0] * end
        advantages = [0.0] * end
        for i in nodes:
            s, e = tree.nodes[i].span
            mask[s:e] = [1] * (e - s)
            advantages[s:e] = [adv.advantages[i]] * (e - s)
        spans = [tree.nodes[i].span for i in nodes]
        rows.append(TrainSequence(r.ids[:end], mask, r.logprobs[:end], advantages, spans))
    return rows


def tree_rollout_and_update(
    run: Run, st: LoopState, step_i: int, batch: Sequence[RLQuestion]
) -> tuple[dict[str, Any], dict[str, float]]:
    """This rank's questions of the step grown into trees, scored, and trained on: its share
    of the step's facts (the flat keys over the leaves' episodes, plus ``tree``) and the
    update's statistics."""
    from kgsynth.agent.loop import EpisodeTask
    from kgsynth.agent.rewards.tree import score_tree
    from kgsynth.agent.rollout import check_alignment
    from kgsynth.agent.tools import ToolEnvironment
    from kgsynth.agent.tree import run_tree_rollouts

    cfg = run.cfg
    t0 = time.perf_counter()
    mine = [gi for gi in range(len(batch)) if gi % run.world == run.rank]
    tasks = [EpisodeTask(batch[gi].question, batch[gi].topic_names) for gi in mine]
    with run.autocast:
        trees = run_tree_rollouts(
            run.sampler,
            tasks,
            lambda task: ToolEnvironment(
                run.graph, task.question, run.tool_cfg, topics=task.topic_names
            ),
            run.rcfg,
            branches=cfg.branches,
            max_live=cfg.max_tree_nodes,
            seed=cfg.seed * 100_003 + step_i + 7_919 * run.rank,
            batch_size=cfg.rollout_batch_size,
            prune=cfg.tree_prune,
        )
    t_roll = time.perf_counter() - t0
    results, eps, rows, values = [], [], [], []
    groups = skipped = 0
    question_of: list[int] = []  # each training row's question among the step's
    for gi, tree in zip(mine, trees, strict=True):
        q = batch[gi]
        gold = q.gold()
        leaves = tree.leaves
        for i in leaves:
            check_alignment(tree.nodes[i].rollout)
        scores = score_tree(
            run.rspec, tree.parents, {i: tree.nodes[i].episode for i in leaves}, gold,
            st.reward_state, distance=run.distance, aggregate=cfg.tree_value,
        )  # fmt: skip
        adv = sibling_advantages(tree.parents, scores.values, scale=cfg.scale_rewards)
        groups, skipped = groups + adv.groups, skipped + adv.skipped
        new_rows = tree_sequences(tree, adv)
        rows += new_rows
        question_of += [gi] * len(new_rows)
        values += scores.values[1:]
        results += [scores.leaves[i] for i in leaves]
        eps += [tree.nodes[i].episode for i in leaves]
    upd = update(
        run.policy, run.ref, rows, [r.advantages for r in rows], list(range(len(rows))), cfg,
        run.device, run.autocast, question_of=question_of,
    )  # fmt: skip
    t_step = time.perf_counter() - t0
    depth = max((len(t.steps) for t in trees), default=0)
    tree_share = {
        "branches_sampled": sum(t.sampled for t in trees),
        "branches_pruned": sum(t.pruned for t in trees),
        "live_nodes": sum(s.live for t in trees for s in t.steps),
        "max_live_nodes": max((s.live for t in trees for s in t.steps), default=0),
        "nodes": sum(len(t.nodes) - 1 for t in trees),
        "leaves": len(eps),
        "timed_out_trees": sum(t.timed_out for t in trees),
        "sibling_groups": groups,
        "skipped_sibling_groups": skipped,
        "node_value_sum": sum(values),
        "sampled_by_turn": [sum(t.steps[d].sampled for t in trees if d < len(t.steps))
                            for d in range(depth)],
        "pruned_by_turn": [sum(t.steps[d].pruned for t in trees if d < len(t.steps))
                           for d in range(depth)],
        "live_by_turn": [sum(t.steps[d].live for t in trees if d < len(t.steps))
                         for d in range(depth)],
    }  # fmt: skip
    share = {
        **scored_share(results, eps),
        "timed_out": sum(e.timed_out for e in eps),
        "truncated": sum(tree.nodes[i].rollout.truncated_observations
                         for tree in trees for i in tree.leaves),
        "generated_tokens": sum(t.generated_tokens for t in trees),
        "skipped": skipped,
        "rollout_s": t_roll,
        "checksum": weights_checksum(run.policy.module) if run.world > 1 else 0.0,
        "tree": tree_share,
    }  # fmt: skip
    return share, {**upd, "step_s": t_step}


__all__ = [
    "SiblingAdvantages",
    "TrainSequence",
    "sibling_advantages",
    "tree_rollout_and_update",
    "tree_row",
    "tree_sequences",
]
