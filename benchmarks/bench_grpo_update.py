"""The GRPO update's seconds, its micro-batches cut in order of length against in group order.

A GRPO step of ``make learn`` spends most of its time in the update, not the rollouts (run
learn52: 14 s of rollouts, 48 s a step). The update pads each micro-batch to its longest
rollout; a group's 8 rollouts differ by turns, so cut in group order about a quarter of the
positions it computes are padding, and cut in order of length almost none. This times
``kgsynth.train.grpo_update.update`` on the same rollouts both ways, alternating, round by
round, on one thread: the tiny policy as ``make all`` builds it (random weights), rollouts of
the lengths in ``grpo_rollout_lengths.json`` (a real run's free rollouts: per rollout the runs
of environment and policy tokens), random token ids, advantages of +-1. The gradients of the two
orders are the same sum (tests/test_grpo_minibatch.py); only the padding differs.

    .venv/bin/python benchmarks/bench_grpo_update.py [--groups 64] [--rounds 3]

The last line ends with ``ratio: R`` (group order's seconds over length order's, the median of
the rounds).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LENGTHS = HERE / "grpo_rollout_lengths.json"


def rollouts_of(groups: list[list[list[int]]], vocab: int, seed: int = 0) -> tuple[list, list]:
    """Rollouts with the given runs of environment and policy tokens, group after group."""
    from kgsynth.agent.rollout import Rollout

    rng = random.Random(seed)
    rollouts, adv = [], []
    for group in groups:
        for runs in group:
            mask = [k % 2 for k, n in enumerate(runs) for _ in range(n)]
            ids = [rng.randrange(4, vocab) for _ in mask]
            a = rng.choice((1.0, -1.0))
            rollouts.append(Rollout(None, ids, mask, [0.0] * len(ids), [0] * len(ids), runs[0]))  # type: ignore[arg-type]
            adv.append([a if m else 0.0 for m in mask])
    return rollouts, adv


def time_update(model_dir: Path, rollouts: list, adv: list, groups: int, by_length: bool) -> float:
    """Seconds of one ``update`` over every rollout (one mini-batch, micro-batches of 8)."""
    import torch
    from transformers import AutoModelForCausalLM

    from kgsynth.train import grpo_update
    from kgsynth.train.grpo import GRPOConfig, Policy

    cfg = GRPOConfig(init=str(model_dir), lr=1e-4, group_size=8, questions_per_step=groups)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ref = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    policy = Policy(model, cfg, "cpu", False)
    original = grpo_update._micro_batches
    if not by_length:  # the group order: chunks of the mini-batch as it comes
        grpo_update._micro_batches = functools.partial(_in_order, original)
    try:
        started = time.perf_counter()
        grpo_update.update(
            policy, ref, rollouts, adv, list(range(len(rollouts))), cfg, "cpu",
            torch.autocast("cpu", enabled=False), question_of=[i // 8 for i in range(len(rollouts))],
        )  # fmt: skip
        return time.perf_counter() - started
    finally:
        grpo_update._micro_batches = original


def _in_order(original, rollouts, adv, part, cfg, device):
    """``_micro_batches`` on micro-batches cut in the given order (each chunk passed alone, so
    sorting within it changes nothing)."""
    size = cfg.micro_batch_size
    out = []
    for i in range(0, len(part), size):
        out += original(rollouts, adv, part[i : i + size], cfg, device)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=64, help="groups of 8 (64: a rank's share)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    sys.path.insert(0, str(HERE))
    from bench_rollouts import tiny_policy

    data = json.loads(LENGTHS.read_text())
    groups = data["groups"][: args.groups]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_policy(Path(tmp), ["what films did X star in"])
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        rollouts, adv = rollouts_of(groups, vocab)
        positions = sum(len(r) for r in rollouts)
        padded = sum(
            8 * max(len(r) for r in rollouts[i : i + 8]) for i in range(0, len(rollouts), 8)
        )
        print(f"{len(rollouts)} rollouts, {positions:,} tokens ({sum(sum(r.mask) for r in rollouts):,} "
              f"the policy's); in group order micro-batches of 8 pad to {padded:,}")  # fmt: skip
        times: dict[str, list[float]] = {"group order": [], "length order": []}
        for r in range(args.rounds):
            for name, by_length in (("group order", False), ("length order", True)):
                s = time_update(model_dir, rollouts, adv, len(groups), by_length)
                times[name].append(s)
                print(f"round {r + 1}: {name:<12} {s:6.2f} s ({positions / s:,.0f} tokens/s)")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"update seconds (median of {args.rounds}): group order {med['group order']:.2f}, "
          f"length order {med['length order']:.2f}; ratio: {med['group order'] / med['length order']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
