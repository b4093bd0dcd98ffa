"""KBQA-R1 end to end at smoke size, as a user runs it: ``make kbqa-r1 SMOKE=1`` (constraint and
chain walks -> questions -> oracle trajectories in the sexpr action space (KBQA-R1's <action>
turns, no reference shown) -> filter -> stage1 -> referenced and plain rejection sampling on the same held-out
questions -> stage2 -> rl --preset kbqa-r1 -> eval with the same tools -> compare)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.kgfixtures import run_make

ACTIONS = ("Find_relation", "Merge", "Order", "Compare", "Time_constraint", "Count")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_kbqa_r1_runs_the_chain(tmp_path: Path) -> None:
    run = tmp_path / "kbqa"
    res = run_make("kbqa-r1", KBQA_RUN=str(run))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    walks = pq.read_table(run / "walks.parquet").to_pylist()
    structures = Counter(w["structure"] for w in walks)
    assert {"count", "superlative", "comparative", "time", "chain-1"} <= set(structures)
    assert all(w["sexpr"] for w in walks if w["structure"] in ("count", "time"))
    traj = pq.read_table(run / "trajectories.parquet").to_pylist()
    assert traj and all(c.split(" [")[0] in ACTIONS for t in traj for c in t["tool_calls"])
    shown = [t for t in traj if "reference action sequence" in t["messages"][1]["content"]]
    assert shown == []  # KBQA-R1 §IV-B1 step 4: the recipe's SFT data shows no reference
    assert all("<action>" in m["content"] for t in traj for m in t["messages"][2:-1:2])
    for mode, name in (("referenced", "referenced"), ("free", "plain")):
        sampled = pq.read_table(run / "rrs" / f"{name}.parquet").to_pylist()
        assert sampled and {t["mode"] for t in sampled} == {mode}
        assert all(t["reference"] for t in sampled) == (mode == "referenced")
        assert not any(t["reference"] and t["reference"] in m["content"]
                       for t in sampled for m in t["messages"])  # fmt: skip
    assert "RRS (with reference)" in res.stdout and "plain rejection sampling" in res.stdout
    rl = json.loads((run / "rl" / "manifest.json").read_text())
    assert rl["config"]["toolset"] == "sexpr" and rl["config"]["gate_high"] == 0.95
    for label in ("stage1", "rl"):
        metrics = json.loads((run / "eval" / label / "metrics.json").read_text())
        assert metrics["tools"] == "sexpr" and metrics["counts"]["questions"] == 3
    assert (run / "summary" / "compare.md").is_file()
