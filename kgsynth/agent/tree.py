"""Tree rollouts in token space (ISP-KGR's; ``kgsynth train rl --rollout tree``).

Input: questions (:class:`~kgsynth.agent.episode.EpisodeTask`), a
:class:`~kgsynth.agent.rollout.TokenPolicy`, a tool environment per question and a
:class:`~kgsynth.agent.rollout.RolloutConfig`. Output: one :class:`QuestionTree` per question,
whose nodes are agent steps::

    trees = run_tree_rollouts(policy, tasks, make_env, cfg, branches=3, max_live=8, seed=0)

At each step every live node is continued ``branches`` (K) times, all the trees' samples in
batched ``generate`` calls. Each continuation is applied by the flat loop's own per-turn code
(:func:`kgsynth.agent.loop.advance`: the turn parsed and run through the action space, its end
detected, else :class:`~kgsynth.agent.rollout.TokenTurns` appends the observation's tokens), so
a tree speaks whatever action format the tool set does.
Pruning (``prune``, ``--tree-prune``) keeps the first of equivalent branches
(:func:`branch_key`). ``tree`` is ISP-KGR's (App. F.3, F.5, Alg. 1): one state cache per
question tree, so a branch whose successful observation (its lines normalised and sorted) any
kept branch of the tree gave before, under any parent at any step, is pruned; a branch that
failed (a tool error, a format error, a turn without an action, a query that returned no
entity) is never pruned and ends as a leaf, a negative sample; answers are compared among
siblings. ``siblings`` is kgsynth's earlier rule: among the children of one parent only, the
same observation text, the same normalised answer set, or the same turn text for a failed
step (identical failures pruned too); a query that returned nothing goes on. A branch ends as a
leaf, kept with its reward, when it answers, fails (a tool error, a format error, a turn
without an action), reaches the forced final turn, or its tree runs past the wall-time limit;
the others stay live.

Bounds (so a CPU run stays small): ``max_turns`` steps (then one forced final answer, as in the
flat loop), and at most ``max_live`` live nodes per question: at a step with L live nodes each
gets ``min(K, max_live // L)`` branches (the remainder spread over the first ones), at least
one, so the next step again has at most ``max_live``. Counts per step (live nodes, branches
sampled, branches pruned, tokens) are in :attr:`QuestionTree.steps`.

Every node keeps its path's :class:`~kgsynth.agent.rollout.Rollout` (ids, loss mask, log-probs)
and the span of its own step's sampled tokens in it, which is what step-level GRPO trains on
(:mod:`kgsynth.train.grpo_tree`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kgsynth.agent.episode import Episode, EpisodeTask, TurnRecord, ask_final_answer, start_episode
from kgsynth.agent.loop import ANSWERED, FAILED, FINAL, TIMEOUT, Generated, LiveEpisode, advance
from kgsynth.agent.prompt import agent_system_prompt
from kgsynth.agent.rollout import Rollout, RolloutConfig, TokenPolicy, TokenTurns
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.metrics import normalize_answer

# why a leaf ended (kgsynth.agent.loop's reasons): ANSWERED; FAILED, a tool error, a format
# error or a turn without an action (:func:`failed_step`); FINAL, the forced final turn gave no
# answer; TIMEOUT


@dataclass
class TreeNode:
    """One agent step (the root: the prompt). ``span`` is where this step's sampled tokens lie
    in ``rollout.ids``; ``end`` says why a leaf ended (None while live or inner)."""

    index: int
    parent: int
    depth: int
    rollout: Rollout
    span: tuple[int, int] = (0, 0)
    children: list[int] = field(default_factory=list)
    end: str | None = None
    # the environment's episode state after this step (sexpr's expressions; None for the
    # stateless tool sets): the branches of a tree share one environment
    env_state: Any = None

    @property
    def episode(self) -> Episode:
        return self.rollout.episode


@dataclass
class StepCounts:
    """One agent step of one tree: live nodes, branches sampled and pruned, tokens sampled."""

    live: int = 0
    sampled: int = 0
    pruned: int = 0
    tokens: int = 0


@dataclass
class QuestionTree:
    """The rollout tree of one question: node 0 is the root (the prompt)."""

    task: EpisodeTask
    env: Any
    nodes: list[TreeNode]
    steps: list[StepCounts] = field(default_factory=list)
    live: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    timed_out: bool = False
    # the tree-wide state cache of --tree-prune tree (ISP-KGR Alg. 1's S_cache)
    states: set[tuple[Any, ...]] = field(default_factory=set)

    @property
    def parents(self) -> list[int]:
        return [n.parent for n in self.nodes]

    @property
    def leaves(self) -> list[int]:
        """Nodes without children, in order (every branch ends in one)."""
        return [n.index for n in self.nodes if not n.children and n.index > 0]

    @property
    def sampled(self) -> int:
        return sum(s.sampled for s in self.steps)

    @property
    def pruned(self) -> int:
        return sum(s.pruned for s in self.steps)

    @property
    def generated_tokens(self) -> int:
        return sum(s.tokens for s in self.steps)


def branch_counts(live: int, branches: int, max_live: int) -> list[int]:
    """Branches for each of ``live`` nodes: K each while ``max_live`` allows, else
    ``max_live // live`` (the remainder to the first ones), never fewer than one."""
    base, extra = divmod(max_live, live)
    return [max(1, min(branches, base + (1 if i < extra else 0))) for i in range(live)]


