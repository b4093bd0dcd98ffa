"""The options of ``kgsynth train stage1|stage2`` (:class:`SFTConfig`), their two recipes and
their checks.

``None`` fields are filled from the recipe by :func:`resolve_config`, which also checks what
only the stage and the files can tell (``--model``/``--init``, the DeepSpeed config). Every
check of the values themselves, alone or against each other, is in
:meth:`SFTConfig.__post_init__`; a check reading a field the recipe fills runs once it is
filled.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kgsynth.agent.config import AGENT_FIELDS, AgentConfig
from kgsynth.core.config import option
from kgsynth.core.errors import ConfigError
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
    SFT_SPEC,
    check_selection,
    check_selection_inputs,
    check_tracking_and_lora,
    fill_recipe,
    load_deepspeed_config,
    need,
    recorded_recipe,
)

STAGES = ("stage1", "stage2")
# Both recipes set the same fields, so they look alike line for line: that is the point.
RECIPES: dict[str, dict[str, Any]] = {
    "graphwalker": dict(
        lr=1e-5,
        batch_size=32,
        micro_batch_size=4,
        epochs=2.0,
        max_length=4096,
        packing=False,
        warmup_ratio=0.03,
        logging_steps=10,
        save_steps=500,
        copy_drills=0,
        copy_warmup_steps=0,
    ),
    "tiny": dict(
        lr=1e-3,
        batch_size=8,
        micro_batch_size=8,
        epochs=3.0,
        max_length=1024,
        packing=False,
        warmup_ratio=0.03,
        logging_steps=5,
        save_steps=50,
        copy_drills=0,
        copy_warmup_steps=0,
    ),
}
SCHEDULERS = ("cosine", "linear", "constant_with_warmup")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
LOGITS = ("labelled", "all")
TINY_INIT = "init-tiny"
CHECKPOINTS = "checkpoints"
SPEC = SFT_SPEC
SUMMARY = "train_summary.json"
METRICS = "metrics.jsonl"
LOSS_PNG = "loss.png"
# the SFT stages' early stopping (--select-questions)
SELECT_FIELDS = ("select_questions", "select_kg", "select_limit", "select_alpha", "select_cache")
# Changing these between an interrupted run and its resumption keeps it the same run.
RESUMABLE_CHANGES = frozenset(
    {"max_steps", "epochs", "logging_steps", "save_steps", *SELECT_FIELDS, *AGENT_FIELDS}
)
_RECIPES = "\\[default: recipe's]"


@dataclass(frozen=True)
class SFTConfig:
    """Options of ``kgsynth train stage1|stage2``. ``None`` fields are filled from the recipe
    by :func:`resolve_config`; ``batch_size`` is the global batch (rows per optimizer step:
    trajectories without packing, packed rows of up to ``max_length`` tokens with it)."""

    model: str | None = option(
        None,
        "A local HF checkpoint folder, or 'tiny' (a small Llama built offline, its tokenizer "
        "trained on the corpus).",
        panel="Model",
    )
    init: str | None = option(
        None, "The stage-1 output folder (weights and tokenizer).", panel="Model"
    )
    recipe: str | None = option(
        None,
        "Defaults: graphwalker (lr 1e-5, batch 32, 2 epochs, 4096 tokens) or tiny (CPU). "
        "\\[default: tiny for --model tiny, else graphwalker]",
        advanced=True,
    )
    epochs: float | None = option(None, f"Epochs. {_RECIPES}")
    max_steps: int | None = option(None, "Optimizer steps; overrides --epochs when set.")
    lr: float | None = option(None, f"Peak learning rate. {_RECIPES}")
    batch_size: int | None = option(
        None,
        "Global batch: rows per optimizer step (trajectories, or packed rows with --packing). "
        + _RECIPES,
    )
    micro_batch_size: int | None = option(
        None,
        "Rows per device per forward pass; gradient accumulation makes up the rest. " + _RECIPES,
        advanced=True,
    )
    max_length: int | None = option(
        None, f"Tokens per row; longer trajectories are dropped and counted. {_RECIPES}"
    )
    packing: bool | None = option(
        None,
        f"Pack trajectories into rows (else length-bucketed batches). {_RECIPES}",
        advanced=True,
    )
    warmup_ratio: float | None = option(
        None, f"Warmup as a fraction of the steps. {_RECIPES}", advanced=True
    )
    lr_scheduler: str = option("cosine", "cosine, linear or constant_with_warmup.", advanced=True)
    weight_decay: float = option(0.0, HELP["weight_decay"], advanced=True)
    max_grad_norm: float = option(1.0, HELP["max_grad_norm"], advanced=True)
    seed: int = option(0, HELP["seed"])
    logging_steps: int | None = option(
        None, f"Write metrics every N steps. {_RECIPES}", panel="Output", advanced=True
    )
    save_steps: int | None = option(
        None, f"Checkpoint every N steps. {_RECIPES}", panel="Output", advanced=True
    )
    save_total_limit: int = option(
        2, "Checkpoints kept in OUT/checkpoints (the oldest go).", panel="Output", advanced=True
    )
    deepspeed: str | None = option(None, HELP["deepspeed"], panel="Launch")
    precision: str = option("auto", HELP["precision"], panel="Model", advanced=True)
    gradient_checkpointing: bool = option(
        False, "Recompute activations to save memory.", panel="Model", advanced=True
    )
    attn_implementation: str = option(
        "sdpa", "sdpa, eager or flash_attention_2.", panel="Model", advanced=True
    )
    logits: str = option(
        "labelled",
        "Where the LM head and the loss run: labelled (only the positions the loss scores: the "
        "same loss and gradients, less time and memory; models that cannot slice by a mask "
        "fall back to all) or all.",
        panel="Model",
        advanced=True,
    )
    tiny_vocab_size: int = option(2000, "tiny: BPE vocabulary cap.", panel="Model", advanced=True)
    tiny_hidden_size: int = option(64, "tiny: hidden size.", panel="Model", advanced=True)
    tiny_layers: int = option(2, "tiny: layers.", panel="Model", advanced=True)
    tiny_heads: int = option(4, "tiny: attention heads.", panel="Model", advanced=True)
    tiny_kv_heads: int | None = option(
        None,
        "tiny: key-value heads (default: tiny_heads); fewer share each among tiny_heads / "
        "tiny_kv_heads query heads (grouped-query attention: a smaller KV cache, faster rollouts).",
        panel="Model",
        advanced=True,
    )
    tiny_init_std: float = option(
        0.1, "tiny: normal-init spread of the weights.", panel="Model", advanced=True
    )
    copy_drills: int | None = option(
        None,
        "Short name-copy conversations made from the corpus's own entity names, mixed into the "
        "training rows (teaches a model trained from scratch to copy names). " + _RECIPES,
        advanced=True,
    )
    copy_warmup_steps: int | None = option(
        None,
        "Steps on name-copy drills (batches of --copy-warmup-batch-size, from the corpus's own "
        "entity names) before the trajectories: a model trained from scratch learns to copy "
        "names in a minute this way. " + _RECIPES,
        advanced=True,
    )
    copy_warmup_batch_size: int = option(32, "Drills per copy warm-up step.", advanced=True)
    # 2.5e-3: the drill loss after 1,000 steps, 3 seeds, 0.42 / 0.50 / 1.00 against 1.32 /
    # 0.74 / 1.56 at 5e-3 (benchmarks/README.md, "the copy warm-up's learning rate")
    copy_warmup_lr: float = option(2.5e-3, "Learning rate of the copy warm-up.", advanced=True)
    copy_warmup_target: float | None = option(
        None,
        "Drill loss (mean of the warm-up's last tenth) the copy warm-up must reach: above it, "
        "the weights go back to their initial values and the warm-up runs again on drills of "
        "another seed, up to --copy-warmup-tries times in all (a tiny model learns to copy "
        "later on some seeds than on others). None: one warm-up, whatever its loss.",
        advanced=True,
    )
    copy_warmup_max_steps: int | None = option(
        None,
        "With --copy-warmup-target: a warm-up still above the target after "
        "--copy-warmup-steps drills on, checking every tenth of --copy-warmup-steps, up to this "
        "many steps in all, before it counts as missed. None: no extension.",
        advanced=True,
    )
    copy_warmup_tries: int = option(
        1, "Most copy warm-ups with --copy-warmup-target.", advanced=True
    )
    report_to: str = option("none", HELP["report_to"], panel="Output")
    lora_r: int = option(0, HELP["lora_r"], panel="Model", advanced=True)
    lora_alpha: float = option(16.0, HELP["lora_alpha"], panel="Model", advanced=True)
    lora_dropout: float = option(0.05, HELP["lora_dropout"], panel="Model", advanced=True)
    lora_target: str = option("all-linear", HELP["lora_target"], panel="Model", advanced=True)
    select_questions: str | None = option(
        None, HELP["select_questions"], panel="Early stopping", advanced=True
    )
    select_kg: str | None = option(
        None,
        "--select-questions: the KG they are answered on (as --kg). \\[default: the shipped KB]",
        panel="Early stopping",
        advanced=True,
    )
    select_limit: int = option(150, HELP["select_limit"], panel="Early stopping", advanced=True)
    select_alpha: float = option(0.05, HELP["select_alpha"], panel="Early stopping", advanced=True)
    select_cache: str | None = option(
        None, HELP["select_cache"], panel="Early stopping", advanced=True
    )
    # the agent the run trains for: its corpus's settings (the CLI layers them first), the
    # recipe's and the flags' over them; it answers --select-questions (stage 2)
    agent: AgentConfig = dataclasses.field(default_factory=AgentConfig)

    def __post_init__(self) -> None:
        """Every check of the values; one reading a recipe field waits until it is filled."""
        c = self
        need(c.lr is None or 0 < c.lr < 1, f"lr must be in (0, 1) (got {c.lr})")
        need(c.epochs is None or c.epochs > 0, f"epochs must be > 0 (got {c.epochs})")
        need(c.max_steps is None or c.max_steps >= 1, f"max_steps must be >= 1 (got {c.max_steps})")
        need(
            c.batch_size is None or c.batch_size >= 1,
            f"batch_size must be >= 1 (got {c.batch_size})",
        )
        batch, micro = c.batch_size, c.micro_batch_size
        if batch is not None and micro is not None:
            need(
                1 <= micro <= batch,
                f"micro_batch_size must be in [1, batch_size={batch}] (got {micro})",
            )
            need(
                batch % micro == 0,
                f"batch_size ({batch}) must be a multiple of micro_batch_size ({micro})",
            )
        need(
            c.max_length is None or c.max_length >= 16,
            f"max_length must be >= 16 (got {c.max_length})",
        )
        need(
            c.warmup_ratio is None or 0 <= c.warmup_ratio < 1,
            f"warmup_ratio must be in [0, 1) (got {c.warmup_ratio})",
        )
        need(
            c.lr_scheduler in SCHEDULERS,
            f"lr_scheduler must be one of {', '.join(SCHEDULERS)} (got {c.lr_scheduler!r})",
        )
        need(c.weight_decay >= 0, f"weight_decay must be >= 0 (got {c.weight_decay})")
        need(c.max_grad_norm > 0, f"max_grad_norm must be > 0 (got {c.max_grad_norm})")
        for name in ("logging_steps", "save_steps"):
            value = getattr(c, name)
            need(value is None or value >= 1, f"{name} must be >= 1 (got {value})")
        need(c.save_total_limit >= 1, f"save_total_limit must be >= 1 (got {c.save_total_limit})")
        need(
            c.precision in PRECISIONS,
            f"precision must be one of {', '.join(PRECISIONS)} (got {c.precision!r})",
        )
        need(
            c.attn_implementation in ATTENTION,
            f"attn_implementation must be one of {', '.join(ATTENTION)} "
            f"(got {c.attn_implementation!r})",
        )
        need(c.logits in LOGITS, f"logits must be one of {', '.join(LOGITS)} (got {c.logits!r})")
        # transformers only finds packed sequences for FlashAttention in a flattened batch of one
        need(
            not (c.packing and c.attn_implementation == "flash_attention_2" and micro != 1)
            or micro is None,
            "attn_implementation flash_attention_2 with packing needs micro_batch_size 1 "
            "(or use sdpa, which masks packed samples at any micro-batch size)",
        )
        self._check_tiny_and_copy()
        check_tracking_and_lora(c)
        check_selection(c)

    def _check_tiny_and_copy(self) -> None:
        c = self
        need(
            c.tiny_hidden_size % (2 * max(1, c.tiny_heads)) == 0,
            f"tiny_hidden_size ({c.tiny_hidden_size}) must be a multiple of 2 * tiny_heads "
            f"({c.tiny_heads})",
        )
        kv = c.tiny_heads if c.tiny_kv_heads is None else c.tiny_kv_heads
        need(
            kv >= 1 and c.tiny_heads % kv == 0,
            f"tiny_heads ({c.tiny_heads}) must be a multiple of tiny_kv_heads ({kv})",
        )
        need(c.tiny_layers >= 1, f"tiny_layers must be >= 1 (got {c.tiny_layers})")
        need(
            0 < c.tiny_init_std <= 1 and math.isfinite(c.tiny_init_std),
            f"tiny_init_std must be in (0, 1] (got {c.tiny_init_std})",
        )
        need((c.copy_drills or 0) >= 0, f"copy_drills must be >= 0 (got {c.copy_drills})")
        need(
            (c.copy_warmup_steps or 0) >= 0,
            f"copy_warmup_steps must be >= 0 (got {c.copy_warmup_steps})",
        )
        need(
            0 < c.copy_warmup_lr < 1 and math.isfinite(c.copy_warmup_lr),
            f"copy_warmup_lr must be in (0, 1) (got {c.copy_warmup_lr})",
        )
        need(
            c.copy_warmup_target is None
            or (c.copy_warmup_target > 0 and math.isfinite(c.copy_warmup_target)),
            f"copy_warmup_target must be > 0 (got {c.copy_warmup_target})",
        )
        need(
            c.copy_warmup_tries >= 1, f"copy_warmup_tries must be >= 1 (got {c.copy_warmup_tries})"
        )
        need(
            c.copy_warmup_max_steps is None
            or c.copy_warmup_max_steps >= (c.copy_warmup_steps or 0),
            f"copy_warmup_max_steps must be >= copy_warmup_steps (got {c.copy_warmup_max_steps})",
        )
        need(
            c.copy_warmup_batch_size >= 1,
            f"copy_warmup_batch_size must be >= 1 (got {c.copy_warmup_batch_size})",
        )
        need(c.tiny_vocab_size >= 300, f"tiny_vocab_size must be >= 300 (got {c.tiny_vocab_size})")


def _check_start(cfg: SFTConfig, stage: str) -> None:
    """What a stage starts from: stage 1 a ``--model``, stage 2 a stage-1 folder; a LoRA
    folder's base must be found (before the run folder is made)."""
    if stage not in STAGES:
        raise ConfigError(f"stage must be one of {', '.join(STAGES)} (got {stage!r})")
    start = cfg.init if stage == "stage2" else cfg.model
    if start and is_adapter(start):
        adapter_base(start, fix=MERGE_FIX)
    if stage == "stage1":
        if not cfg.model:
            raise ConfigError("--model: stage1 needs a local HF checkpoint folder or 'tiny'")
        if cfg.init:
            raise ConfigError("--init belongs to stage2; stage1 starts from --model")
        if cfg.model != "tiny" and not is_model_folder(cfg.model):
            raise ConfigError(
                f"--model: {cfg.model} is not a local HF checkpoint folder (no config.json) "
                "and not 'tiny'; nothing is downloaded"
            )
        return
    if not cfg.init:
        raise ConfigError("--init: stage2 needs a stage-1 output folder")
    if cfg.model:
        raise ConfigError("--model belongs to stage1; stage2 starts from --init")
    if not is_model_folder(cfg.init):
        raise ConfigError(
            f"--init: {cfg.init} holds no saved model (config.json); run `kgsynth train stage1` first"
        )


