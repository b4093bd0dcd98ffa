"""kill -9 at random moments, then the same command again: is anything lost or left behind?

For each stage (walk, synthesize questions, synthesize trajectories, filter, train stage1) this
first runs the command once, uninterrupted, into a reference folder. Then, ``--kills`` times
per stage, it copies the stage's inputs into a fresh folder, starts the command, sends SIGKILL
to its process group after a random share of the reference run's wall time, and runs the same
command again (no ``--overwrite``) until it exits.

Training saves a checkpoint every step and is killed at a random step instead (seeded, drawn
from every step but the last): the moment its ``checkpoint-N`` is complete (its
``trainer_state.json`` written), wherever that falls in an epoch. (Killed at a random moment
with a checkpoint every 6 steps, 6 steps an epoch, every resume was from an epoch boundary,
and a resume inside an epoch that gave other weights went unseen, issue 41.) The re-run
resumes from the newest complete checkpoint, which the table reports with whether it lies
inside an epoch. Training reads the filter's first ``--train-rows`` trajectories (45 and 60
steps, as in the issue: 6 steps an epoch, so most kills land inside a later epoch);
``--train-micro-batch-size`` below the batch of 8 adds gradient accumulation; ``--nproc``
trains on that many processes (torchrun, gloo on CPU). It checks:

- the re-run exits 0, or 2 with "already exists"/"finished run" when the kill came after the
  commit (the output is then complete and is not replaced);
- the final data files are byte-identical to the reference run's (Parquet outputs and rejects,
  the trained weights);
- every file the run holds has a reference counterpart: no ``.staging``, ``.commit``, ``.lock``,
  ``.parts`` or ``.tmp`` left over;
- the inputs are unchanged (sha256).

    .venv/bin/python benchmarks/bench_kill9.py --kills 5     # 25 kills, about 12 minutes
    .venv/bin/python benchmarks/bench_kill9.py --stages "train stage1" --kills 10

Writes ``benchmarks/results/kill9.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
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
KB = ROOT / "kgsynth" / "resources" / "metaqa" / "kb_partial.txt.gz"
CFG = ROOT / "kgsynth" / "resources" / "recipes" / "metaqa_default.yaml"

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
        "argv": ["train", "stage1", "--config", str(CFG), "--corpus", "train/accepted.parquet",
                 "--model", "tiny", "--out", "stage1", "--max-steps", "{train_steps}",
                 "--save-steps", "1", "--micro-batch-size", "{micro}", "--copy-warmup-steps",
                 "0"],
        "inputs": ["train"],  # the filter's corpus, its first --train-rows rows
        "output": "stage1",
        "kill_at_step": True,
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


def command(stage: str, kg: Path, args: argparse.Namespace) -> list[str]:
    fill = {"{kg}": str(kg), "{train_steps}": str(args.train_steps),
            "{micro}": str(args.train_micro_batch_size)}  # fmt: skip
    argv = [fill.get(a, a) for a in STAGES[stage]["argv"]]
    if STAGES[stage].get("kill_at_step") and args.nproc > 1:
        argv += [
            "--nproc-per-node",
            str(args.nproc),
            "--launcher",
            "torchrun",
            "--master-port",
            "0",
        ]
    return [*kgsynth(), *argv]


def training_corpus(corpus: Path, rows: int, out: Path) -> None:
    """The first ``rows`` rows of ``corpus`` (all of it for 0) into ``out``."""
    import pyarrow.parquet as pq

    table = pq.read_table(corpus)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.slice(0, rows) if rows else table, out)


def steps_per_epoch(run: Path) -> int:
    """Optimizer steps an epoch of a finished training run takes (as transformers' Trainer counts
    them: micro-batches per process, then whole or partial accumulation groups)."""
    manifest = json.loads((run / "manifest.json").read_text())
    cfg, world = manifest["config"], manifest["world_size"]
    rows = manifest["data"]["training_rows"]
    micro_batches = -(-rows // (cfg["micro_batch_size"] * world))
    accumulation = cfg["batch_size"] // (cfg["micro_batch_size"] * world)
    return -(-micro_batches // accumulation)


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (from /proc): torchrun starts its workers in sessions of
    their own, out of reach of a kill of the command's process group."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(child: subprocess.Popen) -> None:
    """SIGKILL the command's process group and every process under it, all at once, as a
    machine losing power or a batch system ending the job would."""
    under = descendants(child.pid)
    os.killpg(child.pid, signal.SIGKILL)
    for pid in under:
        with contextlib.suppress(ProcessLookupError):  # ended with the group
            os.kill(pid, signal.SIGKILL)


def kill_after_checkpoint(child: subprocess.Popen, run: Path, step: int) -> bool:
    """SIGKILL ``child``'s process group as soon as ``checkpoint-{step}`` of ``run`` is complete;
    whether it was still running then (else it had finished)."""
    done = run / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json"
    while child.poll() is None and not done.is_file():
        time.sleep(0.002)
    if child.poll() is not None:
        return False
    kill_tree(child)
    return True


def resumed_from(run: Path) -> int | None:
    """The checkpoint step the re-run resumed from (its manifest), None when it started afresh."""
    manifest = run / "manifest.json"
    if not manifest.is_file():
        return None
    return json.loads(manifest.read_text()).get("resumed_from_step")


def run(argv: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


def compared_files(folder: Path) -> dict[str, str]:
    return {k: v for k, v in tree(folder).items() if k.endswith(COMPARED)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=5, help="kills per stage")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset")
    ap.add_argument("--train-steps", type=int, default=60, help="stage-1 optimizer steps")
    ap.add_argument(
        "--train-rows", type=int, default=45, help="stage-1 trajectories (0: the whole corpus)"
    )
    ap.add_argument(
        "--train-micro-batch-size", type=int, default=4, help="of the batch of 8 (4: 2 a step)"
    )
    ap.add_argument("--nproc", type=int, default=1, help="stage-1 training processes")
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
    train_epoch = 0  # steps an epoch of the training stage, once its reference has run
    for stage in STAGES:  # every stage's inputs come from the one before
        if STAGES[stage].get("kill_at_step"):
            training_corpus(
                ref / "corpus" / "accepted.parquet",
                args.train_rows,
                ref / "train" / "accepted.parquet",
            )
        t0 = time.perf_counter()
        proc = run(command(stage, kg, args), ref, env)
        durations[stage] = time.perf_counter() - t0
        if proc.returncode:
            sys.exit(f"reference {stage} failed: {proc.stderr[-2000:]}")
        print(f"reference {stage}: {durations[stage]:.1f}s", flush=True)
        if STAGES[stage].get("kill_at_step"):
            train_epoch = steps_per_epoch(ref / STAGES[stage]["output"])
            print(f"  {train_epoch} steps an epoch", flush=True)
    results = []
    for stage in stages:
        spec = STAGES[stage]
        for k in range(args.kills):
            folder = work / f"{stage.replace(' ', '_')}-{k}"
            folder.mkdir()
            for name in spec["inputs"]:
                shutil.copytree(ref / name, folder / name)
            inputs_before = {n: tree(folder / n) for n in spec["inputs"]}
            by_step = bool(spec.get("kill_at_step"))
            target = rng.randint(1, args.train_steps - 1) if by_step else None
            delay = rng.uniform(0.05, 1.0) * durations[stage]
            t0 = time.perf_counter()
            child = subprocess.Popen(
                command(stage, kg, args),
                cwd=folder,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            if by_step:
                assert target is not None
                finished_first = not kill_after_checkpoint(child, folder / spec["output"], target)
            else:
                time.sleep(delay)
                finished_first = child.poll() is not None
                if not finished_first:
                    kill_tree(child)
            child.wait()
            delay = time.perf_counter() - t0
            left = sorted(
                str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.startswith(".")
            )
            rerun = run(command(stage, kg, args), folder, env)
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
            resumed = resumed_from(out_new) if by_step else None
            row = {
                "stage": stage,
                "kill": k,
                "kill_after_s": round(delay, 2),
                "kill_after_checkpoint": target,
                "resumed_from_step": resumed,
                "resumed_mid_epoch": bool(resumed and resumed % train_epoch),
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
            where = (
                f"after checkpoint {target}, resumed from {resumed}"
                f" ({'mid-epoch' if row['resumed_mid_epoch'] else 'epoch boundary or start'})"
                if by_step
                else ""
            )
            print(
                f"{stage:24s} kill {k} at {delay:5.1f}s {where}: left {len(left)} hidden, rerun exit "
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
                "identical_outputs": sum(
                    r["identical_outputs"] for r in results if r["stage"] == s
                ),
                "resumed_mid_epoch": sum(
                    r["resumed_mid_epoch"] for r in results if r["stage"] == s
                ),
            }
            for s in stages
        },
        "train": {
            "steps": args.train_steps,
            "rows": args.train_rows,
            "steps_per_epoch": train_epoch,
            "micro_batch_size": args.train_micro_batch_size,
            "processes": args.nproc,
        },
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    for s, b in summary["by_stage"].items():
        print(
            f"{s:24s} {b['ok']} of {b['kills']} ok, {b['identical_outputs']} identical"
            + (
                f", {b['resumed_mid_epoch']} resumed mid-epoch"
                if STAGES[s].get("kill_at_step")
                else ""
            )
        )
    print(
        f"{summary['ok']} of {summary['kills']} kills ok ({summary['killed_mid_run']} landed "
        f"mid-run) → {args.out}"
    )
    shutil.rmtree(work)
    sys.exit(0 if summary["ok"] == summary["kills"] else 1)


if __name__ == "__main__":
    main()
