"""GRPO's math, pure and checked against hand-computed values by the tests: group-normalised
advantages (per rollout, or KG-R1's per turn), their spread over a rollout's tokens, the
clipped token-level loss with the k3 KL, and per-token log-probabilities."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def group_advantages(
    rewards: Sequence[float], *, scale: bool = True, eps: float = 1e-6
) -> list[float]:
    """GRPO's group-normalized advantages: ``(R - mean) / (std + eps)`` (population std), or
    ``R - mean`` without ``scale``."""
    n = len(rewards)
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / n)
    return [c / (std + eps) for c in centred]


def degenerate(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """A group whose rewards are all equal: every advantage is zero, nothing to learn."""
    return max(rewards) - min(rewards) <= tol


def token_advantages(
    turn_of: Sequence[int], turn_adv: Sequence[float] | None, advantage: float = 0.0
) -> list[float]:
    """Per-token advantage of one rollout: the token's turn advantage when ``turn_adv`` is
    given (KG-R1's turn-wise advantage; a turn beyond it gets 0), else the sequence's
    ``advantage`` on every assistant token; zero on tokens outside assistant turns."""
    out = []
    for t in turn_of:
        if t < 0:
            out.append(0.0)
        elif turn_adv is not None:
            out.append(turn_adv[t] if t < len(turn_adv) else 0.0)
        else:
            out.append(advantage)
    return out


def grpo_token_loss(
    logp: Any,
    old_logp: Any,
    ref_logp: Any | None,
    advantages: Any,
    mask: Any,
    *,
    clip_low: float,
    clip_high: float,
    kl_coef: float,
    total_tokens: int | float,
    loss_agg: str = "token-mean",
    total_seqs: int | float = 0,
    token_weights: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """The clipped surrogate with asymmetric clip and the k3 KL per masked token, aggregated
    as ``loss_agg`` says. ``token-mean``: summed over masked tokens and divided by
    ``total_tokens`` (the mini-batch's assistant tokens, so micro-batches add up to the
    token-level mean). ``seq-mean-token-mean``: each row's mean over its masked tokens, summed
    and divided by ``total_seqs`` (the mini-batch's rows with a masked token): the
    ``1/N sum_i 1/|tau_i| sum_j`` of GraphWalker Eq. 4 and ISP-KGR App. G.1; where a row
    holds several sequences (a tree row's steps), ``token_weights`` gives each masked token
    1 / its sequence's length instead. Returns the loss and detached sums for the metrics."""
    import torch

    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    surr1 = ratio * advantages
    surr2 = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    pg = -torch.minimum(surr1, surr2)
    clipped = (surr2 < surr1).to(logp.dtype)  # the clip was the active side
    per_token = pg
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        diff = ref_logp - logp
        kl = torch.exp(diff) - diff - 1.0
        per_token = pg + kl_coef * kl
    if loss_agg == "token-mean":
        loss = (per_token * mask).sum() / total_tokens
    elif loss_agg == "seq-mean-token-mean" and token_weights is not None:
        loss = (per_token * mask * token_weights).sum() / (total_seqs or 1)
    elif loss_agg == "seq-mean-token-mean":
        lengths = mask.sum(-1)
        per_seq = (per_token * mask).sum(-1) / lengths.clamp(min=1.0)
        loss = per_seq.sum() / (total_seqs or 1)
    else:
        raise ValueError(f"loss_agg must be token-mean or seq-mean-token-mean (got {loss_agg!r})")
    stats = {
        "pg": (pg * mask).sum().detach(),
        "kl": (kl * mask).sum().detach(),
        "clipped": (clipped * mask).sum().detach(),
        "tokens": mask.sum().detach(),
    }
    return loss, stats


def token_logprobs(
    model: Any, ids: Any, attention: Any, temperature: float = 1.0, mask: Any = None
) -> tuple[Any, Any]:
    """Log-prob of each token given the ones before (position 0 gets 0) and the entropy of
    the predicted distribution there, both (batch, length). With ``mask`` (batch, length;
    the model must take a bool ``logits_to_keep``, :func:`~kgsynth.train.sft_trainer.
    masked_logits_supported`) the LM head runs only where a masked token is predicted; the
    other positions read 0."""
    import torch
    import torch.nn.functional as F

    if mask is None:
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        targets = ids[:, 1:]
    else:
        scored = mask[:, 1:].bool()  # the tokens scored, from position 1
        keep = F.pad(scored, (0, 1), value=False)  # the positions that predict them
        logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=keep).logits
        targets = ids[:, 1:][scored]
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    if mask is not None:  # back to (batch, length - 1)
        zeros = torch.zeros(scored.shape, dtype=logp.dtype, device=logp.device)
        logp, entropy = zeros.masked_scatter(scored, logp), zeros.masked_scatter(scored, entropy)
    pad = torch.zeros((ids.shape[0], 1), dtype=logp.dtype, device=logp.device)
    return torch.cat([pad, logp], dim=1), torch.cat([pad, entropy.detach()], dim=1)


def step_advantages(
    rollouts: Sequence[Any],
    results: Sequence[Any],
    group_size: int,
    *,
    turn_advantage: bool,
    turn_lambda: float,
    scale: bool,
) -> tuple[list[list[float] | None], int]:
    """Per-token advantages of a step's rollouts (laid out group after group, ``group_size``
    each; ``results`` their reward results) and the number of groups skipped for carrying no
    signal (``None`` advantages). With ``turn_advantage`` (KG-R1) each turn gets
    ``G_t = r_t + turn_lambda * R`` against one baseline pooled over the group's turns."""
    from kgsynth.agent.rewards import pooled_turn_advantages, turn_returns

    per_token: list[list[float] | None] = [None] * len(rollouts)
    skipped = 0
    for start in range(0, len(rollouts), group_size):
        idx = list(range(start, start + group_size))
        if turn_advantage:
            returns = [
                turn_returns(results[i].turn_rewards, results[i].trajectory_total, turn_lambda)
                for i in idx
            ]
            if degenerate([v for r in returns for v in r] or [0.0]):
                skipped += 1
                continue
            turn_adv = pooled_turn_advantages(returns, scale=scale)
            for j, i in enumerate(idx):
                per_token[i] = token_advantages(rollouts[i].turn_of, turn_adv[j])
            continue
        group_r = [results[i].total for i in idx]
        if degenerate(group_r):
            skipped += 1
            continue
        adv = group_advantages(group_r, scale=scale)
        for j, i in enumerate(idx):
            per_token[i] = token_advantages(rollouts[i].turn_of, None, adv[j])
    return per_token, skipped
