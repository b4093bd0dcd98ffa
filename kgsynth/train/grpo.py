"""GRPO of the agent policy against the live KG (``kgsynth train rl``).

questions.parquet (or any question file :mod:`kgsynth.qafiles` reads) + a KG + an SFT
checkpoint -> ``OUT/``: a ``save_pretrained`` folder, ``checkpoints/step-N`` folders,
``metrics.jsonl`` (one line per step), ``rl.png`` (reward and KL curves),
``rl_summary.json`` and (written by the CLI) ``manifest.json``::

    kgsynth train rl --questions q.parquet --kg runs/x/kg --init runs/x/stage2 --out runs/x/rl

The loop is written here rather than on TRL's GRPOTrainer: rollouts are multi-turn with the
project's own text protocol and tool environment, kept token-in/token-out
(:mod:`kgsynth.agent.rollout`), and the loss needs per-token advantages (KG-R1's turn-level
advantage) and a reward registry with state (KnowCoder-A1's F-beta curriculum); a plain loop
of about the size of those adapters keeps the core readable. Each step:

1. ``questions_per_step`` questions, ``group_size`` rollouts each, sampled together.
2. Rewards (:mod:`kgsynth.agent.rewards`): the configured weighted sum, every component logged.
3. Advantages: ``A_i = R_i - mean(R)`` of the group, divided by the group's std when
   ``scale_rewards`` (GRPO; Dr. GRPO and KBQA-R1 turn it off); groups whose rewards are all
   equal carry no signal and are skipped (counted). With ``turn_advantage`` (KG-R1; ISP's
   step-level GRPO) each assistant turn t of rollout i gets its own return
   ``G_it = r_it + turn_lambda * R_i`` (``r_it``: the turn-level rewards; ``R_i``: the
   trajectory-level ones) and the advantage ``G_it - mean(G)`` (over every turn of every
   rollout of the group: one pooled baseline), divided by the pooled std when
   ``scale_rewards``; the tokens of turn t carry it.
4. Loss, token-level over assistant tokens only (DAPO):
   ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + kl_coef * k3`` summed over every
   assistant token of the step and divided by their number, with ``r = exp(logp - logp_old)``
   and ``k3 = exp(ref - logp) - (ref - logp) - 1`` against the frozen init model.
   ``updates_per_step = 1`` (KnowCoder-A1's on-policy single update) makes ``logp_old`` the
   current policy's own (detached) log-probs; more updates reuse the rollouts with
   ``logp_old`` recomputed once before the first.

DeepSpeed (``deepspeed``: a ZeRO config) wraps the policy and optimizer; without it, plain
torch AdamW. The one-process CPU path (gloo under DeepSpeed) is what tests and ``make all``
run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.errors import ConfigError, InputFileError
from kgsynth.kg.graph import KGGraph
from kgsynth.modelio import is_model_folder

log = logging.getLogger(__name__)

METRICS = "metrics.jsonl"
SUMMARY = "rl_summary.json"
CHECKPOINTS = "checkpoints"
PLOT = "rl.png"
# in checkpoints/step-N beside the weights, written last: optimizer, scheduler, question order,
# curriculum state, metrics so far (and a LoRA run's adapter)
RESUME_STATE = "resume_state.pt"
RECIPES: dict[str, dict[str, Any]] = {
    # KnowCoder-A1 / KG-R1 scale: lr 1e-6, KL 0.001, group 8
    "default": dict(lr=1e-6, group_size=8, questions_per_step=16, max_turn_tokens=512),
    # a 2-core CPU and a tiny model: a few minutes for a few dozen steps
    "tiny": dict(lr=2e-4, group_size=4, questions_per_step=4, max_turn_tokens=64),
}


@dataclass(frozen=True)
class GRPOConfig:
    """Options of ``kgsynth train rl``; ``None`` fields come from the recipe."""

    init: str = ""  # an SFT output folder (or any local HF checkpoint)
    recipe: str | None = None  # default | tiny (auto: tiny when init was a tiny SFT run)
    preset: str | None = None  # a seed paper's whole RL recipe (kgsynth.train.presets)
    reward: str = "graphwalker"  # RewardSpec text: a preset or name:weight,...
    fbeta_switch_step: int | None = None
    fbeta_switch_reward: float | None = None
    # KnowCoder-A1's per-phase question sets: after the F-beta switch, questions come from here
    phase2_questions: str | None = None
    group_size: int | None = None
    questions_per_step: int | None = None
    max_steps: int = 50
    lr: float | None = None
    kl_coef: float = 0.001
    clip_low: float = 0.2
    clip_high: float = 0.28
    scale_rewards: bool = True  # divide advantages by the group's std
    turn_advantage: bool = False  # KG-R1: G_t = r_t + turn_lambda * R, pooled group baseline
    turn_lambda: float = 1.0  # KG-R1's lambda: the weight of the trajectory reward R in G_t
    updates_per_step: int = 1  # 1: on-policy single update (KnowCoder-A1)
    micro_batch_size: int = 8  # rollouts per forward pass in the update
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    warmup_steps: int = 0
    warmup_ratio: float | None = None  # a share of max_steps instead (KBQA-R1: 0.3); wins when set
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 10
    max_turn_tokens: int | None = None
    max_obs_tokens: int = 512
    rollout_timeout_s: float = 300.0
    rollout_batch_size: int = 64  # sequences per generate() call
    toolset: str = "graphwalker"
    relation_ranking: str = "bm25"  # bm25 | hybrid (kgsynth.agent.relrank); as in synthesis/eval
    report_to: str = "none"  # none | tensorboard | wandb: mirrors metrics.jsonl (kgsynth.tracking)
    lora_r: int = 0  # > 0: train LoRA adapters; the KL reference is the adapter switched off
    lora_alpha: float = 16.0
    lora_dropout: float = 0.05
    lora_target: str = "all-linear"
    top_k_relations: int = 10
    max_triples_per_relation: int = 5
    distance_max_depth: int = 3
    save_steps: int = 25
    logging_steps: int = 1
    seed: int = 0
    deepspeed: str | None = None
    precision: str = "auto"  # auto: bf16 on a CUDA GPU, fp32 on CPU


def _init_recipe(init: str) -> str:
    for name in ("train_config.json", "rl_config.json"):
        try:
            data = json.loads((Path(init) / name).read_text())
            recipe = data["config"]["recipe"]
            return "tiny" if recipe == "tiny" else "default"
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return "default"


def resolve_config(cfg: GRPOConfig) -> GRPOConfig:
    """Fill the recipe's defaults and check each field; errors name the field and range."""
    if not cfg.init or not is_model_folder(cfg.init):
        raise ConfigError(
            f"--init: {cfg.init or '(none)'} holds no saved model (config.json); "
            "give a `kgsynth train stage2` (or stage1) output folder"
        )
    recipe = cfg.recipe or _init_recipe(cfg.init)
    if recipe not in RECIPES:
        raise ConfigError(f"recipe must be one of {', '.join(RECIPES)} (got {recipe!r})")
    filled = {
        k: (v if getattr(cfg, k) is None else getattr(cfg, k)) for k, v in RECIPES[recipe].items()
    }
    c = dataclasses.replace(cfg, recipe=recipe, **filled)

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    need((c.group_size or 0) >= 2, f"group_size must be >= 2 (got {c.group_size})")
    need(
        (c.questions_per_step or 0) >= 1,
        f"questions_per_step must be >= 1 (got {c.questions_per_step})",
    )
    need(c.max_steps >= 1, f"max_steps must be >= 1 (got {c.max_steps})")
    need(c.lr is not None and 0 < c.lr < 1, f"lr must be in (0, 1) (got {c.lr})")
    need(c.kl_coef >= 0, f"kl_coef must be >= 0 (got {c.kl_coef})")
    need(c.warmup_steps >= 0, f"warmup_steps must be >= 0 (got {c.warmup_steps})")
    need(
        c.warmup_ratio is None or 0 <= c.warmup_ratio < 1,
        f"warmup_ratio must be in [0, 1) (got {c.warmup_ratio})",
    )
    need(
        math.isfinite(c.turn_lambda) and c.turn_lambda >= 0,
        f"turn_lambda must be >= 0 (got {c.turn_lambda})",
    )
    need(0 <= c.clip_low < 1, f"clip_low must be in [0, 1) (got {c.clip_low})")
    need(c.clip_high >= 0, f"clip_high must be >= 0 (got {c.clip_high})")
    need(c.updates_per_step >= 1, f"updates_per_step must be >= 1 (got {c.updates_per_step})")
    need(c.micro_batch_size >= 1, f"micro_batch_size must be >= 1 (got {c.micro_batch_size})")
    need(c.max_grad_norm > 0, f"max_grad_norm must be > 0 (got {c.max_grad_norm})")
    need(c.temperature > 0, f"temperature must be > 0 for sampling (got {c.temperature})")
    need(0 < c.top_p <= 1, f"top_p must be in (0, 1] (got {c.top_p})")
    need(c.max_turns >= 1, f"max_turns must be >= 1 (got {c.max_turns})")
    need((c.max_turn_tokens or 0) >= 1, f"max_turn_tokens must be >= 1 (got {c.max_turn_tokens})")
    need(c.max_obs_tokens >= 8, f"max_obs_tokens must be >= 8 (got {c.max_obs_tokens})")
    need(c.rollout_timeout_s > 0, f"rollout_timeout_s must be > 0 (got {c.rollout_timeout_s})")
    need(
        c.toolset in ("graphwalker", "kgr1"),
        f"toolset must be graphwalker or kgr1 (got {c.toolset!r})",
    )
    need(c.save_steps >= 1, f"save_steps must be >= 1 (got {c.save_steps})")
    need(c.logging_steps >= 1, f"logging_steps must be >= 1 (got {c.logging_steps})")
    need(
        c.precision in ("auto", "bf16", "fp32"),
        f"precision must be auto, bf16 or fp32 (got {c.precision!r})",
    )
    from kgsynth.tracking import check_report_to

    check_report_to(c.report_to)
    from kgsynth.train.lora import check_lora

    check_lora(c.lora_r, c.lora_alpha, c.lora_dropout, c.lora_target)
    rewards = reward_spec(c)  # names and weights checked
    if c.phase2_questions is not None:
        need(
            "fbeta" in rewards.components,
            "phase2_questions needs the fbeta reward (its switch starts the second phase)",
        )
        if not Path(c.phase2_questions).is_file():
            raise InputFileError(Path(c.phase2_questions), "does not exist (--phase2-questions)")
    if c.deepspeed is not None:
        from kgsynth.train.sft import load_deepspeed_config

        load_deepspeed_config(c.deepspeed)
    return c


