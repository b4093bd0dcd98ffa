"""The SPARQL-writing agents end to end at smoke size, as a user runs them: ``make
sparql-agent-knowcoder SMOKE=1`` and ``make sparql-agent-isp SMOKE=1`` (walk -> questions ->
oracle trajectories in the tool set's action space -> filter -> stage1 -> rl with the paper's
preset -> eval with the same tools -> compare)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.kgfixtures import run_make

FIRST_CALL = {"knowcoder": "SearchGraphPatterns(", "isp": "<node>"}
LAST_CALL = {"knowcoder": "ExecuteSPARQL(", "isp": "<SPARQL>"}


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("tools", ["knowcoder", "isp"])
def test_the_chain_runs_for_the_tool_set(tmp_path: Path, tools: str) -> None:
    run = tmp_path / "runs"
    res = run_make(f"sparql-agent-{tools}", SPARQL_RUN=str(run))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = run / tools
    traj = pq.read_table(out / "trajectories.parquet").to_pylist()
    assert traj, "no oracle trajectories"
    calls = traj[0]["tool_calls"]
    assert calls[0].startswith(FIRST_CALL[tools]) and LAST_CALL[tools] in calls[-1]
    accepted = pq.read_table(out / "corpus" / "accepted.parquet").num_rows
    corpus = json.loads((out / "corpus" / "manifest.json").read_text())
    if tools == "isp":  # ISP-KGR's format: operations, then \boxed{} answers; all accepted
        assert accepted == len(traj)
        assert (
            traj[0]["messages"][-1]["content"]
            .split("</think>")[1]
            .strip()
            .startswith("<answer>\\boxed{")
        )
    else:  # KnowCoder-A1's expert data: trial and error, per-question cap, balance, upsampling
        assert any(t["mode"] == "oracle_trial" for t in traj)
        assert corpus["config"]["max_per_question"] == 3
        assert corpus["config"]["balance"] == "structure"
        assert accepted == corpus["accepted"] + corpus.get("upsampled_rows", 0)
    rl = json.loads((out / "rl" / "manifest.json").read_text())
    assert rl["config"]["toolset"] == tools
    for label in ("stage1", "rl"):
        metrics = json.loads((out / "eval" / label / "metrics.json").read_text())
        assert metrics["tools"] == tools and metrics["counts"]["questions"] == 3
    assert (out / "summary" / "compare.md").is_file()
