"""GRPO across processes: the policy under training behind one interface (plain torch AdamW
or a DeepSpeed engine), its frozen KL reference (a copy, shards under ZeRO-3, or a LoRA
policy's adapter switched off), and the collectives a step's ranks share (sums, gathers, a
weights checksum). One process needs none of the collectives: each returns its own value."""

from __future__ import annotations

import json
import os
from typing import Any

from kgsynth.train.core import load_deepspeed_config, rank_and_world, use_gloo_on_cpu
from kgsynth.train.grpo_config import GRPOConfig, warmup_steps


def ds_config(path: str, cfg: GRPOConfig, bf16: bool) -> dict[str, Any]:
    """A ZeRO config with the fields left ``auto`` for Trainer filled from ours."""
    ds = json.loads(json.dumps(load_deepspeed_config(path)))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    fills = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": cfg.micro_batch_size * world,
        "gradient_clipping": cfg.max_grad_norm,
    }
    for k, v in fills.items():
        if ds.get(k, "auto") == "auto":
            ds[k] = v
    if isinstance(ds.get("bf16"), dict) and ds["bf16"].get("enabled") == "auto":
        ds["bf16"]["enabled"] = bf16
    if isinstance(ds.get("fp16"), dict) and ds["fp16"].get("enabled") == "auto":
        ds["fp16"]["enabled"] = False
    zero = ds.get("zero_optimization", {})
    for k, v in list(zero.items()):
        if v == "auto":
            zero[k] = 50_000_000 if "bucket" in k else (1_000_000 if "threshold" in k else 0)
    ds.setdefault("zero_allow_untested_optimizer", True)
    return ds


def init_distributed(device: str) -> bool:
    """Join the launcher's process group (``WORLD_SIZE`` > 1): gloo on CPU, NCCL on CUDA.
    Returns whether this call started it."""
    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return True


def barrier() -> None:
    """Wait for every rank (nothing in one process)."""
    import torch.distributed as dist

    if rank_and_world()[1] > 1:
        dist.barrier()


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order ([obj] in one process)."""
    import torch.distributed as dist

    world = rank_and_world()[1]
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def weights_checksum(module: Any) -> float:
    """A float64 sum over every parameter: equal on all ranks when their weights are."""
    import torch

    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in module.parameters()))


class Policy:
    """The policy under training behind one interface: plain torch or a DeepSpeed engine.
    Data-parallel without DeepSpeed: each rank's gradients are summed over the ranks before
    the step (the loss is normalised by the step's token count over all ranks), so every rank
    takes the step one process would take on all the groups."""

    def __init__(self, model: Any, cfg: GRPOConfig, device: str, bf16: bool):
        import torch

        self.cfg = cfg
        self.module = model
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=float(cfg.lr or 0.0), weight_decay=cfg.weight_decay)
        warm = warmup_steps(cfg)

        def factor(step: int) -> float:
            return min(1.0, (step + 1) / (warm + 1)) if warm else 1.0

        # on the torch optimizer: DeepSpeed's ZeRO optimizer reads its param_groups' lr
        self.sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        self.engine = None
        if cfg.deepspeed:
            import deepspeed

            if device == "cpu":
                use_gloo_on_cpu()
            ds = ds_config(cfg.deepspeed, cfg, bf16)
            self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
            self.module = self.engine.module
        self.optimizer = opt

    def forward_module(self) -> Any:
        return self.engine if self.engine is not None else self.module

    def backward(self, loss: Any, last: bool) -> None:
        if self.engine is not None:
            self.engine.set_gradient_accumulation_boundary(last)
            self.engine.backward(loss, scale_wrt_gas=False)
            self.engine.step()
        else:
            loss.backward()

    def step(self, schedule: bool = True) -> float:
        """One optimizer step; ``schedule``: also advance the learning-rate schedule (once per
        RL step, after its last PPO mini-batch)."""
        import torch

        if self.engine is not None:  # stepped at the boundary in backward()
            norm = self.engine.get_global_grad_norm()
            if schedule:
                self.sched.step()
            return float(norm) if norm is not None else float("nan")
        if rank_and_world()[1] > 1:
            import torch.distributed as dist

            for p in self.module.parameters():
                if not p.requires_grad:
                    continue
                if p.grad is None:  # a rank whose groups all carried no signal
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if schedule:
            self.sched.step()
        return float(norm)


def shard_reference(ref: Any, engine: Any, cfg: GRPOConfig, bf16: bool) -> Any:
    """Under ZeRO-3 the frozen KL reference is partitioned across the ranks like the policy
    (an engine without an optimizer, forward only); under ZeRO-0/1/2 each rank keeps a copy."""
    if engine.zero_optimization_stage() != 3:
        return ref
    import deepspeed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    ds = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "train_batch_size": cfg.micro_batch_size * world,
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": bf16},
    }
    ref_engine, *_ = deepspeed.initialize(model=ref, config=ds)
    ref_engine.eval()
    return ref_engine


class AdapterOff:
    """The KL reference of a LoRA policy: the same model with its adapter switched off."""

    def __init__(self, peft_model: Any):
        self.model = peft_model

    def __call__(self, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(**kwargs)