def warmup_steps(cfg: GRPOConfig) -> int:
    """Linear warm-up length: ``warmup_ratio`` of ``max_steps`` (rounded) when set, else
    ``warmup_steps``."""
    if cfg.warmup_ratio is not None:
        return round(cfg.warmup_ratio * cfg.max_steps)
    return max(0, cfg.warmup_steps)


def reward_spec(cfg: GRPOConfig) -> Any:
    from kgsynth.agent.rewards import RewardSpec

    # None keeps the preset's (or the default) curriculum switch
    return RewardSpec.parse(
        cfg.reward,
        fbeta_switch_step=cfg.fbeta_switch_step,
        fbeta_switch_reward=cfg.fbeta_switch_reward,
    )


# ---------------------------------------------------------------------------------------------
# The math (pure; tests check it against hand-computed values)


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
) -> tuple[Any, dict[str, Any]]:
    """The clipped surrogate with asymmetric clip and the k3 KL, summed over masked tokens and
    divided by ``total_tokens`` (the step's assistant tokens, so micro-batches add up to the
    token-level mean). Returns the loss and detached sums for the metrics."""
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
    loss = (per_token * mask).sum() / total_tokens
    stats = {
        "pg": (pg * mask).sum().detach(),
        "kl": (kl * mask).sum().detach(),
        "clipped": (clipped * mask).sum().detach(),
        "tokens": mask.sum().detach(),
    }
    return loss, stats


