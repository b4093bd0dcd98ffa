"""Trainer speed against the machine's fp32 matmul peak (issue 12, "Trainer speed").

Measures, side by side in one run and on the same number of torch threads:

1. the peak: fp32 ``torch.mm`` of square matrices (sizes 256-1024, best of several repeats);
2. the trainer: ``kgsynth train stage1`` with the chosen recipe (the packaged ``metaqa_default``,
   stage1 section) for ``--steps`` steps on oracle trajectories of the shipped KB, reading
   tokens/s from its ``train_summary.json``, once per variant (``--logits``, ``--tiny-heads``
   and ``--attn`` values, every combination, on the same corpus).

Training FLOPs per token = 6·N + 6·n_layers·L·d (Kaplan et al. 2020: 2N forward + 4N backward for
the weights; attention scores and values, causal, at the mean row length L), where N counts every
matmul weight except the embedding look-up. The tied LM head's 6·V·d counts at the positions
where it ran: every token with ``--logits all``, the labelled ones (``loss_tokens_trained`` of
``tokens_trained``) with ``--logits labelled``, so a skipped product is never counted as work.
The ratio is achieved FLOP/s over the peak::

    .venv/bin/python benchmarks/bench_trainer_flops.py --threads 1 --steps 200
    .venv/bin/python benchmarks/bench_trainer_flops.py --logits all labelled --tiny-heads 4 1
    .venv/bin/python benchmarks/bench_trainer_flops.py --attn sdpa eager

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
    done = subprocess.run(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if done.returncode:
        sys.exit(f"{' '.join(cmd[:3])} failed ({done.returncode}): {done.stderr.strip()[-800:]}")


def flops(config: dict, summary: dict) -> dict[str, float]:
    """Training FLOPs per token of a run (see the module's docstring) and its parts."""
    d, layers = config["hidden_size"], config["num_hidden_layers"]
    ffn, vocab = config["intermediate_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or d // heads
    per_layer = d * heads * head_dim * 2 + 2 * d * kv * head_dim + 3 * d * ffn  # q, o, k, v, mlp
    body = layers * per_layer
    mean_len = summary["data"]["tokens"] / max(1, summary["data"]["samples"])
    head_share = (
        summary["loss_tokens_trained"] / max(1, summary["tokens_trained"])
        if summary["logits"] == "labelled"
        else 1.0
    )
    per_token = 6 * body + 6 * vocab * d * head_share + 6 * layers * mean_len * d
    return {
        "matmul_params": body + vocab * d,
        "mean_row_tokens": round(mean_len, 1),
        "lm_head_share": round(head_share, 4),
        "train_flops_per_token": round(per_token),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--walks", type=int, default=1500)
    ap.add_argument(
        "--tiny-layers", type=int, default=None, help="layers of the policy (the 4-layer trial: 4)"
    )
    ap.add_argument(
        "--tiny-heads", type=int, nargs="+", default=[None], help="attention heads, one run each"
    )
    ap.add_argument(
        "--logits", nargs="+", default=["labelled"], choices=["labelled", "all"],
        help="where the LM head runs, one run each",
    )  # fmt: skip
    ap.add_argument(
        "--attn", nargs="+", default=["sdpa"], choices=["sdpa", "eager"],
        help="attention implementation, one run each",
    )  # fmt: skip
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "trainer_flops.json"
    )
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    cfg = ROOT / "kgsynth" / "resources" / "recipes" / "metaqa_default.yaml"
    peak_before = matmul_peak(args.threads)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        run([K, "kg", "import", str(ROOT / "kgsynth/resources/metaqa/kb_partial.txt.gz"), "--out",
             str(t / "kg")], env)  # fmt: skip
        run([K, "walk", "--kg", str(t / "kg"), "--config", str(cfg), "--n", str(args.walks),
             "--out", str(t / "walks.parquet")], env)  # fmt: skip
        run([K, "synthesize", "questions", "--walks", str(t / "walks.parquet"), "--out",
             str(t / "questions.parquet"), "--llm", "template"], env)  # fmt: skip
        run([K, "synthesize", "trajectories", "--config", str(cfg), "--questions",
             str(t / "questions.parquet"), "--kg", str(t / "kg"), "--mode", "oracle", "--llm",
             "template", "--out", str(t / "traj.parquet")], env)  # fmt: skip
        variants = [(h, lg, a) for h in args.tiny_heads for lg in args.logits for a in args.attn]
        for heads, logits, attn in variants:
            out = t / f"s1-{len(runs)}-{heads}-{logits}-{attn}"
            run([K, "train", "stage1", "--config", str(cfg), "--corpus",
                 str(t / "traj.parquet"), "--model", "tiny", "--out", str(out),
                 "--max-steps", str(args.steps), "--logits", logits,
                 "--attn-implementation", attn,
                 "--copy-warmup-steps", "0",  # drills are another loop; this times the trainer
                 *(["--tiny-layers", str(args.tiny_layers)] if args.tiny_layers else []),
                 *(["--tiny-heads", str(heads)] if heads else [])], env)  # fmt: skip
            summary = json.loads((out / "train_summary.json").read_text())
            config = json.loads((out / "config.json").read_text())
            runs.append((config, summary, attn))
    peak_after = matmul_peak(args.threads)
    peak = max(max(peak_before.values()), max(peak_after.values()))
    results = []
    for config, summary, attn in runs:
        counts = flops(config, summary)
        achieved = summary["tokens_per_s"] * counts["train_flops_per_token"]
        results.append(
            {
                "model": {
                    "hidden": config["hidden_size"],
                    "layers": config["num_hidden_layers"],
                    "heads": config["num_attention_heads"],
                    "ffn": config["intermediate_size"],
                    "vocab": config["vocab_size"],
                },
                "logits": summary["logits"],
                "attention": attn,
                **counts,
                "tokens_per_s": summary["tokens_per_s"],
                "train_runtime_s": summary["train_runtime_s"],
                "achieved_gflops": round(achieved / 1e9, 2),
                "ratio_of_peak": round(achieved / peak, 4),
                "steps": summary["steps"],
            }
        )
    result = {
        "threads": args.threads,
        "peak_gflops_before": {k: round(v / 1e9, 2) for k, v in peak_before.items()},
        "peak_gflops_after": {k: round(v / 1e9, 2) for k, v in peak_after.items()},
        "peak_gflops": round(peak / 1e9, 2),
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
