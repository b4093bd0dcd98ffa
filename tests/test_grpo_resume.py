"""A killed DeepSpeed RL run resumes where its last whole checkpoint ends.

``kgsynth train rl --deepspeed zero2`` (and ZeRO-3), checkpointing every step,
is killed with SIGKILL mid-run; the same command again goes on from the newest checkpoint
whose resume state was written (the engine's own checkpoint: module, partitioned optimizer
state, fp32 master weights; the scheduler, step, question order, curriculum, metrics and each
rank's RNG states) and ends with the weights of a run that was never interrupted. A checkpoint
killed mid-write (no resume state) is skipped. Real DeepSpeed on CPU through gloo; the tiny
SFT model and the question task of ``test_grpo_train``."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import test_grpo_train as rl_task

# the RL task's fixtures (module-scoped: built once for this module too)
task, sft, one_thread = rl_task.task, rl_task.sft, rl_task.one_thread
MAX_TURNS = rl_task.MAX_TURNS

pytest.importorskip("deepspeed")

STEPS = 6


def _args(task: Path, sft: Path, zero: str, *extra: str) -> list[str]:
    return [
        "train", "rl", "--questions", str(task / "questions.parquet"), "--kg", str(task / "kg"),
        "--init", str(sft), "--max-turns", str(MAX_TURNS), "--max-turn-tokens", "40",
        "--max-steps", str(STEPS), "--save-steps", "1", "--group-size", "4",
        "--questions-per-step", "2", "--lr", "3e-4", "--warmup-steps", "3", "--temperature",
        "1.0", "--kl-coef", "0.05", "--deepspeed", zero, *extra,
    ]  # fmt: skip


def _cli(args: list[str], log: Path) -> subprocess.Popen:
    """The CLI in its own process group, its output in ``log`` (a pipe nobody reads would
    stall it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("w") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "kgsynth.cli", *args], env=env, start_new_session=True,
            stdout=f, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _run(args: list[str], log: Path) -> float:
    """Run the CLI to its end; its wall time."""
    t0 = time.perf_counter()
    proc = _cli(args, log)
    assert proc.wait(timeout=600) == 0, log.read_text()[-5000:]
    return time.perf_counter() - t0


def _whole(staging: Path) -> list[int]:
    """Steps of the checkpoints whose resume state (written last) exists."""
    return sorted(
        int(p.parent.name.split("-")[1])
        for p in (staging / "checkpoints").glob("step-*/resume_state.pt")
    )


