"""Supervised fine-tuning (SFT) of the agent policy on trajectories: stage 1 and stage 2.

``corpus/accepted.parquet`` + a model -> ``OUT/``: a ``save_pretrained`` folder (weights,
tokenizer, chat template, generation config) that transformers and vLLM load, plus
``checkpoints/checkpoint-N`` (resumable), ``metrics.jsonl``, ``loss.png``,
``train_summary.json`` and (written by the CLI) ``manifest.json``::

    kgsynth train stage1 --corpus corpus/accepted.parquet --model tiny --out runs/x/stage1
    kgsynth train stage2 --corpus corpus/expert.parquet --init runs/x/stage1 --out runs/x/stage2

Stage 1 starts from ``--model`` (a local HF checkpoint folder, or ``tiny``: a small Llama model
with a byte-level BPE tokenizer trained on the corpus, built offline by
:func:`kgsynth.train.tiny.build_tiny_model`). Stage 2 starts from a stage-1 output folder
(``--init``), its weights and its tokenizer. Both are the same SFT; the stages differ in what
they start from and, in the papers, in their data (synthetic walks, then expert or
rejection-sampled trajectories).

Trainer: transformers' ``Trainer``, subclassed to count tokens for the metrics and to draw
each epoch's row order from the seed and the epoch alone (:class:`kgsynth.train.data.RowOrder`).
It brings the maintained DeepSpeed/ZeRO integration, gradient accumulation with token-level
loss normalisation (``num_items_in_batch``), warmup + cosine, bf16 autocast, resumable
checkpoints (optimizer, scheduler, RNG and sampler position) and ``save_model`` that gathers
ZeRO-3 shards. Resuming from any checkpoint, inside an epoch too, ends in the weights of the
uninterrupted run, byte for byte (``tests/test_sft_resume_exact.py``). TRL's ``SFTTrainer`` was not used: it tokenizes and masks conversations itself
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

Modules: the options and recipes are :mod:`kgsynth.train.sft_config`, the run folder
:mod:`kgsynth.train.sft_run`, the ``Trainer`` additions :mod:`kgsynth.train.sft_trainer`, the
placement, model and trainer a run sets up :mod:`kgsynth.train.sft_setup`, and what GRPO shares
:mod:`kgsynth.train.core`; this module is the training run itself and re-exports the names
callers use.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kgsynth.core.errors import InputFileError
from kgsynth.core.modelio import record_adapter_base
from kgsynth.train.core import (
    deepspeed_env,
    load_deepspeed_config,
    resolve_precision,
    single_process_env,
    store_system_prompt,
    write_json_atomic,
)
from kgsynth.train.drills import copy_drills, corpus_toolset
from kgsynth.train.plots import loss_curve_png
from kgsynth.train.probe import copy_loss
from kgsynth.train.sft_config import (
    ATTENTION,
    CHECKPOINTS,
    LOSS_PNG,
    METRICS,
    PRECISIONS,
    RECIPES,
    RESUMABLE_CHANGES,
    SCHEDULERS,
    SPEC,
    STAGES,
    SUMMARY,
    TINY_INIT,
    SFTConfig,
    resolve_config,
)
from kgsynth.train.sft_run import (
    RunSpec,
    keep_metrics_upto,
    last_complete_checkpoint,
    prepare_run,
    read_metrics,
)
from kgsynth.train.sft_setup import Placement, load_model, make_trainer, resolve_placement

log = logging.getLogger(__name__)

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
    use_deepspeed = spec.config.deepspeed is not None
    # The process group a one-process DeepSpeed run starts stays up after it (DeepSpeed caches
    # its groups; a later run in the same process reuses it rather than starting another).
    with deepspeed_env(spec.config.deepspeed):
        try:
            return _train(spec, callbacks, progress, started)
        finally:
            if use_deepspeed:
                from transformers.integrations.deepspeed import unset_hf_deepspeed_config

                unset_hf_deepspeed_config()


def _training_data(spec: RunSpec, tokenizer: Any, zero3: bool) -> dict[str, Any]:
    """The corpus split into training rows and the copy probe's held-out trajectories.

    A few trajectories are held out of the optimisation to measure copying (probe.py): the
    loss on names the policy must copy from its context, before and after training."""
    from kgsynth.train.data import build_samples, make_rows, read_corpus

    cfg = spec.config
    assert cfg.max_length is not None  # resolved
    conversations = read_corpus(spec.corpus)
    probe_rows = [] if zero3 else _probe_split(len(conversations), cfg.seed)
    held = set(probe_rows)
    train = [c for i, c in enumerate(conversations) if i not in held] if held else conversations
    toolset = corpus_toolset(spec.corpus, cfg.init)  # drills in the corpus's action space
    drills = copy_drills(train, int(cfg.copy_drills or 0), cfg.seed, toolset)
    samples, stats = build_samples(tokenizer, [*train, *drills], cfg.max_length)
    if not samples:
        raise InputFileError(
            spec.corpus,
            f"no trajectory fits max_length {cfg.max_length} with an assistant token "
            f"({stats.dropped_overlong} over-long, {stats.dropped_no_assistant} without assistant turns)",
        )
    rows = make_rows(samples, cfg.max_length, bool(cfg.packing), stats)
    if stats.dropped_overlong and int(os.environ.get("RANK", "0")) == 0:  # once per run
        log.warning(
            "dropped %d of %d trajectories longer than max_length %d tokens",
            stats.dropped_overlong,
            stats.rows,
            cfg.max_length,
        )
    return {
        "system_text": corpus_system_prompt(conversations),
        "train": train,
        "probe": [conversations[i] for i in probe_rows],
        "drills": drills,
        "toolset": toolset,
        "rows": rows,
        "stats": stats,
    }


def _copy_warm_up(
    model: Any,
    tokenizer: Any,
    data: dict[str, Any],
    cfg: SFTConfig,
    *,
    verbose: bool = False,
    masked_logits: bool = False,
) -> dict:
    """A fresh run's steps on name-copy drills before the trajectories (drills.py); with
    ``verbose``, its drill loss is logged every tenth of its steps; ``masked_logits`` as the
    trainer's."""
    from kgsynth.train.drills import warm_up

    assert cfg.copy_warmup_steps  # only called for a warm-up
    n = cfg.copy_warmup_steps * cfg.copy_warmup_batch_size
    drills = copy_drills(data["train"], n, cfg.seed, data.get("toolset"))
    if not drills:  # the observations show fewer than two names a drill can copy
        log.warning("copy warm-up skipped: the corpus's observations show no names to drill on")
        return {"steps": 0, "skipped": "the corpus's observations show no names to drill on"}
    tries = cfg.copy_warmup_tries if cfg.copy_warmup_target is not None else 1
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()} if tries > 1 else None
    losses: list[float] = []
    for attempt in range(tries):
        if attempt:  # the warm-up before missed the target: start again from the same weights
            model.load_state_dict(initial)
            drills = copy_drills(data["train"], n, cfg.seed + attempt, data.get("toolset"))
        stats = warm_up(
            model,
            tokenizer,
            drills,
            steps=cfg.copy_warmup_steps,
            batch_size=cfg.copy_warmup_batch_size,
            lr=cfg.copy_warmup_lr,
            seed=cfg.seed + attempt,
            target=cfg.copy_warmup_target,
            max_steps=cfg.copy_warmup_max_steps,
            progress=_warm_up_log(cfg, attempt + 1) if verbose else None,
            masked_logits=masked_logits,
        )
        losses.append(stats["loss_last_tenth"])
        target = cfg.copy_warmup_target
        if target is None or (stats["loss_last_tenth"] or 0.0) <= target:
            break
        if attempt + 1 == tries:
            log.warning(
                "copy warm-up: all %d tries ended above the drill-loss target %.3f (%s); "
                "training goes on from the last",
                tries, target, ", ".join(f"{x:.3f}" for x in losses),
            )  # fmt: skip
        else:
            log.warning(
                "copy warm-up %d of %d ended at drill loss %.3f, above the target %.3f: "
                "drilling again from the initial weights with seed %d",
                attempt + 1, tries, losses[-1], target, cfg.seed + attempt + 1,
            )  # fmt: skip
    return {**stats, "tries": len(losses), "loss_last_tenth_per_try": losses}


