"""The options of ``kgsynth train rl`` (:class:`GRPOConfig`), their two recipes and their checks.

``None`` fields are filled from the recipe by :func:`resolve_config`, which also checks what
only the files can tell (``--init``, ``--phase2-questions``, the DeepSpeed config). Every check
of the values themselves, alone or against each other, is in
:meth:`GRPOConfig.__post_init__`; a check reading a field the recipe fills runs once it is
filled. A preset (:mod:`kgsynth.train.presets`) sets fields under the config file and flags.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.agent.carried import ALLOW_TOOLSET_CHANGE_HELP
from kgsynth.agent.config import AgentConfig
from kgsynth.agent.engines import ENGINES
from kgsynth.core.config import option, option_value, replace_options
from kgsynth.core.errors import ConfigError, InputFileError
from kgsynth.core.modelio import (
    MERGE_FIX,
    adapter_base,
    fit_to_model,
    is_adapter,
    is_model_folder,
)
from kgsynth.train.core import (
    HELP,
    PRECISIONS,
    check_selection,
    check_selection_inputs,
    check_tracking_and_lora,
    fill_recipe,
    load_deepspeed_config,
    need,
    recorded_recipe,
)
from kgsynth.train.sft_config import SPEC as SFT_SPEC

METRICS = "metrics.jsonl"
SUMMARY = "rl_summary.json"
CHECKPOINTS = "checkpoints"
PLOT = "rl.png"
RL_CONFIG = "rl_config.json"
# what launched workers read (kgsynth.train.launch)
RL_SPEC = "rl_spec.json"
# the run's own files beside its model's (every other top-level file is the model's)
RUN_FILES = (METRICS, SUMMARY, PLOT, RL_CONFIG, RL_SPEC)
# in checkpoints/step-N beside the weights, written last: optimizer, scheduler, question order,
# curriculum state, metrics so far (and a LoRA run's adapter); see grpo_resume
RESUME_STATE = "resume_state.pt"
RECIPES: dict[str, dict[str, Any]] = {
    # KnowCoder-A1 / KG-R1 scale: lr 1e-6, KL 0.001, group 8
    "default": dict(lr=1e-6, group_size=8, questions_per_step=16, max_turn_tokens=512),
    # a 2-core CPU and a tiny model: a few minutes for a few dozen steps
    "tiny": dict(lr=2e-4, group_size=4, questions_per_step=4, max_turn_tokens=64),
}
_RECIPES = "\\[default: recipe's]"
ROLLOUTS = ("flat", "tree")
ISP_CHOICES = {
    "tree_prune": ("tree", "siblings"),
    "progress_rule": ("previous", "best"),
    "question_curriculum": ("none", "difficulty"),
}
LOSS_AGGS = ("token-mean", "seq-mean-token-mean")


@dataclass(frozen=True)
class GRPOConfig:
    """Options of ``kgsynth train rl``; ``None`` fields come from the recipe."""

    init: str = option("", "The SFT output folder to start from (stage2, or stage1).")
    recipe: str | None = option(
        None,
        "Defaults: default (lr 1e-6, group 8, 16 questions/step) or tiny (CPU). "
        "\\[default: tiny when --init is a tiny SFT run]",
        advanced=True,
    )
    preset: str | None = option(
        None,
        "A seed paper's whole RL recipe: graphwalker, kbqa-r1 (KBQA-R1: its S-expression "
        "actions, --toolset sexpr, with relation gating), knowcoder-a1, kg-r1 or isp "
        "(rewards, advantage, KL, clip, group, turns, lr, warm-up; docs/recipes.md's preset "
        "table gives each value and its source). --config and flags override it.",
        panel="Inputs",
    )
    reward: str = option(
        "graphwalker",
        "Reward: a preset (graphwalker = hit, kbqa-r1, knowcoder-a1, kg-r1, isp) or "
        "name:weight,... over em, hit, hits_at_1, f1, fbeta, format, retrieval, turn, distance.",
        panel="Rewards",
    )
    fbeta_switch_step: int | None = option(
        None, "fbeta curriculum: beta 0.5 until this step, then 1.", panel="Rewards", advanced=True
    )
    fbeta_switch_reward: float | None = option(
        None,
        "fbeta curriculum: beta 1 from the step after the outcome reward's running mean reaches "
        "this (the switch never goes back).",
        panel="Rewards",
        advanced=True,
    )
    # KnowCoder-A1's per-phase question sets: after the F-beta switch, questions come from here
    phase2_questions: str | None = option(
        None,
        "fbeta curriculum: questions of the second phase (after the switch); KnowCoder-A1's "
        "per-phase question sets. \\[default: --questions throughout]",
        panel="Inputs",
        advanced=True,
    )
    group_size: int | None = option(None, f"Rollouts per question (G). {_RECIPES}")
    questions_per_step: int | None = option(None, f"Questions per step. {_RECIPES}")
    max_steps: int = option(50, "Optimizer steps.")
    lr: float | None = option(None, f"Peak learning rate. {_RECIPES}")
    kl_coef: float = option(
        0.001, "KL coefficient to the frozen init model (k3); 0 = off.", aliases=("--kl",)
    )
    clip_low: float = option(0.2, "Ratio clip below: 1 - clip_low.", advanced=True)
    clip_high: float = option(0.28, "Ratio clip above: 1 + clip_high (DAPO).", advanced=True)
    scale_rewards: bool = option(True, "Divide advantages by the group std.", advanced=True)
    dynamic_sampling: bool = option(
        False,
        "DAPO's dynamic sampling: a group whose rewards all tie is replaced by the group of a "
        "question drawn next, in refill rounds, until the step trains on --questions-per-step "
        "groups with a reward spread (or --dynamic-sampling-rounds run out).",
        advanced=True,
    )
    dynamic_sampling_rounds: int = option(
        4, "Dynamic sampling: refill rounds per step at most.", advanced=True
    )
    shuffle_rewards: bool = option(
        False,
        "A control, not for training: each group's rewards are shuffled among its rollouts "
        "before the advantages, so an update has GRPO's own noise and no signal.",
        advanced=True,
    )
    turn_advantage: bool = option(
        False,
        "KG-R1's turn-wise advantage: each turn's tokens get G_t = r_t + lambda R (turn rewards "
        "plus the trajectory reward) against one baseline pooled over every turn of the group; "
        "on in --preset kg-r1 and isp.",
        advanced=True,
    )
    turn_lambda: float = option(
        1.0, "KG-R1's lambda: the trajectory reward's weight in G_t.", advanced=True
    )
    rollout: str = option(
        "flat",
        "Rollouts: flat (--group-size independent rollouts per question, one advantage per "
        "rollout or per turn) or tree (ISP-KGR: --branches continuations of every live step, "
        "equivalent sibling branches pruned, each step's advantage normalised among its "
        "siblings; --turn-advantage and --group-size do not apply).",
        panel="Rollouts",
        advanced=True,
    )
    branches: int = option(
        3,
        "Tree rollouts: branches sampled from each live node per step (K).",
        panel="Rollouts",
        advanced=True,
    )
    max_tree_nodes: int = option(
        8,
        "Tree rollouts: live nodes per question at most; past it a node gets fewer than "
        "--branches branches (at least one).",
        panel="Rollouts",
        advanced=True,
    )
    tree_value: str = option(
        "max",
        "Tree rollouts: a node's outcome over the leaves of its subtree: max (ISP-KGR) or mean.",
        panel="Rollouts",
        advanced=True,
    )
    tree_prune: str = option(
        "siblings",
        "Tree rollouts: which branches are pruned. tree (ISP-KGR App. F.5, Alg. 1): one cache "
        "per question tree, a branch whose successful observation any kept branch of the tree "
        "already gave is pruned, failed branches are all kept; siblings (kgsynth's earlier "
        "rule): among one parent's children only, failures with the same text pruned too.",
        panel="Rollouts",
        advanced=True,
    )
    progress_rule: str = option(
        "best",
        "The distance reward's per-step progress: previous (ISP-KGR Alg. 2 and App. F.8: "
        "each step against the step before, an unknown <node> -1, COUNT and superlative "
        "questions read from the gold SPARQL) or best (kgsynth's earlier rule: against the "
        "best distance reached so far).",
        panel="Rewards",
        advanced=True,
    )
    question_curriculum: str = option(
        "none",
        "Order of the questions: none (shuffled) or difficulty (ISP-KGR §5.1, App. E.1: easy, "
        "then medium, then hard questions by the reasoning steps of their gold SPARQL, each "
        "stage shuffled; all shuffled together after the first pass).",
        panel="Rollouts",
        advanced=True,
    )
    ppo_mini_batch: int | None = option(
        None,
        "PPO mini-batch, in questions (each with all its rollouts): a step's questions are cut "
        "into mini-batches of this many, in order, and each takes one optimizer step, its loss "
        "normalised over its own tokens (KBQA-R1 V-A4: 128 of a batch of 256 = 2 steps). At or "
        "above --questions-per-step: one optimizer step on the whole batch. \\[default: the "
        "whole batch]",
        advanced=True,
    )
    ppo_epochs: int = option(
        1,
        "Passes over a step's rollouts, each taking one optimizer step per mini-batch; 1 with "
        "one mini-batch = the on-policy single update (KnowCoder-A1 4.3.1). N with no "
        "--ppo-mini-batch is kgsynth's earlier --updates-per-step N (N whole-batch updates).",
        aliases=("--updates-per-step",),
        advanced=True,
    )
    loss_agg: str = option(
        "token-mean",
        "How the loss averages tokens: token-mean (every assistant token of the mini-batch "
        "weighs the same; DAPO) or seq-mean-token-mean (each sequence's mean over its tokens, "
        "then the mean over sequences: GraphWalker Eq. 4, ISP-KGR App. G.1).",
        advanced=True,
    )
    micro_batch_size: int = option(8, "Rollouts per forward pass in the update.", advanced=True)
    max_grad_norm: float = option(1.0, HELP["max_grad_norm"], advanced=True)
    weight_decay: float = option(0.0, HELP["weight_decay"], advanced=True)
    warmup_steps: int = option(0, "Linear learning-rate warm-up steps.", advanced=True)
    warmup_ratio: float | None = option(
        None,
        "Warm-up as a share of --max-steps (KBQA-R1: 0.3); wins over --warmup-steps.",
        advanced=True,
    )
    temperature: float = option(
        1.0, "Sampling temperature of rollouts.", panel="Rollouts", advanced=True
    )
    top_p: float = option(
        1.0,
        "Nucleus sampling of rollouts: the probability mass kept.",
        panel="Rollouts",
        advanced=True,
    )
    # the agent that rolls out (its options by their own names; the turn-token cap None until
    # the recipe fills it); the CLI layers what --init carries under the preset, file and flags
    agent: AgentConfig = dataclasses.field(
        default_factory=lambda: AgentConfig(max_turn_tokens=None)
    )
    max_obs_tokens: int = option(
        512, "Observation tokens kept per call.", panel="Agent", advanced=True
    )
    rollout_timeout_s: float = option(
        300.0,
        "Seconds per rollout before it is ended where it is.",
        aliases=("--rollout-timeout",),
        panel="Rollouts",
        advanced=True,
    )
    rollout_batch_size: int = option(
        64, "Sequences per generate() call.", panel="Rollouts", advanced=True
    )
    rollout_engine: str = option(
        "auto",
        "What samples the rollouts: hf (transformers generate on the policy itself), static (a "
        "Llama policy with a KV cache kept across turns, its steps in native code on a CPU: "
        "small policies), auto (static where it runs the policy on a CPU, else hf) or vllm "
        "(in-process, refreshed after every update; pip install kgsynth[vllm], a CUDA GPU, "
        "--top-p 1).",
        panel="Rollouts",
        advanced=True,
    )
    vllm_gpu_memory_utilization: float = option(
        0.3,
        "--rollout-engine vllm: the share of each rank's GPU its vLLM engine takes (its copy of "
        "the weights and KV cache); the policy, reference and optimizer need the rest.",
        panel="Rollouts",
        advanced=True,
    )
    logprob_tolerance: float | None = option(
        None,
        "The alignment check: stop the run when a step's mean |rollout log-prob - training "
        "forward log-prob| over sampled tokens exceeds this. \\[default: 0.05 for hf, 0.2 for "
        "vllm]",
        panel="Rollouts",
        advanced=True,
    )
    allow_toolset_change: bool = option(False, ALLOW_TOOLSET_CHANGE_HELP, panel="Agent")
    report_to: str = option("none", HELP["report_to"], panel="Output")
    lora_r: int = option(
        0,
        HELP["lora_r"] + " The KL reference is the adapter switched off.",
        panel="Model",
        advanced=True,
    )
    lora_alpha: float = option(16.0, HELP["lora_alpha"], panel="Model", advanced=True)
    lora_dropout: float = option(0.05, HELP["lora_dropout"], panel="Model", advanced=True)
    lora_target: str = option("all-linear", HELP["lora_target"], panel="Model", advanced=True)
    distance_max_depth: int = option(
        3,
        "The distance reward's search depth (hops from the topic entities).",
        panel="Rewards",
        advanced=True,
    )
    save_steps: int = option(25, "Checkpoint every N steps.", panel="Output", advanced=True)
    select_questions: str | None = option(
        None, HELP["select_questions"], panel="Early stopping", advanced=True
    )
    select_limit: int = option(150, HELP["select_limit"], panel="Early stopping", advanced=True)
    select_alpha: float = option(0.05, HELP["select_alpha"], panel="Early stopping", advanced=True)
    select_cache: str | None = option(
        None, HELP["select_cache"], panel="Early stopping", advanced=True
    )
    logging_steps: int = option(1, "Write metrics every N steps.", panel="Output", advanced=True)
    seed: int = option(0, HELP["seed"])
    deepspeed: str | None = option(None, HELP["deepspeed"], panel="Launch")
    precision: str = option("auto", HELP["precision"], panel="Model", advanced=True)

    def __post_init__(self) -> None:
        """Every check of the values; one reading a recipe field waits until it is filled."""
        c = self
        for name, low in (("group_size", 2), ("questions_per_step", 1)):
            value = getattr(c, name)
            need(value is None or value >= low, f"{name} must be >= {low} (got {value})")
        need(c.max_steps >= 1, f"max_steps must be >= 1 (got {c.max_steps})")
        check_selection(c)
        need(c.lr is None or 0 < c.lr < 1, f"lr must be in (0, 1) (got {c.lr})")
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
        need(c.rollout in ROLLOUTS, f"rollout must be flat or tree (got {c.rollout!r})")
        need(
            c.dynamic_sampling_rounds >= 1,
            f"dynamic_sampling_rounds must be >= 1 (got {c.dynamic_sampling_rounds})",
        )
        need(
            not (c.dynamic_sampling and c.rollout == "tree"),
            "dynamic_sampling applies to flat rollouts (a tree's sibling groups are its own)",
        )
        need(c.branches >= 2, f"branches must be >= 2 (got {c.branches})")
        # below --branches it caps the root's branches too (--preset isp --max-tree-nodes 8)
        need(c.max_tree_nodes >= 2, f"max_tree_nodes must be >= 2 (got {c.max_tree_nodes})")
        need(
            c.tree_value in ("max", "mean"),
            f"tree_value must be max or mean (got {c.tree_value!r})",
        )
        for name, values in ISP_CHOICES.items():  # ISP-KGR's rollout and reward variants
            value = getattr(c, name)
            need(value in values, f"{name} must be {' or '.join(values)} (got {value!r})")
        need(
            c.ppo_mini_batch is None or c.ppo_mini_batch >= 1,
            f"ppo_mini_batch must be >= 1 (got {c.ppo_mini_batch})",
        )
        need(c.ppo_epochs >= 1, f"ppo_epochs must be >= 1 (got {c.ppo_epochs})")
        need(
            c.loss_agg in LOSS_AGGS,
            f"loss_agg must be {' or '.join(LOSS_AGGS)} (got {c.loss_agg!r})",
        )
        need(c.micro_batch_size >= 1, f"micro_batch_size must be >= 1 (got {c.micro_batch_size})")
        need(c.max_grad_norm > 0, f"max_grad_norm must be > 0 (got {c.max_grad_norm})")
        need(c.temperature > 0, f"temperature must be > 0 for sampling (got {c.temperature})")
        need(0 < c.top_p <= 1, f"top_p must be in (0, 1] (got {c.top_p})")
        need(c.max_obs_tokens >= 8, f"max_obs_tokens must be >= 8 (got {c.max_obs_tokens})")
        need(
            c.rollout_engine in ENGINES,
            f"rollout_engine must be {' or '.join(ENGINES)} (got {c.rollout_engine!r})",
        )
        need(
            0 < c.vllm_gpu_memory_utilization < 1,
            f"vllm_gpu_memory_utilization must be in (0, 1) (got {c.vllm_gpu_memory_utilization})",
        )
        need(
            c.logprob_tolerance is None or c.logprob_tolerance > 0,
            f"logprob_tolerance must be > 0 (got {c.logprob_tolerance})",
        )
        if c.rollout_engine == "vllm":
            # vLLM's log-probs are of the nucleus, which the training forward does not compute
            need(c.top_p == 1, f"--rollout-engine vllm needs top_p 1 (got {c.top_p})")
            need(
                not c.lora_r,
                "--rollout-engine vllm with lora_r is not built yet: merge the adapter "
                "(kgsynth train merge) or use --rollout-engine hf",
            )
        need(c.rollout_timeout_s > 0, f"rollout_timeout_s must be > 0 (got {c.rollout_timeout_s})")
        need(c.save_steps >= 1, f"save_steps must be >= 1 (got {c.save_steps})")
        need(c.logging_steps >= 1, f"logging_steps must be >= 1 (got {c.logging_steps})")
        need(
            c.precision in PRECISIONS,
            f"precision must be auto, bf16 or fp32 (got {c.precision!r})",
        )
        check_tracking_and_lora(c)
        rewards = reward_spec(c)  # names and weights checked
        need(
            c.phase2_questions is None or "fbeta" in rewards.components,
            "phase2_questions needs the fbeta reward (its switch starts the second phase)",
        )


def resolve_config(cfg: GRPOConfig) -> GRPOConfig:
    """Fill the recipe's defaults and check each field; errors name the field and range. A
    per-turn or per-observation token cap above ``init``'s positions is lowered to them, with
    a warning."""
    if not cfg.init or not is_model_folder(cfg.init):
        raise ConfigError(
            f"--init: {cfg.init or '(none)'} holds no saved model (config.json); "
            "give a `kgsynth train stage2` (or stage1) output folder"
        )
    if is_adapter(cfg.init):  # a LoRA start whose base is gone fails now, not after staging
        adapter_base(cfg.init, fix=MERGE_FIX)
    if cfg.recipe:
        recipe = cfg.recipe
    else:  # what the init folder was trained with: tiny, or anything else (the default)
        recorded = recorded_recipe(cfg.init, (SFT_SPEC, RL_CONFIG))
        recipe = "tiny" if recorded == "tiny" else "default"
    c = replace_options(cfg, recipe=recipe, **fill_recipe(cfg, RECIPES, recipe))
    # a turn or an observation longer than the model's positions cannot be held in its context
    c = replace_options(
        c,
        max_turn_tokens=fit_to_model("max_turn_tokens", option_value(c, "max_turn_tokens"), c.init),
        max_obs_tokens=fit_to_model("max_obs_tokens", c.max_obs_tokens, c.init),
    )
    check_selection_inputs(c)
    if c.phase2_questions is not None and not Path(c.phase2_questions).is_file():
        raise InputFileError(Path(c.phase2_questions), "does not exist (--phase2-questions)")
    if c.deepspeed is not None:
        load_deepspeed_config(c.deepspeed)
    if c.rollout_engine == "vllm":
        from kgsynth.agent.engines import EngineUnavailable, check_vllm_available

        try:
            check_vllm_available()
        except EngineUnavailable as exc:
            raise ConfigError(str(exc)) from None
    return c


LOGPROB_TOLERANCE = {"auto": 0.05, "hf": 0.05, "static": 0.05, "vllm": 0.2}


def logprob_tolerance(cfg: GRPOConfig) -> float:
    """The alignment check's bound: the option, or the engine's default."""
    if cfg.logprob_tolerance is not None:
        return cfg.logprob_tolerance
    return LOGPROB_TOLERANCE[cfg.rollout_engine]


def mini_batch_questions(cfg: GRPOConfig) -> int:
    """Questions per PPO mini-batch: ``ppo_mini_batch``, at most the step's questions."""
    step = int(cfg.questions_per_step or 1)
    return min(cfg.ppo_mini_batch or step, step)


def optimizer_steps(cfg: GRPOConfig) -> int:
    """Optimizer steps per RL step: mini-batches per pass times ``ppo_epochs``."""
    step = int(cfg.questions_per_step or 1)
    return math.ceil(step / mini_batch_questions(cfg)) * cfg.ppo_epochs


def warmup_steps(cfg: GRPOConfig) -> int:
    """Linear warm-up length: ``warmup_ratio`` of ``max_steps`` (rounded) when set, else
    ``warmup_steps``."""
    if cfg.warmup_ratio is not None:
        return round(cfg.warmup_ratio * cfg.max_steps)
    return max(0, cfg.warmup_steps)


def reward_spec(cfg: GRPOConfig) -> Any:
    """The weighted reward the config names, with its F-beta curriculum switch."""
    from kgsynth.agent.rewards import RewardSpec

    # None keeps the preset's (or the default) curriculum switch
    return RewardSpec.parse(
        cfg.reward,
        fbeta_switch_step=cfg.fbeta_switch_step,
        fbeta_switch_reward=cfg.fbeta_switch_reward,
    )
