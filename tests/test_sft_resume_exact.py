"""Resuming SFT from any checkpoint, mid-epoch included, ends in the weights of an uninterrupted
run, byte for byte (issue 41, item 3).

A re-run of the same ``kgsynth train`` command resumes from the newest complete checkpoint in
``OUT/checkpoints`` (:func:`kgsynth.train.sft_run.last_complete_checkpoint`); here a callback
stops the run right after a checkpoint, as a kill there would, and the same spec is trained
again. 24 trajectories in batches of 4 make 6 steps an epoch, so the stops below land inside
epochs 0, 1 and 2, where the order of the rows must be the one the uninterrupted run drew."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kgsynth.train.sft import SFTConfig, prepare_run, read_metrics, train_sft
from tests.test_sft import write_corpus

STEPS_PER_EPOCH = 6  # 24 trajectories, batch 4


class Stop(Exception):
    """Raised where a kill would land: after checkpoint ``at``, before the next step."""


def _stop_at(step: int):
    from transformers import TrainerCallback

    class StopAt(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise Stop

    return StopAt()


def _digest(run: Path) -> str:
    return hashlib.sha256((run / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "accepted.parquet")


def _config(micro_batch_size: int, max_steps: int, logging_steps: int = 1) -> SFTConfig:
    return SFTConfig(
        model="tiny",
        tiny_vocab_size=600,
        max_length=512,
        batch_size=4,
        micro_batch_size=micro_batch_size,
        max_steps=max_steps,
        save_steps=1,  # a checkpoint every step: a kill can land after any of them
        logging_steps=logging_steps,
        warmup_ratio=0.0,
    )


def _stopped_and_resumed(cfg: SFTConfig, corpus: Path, out: Path, stops: list[int]) -> dict:
    """Train ``cfg`` into ``out``, stopping after each checkpoint in ``stops`` and training the
    same spec again each time; the summary of the run that finished."""
    for step in stops:
        with pytest.raises(Stop):
            train_sft(prepare_run(cfg, "stage1", corpus, out), callbacks=[_stop_at(step)])
    return train_sft(prepare_run(cfg, "stage1", corpus, out))


# micro-batch 2: two micro-batches a step (gradient accumulation); 4: one
@pytest.mark.parametrize("micro_batch_size", [2, 4])
def test_resume_from_mid_epoch_checkpoints_gives_the_uninterrupted_weights(
    corpus: Path, tmp_path: Path, micro_batch_size: int
) -> None:
    cfg = _config(micro_batch_size, max_steps=14)
    straight = train_sft(prepare_run(cfg, "stage1", corpus, tmp_path / "straight"))
    # inside epoch 0, inside epoch 1 (twice in a row), inside epoch 2
    stops = [3, 8, 9, 13]
    assert all(s % STEPS_PER_EPOCH for s in stops)
    resumed = _stopped_and_resumed(cfg, corpus, tmp_path / "resumed", stops)

    assert resumed["resumed_from_step"] == 13 and resumed["steps"] == straight["steps"] == 14
    assert resumed["gradient_accumulation_steps"] == 4 // micro_batch_size
    assert _digest(tmp_path / "resumed") == _digest(tmp_path / "straight")
    # the same batches in the same order: every step's loss is the uninterrupted run's
    a = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    b = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert [m["step"] for m in b] == [m["step"] for m in a] == list(range(1, 15))
    assert [m["loss"] for m in b] == [m["loss"] for m in a]
    assert [m["tokens"] for m in b] == [m["tokens"] for m in a]


def test_resume_between_logs_keeps_the_token_counts(corpus: Path, tmp_path: Path) -> None:
    """Tokens trained on since the last metrics line, up to the checkpoint, are not lost: the
    run's totals are kept in the checkpoint, not read back from ``metrics.jsonl``."""
    cfg = _config(2, max_steps=5, logging_steps=4)  # logs at steps 1, 4 and 5 (the last)
    straight = train_sft(prepare_run(cfg, "stage1", corpus, tmp_path / "straight"))
    resumed = _stopped_and_resumed(cfg, corpus, tmp_path / "resumed", [3])

    assert resumed["resumed_from_step"] == 3
    assert resumed["tokens_trained"] == straight["tokens_trained"] > 0
    assert resumed["loss_tokens_trained"] == straight["loss_tokens_trained"] > 0
    last = read_metrics(tmp_path / "resumed" / "metrics.jsonl")[-1]
    assert last["tokens"] == straight["tokens_trained"]
    state = json.loads(
        (tmp_path / "resumed" / "checkpoints" / "checkpoint-5" / "kgsynth_state.json").read_text()
    )
    assert state["tokens_seen"] == straight["tokens_trained"]


