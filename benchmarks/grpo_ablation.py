"""The GRPO ablation of issue 46 item 3, summarised from the run folders it left.

Each run folder is a `kgsynth train rl --select-questions` output: ``metrics.jsonl`` (one row
per step), ``rl_summary.json`` and ``selection.json`` (every checkpoint's validation Hits@1,
and its better / worse split against the start with the exact sign test's p). One row per
run: rollouts, training wall time, the reward of the first and last fifth of the steps, the
share of groups whose rewards tie, the mean within-group reward spread, the mean gradient
norm, and the validation scores::

    .venv/bin/python benchmarks/grpo_ablation.py runs/g46/A runs/g46/B ...

``--pair START END`` compares two ``kgsynth eval`` prediction files of the same questions
(the start and a GRPO checkpoint; several runs a question are averaged): Hits@1 per hop, the
paired sign test, F1, recall and precision likewise, and what the
questions one gets right and the other wrong have in common (hops, structure or question
type, turns, tool and format errors, forced answers, the first tool call that differs)::

    .venv/bin/python benchmarks/grpo_ablation.py --pair runs/g46/eval/start runs/g46/eval/A
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from kgsynth.eval.paired import sign_split
from kgsynth.metrics import sign_test_p


def _fifths(rows: list[dict[str, Any]], key: str) -> tuple[float, float]:
    k = max(1, len(rows) // 5)
    first, last = rows[:k], rows[-k:]
    return (
        sum(r[key] for r in first) / len(first),
        sum(r[key] for r in last) / len(last),
    )


def run_row(folder: Path) -> dict[str, Any]:
    """The ablation table's figures for one run folder."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "rl_summary.json").read_text())
    config = json.loads((folder / "rl_config.json").read_text())["config"]
    sel_path = folder / "selection.json"
    selection = json.loads(sel_path.read_text()) if sel_path.is_file() else summary.get("selection")
    groups = sum(r["groups"] for r in rows)
    tied = sum(r["skipped_groups"] for r in rows)
    trained = sum(r.get("trained_groups", r["groups"] - r["skipped_groups"]) for r in rows)
    spreads = [r["group_reward_std"] for r in rows if "group_reward_std" in r]
    first, last = _fifths(rows, "reward")
    out: dict[str, Any] = {
        "run": folder.name,
        "steps": len(rows),
        "group": config["group_size"],
        "questions": config["questions_per_step"],
        "lr": config["lr"],
        "temperature": config["temperature"],
        "kl": config["kl_coef"],
        "dynamic": bool(config.get("dynamic_sampling")),
        "rollouts": summary["rollouts"],
        "wall_s": summary["wall_s"],
        "reward_first": first,
        "reward_last": last,
        "groups": groups,
        "tied": tied,
        "trained_groups": trained,
        "group_reward_std": statistics.fmean(spreads) if spreads else None,
        "grad_norm": statistics.fmean(r["grad_norm"] for r in rows),
        "kl_last": rows[-1]["kl"],
        "entropy": statistics.fmean(r["entropy"] for r in rows if r.get("entropy") is not None),
        "walk": walk_ratios(folder, config["init"], config["lr"]),
    }
    if selection:
        scores = selection["scores"]
        start = scores[0]["hits_at_1"]
        best = max(scores[1:], key=lambda s: (s["hits_at_1"], s["step"]))
        last_ckpt = scores[-1]
        out.update(
            val_start=start,
            val_steps=[(s["step"], s["hits_at_1"]) for s in scores[1:]],
            val_best=best,
            val_last=last_ckpt,
            chosen_step=selection["chosen_step"],
        )
    return out


def walk_ratios(folder: Path, start: str, lr: float) -> list[tuple[int, float]]:
    """``|W_K - W_0| / (lr sqrt(K N))`` at each checkpoint K (N parameters): the distance the
    weights moved, over the distance an Adam random walk of K steps of size ``lr`` per
    parameter covers. Constant in K: the steps add up as noise (distance ~ sqrt K); growing
    as sqrt K: they share a direction (distance ~ K)."""
    from safetensors.torch import load_file

    w0 = load_file(str(Path(start) / "model.safetensors"))
    n = sum(v.numel() for v in w0.values())
    out = []
    for ck in sorted(folder.glob("checkpoints/step-*"), key=lambda p: int(p.name[5:])):
        k = int(ck.name[5:])
        wk = load_file(str(ck / "model.safetensors"))
        dist = math.sqrt(sum(float((wk[m].float() - w0[m].float()).norm() ** 2) for m in w0))
        out.append((k, dist / (lr * math.sqrt(k * n))))
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The ablation table in Markdown."""
    head = (
        "| run | G x Q x steps, lr, T | rollouts | wall | reward first → last fifth | tied groups "
        "| within-group reward std | validation: start → each checkpoint | best (better / worse, p) "
        "| last (better / worse, p) | ‖W_K − W_0‖ / (lr √(K N)) at each checkpoint |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        setting = (
            f"{r['group']} x {r['questions']} x {r['steps']}, {r['lr']:g}, {r['temperature']:g}"
            + (", dynamic" if r["dynamic"] else "")
            + (f", KL {r['kl']:g}" if r["kl"] != 0.001 else "")
        )
        spread = f"{r['group_reward_std']:.3f}" if r["group_reward_std"] is not None else "n/a"
        val = best = last = ""
        if "val_start" in r:
            val = f"{r['val_start']:.3f} → " + " / ".join(f"{v:.3f}" for _, v in r["val_steps"])
            b, lc = r["val_best"], r["val_last"]
            best = f"step {b['step']}: {b['better']} / {b['worse']}, p {b['sign_test_p']:.3g}"
            last = f"{lc['better']} / {lc['worse']}, p {lc['sign_test_p']:.3g}"
        lines.append(
            f"| {r['run']} | {setting} | {r['rollouts']:,} | {r['wall_s']:.0f} s "
            f"| {r['reward_first']:.3f} → {r['reward_last']:.3f} "
            f"| {r['tied']} of {r['groups']} ({r['tied'] / r['groups']:.0%}) | {spread} "
            f"| {val} | {best} | {last} | " + " / ".join(f"{v:.2f}" for _, v in r["walk"]) + " |"
        )
    return "\n".join(lines)


SCORES = ("hits_at_1", "f1", "recall", "precision")


def _predictions(path: Path) -> dict[str, dict[str, Any]]:
    """An eval's rows by question: run 0's row, its scores the mean over the eval's runs."""
    import polars as pl

    file = path / "predictions.parquet" if path.is_dir() else path
    frame = pl.read_parquet(file).filter(pl.col("system") == "model")
    means = frame.group_by("question_id").agg(pl.col(m).fill_null(0.0).mean() for m in SCORES)
    first = frame.filter(pl.col("run") == 0).drop(SCORES)
    rows = first.join(means, on="question_id")
    return {r["question_id"]: r for r in rows.iter_rows(named=True)}


