"""One GRPO step: the step's questions drawn, this rank's groups rolled out against the KG,
scored and trained on (:func:`rollout_and_update`), then every rank's share gathered into the
step's metrics row (:func:`step_row`). :class:`Run` is what stays fixed over a run,
:class:`LoopState` what a step changes and a checkpoint keeps."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kgsynth.core.errors import KGSynthError
from kgsynth.train.grpo_config import GRPOConfig, logprob_tolerance
from kgsynth.train.grpo_dist import Policy, all_gather, weights_checksum
from kgsynth.train.grpo_loss import step_advantages
from kgsynth.train.grpo_run import RLQuestion, RLSpec
from kgsynth.train.grpo_update import update


@dataclass
class Run:
    """What stays fixed over a run: the policy, its reference, the tools and the limits."""

    spec: RLSpec
    device: str
    dtype: Any
    rank: int
    world: int
    tok: Any
    policy: Policy
    ref: Any
    sampler: Any
    graph: Any
    tool_cfg: Any
    distance: Any
    rcfg: Any
    rspec: Any
    autocast: Any

    @property
    def cfg(self) -> GRPOConfig:
        return self.spec.config


@dataclass
class LoopState:
    """What a step changes, and a checkpoint keeps to resume from."""

    qs: list[RLQuestion]
    rng: random.Random
    reward_state: Any
    order: list[int] = field(default_factory=list)
    cursor: int = 0
    phase: int = 1
    history: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, int] = field(
        default_factory=lambda: dict(rollouts=0, skipped_groups=0, groups=0, generated_tokens=0)
    )
    first_step: int = 1


def draw_questions(run: Run, st: LoopState, phase2: list[RLQuestion] | None) -> list[RLQuestion]:
    """The step's questions, in the shuffled order (reshuffled after each pass); the second
    phase's own questions once the F-beta switch comes."""
    from kgsynth.agent.rewards import FBETA_LATE

    if phase2 is not None and st.phase == 1 and run.rspec.fbeta_beta(st.reward_state) == FBETA_LATE:
        # the switch came: the second phase draws from its own questions
        st.phase, st.qs = 2, phase2
        st.order = list(range(len(st.qs)))
        st.rng.shuffle(st.order)
        st.cursor = 0
    return next_questions(st, int(run.cfg.questions_per_step or 1))


def next_questions(st: LoopState, n: int) -> list[RLQuestion]:
    """The next ``n`` questions in the shuffled order, reshuffled after each pass."""
    batch: list[RLQuestion] = []
    for _ in range(n):
        if st.cursor == len(st.order):
            st.rng.shuffle(st.order)
            st.cursor = 0
        batch.append(st.qs[st.order[st.cursor]])
        st.cursor += 1
    return batch


def refill_size(missing: int, sampled: int, informative: int, step: int) -> int:
    """How many questions a dynamic-sampling round draws: enough that, at the share of groups
    with a reward spread seen so far in the step, ``missing`` more are expected; at least
    ``missing``, at most a step's worth (``step``)."""
    expected = math.ceil(missing * sampled / informative) if informative else step
    return max(missing, min(expected, step))


@dataclass
class Sampled:
    """This rank's scored rollouts of one step, over every dynamic-sampling round; a group
    is numbered among all the step sampled, on every rank."""

    rollouts: list[Any] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    adv: list[list[float] | None] = field(default_factory=list)  # None: the group tied
    group_of: list[int] = field(default_factory=list)  # each rollout's group
    groups: int = 0  # sampled, over all ranks
    skipped: int = 0  # this rank's groups whose rewards tie
    group_std: list[float] = field(default_factory=list)  # each of this rank's groups' spread
    rollout_s: float = 0.0


