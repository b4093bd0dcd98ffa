"""What an SFT run (:mod:`kgsynth.train.sft`) sets up before it trains: where it trains
(:class:`Placement`: processes, precision, DeepSpeed, ``TrainingArguments``), the model
(:func:`load_model`) and the trainer with its callbacks (:func:`make_trainer`). What needs torch
is imported inside the functions (importing kgsynth loads no torch)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError
from kgsynth.train.core import load_deepspeed_config, resolve_precision, use_gloo_on_cpu
from kgsynth.train.probe import copy_loss
from kgsynth.train.sft_config import METRICS, SFTConfig, check_batch_split
from kgsynth.train.sft_run import RunSpec


@dataclass(frozen=True)
class Placement:
    """Where the run trains: its processes, precision, DeepSpeed config and the resolved
    ``TrainingArguments``."""

    world: int
    use_cpu: bool
    bf16: bool
    ds_config: dict[str, Any] | None
    args: Any

    @property
    def rank0(self) -> bool:
        return self.args.process_index == 0

    @property
    def zero3(self) -> bool:
        ds_config = self.ds_config
        return bool(ds_config and (ds_config.get("zero_optimization") or {}).get("stage") == 3)


def resolve_placement(cfg: SFTConfig, ckpt_dir: Path, quiet: bool) -> Placement:
    """Check the batch split over the processes, resolve the precision, load the DeepSpeed
    config and build the ``TrainingArguments``; ``quiet`` turns transformers' bar off."""
    from kgsynth.train.sft_trainer import training_arguments

    assert cfg.recipe is not None and cfg.max_length is not None  # resolved
    assert cfg.batch_size is not None and cfg.micro_batch_size is not None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    check_batch_split(cfg, world)
    use_cpu, bf16 = resolve_precision(cfg.precision)
    ds_config = load_deepspeed_config(cfg.deepspeed) if cfg.deepspeed else None
    if ds_config is not None and use_cpu:
        use_gloo_on_cpu()
    # TrainingArguments before the model: under ZeRO-3 from_pretrained then partitions on load.
    args = training_arguments(cfg, ckpt_dir, world, (use_cpu, bf16), ds_config, quiet)
    return Placement(world, use_cpu, bf16, ds_config, args)


def load_model(
    spec: RunSpec, tokenizer: Any, probe: list[Any], rank0: bool
) -> tuple[Any, float | None, int]:
    """The model to train (LoRA-wrapped with ``lora_r``), the copy probe's loss before
    training (rank 0) and the parameter count."""
    import torch

    from kgsynth.core.modelio import load_causal_lm

    cfg = spec.config
    assert cfg.max_length is not None  # resolved
    model = load_causal_lm(
        spec.model_path, dtype=torch.float32, attn_implementation=cfg.attn_implementation
    )
    # resolve_config lowered max_length to the limit its files state; one they leave to the
    # architecture's default is only known now, after the rows were cut to max_length
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and cfg.max_length > limit:
        raise ConfigError(
            f"max_length ({cfg.max_length}) exceeds the model's max_position_embeddings ({limit}), "
            f"which its config.json does not state; pass --max-length {limit}"
        )
    copy_loss_start = copy_loss(model, tokenizer, probe) if probe and rank0 else None
    if cfg.lora_r:
        from kgsynth.train.lora import wrap

        model = wrap(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target)
    model.config.use_cache = False
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    return model, copy_loss_start, n_params


def make_trainer(
    spec: RunSpec,
    model: Any,
    tokenizer: Any,
    data: dict[str, Any],
    placement: Placement,
    callbacks: Sequence[Any],
    progress: Callable[[int, int, dict], None] | None,
) -> Any:
    """The trainer over the training rows, with the metrics writer, the prompt kept in every
    checkpoint, TensorBoard (``report_to``) and the caller's ``callbacks``."""
    from kgsynth.agent.carried import AGENT_CONFIG_FILE
    from kgsynth.train.data import Collator, RowDataset
    from kgsynth.train.sft_trainer import (
        make_trainer_class,
        masked_logits_supported,
        metrics_callback,
        prompt_callback,
    )

    cfg, out = spec.config, Path(spec.out)
    if (
        cfg.report_to == "tensorboard" and placement.rank0
    ):  # transformers' own, into RUN/tensorboard
        from torch.utils.tensorboard import SummaryWriter
        from transformers.integrations import TensorBoardCallback

        from kgsynth.core.tracking import TB_DIR

        callbacks = [*callbacks, TensorBoardCallback(SummaryWriter(log_dir=str(out / TB_DIR)))]
    trainer = make_trainer_class()(
        model=model,
        args=placement.args,
        train_dataset=RowDataset(data["rows"]),
        data_collator=Collator(
            tokenizer.pad_token_id, pad_to_multiple_of=1 if placement.use_cpu else 8
        ),
        processing_class=tokenizer,
        callbacks=[
            metrics_callback(out / METRICS, progress),
            prompt_callback(
                data["system_text"], out / AGENT_CONFIG_FILE
            ),  # stages.run_sft wrote it
            *callbacks,
        ],
    )
    trainer.masked_logits = cfg.logits == "labelled" and masked_logits_supported(model)
    if progress is not None:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # the caller shows progress; metrics.jsonl logs
    return trainer
