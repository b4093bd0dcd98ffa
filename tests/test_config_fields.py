"""Flags made from config fields (kgsynth/cli/fields.py): names, help with the field's own
default, nested configs, aliases, YAML sections, and the one-line errors."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest
import typer
from typer.testing import CliRunner

from kgsynth.cli.fields import config_command
from kgsynth.core.config import build_config, field_help, flat_fields, option
from kgsynth.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Inner:
    max_turns: int = option(10, "Turn limit.")
    toolset: str = option("graphwalker", "Tool set.", aliases=("--tools",))


@dataclasses.dataclass(frozen=True)
class Outer:
    n: int = option(5, "How many.")
    rate: float = option(0.5, "A rate.")
    verbose: bool = option(False, "Say more.")
    names: tuple[str, ...] = option(("a", "b"), "Some names.")
    hidden: int = option(3, "Only YAML sets this.", cli=False)
    files: tuple[str, ...] = option((), "Repeatable.", multiple=True)
    agent: Inner = dataclasses.field(default_factory=lambda: Inner(max_turns=8))

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"--n must be >= 1 (got {self.n})")


def _app():
    app = typer.Typer()
    seen: dict = {}

    @app.command()
    @config_command(Outer, section="outer")
    def cmd(cfg: Outer, config: str | None = None) -> None:
        seen["cfg"] = cfg

    @app.command()
    def other() -> None:  # a second command keeps typer's sub-command mode
        pass

    return app, seen


def test_help_shows_each_fields_own_default_and_nested_options():
    app, _ = _app()
    text = CliRunner().invoke(app, ["cmd", "--help"], env={"COLUMNS": "200"}).output
    for flag, default in [
        ("--n", "5"),
        ("--rate", "0.5"),
        ("--max-turns", "8"),
        ("--toolset", "graphwalker"),
        ("--names", "a,b"),
    ]:
        line = next(ln for ln in text.splitlines() if re.search(f" {flag}[ ,]", ln))
        assert f"[default: {default}]" in line, line
    assert "--hidden" not in text
    assert "--section" in text and "[default: outer]" in text


def test_flags_yaml_sections_and_nesting(tmp_path):
    app, seen = _app()
    cfg_file = tmp_path / "recipe.yaml"
    cfg_file.write_text("outer:\n  n: 7\n  max_turns: 4\nother:\n  n: 9\n  hidden: 1\n")
    runner = CliRunner()
    res = runner.invoke(app, ["cmd", "--config", str(cfg_file), "--tools", "kgr1"])
    assert res.exit_code == 0, res.output
    assert seen["cfg"] == Outer(n=7, agent=Inner(max_turns=4, toolset="kgr1"))
    res = runner.invoke(app, ["cmd", "--config", str(cfg_file), "--section", "other", "--n", "2"])
    assert res.exit_code == 0, res.output
    assert seen["cfg"].n == 2 and seen["cfg"].hidden == 1 and seen["cfg"].agent.max_turns == 8
    res = runner.invoke(app, ["cmd", "--verbose", "--names", "x,y"])
    assert seen["cfg"].verbose is True and seen["cfg"].names == "x,y"
    assert seen["cfg"].files == ()
    res = runner.invoke(app, ["cmd", "--files", "a.txt", "--files", "b.txt"])
    assert res.exit_code == 0, res.output
    assert seen["cfg"].files == ("a.txt", "b.txt")


def test_errors_are_one_line_and_name_the_field(tmp_path):
    app, _ = _app()
    runner = CliRunner()
    res = runner.invoke(app, ["cmd", "--n", "0"])
    assert res.exit_code != 0 and "--n must be >= 1 (got 0)" in res.output
    cfg_file = tmp_path / "recipe.yaml"
    cfg_file.write_text("outer:\n  max_turns: many\n")
    res = runner.invoke(app, ["cmd", "--config", str(cfg_file)])
    assert res.exit_code != 0 and "max_turns must be an integer" in res.output
    res = runner.invoke(app, ["cmd", "--config", str(cfg_file), "--section", "nope"])
    assert res.exit_code != 0 and "has no section 'nope'" in res.output


def test_build_config_nests_and_keeps_the_nested_default():
    assert build_config(Outer, None, {}).agent == Inner(max_turns=8)
    assert build_config(Outer, None, {"toolset": "kgr1"}).agent == Inner(8, "kgr1")
    assert build_config(Outer, None, {}, base={"max_turns": 2}).agent.max_turns == 2
    with pytest.raises(ConfigError, match="preset sets unknown option 'nope'"):
        build_config(Outer, None, {}, base={"nope": 1})
    assert set(flat_fields(Outer)) == {
        "n",
        "rate",
        "verbose",
        "names",
        "hidden",
        "files",
        "max_turns",
        "toolset",
    }
    assert field_help(dataclasses.fields(Outer)[2]) == "Say more. \\[default: false]"


def test_an_older_name_still_works_in_yaml_and_presets(tmp_path):
    cfg_file = tmp_path / "recipe.yaml"
    cfg_file.write_text("outer:\n  tools: kgr1\n")
    assert build_config(Outer, cfg_file, {}, section="outer").agent.toolset == "kgr1"
    assert build_config(Outer, None, {}, base={"tools": "kgr1"}).agent.toolset == "kgr1"


RECIPE = """
steps: [{name: t, run: synthesize trajectories}]
agent:
  max_turns: 6
  relation_ranking: focus
