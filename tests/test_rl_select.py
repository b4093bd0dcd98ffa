"""The choice and the file moves of GRPO's early stopping (kgsynth.train.select), on model
folders of known bytes with the scores given; the scoring itself (greedy agent episodes) is
checked end to end in test_grpo_train.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kgsynth.errors import ConfigError
from kgsynth.train import select


def _model(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(weights)
    return folder


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, Path]:
    init = _model(tmp_path / "stage2", b"init")
    run_dir = _model(tmp_path / "rl", b"last")
    _model(run_dir / "checkpoints" / "step-2", b"two")
    _model(run_dir / "checkpoints" / "step-4", b"four")
    (run_dir / "checkpoints" / "step-3").mkdir()  # killed before its weights: not a candidate
    questions = tmp_path / "val.jsonl"
    questions.write_text(
        "".join(
            json.dumps({"question": f"q{i}", "topic_names": ["A"], "answer_names": ["B"]}) + "\n"
            for i in range(3)
        )
    )
    return init, run_dir


def _select(monkeypatch, run, scores: dict[bytes, float]) -> dict:
    init, run_dir = run
    monkeypatch.setattr(
        select,
        "_score",
        lambda folder, *a, **k: scores[(folder / "model.safetensors").read_bytes()],
    )
    questions = run_dir.parent / "val.jsonl"
    return select.select_weights(run_dir, init, 6, questions, 2, graph=None, agent=None)


def test_candidates_are_the_start_the_whole_checkpoints_and_the_last_weights(run):
    init, run_dir = run
    got = select.candidates(run_dir, init, 6)
    assert got == [
        (0, init),
        (2, run_dir / "checkpoints" / "step-2"),
        (4, run_dir / "checkpoints" / "step-4"),
        (6, run_dir),
    ]


@pytest.mark.parametrize(
    ("scores", "chosen", "weights"),
    [
        ({b"init": 0.5, b"two": 0.7, b"four": 0.7, b"last": 0.6}, 4, b"four"),  # tie: the later
        ({b"init": 0.9, b"two": 0.7, b"four": 0.7, b"last": 0.6}, 0, b"init"),
        ({b"init": 0.5, b"two": 0.5, b"four": 0.5, b"last": 0.5}, 6, b"last"),
    ],
)
def test_the_best_weights_are_kept_and_the_last_stay_on_disk(
    monkeypatch, run, scores, chosen, weights
):
    init, run_dir = run
    record = _select(monkeypatch, run, scores)
    assert record["chosen_step"] == chosen and record["evaluated"] == 2
    assert [s["step"] for s in record["scores"]] == [0, 2, 4, 6]
    assert (run_dir / "model.safetensors").read_bytes() == weights
    assert json.loads((run_dir / "selection.json").read_text()) == record
    last = run_dir / "checkpoints" / "step-6" / "model.safetensors"
    if chosen == 6:
        assert not last.exists()
    else:
        assert last.read_bytes() == b"last"
    assert (init / "model.safetensors").read_bytes() == b"init"  # the start is never touched
    assert not list(run_dir.glob(".*.tmp"))


def test_a_candidate_without_whole_weights_is_refused(monkeypatch, run):
    init, run_dir = run
    (init / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="stage2"):
        _select(monkeypatch, run, {})
    assert (run_dir / "model.safetensors").read_bytes() == b"last"
