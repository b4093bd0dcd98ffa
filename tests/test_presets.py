"""`kgsynth train rl --preset`: each seed paper's RL recipe, pinned to the README's table and
to the values the papers (or their released scripts) state."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgsynth.agent.rewards import RewardSpec
from kgsynth.cli import app
from kgsynth.train.presets import RL_PRESETS, preset_table, preset_values

runner = CliRunner()
README = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"  # the preset table


def test_readme_table_is_the_code():
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- preset table:[^\n]*-->\n(.*?)\n<!-- end preset table -->", text, re.S)
    assert block, "README lost its preset table markers"
    assert block.group(1) == preset_table()


# values read from each paper (or, where it states none, the authors' training script)
PAPER = {
    "graphwalker": {"reward": "graphwalker", "kl_coef": 0.001, "clip_high": 0.28,
                    "group_size": 8, "questions_per_step": 16, "lr": 1e-6, "max_turns": 10},
    "kbqa-r1": {"reward": "kbqa-r1", "scale_rewards": False, "warmup_ratio": 0.3,
                "group_size": 5, "questions_per_step": 256, "kl_coef": 0.001, "top_p": 0.99,
                "toolset": "sexpr", "gate_high": 0.95, "gate_low": 0.3},
    "knowcoder-a1": {"reward": "knowcoder-a1", "fbeta_switch_reward": 0.5,
                     "turn_advantage": False},
    "kg-r1": {"reward": "kg-r1", "turn_advantage": True, "toolset": "kgr1", "kl_coef": 0.01,
              "group_size": 16, "questions_per_step": 128, "max_turns": 5, "lr": 1e-6,
              "warmup_ratio": 0.0, "max_steps": 400},
    "isp": {"reward": "isp", "turn_advantage": True, "kl_coef": 0.0, "clip_high": 0.24,
            "group_size": 6, "max_turns": 6, "lr": 5e-7},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RL_PRESETS))
def test_preset_values_are_the_papers(name):
    values = preset_values(name)
    for field, expected in PAPER[name].items():
        assert values[field] == expected, (name, field)
    assert all(s.source for s in RL_PRESETS[name].values())


def test_reward_presets_are_the_papers_weights():
    assert RewardSpec.parse("kg-r1").weights == (("f1", 1.0), ("retrieval", 1.0), ("turn", 1.0))
    assert RewardSpec.parse("isp").weights == (("f1", 0.6), ("distance", 0.3), ("format", 0.1))
    kbqa = RewardSpec.parse("kbqa-r1")
    assert kbqa.weights == (("f1", 1.0), ("format", 0.1)) and kbqa.gate_format


def _dry_run(tmp_path, *args):
    init = tmp_path / "init"
    init.mkdir(exist_ok=True)
    (init / "config.json").write_text("{}")
    q = tmp_path / "q.jsonl"
    q.write_text('{"question": "q", "topic_names": ["A"], "answer_names": ["B"]}\n')
    res = runner.invoke(
        app,
        ["train", "rl", "--questions", str(q), "--init", str(init), "--out",
         str(tmp_path / "rl"), "--dry-run", *args],
    )  # fmt: skip
    return res


@pytest.mark.parametrize("name", sorted(RL_PRESETS))
def test_cli_preset_fills_the_config(tmp_path, name):
    res = _dry_run(tmp_path, "--preset", name)
    assert res.exit_code == 0, res.output
    cfg = json.loads(res.output)["config"]
    assert cfg["preset"] == name
    for field, value in preset_values(name).items():
        assert cfg[field] == value, (name, field)


def test_flags_and_config_override_the_preset(tmp_path):
    res = _dry_run(tmp_path, "--preset", "kg-r1", "--lr", "2e-4", "--group-size", "4",
                   "--no-turn-advantage")  # fmt: skip
    cfg = json.loads(res.output)["config"]
    assert (cfg["lr"], cfg["group_size"], cfg["turn_advantage"]) == (2e-4, 4, False)
    assert cfg["kl_coef"] == 0.01 and cfg["toolset"] == "kgr1"  # the rest stays the paper's
    yaml = tmp_path / "rl.yaml"
    yaml.write_text("rl:\n  preset: kbqa-r1\n  questions_per_step: 3\n")
    res = _dry_run(tmp_path, "--config", str(yaml))
    cfg = json.loads(res.output)["config"]
    assert cfg["preset"] == "kbqa-r1" and cfg["scale_rewards"] is False
    assert cfg["questions_per_step"] == 3 and cfg["warmup_ratio"] == 0.3
    # without a preset nothing changes: the recipe's defaults
    cfg = json.loads(_dry_run(tmp_path).output)["config"]
    assert cfg["preset"] is None and cfg["turn_advantage"] is False and cfg["kl_coef"] == 0.001


def test_unknown_preset_is_one_clear_line(tmp_path):
    res = _dry_run(tmp_path, "--preset", "kg-r2")
    assert res.exit_code != 0
    assert "unknown preset 'kg-r2'" in res.output and "kbqa-r1" in res.output
