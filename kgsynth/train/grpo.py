"""GRPO of the agent policy against the live KG (``kgsynth train rl``).

questions.parquet (or any question file :mod:`kgsynth.datasets.qafiles` reads) + a KG + an SFT
checkpoint -> ``OUT/``: a ``save_pretrained`` folder, ``checkpoints/step-N`` folders,
``metrics.jsonl`` (one line per step), ``rl.png`` (reward and KL curves),
``rl_summary.json`` and (written by the CLI) ``manifest.json``::

    kgsynth train rl --questions q.parquet --kg runs/x/kg --init runs/x/stage2 --out runs/x/rl

The loop is written here rather than on TRL's GRPOTrainer: rollouts are multi-turn with the
project's own text protocol and tool environment, kept token-in/token-out
(:mod:`kgsynth.agent.rollout`), and the loss needs per-token advantages (KG-R1's turn-level
advantage) and a reward registry with state (KnowCoder-A1's F-beta curriculum); a plain loop
of about the size of those adapters keeps the core readable. Each step:

1. ``questions_per_step`` questions, ``group_size`` rollouts each, sampled together. With
   ``rollout = tree`` (ISP-KGR) each question grows a rollout tree instead and steps 2-3 are
   step-level: :mod:`kgsynth.train.grpo_tree`.
2. Rewards (:mod:`kgsynth.agent.rewards`): the configured weighted sum, every component logged.
3. Advantages: ``A_i = R_i - mean(R)`` of the group, divided by the group's std when
   ``scale_rewards`` (GRPO; Dr. GRPO and KBQA-R1 turn it off); groups whose rewards are all
   equal carry no signal and are skipped (counted). With ``turn_advantage`` (KG-R1; ISP's
   step-level GRPO) each assistant turn t of rollout i gets its own return
   ``G_it = r_it + turn_lambda * R_i`` (``r_it``: the turn-level rewards; ``R_i``: the
   trajectory-level ones) and the advantage ``G_it - mean(G)`` (over every turn of every
   rollout of the group: one pooled baseline), divided by the pooled std when
   ``scale_rewards``; the tokens of turn t carry it.
4. Loss over assistant tokens only:
   ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + kl_coef * k3`` per token, with
   ``r = exp(logp - logp_old)`` and ``k3 = exp(ref - logp) - (ref - logp) - 1`` against the
   frozen init model, averaged over a PPO mini-batch's tokens (``loss_agg = token-mean``,
   DAPO) or per sequence then over sequences (``seq-mean-token-mean``, GraphWalker Eq. 4).
   The step's questions are cut into mini-batches of ``ppo_mini_batch`` questions, one
   optimizer step each, ``ppo_epochs`` passes. One optimizer step in all (KnowCoder-A1's
   on-policy single update) makes ``logp_old`` the current policy's own (detached)
   log-probs; more reuse the rollouts with ``logp_old`` computed once before the first.

DeepSpeed (``deepspeed``: a ZeRO config) wraps the policy and optimizer; without it, plain
torch AdamW. The one-process CPU path (gloo under DeepSpeed) is what tests and ``make all``
run.

Modules: the options and recipes are :mod:`kgsynth.train.grpo_config`, the math
:mod:`kgsynth.train.grpo_loss`, the update :mod:`kgsynth.train.grpo_update`, the policy and
the collectives across processes :mod:`kgsynth.train.grpo_dist`, the run's spec, questions and
files :mod:`kgsynth.train.grpo_run`, checkpoints and resuming a killed run (plain or
DeepSpeed) :mod:`kgsynth.train.grpo_resume`, and what SFT shares :mod:`kgsynth.train.core`;
this module is the loop and re-exports the names callers use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kgsynth.core.config import config_record
from kgsynth.core.errors import ConfigError
from kgsynth.train.core import deepspeed_env, rank_and_world, resolve_precision
from kgsynth.train.grpo_config import (
    CHECKPOINTS,
    METRICS,
    RECIPES,
    RESUME_STATE,
    SUMMARY,
    GRPOConfig,
    resolve_config,
    reward_spec,
    warmup_steps,
)
from kgsynth.train.grpo_dist import (
    AdapterOff,
    Policy,
    init_distributed,
    shard_reference,
    weights_checksum,
)
from kgsynth.train.grpo_loss import (
    degenerate,
    group_advantages,
    grpo_token_loss,
    token_advantages,
    token_logprobs,
)
from kgsynth.train.grpo_resume import resume, save_checkpoint
from kgsynth.train.grpo_run import (
    RLQuestion,
    RLSpec,
    last_resumable,
    read_rl_questions,
    run_summary,
    save_model,
    with_topic_names,
    write_run_files,
)
from kgsynth.train.grpo_step import (
    LoopState,
    Run,
    check_logprobs,
    draw_questions,
    rollout_and_update,
    step_row,
)
from kgsynth.train.grpo_update import update
from kgsynth.train.plots import plot_rl

log = logging.getLogger(__name__)


def train_grpo(
    spec: RLSpec,
    *,
    progress: Callable[[int, int, dict], None] | None = None,
    questions: Sequence[RLQuestion] | None = None,
) -> dict[str, Any]:
    """Run GRPO for ``max_steps`` steps; save checkpoints and the final model into
    ``spec.out``; return a summary. ``progress(step, max_steps, metrics)`` after each step."""
    with deepspeed_env(spec.config.deepspeed):
        return _train(spec, progress, questions)


def _start(spec: RLSpec, device: str, dtype: Any, bf16: bool, resumed: Path | None) -> Run:
    """Load the policy (from the last checkpoint when resuming), its KL reference, the KG and
    its tools."""
    import torch
    from transformers import AutoTokenizer

    from kgsynth.agent.loop import stored_system_prompt
    from kgsynth.agent.rewards import GraphDistance
    from kgsynth.agent.rollout import RolloutConfig, TokenPolicy
    from kgsynth.core.modelio import load_causal_lm
    from kgsynth.kg.graph import KGGraph
    from kgsynth.kg.open import open_kg
    from kgsynth.train.lora import wrap

    cfg = spec.config
    rank, world = rank_and_world()
    tok = AutoTokenizer.from_pretrained(cfg.init)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    # a killed run goes on from its last whole checkpoint, whose folder holds the weights
    start = resumed if resumed is not None and not cfg.lora_r else cfg.init
    model = load_causal_lm(start, dtype=torch.float32).to(device)
    ref: Any = None
    if cfg.lora_r:
        model = wrap(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target)
    elif cfg.kl_coef > 0:
        ref = load_causal_lm(cfg.init, dtype=dtype).to(device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    policy = Policy(model, cfg, device, bf16)
    if ref is not None and policy.engine is not None:
        ref = shard_reference(ref, policy.engine, cfg, bf16)
    if cfg.lora_r and cfg.kl_coef > 0:
        ref = AdapterOff(policy.module)  # the base weights, without a second copy
    rspec = reward_spec(cfg)
    graph = KGGraph(open_kg(spec.kg, profile=spec.profile))
    return Run(
        spec=spec,
        device=device,
        dtype=dtype,
        rank=rank,
        world=world,
        tok=tok,
        policy=policy,
        ref=ref,
        sampler=TokenPolicy(policy.module, tok, _engine(cfg, policy, tok, start, bf16)),
        graph=graph,
        tool_cfg=cfg.agent,
        distance=GraphDistance(graph, max_depth=cfg.distance_max_depth, progress=cfg.progress_rule)
        if rspec.needs_distance
        else None,
        rcfg=RolloutConfig(
            **{**dataclasses.asdict(cfg.agent), "system_text": stored_system_prompt(cfg.init)},
            max_obs_tokens=cfg.max_obs_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            timeout_s=cfg.rollout_timeout_s,
        ),
        rspec=rspec,
        autocast=torch.autocast("cuda", dtype=torch.bfloat16)
        if dtype == torch.bfloat16
        else contextlib.nullcontext(),
    )


def _engine(cfg: GRPOConfig, policy: Policy, tok: Any, folder: Any, bf16: bool) -> Any:
    """This rank's rollout engine (``--rollout-engine``): ``hf`` samples with the policy module
    itself; ``vllm`` loads ``folder`` (the init model or the checkpoint resumed from) and then
    the policy's own weights."""
    from kgsynth.agent.engines import EngineUnavailable, make_engine

    try:
        return make_engine(
            cfg.rollout_engine, model=policy.module, tokenizer=tok, model_dir=str(folder),
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            dtype="bfloat16" if bf16 else "float32", seed=cfg.seed,
        )  # fmt: skip
    except EngineUnavailable as exc:
        raise ConfigError(str(exc)) from None