def test_a_run_stopped_after_its_last_checkpoint_takes_no_further_step(
    corpus: Path, tmp_path: Path
) -> None:
    """Killed after its last checkpoint (saving the final model, or in stage 2's selection of
    a checkpoint), a run resumes from that checkpoint and has nothing left to train. Its last
    step, 8, is inside the second epoch, where transformers' loop would take a 9th step; with a
    constant learning rate that step changes the weights too."""
    import dataclasses

    from transformers import TrainerCallback

    class StopAfterLastSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == state.max_steps:
                raise Stop

    cfg = dataclasses.replace(_config(2, max_steps=8), lr_scheduler="constant_with_warmup")
    straight = train_sft(prepare_run(cfg, "stage1", corpus, tmp_path / "straight"))
    out = tmp_path / "resumed"
    with pytest.raises(Stop):
        train_sft(prepare_run(cfg, "stage1", corpus, out), callbacks=[StopAfterLastSave()])
    assert not (out / "model.safetensors").exists()
    resumed = train_sft(prepare_run(cfg, "stage1", corpus, out))

    assert resumed["resumed_from_step"] == 8 and resumed["steps"] == straight["steps"] == 8
    assert not (out / "checkpoints" / "checkpoint-9").exists()
    assert read_metrics(out / "metrics.jsonl")[-1]["step"] == 8
    assert resumed["tokens_trained"] == straight["tokens_trained"]
    assert _digest(out) == _digest(tmp_path / "straight")


def test_a_checkpoint_whose_trainer_state_a_kill_left_empty_is_passed_over(tmp_path: Path) -> None:
    """The Trainer writes ``trainer_state.json`` in place, last: a kill between its creation and
    its write leaves it empty, and resuming from that checkpoint would fail to read it."""
    from kgsynth.train.sft_run import last_complete_checkpoint

    ckpts = tmp_path / "checkpoints"
    for step, state in ((7, '{"global_step": 7}'), (8, "")):
        folder = ckpts / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text(state)
    assert last_complete_checkpoint(ckpts) == str(ckpts / "checkpoint-7")


@pytest.mark.slow  # three torchrun launches, ~20 s each
def test_two_processes_resumed_inside_a_later_epoch_give_the_uninterrupted_weights(
    corpus: Path, tmp_path: Path
) -> None:
    """Data-parallel: accelerate's skip of a resumed epoch's first batches wraps each
    process's shard of the batches, and ``set_epoch`` does not reach the sampler through
    it; the trainer's epoch callback tells it. A constant learning rate lets a run stopped at
    ``max_steps`` 8 be the same run as one of 10 up to there (``max_steps`` may change on
    resume), so the launcher needs no kill: its re-run resumes from checkpoint 8, inside the
    second epoch (2 processes of micro-batch 1, 2 micro-batches a step: 6 steps an epoch)."""
    import dataclasses

    from kgsynth.train.launch import LaunchConfig, launch_command, run_launched
    from kgsynth.train.sft import SUMMARY
    from kgsynth.train.sft_config import SPEC
    from tests.test_sft import _free_port

    base = dataclasses.replace(
        _config(1, max_steps=10), lr_scheduler="constant_with_warmup", precision="fp32"
    )

    def launched(max_steps: int, out: Path) -> dict:
        spec = prepare_run(dataclasses.replace(base, max_steps=max_steps), "stage1", corpus, out)
        launch = LaunchConfig(nproc_per_node=2, master_port=_free_port())
        summary = run_launched(launch_command(out / SPEC, launch, "torchrun"), out / SUMMARY)
        assert summary is not None and spec.out == str(out)
        return summary

    straight = launched(10, tmp_path / "straight")
    assert straight["world_size"] == 2 and straight["gradient_accumulation_steps"] == 2
    launched(8, tmp_path / "resumed")
    resumed = launched(10, tmp_path / "resumed")

    assert resumed["resumed_from_step"] == 8 and resumed["steps"] == 10
    assert _digest(tmp_path / "resumed") == _digest(tmp_path / "straight")
