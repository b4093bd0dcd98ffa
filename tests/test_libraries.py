"""The libraries that replaced hand-written pieces (issue 44, item 7) keep what kgsynth relied on:
the output lock (filelock) across processes, the intervals and the sign test (scipy.stats)
against their definitions, and near names (rapidfuzz's bound before difflib's ratio) equal to
difflib's alone."""

from __future__ import annotations

import difflib
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kgsynth.agent.strategies.entities import near_names
from kgsynth.core.errors import OutputBusyError
from kgsynth.core.output_lock import OutputLock
from kgsynth.metrics import bootstrap_interval, sign_test_p, wilson_interval

# --- the output lock ------------------------------------------------------------------------

CONTENDER = """
    import sys, time
    from pathlib import Path
    from kgsynth.core.errors import OutputBusyError
    from kgsynth.core.output_lock import OutputLock

    out, log, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    held = busy = 0
    for _ in range(rounds):
        try:
            with OutputLock(out):
                with log.open("a") as fh:  # nobody else may be inside now
                    fh.write("in\\n"); fh.flush(); time.sleep(0.002); fh.write("out\\n")
                held += 1
        except OutputBusyError:
            busy += 1
    print(held, busy)
"""


def test_two_processes_never_hold_one_output_at_once(tmp_path: Path) -> None:
    """Two processes take and release the lock on one output 150 times each, racing the
    release (the holder unlinks the file while a contender may have it open): the log of
    entries and exits never interleaves, and the lock file is gone at the end."""
    script = tmp_path / "contend.py"
    script.write_text(textwrap.dedent(CONTENDER))
    out, log = tmp_path / "walks.parquet", tmp_path / "log.txt"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(out), str(log), "150"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        for _ in range(2)
    ]
    counts = [tuple(map(int, p.communicate(timeout=120)[0].split())) for p in procs]
    lines = log.read_text().split()
    assert lines == ["in", "out"] * (len(lines) // 2)  # never two inside
    assert sum(held for held, _ in counts) == len(lines) // 2 >= 150
    assert not (tmp_path / ".walks.lock").exists()


def test_a_busy_output_names_its_holder_and_a_released_one_is_free(tmp_path: Path) -> None:
    out = tmp_path / "q.parquet"
    first = OutputLock(out).acquire()
    assert (tmp_path / ".q.lock").read_text().strip() == str(os.getpid())
    with pytest.raises(OutputBusyError, match=r"--out: .*q\.parquet is being written .*pid \d+"):
        OutputLock(out).acquire()
    first.release()
    first.release()  # twice is harmless
    with OutputLock(out):
        pass
    assert list(tmp_path.iterdir()) == []


# --- intervals and the sign test -------------------------------------------------------------


def reference_wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@pytest.mark.parametrize(("k", "n"), [(0, 1), (1, 1), (3, 7), (50, 100), (1, 400), (399, 400)])
def test_wilson_interval_is_the_formula(k: int, n: int) -> None:
    lo, hi = wilson_interval(k, n)
    ref = reference_wilson(k, n)
    assert lo == pytest.approx(ref[0], abs=1e-12) and hi == pytest.approx(ref[1], abs=1e-12)
    assert (lo == 0.0) == (k == 0) and (hi == 1.0) == (k == n)


@pytest.mark.parametrize(("better", "worse"), [(6, 0), (1, 5), (10, 10), (3, 17), (0, 40)])
def test_sign_test_is_the_exact_binomial_tail(better: int, worse: int) -> None:
    n = better + worse
    tail = sum(math.comb(n, k) for k in range(min(better, worse) + 1)) / 2**n
    assert sign_test_p(better, worse) == pytest.approx(min(1.0, 2 * tail), rel=1e-12)


def test_sign_test_of_many_pairs_is_quick() -> None:
    """40,500 changed answers (a large eval): the exact sum took minutes; scipy's is at once."""
    import time

    start = time.perf_counter()
    p = sign_test_p(20_000, 20_500)
    assert time.perf_counter() - start < 2.0
    assert p == pytest.approx(0.0131538251, rel=1e-6)


def test_bootstrap_interval_resamples_groups_from_the_seeded_generator() -> None:
    """The interval is the percentiles of the means of resampled group means, drawn by
    NumPy's generator seeded with ``seed`` (written out here)."""
    rng = np.random.default_rng(7)
    groups = [
        list(rng.integers(0, 2, size=int(rng.integers(1, 4))).astype(float)) for _ in range(60)
    ]
    means = np.array([sum(g) / len(g) for g in groups])
    draws = np.random.default_rng(3).integers(0, len(means), size=(500, len(means)))
    expected = np.percentile(means[draws].mean(axis=1), [5.0, 95.0])
    got = bootstrap_interval(groups, resamples=500, seed=3, level=0.9)
    assert got == pytest.approx(tuple(expected), abs=1e-12)
    assert bootstrap_interval([[0.25, 0.75]]) == (0.5, 0.5)  # one group: its mean


# --- near names --------------------------------------------------------------------------------


def difflib_only(name: str, candidates: list[str], cutoff: float = 0.6) -> list[str]:
    target = " ".join(name.casefold().split())
    scored = []
    for c in candidates:
        folded = " ".join(c.casefold().split())
        if folded and folded != target:
            ratio = difflib.SequenceMatcher(None, target, folded, autojunk=False).ratio()
            if ratio >= cutoff:
                scored.append((ratio, c))
    scored.sort(key=lambda s: (-s[0], -len(s[1]), s[1]))
    return [c for _, c in scored]


NAMES = [
    "William Dieterle",
    "Wilhelm Dieterle",
    "Bette Davis",
    "Betty Davies",
    "Juarez",
    "Jezebel",
    "Kismet",
    "Edward G. Robinson",
    "abcxy",  # "abcde" scores 0.6 exactly: on the cutoff, kept
    "maria_of_austria_the_younger",
    "Das Boot",
    "Boot Camp",
]


@pytest.mark.parametrize(
    "name",
    ["William Deiterle", "Bete Davis", "Juarz", "abcde", "maria_of_austria_the_yonger", "Boot"],
)
def test_near_names_are_difflibs_ratio_whatever_filters_first(name: str) -> None:
    assert near_names(name, "", NAMES) == difflib_only(name, NAMES)
    assert near_names(name, "", NAMES, cutoff=0.8) == difflib_only(name, NAMES, cutoff=0.8)
    assert ("abcxy" in near_names(name, "", NAMES)) == (name == "abcde")
