"""Supervised fine-tuning (SFT) of the agent policy on trajectories: stage 1 and stage 2.

``corpus/accepted.parquet`` + a model -> ``OUT/``: a ``save_pretrained`` folder (weights,
tokenizer, chat template, generation config) that transformers and vLLM load, plus
``checkpoints/checkpoint-N`` (resumable), ``metrics.jsonl``, ``loss.png``,
``train_summary.json`` and (written by the CLI) ``manifest.json``::

    kgsynth train stage1 --corpus corpus/accepted.parquet --model tiny --out runs/x/stage1
    kgsynth train stage2 --corpus corpus/expert.parquet --init runs/x/stage1 --out runs/x/stage2

Stage 1 starts from ``--model`` (a local HF checkpoint folder, or ``tiny``: a small Qwen2 model
with a byte-level BPE tokenizer trained on the corpus, built offline by
:func:`kgsynth.tiny.build_tiny_model`). Stage 2 starts from a stage-1 output folder
(``--init``), its weights and its tokenizer. Both are the same SFT; the stages differ in what
they start from and, in the papers, in their data (synthetic walks, then expert or
rejection-sampled trajectories).

Trainer: transformers' ``Trainer``, subclassed only to count tokens for the metrics. It
brings the maintained DeepSpeed/ZeRO integration, gradient accumulation with token-level
loss normalisation (``num_items_in_batch``), warmup + cosine, bf16 autocast, resumable
checkpoints (optimizer, scheduler, RNG and sampler position) and ``save_model`` that gathers
ZeRO-3 shards. TRL's ``SFTTrainer`` was not used: it tokenizes and masks conversations itself
(its own chat-template path and ``assistant_only_loss`` generation tags), and this project has
one renderer and one loss mask (:mod:`kgsynth.agent.render`) shared with GRPO; feeding it
pre-tokenized rows leaves nothing it adds over ``Trainer``. Data rules (the loss mask, the
over-long rule, packing) are in :mod:`kgsynth.train.data`.

Defaults come in two recipes, chosen by ``recipe`` (auto: ``tiny`` for ``--model tiny`` and
for a stage 2 whose ``--init`` was a tiny run, else ``graphwalker``) and recorded, resolved,
in the manifest:

- ``graphwalker`` (the GraphWalker SFT seed): lr 1e-5, cosine, batch 32 trajectories, 2 epochs,
  max length 4096; no packing (length-bucketed batches), so a batch counts trajectories as the
  seed's does. Warmup 3% and micro-batch 4 are ours (the seed does not state them).
- ``tiny`` (a 2-core CPU in about a minute for a few hundred trajectories): lr 1e-3, batch 8
  trajectories of up to 1024 tokens in length-grouped batches, 3 epochs, warmup 3%. Not
  packed: on this model and a CPU, attention over full packed rows cost more than the padding
  it saves (``benchmarks/bench_sft.py``: packed 0.68x the tokens/s of unpacked, 2026-11-23).

Precision: bf16 (autocast, fp32 master weights) on a CUDA GPU with bf16, fp32 on CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.agent.loop import SYSTEM_PROMPT_FILE
from kgsynth.errors import ConfigError, InputFileError
from kgsynth.modelio import is_model_folder
from kgsynth.train.drills import copy_drills
from kgsynth.train.probe import copy_loss

log = logging.getLogger(__name__)

STAGES = ("stage1", "stage2")
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
PRECISIONS = ("auto", "bf16", "fp32")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
TINY_INIT = "init-tiny"
CHECKPOINTS = "checkpoints"
SPEC = "train_config.json"
SUMMARY = "train_summary.json"
METRICS = "metrics.jsonl"
LOSS_PNG = "loss.png"
# Changing these between an interrupted run and its resumption keeps it the same run.
RESUMABLE_CHANGES = frozenset({"max_steps", "epochs", "logging_steps", "save_steps"})


@dataclass(frozen=True)
class SFTConfig:
    """Options of ``kgsynth train stage1|stage2``. ``None`` fields are filled from the recipe
    by :func:`resolve_config`; ``batch_size`` is the global batch (rows per optimizer step:
    trajectories without packing, packed rows of up to ``max_length`` tokens with it)."""

    model: str | None = None  # stage 1: a local HF checkpoint folder, or "tiny"
    init: str | None = None  # stage 2: a stage-1 output folder
    recipe: str | None = None  # graphwalker | tiny (default: from the model)
    epochs: float | None = None
    max_steps: int | None = None  # overrides epochs when set
    lr: float | None = None
    batch_size: int | None = None
    micro_batch_size: int | None = None  # rows per device per forward pass
    max_length: int | None = None
    packing: bool | None = None
    warmup_ratio: float | None = None
    lr_scheduler: str = "cosine"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    logging_steps: int | None = None
    save_steps: int | None = None
    save_total_limit: int = 2
    deepspeed: str | None = None  # a ZeRO config JSON (train/ds_zero{0,2,3}.json)
    precision: str = "auto"  # auto: bf16 on a CUDA GPU, fp32 on CPU
    gradient_checkpointing: bool = False
    attn_implementation: str = "sdpa"
    tiny_vocab_size: int = 2000
    tiny_hidden_size: int = 64
    tiny_layers: int = 2
    tiny_heads: int = 4
    tiny_init_std: float = 0.1
    copy_drills: int | None = None  # short name-copy conversations mixed in (drills.py)
    copy_warmup_steps: int | None = None  # steps on copy drills before the trajectories
    copy_warmup_batch_size: int = 32
    copy_warmup_lr: float = 5e-3
    report_to: str = "none"  # none | tensorboard (RUN/tensorboard) | wandb (kgsynth.tracking)
    lora_r: int = 0  # > 0: train LoRA adapters of this rank instead of every weight (lora.py)
    lora_alpha: float = 16.0
    lora_dropout: float = 0.05
    lora_target: str = "all-linear"  # module names, comma-separated, or all-linear


def _init_recipe(init: str) -> str | None:
    """The recipe a stage-1 folder was trained with (from its spec), if it says."""
    spec = Path(init) / SPEC
    try:
        return json.loads(spec.read_text())["config"]["recipe"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resolve_config(cfg: SFTConfig, stage: str) -> SFTConfig:
    """Fill the recipe's defaults and check every field; errors name the field and range."""
    if stage not in STAGES:
        raise ConfigError(f"stage must be one of {', '.join(STAGES)} (got {stage!r})")
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
    else:
        if not cfg.init:
            raise ConfigError("--init: stage2 needs a stage-1 output folder")
        if cfg.model:
            raise ConfigError("--model belongs to stage1; stage2 starts from --init")
        if not is_model_folder(cfg.init):
            raise ConfigError(
                f"--init: {cfg.init} holds no saved model (config.json); run `kgsynth train stage1` first"
            )
    recipe = cfg.recipe
    if recipe is None:
        if stage == "stage1":
            recipe = "tiny" if cfg.model == "tiny" else "graphwalker"
        else:
            recipe = _init_recipe(cfg.init or "") or "graphwalker"
    if recipe not in RECIPES:
        raise ConfigError(f"recipe must be one of {', '.join(RECIPES)} (got {recipe!r})")
    filled = {
        k: (v if getattr(cfg, k) is None else getattr(cfg, k)) for k, v in RECIPES[recipe].items()
    }
    if cfg.batch_size is not None and cfg.micro_batch_size is None and cfg.batch_size >= 1:
        # the recipe's micro-batch, or the largest divisor of the batch below it
        top = min(RECIPES[recipe]["micro_batch_size"], cfg.batch_size)
        filled["micro_batch_size"] = next(d for d in range(top, 0, -1) if cfg.batch_size % d == 0)
    out = dataclasses.replace(cfg, recipe=recipe, **filled)
    _check(out)
    return out


