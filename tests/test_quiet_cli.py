"""A quiet CLI (issue 44, item 5): no third-party warnings, logs or progress bars unless ``-v``,
in kgsynth's process and in the processes it starts.

The end-to-end tests run ``kgsynth train stage1`` (a tiny model, two steps) and a LoRA run on
it as real processes and read everything they printed."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import polars as pl
import pytest

from kgsynth.core import quiet

ROOT = Path(__file__).resolve().parents[1]
KGSYNTH = [sys.executable, "-c", "from kgsynth.cli import app; app()"]
TQDM_BAR = re.compile(r"\d+%\|[^|]*\|")  # tqdm's "50%|█████     |"


def clean_env() -> dict[str, str]:
    """This process's environment without what an earlier quiet or -v call here put in it."""
    env = {k: v for k, v in os.environ.items() if k not in quiet.QUIET_ENVIRONMENT}
    env.pop(quiet.VERBOSE_ENV, None)
    return {**env, "OMP_NUM_THREADS": "1"}


@pytest.fixture
def restore_logging():
    """configure_output changes loggers and the environment of this process: put them back."""
    names = (*quiet.THIRD_PARTY_LOGGERS, quiet.DEEPSPEED_LOGGER)
    levels = {n: logging.getLogger(n).level for n in names}
    filters = {n: list(logging.getLogger(n).filters) for n in names}
    env = dict(os.environ)
    with warnings.catch_warnings():
        yield
    for n in names:
        logging.getLogger(n).setLevel(levels[n])
        logging.getLogger(n).filters[:] = filters[n]
    os.environ.clear()
    os.environ.update(env)


def test_quiet_then_verbose_in_one_process(
    restore_logging, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quiet, "_SET_HERE", set())  # as if no command had run in this process
    for key in (*quiet.QUIET_ENVIRONMENT, quiet.VERBOSE_ENV):
        os.environ.pop(key, None)
    os.environ["TRANSFORMERS_VERBOSITY"] = "info"  # a value the user set wins
    quiet.configure_output(False)
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"
    assert quiet.VERBOSE_ENV not in os.environ
    assert logging.getLogger("transformers").level == logging.ERROR
    deepspeed = logging.getLogger(quiet.DEEPSPEED_LOGGER)
    warning = logging.LogRecord("DeepSpeed", logging.WARNING, "x.py", 1, "Setting", (), None)
    error = logging.LogRecord("DeepSpeed", logging.ERROR, "x.py", 1, "failed", (), None)
    assert not deepspeed.filter(warning) and deepspeed.filter(error)
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn_explicit("theirs", FutureWarning, "m.py", 1, module="transformers.x")
        warnings.warn_explicit("ours", FutureWarning, "m.py", 2, module="kgsynth.train.lora")
    assert [str(w.message) for w in seen] == ["ours"]

    quiet.configure_output(True)  # -v after a quiet call: everything shows again
    assert os.environ[quiet.VERBOSE_ENV] == "1"  # for the processes it starts
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ  # set by the quiet call: gone
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"
    # its warnings show: NOTSET, or transformers' own default (WARNING) once it is imported
    assert logging.getLogger("transformers").level in (logging.NOTSET, logging.WARNING)
    assert deepspeed.filter(warning)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn_explicit("theirs", FutureWarning, "m.py", 3, module="transformers.x")
    assert [str(w.message) for w in seen] == ["theirs"]


