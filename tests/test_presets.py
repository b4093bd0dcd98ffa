"""`kgsynth train rl --preset`: each seed paper's RL recipe, pinned to docs/recipes.md's table
and to the papers' text: every cited figure is read from ../shared/papers/<paper>.txt at the
cited heading (skipped where that folder is missing), so a wrong value or a wrong citation
fails."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgsynth.agent.rewards import RewardSpec
from kgsynth.cli import app
from kgsynth.train.presets import (
    RL_PRESET_AGENT,
    RL_PRESETS,
    preset_agent_values,
    preset_table,
    preset_values,
)

runner = CliRunner()
README = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"  # the preset table


def test_readme_table_is_the_code():
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- preset table:[^\n]*-->\n(.*?)\n<!-- end preset table -->", text, re.S)
    assert block, "README lost its preset table markers"
    assert block.group(1) == preset_table()


# The papers' text (../shared/papers beside the checkout); nothing reads it at run time
PAPERS = Path(__file__).resolve().parents[2] / "shared" / "papers"
needs_papers = pytest.mark.skipif(
    not (PAPERS / "README.md").is_file(), reason=f"the papers' text is not at {PAPERS}"
)
# a section or appendix heading as the five texts print them: "2.3 GraphWalker Training",
# "Appendix G ...", "D.4 RL ...", "C Experiments", "IV-C2 Policy ..."
HEADING = re.compile(
    r"^(Appendix [A-Z] |\d+(\.\d+)* [A-Z]|[A-Z](\.\d+)+ [A-Z]|[A-Z] [A-Z]|[IVX]+-[A-Z]\d* [A-Z])"
)
SCIENTIFIC = re.compile(r"(\d+(?:\.\d+)?)\s*(?:×|\\times)\s*10\^\{?(-?\d+)\}?")
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?(%?)")
WORDS = {"single": 1.0}


def _squash(text: str) -> str:
    return " ".join(text.split())


def place_text(paper: str, place: str) -> str:
    """The lines of ``paper`` from the heading ``place`` to the next heading."""
    lines = (PAPERS / paper).read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == place]
    assert len(starts) == 1, f"{paper}: heading {place!r} found {len(starts)} times"
    end = next(
        (j for j in range(starts[0] + 1, len(lines))
         if len(lines[j]) < 100 and HEADING.match(lines[j])),
        len(lines),
    )  # fmt: skip
    return "\n".join(lines[starts[0] : end])


def numbers(text: str) -> list[float]:
    """The figures ``text`` writes: 1e-6, 1×10^{-6}, 30% (as 0.3 and 30), 0.28, single (1)."""
    found = [float(a) * 10 ** int(b) for a, b in SCIENTIFIC.findall(text)]
    rest = SCIENTIFIC.sub(" ", text)
    for m in NUMBER.finditer(rest):
        value = float(m.group(0).rstrip("%"))
        found += [value, value / 100] if m.group(1) else [value]
    return found + [v for w, v in WORDS.items() if re.search(rf"\b{w}\b", text)]


def evaluate(reading: str) -> float:
    """``reading``: arithmetic over numbers (``512 / 8``), nothing else."""
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv}  # fmt: skip

    def walk(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"reading {reading!r}: only numbers and + - * /")

    return walk(ast.parse(reading, mode="eval").body)


def check_setting(field: str, s) -> None:
    """The setting's quotes stand at its cited place and its value is their figure (or the
    figure its reading makes of them); an uncited one says why the text gives none."""
    if s.cite is None:
        assert s.why and "not stated" in s.source, field
        return
    span = _squash(place_text(s.cite.paper, s.cite.place))
    for quote in s.cite.quotes:
        assert _squash(quote) in span, (field, s.cite.place, quote)
    if isinstance(s.value, bool) or not isinstance(s.value, int | float):
        assert not s.cite.reading, field
        return
    figures = [v for q in s.cite.quotes for v in numbers(q)]
    if s.cite.reading:
        used = [v for v in numbers(s.cite.reading) if v != 0]
        assert all(any(math.isclose(u, f) for f in figures) for u in used), (field, used)
        figures = [evaluate(s.cite.reading)]
    assert any(math.isclose(float(s.value), f, rel_tol=1e-9) for f in figures), (
        field, s.value, figures,
    )  # fmt: skip


@needs_papers
@pytest.mark.parametrize("name", sorted(RL_PRESETS))
def test_preset_values_are_the_papers_text(name):
    for field, setting in RL_PRESETS[name].items():
        check_setting(field, setting)


@needs_papers
@pytest.mark.parametrize("name", sorted(RL_PRESET_AGENT))
def test_preset_agent_settings_are_the_papers_text(name):
    for field, setting in RL_PRESET_AGENT[name].items():
        check_setting(field, setting)


def test_a_preset_gives_the_agent_settings_its_init_does_not_carry(tmp_path):
    """KG-R1 starts RL from the base model (no agent_config.json): the preset's 2-hop
    subgraph applies; a model trained with another value keeps its own, and the command
    says so in one line."""
    from kgsynth.agent.carried import write_agent_file
    from kgsynth.agent.config import AgentConfig

    base, trained = tmp_path / "base", tmp_path / "trained"
    for folder in (base, trained):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    write_agent_file(trained, AgentConfig(toolset="kgr1", kgr1_subgraph_hops=3))
    assert preset_agent_values("kg-r1") == {"kgr1_subgraph_hops": 2}

    def hops(*args, init):
        res = _dry_run(tmp_path, *args, init=init)
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["config"]["kgr1_subgraph_hops"], res.output

    assert hops("--preset", "kg-r1", init=base)[0] == 2
    assert hops(init=base)[0] is None  # no preset: none
    assert hops("--preset", "kg-r1", "--kgr1-subgraph-hops", "1", init=base)[0] == 1
    held, output = hops("--preset", "kg-r1", init=trained)
    assert held == 3
    assert "carries kgr1_subgraph_hops 3; --preset kg-r1's 2 is not applied" in output
    assert "not applied" not in _dry_run(tmp_path, "--preset", "kg-r1", init=base).output
    assert "graphwalker_observations" in preset_table()


@needs_papers
def test_the_check_catches_a_wrong_value_or_a_wrong_place():
    from dataclasses import replace

    good = RL_PRESETS["kbqa-r1"]["ppo_mini_batch"]
    check_setting("ppo_mini_batch", good)
    for bad in (
        replace(good, value=64),  # not the quoted 128
        replace(good, cite=replace(good.cite, place="IV-C2 Policy Optimization (GRPO)")),
        replace(good, cite=replace(good.cite, quotes=("PPO mini-batch size 64",))),
        replace(RL_PRESETS["graphwalker"]["ppo_mini_batch"], value=512),  # the reading: 512/8
    ):
        with pytest.raises(AssertionError):
            check_setting("ppo_mini_batch", bad)
    assert numbers(r"rate 1\times 10^{-6} and 30% warm-up, Top-20") == [1e-6, 30, 0.3, 20]


def test_every_preset_field_is_an_rl_option():
    from kgsynth.core.config import flat_fields
    from kgsynth.train.grpo_config import GRPOConfig

    names = set(flat_fields(GRPOConfig))  # the nested agent's options by their own names
    for name, settings in RL_PRESETS.items():
        assert set(settings) <= names, (name, set(settings) - names)


@needs_papers
def test_reward_presets_are_the_papers_weights():
    kbqa = RewardSpec.parse("kbqa-r1")
    setup = place_text("kbqa-r1.txt", "V-A4 Training Setup")
    assert "λoutcome=1.0" in setup and "λformat=0.1" in setup
    assert kbqa.weights == (("f1", 1.0), ("format", 0.1)) and kbqa.gate_format
    table8 = place_text("kg-r1.txt", "D.3 REWARD WEIGHTS")
    row = {ln.split("\t")[1]: float(ln.split("\t")[-1]) for ln in table8.splitlines()
           if ln.startswith("w_{")}  # fmt: skip
    kgr1 = dict(RewardSpec.parse("kg-r1").weights)
    assert (kgr1["f1"], kgr1["retrieval"]) == (
        row["Final-answer weight"], row["Retrieval-coverage weight"],
    )  # fmt: skip
    # the turn reward is 0.5 format + 0.5 KG query (weighted 1 here; Table 8: 0.5 each)
    assert row["Format weight"] == row["KG-query weight"] == 0.5 and kgr1["turn"] == 1.0
    # ISP-KGR §5.1: w1 format, w2 progress (kgsynth's distance), w3 outcome (F1); the reward
    # preset `isp` keeps the authors' code's weights, a variant
    setup = place_text("isp-kgr.txt", "5.1 Experimental Setup")
    assert "$w_1 = 0.1$, $w_2 = 0.6$, and $w_3 = 0.3$" in setup
    isp = dict(RewardSpec.parse(preset_values("isp")["reward"]).weights)
    assert (isp["format"], isp["distance"], isp["f1"]) == (0.1, 0.6, 0.3)


def _dry_run(tmp_path, *args, init=None):
    if init is None:
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