def branch_key(ep: Episode) -> tuple[Any, ...]:
    """What makes two sibling branches equivalent, read from the step the environment just
    applied: an answer by its normalised answer set (and whether the step was well-formed), a
    successful call by the observation text it returned, anything else (a failed step) by
    its whitespace-normalised text, so distinct failures are all kept."""
    t = ep.turns[-1]
    if ep.answered:
        answers = frozenset(normalize_answer(a) for a in ep.predicted_answers)
        return ("answer", answers, t.format_error is None)
    if t.observation is not None and t.tool_error is None and t.format_error is None:
        return ("observation", t.observation)
    return ("failed", " ".join(t.text.split()))


PRUNES = ("tree", "siblings")
"""Tree-wide pruning that keeps every failure (ISP-KGR Alg. 1), or sibling-only pruning."""


def state_key(ep: Episode) -> tuple[Any, ...]:
    """ISP-KGR's key of a successful step's observation (App. F.5): its non-empty lines,
    whitespace-normalised, as a sorted set, so the same entities or relations listed in another
    order are the same state."""
    text = ep.turns[-1].observation or ""
    lines = {" ".join(line.split()) for line in text.splitlines()}
    return ("observation", tuple(sorted(line for line in lines if line)))


def _pruned(tree: QuestionTree, parent: int, child: TreeNode, prune: str, seen: dict) -> bool:
    """Whether ``child`` repeats a kept branch (see the module doc); records it when not."""
    if prune == "siblings":
        keys, key = seen.setdefault((id(tree), parent), set()), branch_key(child.episode)
    elif child.end in (FAILED, FINAL):
        return False  # every failure is kept (App. F.2, F.5)
    elif child.episode.answered:
        keys, key = seen.setdefault((id(tree), parent), set()), branch_key(child.episode)
    else:
        keys, key = tree.states, state_key(child.episode)
    if key in keys:
        return True
    keys.add(key)
    return False


def _fork(r: Rollout) -> Rollout:
    ep = r.episode
    child = dataclasses.replace(
        ep,
        messages=list(ep.messages),
        turns=list(ep.turns),
        predicted_answers=list(ep.predicted_answers),
    )
    return dataclasses.replace(
        r,
        episode=child,
        ids=list(r.ids),
        mask=list(r.mask),
        logprobs=list(r.logprobs),
        turn_of=list(r.turn_of),
    )


def failed_step(end_empty: bool) -> Callable[[TurnRecord], bool]:
    """What ends a branch as a failed leaf though the flat loop would go on: a format or tool
    error, a turn without an action (no observation) and, with ``end_empty``, an observation
    that names no entity (ISP-KGR's empty result)."""

    def failed(t: TurnRecord) -> bool:
        return bool(
            t.format_error
            or t.tool_error
            or t.observation is None
            or (end_empty and not t.entities)
        )

    return failed


