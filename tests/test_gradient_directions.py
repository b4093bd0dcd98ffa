"""benchmarks/gradient_directions.py: the noise-scale estimates, GRPO's group advantages, the
reward, and a run end to end on a tiny model."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gradient_directions.py"
spec = importlib.util.spec_from_file_location("gradient_directions", SCRIPT)
gd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gd)


def test_noise_scale_recovers_a_known_mean_and_covariance() -> None:
    import torch

    gen = torch.Generator().manual_seed(0)
    mean = torch.zeros(50)
    mean[0] = 2.0  # |G|^2 = 4
    mom = gd.Moments(seed=0)
    for _ in range(4000):
        mom.add(mean + torch.randn(50, generator=gen))  # tr(Sigma) = 50
    signal, trace, scale = mom.noise_scale()
    assert signal == pytest.approx(4.0, rel=0.1)
    assert trace == pytest.approx(50.0, rel=0.05)
    assert scale == pytest.approx(12.5, rel=0.15)
    assert mom.split_cosine() > 0.8


def test_pure_noise_has_no_signal_and_no_reproducible_direction() -> None:
    import torch

    gen = torch.Generator().manual_seed(1)
    mom = gd.Moments(seed=1)
    for _ in range(400):
        mom.add(torch.randn(200, generator=gen))
    signal, trace, _ = mom.noise_scale()
    # the unbiased signal is 0 within its spread, far under the naive |mean|^2 = tr / n
    assert abs(signal) < 0.25 * trace / 400 and abs(mom.split_cosine()) < 0.3


def test_group_advantages_and_the_reward() -> None:
    assert gd.group_advantages([1.0, 1.0, 1.0]) is None
    adv = gd.group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert gd.hits_at_1({"predicted_answers": ["X", "Y"], "gold_answers": ["x"]}) == 1.0
    assert gd.hits_at_1({"predicted_answers": ["Y", "X"], "gold_answers": ["X"]}) == 0.0
    assert gd.hits_at_1({"predicted_answers": [], "gold_answers": ["X"]}) == 0.0
    rows = [{"question_id": q} for q in ("a", "b", "a")]
    assert [[r["question_id"] for r in g] for g in gd.grouped(rows)] == [["a", "a"], ["b"]]


def test_a_run_on_a_tiny_model(tmp_path: Path, capsys) -> None:
    import pyarrow.parquet as pq

    from kgsynth.train.tiny import build_tiny_model

    def conv(answer: str, thought: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": "Answer with tools."},
            {"role": "user", "content": "Question: who directed Kismet?"},
            {
                "role": "assistant",
                "content": f'<think>{thought}</think>\n<answer>["{answer}"]</answer>',
            },
        ]

    rows = []
    for q in range(3):
        for k in range(4):
            answer = "William Dieterle" if k % 2 == 0 or q == 2 else "Somebody"
            rows.append({"question_id": f"q{q}", "messages": conv(answer, f"look {k}"),
                         "predicted_answers": [answer], "gold_answers": ["William Dieterle"]})  # fmt: skip
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "free.parquet")
    pq.write_table(
        pa.table({"messages": [r["messages"] for r in rows[:6]]}), tmp_path / "c.parquet"
    )
    texts = [m["content"] for r in rows for m in r["messages"]]
    model = build_tiny_model(texts, tmp_path / "m", vocab_size=300)
    out = tmp_path / "g.json"
    assert gd.main(["--model", str(model), "--corpus", str(tmp_path / "c.parquet"),
                    "--rollouts", str(tmp_path / "free.parquet"), "--threads", "1",
                    "--json", str(out)]) == 0  # fmt: skip
    res = json.loads(out.read_text())
    # q2's four samples all succeed: no advantage; q0 and q1 are mixed
    assert res["informative_groups"] == 2 and res["groups"] == 3
    assert res["examples"]["sft"]["n"] == 6 and res["examples"]["rft"]["n"] == 8
    assert res["examples"]["pg"]["n"] == res["examples"]["pg+"]["n"] == 2
    assert all(math.isfinite(v) for v in res["cosines"].values())
    assert "| pg | 2 |" in capsys.readouterr().out
