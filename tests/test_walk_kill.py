"""A real kill -9 in the middle of `kgsynth walk` on the shipped MetaQA KB, then a re-run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kgsynth.kg.importer import import_kg
from kgsynth.kg.open import DEFAULT_KG


def kgsynth(*args: str) -> list[str]:
    return [sys.executable, "-m", "kgsynth.cli", *args]


def test_kill_9_then_rerun_gives_the_uninterrupted_file(tmp_path: Path):
    store = tmp_path / "kg"
    import_kg(DEFAULT_KG, store)
    common = ["walk", "--kg", str(store), "--n", "600", "--seed", "5", "--chunk-size", "40"]
    subprocess.run(
        kgsynth(*common, "--out", str(tmp_path / "full" / "walks.parquet")),
        check=True,
        capture_output=True,
    )

    out = tmp_path / "killed" / "walks.parquet"
    parts = out.with_name("walks.parquet.parts")
    proc = subprocess.Popen(
        kgsynth(*common, "--out", str(out)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(parts.glob("chunk-*.json"))) < 3:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    chunks = len(list(parts.glob("chunk-*.json")))
    assert chunks >= 3 and not out.exists(), "the run finished before it could be killed"

    rerun = subprocess.run(kgsynth(*common, "--out", str(out)), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert out.read_bytes() == (tmp_path / "full" / "walks.parquet").read_bytes()
    assert not parts.exists()
