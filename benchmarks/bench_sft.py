"""SFT throughput on the tiny model: kgsynth's trainer packed and unpacked, and TRL's SFTTrainer.

A corpus (built offline the way ``make all`` builds one, or ``--corpus PATH``) -> a printed
table and ``benchmarks/results/sft.json``::

    .venv/bin/python benchmarks/bench_sft.py                      # ~2.5 min on 2 shared CPUs
    .venv/bin/python benchmarks/bench_sft.py --corpus runs/x/corpus/accepted.parquet --steps 20

In one process, on the same corpus, the same tiny model (one tokenizer and one set of initial
weights, saved once and loaded by every run), the same global batch (``--batch-size`` rows per
optimizer step), the same micro-batch, ``--max-length``, optimizer, learning-rate schedule and
seed, each run trains ``--warmup-steps`` untimed steps and then ``--steps`` timed optimizer
steps, on CPU in fp32, one process:

1. ``ours-packed``: :func:`kgsynth.train.sft.train_sft` as ``kgsynth train stage1`` runs it,
   with packing (first-fit-decreasing rows of up to ``max_length`` tokens, position ids
   restarting per sample, rows right-padded to the longest in the batch);
2. ``ours-unpacked``: the same without packing (one trajectory per row, length-grouped
   batches: ``train_sampling_strategy="group_by_length"``);
3. ``trl-packed``: TRL's ``SFTTrainer`` with ``packing=True`` (its default ``bfd`` strategy,
   which turns on padding-free batches: the micro-batch's rows are laid end to end in one
   sequence with restarting position ids);
4. ``trl-unpacked``: ``SFTTrainer`` without packing, with the same length-grouped sampler as
   ours (so both see the very same batches; the script checks this step by step);
5. ``trl-packed-mb1``: ``trl-packed`` with micro-batch 1 and gradient accumulation over the
   global batch. Padding-free flattening makes SDPA attend over the whole micro-batch as one
   sequence (a block-diagonal mask over all of its tokens, computed densely); at micro-batch
   1 TRL attends within one packed row at a time, as ours does.

Both trainers train on the samples kgsynth keeps (over-long ones are dropped, as ours drops
them; TRL would truncate them). TRL gets them pre-tokenized: ``input_ids`` from kgsynth's
renderer and an ``assistant_masks`` column holding kgsynth's loss mask
(:func:`kgsynth.train.data.to_sample`), so both trainers compute the loss on exactly the same
tokens. The tiny model's chat template has no ``{% generation %}`` tags, so TRL's own
``assistant_only_loss=True`` path (conversational ``messages``) cannot mask it; for a
pre-tokenized dataset TRL builds ``labels`` from the ``assistant_masks`` column itself
(``SFTTrainer._prepare_dataset``), and the script checks those labels equal ours (and that both
runs log the same loss at every step). TRL computes the loss through its fused LM head: it
projects only the positions whose next-token label is kept, and computes entropy and top-1
accuracy there for its logs.

Per run: non-padding ("trained") tokens/s, loss-carrying tokens/s, mean fraction of non-padding
tokens per micro-batch, step time, and real and loss tokens per step. The counts come from
the collated batches (a counting wrapper around each trainer's collator; ours is patched in
for the run, the shipped ``train_sft`` is otherwise untouched); the clock reads at each
optimizer step's end, so a step's time covers loading and collating its batch, forward,
backward, the optimizer and the trainer's logging (every step for all runs). The runs follow
each other in one process, a minute or so apart; on a shared machine the load from other jobs
still changes between them (and from step to step), so the script also reads the process's CPU
time and reports tokens per CPU second, which such load moves much less. torch runs one
intra-op thread (``--threads 1``): with two threads on two cores shared with other jobs, a
preempted thread stalls the other at every operator, and wall times of identical runs differed
by 2-3x; with one thread the CPU time is close to the work done. Where two runs trained the
same tokens at every step (checked), the median over steps of their paired step-time ratio is
reported too: a burst of load on a few steps does not move it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RUN_DATE = "2026-11-23"
DEFAULT_KG = ROOT / "kgsynth" / "resources" / "metaqa" / "kb_partial.txt.gz"
RUNS = ("ours-packed", "ours-unpacked", "trl-packed", "trl-unpacked", "trl-packed-mb1")
RATIOS = (
    ("ours-packed", "ours-unpacked"),
    ("ours-packed", "trl-packed"),
    ("ours-unpacked", "trl-unpacked"),
    ("ours-packed", "trl-packed-mb1"),
)


# --- corpus and model ------------------------------------------------------------------------


def build_corpus(workdir: Path, walks: int) -> Path:
    """``accepted.parquet`` made as ``make all`` makes it (MetaQA KB, template LLM, offline)."""
    exe = str(Path(sys.executable).with_name("kgsynth"))
    env = {**os.environ, "KGSYNTH_CACHE": str(workdir / "cache")}
    kg, walks_file = str(workdir / "kg"), str(workdir / "walks.parquet")
    questions, trajectories = (
        str(workdir / "questions.parquet"),
        str(workdir / "trajectories.parquet"),
    )
    pipeline = str(ROOT / "kgsynth" / "resources" / "recipes" / "metaqa_default.yaml")
    steps = [
        ["kg", "import", str(DEFAULT_KG), "--out", kg],
        [
            "walk",
            "--kg",
            kg,
            "--n",
            str(walks),
            "--seed",
            "0",
            "--config",
            pipeline,
            "--out",
            walks_file,
        ],
        ["synthesize", "questions", "--walks", walks_file, "--out", questions, "--llm", "template"],
        [
            "synthesize",
            "trajectories",
            "--questions",
            questions,
            "--kg",
            kg,
            "--mode",
            "oracle",
            "--llm",
            "template",
            "--out",
            trajectories,
        ],
        ["filter", "--in", trajectories, "--out", str(workdir / "corpus")],
    ]
    for argv in steps:
        proc = subprocess.run(
            [exe, *argv], capture_output=True, text=True, env=env, check=False, cwd=workdir
        )
        if proc.returncode != 0:
            sys.exit(f"kgsynth {' '.join(argv[:2])} failed: {proc.stderr.strip()[-2000:]}")
    return workdir / "corpus" / "accepted.parquet"


# --- measurement ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BatchCount:
    """One collated micro-batch: real (non-padding) tokens, tokens incl. padding, loss tokens."""

    real: int
    padded: int
    loss: int


def count_batch(batch: dict[str, Any]) -> BatchCount:
    """The same definitions for every trainer's batch layout."""
    ids = batch["input_ids"]
    padded = int(ids.numel())
    if "num_real_tokens" in batch:  # ours
        real = int(batch["num_real_tokens"])
    elif "attention_mask" in batch:  # TRL, padded rows
        real = int(batch["attention_mask"].sum())
    else:  # TRL, padding-free: one flattened row, no padding (pad_to_multiple_of is None)
        real = padded
    # the causal-LM loss predicts position t from t-1: a label at position 0 is never used
    loss = int((batch["labels"][:, 1:] != -100).sum())
    return BatchCount(real, padded, loss)


