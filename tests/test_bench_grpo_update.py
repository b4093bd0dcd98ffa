"""benchmarks/bench_grpo_update.py: rollouts built from runs of environment and policy tokens,
and the group-order baseline cutting micro-batches as the rollouts come."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_grpo_update.py"
spec = importlib.util.spec_from_file_location("bench_grpo_update", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_rollouts_follow_the_runs() -> None:
    rollouts, adv = bench.rollouts_of([[[3, 2, 1], [1, 1]]], vocab=50)
    assert [r.mask for r in rollouts] == [[0, 0, 0, 1, 1, 0], [0, 1]]
    pairs = [
        (v, m) for a, r in zip(adv, rollouts, strict=True) for v, m in zip(a, r.mask, strict=True)
    ]
    assert {abs(v) for v, m in pairs if m} == {1.0} and {v for v, m in pairs if not m} == {0.0}
    assert all(0 <= t < 50 for r in rollouts for t in r.ids)


def test_in_order_cuts_as_the_rollouts_come() -> None:
    class Cfg:
        micro_batch_size = 2

    calls = []
    out = bench._in_order(lambda r, a, part, c, d: calls.append(part) or [part], None, None,
                          [5, 1, 4, 2, 3], Cfg(), "cpu")  # fmt: skip
    assert calls == [[5, 1], [4, 2], [3]] and out == calls


def test_the_shipped_lengths_are_groups_of_eight() -> None:
    data = json.loads(bench.LENGTHS.read_text())
    assert "learn52" in data["source"]
    assert len(data["groups"]) >= 64 and all(len(g) == 8 for g in data["groups"])
    assert all(n >= 0 for g in data["groups"] for runs in g for n in runs)