def _child(
    turns: TokenTurns,
    tree: QuestionTree,
    parent: TreeNode,
    sample: tuple[list[int], list[float], bool],
    turn: int,
    final: bool,
    end_empty: bool = False,
) -> TreeNode:
    """The branch ``sample`` makes from ``parent``: the step applied, its observation
    appended (when it goes on), or ended as a leaf (``end_empty``: also a step whose
    observation names no entity, ISP-KGR's empty result)."""
    toks, lps, eos_end = sample
    r = _fork(parent.rollout)
    start = len(r.ids)
    r.append(toks, lps, turn)
    node = TreeNode(len(tree.nodes), parent.index, parent.depth + 1, r, (start, len(r.ids)))
    text = turns.policy.tok.decode(toks, skip_special_tokens=True)
    tree.env.restore(parent.env_state)  # this branch's own state, not its last sibling's
    generated = Generated(text, None, len(toks), sampled=eos_end)
    live = LiveEpisode(r.episode, tree.env, r)
    node.end = advance(turns, live, generated, turn, final=final, ends=failed_step(end_empty))
    node.env_state = tree.env.snapshot()  # observing adds tokens, never environment state
    return node


def run_tree_rollouts(
    policy: TokenPolicy,
    tasks: Sequence[EpisodeTask],
    make_env: Callable[[EpisodeTask], ToolEnvironment],
    cfg: RolloutConfig,
    *,
    branches: int,
    max_live: int,
    seed: int | None = None,
    batch_size: int = 64,
    prune: str = "siblings",
) -> list[QuestionTree]:
    """One tree per task (see the module doc); ``cfg.timeout_s`` bounds each tree's wall
    time, after which its live nodes end as leaves; ``prune``: ``tree`` or ``siblings``."""
    import torch

    if branches < 1 or max_live < 1:
        raise ValueError(f"branches and max_live must be >= 1 (got {branches}, {max_live})")
    if prune not in PRUNES:
        raise ValueError(f"prune must be one of {', '.join(PRUNES)} (got {prune!r})")
    if seed is not None:
        torch.manual_seed(seed)
    turns = TokenTurns(policy, cfg, batch_size)
    system_text = agent_system_prompt(cfg)
    trees = []
    for task in tasks:
        ep = start_episode(task, system_text)
        root = TreeNode(0, -1, 0, turns.begin(ep))
        trees.append(QuestionTree(task, make_env(task), [root], live=[0]))
    for turn in range(cfg.max_turns + 1):
        final = turn == cfg.max_turns
        jobs: list[tuple[QuestionTree, TreeNode]] = []
        for tree in trees:
            if not tree.live:
                continue
            # as in the flat loop, the wall-time limit ends a branch after a step, never before
            # the first one: every tree has leaves
            if turn > 0 and time.monotonic() - tree.started > cfg.timeout_s:
                for i in tree.live:
                    tree.nodes[i].end = TIMEOUT
                    tree.nodes[i].episode.timed_out = True
                    tree.nodes[i].episode.done = True
                tree.live, tree.timed_out = [], True
                continue
            counts = branch_counts(len(tree.live), branches, max_live)
            tree.steps.append(StepCounts(live=len(tree.live), sampled=sum(counts)))
            for i, k in zip(tree.live, counts, strict=True):
                node = tree.nodes[i]
                if final:  # the turn limit (as the flat loop)
                    ask_final_answer(node.episode, tree.env)
                jobs.extend([(tree, node)] * k)
        if not jobs:
            break
        samples: list[tuple[list[int], list[float], bool]] = []
        for start in range(0, len(jobs), batch_size):
            chunk = jobs[start : start + batch_size]
            samples += policy.sample(
                [node.rollout.ids for _, node in chunk],
                max_new_tokens=cfg.max_turn_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
            )
        seen: dict[tuple[int, int], set[tuple[Any, ...]]] = {}
        for tree in trees:
            tree.live = []
        for (tree, parent), sample in zip(jobs, samples, strict=True):
            counts = tree.steps[-1]
            counts.tokens += len(sample[0])
            child = _child(turns, tree, parent, sample, turn, final, prune == "tree")
            if _pruned(tree, parent.index, child, prune, seen):
                counts.pruned += 1
                continue
            tree.nodes.append(child)
            parent.children.append(child.index)
            if child.end is None:
                tree.live.append(child.index)
    for tree in trees:
        for i in tree.leaves:
            tree.nodes[i].rollout.timed_out = tree.nodes[i].episode.timed_out
    return trees


__all__ = [
    "ANSWERED",
    "FAILED",
    "FINAL",
    "PRUNES",
    "TIMEOUT",
    "QuestionTree",
    "StepCounts",
    "TreeNode",
    "branch_counts",
    "branch_key",
    "failed_step",
    "run_tree_rollouts",
    "state_key",
]
