"""A GRPO update on a step's rollouts: the step's questions cut into PPO mini-batches, each
padded into micro-batch tensors; the reference's and (for more than one optimizer step) the old
policy's log-probs; then ``ppo_epochs`` passes, one optimizer step per mini-batch, each on the
clipped loss over the mini-batch's assistant tokens, aggregated as ``loss_agg`` says and
normalised by the mini-batch's tokens (or sequences) over all ranks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kgsynth.train.core import all_sum, rank_and_world
from kgsynth.train.grpo_config import GRPOConfig, mini_batch_questions
from kgsynth.train.grpo_dist import Policy, all_gather
from kgsynth.train.grpo_loss import grpo_token_loss, token_logprobs
from kgsynth.train.sft_trainer import masked_logits_supported


def pad_batch(rows: Sequence[Sequence[Any]], fill: Any, dtype: Any, width: int) -> Any:
    import torch

    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=dtype)
    return out


def mini_batches(
    keep: Sequence[int], question_of: Sequence[int] | None, cfg: GRPOConfig
) -> list[list[int]]:
    """The kept rollouts by PPO mini-batch: the rollouts of the step's question ``gi`` (its
    index among the step's questions, ``question_of[i]``) go to mini-batch
    ``gi // mini_batch_questions``, so every rank cuts the step at the same questions and has
    the same number of mini-batches (some perhaps empty here). Without ``question_of`` the
    step must be one mini-batch."""
    size = mini_batch_questions(cfg)
    n = math.ceil(int(cfg.questions_per_step or 1) / size)
    if question_of is None:
        if n > 1:
            raise ValueError("update: ppo_mini_batch below the step needs each rollout's question")
        return [list(keep)]
    parts: list[list[int]] = [[] for _ in range(n)]
    for i in keep:
        parts[min(question_of[i] // size, n - 1)].append(i)
    return parts


def sequences(row: Any) -> list[tuple[int, int]]:
    """The token spans of a training row that are one sequence each for ``seq-mean-token-mean``
    and hold a masked token: a tree row's steps (``segments``), else the whole row."""
    spans = getattr(row, "segments", None) or [(0, len(row.ids))]
    return [(s, e) for s, e in spans if any(row.mask[s:e])]


def token_weights(row: Any) -> list[float]:
    """1 / the length (masked tokens) of the sequence each token belongs to; 0 elsewhere."""
    weights = [0.0] * len(row.ids)
    for s, e in sequences(row):
        weights[s:e] = [1.0 / sum(row.mask[s:e])] * (e - s)
    return weights


def _tensors(rollouts: Sequence[Any], adv: Sequence[Any], idx: list[int], device: str) -> tuple:
    """One micro-batch padded: ids, attention, mask, per-token advantages, rollout log-probs
    and the tokens' weights in a per-sequence mean."""
    import torch

    width = max(len(rollouts[i]) for i in idx)
    ids = pad_batch([rollouts[i].ids for i in idx], 0, torch.long, width)
    att = pad_batch([[1] * len(rollouts[i]) for i in idx], 0, torch.long, width)
    mask = pad_batch([rollouts[i].mask for i in idx], 0, torch.long, width)
    advs = pad_batch([adv[i] or [] for i in idx], 0.0, torch.float32, width)
    old = pad_batch([rollouts[i].logprobs for i in idx], 0.0, torch.float32, width)
    weights = pad_batch([token_weights(rollouts[i]) for i in idx], 0.0, torch.float32, width)
    return tuple(t.to(device) for t in (ids, att, mask, advs, old, weights))


def _micro_batches(
    rollouts: Sequence[Any], adv: Sequence[Any], part: list[int], cfg: GRPOConfig, device: str
) -> list[tuple]:
    """A mini-batch's micro-batch tensors, its rollouts cut in order of length (the loss is
    a sum over the mini-batch, so the order changes nothing but the padding: a group's
    rollouts differ by turns, and padded to the group's longest a step's update computed
    about a quarter more positions); where this rank holds none of it, one masked-out row, so
    that it still takes the optimizer step with the other ranks."""
    import torch

    size = cfg.micro_batch_size
    if any(sum(rollouts[i].mask) for i in part):
        by_length = sorted(part, key=lambda i: len(rollouts[i]))
        chunks = [by_length[i : i + size] for i in range(0, len(by_length), size)]
        return [_tensors(rollouts, adv, c, device) for c in chunks]
    zero = torch.zeros((1, 2), dtype=torch.long, device=device)
    return [(zero, torch.ones_like(zero), zero, zero.float(), zero.float(), zero.float())]


def _fixed_logprobs(
    fwd: Any, ref: Any, batches: list[list[tuple]], cfg: GRPOConfig, autocast: Any
) -> tuple[dict, dict]:
    """The reference's log-probs of every micro-batch and, with ``fwd``, the policy's before
    any step (the old log-probs of every step after the first), keyed (mini-batch, micro)."""
    import torch

    fwd_masked = fwd is not None and masked_logits_supported(getattr(fwd, "module", fwd))
    ref_masked = ref is not None and masked_logits_supported(ref)
    ref_lp: dict[tuple[int, int], Any] = {}
    old_lp: dict[tuple[int, int], Any] = {}
    with torch.no_grad(), autocast:
        for m, micro in enumerate(batches):
            for k, (ids, att, mask, *_) in enumerate(micro):
                if ref is not None:
                    only = mask if ref_masked else None
                    ref_lp[m, k] = token_logprobs(ref, ids, att, cfg.temperature, only)[0].float()
                if fwd is not None:
                    only = mask if fwd_masked else None
                    old_lp[m, k] = token_logprobs(fwd, ids, att, cfg.temperature, only)[0].float()
    return ref_lp, old_lp


