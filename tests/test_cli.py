"""The CLI as a user runs it: import, stats, tool, query; one-line errors with exit codes."""

import json

import pytest
from typer.testing import CliRunner

from kgsynth.cli import app
from tests.kgfixtures import MOVIE_FACTS

runner = CliRunner()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    kb = tmp / "kb.txt"
    kb.write_text("\n".join("|".join(f) for f in MOVIE_FACTS) + "\n")
    res = runner.invoke(app, ["kg", "import", str(kb), "--out", str(tmp / "store")])
    assert res.exit_code == 0, res.output
    assert "12 facts" in res.output and "12 entities" in res.output and "4 relations" in res.output
    return tmp / "store"


def test_import_error_is_one_line_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("a|b|c\nonly|two\n")
    res = runner.invoke(app, ["kg", "import", str(bad), "--out", str(tmp_path / "s")])
    assert res.exit_code == 3
    assert f"{bad}:2:" in res.output and "expected 3 fields" in res.output
    assert not (tmp_path / "s").exists()


def test_stats_json(store):
    res = runner.invoke(app, ["kg", "stats", "--kg", str(store), "--json"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    assert stats["facts"] == 12 and stats["entities"] == 12 and stats["relations"] == 4
    assert stats["top_relations"][0] == {
        "relation": "starred_actors",
        "iri": "http://kgsynth.org/relation/starred_actors",
        "count": 4,
        "hidden": False,
    }
    assert sum(b["entities"] for b in stats["degree"]["histogram"]) == 12


def test_tool_prints_the_observation(store):
    res = runner.invoke(
        app, ["kg", "tool", "--kg", str(store), "get_triples('Kismet', ['directed_by'])"]
    )
    assert res.exit_code == 0, res.output
    assert (
        res.output.strip() == "<information>(Kismet, directed_by, William Dieterle)</information>"
    )
    res = runner.invoke(app, ["kg", "tool", "--kg", str(store), 'get_relations("Nobody")'])
    assert res.exit_code == 1 and "entity_not_found" in res.output


def test_query_tsv_json_and_refused_update(store):
    q = 'SELECT ?o WHERE { ?s <http://www.w3.org/2000/01/rdf-schema#label> "Juarez" ; <http://kgsynth.org/relation/release_year> ?o }'
    res = runner.invoke(app, ["kg", "query", "--kg", str(store), q])
    assert res.output.splitlines() == ["o", "http://kgsynth.org/entity/1939"]
    res = runner.invoke(app, ["kg", "query", "--kg", str(store), "--format", "json", q])
    assert json.loads(res.output) == [{"o": "http://kgsynth.org/entity/1939"}]
    res = runner.invoke(app, ["kg", "query", "--kg", str(store), "ASK { ?s ?p ?o }"])
    assert res.output.strip() == "true"
    res = runner.invoke(app, ["kg", "query", "--kg", str(store), "DELETE WHERE { ?s ?p ?o }"])
    assert res.exit_code == 4 and "read-only" in res.output


def test_unknown_kg_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["kg", "stats", "--kg", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "--kg" in res.output


def test_a_command_learns_which_config_flags_were_given():
    """config_command passes a ``given_flags`` parameter the fields given as flags (synthesize
    trajectories keeps an explicit --system-prompt over an hf checkpoint's stored prompt)."""
    import typer

    from kgsynth.cli.fields import config_command
    from kgsynth.synthesize.trajectory_config import TrajectoryConfig

    toy = typer.Typer()
    seen: dict = {}

    @toy.command()
    @config_command(TrajectoryConfig, section="trajectories")
    def cmd(cfg: TrajectoryConfig, given_flags: frozenset[str] = frozenset()) -> None:
        seen.update(given=given_flags, cfg=cfg)

    res = runner.invoke(toy, ["--system-prompt", "full", "--max-turns", "3"])
    assert res.exit_code == 0, res.output
    assert seen["given"] == {"system_prompt", "max_turns"}
    assert seen["cfg"].agent.max_turns == 3
    runner.invoke(toy, [])
    assert seen["given"] == frozenset()


def test_an_older_flag_spelling_still_works_and_says_it_is_deprecated(capsys):
    """--tools (now --toolset) and --max-tokens (now --max-turn-tokens) are read as the field,
    with one deprecation line each; the field's own flag wins where both are given."""
    import typer

    from kgsynth.cli.fields import config_command
    from kgsynth.synthesize.trajectory_config import TrajectoryConfig

    toy = typer.Typer()
    seen: dict = {}

    @toy.command()
    @config_command(TrajectoryConfig, section="trajectories")
    def cmd(cfg: TrajectoryConfig) -> None:
        seen["cfg"] = cfg

    res = runner.invoke(toy, ["--tools", "kgr1", "--max-tokens", "99"])
    assert res.exit_code == 0, res.output
    assert (seen["cfg"].agent.toolset, seen["cfg"].agent.max_turn_tokens) == ("kgr1", 99)
    said = res.output + capsys.readouterr().err
    assert "--tools is deprecated; use --toolset" in said
    assert "--max-tokens is deprecated; use --max-turn-tokens" in said
    runner.invoke(toy, ["--toolset", "isp", "--tools", "kgr1"])
    assert seen["cfg"].agent.toolset == "isp"


def test_top_level_help_lists_the_commands_in_pipeline_order():
    res = runner.invoke(app, ["--help"], env={"COLUMNS": "100"})
    listed = [line.split()[1] for line in res.output.splitlines() if line.startswith("│ ")]
    commands = [
        c
        for c in listed
        if c in {"run", "kg", "walk", "synthesize", "filter", "train", "eval", "report"}
    ]
    assert commands == ["run", "kg", "walk", "synthesize", "filter", "train", "eval", "report"]
    train = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "rl (GRPO" in train and "merge" in train


def test_verbose_logs_kgsynth_not_the_plotting_library(tmp_path):
    """-v shows kgsynth's INFO lines; matplotlib's (font cache, backends) stay out."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.NOTSET)
    res = runner.invoke(app, ["-v", "kg", "tool", "--kg", str(tmp_path / "none"), "x()"])
    assert res.exit_code != 0  # no KG there: what matters is the logging set up before
    assert logging.getLogger("matplotlib").level == logging.WARNING