def _check(c: SFTConfig) -> None:
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    need(c.lr is not None and 0 < c.lr < 1, f"lr must be in (0, 1) (got {c.lr})")
    need(c.epochs is not None and c.epochs > 0, f"epochs must be > 0 (got {c.epochs})")
    need(c.max_steps is None or c.max_steps >= 1, f"max_steps must be >= 1 (got {c.max_steps})")
    need(
        c.batch_size is not None and c.batch_size >= 1,
        f"batch_size must be >= 1 (got {c.batch_size})",
    )
    need(
        c.micro_batch_size is not None and 1 <= c.micro_batch_size <= (c.batch_size or 0),
        f"micro_batch_size must be in [1, batch_size={c.batch_size}] (got {c.micro_batch_size})",
    )
    need(
        (c.batch_size or 0) % (c.micro_batch_size or 1) == 0,
        f"batch_size ({c.batch_size}) must be a multiple of micro_batch_size ({c.micro_batch_size})",
    )
    need(
        c.max_length is not None and c.max_length >= 16,
        f"max_length must be >= 16 (got {c.max_length})",
    )
    need(
        c.warmup_ratio is not None and 0 <= c.warmup_ratio < 1,
        f"warmup_ratio must be in [0, 1) (got {c.warmup_ratio})",
    )
    need(
        c.lr_scheduler in SCHEDULERS,
        f"lr_scheduler must be one of {', '.join(SCHEDULERS)} (got {c.lr_scheduler!r})",
    )
    need(c.weight_decay >= 0, f"weight_decay must be >= 0 (got {c.weight_decay})")
    need(c.max_grad_norm > 0, f"max_grad_norm must be > 0 (got {c.max_grad_norm})")
    need((c.logging_steps or 0) >= 1, f"logging_steps must be >= 1 (got {c.logging_steps})")
    need((c.save_steps or 0) >= 1, f"save_steps must be >= 1 (got {c.save_steps})")
    need(c.save_total_limit >= 1, f"save_total_limit must be >= 1 (got {c.save_total_limit})")
    need(
        c.precision in PRECISIONS,
        f"precision must be one of {', '.join(PRECISIONS)} (got {c.precision!r})",
    )
    need(
        c.attn_implementation in ATTENTION,
        f"attn_implementation must be one of {', '.join(ATTENTION)} (got {c.attn_implementation!r})",
    )
    # transformers only finds packed sequences for FlashAttention in a flattened batch of one
    need(
        not (
            c.packing and c.attn_implementation == "flash_attention_2" and c.micro_batch_size != 1
        ),
        "attn_implementation flash_attention_2 with packing needs micro_batch_size 1 "
        "(or use sdpa, which masks packed samples at any micro-batch size)",
    )
    need(
        c.tiny_hidden_size % (2 * max(1, c.tiny_heads)) == 0,
        f"tiny_hidden_size ({c.tiny_hidden_size}) must be a multiple of 2 * tiny_heads ({c.tiny_heads})",
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
        c.copy_warmup_batch_size >= 1,
        f"copy_warmup_batch_size must be >= 1 (got {c.copy_warmup_batch_size})",
    )
    need(c.tiny_vocab_size >= 300, f"tiny_vocab_size must be >= 300 (got {c.tiny_vocab_size})")
    from kgsynth.tracking import check_report_to

    check_report_to(c.report_to)
    from kgsynth.train.lora import check_lora

    check_lora(c.lora_r, c.lora_alpha, c.lora_dropout, c.lora_target)
    if c.deepspeed is not None:
        load_deepspeed_config(c.deepspeed)


