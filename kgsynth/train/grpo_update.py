"""One GRPO update on a step's rollouts: micro-batches padded into tensors, the reference's
and (for more than one update) the old policy's log-probs, then the clipped loss over every
assistant token of the step, normalised by their count over all ranks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kgsynth.train.core import all_sum, rank_and_world
from kgsynth.train.grpo_config import GRPOConfig
from kgsynth.train.grpo_dist import Policy, all_gather
from kgsynth.train.grpo_loss import grpo_token_loss, token_logprobs
from kgsynth.train.sft_trainer import masked_logits_supported


def pad_batch(rows: Sequence[Sequence[Any]], fill: Any, dtype: Any, width: int) -> Any:
    import torch

    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=dtype)
    return out


def update(
    policy: Policy,
    ref: Any,
    rollouts: Sequence[Any],
    per_token_adv: Sequence[list[float] | None],
    keep: Sequence[int],
    cfg: GRPOConfig,
    device: str,
    autocast: Any,
) -> dict[str, float]:
    """One GRPO update (or ``updates_per_step``) over the kept rollouts. In a process group
    each rank passes its own rollouts; the loss is normalised by the token count of all ranks,
    and every rank steps together (a rank with nothing kept contributes zero gradients)."""
    import torch

    empty = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": None, "grad_norm": 0.0,
             "trained_tokens": 0, "logprob_mismatch": 0.0, "logprob_mismatch_mean": 0.0}  # fmt: skip
    _, world = rank_and_world()
    local_tokens = sum(sum(rollouts[i].mask) for i in keep)
    total_tokens = int(all_sum([local_tokens], device)[0])
    if total_tokens == 0:  # the same on every rank: no step anywhere
        return empty
    # DeepSpeed averages the ranks' gradients, the plain path sums them
    norm_tokens = total_tokens / world if policy.engine is not None else total_tokens
    micro = [
        list(keep[i : i + cfg.micro_batch_size]) for i in range(0, len(keep), cfg.micro_batch_size)
    ] if local_tokens else []  # fmt: skip

    def tensors(idx: list[int]) -> tuple[Any, ...]:  # ids, attention, mask, advantages, logprobs
        width = max(len(rollouts[i]) for i in idx)
        ids = pad_batch([rollouts[i].ids for i in idx], 0, torch.long, width)
        att = pad_batch([[1] * len(rollouts[i]) for i in idx], 0, torch.long, width)
        mask = pad_batch([rollouts[i].mask for i in idx], 0, torch.long, width)
        adv = pad_batch([per_token_adv[i] or [] for i in idx], 0.0, torch.float32, width)
        old = pad_batch([rollouts[i].logprobs for i in idx], 0.0, torch.float32, width)
        return ids.to(device), att.to(device), mask.to(device), adv.to(device), old.to(device)

    batches = [tensors(idx) for idx in micro]
    if not batches:  # this rank kept nothing: one masked-out row, so it still steps with the rest
        zero = torch.zeros((1, 2), dtype=torch.long, device=device)
        batches = [(zero, torch.ones_like(zero), zero, zero.float(), zero.float())]
    fwd = policy.forward_module()
    # the LM head at the positions that predict a trained token only (the same values there)
    fwd_masked = masked_logits_supported(getattr(fwd, "module", fwd))
    ref_masked = ref is not None and masked_logits_supported(ref)
    ref_lp: dict[int, Any] = {}
    old_lp: dict[int, Any] = {}
    with torch.no_grad(), autocast:
        for k, (ids, att, mask, *_) in enumerate(batches):
            if ref is not None:
                only = mask if ref_masked else None
                ref_lp[k] = token_logprobs(ref, ids, att, cfg.temperature, only)[0].float()
            if cfg.updates_per_step > 1:
                only = mask if fwd_masked else None
                old_lp[k] = token_logprobs(fwd, ids, att, cfg.temperature, only)[0].float()
    # gap: |rollout log-prob - the training forward's| summed over sampled tokens
    sums = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0, "entropy": 0.0,
            "gap": 0.0}  # fmt: skip
    mismatch = 0.0
    norms = []
    for update in range(cfg.updates_per_step):
        for k, (ids, att, mask, adv, rollout_lp) in enumerate(batches):
            with autocast:
                only = mask if fwd_masked else None
                logp, ent = token_logprobs(fwd, ids, att, cfg.temperature, only)
            logp = logp.float()
            old = old_lp[k] if k in old_lp else logp.detach()
            m = mask.bool()
            if update == 0 and m.any():  # the policy that sampled the rollouts, not yet updated
                gap = (logp.detach() - rollout_lp)[m].abs()
                mismatch = max(mismatch, float(gap.max()))
                sums["gap"] += float(gap.sum())
            loss, st = grpo_token_loss(
                logp, old, ref_lp.get(k), adv, mask,
                clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                kl_coef=cfg.kl_coef, total_tokens=norm_tokens,
            )  # fmt: skip
            policy.backward(loss, last=k == len(batches) - 1)
            sums["loss"] += float(loss.detach())
            for name in ("pg", "kl", "clipped", "tokens"):
                sums[name] += float(st[name])
            sums["entropy"] += float((ent * mask).sum())
        norms.append(policy.step())
    keys = ("loss", "pg", "kl", "clipped", "tokens", "entropy", "gap")
    sums = dict(zip(keys, all_sum([sums[k] for k in keys], device), strict=True))
    mismatch = max(all_gather(mismatch))
    if policy.engine is not None:
        sums["loss"] /= world  # each rank's loss was scaled up by the averaging
    n = max(1.0, sums["tokens"])
    return {
        "loss": sums["loss"] / cfg.updates_per_step,
        "kl": sums["kl"] / n,
        "clip_fraction": sums["clipped"] / n,
        "entropy": sums["entropy"] / n if sums["tokens"] else None,
        "grad_norm": sum(norms) / len(norms),
        "trained_tokens": int(total_tokens),
        "logprob_mismatch": mismatch,
        # the alignment check's figure (grpo_step.check_logprobs): the mean over sampled tokens
        "logprob_mismatch_mean": sums["gap"] / total_tokens,
    }
