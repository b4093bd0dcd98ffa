"""Cut copies of names (kgsynth.agent.strategies.entities.cut_names): a name the policy
stopped copying early, or copied with letters left out, is read as the topic or shown name
it is a cut of, where no near name resolves; in a tool call and in a final answer."""

from __future__ import annotations

from kgsynth.agent.strategies.entities import cut_names, read_answers
from kgsynth.agent.tools import ToolConfig, ToolEnvironment
from kgsynth.kg.graph import KGGraph
from tests.kgfixtures import movie_kg


def test_a_cut_reads_as_the_longer_name_that_starts_the_same_and_keeps_its_letters():
    names = ["Vyacheslav Tikhonov", "Ivan Tikhonov", "As Good as It Gets"]
    assert cut_names("Vyaches", names) == ["Vyacheslav Tikhonov"]
    assert cut_names("As Gets", names) == ["As Good as It Gets"]
    assert cut_names("Tikhonov", names) == []  # another start
    assert cut_names("Vy", names) == []  # too short to read
    assert cut_names("Vyacheslav Tikhonov", names) == []  # not longer: the name itself
    assert cut_names("Vyachez", names) == []  # a letter the name lacks


def test_a_cut_topic_name_resolves_in_a_tool_call_with_a_note_and_only_with_near():
    graph = KGGraph(movie_kg())
    question = "who directed the films starred by Marlene Dietrich"
    near = ToolEnvironment(
        graph, question, ToolConfig(entity_matching="near"), topics=("Marlene Dietrich",)
    )
    got = near.execute('get_relations("Marl")').text
    assert got.splitlines()[0] == '(no entity named "Marl": read as "Marlene Dietrich")'
    assert "starred_actors" in got
    exact = ToolEnvironment(graph, question, ToolConfig(), topics=("Marlene Dietrich",))
    assert not exact.execute('get_relations("Marl")').ok


def test_a_cut_answer_reads_as_the_shown_name():
    shown = ["Paradise Road", "Crimes of the Heart"]
    assert read_answers(["Para", "Crimes of the Heart"], shown) == shown
    assert read_answers(["Zz Top"], shown) == ["Zz Top"]  # nothing it is a cut of: kept