def token_logprobs(
    model: Any, ids: Any, attention: Any, temperature: float = 1.0
) -> tuple[Any, Any]:
    """Log-prob of each token given the ones before (position 0 gets 0) and the entropy of
    the predicted distribution there, both (batch, length)."""
    import torch

    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    pad = torch.zeros((ids.shape[0], 1), dtype=logp.dtype, device=logp.device)
    return torch.cat([pad, logp], dim=1), torch.cat([pad, entropy.detach()], dim=1)


# ---------------------------------------------------------------------------------------------
# Questions


@dataclass(frozen=True)
class RLQuestion:
    question: str
    topic_names: list[str]
    answers: list[str]
    question_id: str


def read_rl_questions(path: str | Path) -> list[RLQuestion]:
    """Questions with topic entities and gold answers (questions.parquet, MetaQA txt, JSONL)."""
    from kgsynth.qafiles import read_questions

    path = Path(path)
    if not path.is_file():
        raise InputFileError(path, "does not exist")
    out = []
    for r in read_questions(path):
        if not r.topic_names:
            raise InputFileError(path, f"row {r.line}: no topic entity (topic_names)")
        if not r.answer_names:
            raise InputFileError(path, f"row {r.line}: no gold answer (answer_names)")
        out.append(
            RLQuestion(
                r.question, list(r.topic_names), list(r.answer_names), f"{path.name}:{r.line}"
            )
        )
    if not out:
        raise InputFileError(path, "holds no questions")
    return out


# ---------------------------------------------------------------------------------------------
# The loop


@dataclass(frozen=True)
class RLSpec:
    questions: str
    kg: str
    profile: str | None
    out: str
    config: GRPOConfig

    def write(self, path: str | Path) -> None:
        """``OUT/rl_spec.json``: what every launched worker reads (``kind: rl``)."""
        data = {"kind": "rl", **dataclasses.asdict(self)}
        Path(path).write_text(json.dumps(data, indent=2))

    @classmethod
    def read(cls, path: str | Path) -> RLSpec:
        data = json.loads(Path(path).read_text())
        return cls(
            data["questions"], data["kg"], data["profile"], data["out"],
            GRPOConfig(**data["config"]),
        )  # fmt: skip


