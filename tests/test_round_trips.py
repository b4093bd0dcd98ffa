"""The focus ranking's round-trip words are read from the run's own synthesized questions (issue
43: nothing in the agent core is a word list of the template backend): the words that come,
almost only, with walks that go out along a relation and back along it; ``synthesize
trajectories`` records them, and a model trained on its trajectories carries them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.strategies.round_trips import comes_back, round_trip_words
from kgsynth.cli import app

runner = CliRunner()


def _step(relation: str, inverse: bool) -> dict:
    return {"relation": relation, "inverse": inverse, "entity": "e"}


def test_a_walk_comes_back_where_a_relation_is_followed_the_other_way_next():
    assert comes_back([[_step("directed_by", False), _step("directed_by", True)]])
    assert comes_back([[_step("a", False)], [_step("b", True), _step("b", False), _step("c", 0)]])
    assert not comes_back([[_step("directed_by", False), _step("directed_by", False)]])
    assert not comes_back([[_step("directed_by", True), _step("written_by", False)]])
    assert not comes_back([[_step("directed_by", False)]]) and not comes_back(None)


def _row(question: str, back: bool, topic: str = "Kismet") -> dict:
    steps = [_step("directed_by", False), _step("directed_by", back)]
    return {"question": question, "topic_names": [topic], "branches": [steps]}


def test_words_that_come_with_round_trips_only_and_often_enough():
    rows = [_row("which films share a director with Kismet", True) for _ in range(12)]
    rows += [_row("what has the same director as Kismet", True) for _ in range(12)]
    rows += [_row("what films did the director of Kismet make", False) for _ in range(40)]
    rows += [_row("what is shared like Kismet", True) for _ in range(2)]  # too rare
    # "Kismet" is the topic's name, "films" and "director" come with both kinds of walk
    assert round_trip_words(rows) == ("same", "share")
    assert round_trip_words([_row("what has the same director as Kismet", False)] * 20) == ()
    assert round_trip_words([]) == ()


def test_a_word_the_walks_share_explains_is_not_a_round_trip_word():
    """Where most walks come back, a word that comes with them 10 times of 10 is chance."""
    rows = [_row("list what has the same director as Kismet", True) for _ in range(10)]
    rows += [_row("what has the same director as Kismet", True) for _ in range(60)]
    rows += [_row("which director made Kismet", False) for _ in range(10)]
    assert round_trip_words(rows) == ("same",)


@pytest.fixture(scope="module")
def movies(tmp_path_factory) -> dict[str, Path]:
    """A movie KB big enough for walks that come back, walked and worded by the template
    backend through the CLI."""
    root = tmp_path_factory.mktemp("round_trips")
    rng = random.Random(0)
    facts = []
    for i in range(80):
        facts.append((f"Film {i}", "directed_by", f"Director {rng.randrange(12)}"))
        facts.append((f"Film {i}", "has_genre", f"Genre {rng.randrange(6)}"))
        facts += [(f"Film {i}", "starred_actors", f"Actor {a}") for a in rng.sample(range(30), 2)]
    (root / "kb.txt").write_text("\n".join("|".join(f) for f in facts) + "\n")
    paths = {n: root / n for n in ("kb.txt", "store", "walks.parquet", "questions.parquet")}
    for args in (
        ["kg", "import", paths["kb.txt"], "--out", paths["store"]],
        ["walk", "--kg", paths["store"], "--out", paths["walks.parquet"], "--n", "400",
         "--structures", "chain-1,chain-2"],
        ["synthesize", "questions", "--walks", paths["walks.parquet"], "--out",
         paths["questions.parquet"]],
    ):  # fmt: skip
        res = runner.invoke(app, [str(a) for a in args])
        assert res.exit_code == 0, res.output
    return paths


def test_trajectories_record_the_words_their_questions_say_and_a_set_value_stands(movies, tmp_path):
    rows = pq.read_table(movies["questions.parquet"]).to_pylist()
    words = round_trip_words(rows)
    # the template backend's shared forms ("the same genre as", "sharing starred actors with"),
    # and no relation's or entity's word
    assert "same" in words and {"share", "sharing"} & set(words)
    assert not {"genre", "directed", "starred", "actors", "film", "films"} & set(words)

    def made(out: Path, *extra: str) -> dict:
        args = ["synthesize", "trajectories", "--questions", movies["questions.parquet"], "--kg",
                movies["store"], "--out", out, "--relation-ranking", "focus", *extra]  # fmt: skip
        res = runner.invoke(app, [str(a) for a in args])
        assert res.exit_code == 0, res.output
        return json.loads(out.with_name(out.stem + ".manifest.json").read_text())["config"]

    assert made(tmp_path / "derived.parquet")["round_trip_words"] == list(words)
    config = tmp_path / "recipe.yaml"
    config.write_text("trajectories:\n  round_trip_words: [Alike]\n")
    given = made(tmp_path / "given.parquet", "--config", str(config))
    assert given["round_trip_words"] == ["alike"]
    # bm25 has no use for them: left unset
    res = runner.invoke(app, [str(a) for a in ["synthesize", "trajectories", "--questions",
                              movies["questions.parquet"], "--kg", movies["store"], "--out",
                              tmp_path / "bm25.parquet"]])  # fmt: skip
    assert res.exit_code == 0, res.output
    bm25 = json.loads((tmp_path / "bm25.manifest.json").read_text())["config"]
    assert bm25["round_trip_words"] is None


def test_the_focus_ranking_uses_the_config_words():
    from kgsynth.agent.strategies import episode_strategies

    cfg = AgentConfig(relation_ranking="focus", round_trip_words=("same",))
    assert episode_strategies(cfg, ["Kismet"], lambda: None).ranking.round_trip == {"same"}
    plain = episode_strategies(AgentConfig(relation_ranking="focus"), ["Kismet"], lambda: None)
    assert plain.ranking.round_trip == frozenset()


def test_a_round_trip_word_is_read_as_a_word_not_as_a_stem_inside_a_name():
    """ "Sam" stems as "same" does; a name is not a round-trip word, "shared" is "share"."""
    from kgsynth.agent.strategies.focus import focus_weights

    words = ("same", "share")
    assert "direct" not in focus_weights(
        "what did Sam Raimi direct", "Sam Raimi", ["directed_by"], words
    )
    assert "direct" not in focus_weights(
        "what did Kismet's Sam direct", "Kismet", ["directed_by"], words
    )
    shared = "which films shared a director with Kismet"
    assert "direct" in focus_weights(shared, "Kismet", ["directed_by"], words)