trajectories:
  mode: oracle
  agent:
    system_prompt: short
    max_turns: 4
eval:
  limit: 3
rl:
  init: runs/x/stage2
filter:
  outcome: hit
"""


def test_a_recipe_level_agent_block_reaches_every_step_with_agent_settings(tmp_path):
    """The recipe's top-level agent: block is read by each section whose config has agent
    settings (each nests an AgentConfig); a section's own agent:
    mapping adds to it and wins; a config field that only shares a name with an agent setting
    (the filter's max_turns) is not touched."""
    from kgsynth.eval.config import EvalConfig
    from kgsynth.filter import FilterConfig
    from kgsynth.synthesize.trajectory_config import TrajectoryConfig
    from kgsynth.train.grpo_config import GRPOConfig

    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)
    traj = build_config(TrajectoryConfig, path, {}, section="trajectories")
    assert (traj.agent.max_turns, traj.agent.system_prompt) == (4, "short")
    assert traj.agent.relation_ranking == "focus" and traj.mode == "oracle"
    ev = build_config(EvalConfig, path, {}, section="eval")
    assert (ev.agent.max_turns, ev.agent.relation_ranking, ev.limit) == (6, "focus", 3)
    rl = build_config(GRPOConfig, path, {}, section="rl")
    assert (rl.agent.max_turns, rl.agent.relation_ranking) == (6, "focus")
    flt = build_config(FilterConfig, path, {}, section="filter")
    assert flt.max_turns is None and flt.outcome == "hit"
    # a flag wins over both
    assert build_config(EvalConfig, path, {"max_turns": 2}, section="eval").agent.max_turns == 2


def test_a_recipe_agent_block_with_an_unknown_setting_is_a_one_line_error(tmp_path):
    from kgsynth.cli.recipe import load_recipe

    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.replace("relation_ranking: focus", "relation_rankin: focus"))
    with pytest.raises(ConfigError, match="agent: unknown setting 'relation_rankin'"):
        load_recipe(path)


@pytest.mark.parametrize("stage", ["synthesize", "eval", "sft", "rl"])
def test_every_stage_that_runs_the_agent_nests_one_agent_config(stage):
    """Issue 45 item 3: the agent's settings are declared once (AgentConfig) and nested as
    ``agent`` in each stage config; no stage declares a copy of one under its own name."""
    from kgsynth.agent.config import AGENT_FIELDS, AgentConfig
    from kgsynth.eval.config import EvalConfig
    from kgsynth.synthesize.trajectory_config import TrajectoryConfig
    from kgsynth.train.grpo_config import GRPOConfig
    from kgsynth.train.sft_config import SFTConfig

    cls = {"synthesize": TrajectoryConfig, "eval": EvalConfig, "sft": SFTConfig,
           "rl": GRPOConfig}[stage]  # fmt: skip
    hints = typing.get_type_hints(cls)
    assert hints["agent"] is AgentConfig
    own = {f.name for f in dataclasses.fields(cls)}
    assert not own & set(AGENT_FIELDS), own & set(AGENT_FIELDS)
    assert {n for n, (owner, _, _) in flat_fields(cls).items() if owner} == set(AGENT_FIELDS)


def test_a_stage_config_round_trips_through_its_record_in_either_layout():
    """Spec and resume files record the nested agent's options among the stage's own (flat,
    as manifests always did); they read back to the same config, and so does the nested
    layout ``dataclasses.asdict`` writes. An unknown key is named."""
    from kgsynth.agent.config import AgentConfig
    from kgsynth.core.config import config_from_record, config_record
    from kgsynth.core.errors import ConfigError
    from kgsynth.train.grpo_config import GRPOConfig

    cfg = GRPOConfig(init="x", lr=0.5, agent=AgentConfig(toolset="kgr1", max_turns=3))
    record = config_record(cfg)
    assert record["toolset"] == "kgr1" and record["lr"] == 0.5 and "agent" not in record
    assert config_from_record(GRPOConfig, record) == cfg
    assert config_from_record(GRPOConfig, dataclasses.asdict(cfg)) == cfg
    assert GRPOConfig().agent.max_turn_tokens is None  # rl's recipe fills it
    with pytest.raises(ConfigError, match="max_turnz"):
        config_from_record(GRPOConfig, {**record, "max_turnz": 3})