def update(
    policy: Policy,
    ref: Any,
    rollouts: Sequence[Any],
    per_token_adv: Sequence[list[float] | None],
    keep: Sequence[int],
    cfg: GRPOConfig,
    device: str,
    autocast: Any,
    question_of: Sequence[int] | None = None,
) -> dict[str, float]:
    """The step's GRPO update over the kept rollouts: ``ppo_epochs`` passes, one optimizer
    step per PPO mini-batch (:func:`mini_batches`; ``question_of[i]``: rollout i's question
    among the step's). In a process group each rank passes its own rollouts; a mini-batch's
    loss is normalised by its tokens (or sequences) over all ranks, and every rank steps
    together (a rank with none of a mini-batch contributes zero gradients). A mini-batch
    with no assistant token on any rank takes no step; the learning-rate schedule advances
    once per RL step that took one."""

    empty = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": None, "grad_norm": 0.0,
             "trained_tokens": 0, "logprob_mismatch": 0.0, "logprob_mismatch_mean": 0.0}  # fmt: skip
    _, world = rank_and_world()
    parts = mini_batches(keep, question_of, cfg)
    local: list[float] = []  # each mini-batch's assistant tokens and sequences on this rank
    for p in parts:
        local += [
            sum(sum(rollouts[i].mask) for i in p),
            sum(len(sequences(rollouts[i])) for i in p),
        ]
    totals = [float(v) for v in all_sum(local, device)]
    # (tokens, sequences) of each mini-batch over all ranks; the same list on every rank
    plan = [(parts[m], totals[2 * m], totals[2 * m + 1]) for m in range(len(parts))]
    plan = [x for x in plan if x[1] > 0]
    total_tokens = int(sum(x[1] for x in plan))
    if not plan:  # the same on every rank: no step anywhere
        return empty
    # DeepSpeed averages the ranks' gradients, the plain path sums them
    scale = world if policy.engine is not None else 1
    batches = [_micro_batches(rollouts, per_token_adv, p, cfg, device) for p, _, _ in plan]
    fwd = policy.forward_module()
    # the LM head at the positions that predict a trained token only (the same values there)
    fwd_masked = masked_logits_supported(getattr(fwd, "module", fwd))
    several = len(plan) * cfg.ppo_epochs > 1  # later steps need the sampling policy's log-probs
    ref_lp, old_lp = _fixed_logprobs(fwd if several else None, ref, batches, cfg, autocast)
    # gap: |rollout log-prob - the training forward's| summed over sampled tokens
    sums = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0, "entropy": 0.0,
            "gap": 0.0}  # fmt: skip
    mismatch = 0.0
    norms = []
    for epoch in range(cfg.ppo_epochs):
        for m, (micro, (_, tokens, seqs)) in enumerate(zip(batches, plan, strict=True)):
            for k, (ids, att, mask, adv, rollout_lp, weights) in enumerate(micro):
                with autocast:
                    only = mask if fwd_masked else None
                    logp, ent = token_logprobs(fwd, ids, att, cfg.temperature, only)
                logp = logp.float()
                old = old_lp[m, k] if (m, k) in old_lp else logp.detach()
                msk = mask.bool()
                if epoch == 0 and msk.any():  # the policy that sampled the rollouts
                    gap = (old - rollout_lp)[msk].abs()
                    mismatch = max(mismatch, float(gap.max()))
                    sums["gap"] += float(gap.sum())
                loss, st = grpo_token_loss(
                    logp, old, ref_lp.get((m, k)), adv, mask,
                    clip_low=cfg.clip_low, clip_high=cfg.clip_high, kl_coef=cfg.kl_coef,
                    total_tokens=tokens / scale, loss_agg=cfg.loss_agg, total_seqs=seqs / scale,
                    token_weights=weights,
                )  # fmt: skip
                policy.backward(loss, last=k == len(micro) - 1)
                sums["loss"] += float(loss.detach())
                for name in ("pg", "kl", "clipped", "tokens"):
                    sums[name] += float(st[name])
                sums["entropy"] += float((ent * mask).sum())
            last = epoch == cfg.ppo_epochs - 1 and m == len(batches) - 1
            norms.append(policy.step(schedule=last))
    keys = ("loss", "pg", "kl", "clipped", "tokens", "entropy", "gap")
    sums = dict(zip(keys, all_sum([sums[k] for k in keys], device), strict=True))
    mismatch = max(all_gather(mismatch))
    if policy.engine is not None:
        sums["loss"] /= world  # each rank's loss was scaled up by the averaging
    n = max(1.0, sums["tokens"])
    return {
        "loss": sums["loss"] / len(norms),
        "kl": sums["kl"] / n,
        "clip_fraction": sums["clipped"] / n,
        "entropy": sums["entropy"] / n if sums["tokens"] else None,
        "grad_norm": sum(norms) / len(norms),
        "optimizer_steps": len(norms),
        "trained_tokens": total_tokens,
        "logprob_mismatch": mismatch,
        # the alignment check's figure (grpo_step.check_logprobs): the mean over sampled tokens
        "logprob_mismatch_mean": sums["gap"] / total_tokens,
    }