def _kind(r: dict[str, Any]) -> str:
    return str(r.get("qtype") or r.get("structure") or "?")


def _first_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    calls_a, calls_b = list(a.get("tool_calls") or []), list(b.get("tool_calls") or [])
    for k, (x, y) in enumerate(zip(calls_a, calls_b, strict=False)):
        if x != y:
            return f"call {k + 1}: {x} -> {y}"
    if len(calls_a) != len(calls_b):
        return f"{len(calls_a)} calls -> {len(calls_b)} calls, then answered"
    return "same calls, another answer"


def pair(start: Path, end: Path) -> str:
    """Hits@1 per hop of two evals of the same questions, the sign test, and the questions
    that changed, with what they have in common."""
    a, b = _predictions(start), _predictions(end)
    common = sorted(set(a) & set(b))
    lines = [f"{len(common)} questions in both"]

    def hits(r: dict[str, dict[str, Any]], qs: list[str]) -> dict[str, float]:
        return {q: r[q]["hits_at_1"] for q in qs}

    for hop in sorted({a[q]["hops"] for q in common}):
        qs = [q for q in common if a[q]["hops"] == hop]
        sa, sb = hits(a, qs), hits(b, qs)
        better, worse, p = sign_split(sa, sb)
        lines.append(
            f"{hop}-hop ({len(qs)}): {statistics.fmean(sa.values()):.3f} -> "
            f"{statistics.fmean(sb.values()):.3f}, {better} better / {worse} worse, p {p:.3g}"
        )
    for metric in SCORES[1:]:  # the reward's own metric and its two halves
        ma = sum(a[q][metric] for q in common) / len(common)
        mb = sum(b[q][metric] for q in common) / len(common)
        up = sum(b[q][metric] > a[q][metric] + 1e-9 for q in common)
        down = sum(b[q][metric] < a[q][metric] - 1e-9 for q in common)
        lines.append(
            f"{metric}: {ma:.3f} -> {mb:.3f}, {up} better / {down} worse, "
            f"p {sign_test_p(up, down):.3g}"
        )
    gained = [q for q in common if b[q]["hits_at_1"] > a[q]["hits_at_1"]]
    lost = [q for q in common if b[q]["hits_at_1"] < a[q]["hits_at_1"]]
    sa, sb = hits(a, common), hits(b, common)
    _, _, p = sign_split(sa, sb)
    lines.append(
        f"all: {statistics.fmean(sa.values()):.3f} -> {statistics.fmean(sb.values()):.3f}, "
        f"{len(gained)} better / {len(lost)} worse, p {p:.3g}"
    )
    for name, qs in (("gained", gained), ("lost", lost)):
        if not qs:
            continue
        lines.append(f"\n{name} ({len(qs)}):")
        lines.append(f"  hops: {dict(Counter(a[q]['hops'] for q in qs))}")
        lines.append(f"  kind: {dict(Counter(_kind(a[q]) for q in qs).most_common(6))}")
        for label, r in (("start", a), ("end", b)):
            lines.append(
                f"  {label}: turns {statistics.fmean(r[q]['num_turns'] for q in qs):.1f}, "
                f"tool errors {sum(r[q]['tool_errors'] for q in qs)}, "
                f"format errors {sum(r[q]['format_errors'] for q in qs)}, "
                f"forced answers {sum(bool(r[q]['forced_answer']) for q in qs)}, "
                f"unanswered {sum(not r[q]['answered'] for q in qs)}"
            )
        for q in qs:
            lines.append(
                f"  - [{a[q]['hops']}-hop] {a[q]['question'][:90]} | "
                f"{_first_difference(a[q], b[q])[:140]}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="kgsynth train rl output folders")
    parser.add_argument("--pair", nargs=2, type=Path, metavar=("START", "END"))
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()
    if args.pair:
        print(pair(*args.pair))
    if args.runs:
        rows = [run_row(folder) for folder in args.runs]
        print(table(rows))
        if args.json:
            print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