def _train(
    spec: RLSpec,
    progress: Callable[[int, int, dict], None] | None,
    questions: Sequence[RLQuestion] | None,
) -> dict[str, Any]:
    import torch

    from kgsynth.agent.rewards import RewardState

    started = time.perf_counter()
    cfg = spec.config
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    qs = list(questions) if questions is not None else read_rl_questions(spec.questions)
    phase2 = read_rl_questions(cfg.phase2_questions) if cfg.phase2_questions else None
    use_cpu, bf16 = resolve_precision(cfg.precision)
    device = "cpu" if use_cpu else "cuda"
    dtype = torch.bfloat16 if bf16 else torch.float32
    own_group = init_distributed(device)
    rank, world = rank_and_world()
    if device == "cuda" and world > 1:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)  # the same on every rank: all draw the same questions
    resumed = last_resumable(out)
    run = _start(spec, device, dtype, bf16, resumed)
    qs = with_topic_names(qs, run.graph)  # a benchmark's topics given by id (CWQ)
    phase2 = with_topic_names(phase2, run.graph) if phase2 else phase2
    metrics_path = out / METRICS
    tracker = None
    if rank == 0:
        from kgsynth.core.tracking import Tracker

        metrics_path.unlink(missing_ok=True)
        tracker = Tracker(cfg.report_to, out, name="rl", config=config_record(cfg))
    st = LoopState(qs=qs, rng=rng, reward_state=RewardState(step=0), order=list(range(len(qs))))
    rng.shuffle(st.order)
    if cfg.question_curriculum == "difficulty":  # ISP-KGR: easy, then medium, then hard
        from kgsynth.agent.spaces.isp.curriculum import curriculum_order

        st.order = curriculum_order([q.sparql for q in qs], rng)
    if resumed is not None:
        resume(run, st, resumed, phase2)
        if rank == 0:
            metrics_path.write_text("".join(json.dumps(r) + "\n" for r in st.history))
    for step_i in range(st.first_step, cfg.max_steps + 1):
        batch = draw_questions(run, st, phase2)
        if cfg.rollout == "tree":
            from kgsynth.train.grpo_tree import tree_rollout_and_update

            share, upd = tree_rollout_and_update(run, st, step_i, batch)
        else:
            share, upd = rollout_and_update(run, st, step_i, batch)
        row = step_row(run, st, step_i, len(batch), share, upd)
        if rank == 0 and (step_i % cfg.logging_steps == 0 or step_i == cfg.max_steps):
            with metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if tracker is not None:
                from kgsynth.core.tracking import scalars

                tracker.log(step_i, scalars(row, "rl/"))
        check_logprobs(cfg, row)  # every rank raises together: the row's figures are gathered
        run.sampler.refresh()  # the engine samples the next step with the updated weights
        if step_i % cfg.save_steps == 0 and step_i != cfg.max_steps:
            save_checkpoint(run, st, step_i, out / CHECKPOINTS / f"step-{step_i}")
        if progress and rank == 0:
            progress(step_i, cfg.max_steps, row)
    if tracker is not None:
        tracker.close()
    save_model(run.policy, run.tok, out, run.rcfg.system_text, run.tool_cfg)
    summary = run_summary(st.history, st.qs, started, device, dtype, st.totals, world)
    summary["resumed_from_step"] = st.first_step - 1 if st.first_step > 1 else None
    if rank == 0:
        write_run_files(spec, st.history, summary)
    if own_group:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return summary


__all__ = [
    "CHECKPOINTS",
    "METRICS",
    "RECIPES",
    "RESUME_STATE",
    "SUMMARY",
    "GRPOConfig",
    "Policy",
    "RLQuestion",
    "RLSpec",
    "degenerate",
    "group_advantages",
    "grpo_token_loss",
    "plot_rl",
    "read_rl_questions",
    "resolve_config",
    "reward_spec",
    "token_advantages",
    "token_logprobs",
    "train_grpo",
    "update",
    "warmup_steps",
    "weights_checksum",
]