def _group_alive(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _kill_after(args: list[str], out: Path, step: int, log: Path) -> int:
    """Start the run, SIGKILL its whole process group once checkpoint ``step`` is whole (the
    deepspeed launcher keeps its workers in its group); the newest whole checkpoint left."""
    proc = _cli(args, log)
    staging = out.with_name(f".{out.name}.staging")
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        if any(s >= step for s in _whole(staging)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, log.read_text()[-5000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 20
    while _group_alive(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _group_alive(proc.pid), "a worker of the killed run is left writing"
    assert not out.exists() and staging.is_dir()
    whole = _whole(staging)
    assert whole and whole[-1] < STEPS
    return whole[-1]


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def _same_run(out: Path, ref: Path, resumed_from: int) -> None:
    """``out`` resumed from ``resumed_from`` and ended where the uninterrupted ``ref`` did."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    ref_rows = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed_from_step"] == resumed_from  # went on; did not start again
    # the steps after the resume drew the same questions, rollouts and learning rates
    for key in ("reward", "lr", "trained_tokens", "generated_tokens", "outcome_mean"):
        assert [r[key] for r in rows] == [r[key] for r in ref_rows], key
    assert any(r["trained_tokens"] > 0 for r in rows[resumed_from:])  # the resumed steps trained
    got, want, init = _weights(out), _weights(ref), _weights(ref.parent / "sft_copy")
    assert got.keys() == want.keys()
    worst = max(float((got[k] - want[k]).abs().max()) for k in got)
    assert worst <= 1e-6, worst
    assert any(not init[k].equal(want[k]) for k in want)  # the run moved the weights
    print(f"\nresumed from step {resumed_from}: max |w - w_ref| = {worst:.3g}; "
          f"byte-identical: {_sha(out) == _sha(ref)}")  # fmt: skip


def _sha(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "zero", ["ds_zero2.json", pytest.param("ds_zero0.json", marks=pytest.mark.slow)]
)
def test_killed_one_process_run_resumes_to_the_same_weights(
    task: Path, sft: Path, tmp_path: Path, zero: str
):
    """One process, ZeRO-2 (ZeRO-0 in the slow run): kill -9 once checkpoint 3 is whole; a
    later checkpoint killed mid-write (weights and shards there, no resume state) is skipped;
    the same command again ends with the uninterrupted run's weights."""
    import shutil

    shutil.copytree(sft, tmp_path / "sft_copy")
    args = _args(task, sft, zero)
    ref = tmp_path / "ref"
    t_ref = _run([*args, "--out", str(ref)], tmp_path / "ref.log")

    out = tmp_path / "killed"
    last = _kill_after([*args, "--out", str(out)], out, 3, tmp_path / "killed.log")
    staging = out.with_name(f".{out.name}.staging")
    # a checkpoint killed mid-write: the next step's folder without its resume state, and
    # half-written DeepSpeed shards
    half = staging / "checkpoints" / f"step-{last + 1}"
    shutil.rmtree(half, ignore_errors=True)
    shutil.copytree(staging / "checkpoints" / f"step-{last}", half)
    (half / "resume_state.pt").unlink()
    shards = list((half / "deepspeed").rglob("*.pt"))
    assert shards
    for shard in shards:
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    t_resume = _run([*args, "--out", str(out)], tmp_path / "resumed.log")
    _same_run(out, ref, last)
    print(f"uninterrupted run {t_ref:.1f} s, resumed run {t_resume:.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("zero", ["ds_zero2.json", "ds_zero3.json"])
def test_killed_two_rank_run_resumes_to_the_same_weights(
    task: Path, sft: Path, tmp_path: Path, zero: str
):
    """Two gloo ranks through the deepspeed launcher: each rank writes and reads back its own
    partition of the optimizer state (and, under ZeRO-3, of the weights) and its own RNG
    states; rank 0 writes the shared resume state once both are done."""
    import shutil

    shutil.copytree(sft, tmp_path / "sft_copy")
    args = _args(task, sft, zero, "--nproc-per-node", "2")
    ref = tmp_path / "ref"
    t_ref = _run([*args, "--out", str(ref), "--master-port", str(_free_port())],
                 tmp_path / "ref.log")  # fmt: skip

    out = tmp_path / "killed"
    killed = [*args, "--out", str(out), "--master-port", str(_free_port())]
    last = _kill_after(killed, out, 3, tmp_path / "killed.log")
    folder = out.with_name(f".{out.name}.staging") / "checkpoints" / f"step-{last}"
    assert len(list(folder.rglob("*optim_states.pt"))) == 2  # one partition per rank
    assert len(list((folder / "rng").glob("rank-*.pt"))) == 2
    t_resume = _run([*args, "--out", str(out), "--master-port", str(_free_port())],
                    tmp_path / "resumed.log")  # fmt: skip
    _same_run(out, ref, last)
    print(f"uninterrupted run {t_ref:.1f} s, resumed run {t_resume:.1f} s")


def test_deepspeed_run_resumes_only_on_its_own_world_size(tmp_path: Path):
    """A DeepSpeed checkpoint's optimizer state is partitioned by rank: resuming a 2-rank run
    on 1 process is refused with a message naming the fix."""
    import dataclasses
    from types import SimpleNamespace

    import torch

    from kgsynth.core.errors import ConfigError
    from kgsynth.train.grpo_config import GRPOConfig
    from kgsynth.train.grpo_resume import resume

    cfg = GRPOConfig(init="x", deepspeed="zero2")
    torch.save(
        {"config": dataclasses.asdict(cfg), "world_size": 2, "deepspeed": "state"},
        tmp_path / "resume_state.pt",
    )
    policy = SimpleNamespace(engine=object())
    run = SimpleNamespace(cfg=cfg, policy=policy, world=1, device="cpu",
                          spec=SimpleNamespace(out="runs/rl"), rank=0)  # fmt: skip
    with pytest.raises(ConfigError, match="--nproc-per-node 2"):
        resume(run, None, tmp_path, None)  # type: ignore[arg-type]