def _warm_up_log(cfg: SFTConfig, attempt: int) -> Callable[[int, float], None]:
    steps = cfg.copy_warmup_steps or 0
    every = max(1, steps // 10)
    more = cfg.copy_warmup_max_steps if cfg.copy_warmup_target is not None else None
    plan = f"{steps}" + (f", up to {more} above the target" if more and more > steps else "")

    def progress(step: int, loss: float) -> None:
        if step % every == 0:
            log.info("copy warm-up (try %d): step %d (%s), drill loss %.3f", attempt, step, plan,
                     loss)  # fmt: skip

    return progress


def _start_or_resume(
    spec: RunSpec, trainer: Any, model: Any, tokenizer: Any, data: dict[str, Any], rank0: bool
) -> tuple[str | None, int | None, dict | None]:
    """A fresh run's copy warm-up, or a resumed run's token totals: the last complete
    checkpoint (None for a fresh run), its step and the warm-up's stats."""
    from kgsynth.train.sft_trainer import read_run_state

    cfg, out = spec.config, Path(spec.out)
    metrics_path = out / METRICS
    probe = data["probe"]
    last = last_complete_checkpoint(out / CHECKPOINTS)
    warmup_stats = None
    if cfg.copy_warmup_steps and last is None:
        # a resumed run's weights already hold the warm-up; a fresh one does it first
        warmup_stats = _copy_warm_up(
            model, tokenizer, data, cfg, verbose=rank0, masked_logits=trainer.masked_logits
        )
        if probe and rank0:
            warmup_stats["copy_probe_loss"] = copy_loss(model, tokenizer, probe)
        log.info("copy warm-up: %s", warmup_stats)
    resumed_from = None
    if last is not None:
        resumed_from = int(Path(last).name.split("-")[-1])
        if rank0:  # only rank 0 writes (and logs) the metrics
            keep_metrics_upto(metrics_path, resumed_from)
            state = read_run_state(last)
            if state is not None:
                trainer.restore_run_state(state)
            else:  # a checkpoint saved before it kept the totals: its last metrics line's
                done = read_metrics(metrics_path)
                if done:
                    trainer.tokens_seen = int(done[-1].get("tokens", 0))
                    trainer.loss_tokens_seen = int(done[-1].get("loss_tokens", 0))
        log.info("resuming from %s", last)
    elif rank0 and metrics_path.exists():
        metrics_path.unlink()
    return last, resumed_from, warmup_stats


def _train(
    spec: RunSpec,
    callbacks: Sequence[Any],
    progress: Callable[[int, int, dict], None] | None,
    started: float,
) -> dict[str, Any]:
    """:func:`train_sft`'s run: set up, warm up or resume, train, save, summarise."""
    from kgsynth.train.sft_trainer import RunComplete, load_tokenizer

    cfg = spec.config
    out = Path(spec.out)
    placement = resolve_placement(cfg, out / CHECKPOINTS, progress is not None)
    rank0 = placement.rank0
    tokenizer = load_tokenizer(spec.model_path)
    data = _training_data(spec, tokenizer, placement.zero3)
    probe = data["probe"]
    model, copy_loss_start, n_params = load_model(spec, tokenizer, probe, rank0)
    trainer = make_trainer(spec, model, tokenizer, data, placement, callbacks, progress)
    last, resumed_from, warmup_stats = _start_or_resume(
        spec, trainer, model, tokenizer, data, rank0
    )
    try:
        result = trainer.train(resume_from_checkpoint=last)
        train_s, train_loss = result.metrics.get("train_runtime"), result.training_loss
    except RunComplete:  # killed after its last checkpoint: the weights are that checkpoint's
        train_s, train_loss = 0.0, None

    model.config.use_cache = True
    trainer.save_model(str(out))  # weights, config, generation config, tokenizer + template
    if rank0:
        store_system_prompt(out, data["system_text"])
        record_adapter_base(out)  # a LoRA run's base: absolute and relative to the run folder
    trainer.accelerator.wait_for_everyone()
    if not rank0:
        return {}
    copy_loss_end = copy_loss(model, tokenizer, probe) if probe else None
    metrics = read_metrics(out / METRICS)
    loss_curve_png(metrics, out / LOSS_PNG, f"{spec.stage} SFT ({cfg.recipe} recipe)")
    wall = time.perf_counter() - started
    train_s = float(wall if train_s is None else train_s)
    summary = _summary(
        spec,
        placement,
        trainer,
        data,
        metrics,
        parameters=n_params,
        resumed_from=resumed_from,
        warmup_stats=warmup_stats,
        copy_losses=(copy_loss_start, copy_loss_end),
        train_loss=train_loss,
        times=(train_s, wall),
    )
    write_json_atomic(out / SUMMARY, summary)
    return summary


def _summary(
    spec: RunSpec,
    placement: Placement,
    trainer: Any,
    data: dict[str, Any],
    metrics: list[dict[str, Any]],
    *,
    parameters: int,
    resumed_from: int | None,
    warmup_stats: dict | None,
    copy_losses: tuple[float | None, float | None],
    train_loss: float | None,
    times: tuple[float, float],
) -> dict[str, Any]:
    """``train_summary.json``: the run's setup, steps, losses, token counts and speed;
    ``times`` is the training's seconds and the wall time."""
    import torch

    out = Path(spec.out)
    train_s, wall = times
    return {
        "stage": spec.stage,
        "model_path": str(spec.model_path),
        "parameters": int(parameters),
        "world_size": placement.world,
        "device": "cpu" if placement.use_cpu else torch.cuda.get_device_name(0),
        "precision": "bf16" if placement.bf16 else "fp32",
        "deepspeed": placement.ds_config,
        "gradient_accumulation_steps": placement.args.gradient_accumulation_steps,
        "data": data["stats"].as_dict(),
        "steps": trainer.state.global_step,
        "max_steps": trainer.state.max_steps,
        "epochs_done": round(trainer.state.epoch or 0.0, 4),
        "resumed_from_step": resumed_from,
        "loss_first": metrics[0]["loss"] if metrics else None,
        "loss_last": metrics[-1]["loss"] if metrics else None,
        "train_loss_mean": train_loss,
        "copy_drills": len(data["drills"]),
        "copy_warmup": warmup_stats,
        "copy_probe": {
            "trajectories": len(data["probe"]),
            "loss_start": copy_losses[0],
            "loss_end": copy_losses[1],
        },
        "tokens_trained": trainer.tokens_seen,
        "loss_tokens_trained": trainer.loss_tokens_seen,
        # "labelled": the LM head and the loss ran at the labelled positions only
        "logits": "labelled" if trainer.masked_logits else "all",
        "tokens_per_s": round(trainer.session_tokens / max(1e-9, train_s), 1),
        "nonpad_fraction": round(trainer.session_tokens / max(1, trainer.session_padded), 4),
        "train_runtime_s": round(train_s, 3),
        "wall_s": round(wall, 3),
        "final_model": str(out),
        "metrics": str(out / METRICS),
        "loss_png": str(out / LOSS_PNG),
        "checkpoints": str(out / CHECKPOINTS),
    }


__all__ = [
    "ATTENTION",
    "CHECKPOINTS",
    "LOSS_PNG",
    "METRICS",
    "PRECISIONS",
    "PROBE_ROWS",
    "RECIPES",
    "RESUMABLE_CHANGES",
    "SCHEDULERS",
    "SPEC",
    "STAGES",
    "SUMMARY",
    "TINY_INIT",
    "RunSpec",
    "SFTConfig",
    "corpus_system_prompt",
    "last_complete_checkpoint",
    "load_deepspeed_config",
    "loss_curve_png",
    "prepare_run",
    "read_metrics",
    "resolve_config",
    "resolve_precision",
    "single_process_env",
    "train_sft",
]
