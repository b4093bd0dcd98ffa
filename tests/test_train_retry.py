"""A failed training run does not block its fix (issue 41, item 8).

``kgsynth train stage1 … --lora-target nosuchmodule`` fails as training starts, before any
checkpoint, leaving its ``train_config.json``; the corrected command must then train rather
than be refused as "a run with different lora_target". A folder whose run saved a checkpoint
still refuses different options (it holds progress that only its own options resume)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgsynth.cli.train import train_app
from tests.test_sft import write_corpus

runner = CliRunner()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "accepted.parquet")


def lora_run(corpus: Path, out: Path, target: str) -> list[str]:
    """Two steps of LoRA on the tiny model: a few seconds on CPU."""
    return [
        "stage1", "--corpus", str(corpus), "--model", "tiny", "--out", str(out),
        "--max-steps", "2", "--batch-size", "4", "--micro-batch-size", "2",
        "--max-length", "512", "--tiny-vocab-size", "600",
        "--lora-r", "4", "--lora-target", target,
    ]  # fmt: skip


def one_line_error(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def test_a_run_that_failed_before_any_checkpoint_does_not_block_the_corrected_one(
    corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "s1"
    res = runner.invoke(train_app, lora_run(corpus, out, "nosuchmodule"))
    assert res.exit_code == 2, res.output
    assert "--lora-target" in one_line_error(res.output)
    assert not out.exists()  # the run made the folder and made no progress: nothing is left
    # a folder that was there before is kept, with the failed run's train_config.json
    out.mkdir()
    res = runner.invoke(train_app, lora_run(corpus, out, "nosuchmodule"))
    assert res.exit_code == 2, res.output
    assert (out / "train_config.json").is_file()

    # a checkpoint in the folder: its run is progress, so other options are still refused
    ckpt = out / "checkpoints" / "checkpoint-1"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    res = runner.invoke(train_app, lora_run(corpus, out, "q_proj,v_proj"))
    assert res.exit_code == 2, res.output
    assert "holds a run with different lora_target" in one_line_error(res.output)

    # without one there is nothing to resume: the corrected command trains
    (ckpt / "trainer_state.json").unlink()
    res = runner.invoke(train_app, lora_run(corpus, out, "q_proj,v_proj"))
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["steps"] == 2 and manifest["config"]["lora_target"] == "q_proj,v_proj"
    assert (out / "adapter_model.safetensors").is_file()
