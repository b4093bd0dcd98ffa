"""kill -9 at random moments, then the same command again: is anything lost or left behind?

For each stage (walk, synthesize questions, synthesize trajectories, filter, train stage1) this
first runs the command once, uninterrupted, into a reference folder. Then, ``--kills`` times
per stage, it copies the stage's inputs into a fresh folder, starts the command, sends SIGKILL
to its process group after a random share of the reference run's wall time, and runs the same
command again (no ``--overwrite``) until it exits. It checks:

- the re-run exits 0, or 2 with "already exists"/"finished run" when the kill came after the
  commit (the output is then complete and is not replaced);
- the final data files are byte-identical to the reference run's (Parquet outputs and rejects,
  the trained weights);
- every file the run holds has a reference counterpart: no ``.staging``, ``.commit``, ``.lock``,
  ``.parts`` or ``.tmp`` left over;
- the inputs are unchanged (sha256).

    .venv/bin/python benchmarks/bench_kill9.py --kills 5     # 25 kills, about 10 minutes

Writes ``benchmarks/results/kill9.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KB = ROOT / "data" / "metaqa" / "kb_partial.txt.gz"
CFG = ROOT / "pipelines" / "metaqa_default.yaml"

# per stage: the command (paths relative to the run folder), its inputs, its output
STAGES: dict[str, dict] = {
    "walk": {
        "argv": ["walk", "--kg", "{kg}", "--config", str(CFG), "--n", "1500", "--chunk-size",
                 "100", "--out", "walks/walks.parquet"],
        "inputs": [],
        "output": "walks",
    },
    "synthesize questions": {
        "argv": ["synthesize", "questions", "--walks", "walks/walks.parquet", "--out",
                 "questions/questions.parquet", "--llm", "template"],
        "inputs": ["walks"],
        "output": "questions",
    },
    "synthesize trajectories": {
        "argv": ["synthesize", "trajectories", "--config", str(CFG), "--questions",
                 "questions/questions.parquet", "--kg", "{kg}", "--mode", "oracle", "--llm",
                 "template", "--out", "trajectories/trajectories.parquet"],
        "inputs": ["questions"],
        "output": "trajectories",
    },
    "filter": {
        "argv": ["filter", "--in", "trajectories/trajectories.parquet", "--out", "corpus"],
        "inputs": ["trajectories"],
        "output": "corpus",
    },
    "train stage1": {
        "argv": ["train", "stage1", "--config", str(CFG), "--corpus", "corpus/accepted.parquet",
                 "--model", "tiny", "--out", "stage1", "--max-steps", "24", "--save-steps", "6",
                 "--copy-warmup-steps", "0"],
        "inputs": ["corpus"],
        "output": "stage1",
    },
}  # fmt: skip

# files whose bytes must match the reference run; manifests, plots and logs carry timings
COMPARED = (".parquet", ".safetensors", "tokenizer.json")


def kgsynth() -> list[str]:
    script = Path(sys.executable).parent / "kgsynth"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "kgsynth.cli"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder``."""
    return {str(p.relative_to(folder)): sha(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def command(stage: str, kg: Path) -> list[str]:
    return [*kgsynth(), *(a.replace("{kg}", str(kg)) for a in STAGES[stage]["argv"])]


def run(argv: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


def compared_files(folder: Path) -> dict[str, str]:
    return {k: v for k, v in tree(folder).items() if k.endswith(COMPARED)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=5, help="kills per stage")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "kill9.json")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    stages = [s for s in args.stages.split(",") if s]
    work = Path(tempfile.mkdtemp(prefix="kgsynth-kill9-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KGSYNTH_CACHE": str(work / "cache")}
    kg = work / "kg"
    proc = run([*kgsynth(), "kg", "import", str(KB), "--out", str(kg)], work, env)
    if proc.returncode:
        sys.exit(proc.stderr)
    ref = work / "ref"
    ref.mkdir()
    durations: dict[str, float] = {}
    for stage in STAGES:  # every stage's inputs come from the one before
        t0 = time.perf_counter()
        proc = run(command(stage, kg), ref, env)
        durations[stage] = time.perf_counter() - t0
        if proc.returncode:
            sys.exit(f"reference {stage} failed: {proc.stderr[-2000:]}")
        print(f"reference {stage}: {durations[stage]:.1f}s", flush=True)
    results = []
    for stage in stages:
        spec = STAGES[stage]
        for k in range(args.kills):
            folder = work / f"{stage.replace(' ', '_')}-{k}"
            folder.mkdir()
            for name in spec["inputs"]:
                shutil.copytree(ref / name, folder / name)
            inputs_before = {n: tree(folder / n) for n in spec["inputs"]}
            delay = rng.uniform(0.05, 1.0) * durations[stage]
            child = subprocess.Popen(
                command(stage, kg),
                cwd=folder,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            time.sleep(delay)
            finished_first = child.poll() is not None
            if not finished_first:
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            left = sorted(
                str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.startswith(".")
            )
            rerun = run(command(stage, kg), folder, env)
            refused = rerun.returncode == 2 and (
                "already exists" in rerun.stderr
                or "already holds" in rerun.stderr
                or "finished run" in rerun.stderr
            )
            out_ref = ref / spec["output"]
            out_new = folder / spec["output"]
            same = out_new.exists() and compared_files(out_ref) == compared_files(out_new)
            ref_names = set(tree(out_ref))
            new_names = set(tree(out_new)) if out_new.exists() else set()
            strays = sorted(
                str(p.relative_to(folder))
                for p in folder.rglob("*")
                if p.name.startswith(".") or p.name.endswith((".tmp", ".parts"))
            )
            row = {
                "stage": stage,
                "kill": k,
                "kill_after_s": round(delay, 2),
                "finished_before_kill": finished_first,
                "hidden_files_after_kill": left,
                "rerun_exit": rerun.returncode,
                "rerun_refused_as_complete": refused,
                "identical_outputs": same,
                "missing_files": sorted(ref_names - new_names),
                "extra_files": sorted(new_names - ref_names),
                "stray_files": strays,
                "inputs_unchanged": all(
                    tree(folder / n) == inputs_before[n] for n in spec["inputs"]
                ),
                "rerun_error": rerun.stderr.strip().splitlines()[-1:] if rerun.returncode else [],
            }
            row["ok"] = (
                (rerun.returncode == 0 or refused)
                and same
                and not row["missing_files"]
                and not row["stray_files"]
                and row["inputs_unchanged"]
            )
            results.append(row)
            print(
                f"{stage:24s} kill {k} at {delay:5.1f}s: left {len(left)} hidden, rerun exit "
                f"{rerun.returncode}{' (complete)' if refused else ''}, identical {same}, "
                f"strays {strays or 'none'} → {'ok' if row['ok'] else 'FAIL'}",
                flush=True,
            )
            shutil.rmtree(folder)
    summary = {
        "kills": len(results),
        "ok": sum(r["ok"] for r in results),
        "killed_mid_run": sum(not r["finished_before_kill"] for r in results),
        "reference_seconds": {k: round(v, 1) for k, v in durations.items()},
        "by_stage": {
            s: {
                "kills": sum(r["stage"] == s for r in results),
                "ok": sum(r["ok"] for r in results if r["stage"] == s),
                "left_hidden_files": sum(
                    bool(r["hidden_files_after_kill"]) for r in results if r["stage"] == s
                ),
            }
            for s in stages
        },
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"{summary['ok']} of {summary['kills']} kills ok ({summary['killed_mid_run']} landed "
        f"mid-run) → {args.out}"
    )
    shutil.rmtree(work)
    sys.exit(0 if summary["ok"] == summary["kills"] else 1)


if __name__ == "__main__":
    main()
