"""The choice and the file moves of GRPO's early stopping (kgsynth.train.select), on model
folders of known bytes with the scores given; the scoring itself (greedy agent episodes) is
checked end to end in test_grpo_train.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kgsynth.core.errors import ConfigError
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


def _outcomes(right: int, shift: int = 0) -> dict[str, float]:
    """Hits@1 of 12 validation questions: ``right`` of them right, from question ``shift`` on."""
    return {f"q{i}": float((i - shift) % 12 < right) for i in range(12)}


def _select(monkeypatch, run, scores: dict[bytes, dict[str, float]], **kw) -> dict:
    """select_weights with each model's per-question outcomes given (by its weights' bytes)."""
    init, run_dir = run

    def score(folder, *a, **k):
        per_question = scores[(folder / "model.safetensors").read_bytes()]
        return sum(per_question.values()) / len(per_question), per_question

    monkeypatch.setattr(select, "_score", score)
    questions = run_dir.parent / "val.jsonl"
    return select.select_weights(run_dir, init, 6, questions, 2, graph=None, agent=None, **kw)


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
    ("scores", "alpha", "chosen", "weights"),
    [
        # 10 of 12 better than a start that has none: p = 2 / 2^10; a tie goes to the later
        ({b"init": 0, b"two": 10, b"four": 10, b"last": 8}, 0.05, 4, b"four"),
        ({b"init": 9, b"two": 7, b"four": 7, b"last": 6}, 0.05, 0, b"init"),
        # one question more than the start is chance: the start stays, unless alpha is 1
        ({b"init": 6, b"two": 6, b"four": 5, b"last": 7}, 0.05, 0, b"init"),
        ({b"init": 6, b"two": 6, b"four": 5, b"last": 7}, 1.0, 6, b"last"),
        ({b"init": 6, b"two": 6, b"four": 6, b"last": 6}, 0.05, 0, b"init"),
    ],
)
def test_the_best_weights_are_kept_and_the_last_stay_on_disk(
    monkeypatch, run, scores, alpha, chosen, weights
):
    init, run_dir = run
    record = _select(monkeypatch, run, {k: _outcomes(v) for k, v in scores.items()}, alpha=alpha)
    assert record["chosen_step"] == chosen and record["evaluated"] == 2
    assert record["alpha"] == alpha
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


def test_the_sign_test_counts_questions_not_scores(monkeypatch, run):
    """Same Hits@1, different questions: 3 better and 3 worse is no gain (p 1); a checkpoint
    right on 8 where the start was right on 2 others is 8 better, 2 worse (p 0.109)."""
    record = _select(
        monkeypatch,
        run,
        {
            b"init": _outcomes(2),
            b"two": _outcomes(2, shift=3),  # none of the start's 2 and 2 others
            b"four": _outcomes(8, shift=2),
            b"last": _outcomes(2),
        },
    )
    two, four = record["scores"][1:3]
    assert (two["better"], two["worse"], two["sign_test_p"]) == (2, 2, 1.0)
    assert (four["better"], four["worse"]) == (8, 2)
    assert four["sign_test_p"] == pytest.approx(0.109375)
    assert record["chosen_step"] == 0  # the best is not beyond chance at 0.05


def test_a_candidate_without_whole_weights_is_refused(monkeypatch, run):
    init, run_dir = run
    (init / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="stage2"):
        _select(monkeypatch, run, {})
    assert (run_dir / "model.safetensors").read_bytes() == b"last"


def test_sft_checkpoints_are_candidates_and_the_saved_last_one_is_not_copied(monkeypatch, run):
    """Stage 2's run: the SFT trainer's ``checkpoint-N`` folders, the last of them saved by the
    trainer itself (it stays as it is); the run's own files stay out of checkpoints."""
    init = run[0]
    run_dir = _model(run[1].parent / "stage2-sft", b"last")
    (run_dir / "metrics.jsonl").write_text("{}\n")
    _model(run_dir / "checkpoints" / "checkpoint-3", b"three")
    saved_last = _model(run_dir / "checkpoints" / "checkpoint-6", b"last")
    assert select.candidates(run_dir, init, 6, "checkpoint-") == [
        (0, init),
        (3, run_dir / "checkpoints" / "checkpoint-3"),
        (6, run_dir),
    ]
    scores = {b"init": _outcomes(0), b"three": _outcomes(10), b"last": _outcomes(1)}
    record = _select(
        monkeypatch, (init, run_dir), scores, prefix="checkpoint-", run_files=("metrics.jsonl",)
    )
    assert record["chosen_step"] == 3
    assert (run_dir / "model.safetensors").read_bytes() == b"three"
    assert (saved_last / "model.safetensors").read_bytes() == b"last"
    assert sorted(p.name for p in saved_last.iterdir()) == ["config.json", "model.safetensors"]
    assert not (run_dir / "checkpoints" / "step-6").exists()
