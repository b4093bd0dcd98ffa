"""A preset or flag that changes the tool set a model was trained with is refused unless
--allow-toolset-change (issue 44, item 4): ``train rl --preset kg-r1`` on a model that carries
graphwalker tools (its ``agent_config.json``) stops with one line naming both tool sets and
the flag; with the flag it goes on with one warning line; the model's own tool set says
nothing about tool sets. ``eval --toolset`` is held to the same rule.

The model is a tiny one built in the test; rl is run with --dry-run (the check comes before
any training), eval for real on one question of the movie fixture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgsynth.agent.carried import CarriedAgent, check_toolset_change, write_agent_file
from kgsynth.cli import app
from kgsynth.core.errors import ConfigError
from tests.kgfixtures import movie_ntriples

runner = CliRunner()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A tiny model that carries graphwalker tools, one question and the movie KG."""
    from kgsynth.train.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("guard")
    model = build_tiny_model(
        ["who directed Kismet? <answer>William Dieterle</answer>"] * 8,
        root / "model",
        vocab_size=300,
        max_position=256,
    )
    write_agent_file(model, {"toolset": "graphwalker", "max_turns": 2}, "a test")
    questions = root / "q.jsonl"
    questions.write_text(
        json.dumps(
            {
                "question": "who directed Kismet?",
                "topic_names": ["Kismet"],
                "answer_names": ["William Dieterle"],
            }
        )
        + "\n"
    )
    (root / "movie.nt").write_text(movie_ntriples())
    return {"root": root, "model": model, "questions": questions, "kg": root / "movie.nt"}


def _rl(made, *extra: str):
    return runner.invoke(
        app,
        ["train", "rl", "--init", str(made["model"]), "--questions", str(made["questions"]),
         "--out", str(made["root"] / "rl"), "--dry-run", *extra],
    )  # fmt: skip


def _lines(output: str, start: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith(start)]


def test_rl_preset_with_another_tool_set_is_refused_in_one_line(made):
    res = _rl(made, "--preset", "kg-r1")
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    (line,) = _lines(res.output, "error:")
    assert "toolset graphwalker" in line and "--preset kg-r1 sets toolset kgr1" in line
    assert "--allow-toolset-change" in line
    assert not _lines(res.output, "warning:")  # the refusal alone, not a warning before it


def test_rl_toolset_flag_is_refused_too_and_allowed_with_the_flag(made):
    res = _rl(made, "--toolset", "sexpr")
    assert res.exit_code == 2, res.output
    (line,) = _lines(res.output, "error:")
    assert "toolset graphwalker" in line and "toolset sexpr" in line

    res = _rl(made, "--preset", "kg-r1", "--allow-toolset-change")
    assert res.exit_code == 0, res.output
    (warning,) = _lines(res.output, "warning:")
    assert "toolset graphwalker" in warning and "toolset kgr1 (--preset kg-r1)" in warning
    config = json.loads(res.output[res.output.index("{") : res.output.rindex("}") + 1])["config"]
    assert config["toolset"] == "kgr1" and config["allow_toolset_change"] is True


def test_rl_preset_with_the_model_s_own_tool_set_says_nothing_of_tool_sets(made):
    res = _rl(made, "--preset", "graphwalker")
    assert res.exit_code == 0, res.output
    assert not _lines(res.output, "error:")
    assert all("toolset" not in ln for ln in _lines(res.output, "warning:"))
    # a preset of another tool set with the model's own named over it is no change either
    res = _rl(made, "--preset", "kg-r1", "--toolset", "graphwalker")
    assert res.exit_code == 0, res.output
    assert all("toolset" not in ln for ln in _lines(res.output, "warning:"))


def _eval(made, out: str, *extra: str):
    return runner.invoke(
        app,
        ["eval", "--model", str(made["model"]), "--kg", str(made["kg"]), "--questions",
         str(made["questions"]), "--out", str(made["root"] / out), "--max-turns", "1",
         "--max-turn-tokens", "4", *extra],
    )  # fmt: skip


def test_eval_with_another_tool_set_is_refused_unless_allowed(made):
    res = _eval(made, "refused", "--toolset", "kgr1")
    assert res.exit_code == 2, res.output
    (line,) = _lines(res.output, "error:")
    assert "toolset graphwalker" in line and "toolset kgr1" in line
    assert "--allow-toolset-change" in line
    assert not (made["root"] / "refused").exists()

    res = _eval(made, "allowed", "--toolset", "kgr1", "--allow-toolset-change")
    assert res.exit_code == 0, res.output
    (warning,) = _lines(res.output, "warning:")
    assert "toolset graphwalker" in warning and "--toolset kgr1" in warning
    manifest = json.loads((made["root"] / "allowed" / "manifest.json").read_text())
    assert manifest["config"]["toolset"] == "kgr1"

    res = _eval(made, "same")
    assert res.exit_code == 0, res.output
    assert all("toolset" not in ln for ln in _lines(res.output, "warning:"))


def test_the_check_itself():
    carried = CarriedAgent({"toolset": "graphwalker"}, "the model m")
    check_toolset_change(None, {"toolset": "kgr1"})  # a model that carries nothing
    check_toolset_change(carried, {})  # no tool set given
    check_toolset_change(carried, {"toolset": "graphwalker"})
    check_toolset_change(carried, {"toolset": "kgr1", "allow_toolset_change": True})
    with pytest.raises(ConfigError, match="the model m was trained with toolset graphwalker"):
        check_toolset_change(carried, {"toolset": "kgr1", "allow_toolset_change": False})