class CountingCollator:
    """Wraps a collator and records every batch it makes (in the order the loader asks)."""

    def __init__(self, inner: Any, sink: list[BatchCount]) -> None:
        self.inner = inner
        self.sink = sink

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.inner(features)
        self.sink.append(count_batch(batch))
        return batch


def _step_clock(times: list[tuple[float, float]], losses: dict[int, float]) -> Any:
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        """Wall clock and process CPU time at the end of every optimizer step, and the logged
        losses."""

        def on_step_end(self, args, state, control, **kwargs):
            times.append((time.perf_counter(), time.process_time()))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses[state.global_step] = float(logs["loss"])

    return StepClock()


def summarize(
    name: str,
    times: list[tuple[float, float]],
    counts: list[BatchCount],
    losses: dict[int, float],
    *,
    warmup: int,
    steps: int,
    accumulation: int,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """Rates over the timed steps (warmup+1 .. warmup+steps)."""
    total = warmup + steps
    if len(times) < total or len(counts) < total * accumulation:
        raise RuntimeError(
            f"{name}: {len(times)} steps and {len(counts)} batches seen, expected {total} steps"
        )
    per_step = [
        counts[k * accumulation : (k + 1) * accumulation] for k in range(total)
    ]  # micro-batches of each optimizer step
    timed = per_step[warmup:total]
    seconds = times[total - 1][0] - times[warmup - 1][0]
    cpu_seconds = times[total - 1][1] - times[warmup - 1][1]
    step_wall = [times[k][0] - times[k - 1][0] for k in range(warmup, total)]
    step_cpu = [times[k][1] - times[k - 1][1] for k in range(warmup, total)]
    real = sum(b.real for s in timed for b in s)
    padded = sum(b.padded for s in timed for b in s)
    loss = sum(b.loss for s in timed for b in s)
    fractions = [b.real / b.padded for s in timed for b in s]
    return {
        "run": name,
        "timed_steps": steps,
        "warmup_steps": warmup,
        "seconds": round(seconds, 3),
        "step_s": round(seconds / steps, 4),
        "step_s_median": round(statistics.median(step_wall), 4),
        "step_s_each": [round(x, 4) for x in step_wall],
        "cpu_s_each": [round(x, 4) for x in step_cpu],
        "cpu_s_per_step": round(cpu_seconds / steps, 4),
        "first_step_s": round(times[0][0] - extra.pop("_started"), 3),
        "real_tokens": real,
        "padded_tokens": padded,
        "loss_tokens": loss,
        "real_tokens_per_s": round(real / seconds, 1),
        "loss_tokens_per_s": round(loss / seconds, 1),
        "padded_tokens_per_s": round(padded / seconds, 1),
        "real_tokens_per_cpu_s": round(real / cpu_seconds, 1),
        "nonpad_fraction_mean": round(statistics.fmean(fractions), 4),
        "nonpad_fraction_min": round(min(fractions), 4),
        "nonpad_fraction_overall": round(real / padded, 4),
        "real_tokens_per_step": round(real / steps, 1),
        "loss_tokens_per_step": round(loss / steps, 1),
        "per_step_real": [sum(b.real for b in s) for s in per_step],
        "per_step_loss": [sum(b.loss for b in s) for s in per_step],
        "losses": {str(k): v for k, v in sorted(losses.items())},
        **extra,
    }


# --- the runs ---------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers/TRL/datasets progress bars and info logs off for a run."""
    import datasets
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)
        transformers.logging.enable_progress_bar()
        datasets.enable_progress_bars()