def load_deepspeed_config(path: str | Path) -> dict[str, Any]:
    """A ZeRO config file as a dict; errors name the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--deepspeed: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"--deepspeed: {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or "zero_optimization" not in data:
        raise ConfigError(f"--deepspeed: {path} must be a DeepSpeed config with zero_optimization")
    return data


# ---------------------------------------------------------------------------------------------
# Run folder


@dataclass(frozen=True)
class RunSpec:
    """Everything a training process needs; written to ``OUT/train_config.json`` so launched
    workers (and a resumed run) read the same resolved configuration."""

    stage: str
    corpus: str
    out: str
    config: SFTConfig

    @property
    def model_path(self) -> Path:
        c = self.config
        if self.stage == "stage2":
            return Path(c.init or "")
        return Path(self.out) / TINY_INIT if c.model == "tiny" else Path(c.model or "")

    def to_json(self) -> str:
        return json.dumps(
            {
                "stage": self.stage,
                "corpus": self.corpus,
                "out": self.out,
                "config": dataclasses.asdict(self.config),
            },
            indent=2,
        )

    @classmethod
    def read(cls, path: str | Path) -> RunSpec:
        data = json.loads(Path(path).read_text())
        return cls(data["stage"], data["corpus"], data["out"], SFTConfig(**data["config"]))


def prepare_run(
    cfg: SFTConfig, stage: str, corpus: str | Path, out: str | Path, *, overwrite: bool = False
) -> RunSpec:
    """Resolve the config, validate the corpus, set up ``out`` and build the tiny model.

    A folder holding an earlier run of the same configuration is resumed from its last
    checkpoint; a finished run (one with its ``manifest.json``, written last) or a different
    configuration there is an error unless ``overwrite`` (which deletes the earlier run). Runs once, before any training process starts."""
    from kgsynth.train.data import corpus_texts, read_corpus

    cfg = resolve_config(cfg, stage)
    out = Path(out)
    spec = RunSpec(stage, str(Path(corpus)), str(out), cfg)
    conversations = read_corpus(corpus)
    old = out / SPEC
    if out.exists() and {p.name for p in out.iterdir()} <= {TINY_INIT, SPEC + ".tmp"}:
        # the leftovers of a run stopped while it was being prepared: start it afresh
        shutil.rmtree(out)
    if out.exists() and any(out.iterdir()):
        if not old.is_file():
            raise ConfigError(
                f"--out: {out} is not empty and holds no kgsynth training run; choose a new folder"
            )
        if overwrite:
            shutil.rmtree(out)
        elif (out / "manifest.json").is_file():
            raise ConfigError(
                f"--out: {out} holds a finished run (its manifest.json); pass --overwrite to "
                "train it again, or choose a new --out"
            )
        else:
            try:
                before = RunSpec.read(old)
            except (ValueError, KeyError, TypeError) as exc:
                raise InputFileError(old, f"unreadable ({exc}); use --overwrite") from None
            changed = _changed_fields(before, spec)
            if changed:
                raise ConfigError(
                    f"--out: {out} holds a run with different {', '.join(changed)}; "
                    "use --overwrite to start over, or a new --out"
                )
    out.mkdir(parents=True, exist_ok=True)
    if stage == "stage1" and cfg.model == "tiny" and not (out / TINY_INIT / "config.json").exists():
        from kgsynth.tiny import build_tiny_model

        build_tiny_model(
            corpus_texts(conversations),
            out / TINY_INIT,
            vocab_size=cfg.tiny_vocab_size,
            hidden_size=cfg.tiny_hidden_size,
            num_layers=cfg.tiny_layers,
            num_heads=cfg.tiny_heads,
            init_std=cfg.tiny_init_std,
            max_position=max(2048, cfg.max_length or 0),
            seed=cfg.seed,
        )
    tmp = old.with_name(old.name + ".tmp")
    tmp.write_text(spec.to_json() + "\n")
    os.replace(tmp, old)
    return spec


def _changed_fields(before: RunSpec, now: RunSpec) -> list[str]:
    changed = [k for k in ("stage", "corpus") if getattr(before, k) != getattr(now, k)]
    a, b = dataclasses.asdict(before.config), dataclasses.asdict(now.config)
    changed += [k for k in a if a[k] != b.get(k) and k not in RESUMABLE_CHANGES]
    return changed


# ---------------------------------------------------------------------------------------------
# Distributed set-up


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def single_process_env() -> Iterator[bool]:
    """``MASTER_ADDR/PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` for a one-process
    DeepSpeed run (without them DeepSpeed looks for MPI). Variables already set, as a launcher
    sets them, are left alone. Yields whether it set them; restores the environment after."""
    keys = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    # accelerate leaves these behind, and a later run in this process would take them up
    left_behind = ("LOCAL_WORLD_SIZE", "ACCELERATE_USE_DEEPSPEED")
    if "WORLD_SIZE" in os.environ:
        yield False
        return
    keys += left_behind
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    try:
        yield True
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------------------------
# Trainer


def _make_trainer_class() -> type:
    """``Trainer`` plus token counting (imported lazily: importing kgsynth loads no torch)."""
    import torch
    from transformers import Trainer

    class TokenCountingTrainer(Trainer):
        """Counts real, padded and labelled tokens per micro-batch and adds tokens/s and the
        non-padding fraction (over the logging window, and its worst batch) to every log."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._window_start: float | None = None  # set by the window's first micro-batch
            self._counts: torch.Tensor | None = None  # real, padded, labelled (on device)
            self._worst: torch.Tensor | None = None  # lowest non-padding fraction of a batch
            self.tokens_seen = 0  # over the whole run, resumed runs included
            self.loss_tokens_seen = 0
            self.session_tokens = 0  # this session only (a resumed run starts a session)
            self.session_padded = 0

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            real = inputs.pop("num_real_tokens", None)
            padded = inputs.pop("num_padded_tokens", None)
            if real is not None and padded is not None and model.training:
                if self._window_start is None:
                    self._window_start = time.perf_counter()
                labelled = (inputs["labels"] != -100).sum()
                row = torch.stack([real, padded, labelled]).to(torch.float64)
                frac = row[:1] / row[1:2].clamp(min=1)
                self._counts = row if self._counts is None else self._counts + row
                self._worst = frac if self._worst is None else torch.minimum(self._worst, frac)
            # with a KV cache transformers skips packed-sequence detection, and packed samples
            # would attend to each other
            inputs = {**inputs, "use_cache": False}
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if "loss" in logs:
                device = self.args.device
                counts = self._counts if self._counts is not None else torch.zeros(3)
                worst = self._worst if self._worst is not None else torch.ones(1)
                counts = counts.to(device, torch.float64)
                worst = worst.to(device, torch.float64)
                if self.args.world_size > 1:  # every rank logs at the same steps
                    counts = self.accelerator.reduce(counts, reduction="sum")
                    worst = self.accelerator.gather(worst).min().reshape(1)
                real, padded, labelled = (float(x) for x in counts.cpu())
                now = time.perf_counter()
                elapsed = now - (self._window_start or now)
                self.tokens_seen += int(real)
                self.loss_tokens_seen += int(labelled)
                self.session_tokens += int(real)
                self.session_padded += int(padded)
                logs["tokens_per_s"] = round(real / elapsed, 1) if elapsed > 0 else 0.0
                logs["nonpad_fraction"] = round(real / padded, 4) if padded else 0.0
                logs["worst_batch_nonpad_fraction"] = round(float(worst.cpu()), 4)
                logs["tokens"] = self.tokens_seen
                logs["loss_tokens"] = self.loss_tokens_seen
                self._counts, self._worst, self._window_start = None, None, now
            super().log(logs, start_time)

    return TokenCountingTrainer


def _metrics_callback(path: Path, progress: Callable[[int, int, dict], None] | None) -> Any:
    from transformers import TrainerCallback

    class MetricsCallback(TrainerCallback):
        """Appends every training log (the ones with a loss) to ``metrics.jsonl``."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "loss" in logs and state.is_world_process_zero:
                row = {"step": state.global_step, **logs, "time": round(time.time(), 3)}
                with path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
            if progress is not None and state.is_world_process_zero:
                progress(state.global_step, state.max_steps, logs)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= state.max_steps:
                control.should_log = True  # the last loss belongs in the curve
            if progress is not None and state.is_world_process_zero:
                progress(state.global_step, state.max_steps, {})

    return MetricsCallback()


def _store_system_prompt(folder: Path, system_text: str | None) -> None:
    """Eval, RL and rollouts of a checkpoint prompt it the way it was trained."""
    if system_text is not None:
        (folder / SYSTEM_PROMPT_FILE).write_text(system_text, encoding="utf-8")


def _prompt_callback(system_text: str | None) -> Any:
    from transformers import TrainerCallback

    class PromptCallback(TrainerCallback):
        """Stores the system prompt in every intermediate checkpoint too."""

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if folder.is_dir():
                    _store_system_prompt(folder, system_text)

    return PromptCallback()


def last_complete_checkpoint(ckpt_dir: Path) -> str | None:
    """The newest ``checkpoint-N`` that was saved whole, or None.

    The Trainer writes a checkpoint in place: weights, then optimizer, scheduler and RNG
    states, then ``trainer_state.json``. A run killed while saving leaves a folder without the
    last of these, and resuming from it would silently start with a fresh optimizer, so such
    folders are passed over (the resumed run saves them again when it gets there)."""
    if not ckpt_dir.is_dir():
        return None
    steps = []
    for folder in ckpt_dir.iterdir():
        m = re.fullmatch(r"checkpoint-(\d+)", folder.name)
        if m and folder.is_dir() and (folder / "trainer_state.json").is_file():
            steps.append((int(m.group(1)), folder))
    return str(max(steps)[1]) if steps else None


def _keep_metrics_upto(path: Path, step: int) -> None:
    """Drop metric lines a killed run logged after the checkpoint it resumes from."""
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    kept = [ln for ln in lines if json.loads(ln).get("step", 0) <= step]
    if len(kept) != len(lines):
        path.write_text("".join(ln + "\n" for ln in kept))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def loss_curve_png(metrics: Sequence[dict[str, Any]], path: str | Path, title: str) -> None:
    """Training loss (and learning rate) against the optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, [m["loss"] for m in metrics], color="#4477aa", marker=".", label="loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (mean over assistant tokens)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if metrics and "learning_rate" in metrics[0]:
        lr_ax = ax.twinx()
        lr_ax.plot(
            steps,
            [m.get("learning_rate", math.nan) for m in metrics],
            color="#ccbb44",
            linewidth=1,
            label="learning rate",
        )
        lr_ax.set_ylabel("learning rate")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def resolve_precision(precision: str) -> tuple[bool, bool]:
    """(use_cpu, bf16) for this machine and a ``precision`` option (auto, bf16, fp32); shared
    by SFT and GRPO."""
    import torch

    cuda = torch.cuda.is_available()
    bf16_ok = cuda and torch.cuda.is_bf16_supported()
    if precision == "bf16" and not bf16_ok:
        raise ConfigError("precision bf16 needs a CUDA GPU with bf16; use fp32 (or auto) on CPU")
    return (not cuda), (precision == "bf16" or (precision == "auto" and bf16_ok))


PROBE_MIN_CORPUS = 256  # smaller corpora are all trained on
PROBE_ROWS = 64


def _probe_split(n: int, seed: int) -> list[int]:
    """Indices of the trajectories held out for the copy probe (none for small corpora)."""
    import random

    if n < PROBE_MIN_CORPUS:
        return []
    return sorted(random.Random(f"copy-probe|{seed}").sample(range(n), PROBE_ROWS))


def corpus_system_prompt(conversations: Sequence[Sequence[dict[str, Any]]]) -> str | None:
    """The system prompt most of the corpus's trajectories start with, if any."""
    from collections import Counter

    counts = Counter(c[0]["content"] for c in conversations if c and c[0].get("role") == "system")
    return counts.most_common(1)[0][0] if counts else None


def train_sft(
    spec: RunSpec,
    *,
    callbacks: Sequence[Any] = (),
    progress: Callable[[int, int, dict], None] | None = None,
) -> dict[str, Any]:
    """Train, save the final model into ``spec.out`` and return a summary.

    Resumes from the last checkpoint in ``OUT/checkpoints`` when there is one. Every process
    of a launched run calls this; rank 0 writes the metrics, the loss curve and
    ``train_summary.json``. ``callbacks`` are extra ``transformers.TrainerCallback`` objects;
    ``progress(step, max_steps, logs)`` is called on rank 0 after each step."""
    started = time.perf_counter()
    cfg = spec.config
    use_deepspeed = cfg.deepspeed is not None
    env = single_process_env() if use_deepspeed else contextlib.nullcontext(False)
    # The process group a one-process DeepSpeed run starts stays up after it (DeepSpeed caches
    # its groups; a later run in the same process reuses it rather than starting another).
    with env:
        try:
            return _train(spec, callbacks, progress, started)
        finally:
            if use_deepspeed:
                from transformers.integrations.deepspeed import unset_hf_deepspeed_config

                unset_hf_deepspeed_config()


def _train(
    spec: RunSpec,
    callbacks: Sequence[Any],
    progress: Callable[[int, int, dict], None] | None,
    started: float,
) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer, TrainingArguments

    from kgsynth.agent.render import CHATML_TEMPLATE
    from kgsynth.train.data import Collator, RowDataset, build_samples, make_rows, read_corpus

    cfg = spec.config
    out = Path(spec.out)
    assert cfg.recipe is not None and cfg.max_length is not None  # resolved
    assert cfg.batch_size is not None and cfg.micro_batch_size is not None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_step = cfg.micro_batch_size * world
    if cfg.batch_size % per_step:
        raise ConfigError(
            f"batch_size ({cfg.batch_size}) must be a multiple of micro_batch_size × processes "
            f"({cfg.micro_batch_size} × {world})"
        )
    use_cpu, bf16 = resolve_precision(cfg.precision)
    ds_config = load_deepspeed_config(cfg.deepspeed) if cfg.deepspeed else None
    if ds_config is not None and use_cpu:
        # DeepSpeed's CPU backend otherwise probes its ops with test compiles and JIT-builds
        # its shared-memory all-reduce (a C++ compile, ~1 min, needs a compiler) on first use;
        # gloo does the same job. The table is the one DeepSpeed reads (deepspeed/comm/torch.py).
        import deepspeed.ops

        deepspeed.ops.__dict__.setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False
    ckpt_dir = out / CHECKPOINTS
    # TrainingArguments before the model: under ZeRO-3 from_pretrained then partitions on load.
    args = TrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=cfg.batch_size // per_step,
        num_train_epochs=float(cfg.epochs or 1.0),
        max_steps=cfg.max_steps or -1,
        learning_rate=float(cfg.lr or 0.0),
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=float(cfg.warmup_ratio or 0.0),
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        optim="adamw_torch",
        logging_strategy="steps",
        logging_steps=cfg.logging_steps or 1,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=cfg.save_steps or 1,
        save_total_limit=cfg.save_total_limit,
        seed=cfg.seed,
        data_seed=cfg.seed,
        bf16=bf16,
        use_cpu=use_cpu,
        # gloo only for a distributed CPU run: naming a backend makes accelerate start one
        ddp_backend="gloo" if use_cpu and "WORLD_SIZE" in os.environ else None,
        deepspeed=ds_config,
        activation_checkpointing=cfg.gradient_checkpointing,
        train_sampling_strategy="random" if cfg.packing else "group_by_length",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        report_to="wandb" if cfg.report_to == "wandb" else "none",  # transformers' integration
        disable_tqdm=progress is not None,
    )
    rank0 = args.process_index == 0

    model_path = spec.model_path
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        # the renderer fell back to ChatML; the saved folder must render the same way
        tokenizer.chat_template = CHATML_TEMPLATE

    conversations = read_corpus(spec.corpus)
    system_text = corpus_system_prompt(conversations)
    # A few trajectories are held out of the optimisation to measure copying (probe.py):
    # the loss on names the policy must copy from its context, before and after training.
    zero3 = bool(ds_config and (ds_config.get("zero_optimization") or {}).get("stage") == 3)
    probe_rows = [] if zero3 else _probe_split(len(conversations), cfg.seed)
    probe = [conversations[i] for i in probe_rows]
    if probe_rows:
        held = set(probe_rows)
        train_conversations = [c for i, c in enumerate(conversations) if i not in held]
    else:
        train_conversations = conversations
    drills = copy_drills(train_conversations, int(cfg.copy_drills or 0), cfg.seed)
    samples, stats = build_samples(tokenizer, [*train_conversations, *drills], cfg.max_length)
    if not samples:
        raise InputFileError(
            spec.corpus,
            f"no trajectory fits max_length {cfg.max_length} with an assistant token "
            f"({stats.dropped_overlong} over-long, {stats.dropped_no_assistant} without assistant turns)",
        )
    rows = make_rows(samples, cfg.max_length, bool(cfg.packing), stats)
    if stats.dropped_overlong:
        log.warning(
            "dropped %d of %d trajectories longer than max_length %d tokens",
            stats.dropped_overlong,
            stats.rows,
            cfg.max_length,
        )

    from kgsynth.modelio import load_causal_lm

    model = load_causal_lm(
        model_path, dtype=torch.float32, attn_implementation=cfg.attn_implementation
    )
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and cfg.max_length > limit:
        raise ConfigError(
            f"max_length ({cfg.max_length}) exceeds the model's max_position_embeddings ({limit})"
        )
    copy_loss_start = copy_loss(model, tokenizer, probe) if probe and rank0 else None
    if cfg.lora_r:
        from kgsynth.train.lora import wrap

        model = wrap(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target)
    model.config.use_cache = False
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())

    metrics_path = out / METRICS
    if cfg.report_to == "tensorboard" and rank0:  # transformers' own callback, into RUN/tensorboard
        from torch.utils.tensorboard import SummaryWriter
        from transformers.integrations import TensorBoardCallback

        from kgsynth.tracking import TB_DIR

        callbacks = [*callbacks, TensorBoardCallback(SummaryWriter(log_dir=str(out / TB_DIR)))]
    trainer_cls = _make_trainer_class()
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=RowDataset(rows),
        data_collator=Collator(tokenizer.pad_token_id, pad_to_multiple_of=1 if use_cpu else 8),
        processing_class=tokenizer,
        callbacks=[
            _metrics_callback(metrics_path, progress),
            _prompt_callback(system_text),
            *callbacks,
        ],
    )
    if progress is not None:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # the caller shows progress; metrics.jsonl logs
    last = last_complete_checkpoint(ckpt_dir)
    warmup_stats = None
    if cfg.copy_warmup_steps and last is None:
        # a resumed run's weights already hold the warm-up; a fresh one does it first
        from kgsynth.train.drills import warm_up

        n = cfg.copy_warmup_steps * cfg.copy_warmup_batch_size
        warmup_stats = warm_up(
            model,
            tokenizer,
            copy_drills(train_conversations, n, cfg.seed),
            steps=cfg.copy_warmup_steps,
            batch_size=cfg.copy_warmup_batch_size,
            lr=cfg.copy_warmup_lr,
            seed=cfg.seed,
        )
        if probe and rank0:
            warmup_stats["copy_probe_loss"] = copy_loss(model, tokenizer, probe)
        log.info("copy warm-up: %s", warmup_stats)
    resumed_from = None
    if last is not None:
        resumed_from = int(Path(last).name.split("-")[-1])
        if rank0:  # only rank 0 writes (and logs) the metrics
            _keep_metrics_upto(metrics_path, resumed_from)
            done = read_metrics(metrics_path)
            if done:
                trainer.tokens_seen = int(done[-1].get("tokens", 0))
                trainer.loss_tokens_seen = int(done[-1].get("loss_tokens", 0))
        log.info("resuming from %s", last)
    elif rank0 and metrics_path.exists():
        metrics_path.unlink()
    result = trainer.train(resume_from_checkpoint=last)

    model.config.use_cache = True
    trainer.save_model(str(out))  # weights, config, generation config, tokenizer + template
    if rank0:
        _store_system_prompt(out, system_text)
    trainer.accelerator.wait_for_everyone()

    summary: dict[str, Any] = {}
    if rank0:
        copy_loss_end = copy_loss(model, tokenizer, probe) if probe else None
        metrics = read_metrics(metrics_path)
        loss_curve_png(metrics, out / LOSS_PNG, f"{spec.stage} SFT ({cfg.recipe} recipe)")
        wall = time.perf_counter() - started
        train_s = float(result.metrics.get("train_runtime", wall))
        summary = {
            "stage": spec.stage,
            "model_path": str(model_path),
            "parameters": int(n_params),
            "world_size": world,
            "device": "cpu" if use_cpu else torch.cuda.get_device_name(0),
            "precision": "bf16" if bf16 else "fp32",
            "deepspeed": ds_config,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "data": stats.as_dict(),
            "steps": trainer.state.global_step,
            "max_steps": trainer.state.max_steps,
            "epochs_done": round(trainer.state.epoch or 0.0, 4),
            "resumed_from_step": resumed_from,
            "loss_first": metrics[0]["loss"] if metrics else None,
            "loss_last": metrics[-1]["loss"] if metrics else None,
            "train_loss_mean": result.training_loss,
            "copy_drills": len(drills),
            "copy_warmup": warmup_stats,
            "copy_probe": {
                "trajectories": len(probe),
                "loss_start": copy_loss_start,
                "loss_end": copy_loss_end,
            },
            "tokens_trained": trainer.tokens_seen,
            "loss_tokens_trained": trainer.loss_tokens_seen,
            "tokens_per_s": round(trainer.session_tokens / max(1e-9, train_s), 1),
            "nonpad_fraction": round(trainer.session_tokens / max(1, trainer.session_padded), 4),
            "train_runtime_s": round(train_s, 3),
            "wall_s": round(wall, 3),
            "final_model": str(out),
            "metrics": str(metrics_path),
            "loss_png": str(out / LOSS_PNG),
            "checkpoints": str(ckpt_dir),
        }
        tmp = out / (SUMMARY + ".tmp")
        tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        os.replace(tmp, out / SUMMARY)
    return summary
