"""The copy warm-up's drill loss for learning rates x seeds (issue 12: is the warm-up reliable?).

Stage 1 of the tiny recipe starts with ``copy_warmup_steps`` steps of name-copy drills
(:mod:`kgsynth.train.drills`); a warm-up that ends above ``copy_warmup_target`` is run again
from the same initial weights on another seed's drills. This script runs the warm-up alone,
as ``train stage1`` runs it (the same drills for a seed, batch, schedule and optimizer), from
one set of initial weights (a run's ``stage1/init-tiny``), for each learning rate and seed,
and prints the drill loss over the last tenth of the steps and the loss curve (means over 50
steps). Seeds run one after another, one torch thread each::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_copy_warmup.py \\
        --corpus runs/default/corpus/accepted.parquet --init runs/default/stage1/init-tiny \\
        --lr 0.005,0.0025 --seeds 0,1,2                                # ~3.5 min per seed

Writes ``--out`` (default ``benchmarks/results/copy_warmup.json``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="the stage-1 corpus (parquet)")
    ap.add_argument("--init", type=Path, required=True, help="initial weights and tokenizer")
    ap.add_argument("--lr", default="0.005,0.0025", help="comma-separated learning rates")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated drill seeds")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/copy_warmup.json"))
    args = ap.parse_args()

    import polars as pl
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.train.drills import copy_drills, warm_up

    torch.set_num_threads(1)
    conversations = pl.read_parquet(args.corpus, columns=["messages"])["messages"].to_list()
    tokenizer = AutoTokenizer.from_pretrained(args.init)
    runs = []
    for lr in (float(x) for x in args.lr.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            model = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
            drills = copy_drills(conversations, args.steps * args.batch_size, seed)
            losses: list[float] = []
            started = time.perf_counter()
            info = warm_up(
                model,
                tokenizer,
                drills,
                steps=args.steps,
                batch_size=args.batch_size,
                lr=lr,
                seed=seed,
                progress=lambda _step, loss, into=losses: into.append(loss),
            )
            curve = [
                round(sum(losses[i : i + 50]) / len(losses[i : i + 50]), 3)
                for i in range(0, len(losses), 50)
            ]
            runs.append(
                {
                    "lr": lr,
                    "seed": seed,
                    "loss_last_tenth": round(info["loss_last_tenth"], 3),
                    "seconds": round(time.perf_counter() - started, 1),
                    "curve_per_50_steps": curve,
                }
            )
            print(
                f"lr {lr:g}  seed {seed}  last tenth {info['loss_last_tenth']:.3f}  "
                f"({runs[-1]['seconds']:.0f} s)  curve {curve}",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"corpus": str(args.corpus), "runs": runs}, indent=1))
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
