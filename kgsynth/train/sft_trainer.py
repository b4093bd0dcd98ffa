"""SFT on transformers' ``Trainer``: its arguments from an :class:`SFTConfig`, the tokenizer,
and what SFT adds to it: token counting for the metrics, the row order of
:class:`kgsynth.train.data.RowOrder` (seeded by epoch, so a resumed run trains on the batches
an uninterrupted one would), the run's own state kept in every checkpoint
(:data:`RUN_STATE`), the ``metrics.jsonl`` writer and the system prompt kept in every
checkpoint. Built lazily (importing kgsynth loads no torch)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kgsynth.train.core import store_system_prompt, write_json_atomic
from kgsynth.train.sft_config import SFTConfig

if TYPE_CHECKING:
    import torch

    from kgsynth.train.data import RowOrder

# What a checkpoint holds of kgsynth's own run state (transformers' files hold the rest): the
# token totals the metrics and the summary count on from (``metrics.jsonl`` has them only as
# of its last line, which a checkpoint between two logs is past).
RUN_STATE = "kgsynth_state.json"


class RunComplete(Exception):
    """``Trainer.train`` resumed from a checkpoint of the run's last step: nothing is left to
    train (raised from its ``on_train_begin``, once the checkpoint is loaded)."""


def read_run_state(checkpoint: str | Path) -> dict[str, Any] | None:
    """The :data:`RUN_STATE` of a checkpoint, or None for one saved before it was kept."""
    path = Path(checkpoint) / RUN_STATE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def load_tokenizer(model_path: Path) -> Any:
    """The model's tokenizer, with a pad token and a chat template."""
    from transformers import AutoTokenizer

    from kgsynth.agent.render import CHATML_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        # the renderer fell back to ChatML; the saved folder must render the same way
        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def _checkpointing_field(arguments: type) -> str:
    """The name transformers gives activation recomputation: ``activation_checkpointing`` from
    5.2x (``gradient_checkpointing`` stays as its deprecated alias there), only
    ``gradient_checkpointing`` before (5.17 on the GPU image of 2026-11-26)."""
    names = {f.name for f in dataclasses.fields(arguments)}
    return (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )


def training_arguments(
    cfg: SFTConfig,
    ckpt_dir: Path,
    world: int,
    precision: tuple[bool, bool],
    ds_config: Any,
    quiet: bool,
) -> Any:
    """transformers' ``TrainingArguments`` for the resolved ``cfg``."""
    from transformers import TrainingArguments

    assert cfg.batch_size is not None and cfg.micro_batch_size is not None  # resolved
    use_cpu, bf16 = precision
    return TrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=cfg.batch_size // (cfg.micro_batch_size * world),
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
        # every parameter of a causal LM takes part in its loss; looking for unused ones costs
        # a pass over the autograd graph each step (and a warning from every process)
        ddp_find_unused_parameters=False,
        deepspeed=ds_config,
        **{_checkpointing_field(TrainingArguments): cfg.gradient_checkpointing},
        train_sampling_strategy="random" if cfg.packing else "group_by_length",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        report_to="wandb" if cfg.report_to == "wandb" else "none",  # transformers' integration
        disable_tqdm=quiet,
    )


def masked_logits_supported(model: Any) -> bool:
    """Whether ``model`` (a causal LM, bare or wrapped by PEFT) can compute its logits at the
    positions of a boolean ``logits_to_keep`` mask only: its ``forward`` slices with
    transformers' ``slice_logits_to_keep``, and that function takes a ``(batch, length)`` bool
    mask (transformers 5.2x; older releases index with it as positions)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _slices_by_mask(type(base))


@functools.cache
def _slices_by_mask(model_class: type) -> bool:
    """:func:`masked_logits_supported` for a model class (read once per class: RL asks every
    step)."""
    try:
        from transformers import modeling_utils

        slicer = modeling_utils.slice_logits_to_keep
        forward = model_class.forward
        return (
            "torch.bool" in inspect.getsource(slicer)
            and "logits_to_keep" in inspect.signature(forward).parameters
            and "slice_logits_to_keep" in inspect.getsource(forward)
        )
    except (AttributeError, OSError, TypeError):
        return False


def labelled_positions(labels: Any) -> tuple[Any, Any]:
    """The positions whose next token is labelled, as a ``(batch, length)`` bool mask, and those
    next tokens in mask order: what ``ForCausalLMLoss`` scores after its own shift by one. The
    LM head and the cross-entropy then run on these positions only; the loss and its gradients
    are the ones of all positions (the others are ``-100`` and add nothing), at a fraction of
    the cost (a third of the tiny policy's tokens are labelled; a real model's vocabulary makes
    the full logits the largest activation)."""
    import torch.nn.functional as F

    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
    keep = shifted != -100
    return keep, shifted[keep]


def _run_callbacks(trainer: Any) -> list[Any]:
    """The callbacks an SFT trainer adds to itself: the epoch of its row order, and the stop of
    a resumed run that has nothing left to train."""
    from transformers import TrainerCallback

    class EpochOfRowOrder(TrainerCallback):
        """Tells the trainer's :class:`RowOrder` which epoch begins. The dataloader passes
        ``set_epoch`` on too, except through the wrapper a multi-process run resumed inside
        an epoch iterates (accelerate's skip of the first batches around its per-process
        shard), where the order would otherwise stay at epoch 0's."""

        def __init__(self, trainer: Any) -> None:
            self.trainer = trainer

        def on_epoch_begin(self, args, state, control, **kwargs):
            order = getattr(self.trainer, "row_order", None)
            if order is not None:
                # epochs done, and the part of this one a resumed run starts inside
                order.set_epoch(math.floor(state.epoch or 0))

    class StopWhenComplete(TrainerCallback):
        """Raises :class:`RunComplete` when a resumed run's checkpoint is its last step. A run
        killed after that checkpoint (while saving the final model, or during stage 2's
        selection of the best checkpoint, which takes minutes) resumes from it, and
        transformers would otherwise take one more step in an epoch left part done: its loop
        checks the step limit only after a step (a 15th step of a 14-step run, its checkpoint,
        metrics line and step count; with a constant learning rate, other weights too)."""

        def on_train_begin(self, args, state, control, **kwargs):
            if state.global_step >= state.max_steps > 0:
                raise RunComplete

    return [EpochOfRowOrder(trainer), StopWhenComplete()]


