"""The learning sweep of issue 12: dev Hits@1 against CPU minutes for stage-1 SFT recipes.

For each training run folder given (``kgsynth train stage1 ... --save-steps N`` output), every
saved checkpoint (``checkpoints/checkpoint-N``) and the final model are evaluated with
``kgsynth eval`` on the first ``--limit`` questions of the MetaQA dev sample (interleaved by hop,
so every hop count gets an equal share), greedy, through the real KG tools. The training time of
a checkpoint is read from the run's ``metrics.jsonl`` (wall seconds since the first logged step
plus the first step's own time, on the threads the run used). Rows go to a JSON file and a
markdown table; the plot is dev Hits@1 (mean and by hop) against training minutes, one line per
run::

    .venv/bin/python benchmarks/sweep_learning.py runs/sweep/a runs/sweep/b \\
        --kg runs/default/kg --limit 90 --out benchmarks/results/learning

The evaluation questions are only scored here; nothing is trained or tuned on them: the runs were
made before the sweep, from synthetic walks of the KB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT / "kgsynth" / "resources" / "metaqa" / "dev_sample" / "metaqa_dev_sample.jsonl"


def train_seconds(run: Path) -> dict[int, float]:
    """Step -> training seconds so far, from the run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    rows = [r for r in rows if "time" in r and "step" in r]
    if not rows:
        return {}
    first = rows[0]
    # the first logged step's own duration, from its throughput
    t0 = first["time"] - first["tokens"] / max(first.get("tokens_per_s") or 1.0, 1.0)
    return {int(r["step"]): r["time"] - t0 for r in rows}


def checkpoints(run: Path) -> list[tuple[int, Path]]:
    found = []
    for ck in sorted((run / "checkpoints").glob("checkpoint-*")):
        found.append((int(ck.name.split("-")[-1]), ck))
    summary = run / "train_summary.json"
    if (run / "config.json").is_file() and summary.is_file():
        steps = json.loads(summary.read_text()).get("steps")
        if steps and all(s != steps for s, _ in found):
            found.append((int(steps), run))
    return sorted(found)


def probe(model: Path, conversations: list) -> float | None:
    """The copy probe (kgsynth.train.probe) of a checkpoint on held-out synthetic trajectories."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.train.probe import copy_loss

    return copy_loss(
        AutoModelForCausalLM.from_pretrained(model),
        AutoTokenizer.from_pretrained(model),
        conversations,
    )


def evaluate(model: Path, kg: str, limit: int, out: Path, max_turns: int, reuse: bool) -> dict:
    # each checkpoint carries the system prompt it was trained with (agent_system_prompt.txt),
    # which eval reads
    if reuse and (out / "metrics.json").is_file():
        return json.loads((out / "metrics.json").read_text())
    cmd = [
        str(Path(sys.executable).with_name("kgsynth")),
        "eval",
        "--questions",
        str(DEV),
        "--kg",
        kg,
        "--model",
        str(model),
        "--limit",
        str(limit),
        "--max-turns",
        str(max_turns),
        "--max-tokens",
        "64",
        "--batch-size",
        "64",
        "--out",
        str(out),
        "--overwrite",
    ]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads((out / "metrics.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="stage-1 output folders")
    ap.add_argument("--kg", required=True, help="the store the runs were trained on")
    ap.add_argument("--limit", type=int, default=90)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learning")
    ap.add_argument(
        "--probe",
        type=Path,
        help="trajectories.parquet none of the runs trained on (e.g. oracle trajectories of walks "
        "with another seed): its first 64 rows give each checkpoint's copy probe",
    )
    ap.add_argument("--reuse", action="store_true", help="reuse evaluations already in --out")
    ap.add_argument(
        "--final-only",
        action="store_true",
        help="evaluate each run's final model only, at its whole stage-1 wall time (copy "
        "warm-up included): one point per run, for runs annealed at different budgets",
    )
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    held = []
    if args.probe:
        from kgsynth.train.data import read_corpus

        held = read_corpus(args.probe)[:64]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in args.runs:
        seconds = train_seconds(run)
        spec = json.loads((run / "train_config.json").read_text())["config"]
        label = run.name if run.name != "stage1" else run.parent.name
        found = checkpoints(run)
        if args.final_only:
            summary = json.loads((run / "train_summary.json").read_text())
            found = [(int(summary["steps"]), run)]
            seconds = {int(summary["steps"]): float(summary["wall_s"])}
        for step, model in found:
            m = evaluate(
                model,
                args.kg,
                args.limit,
                args.out / label / f"step-{step}",
                args.max_turns,
                args.reuse,
            )
            hops = m.get("breakdowns", {}).get("hops", {})
            row = {
                "run": label,
                "step": step,
                "train_min": round(seconds.get(step, float("nan")) / 60, 2),
                "hits_at_1": m["overall"]["hits_at_1"],
                **{f"hits_{h}hop": v["hits_at_1"] for h, v in sorted(hops.items())},
                "questions": m["counts"]["questions"],
                "copy_probe": round(probe(model, held), 3) if held else None,
                "config": {
                    k: spec.get(k)
                    for k in (
                        "tiny_hidden_size",
                        "tiny_layers",
                        "tiny_vocab_size",
                        "lr",
                        "batch_size",
                    )
                },
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "sweep.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "| run | step | train min | copy probe (nats/token) | Hits@1 | 1-hop | 2-hop | 3-hop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['step']} | {r['train_min']} | {r['copy_probe']} | {r['hits_at_1']:.3f} | "
            + " | ".join(f"{r.get(f'hits_{h}hop', float('nan')):.3f}" for h in (1, 2, 3))
            + " |"
        )
    (args.out / "sweep.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))

    def series(r: dict) -> str:
        # with --final-only every run is one point of one curve: budget against score
        return "runs annealed at each budget" if args.final_only else r["run"]

    for run in dict.fromkeys(series(r) for r in rows):
        rr = sorted((r for r in rows if series(r) == run), key=lambda r: r["train_min"])
        axes[0].plot([r["train_min"] for r in rr], [r["hits_at_1"] for r in rr], "o-", label=run)
        for h, style in ((1, "o-"), (2, "s--"), (3, "^:")):
            axes[1].plot(
                [r["train_min"] for r in rr],
                [r.get(f"hits_{h}hop", 0.0) for r in rr],
                style,
                label=f"{run} {h}-hop",
            )
        if any(r["copy_probe"] is not None for r in rr):
            axes[2].plot(
                [r["train_min"] for r in rr], [r["copy_probe"] for r in rr], "o-", label=run
            )
    axes[2].set_xlabel("stage-1 training, CPU minutes (1 thread)")
    axes[2].set_ylabel("nats per copied token (lower: copies)")
    axes[2].set_title("copy probe on held-out synthetic trajectories")
    axes[2].legend(fontsize=6)
    for ax, title in ((axes[0], "dev Hits@1 (mean over hops)"), (axes[1], "dev Hits@1 by hop")):
        ax.set_xlabel("stage-1 training, CPU minutes (1 thread)")
        ax.set_ylabel("Hits@1")
        ax.set_ylim(0, 1)
        ax.set_title(title)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(args.out / "sweep.png", dpi=90)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
