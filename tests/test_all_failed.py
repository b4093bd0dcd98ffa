"""Failure is not reported as success (issue 41, item 7).

- A command whose every LLM request failed (an unreachable ``--base-url``) exits non-zero with
  one ``error:`` line saying so, at any ``--max-failed-fraction``; its outputs stay, for
  inspection: ``eval`` (every question failed: nothing scored), ``synthesize questions`` and
  ``synthesize trajectories --mode free``.
- A seed outside 0..2**31-1 is a config error naming ``--seed``, from a flag or a ``--config``
  file, not a run whose every request fails (or that fails deep inside numpy).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgsynth.cli import app
from tests.kgfixtures import build_pipeline_inputs
from tests.servers import free_port

runner = CliRunner()
QUESTIONS = [
    {"question": "who directed [Kismet]", "answer_names": ["William Dieterle"]},
    {"question": "which films did the director of [Juarez] make", "answer_names": ["Kismet"]},
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("all_failed")
    paths = build_pipeline_inputs(root, walks=2, structures="chain-1")
    qfile = root / "eval.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return {**paths, "eval_questions": qfile}


def closed_url(query: str = "") -> str:
    """An OpenAI-compatible base URL on a port nothing listens on."""
    return f"http://127.0.0.1:{free_port()}/v1{query}"


def llm_args(base_url: str) -> list[str]:
    return ["--llm", "openai", "--model", "m", "--api-key", "x", "--base-url", base_url,
            "--max-retries", "0", "--timeout", "5"]  # fmt: skip


def error_lines(output: str) -> list[str]:
    assert "Traceback" not in output, output
    return [line for line in output.splitlines() if line.startswith("error:")]


def test_eval_with_an_unreachable_server_fails_and_says_nothing_was_scored(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    base_url = closed_url("?key=URLSECRET123")
    args = ["eval", "--questions", str(inputs["eval_questions"]), "--kg", str(inputs["store"])]
    args += ["--out", str(out), "--runs", "2", "--temperature", "1", *llm_args(base_url)]
    res = runner.invoke(app, args)
    assert res.exit_code == 5, res.output
    [line] = error_lines(res.output)
    assert line.startswith("error: eval: all 2 questions failed in all 2 runs (LLM error at ")
    assert f"{base_url.split('?')[0]}?key=***: gave up after 1 attempts: connection error" in line
    assert "nothing scored" in line and "URLSECRET123" not in res.output
    assert "Hits@1" not in res.output  # no table of zeros that reads as answers
    # the outputs stay, for inspection
    assert (out / "predictions.parquet").is_file() and (out / "metrics.json").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["llm"]["m"]["stats"]["errors"] == 4
    assert "connection error" in manifest["llm"]["m"]["stats"]["first_error"]


def test_eval_names_a_baseline_that_failed_on_every_question(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    args = ["eval", "--questions", str(inputs["eval_questions"]), "--kg", str(inputs["store"])]
    args += ["--out", str(tmp_path / "e"), "--baseline", "no-tools", *llm_args(closed_url())]
    res = runner.invoke(app, args)
    assert res.exit_code == 5, res.output
    [line] = error_lines(res.output)
    assert "eval: all 2 questions failed (" in line
    assert "; the no-tools baseline: all 2 questions failed (" in line


def test_synthesize_questions_whose_every_request_failed_fails_at_any_fraction(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "q.parquet"
    args = ["synthesize", "questions", "--walks", str(inputs["walks"]), "--out", str(out)]
    args += ["--max-failed-fraction", "1", *llm_args(closed_url())]
    res = runner.invoke(app, args)
    assert res.exit_code == 5, res.output
    [line] = error_lines(res.output)
    assert "synthesize questions: all 2 of 2 LLM requests failed (LLM error at http://" in line
    assert out.is_file() and (tmp_path / "q.rejected.parquet").is_file()


def test_free_rollouts_whose_every_request_failed_fail(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "t.parquet"
    args = ["synthesize", "trajectories", "--questions", str(inputs["questions"])]
    args += ["--out", str(out), "--kg", str(inputs["store"]), "--mode", "free", "--limit", "2"]
    args += ["--max-failed-fraction", "1", *llm_args(closed_url())]
    res = runner.invoke(app, args)
    assert res.exit_code == 5, res.output
    [line] = error_lines(res.output)
    assert "synthesize trajectories: all 2 of 2 LLM requests failed" in line
    assert (tmp_path / "t.manifest.json").is_file()


def test_a_seed_out_of_range_is_a_config_error_naming_the_flag(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    args = ["eval", "--questions", str(inputs["eval_questions"]), "--kg", str(inputs["store"])]
    args += ["--out", str(tmp_path / "e"), *llm_args(closed_url())]
    for seed in ("-1", str(2**31)):
        res = runner.invoke(app, [*args, f"--seed={seed}"])
        assert res.exit_code == 2, res.output
        assert error_lines(res.output) == [
            f"error: --seed must be within [0, 2147483647] (got {seed})"
        ]
    huge = "99999999999999999999999"  # past int64: the type check names it first
    res = runner.invoke(app, [*args, f"--seed={huge}"])
    assert res.exit_code == 2, res.output
    [line] = error_lines(res.output)
    assert line.startswith("error: --seed must be") and line.endswith(f"(got {huge})")
    assert not (tmp_path / "e").exists()

    for seed in ("-1", str(2**31)):
        config = tmp_path / "walk.yaml"
        config.write_text(f"walk:\n  seed: {seed}\n")
        res = runner.invoke(
            app, ["walk", "--kg", str(inputs["store"]), "--out", str(tmp_path / "w.parquet"),
                  "--config", str(config)]
        )  # fmt: skip
        assert res.exit_code == 2, res.output
        assert error_lines(res.output) == [
            f"error: --config: {config}: seed must be within [0, 2147483647] (got {seed})"
        ]