def sample_groups(
    run: Run,
    st: LoopState,
    step_i: int,
    questions: Sequence[RLQuestion],
    out: Sampled,
    round_i: int,
) -> list[int]:
    """One round: this rank's groups of ``questions`` (numbered on from the groups ``out``
    holds) rolled out, scored and given advantages, added to ``out``. Returns the groups with
    a reward spread, of every rank, in order."""
    from kgsynth.agent.loop import EpisodeTask
    from kgsynth.agent.rollout import check_alignment, run_rollouts
    from kgsynth.agent.tools import ToolEnvironment

    cfg = run.cfg
    g = int(cfg.group_size or 2)
    first = out.groups
    # data parallel: each rank rolls out whole groups (group gi on rank gi % world)
    mine = [first + j for j in range(len(questions)) if (first + j) % run.world == run.rank]
    qs = [questions[gi - first] for gi in mine]
    tasks = [EpisodeTask(q.question, q.topic_names) for q in qs for _ in range(g)]
    t0 = time.perf_counter()
    with run.autocast:
        rollouts = run_rollouts(
            run.sampler,
            tasks,
            lambda task: ToolEnvironment(
                run.graph, task.question, run.tool_cfg, topics=task.topic_names
            ),
            run.rcfg,
            seed=cfg.seed * 100_003 + step_i + 7_919 * run.rank + 1_000_003 * round_i,
            batch_size=cfg.rollout_batch_size,
        )
    out.rollout_s += time.perf_counter() - t0
    for r in rollouts:
        check_alignment(r)
    # rewards (reward_state.step = step_i - 1: the steps done before this one)
    results = [
        run.rspec.score(r.episode, qs[k // g].gold(), st.reward_state, distance=run.distance)
        for k, r in enumerate(rollouts)
    ]
    if cfg.shuffle_rewards:  # the no-signal control: a rollout gets a groupmate's reward
        shuffle = random.Random(cfg.seed * 100_003 + step_i + 1_000_003 * round_i)
        for j in range(len(qs)):
            part = results[j * g : (j + 1) * g]
            shuffle.shuffle(part)
            results[j * g : (j + 1) * g] = part
    adv, skipped = step_advantages(
        rollouts, results, g, turn_advantage=cfg.turn_advantage,
        turn_lambda=cfg.turn_lambda, scale=cfg.scale_rewards,
    )  # fmt: skip
    out.rollouts += rollouts
    out.results += results
    out.adv += adv
    out.group_of += [mine[k // g] for k in range(len(rollouts))]
    out.groups += len(questions)
    out.skipped += skipped
    out.group_std += [
        statistics.pstdev(res.total for res in results[j * g : (j + 1) * g]) for j in range(len(qs))
    ]
    spread = [gi for j, gi in enumerate(mine) if adv[j * g] is not None]
    return sorted(gi for part in all_gather(spread) for gi in part)


def rollout_and_update(
    run: Run, st: LoopState, step_i: int, batch: Sequence[RLQuestion]
) -> tuple[dict[str, Any], dict[str, float]]:
    """This rank's groups of the step rolled out, scored and trained on: its share of the
    step's facts (for the metrics) and the update's statistics. With ``dynamic_sampling``
    (DAPO) the groups whose rewards tie are replaced by groups of questions drawn next,
    round after round, until ``len(batch)`` groups with a spread are found or the rounds run
    out; the first ``len(batch)`` found are trained on, the rest only counted."""
    cfg = run.cfg
    t0 = time.perf_counter()
    sampled = Sampled()
    spread = sample_groups(run, st, step_i, batch, sampled, 0)
    rounds = 0
    while (
        cfg.dynamic_sampling and len(spread) < len(batch) and rounds < cfg.dynamic_sampling_rounds
    ):
        rounds += 1
        n = refill_size(len(batch) - len(spread), sampled.groups, len(spread), len(batch))
        spread += sample_groups(run, st, step_i, next_questions(st, n), sampled, rounds)
    # a trained group's place among the step's questions, for the PPO mini-batches (without
    # refills every group keeps its own: the step's question index)
    place = {gi: k for k, gi in enumerate(spread[: len(batch)])}
    keep = [i for i, gi in enumerate(sampled.group_of) if gi in place]
    if cfg.dynamic_sampling:
        question_of = [place.get(gi, 0) for gi in sampled.group_of]
    else:
        question_of = list(sampled.group_of)
    upd = update(
        run.policy, run.ref, sampled.rollouts, sampled.adv, keep, cfg, run.device, run.autocast,
        question_of=question_of,
    )  # fmt: skip
    t_step = time.perf_counter() - t0
    eps = [r.episode for r in sampled.rollouts]
    share = {
        **scored_share(sampled.results, eps),
        "timed_out": sum(r.timed_out for r in sampled.rollouts),
        "truncated": sum(r.truncated_observations for r in sampled.rollouts),
        "generated_tokens": sum(r.generated_tokens for r in sampled.rollouts),
        "skipped": sampled.skipped,
        "groups_sampled": sampled.groups,
        "trained_groups": len(place),
        "refill_rounds": rounds,
        "group_std": sampled.group_std,
        "rollout_s": sampled.rollout_s,
        "checksum": weights_checksum(run.policy.module) if run.world > 1 else 0.0,
    }
    return share, {**upd, "step_s": t_step}


def step_row(
    run: Run, st: LoopState, step_i: int, n_groups: int, share: dict, upd: dict[str, float]
) -> dict[str, Any]:
    """The step's ``metrics.jsonl`` row from every rank's share, so that all ranks hold the
    same curriculum state and rank 0 logs the whole step; advances the curriculum."""
    import torch

    t_step = upd.pop("step_s")
    shares = all_gather(share)
    tree = tree_row(shares)
    if tree:  # tree rollouts: a group is a parent's children
        n_groups = tree["tree/sibling_groups"]
    # dynamic sampling: every group sampled, refills included (the same count on every rank)
    n_groups = shares[0].get("groups_sampled", n_groups)
    spreads = [v for s in shares for v in s.get("group_std", [])]
    sampling = {
        "trained_groups": shares[0].get(
            "trained_groups", n_groups - sum(s["skipped"] for s in shares)
        ),
        **({"refill_rounds": shares[0]["refill_rounds"]} if run.cfg.dynamic_sampling else {}),
        # the mean within-group spread of the reward: what the advantages are made of
        **({"group_reward_std": sum(spreads) / len(spreads)} if spreads else {}),
    }
    every = {k: [v for s in shares for v in s[k]] for k in
             ("rewards", "outcomes", "components", "turns", "tool_errors", "format_errors",
              "answered")}  # fmt: skip
    rewards = every["rewards"]
    beta = next((s["beta"] for s in shares if s["beta"] is not None), None)
    # the running mean of the outcome reward and the F-beta switch, for the next step
    st.reward_state = run.rspec.advance(st.reward_state, every["outcomes"])
    gen_tokens = sum(s["generated_tokens"] for s in shares)
    skipped = sum(s["skipped"] for s in shares)
    t_roll = max(s["rollout_s"] for s in shares)
    st.totals["rollouts"] += len(rewards)
    st.totals["skipped_groups"] += skipped
    st.totals["groups"] += n_groups
    st.totals["generated_tokens"] += gen_tokens
    comps: dict[str, float] = {}
    for components in every["components"]:
        for name, v in components.items():
            comps[name] = comps.get(name, 0.0) + v / len(rewards)
    n_eps = len(rewards)
    sync = {}
    if run.world > 1:
        sums = [s["checksum"] for s in shares]
        engine = run.policy.engine
        if not (engine is not None and engine.zero_optimization_stage() == 3):
            # ZeRO-3 ranks hold shards, not whole weights
            sync = {"weights_in_sync": max(sums) - min(sums) <= 1e-9 * max(1.0, abs(sums[0]))}
    row = {
        "step": step_i,
        "reward": sum(rewards) / len(rewards),
        "reward_std": float(torch.tensor(rewards).std(unbiased=False)),
        **{f"reward/{k}": v for k, v in sorted(comps.items())},
        "outcome_mean": st.reward_state.outcome_mean,
        "phase": st.phase,
        **({"fbeta_beta": beta} if beta is not None else {}),
        **upd,
        "lr": run.policy.sched.get_last_lr()[0],
        "turns": sum(every["turns"]) / n_eps,
        "tool_errors": sum(every["tool_errors"]) / n_eps,
        "format_errors": sum(every["format_errors"]) / n_eps,
        "answered": sum(every["answered"]) / n_eps,
        "timed_out": sum(s["timed_out"] for s in shares),
        "truncated_observations": sum(s["truncated"] for s in shares),
        "generated_tokens": gen_tokens,
        "rollout_tokens_per_s": gen_tokens / t_roll if t_roll > 0 else 0.0,
        "skipped_groups": skipped,
        "groups": n_groups,
        **sampling,
        "rollout_s": t_roll,
        "step_s": t_step,
        **tree,
        **({"world_size": run.world} if run.world > 1 else {}),
        **sync,
        "time": time.time(),
    }
    st.history.append(row)
    if sync and not sync["weights_in_sync"]:
        raise RuntimeError(f"step {step_i}: the ranks' weights differ ({shares})")
    return row


def check_logprobs(cfg: GRPOConfig, row: dict[str, Any]) -> None:
    """The alignment check: the rollout engine's log-probs of the sampled tokens must be the
    training forward's (the same tokens, the same weights, the same temperature) within
    ``logprob_tolerance`` on average. The row's figure is summed over every rank, so every rank
    raises together."""
    gap, bound = row.get("logprob_mismatch_mean", 0.0), logprob_tolerance(cfg)
    if gap > bound:
        raise KGSynthError(
            f"step {row['step']}: the {cfg.rollout_engine} engine's rollout log-probs differ "
            f"from the training forward's by {gap:.4g} per sampled token on average (largest "
            f"{row.get('logprob_mismatch', 0.0):.4g}), over --logprob-tolerance {bound:g}: the "
            "rollouts are not the tokens or weights being trained"
        )


def tree_row(shares: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``tree/...`` fields of a step's metrics row from every rank's ``tree`` share."""
    parts = [s["tree"] for s in shares if "tree" in s]
    if not parts:
        return {}

    def total(key: str) -> int | float:
        return sum(p[key] for p in parts)

    def by_turn(key: str) -> list[int]:
        depth = max(len(p[key]) for p in parts)
        return [sum(p[key][d] for p in parts if d < len(p[key])) for d in range(depth)]

    sampled, nodes = total("branches_sampled"), total("nodes")
    return {
        "tree/branches_sampled": sampled,
        "tree/branches_pruned": total("branches_pruned"),
        "tree/prune_rate": total("branches_pruned") / sampled if sampled else 0.0,
        "tree/live_nodes": total("live_nodes"),
        "tree/max_live_nodes": max(p["max_live_nodes"] for p in parts),
        "tree/nodes": nodes,
        "tree/leaves": total("leaves"),
        "tree/timed_out_trees": total("timed_out_trees"),
        "tree/sibling_groups": total("sibling_groups"),
        "tree/skipped_sibling_groups": total("skipped_sibling_groups"),
        "tree/node_value": total("node_value_sum") / nodes if nodes else 0.0,
        "tree/sampled_by_turn": by_turn("sampled_by_turn"),
        "tree/pruned_by_turn": by_turn("pruned_by_turn"),
        "tree/live_by_turn": by_turn("live_by_turn"),
    }


def scored_share(results: list[Any], eps: list[Any]) -> dict[str, Any]:
    """The part of a step's share that its scored episodes give, flat or tree alike: rewards,
    outcomes, reward components, the F-beta in force, and per-episode turns, errors, answers."""
    return {
        "rewards": [res.total for res in results],
        "outcomes": [res.outcome for res in results],
        "components": [res.components for res in results],
        "beta": results[0].fbeta_beta if results else None,
        "turns": [len([t for t in e.turns if not t.llm_error]) for e in eps],
        "tool_errors": [e.tool_errors for e in eps],
        "format_errors": [e.format_errors for e in eps],
        "answered": [e.answered for e in eps],
    }
