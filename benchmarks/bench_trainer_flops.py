"""Trainer speed against the machine's fp32 matmul peak (issue 12, "Trainer speed").

Measures, side by side in one run and on the same number of torch threads:

1. the peak: fp32 ``torch.mm`` of square matrices (sizes 256-1024, best of several repeats);
2. the trainer: ``kgsynth train stage1`` with the chosen recipe (``pipelines/metaqa_default.yaml``,
   stage1 section) for ``--steps`` steps on oracle trajectories of the shipped KB, reading
   tokens/s from its ``train_summary.json``.

Training FLOPs per token = 6·N + 6·n_layers·L·d (Kaplan et al. 2020: 2N forward + 4N backward for
the weights; attention scores and values, causal, at the mean row length L), where N counts every
matmul weight including the tied LM head (its matmul runs once per token) and excludes the
embedding look-up. The ratio is achieved FLOP/s over the peak::

    .venv/bin/python benchmarks/bench_trainer_flops.py --threads 1 --steps 200

Writes ``benchmarks/results/trainer_flops.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
K = str(Path(sys.executable).with_name("kgsynth"))


def matmul_peak(threads: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(threads)
    best: dict[str, float] = {}
    for n in (256, 512, 1024):
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(3):
            a @ b
        reps = max(3, int(4e9 / (2 * n**3)))
        rates = []
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(reps):
                a @ b
            rates.append(2 * n**3 * reps / (time.perf_counter() - t))
        best[str(n)] = max(rates)
    return best


def run(cmd: list[str], env: dict[str, str]) -> None:
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--walks", type=int, default=1500)
    ap.add_argument(
        "--tiny-layers", type=int, default=None, help="layers of the policy (the 4-layer trial: 4)"
    )
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "trainer_flops.json"
    )
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    cfg = ROOT / "pipelines" / "metaqa_default.yaml"
    peak_before = matmul_peak(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        run(
            [
                K,
                "kg",
                "import",
                str(ROOT / "data/metaqa/kb_partial.txt.gz"),
                "--out",
                str(t / "kg"),
            ],
            env,
        )
        run([K, "walk", "--kg", str(t / "kg"), "--config", str(cfg), "--n", str(args.walks),
             "--out", str(t / "walks.parquet")], env)  # fmt: skip
        run([K, "synthesize", "questions", "--walks", str(t / "walks.parquet"), "--out",
             str(t / "questions.parquet"), "--llm", "template"], env)  # fmt: skip
        run([K, "synthesize", "trajectories", "--config", str(cfg), "--questions",
             str(t / "questions.parquet"), "--kg", str(t / "kg"), "--mode", "oracle", "--llm",
             "template", "--out", str(t / "traj.parquet")], env)  # fmt: skip
        run([K, "train", "stage1", "--config", str(cfg), "--corpus", str(t / "traj.parquet"),
             "--model", "tiny", "--out", str(t / "s1"), "--max-steps", str(args.steps),
             *(["--tiny-layers", str(args.tiny_layers)] if args.tiny_layers else [])], env)  # fmt: skip
        summary = json.loads((t / "s1" / "train_summary.json").read_text())
        config = json.loads((t / "s1" / "config.json").read_text())
    peak_after = matmul_peak(args.threads)
    d, layers = config["hidden_size"], config["num_hidden_layers"]
    ffn, vocab = config["intermediate_size"], config["vocab_size"]
    heads, kv = (
        config["num_attention_heads"],
        config.get("num_key_value_heads") or config["num_attention_heads"],
    )
    head_dim = d // heads
    per_layer = d * d * 2 + 2 * d * kv * head_dim + 3 * d * ffn  # q, o, k, v, gate/up/down
    n_matmul = layers * per_layer + vocab * d  # + the LM head
    mean_len = summary["data"]["tokens"] / max(1, summary["data"]["samples"])
    flops_per_token = 6 * n_matmul + 6 * layers * mean_len * d
    tokens_per_s = summary["tokens_per_s"]
    achieved = tokens_per_s * flops_per_token
    peak = max(max(peak_before.values()), max(peak_after.values()))
    result = {
        "threads": args.threads,
        "model": {"hidden": d, "layers": layers, "heads": heads, "ffn": ffn, "vocab": vocab},
        "matmul_params": n_matmul,
        "mean_row_tokens": round(mean_len, 1),
        "train_flops_per_token": round(flops_per_token),
        "tokens_per_s": tokens_per_s,
        "achieved_gflops": round(achieved / 1e9, 2),
        "peak_gflops_before": {k: round(v / 1e9, 2) for k, v in peak_before.items()},
        "peak_gflops_after": {k: round(v / 1e9, 2) for k, v in peak_after.items()},
        "peak_gflops": round(peak / 1e9, 2),
        "ratio_of_peak": round(achieved / peak, 4),
        "steps": summary["steps"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