def test_a_deepspeed_launch_is_told_its_accelerator_and_log_level(
    restore_logging, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kgsynth.train.launch import launch_environment, quiet_command

    monkeypatch.setattr(quiet, "_FROM_PARENT", False)
    os.environ.pop("DS_ACCELERATOR", None)
    ds = ["/venv/bin/deepspeed", "--num_gpus", "2", "--module", "kgsynth.train.launch", "spec"]
    env = launch_environment(ds)
    from deepspeed.accelerator import get_accelerator

    assert env["DS_ACCELERATOR"] == get_accelerator().device_name()
    assert quiet_command(ds)[:3] == ["/venv/bin/deepspeed", "--log_level", "error"]
    assert "DS_ACCELERATOR" not in launch_environment(["/venv/bin/torchrun", "-m", "x"])
    monkeypatch.setattr(quiet, "_FROM_PARENT", True)  # a worker of `kgsynth -v`
    assert quiet_command(ds) == ds and "DS_ACCELERATOR" not in launch_environment(ds)


def corpus(root: Path) -> Path:
    from kgsynth.agent.loop import system_prompt, user_prompt

    rows = []
    for movie in ("Kismet", "Juarez", "Jezebel", "Casablanca"):
        call = f'get_triples("{movie}", ["directed_by"])'
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": system_prompt("graphwalker", 2)},
                    {"role": "user", "content": user_prompt(f"who directed {movie}?", [movie])},
                    {
                        "role": "assistant",
                        "content": f"<think>Look.</think><kg-query>{call}</kg-query>",
                    },
                    {"role": "tool", "content": "<information>(x, directed_by, y)</information>"},
                    {"role": "assistant", "content": '<think>Found.</think><answer>["y"]</answer>'},
                ]
            }
        )
    pl.DataFrame(rows).write_parquet(root / "corpus.parquet")
    return root / "corpus.parquet"


def stage1(data: Path, out: Path, *extra: str, verbose: bool = False) -> str:
    """Run ``kgsynth [-v] train stage1`` as a process; all it printed (stdout and stderr)."""
    args = [*KGSYNTH, *(["-v"] if verbose else []), "train", "stage1", "--corpus", str(data)]
    args += ["--out", str(out), "--max-steps", "2", "--batch-size", "2", "--max-length", "4096"]
    args += ["--no-packing", *extra]
    done = subprocess.run(
        args, capture_output=True, text=True, env=clean_env(), cwd=ROOT, timeout=300
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed
    return printed


def test_training_prints_no_library_chatter_unless_verbose(tmp_path: Path) -> None:
    """stage 1 of a tiny model, then LoRA on it: DeepSpeed's "Setting accelerator to CPU"
    (printed on stdout at import), transformers' "Writing model shards" bar and the
    FutureWarning a LoRA run raises are gone; kgsynth's summary stays. With -v they show."""
    data = corpus(tmp_path)
    base = tmp_path / "sft"
    lora = ("--model", str(base), "--lora-r", "2", "--lora-alpha", "4")
    lora += ("--lora-target", "q_proj,v_proj")
    for printed in (
        stage1(data, base, "--model", "tiny", "--tiny-vocab-size", "400"),
        stage1(data, tmp_path / "lora", *lora),
    ):
        assert "stage1: 2 steps" in printed
        assert "Setting accelerator" not in printed and "FutureWarning" not in printed
        assert not TQDM_BAR.search(printed), printed
        assert "Writing model shards" not in printed
    assert json.loads((tmp_path / "lora" / "adapter_config.json").read_text())["r"] == 2

    printed = stage1(data, tmp_path / "lora_v", *lora, verbose=True)
    assert "Setting accelerator to CPU" in printed or "Setting ds_accelerator" in printed
    assert "FutureWarning" in printed


def test_a_launched_sft_run_prints_a_line_per_tenth_instead_of_a_bar(capsys):
    from kgsynth.train.launch import tenths_progress

    progress = tenths_progress()
    for step in range(1, 21):
        progress(step, 20, {"loss": 5.0 - step / 10} if step % 3 == 0 else {})
    progress(20, 20, {"train_loss": 4.0})  # the run's end logs the last step again
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(",")[0] for ln in lines] == [f"step {2 * k}/20" for k in range(1, 11)]
    assert lines[0] == "step 2/20" and lines[-1] == "step 20/20, loss 3.2000"