def resolve_config(cfg: SFTConfig, stage: str) -> SFTConfig:
    """Fill the recipe's defaults and check every field; errors name the field and range.
    ``max_length`` above the starting model's positions is lowered to them, with a warning."""
    _check_start(cfg, stage)
    recipe = cfg.recipe
    if recipe is None:
        if stage == "stage1":
            recipe = "tiny" if cfg.model == "tiny" else "graphwalker"
        else:
            recipe = recorded_recipe(cfg.init or "") or "graphwalker"
    filled = fill_recipe(cfg, RECIPES, recipe)
    if cfg.batch_size is not None and cfg.micro_batch_size is None and cfg.batch_size >= 1:
        # the recipe's micro-batch, or the largest divisor of the batch below it
        top = min(RECIPES[recipe]["micro_batch_size"], cfg.batch_size)
        filled["micro_batch_size"] = next(d for d in range(top, 0, -1) if cfg.batch_size % d == 0)
    out = dataclasses.replace(cfg, recipe=recipe, **filled)
    # a model of fewer positions trains on what it can hold (the tiny model is built to fit)
    start = cfg.init if stage == "stage2" else cfg.model if cfg.model != "tiny" else None
    out = dataclasses.replace(out, max_length=fit_to_model("max_length", out.max_length, start))
    check_selection_inputs(out)
    if out.deepspeed is not None:
        load_deepspeed_config(out.deepspeed)
    return out


def check_batch_split(cfg: Any, world: int) -> None:
    """A batch must split evenly into micro-batches on every process (checked before a launch
    too, so the error comes once, not from every worker)."""
    if cfg.batch_size % (cfg.micro_batch_size * world):
        raise ConfigError(
            f"batch_size ({cfg.batch_size}) must be a multiple of micro_batch_size × processes "
            f"({cfg.micro_batch_size} × {world})"
        )