def run_ours(
    name: str, corpus: Path, model_dir: Path, workdir: Path, cfg: Any, warmup: int, steps: int
) -> dict[str, Any]:
    """``train_sft`` as ``kgsynth train stage1`` calls it, with counting and a clock added."""
    import kgsynth.train.data as data_module
    from kgsynth.train.sft import prepare_run, train_sft

    counts: list[BatchCount] = []
    times: list[tuple[float, float]] = []
    losses: dict[int, float] = {}

    class Counted(data_module.Collator):
        def __call__(self, features):  # type: ignore[override]
            batch = super().__call__(features)
            counts.append(count_batch(batch))
            return batch

    spec = prepare_run(cfg, "stage1", corpus, workdir / name, overwrite=True)
    started = time.perf_counter()
    with mock.patch.object(data_module, "Collator", Counted), quiet():
        summary = train_sft(spec, callbacks=[_step_clock(times, losses)], progress=lambda *_: None)
    accumulation = summary["gradient_accumulation_steps"]
    # the trainer's own count of non-padding tokens over all steps, to cross-check ours
    own = summary["tokens_trained"]
    seen = sum(b.real for b in counts[: (warmup + steps) * accumulation])
    if own != seen:
        raise RuntimeError(f"{name}: counted {seen} real tokens, the trainer logged {own}")
    return summarize(
        name,
        times,
        counts,
        losses,
        warmup=warmup,
        steps=steps,
        accumulation=accumulation,
        extra={
            "_started": started,
            "trainer": "kgsynth train_sft (transformers Trainer)",
            "packing": bool(spec.config.packing),
            "micro_batch_size": spec.config.micro_batch_size,
            "gradient_accumulation_steps": accumulation,
            "training_rows": summary["data"]["training_rows"],
            "packed_fill": summary["data"]["packed_fill"],
            "samples": summary["data"]["samples"],
        },
    )