def _ds_config(path: str, cfg: GRPOConfig, bf16: bool) -> dict[str, Any]:
    """A ZeRO config with the fields left ``auto`` for Trainer filled from ours."""
    from kgsynth.train.sft import load_deepspeed_config

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


def _dist() -> tuple[int, int]:
    """(rank, world size) of the running process group; (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _init_distributed(device: str) -> bool:
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


def _all_sum(values: Sequence[float], device: str = "cpu") -> list[float]:
    """Element-wise sum over the ranks (the values themselves in one process)."""
    import torch
    import torch.distributed as dist

    if _dist()[1] == 1:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return [float(v) for v in t.tolist()]


def _all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order ([obj] in one process)."""
    import torch.distributed as dist

    world = _dist()[1]
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


class _Policy:
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

            if device == "cpu":  # see kgsynth.train.sft: gloo instead of a JIT-built op
                import deepspeed.ops

                deepspeed.ops.__dict__.setdefault("__compatible_ops__", {})[
                    "deepspeed_shm_comm"
                ] = False
            ds = _ds_config(cfg.deepspeed, cfg, bf16)
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

    def step(self) -> float:
        import torch

        if self.engine is not None:  # stepped at the boundary in backward()
            norm = self.engine.get_global_grad_norm()
            self.sched.step()
            return float(norm) if norm is not None else float("nan")
        if _dist()[1] > 1:
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
        self.sched.step()
        return float(norm)


def _shard_reference(ref: Any, engine: Any, cfg: GRPOConfig, bf16: bool) -> Any:
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


class _AdapterOff:
    """The KL reference of a LoRA policy: the same model with its adapter switched off."""

    def __init__(self, peft_model: Any):
        self.model = peft_model

    def __call__(self, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(**kwargs)


def _pad_batch(rows: Sequence[Sequence[Any]], fill: Any, dtype: Any, width: int) -> Any:
    import torch

    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=dtype)
    return out


def train_grpo(
    spec: RLSpec,
    *,
    progress: Callable[[int, int, dict], None] | None = None,
    questions: Sequence[RLQuestion] | None = None,
) -> dict[str, Any]:
    """Run GRPO for ``max_steps`` steps; save checkpoints and the final model into
    ``spec.out``; return a summary. ``progress(step, max_steps, metrics)`` after each step."""
    from kgsynth.train.sft import single_process_env

    use_ds = spec.config.deepspeed is not None
    env = single_process_env() if use_ds else contextlib.nullcontext(False)
    with env:
        return _train(spec, progress, questions)


