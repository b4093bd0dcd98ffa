"""Resuming a killed GRPO run, plain or DeepSpeed, on one rank or several.

Every ``--save-steps`` step the run writes ``checkpoints/step-N`` in this order; the folder is
resumed from only once its last file exists, so a checkpoint killed mid-write is skipped:

1. the ``save_pretrained`` weights (rank 0; gathered under ZeRO-3: :func:`save_model`);
2. every rank's RNG states, ``rng/rank-R.pt`` (torch, Python, NumPy, CUDA);
3. under DeepSpeed, every rank's engine checkpoint in ``deepspeed/`` through the engine's own
   ``save_checkpoint`` (the module, each rank's partition of the optimizer state and its fp32
   master weights, the engine's step counters); it ends at a barrier of all ranks;
4. rank 0's ``resume_state.pt``, atomically, once every rank is done: the run's configuration
   and world size, the optimizer of a plain run, the LR scheduler, the step, the question order
   and cursor, the curriculum (reward) state, the metrics so far and a LoRA run's adapter.

Running the same command again (without ``--overwrite``) calls :func:`resume` on every rank:
the weights come from the folder (and, under DeepSpeed, the engine's ``load_checkpoint``),
the rest from the files above.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path
from typing import Any

from kgsynth.core.config import config_from_record, config_record
from kgsynth.core.errors import ConfigError, KGSynthError
from kgsynth.train.grpo_config import RESUME_STATE
from kgsynth.train.grpo_dist import barrier
from kgsynth.train.grpo_run import RLQuestion, save_model, save_resume_state
from kgsynth.train.grpo_step import LoopState, Run

log = logging.getLogger(__name__)

DEEPSPEED_DIR = "deepspeed"  # in checkpoints/step-N: the engine's own checkpoint
DEEPSPEED_TAG = "state"  # the engine's tag (its sub-folder); one per checkpoint folder
RNG_DIR = "rng"  # in checkpoints/step-N: rank-R.pt, each rank's RNG states


def rng_states() -> dict[str, Any]:
    """This process's global RNG states: torch (and CUDA's), Python's and NumPy's."""
    import numpy as np
    import torch

    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Put back what :func:`rng_states` returned."""
    import numpy as np
    import torch

    torch.set_rng_state(states["torch"].cpu())
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])


def _rng_file(folder: Path, rank: int) -> Path:
    return folder / RNG_DIR / f"rank-{rank}.pt"


def resume_state(run: Run, st: LoopState, step_i: int) -> dict[str, Any]:
    """What :func:`resume` reads back from rank 0's file: everything a killed run needs to go
    on after ``step_i`` that every rank shares (a DeepSpeed run's optimizer is in the engine's
    checkpoint, partitioned by rank)."""
    cfg, policy = run.cfg, run.policy
    return {
        "step": step_i, "config": config_record(cfg), "world_size": run.world,
        # the weights are the folder's; a LoRA run's adapter is kept here
        "adapter": {n: p.detach().cpu() for n, p in
                    policy.module.named_parameters() if p.requires_grad}
        if cfg.lora_r else None,
        "optimizer": policy.optimizer.state_dict() if policy.engine is None else None,
        "deepspeed": DEEPSPEED_TAG if policy.engine is not None else None,
        "scheduler": policy.sched.state_dict(), "rng": st.rng.getstate(),
        "order": st.order, "cursor": st.cursor, "phase": st.phase,
        "reward_state": dataclasses.asdict(st.reward_state), "history": st.history,
        "totals": st.totals,
    }  # fmt: skip


def save_checkpoint(run: Run, st: LoopState, step_i: int, folder: Path) -> None:
    """``checkpoints/step-N``: weights, every rank's RNG states and DeepSpeed shards, then
    rank 0's resume state, last. Every rank calls it."""
    import torch

    if run.rank == 0:  # a folder rewritten after a resume is not whole until the end again
        (folder / RESUME_STATE).unlink(missing_ok=True)
    save_model(run.policy, run.tok, folder, run.rcfg.system_text, run.tool_cfg)
    rng = _rng_file(folder, run.rank)
    rng.parent.mkdir(parents=True, exist_ok=True)
    torch.save(rng_states(), rng)
    engine = run.policy.engine
    if engine is not None:  # every rank writes its own partition; ends at a barrier
        engine.save_checkpoint(str(folder / DEEPSPEED_DIR), tag=DEEPSPEED_TAG, save_latest=False)
    barrier()  # every rank's files are written before the marker
    if run.rank == 0:
        save_resume_state(folder, resume_state(run, st, step_i))


def resume(run: Run, st: LoopState, folder: Path, phase2: list[RLQuestion] | None) -> None:
    """Load a killed run's checkpoint on this rank: the DeepSpeed engine's state (module,
    partitioned optimizer, step counters) or a plain run's optimizer, the scheduler, question
    order, curriculum, metrics so far and this rank's RNG states (the weights of a plain run
    came from the folder; a LoRA run's adapter is in the resume state)."""
    import torch

    from kgsynth.agent.rewards import RewardState

    cfg, policy = run.cfg, run.policy
    saved = torch.load(folder / RESUME_STATE, map_location=run.device, weights_only=False)
    if _recorded(saved["config"]) != config_record(cfg):
        raise ConfigError(
            f"{run.spec.out} holds an interrupted RL run with another configuration; pass "
            "--overwrite to start again, or rerun it with its own options"
        )
    world = saved.get("world_size")
    if policy.engine is not None and world is not None and world != run.world:
        raise ConfigError(
            f"{run.spec.out} holds an interrupted DeepSpeed RL run of {world} processes, whose "
            f"optimizer state is partitioned {world} ways; resume it with --nproc-per-node "
            f"{world} (this run has {run.world}), or pass --overwrite to start again"
        )
    if cfg.lora_r:
        policy.module.load_state_dict(saved["adapter"], strict=False)
    if policy.engine is not None:
        path, _ = policy.engine.load_checkpoint(
            str(folder / DEEPSPEED_DIR), tag=saved["deepspeed"], load_optimizer_states=True,
            load_lr_scheduler_states=False,
        )  # fmt: skip
        if path is None:
            raise ConfigError(f"{folder / DEEPSPEED_DIR}: DeepSpeed could not load its checkpoint")
    else:
        policy.optimizer.load_state_dict(saved["optimizer"])
    policy.sched.load_state_dict(saved["scheduler"])
    # the learning rate the next step uses is the scheduler's, whatever the engine restored
    for group, lr in zip(policy.optimizer.param_groups, policy.sched.get_last_lr(), strict=True):
        group["lr"] = lr
    st.rng.setstate(saved["rng"])
    st.order, st.cursor, st.phase = saved["order"], saved["cursor"], saved["phase"]
    if st.phase == 2 and phase2 is not None:
        st.qs = phase2
    st.reward_state = RewardState(**saved["reward_state"])
    st.history, st.totals = saved["history"], saved["totals"]
    st.first_step = saved["step"] + 1
    rng = _rng_file(folder, run.rank)
    if rng.is_file():  # checkpoints written before the RNG states were kept have none
        set_rng_states(torch.load(rng, weights_only=False))
    log.info("resuming RL from %s (step %d, rank %d)", folder, saved["step"], run.rank)


def _recorded(config: Any) -> dict[str, Any] | None:
    """A resume state's config as :func:`config_record` writes it, from either layout (flat,
    or the agent nested as ``dataclasses.asdict`` writes it); None when it is no config."""
    from kgsynth.train.grpo_config import GRPOConfig

    try:
        return config_record(config_from_record(GRPOConfig, config))
    except (KGSynthError, TypeError, AttributeError):
        return None
