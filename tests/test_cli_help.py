"""``--help`` a person can read (kgsynth/cli/panels.py): every option in a named panel, the
common ones in ``--help`` (at most 120 lines at 100 columns), every one in ``--help-all``, and
an advanced option working as any other when given."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from kgsynth.cli import app
from kgsynth.cli.panels import PANELS

runner = CliRunner()
WIDE = {"COLUMNS": "100"}
# the commands a researcher reads most; each had 80 to 420 lines of --help before the panels
TARGETS = [
    ["train", "rl"],
    ["train", "stage1"],
    ["train", "stage2"],
    ["synthesize", "trajectories"],
    ["eval"],
    ["walk"],
]


def _help(command: list[str], flag: str = "--help") -> str:
    res = runner.invoke(app, [*command, flag], env=WIDE)
    assert res.exit_code == 0, res.output
    return res.output


def _commands(group=None, path=()):
    """Every leaf command of ``kgsynth``: (its words, the click command)."""
    group = group or typer.main.get_command(app)
    ctx = typer.Context(group)
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        if hasattr(sub, "list_commands"):
            yield from _commands(sub, (*path, name))
        else:
            yield [*path, name], sub


@pytest.mark.parametrize("command", TARGETS, ids=" ".join)
def test_help_fits_in_120_lines_and_points_to_help_all(command):
    text = _help(command)
    assert len(text.splitlines()) <= 120, f"{' '.join(command)} --help: {len(text.splitlines())}"
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert "advanced" in last and "--help-all shows every option" in last, last
    assert len(_help(command, "--help-all").splitlines()) > len(text.splitlines())


def test_every_option_of_every_command_is_in_a_known_panel():
    seen = set()
    for words, command in _commands():
        options = [p for p in command.params if p.param_type_name == "option"]
        names = [o for p in options for o in p.opts]
        assert "--help-all" in names, words
        for param in options:
            panel = getattr(param, "rich_help_panel", None)
            assert panel in PANELS, (words, param.opts, panel)
            seen.add(panel)
    assert {"Inputs", "Agent", "Model", "Optimization", "Launch", "Output"} <= seen


def test_help_all_shows_the_advanced_options_that_help_leaves_out():
    short, full = _help(["train", "rl"]), _help(["train", "rl"], "--help-all")
    for flag in ("--clip-high", "--relation-ranking", "--master-port", "--lora-r"):
        assert flag not in short and flag in full, flag
    for flag in ("--questions", "--init", "--lr", "--max-steps", "--tools", "--nproc-per-node"):
        assert flag in short and flag in full, flag
    assert "--help-all shows every option" not in full
    # the advanced options are hidden again afterwards (the same command object serves both)
    assert _help(["train", "rl"]) == short


def test_panels_come_in_their_order():
    text = _help(["train", "rl"], "--help-all")
    titles = [line.split("─ ")[1].split(" ─")[0] for line in text.splitlines() if "╭─ " in line]
    assert titles == sorted(titles, key=PANELS.index), titles
    assert titles[0] == "Inputs" and titles[-1] == "Help"


def test_an_advanced_option_still_takes_effect(tmp_path):
    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text("{}")
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "q", "topic_names": ["A"], "answer_names": ["B"]}\n')
    args = ["train", "rl", "--questions", str(questions), "--init", str(init)]
    args += ["--out", str(tmp_path / "rl"), "--dry-run"]
    res = runner.invoke(app, [*args, "--clip-high", "0.31", "--relation-ranking", "focus"])
    assert res.exit_code == 0, res.output
    cfg = json.loads(res.output)["config"]
    assert cfg["clip_high"] == 0.31 and cfg["relation_ranking"] == "focus"
    res = runner.invoke(app, args)
    cfg = json.loads(res.output)["config"]
    assert cfg["clip_high"] == 0.28 and cfg["relation_ranking"] == "bm25"
