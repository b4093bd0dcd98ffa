"""Data-parallel GRPO (``kgsynth train rl --nproc-per-node N``) on CPU through gloo.

One step on 2 ranks, each holding half of the step's groups, must equal one step in one
process on all the groups: the same loss and the same weights (within float rounding), and
both ranks must hold identical weights afterwards. A real 2-process run through torchrun is
tested in ``test_grpo_train.py``."""

from __future__ import annotations

import json
import os
import random
import socket
from pathlib import Path

import pytest

GROUPS, G = 4, 3
TOL = 1e-6  # the loss and statistics: float32 sums taken in another order
PARAM_TOL = 1e-6  # weights after one SGD step at lr 1: the summed gradients themselves


def _model_dir(root: Path) -> Path:
    from tests.kgfixtures import tiny_agent_model

    return Path(tiny_agent_model(root, vocab_size=400))


def _rollouts(vocab: int) -> tuple[list, list]:
    """Fixed token sequences with assistant masks and per-token advantages, as a step's groups."""
    from kgsynth.agent.rollout import Rollout

    rng = random.Random(7)
    rollouts, adv = [], []
    for _ in range(GROUPS * G):
        n = rng.randint(12, 30)
        ids = [rng.randrange(vocab) for _ in range(n)]
        mask = [0] * 6 + [rng.randint(0, 1) for _ in range(n - 6)]
        a = rng.uniform(-1, 1)
        rollouts.append(Rollout(None, ids, mask, [0.0] * n, [0] * n, 6))  # type: ignore[arg-type]
        adv.append([a if m else 0.0 for m in mask])
    return rollouts, adv


def _step(model_dir: str, keep: list[int]) -> tuple[dict, list]:
    import torch
    from transformers import AutoModelForCausalLM

    from kgsynth.train.grpo import GRPOConfig
    from kgsynth.train.grpo import Policy as _Policy
    from kgsynth.train.grpo import update as _update

    torch.manual_seed(0)
    cfg = GRPOConfig(init=model_dir, lr=1e-2, kl_coef=0.05, micro_batch_size=4)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ref = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    policy = _Policy(model, cfg, "cpu", False)
    # plain SGD: the weights move by exactly -lr x the gradient, so comparing weights compares
    # the summed gradients (AdamW's first step, about lr x sign(grad), would magnify rounding
    # in gradients near zero; it is elementwise, so equal gradients give it equal steps)
    policy.optimizer = torch.optim.SGD(policy.module.parameters(), lr=1.0)
    rollouts, adv = _rollouts(model.config.vocab_size)
    stats = _update(
        policy, ref, rollouts, adv, keep, cfg, "cpu", torch.autocast("cpu", enabled=False)
    )
    return stats, [p.detach().clone() for p in policy.module.parameters()]


def _rank(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mine = [i for gi in range(GROUPS) if gi % world == rank for i in range(gi * G, gi * G + G)]
        stats, params = _step(model_dir, mine)
        torch.save({"stats": stats, "params": params}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_take_the_one_process_step(tmp_path):
    import torch
    import torch.multiprocessing as mp

    model_dir = str(_model_dir(tmp_path / "tiny"))
    one_stats, one_params = _step(model_dir, list(range(GROUPS * G)))
    mp.spawn(_rank, args=(2, _free_port(), model_dir, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r in ranks:
        for a, b in zip(r["params"], one_params, strict=True):
            assert torch.allclose(a, b, atol=PARAM_TOL, rtol=0), float((a - b).abs().max())
        for key in ("loss", "kl", "clip_fraction", "trained_tokens"):
            assert r["stats"][key] == pytest.approx(one_stats[key], abs=TOL), key
    for a, b in zip(ranks[0]["params"], ranks[1]["params"], strict=True):
        assert torch.equal(a, b)  # every rank holds the same weights
    # the step moved the weights: the comparison is not between two untouched models
    start = [p.detach() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(
        model_dir).parameters()]  # fmt: skip
    assert any(not torch.allclose(a, b) for a, b in zip(start, one_params, strict=True))
    print(json.dumps({"loss": one_stats["loss"], "tokens": one_stats["trained_tokens"]}))
