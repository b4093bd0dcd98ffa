"""benchmarks/sample_outcomes.py: per-question successes of a filter output, the summary
figures, and the corpus of the mixed questions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import polars as pl
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sample_outcomes.py"
spec = importlib.util.spec_from_file_location("sample_outcomes", SCRIPT)
sample_outcomes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sample_outcomes)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    # q1: both samples pass (the second as a repeat); q2: one of two; q3: none of two
    pl.DataFrame(
        {"question_id": ["q1", "q2"], "structure": ["chain-1", "chain-2"], "messages": ["a", "b"]}
    ).write_parquet(tmp_path / "accepted.parquet")
    pl.DataFrame(
        {
            "question_id": ["q1", "q2", "q3", "q3"],
            "structure": ["chain-1", "chain-2", "chain-3", "chain-3"],
            "reject_reason": ["duplicate_actions", "wrong_answer", "no_answer", "wrong_answer"],
        }
    ).write_parquet(tmp_path / "rejected.parquet")
    return tmp_path


def test_outcomes_count_repeats_as_successes(folder: Path) -> None:
    per_question = sample_outcomes.outcomes(folder)
    assert per_question.rows() == [
        ("q1", "chain-1", 2, 2),
        ("q2", "chain-2", 2, 1),
        ("q3", "chain-3", 2, 0),
    ]


def test_summary(folder: Path) -> None:
    s = sample_outcomes.summary(sample_outcomes.outcomes(folder))
    assert s["histogram"] == {0: 1, 1: 1, 2: 1}
    assert s["mean_success"] == pytest.approx(0.5)
    assert s["reward_variance"] == pytest.approx(0.25 / 3)
    assert (s["mixed"], s["never"], s["always"]) == (1, 1, 1)
    assert (s["successes_in_hard"], s["successes"]) == (1, 3)


def test_mixed_out_keeps_only_mixed_questions(folder: Path, capsys) -> None:
    out = folder / "mixed.parquet"
    assert sample_outcomes.main([str(folder), "--mixed-out", str(out)]) == 0
    assert pl.read_parquet(out)["question_id"].to_list() == ["q2"]
    assert "mixed 1, never 1, always 1" in capsys.readouterr().out


def test_missing_file_is_one_line_error(tmp_path: Path, capsys) -> None:
    assert sample_outcomes.main([str(tmp_path)]) == 2
    assert "no accepted.parquet" in capsys.readouterr().err