def _train(
    spec: RLSpec,
    progress: Callable[[int, int, dict], None] | None,
    questions: Sequence[RLQuestion] | None,
) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from kgsynth.agent.loop import EpisodeTask, stored_system_prompt
    from kgsynth.agent.rewards import (
        FBETA_LATE,
        Gold,
        GraphDistance,
        RewardState,
        pooled_turn_advantages,
        turn_returns,
    )
    from kgsynth.agent.rollout import RolloutConfig, TokenPolicy, check_alignment, run_rollouts
    from kgsynth.agent.tools import ToolConfig, ToolEnvironment
    from kgsynth.kg.open import open_kg
    from kgsynth.train.sft import resolve_precision

    started = time.perf_counter()
    cfg = spec.config
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    qs = list(questions) if questions is not None else read_rl_questions(spec.questions)
    rspec = reward_spec(cfg)
    phase2 = read_rl_questions(cfg.phase2_questions) if cfg.phase2_questions else None
    use_cpu, bf16 = resolve_precision(cfg.precision)
    device = "cpu" if use_cpu else "cuda"
    dtype = torch.bfloat16 if bf16 else torch.float32
    own_group = _init_distributed(device)
    rank, world = _dist()
    if device == "cuda" and world > 1:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)  # the same on every rank: all draw the same questions

    tok = AutoTokenizer.from_pretrained(cfg.init)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    from kgsynth.modelio import load_causal_lm
    from kgsynth.train.lora import wrap

    # a killed run goes on from its last whole checkpoint, whose folder holds the weights
    resumed = _last_resumable(out)
    if resumed is not None and cfg.deepspeed:
        raise ConfigError(
            f"{spec.out} holds an interrupted DeepSpeed RL run; resuming one is not built "
            "yet: pass --overwrite to start again"
        )
    start = resumed if resumed is not None and not cfg.lora_r else cfg.init
    model = load_causal_lm(start, dtype=torch.float32).to(device)
    ref: Any = None
    if cfg.lora_r:
        model = wrap(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target)
    elif cfg.kl_coef > 0:
        ref = load_causal_lm(cfg.init, dtype=dtype).to(device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    policy = _Policy(model, cfg, device, bf16)
    if ref is not None and policy.engine is not None:
        ref = _shard_reference(ref, policy.engine, cfg, bf16)
    if cfg.lora_r and cfg.kl_coef > 0:
        ref = _AdapterOff(policy.module)  # the base weights, without a second copy
    sampler = TokenPolicy(policy.module, tok)
    kg = open_kg(spec.kg, profile=spec.profile)
    graph = KGGraph(kg)
    tool_cfg = ToolConfig(
        toolset=cfg.toolset,  # type: ignore[arg-type]
        top_k_relations=cfg.top_k_relations,
        max_triples_per_relation=cfg.max_triples_per_relation,
        relation_ranking=cfg.relation_ranking,  # type: ignore[arg-type]
    )
    distance = (
        GraphDistance(graph, max_depth=cfg.distance_max_depth) if rspec.needs_distance else None
    )
    rcfg = RolloutConfig(
        toolset=cfg.toolset,
        max_turns=cfg.max_turns,
        max_turn_tokens=int(cfg.max_turn_tokens or 64),
        max_obs_tokens=cfg.max_obs_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        timeout_s=cfg.rollout_timeout_s,
        system_text=stored_system_prompt(cfg.init),
    )
    state = RewardState(step=0)
    metrics_path = out / METRICS
    tracker = None
    if rank == 0:
        from kgsynth.tracking import Tracker

        metrics_path.unlink(missing_ok=True)
        tracker = Tracker(cfg.report_to, out, name="rl", config=dataclasses.asdict(cfg))
    history: list[dict[str, Any]] = []
    order = list(range(len(qs)))
    rng.shuffle(order)
    cursor = 0
    phase = 1
    totals = {"rollouts": 0, "skipped_groups": 0, "groups": 0, "generated_tokens": 0}
    first_step = 1
    if resumed is not None:  # the weights came from its folder (a LoRA run's adapter: here)
        saved = torch.load(resumed / RESUME_STATE, map_location=device, weights_only=False)
        if saved["config"] != dataclasses.asdict(cfg):
            raise ConfigError(
                f"{spec.out} holds an interrupted RL run with another configuration; pass "
                "--overwrite to start again, or rerun it with its own options"
            )
        if cfg.lora_r:
            policy.module.load_state_dict(saved["adapter"], strict=False)
        policy.optimizer.load_state_dict(saved["optimizer"])
        policy.sched.load_state_dict(saved["scheduler"])
        rng.setstate(saved["rng"])
        order, cursor, phase = saved["order"], saved["cursor"], saved["phase"]
        if phase == 2 and phase2 is not None:
            qs = phase2
        state = RewardState(**saved["reward_state"])
        history, totals = saved["history"], saved["totals"]
        first_step = saved["step"] + 1
        log.info("resuming RL from %s (step %d)", resumed, saved["step"])
        if rank == 0:
            metrics_path.write_text("".join(json.dumps(r) + "\n" for r in history))
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if dtype == torch.bfloat16
        else contextlib.nullcontext()
    )
    for step_i in range(first_step, cfg.max_steps + 1):
        t0 = time.perf_counter()
        if phase2 is not None and phase == 1 and rspec.fbeta_beta(state) == FBETA_LATE:
            # the switch came: the second phase draws from its own questions
            phase, qs = 2, phase2
            order = list(range(len(qs)))
            rng.shuffle(order)
            cursor = 0
        batch: list[RLQuestion] = []
        for _ in range(int(cfg.questions_per_step or 1)):
            if cursor == len(order):
                rng.shuffle(order)
                cursor = 0
            batch.append(qs[order[cursor]])
            cursor += 1
        g = int(cfg.group_size or 2)
        # data parallel: each rank rolls out whole groups (group gi on rank gi % world)
        mine = [gi for gi in range(len(batch)) if gi % world == rank]
        tasks = [
            EpisodeTask(batch[gi].question, batch[gi].topic_names) for gi in mine for _ in range(g)
        ]
        with autocast:
            rollouts = run_rollouts(
                sampler,
                tasks,
                lambda task: ToolEnvironment(graph, task.question, tool_cfg),
                rcfg,
                seed=cfg.seed * 100_003 + step_i + 7_919 * rank,
                batch_size=cfg.rollout_batch_size,
            )
        t_roll = time.perf_counter() - t0
        for r in rollouts:
            check_alignment(r)
        # rewards (state.step = step_i - 1: the steps done before this one)
        results = []
        for k, r in enumerate(rollouts):
            q = batch[mine[k // g]]
            gold = Gold(answers=q.answers, question=q.question, topic_names=q.topic_names)
            results.append(rspec.score(r.episode, gold, state, distance=distance))
        rewards = [res.total for res in results]
        # advantages per group
        per_token_adv: list[list[float] | None] = [None] * len(rollouts)
        skipped = 0
        for j_group in range(len(mine)):
            idx = list(range(j_group * g, (j_group + 1) * g))
            if cfg.turn_advantage:  # KG-R1: G_t = r_t + lambda R, one pooled baseline
                returns = [
                    turn_returns(
                        results[i].turn_rewards, results[i].trajectory_total, cfg.turn_lambda
                    )
                    for i in idx
                ]
                if degenerate([v for r in returns for v in r] or [0.0]):
                    skipped += 1
                    continue
                turn_adv = pooled_turn_advantages(returns, scale=cfg.scale_rewards)
                for j, i in enumerate(idx):
                    per_token_adv[i] = token_advantages(rollouts[i].turn_of, turn_adv[j])
                continue
            group_r = [rewards[i] for i in idx]
            if degenerate(group_r):
                skipped += 1
                continue
            adv = group_advantages(group_r, scale=cfg.scale_rewards)
            for j, i in enumerate(idx):
                per_token_adv[i] = token_advantages(rollouts[i].turn_of, None, adv[j])
        keep = [i for i, a in enumerate(per_token_adv) if a is not None]
        upd = _update(policy, ref, rollouts, per_token_adv, keep, cfg, device, autocast)
        t_step = time.perf_counter() - t0
        eps = [r.episode for r in rollouts]
        # every rank's share of the step, so that all hold the same curriculum state and rank
        # 0 logs the whole step
        shares = _all_gather(
            {
                "rewards": rewards,
                "outcomes": [res.outcome for res in results],
                "components": [res.components for res in results],
                "beta": results[0].fbeta_beta if results else None,
                "turns": [len([t for t in e.turns if not t.llm_error]) for e in eps],
                "tool_errors": [e.tool_errors for e in eps],
                "format_errors": [e.format_errors for e in eps],
                "answered": [e.answered for e in eps],
                "timed_out": sum(r.timed_out for r in rollouts),
                "truncated": sum(r.truncated_observations for r in rollouts),
                "generated_tokens": sum(r.generated_tokens for r in rollouts),
                "skipped": skipped,
                "rollout_s": t_roll,
                "checksum": weights_checksum(policy.module) if world > 1 else 0.0,
            }
        )
        every = {k: [v for s in shares for v in s[k]] for k in
                 ("rewards", "outcomes", "components", "turns", "tool_errors", "format_errors",
                  "answered")}  # fmt: skip
        rewards = every["rewards"]
        mean_r = sum(rewards) / len(rewards)
        beta = next((s["beta"] for s in shares if s["beta"] is not None), None)
        # the running mean of the outcome reward and the F-beta switch, for the next step
        state = rspec.advance(state, every["outcomes"])
        gen_tokens = sum(s["generated_tokens"] for s in shares)
        skipped = sum(s["skipped"] for s in shares)
        t_roll = max(s["rollout_s"] for s in shares)
        totals["rollouts"] += len(rewards)
        totals["skipped_groups"] += skipped
        totals["groups"] += len(batch)
        totals["generated_tokens"] += gen_tokens
        comps: dict[str, float] = {}
        for components in every["components"]:
            for name, v in components.items():
                comps[name] = comps.get(name, 0.0) + v / len(rewards)
        n_eps = len(rewards)
        sync = {}
        if world > 1:
            sums = [s["checksum"] for s in shares]
            zero3 = policy.engine is not None and policy.engine.zero_optimization_stage() == 3
            if not zero3:  # ZeRO-3 ranks hold shards, not whole weights
                sync = {"weights_in_sync": max(sums) - min(sums) <= 1e-9 * max(1.0, abs(sums[0]))}
        row = {
            "step": step_i,
            "reward": mean_r,
            "reward_std": float(torch.tensor(rewards).std(unbiased=False)),
            **{f"reward/{k}": v for k, v in sorted(comps.items())},
            "outcome_mean": state.outcome_mean,
            "phase": phase,
            **({"fbeta_beta": beta} if beta is not None else {}),
            **upd,
            "lr": policy.sched.get_last_lr()[0],
            "turns": sum(every["turns"]) / n_eps,
            "tool_errors": sum(every["tool_errors"]) / n_eps,
            "format_errors": sum(every["format_errors"]) / n_eps,
            "answered": sum(every["answered"]) / n_eps,
            "timed_out": sum(s["timed_out"] for s in shares),
            "truncated_observations": sum(s["truncated"] for s in shares),
            "generated_tokens": gen_tokens,
            "rollout_tokens_per_s": gen_tokens / t_roll if t_roll > 0 else 0.0,
            "skipped_groups": skipped,
            "groups": len(batch),
            "rollout_s": t_roll,
            "step_s": t_step,
            **({"world_size": world} if world > 1 else {}),
            **sync,
            "time": time.time(),
        }
        history.append(row)
        if sync and not sync["weights_in_sync"]:
            raise RuntimeError(f"step {step_i}: the ranks' weights differ ({shares})")
        if rank == 0 and (step_i % cfg.logging_steps == 0 or step_i == cfg.max_steps):
            with metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if tracker is not None:
                from kgsynth.tracking import scalars

                tracker.log(step_i, scalars(row, "rl/"))
        if step_i % cfg.save_steps == 0 and step_i != cfg.max_steps:
            folder = out / CHECKPOINTS / f"step-{step_i}"
            _save(policy, tok, folder, rcfg.system_text)
            if rank == 0 and not cfg.deepspeed:
                _save_resume_state(folder, {
                    "step": step_i, "config": dataclasses.asdict(cfg),
                    # the weights are the folder's; a LoRA run's adapter is kept here
                    "adapter": {n: p.detach().cpu() for n, p in
                                policy.module.named_parameters() if p.requires_grad}
                    if cfg.lora_r else None,
                    "optimizer": policy.optimizer.state_dict(),
                    "scheduler": policy.sched.state_dict(), "rng": rng.getstate(),
                    "order": order, "cursor": cursor, "phase": phase,
                    "reward_state": dataclasses.asdict(state), "history": history,
                    "totals": totals,
                })  # fmt: skip
        if progress and rank == 0:
            progress(step_i, cfg.max_steps, row)
    if tracker is not None:
        tracker.close()
    _save(policy, tok, out, rcfg.system_text)
    summary = _summary(history, qs, started, device, dtype, totals, world)
    summary["resumed_from_step"] = first_step - 1 if first_step > 1 else None
    if rank == 0:
        _write_run_files(spec, history, summary)
    if own_group:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return summary


def _save_resume_state(folder: Path, data: dict[str, Any]) -> None:
    """Everything a killed run needs to go on exactly where this step ended, written last and
    atomically, so a checkpoint without it is not resumed from."""
    import torch

    tmp = folder / (RESUME_STATE + ".tmp")
    torch.save(data, tmp)
    os.replace(tmp, folder / RESUME_STATE)


def _last_resumable(out: Path) -> Path | None:
    """The newest ``checkpoints/step-N`` holding a whole resume state, if any."""
    root = out / CHECKPOINTS
    if not root.is_dir():
        return None
    steps = [
        (int(f.name.split("-")[1]), f)
        for f in root.iterdir()
        if f.name.startswith("step-") and f.name[5:].isdigit() and (f / RESUME_STATE).is_file()
    ]
    return max(steps)[1] if steps else None


def _summary(
    history: Sequence[dict[str, Any]],
    qs: Sequence[Any],
    started: float,
    device: str,
    dtype: Any,
    totals: dict[str, int],
    world: int,
) -> dict[str, Any]:
    first = history[: max(1, len(history) // 5)]
    last = history[-max(1, len(history) // 5) :]
    return {
        "steps": len(history),
        "questions": len(qs),
        "reward_first": sum(h["reward"] for h in first) / len(first),
        "reward_last": sum(h["reward"] for h in last) / len(last),
        "mean_step_s": sum(h["step_s"] for h in history) / len(history),
        "mean_rollout_tokens_per_s": sum(h["rollout_tokens_per_s"] for h in history) / len(history),
        "wall_s": round(time.perf_counter() - started, 3),
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "world_size": world,
        **totals,
    }


def _write_run_files(spec: RLSpec, history: Sequence[dict[str, Any]], summary: dict) -> None:
    """rl_config.json, rl.png and rl_summary.json (rank 0)."""
    cfg, out = spec.config, Path(spec.out)
    (out / "rl_config.json").write_text(
        json.dumps(
            {"config": dataclasses.asdict(cfg), "questions": spec.questions, "kg": spec.kg},
            indent=2,
        )
    )
    plot_rl(history, out / PLOT)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2))


def _update(
    policy: _Policy,
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
             "trained_tokens": 0, "logprob_mismatch": 0.0}  # fmt: skip
    _, world = _dist()
    local_tokens = sum(sum(rollouts[i].mask) for i in keep)
    total_tokens = int(_all_sum([local_tokens], device)[0])
    if total_tokens == 0:  # the same on every rank: no step anywhere
        return empty
    # DeepSpeed averages the ranks' gradients, the plain path sums them
    norm_tokens = total_tokens / world if policy.engine is not None else total_tokens
    micro = [
        list(keep[i : i + cfg.micro_batch_size]) for i in range(0, len(keep), cfg.micro_batch_size)
    ] if local_tokens else []  # fmt: skip

    def tensors(idx: list[int]) -> tuple[Any, ...]:  # ids, attention, mask, advantages, logprobs
        width = max(len(rollouts[i]) for i in idx)
        ids = _pad_batch([rollouts[i].ids for i in idx], 0, torch.long, width)
        att = _pad_batch([[1] * len(rollouts[i]) for i in idx], 0, torch.long, width)
        mask = _pad_batch([rollouts[i].mask for i in idx], 0, torch.long, width)
        adv = _pad_batch([per_token_adv[i] or [] for i in idx], 0.0, torch.float32, width)
        old = _pad_batch([rollouts[i].logprobs for i in idx], 0.0, torch.float32, width)
        return ids.to(device), att.to(device), mask.to(device), adv.to(device), old.to(device)

    batches = [tensors(idx) for idx in micro]
    if not batches:  # this rank kept nothing: one masked-out row, so it still steps with the rest
        zero = torch.zeros((1, 2), dtype=torch.long, device=device)
        batches = [(zero, torch.ones_like(zero), zero, zero.float(), zero.float())]
    fwd = policy.forward_module()
    ref_lp: dict[int, Any] = {}
    old_lp: dict[int, Any] = {}
    with torch.no_grad(), autocast:
        for k, (ids, att, *_) in enumerate(batches):
            if ref is not None:
                ref_lp[k] = token_logprobs(ref, ids, att, cfg.temperature)[0].float()
            if cfg.updates_per_step > 1:
                old_lp[k] = token_logprobs(fwd, ids, att, cfg.temperature)[0].float()
    sums = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0, "entropy": 0.0}
    mismatch = 0.0
    norms = []
    for update in range(cfg.updates_per_step):
        for k, (ids, att, mask, adv, rollout_lp) in enumerate(batches):
            with autocast:
                logp, ent = token_logprobs(fwd, ids, att, cfg.temperature)
            logp = logp.float()
            old = old_lp[k] if k in old_lp else logp.detach()
            m = mask.bool()
            if update == 0 and m.any():  # the policy that sampled the rollouts, not yet updated
                gap = (logp.detach() - rollout_lp)[m].abs().max()
                mismatch = max(mismatch, float(gap))
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
    keys = ("loss", "pg", "kl", "clipped", "tokens", "entropy")
    sums = dict(zip(keys, _all_sum([sums[k] for k in keys], device), strict=True))
    mismatch = max(_all_gather(mismatch))
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
    }


def _save(policy: _Policy, tok: Any, folder: Path, system_text: str | None = None) -> None:
    """A ``save_pretrained`` folder (weights gathered under ZeRO-3), with the tokenizer and the
    stored system prompt the policy was trained with."""
    from kgsynth.agent.loop import SYSTEM_PROMPT_FILE

    folder.mkdir(parents=True, exist_ok=True)
    if system_text is not None and int(os.environ.get("RANK", "0")) == 0:
        (folder / SYSTEM_PROMPT_FILE).write_text(system_text, encoding="utf-8")
    engine = policy.engine
    if engine is not None and engine.zero_optimization_stage() == 3:
        state = engine._zero3_consolidated_16bit_state_dict()
        if int(os.environ.get("RANK", "0")) == 0:
            policy.module.save_pretrained(folder, state_dict=state)
    elif int(os.environ.get("RANK", "0")) == 0:
        policy.module.save_pretrained(folder)
    if int(os.environ.get("RANK", "0")) == 0:
        tok.save_pretrained(folder)


def plot_rl(history: Sequence[dict[str, Any]], path: Path) -> None:
    """Reward (and each component) and KL against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not history:
        return
    steps = [h["step"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(steps, [h["reward"] for h in history], label="reward (total)", lw=2)
    for key in sorted(k for k in history[0] if k.startswith("reward/")):
        a.plot(steps, [h.get(key, 0.0) for h in history], label=key[7:], lw=1, alpha=0.8)
    a.set_xlabel("step")
    a.set_ylabel("mean reward")
    a.legend(fontsize=7)
    a.set_title("reward")
    b.plot(steps, [h["kl"] for h in history], color="tab:red")
    b.set_xlabel("step")
    b.set_ylabel("KL (k3) to the init model")
    b.set_title("KL")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = [
    "GRPOConfig",
    "RLQuestion",
    "RLSpec",
    "degenerate",
    "group_advantages",
    "grpo_token_loss",
    "read_rl_questions",
    "resolve_config",
    "token_advantages",
    "token_logprobs",
    "train_grpo",
]