def trl_dataset(samples: list[Any]) -> Any:
    """Pre-tokenized rows for TRL: our token ids and our loss mask as ``assistant_masks``."""
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "input_ids": [s.input_ids for s in samples],
            "assistant_masks": [[int(x != -100) for x in s.labels] for s in samples],
        }
    )


def run_trl(
    name: str,
    samples: list[Any],
    model_dir: Path,
    workdir: Path,
    cfg: Any,
    warmup: int,
    steps: int,
    packing: bool,
    micro_batch_size: int,
) -> dict[str, Any]:
    """TRL's SFTTrainer on the same rows, model, global batch and optimizer settings."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    counts: list[BatchCount] = []
    times: list[tuple[float, float]] = []
    losses: dict[int, float] = {}
    accumulation = cfg.batch_size // micro_batch_size
    args = SFTConfig(
        output_dir=str(workdir / name),
        per_device_train_batch_size=micro_batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=warmup + steps,
        learning_rate=cfg.lr,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=float(cfg.warmup_ratio),
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        optim="adamw_torch",
        logging_strategy="steps",
        logging_steps=1,
        logging_first_step=True,
        save_strategy="no",
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,  # TRL's default is on; ours is off
        max_length=cfg.max_length,
        packing=packing,
        # without packing: the length-grouped sampler ours uses (TRL's default is random)
        train_sampling_strategy="random" if packing else "group_by_length",
        dataloader_num_workers=0,
        report_to="none",
        disable_tqdm=True,
    )
    started = time.perf_counter()
    with quiet():
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation=cfg.attn_implementation
        )
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=trl_dataset(samples),
            processing_class=tokenizer,
            callbacks=[_step_clock(times, losses)],
        )
        trainer.remove_callback(PrinterCallback)
        if not packing:  # TRL built the labels from our mask: they must be ours
            labels = trainer.train_dataset["labels"]
            if labels != [s.labels for s in samples]:
                raise RuntimeError(f"{name}: TRL's labels differ from kgsynth's")
        rows = len(trainer.train_dataset)
        trainer.data_collator = CountingCollator(trainer.data_collator, counts)
        trainer.train()
    return summarize(
        name,
        times,
        counts,
        losses,
        warmup=warmup,
        steps=steps,
        accumulation=accumulation,
        extra={
            "_started": started,
            "trainer": "trl SFTTrainer",
            "packing": packing,
            "padding_free": bool(trainer.padding_free),
            "packing_strategy": args.packing_strategy if packing else None,
            "micro_batch_size": micro_batch_size,
            "gradient_accumulation_steps": accumulation,
            "training_rows": rows,
            "samples": len(samples),
        },
    )


# --- report -------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    import torch
    import transformers
    import trl

    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "date": RUN_DATE,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_before": load,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "git": sha,
    }


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for a, b in RATIOS:
        ra, rb = results[a], results[b]
        out[f"{a}/{b}"] = {
            "real_tokens_per_s": round(ra["real_tokens_per_s"] / rb["real_tokens_per_s"], 3),
            "loss_tokens_per_s": round(ra["loss_tokens_per_s"] / rb["loss_tokens_per_s"], 3),
            "real_tokens_per_cpu_s": round(
                ra["real_tokens_per_cpu_s"] / rb["real_tokens_per_cpu_s"], 3
            ),
            "real_tokens_per_step": round(
                ra["real_tokens_per_step"] / rb["real_tokens_per_step"], 3
            ),
        }
    return out


def same_batches(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Whether two runs saw the same real and loss tokens at every step, and their losses.

    When they did, step k of both trained the same tokens, so the median over the timed steps
    of (b's step time / a's step time) is a speed ratio a/b that a burst of load on a few
    steps does not move."""
    same_real = a["per_step_real"] == b["per_step_real"]
    same_loss = a["per_step_loss"] == b["per_step_loss"]
    common = sorted(set(a["losses"]) & set(b["losses"]), key=int)
    diff = max((abs(a["losses"][k] - b["losses"][k]) for k in common), default=None)
    out: dict[str, Any] = {
        "same_real_tokens_every_step": same_real,
        "same_loss_tokens_every_step": same_loss,
        "max_abs_loss_difference": None if diff is None else round(diff, 6),
        "steps_compared": len(common),
    }
    if same_real and same_loss:
        for key, field in (("wall", "step_s_each"), ("cpu", "cpu_s_each")):
            paired = [tb / ta for ta, tb in zip(a[field], b[field], strict=True) if ta > 0]
            out[f"paired_median_speed_ratio_{key}"] = round(statistics.median(paired), 3)
    return out


