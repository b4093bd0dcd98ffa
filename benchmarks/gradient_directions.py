"""Where stage 2's SFT and GRPO's first step push a policy, and how noisy each push is.

At a policy's weights this computes four mean gradients, one example (or one group) at a time:

- ``sft``: the SFT loss on a corpus (``--corpus``, e.g. ``RUN/corpus_stage2/accepted.parquet``),
  per trajectory the summed token loss of its trained tokens;
- ``rft``: SFT on the policy's own successful samples (``--rollouts``, rollouts of the policy
  at its training temperature, several a question): rejection-sampling fine-tuning, stage 2's
  free-rollout half before the repeat filter;
- ``pg+``: the successes' part of ``pg`` alone (each success weighted by its advantage, the
  failures left out): SFT weighted the way GRPO weighs a success;
- ``pg``: GRPO's first step on the same samples, per question group the sum over its rollouts
  of the group-normalized advantage times the rollout's log-likelihood gradient (at the start
  the ratio is 1 and the KL 0, so this is the update's direction); groups whose rewards all tie
  give nothing and are left out, as dynamic sampling leaves them out.

Each is reported with its gradient noise scale ``B = tr(Sigma) / |G|^2`` (McCandlish et al.
2018, "An Empirical Model of Large-Batch Training": the batch size, in examples, at which the
noise of a mini-batch's gradient is as large as the gradient itself; both terms unbiased), the
cosine between the means of two random halves of its examples (how reproducible the direction
is at this sample size) and the cosines between the means. A rollout's reward is Hits@1, its
first predicted answer among the gold ones compared case-folded (GRPO's ``hits_at_1`` reward,
which may also take a near name under ``answer_matching: near``).

    .venv/bin/python benchmarks/gradient_directions.py --model RUN/stage1 \\
        --corpus RUN/corpus_stage2/accepted.parquet --rollouts FREE.parquet [--limit 400]

``FREE.parquet``: ``kgsynth synthesize trajectories --section free_rollouts --llm hf --model
RUN/stage1 --samples 8 --temperature 1.0 ...``. Prints one table; ``--json F`` writes it too.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


class Moments:
    """Running sums of per-example gradient vectors: their mean, their noise scale, and the
    means of two random halves."""

    def __init__(self, seed: int = 0) -> None:
        self.n = 0
        self.total: Any = None
        self.halves: list[Any] = [None, None]
        self.counts = [0, 0]
        self.sq = 0.0  # sum of |g_i|^2
        self.rng = random.Random(seed)

    def add(self, g: Any) -> None:
        half = self.rng.randrange(2)
        self.total = g.clone() if self.total is None else self.total + g
        self.halves[half] = g.clone() if self.halves[half] is None else self.halves[half] + g
        self.counts[half] += 1
        self.sq += float(g.dot(g))
        self.n += 1

    def mean(self) -> Any:
        return self.total / self.n

    def noise_scale(self) -> tuple[float, float, float]:
        """``(|G|^2, tr(Sigma), B)``, unbiased: with n examples, E|mean|^2 = |G|^2 + tr/n."""
        n = self.n
        if n < 2:
            return math.nan, math.nan, math.nan
        mean_sq = float(self.mean().dot(self.mean()))
        per = self.sq / n
        trace = n / (n - 1) * (per - mean_sq)
        signal = mean_sq - trace / n
        return signal, trace, (trace / signal if signal > 0 else math.inf)

    def split_cosine(self) -> float:
        if min(self.counts) == 0:
            return math.nan
        a = self.halves[0] / self.counts[0]
        b = self.halves[1] / self.counts[1]
        return cosine(a, b)


def cosine(a: Any, b: Any) -> float:
    na, nb = float(a.norm()), float(b.norm())
    return float(a.dot(b)) / (na * nb) if na > 0 and nb > 0 else math.nan


def group_advantages(rewards: Sequence[float]) -> list[float] | None:
    """GRPO's group-normalized advantages (:func:`kgsynth.train.grpo_loss.group_advantages`);
    None when the rewards all tie (GRPO's ``degenerate`` group)."""
    from kgsynth.train import grpo_loss

    return None if grpo_loss.degenerate(rewards) else grpo_loss.group_advantages(rewards)


def hits_at_1(row: dict[str, Any]) -> float:
    pred = row.get("predicted_answers") or []
    gold = {g.casefold() for g in row.get("gold_answers") or []}
    return float(bool(pred) and pred[0].casefold() in gold)


def grouped(rows: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rollouts grouped by question, in first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["question_id"], []).append(row)
    return list(groups.values())


def flat_grad(model: Any) -> Any:
    import torch

    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def summed_logprob_grad(model: Any, tokenizer: Any, messages: Sequence[dict[str, Any]]) -> Any:
    """The gradient of the summed log-likelihood of ``messages``' trained tokens."""
    import torch

    from kgsynth.agent.render import render_messages
    from kgsynth.train.grpo_loss import token_logprobs

    r = render_messages(tokenizer, messages)
    model.zero_grad(set_to_none=False)
    logp, _ = token_logprobs(model, torch.tensor([r.input_ids]), None)
    (logp * torch.tensor([r.loss_mask], dtype=logp.dtype)).sum().backward()
    return flat_grad(model)


def measure(
    model: Any,
    tokenizer: Any,
    corpus: list[list[dict[str, Any]]],
    groups: list[list[dict[str, Any]]],
    progress: Callable[[str], None] = lambda _s: None,
) -> dict[str, Any]:
    """The four directions' statistics (module docstring) and their cosines."""
    sft, rft, pos, pg = Moments(1), Moments(2), Moments(4), Moments(3)
    for i, messages in enumerate(corpus):
        sft.add(-summed_logprob_grad(model, tokenizer, messages))  # the SFT loss's gradient
        if i % 200 == 199:
            progress(f"sft {i + 1}/{len(corpus)}")
    informative = 0
    for i, group in enumerate(groups):
        rewards = [hits_at_1(r) for r in group]
        adv = group_advantages(rewards)
        pg_sum = pos_sum = None
        for k, (row, r) in enumerate(zip(group, rewards, strict=True)):
            if r <= 0 and adv is None:
                continue
            g = summed_logprob_grad(model, tokenizer, row["messages"])
            if r > 0:
                rft.add(-g)
            if adv is not None:
                pg_sum = -adv[k] * g if pg_sum is None else pg_sum - adv[k] * g
                if adv[k] > 0:
                    pos_sum = -adv[k] * g if pos_sum is None else pos_sum - adv[k] * g
        if pg_sum is not None:
            pg.add(pg_sum)
            pos.add(pos_sum)
            informative += 1
        if i % 100 == 99:
            progress(f"groups {i + 1}/{len(groups)}")
    out: dict[str, Any] = {"examples": {}, "cosines": {}}
    directions = (("sft", sft), ("rft", rft), ("pg+", pos), ("pg", pg))
    for name, mom in directions:
        signal, trace, scale = mom.noise_scale()
        out["examples"][name] = {
            "n": mom.n,
            "grad_norm": math.sqrt(signal) if signal > 0 else 0.0,
            "trace": trace,
            "noise_scale": scale,
            "split_cosine": mom.split_cosine(),
        }
    means = {k: m.mean() for k, m in directions if m.n}
    for a, b in (("sft", "rft"), ("sft", "pg"), ("rft", "pg"), ("pg+", "pg"), ("rft", "pg+")):
        if a in means and b in means:
            out["cosines"][f"{a}-{b}"] = cosine(means[a], means[b])
    out["groups"] = len(groups)
    out["informative_groups"] = informative
    return out


def table(res: dict[str, Any]) -> str:
    lines = [
        "| direction | examples | |G| | tr(Sigma) | noise scale B | half-split cosine |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in res["examples"].items():
        lines.append(
            f"| {name} | {e['n']:,} | {e['grad_norm']:.4g} | {e['trace']:.4g} | "
            f"{e['noise_scale']:.4g} | {e['split_cosine']:.3f} |"
        )
    lines.append("")
    lines.append(
        "cosines: "
        + ", ".join(f"{k} {v:.3f}" for k, v in res["cosines"].items())
        + f"; informative groups {res['informative_groups']:,} of {res['groups']:,}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="the policy checkpoint")
    ap.add_argument("--corpus", type=Path, required=True, help="an SFT corpus (Parquet)")
    ap.add_argument("--rollouts", type=Path, required=True, help="the policy's free rollouts")
    ap.add_argument(
        "--limit", type=int, default=None, help="at most this many corpus rows and question groups"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)

    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.train.data import read_corpus

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.train(False)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    corpus = read_corpus(args.corpus)
    cols = ["question_id", "messages", "predicted_answers", "gold_answers"]
    groups = grouped(pq.read_table(args.rollouts, columns=cols).to_pylist())
    rng = random.Random(args.seed)
    rng.shuffle(corpus)
    rng.shuffle(groups)
    if args.limit:
        corpus, groups = corpus[: args.limit], groups[: args.limit]
    res = measure(model, tokenizer, corpus, groups, lambda s: print(s, file=sys.stderr))
    res.update(model=str(args.model), corpus=str(args.corpus), rollouts=str(args.rollouts))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    print(table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
