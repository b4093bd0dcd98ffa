"""The focus ranking's first-hop fallback (kgsynth.agent.strategies.first_hop): which relation a first
list with no match mark gets marked, and that only the topic's first list is touched. The
encoder is a stand-in of known scores here, except in the last test (the bundled MiniLM)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from kgsynth.agent.strategies.first_hop import first_hop_marks, relation_question
from kgsynth.agent.strategies.focus import rank_relations_focused
from kgsynth.agent.tools import ToolConfig, ToolEnvironment
from kgsynth.kg.graph import KGGraph, Relation
from tests.kgfixtures import movie_kg

RELS = [
    Relation("directed_by", "out", ("x",)),
    Relation("has_genre", "out", ("y",)),
    Relation("starred_actors", "out", ("z",)),
]


class Keyed:
    """Cosine 1 for a sentence holding ``key`` (and for the word ``word``), else 0; it
    records what it was asked."""

    def __init__(self, key: str, word: str = "") -> None:
        self.key, self.word, self.asked = key, word, []

    def sentence_scores(self, question: str, sentences: Sequence[str]) -> np.ndarray:
        self.asked.append((question, list(sentences)))
        return np.array([float(self.key in s or s == self.word) for s in sentences])


def _focused(question: str, topic: str = "Kismet") -> list:
    return rank_relations_focused(question, RELS, topic, ())


def test_a_list_with_a_mark_is_left_as_it_is():
    ranked = _focused("what is the genre of Kismet")
    assert ranked[0] == (RELS[1], ("genre",))
    encoder = Keyed("starred")
    assert first_hop_marks("what is the genre of Kismet", "Kismet", ranked, encoder) == ranked
    assert encoder.asked == []


def test_a_hidden_short_word_match_is_marked_first():
    """ "act" stems like "actors" but is too short for the mark: the fallback shows it."""
    ranked = _focused("what does Kismet act in")
    assert all(marks == () for _, marks in ranked) and ranked[0][0] == RELS[2]
    encoder = Keyed("genre")
    got = first_hop_marks("what does Kismet act in", "Kismet", ranked, encoder)
    assert got[0] == (RELS[2], ("act",)) and [r for r, _ in got] == [r for r, _ in ranked]
    assert encoder.asked == []  # a word match needs no encoder


def test_no_word_match_marks_the_relation_whose_question_is_nearest():
    question = "what kind of picture is Kismet"
    ranked = _focused(question)
    assert all(marks == () for _, marks in ranked)
    encoder = Keyed("genre", word="kind")
    got = first_hop_marks(question, "Kismet", ranked, encoder)
    assert got[0] == (RELS[1], ("kind",))
    assert [r for r, _ in got[1:]] == [RELS[0], RELS[2]]  # the rest in their order
    assert all(marks == () for _, marks in got[1:])
    asked_question, sentences = encoder.asked[0]
    assert asked_question == question
    assert sentences == [relation_question("Kismet", r) for r in RELS]
    assert sentences[1] == "What is the genre of Kismet?"
    # the word: the content word nearest the relation's words; function words are not asked
    words_asked = encoder.asked[1]
    assert words_asked == ("genre", ["picture", "kind"])  # nearest the topic first


def test_nothing_to_mark_with_or_no_encoder_leaves_the_list():
    ranked = _focused("what is Kismet about")  # function words only
    assert first_hop_marks("what is Kismet about", "Kismet", ranked, Keyed("genre")) == ranked
    ranked = _focused("what kind of picture is Kismet")
    assert first_hop_marks("what kind of picture is Kismet", "Kismet", ranked, None) == ranked


def test_an_inverse_relation_is_asked_the_other_way():
    rel = Relation("directed_by", "in", ("x",))
    assert relation_question("William Dieterle", rel) == (
        "What are the things directed by William Dieterle?"
    )


def test_only_the_topics_first_list_is_marked(monkeypatch):
    """In an episode: the topic's first list gets the mark; after a hop an unmarked list stays
    unmarked (the agent's cue to answer), and the option is off unless asked for."""
    graph = KGGraph(movie_kg())
    question = "what kind of picture is Kismet"
    off = ToolEnvironment(graph, question, ToolConfig(relation_ranking="focus"))
    assert "<-" not in off.execute('get_relations("Kismet")').text
    env = ToolEnvironment(
        graph,
        question,
        ToolConfig(relation_ranking="focus", first_hop_fallback="dense"),
        dense=Keyed("release year"),  # type: ignore[arg-type]
    )
    first = env.execute('get_relations("Kismet")').text.splitlines()
    assert first[1].startswith("(Kismet, release_year, ?) <- ")
    assert sum("<-" in line for line in first) == 1
    assert env.execute('get_triples("Kismet", ["directed_by"])').ok
    assert "<-" not in env.execute('get_relations("William Dieterle")').text
    with pytest.raises(ValueError, match="first_hop_fallback must be none unless"):
        ToolConfig(relation_ranking="bm25", first_hop_fallback="dense")


def test_the_bundled_encoder_picks_a_relation_the_words_do_not_name():
    """The shipped MiniLM, end to end through the shared scorer: "who penned X" names no
    relation of X, and the mark goes to written_by."""
    from kgsynth.agent.relrank import shared_scorer

    rels = [*RELS, Relation("written_by", "out", ("w",))]
    question = "who penned Kismet"
    ranked = rank_relations_focused(question, rels, "Kismet", ())
    got = first_hop_marks(question, "Kismet", ranked, shared_scorer())
    assert got[0] == (rels[3], ("penned",))


class WordNear:
    """Cosine 1 between the relation words ``rel`` and the question word ``word``, else 0."""

    def __init__(self, rel: str, word: str) -> None:
        self.rel, self.word = rel, word

    def sentence_scores(self, question: str, sentences: Sequence[str]) -> np.ndarray:
        return np.array([float(question == self.rel and s == self.word) for s in sentences])


def _later(question: str, word: str = "cast") -> ToolEnvironment:
    config = ToolConfig(relation_ranking="focus", later_hop_fallback="dense")
    env = ToolEnvironment(
        KGGraph(movie_kg()),
        question,
        config,
        topics=["William Dieterle"],
        dense=WordNear("starred actors", word),  # type: ignore[arg-type]
    )
    assert env.execute('get_triples("William Dieterle", ["directed_by"])').ok
    return env


def test_a_later_list_marks_the_relation_nearest_a_word_nothing_used():
    env = _later("the cast of the films William Dieterle directed")
    lines = env.execute('get_relations("Kismet")').text.splitlines()
    assert lines[1] == "(Kismet, starred_actors, ?) <- cast"
    assert sum("<-" in line for line in lines) == 1


def test_the_answer_type_noun_and_topic_words_mark_nothing():
    # "films" is the noun "which" opens the question with; the rest is the topic's name or
    # was used by directed_by
    env = _later("which films has William Dieterle directed", word="films")
    assert "<-" not in env.execute('get_relations("Kismet")').text
    # the same words without the opening "which": "films" is left and marked
    env = _later("name the films William Dieterle directed", word="films")
    assert "(Kismet, starred_actors, ?) <- films" in env.execute('get_relations("Kismet")').text
    off = ToolEnvironment(
        KGGraph(movie_kg()),
        "the cast of the films William Dieterle directed",
        ToolConfig(relation_ranking="focus"),
        topics=["William Dieterle"],
    )
    off.execute('get_triples("William Dieterle", ["directed_by"])')
    assert "<-" not in off.execute('get_relations("Kismet")').text


def test_a_word_a_mark_showed_is_used_up_by_following_its_relation():
    question = "the cast of the films William Dieterle directed"
    rels = [Relation("starred_actors", "out", ("x",)), Relation("has_genre", "out", ("y",))]
    before = dict(rank_relations_focused(question, rels, "William Dieterle", ["directed_by"]))
    assert before[rels[0]] == ()  # "cast" is no word of starred_actors: no mark, but left
    env = _later(question)
    env.execute('get_relations("Kismet")')
    assert env.execute('get_triples("Kismet", ["starred_actors"])').ok
    assert env.strategies.ranking.used == ("cast",)
    # after that hop "cast" marks nothing; "films" is what is left
    after = env.execute('get_relations("Marlene Dietrich")').text
    assert "cast" not in after and after.endswith("<- films")


def test_a_first_hop_mark_word_stays_for_the_next_list():
    """The first-hop fallback marks with the question word nearest the relation, which can be
    the next hop's word; without the later-hop fallback nothing uses it up."""
    env = ToolEnvironment(
        KGGraph(movie_kg()),
        "what kind of picture is Kismet",
        ToolConfig(relation_ranking="focus", first_hop_fallback="dense"),
        dense=Keyed("release year"),  # type: ignore[arg-type]
    )
    assert "<- " in env.execute('get_relations("Kismet")').text
    assert env.execute('get_triples("Kismet", ["release_year"])').ok
    assert env.strategies.ranking.used == ()