def print_table(results: dict[str, Any]) -> None:
    cfg = results["config"]
    m = results["machine"]
    print(
        f"SFT benchmark — tiny model ({cfg['parameters']:,} parameters), {cfg['samples']} "
        f"trajectories, batch {cfg['batch_size']} rows (micro {cfg['micro_batch_size']}), "
        f"max length {cfg['max_length']}, {cfg['steps']} timed steps after {cfg['warmup_steps']}; "
        f"CPU fp32, {m['cpus']} CPUs, torch {m['torch']}, transformers {m['transformers']}, "
        f"trl {m['trl']}"
    )
    header = (
        f"{'run':15} {'tokens/s':>9} {'loss tok/s':>10} {'non-pad':>8} {'min':>6} "
        f"{'step s':>7} {'median':>7} {'CPU s':>6} {'tok/CPU-s':>9} {'tok/step':>9} "
        f"{'loss/step':>9} {'rows':>5}"
    )
    print(header)
    print("-" * len(header))
    for name in RUNS:
        r = results["runs"][name]
        print(
            f"{name:15} {r['real_tokens_per_s']:9,.0f} {r['loss_tokens_per_s']:10,.0f} "
            f"{r['nonpad_fraction_mean']:8.3f} {r['nonpad_fraction_min']:6.3f} "
            f"{r['step_s']:7.3f} {r['step_s_median']:7.3f} {r['cpu_s_per_step']:6.2f} "
            f"{r['real_tokens_per_cpu_s']:9,.0f} {r['real_tokens_per_step']:9,.0f} "
            f"{r['loss_tokens_per_step']:9,.0f} {r['training_rows']:5}"
        )
    print("-" * len(header))
    for key, r in results["ratios"].items():
        print(
            f"{key:31} tokens/s {r['real_tokens_per_s']:.2f}x, loss tokens/s "
            f"{r['loss_tokens_per_s']:.2f}x, tokens/CPU-s {r['real_tokens_per_cpu_s']:.2f}x, "
            f"real tokens per step {r['real_tokens_per_step']:.2f}x"
        )
    for key, c in results["checks"].items():
        same = c["same_real_tokens_every_step"] and c["same_loss_tokens_every_step"]
        line = (
            f"{key}: same real and loss tokens every step: {same}; "
            f"max |loss difference| {c['max_abs_loss_difference']} over {c['steps_compared']} steps"
        )
        if same:
            wall, cpu = c["paired_median_speed_ratio_wall"], c["paired_median_speed_ratio_cpu"]
            line += f"; paired per-step speed ratio (median) wall {wall}x, CPU {cpu}x"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=None, help="an accepted.parquet to use")
    parser.add_argument("--walks", type=int, default=300, help="walks for the built corpus")
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps per run")
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per optimizer step")
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: see the docstring)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/sft.json")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup_steps < 1:
        sys.exit("--steps and --warmup-steps must be >= 1")

    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.train.data import build_samples, corpus_texts, read_corpus
    from kgsynth.train.sft import SFTConfig, resolve_config
    from kgsynth.train.tiny import build_tiny_model

    machine = machine_info()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-sft-") as tmp:
        workdir = Path(tmp)
        corpus = args.corpus or build_corpus(workdir, args.walks)
        corpus_s = round(time.perf_counter() - started, 1)
        conversations = read_corpus(corpus)
        with quiet():  # as prepare_run builds it for `--model tiny`
            model_dir = build_tiny_model(
                corpus_texts(conversations),
                workdir / "tiny",
                vocab_size=SFTConfig.tiny_vocab_size,
                hidden_size=SFTConfig.tiny_hidden_size,
                num_layers=SFTConfig.tiny_layers,
                num_heads=SFTConfig.tiny_heads,
                max_position=max(2048, args.max_length),
                seed=0,
            )
            n_params = sum(
                p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters()
            )
        base = resolve_config(
            SFTConfig(
                model=str(model_dir),
                recipe="tiny",
                max_steps=args.warmup_steps + args.steps,
                batch_size=args.batch_size,
                max_length=args.max_length,
                logging_steps=1,
                save_steps=args.warmup_steps + args.steps + 1,
                precision="fp32",
            ),
            "stage1",
        )
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        samples, stats = build_samples(tokenizer, conversations, args.max_length)
        results: dict[str, Any] = {
            "machine": machine,
            "config": {
                "corpus": str(args.corpus) if args.corpus else f"built: {args.walks} walks",
                "corpus_build_s": corpus_s if args.corpus is None else None,
                "rows": stats.rows,
                "samples": stats.samples,
                "dropped_overlong": stats.dropped_overlong,
                "tokens": stats.tokens,
                "loss_tokens": stats.loss_tokens,
                "longest": stats.longest,
                "parameters": n_params,
                "batch_size": base.batch_size,
                "micro_batch_size": base.micro_batch_size,
                "max_length": base.max_length,
                "steps": args.steps,
                "warmup_steps": args.warmup_steps,
                "lr": base.lr,
                "lr_scheduler": base.lr_scheduler,
                "warmup_ratio": base.warmup_ratio,
                "seed": base.seed,
                "attn_implementation": base.attn_implementation,
            },
            "runs": {},
        }
        w, s = args.warmup_steps, args.steps
        for name in RUNS:
            print(f"{name} ...", flush=True)
            if name.startswith("ours"):
                cfg = dataclasses.replace(base, packing=name == "ours-packed")
                r = run_ours(name, corpus, model_dir, workdir, cfg, w, s)
            else:
                packing = name.startswith("trl-packed")
                micro = 1 if name.endswith("-mb1") else base.micro_batch_size
                r = run_trl(name, samples, model_dir, workdir, base, w, s, packing, micro)
            results["runs"][name] = r
            print(
                f"  {r['real_tokens_per_s']:,.0f} tokens/s, {r['step_s']:.3f} s/step",
                flush=True,
            )
    runs = results["runs"]
    results["ratios"] = ratios(runs)
    results["checks"] = {
        "ours-unpacked vs trl-unpacked": same_batches(runs["ours-unpacked"], runs["trl-unpacked"]),
        "ours-packed vs trl-packed": same_batches(runs["ours-packed"], runs["trl-packed"]),
        "ours-packed vs trl-packed-mb1": same_batches(runs["ours-packed"], runs["trl-packed-mb1"]),
    }
    results["wall_s"] = round(time.perf_counter() - started, 1)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out} ({results['wall_s']}s)")


if __name__ == "__main__":
    main()