class _TokenCounting:
    """What SFT adds to ``Trainer`` (mixed in before it by :func:`make_trainer_class`, so that
    importing kgsynth loads no torch): counts real, padded and labelled tokens per micro-batch
    and adds tokens/s and the non-padding fraction (over the logging window, and its worst
    batch) to every log. With ``masked_logits`` (set by the caller, where the model supports
    it) the logits are computed at labelled positions only (:func:`labelled_positions`). Rows
    come in the order of :class:`RowOrder`; every checkpoint keeps the token totals
    (:data:`RUN_STATE`), which the caller restores with :meth:`restore_run_state`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for callback in _run_callbacks(self):
            self.add_callback(callback)
        self.row_order: RowOrder | None = None  # made with the training dataloader
        self.masked_logits = False
        self._window_start: float | None = None  # set by the window's first micro-batch
        self._counts: torch.Tensor | None = None  # real, padded, labelled (on device)
        self._worst: torch.Tensor | None = None  # lowest non-padding fraction of a batch
        self.tokens_seen = 0  # over the whole run, resumed runs included
        self.loss_tokens_seen = 0
        self.session_tokens = 0  # this session only (a resumed run starts a session)
        self.session_padded = 0

    def _get_train_sampler(self, train_dataset: Any = None) -> RowOrder:
        """The row order: length-grouped in megabatches of a step's rows per process
        (``train_sampling_strategy`` ``group_by_length``, as transformers' own sampler), or
        a plain shuffle, drawn per epoch from the data seed alone."""
        from kgsynth.train.data import RowDataset, RowOrder

        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if isinstance(dataset, RowDataset):
            lengths = [len(row) for row in dataset.rows]
        else:
            lengths = [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
        grouped = getattr(self.args, "train_sampling_strategy", "") == "group_by_length"
        step_rows = self.args.train_batch_size * self.args.gradient_accumulation_steps
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        self.row_order = RowOrder(lengths, seed, step_rows if grouped else None)
        return self.row_order

    def run_state(self) -> dict[str, int]:
        """The token totals up to the last step taken: the logged ones plus the logging
        window's so far (summed over the processes; every process must call this)."""
        import torch

        pending = self._counts if self._counts is not None else torch.zeros(3)
        pending = pending.to(self.args.device, torch.float64)
        if self.args.world_size > 1:
            pending = self.accelerator.reduce(pending, reduction="sum")
        real, _, labelled = (int(x) for x in pending.cpu())
        return {
            "step": int(self.state.global_step),
            "tokens_seen": self.tokens_seen + real,
            "loss_tokens_seen": self.loss_tokens_seen + labelled,
        }

    def restore_run_state(self, state: dict[str, Any]) -> None:
        """Count on from a checkpoint's :data:`RUN_STATE`."""
        self.tokens_seen = int(state["tokens_seen"])
        self.loss_tokens_seen = int(state["loss_tokens_seen"])

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The run state first, then transformers' files: its ``trainer_state.json``,
        written last, marks a checkpoint complete, so a complete one holds the state."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        state = self.run_state()
        if self.args.should_save:
            folder = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state['step']}"
            folder.mkdir(parents=True, exist_ok=True)
            write_json_atomic(folder / RUN_STATE, state)
        super()._save_checkpoint(model, trial)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        import torch

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
        if self.masked_logits and not return_outputs and "labels" in inputs:
            keep, targets = labelled_positions(inputs["labels"])
            inputs["logits_to_keep"], inputs["shift_labels"] = keep, targets
        return super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        import torch

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


def make_trainer_class() -> type:
    """``Trainer`` plus token counting, the epoch-seeded row order and the run state kept in
    checkpoints (:class:`_TokenCounting`; imported lazily: importing kgsynth loads no torch)."""
    from transformers import Trainer

    class TokenCountingTrainer(_TokenCounting, Trainer):
        """transformers' ``Trainer`` with :class:`_TokenCounting`'s additions."""

    return TokenCountingTrainer


def metrics_callback(path: Path, progress: Callable[[int, int, dict], None] | None) -> Any:
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


def prompt_callback(system_text: str | None, agent_file: Path | None = None) -> Any:
    from transformers import TrainerCallback

    class PromptCallback(TrainerCallback):
        """Stores the system prompt and the run's agent settings (``agent_file``) in every
        intermediate checkpoint too."""

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if folder.is_dir():
                    store_system_prompt(folder, system_text, agent_file=agent_file)

    return PromptCallback()
