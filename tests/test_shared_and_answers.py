"""``conjunction_hints`` (entities two get_triples calls both reached come first, marked) and
``answer_matching`` (an answer's misspelt names read as the names the episode showed)."""

from __future__ import annotations

from kgsynth.agent.episode import Episode, EpisodeTask, step
from kgsynth.agent.strategies.entities import read_answers
from kgsynth.agent.tools import ToolConfig, ToolEnvironment
from kgsynth.kg.graph import KGGraph
from tests.kgfixtures import movie_kg

QUESTION = "which film with Bette Davis was directed by William Dieterle"


def _env(**changes) -> ToolEnvironment:
    return ToolEnvironment(KGGraph(movie_kg()), QUESTION, ToolConfig(**changes))


def test_the_entity_both_calls_reached_comes_first_and_marked():
    env = _env(conjunction_hints=True, max_triples_per_relation=1)
    first = env.execute('get_triples("Bette Davis", ["starred_actors"])')
    assert "<- both" not in first.text  # nothing was reached before
    second = env.execute('get_triples("William Dieterle", ["directed_by"])').text.splitlines()
    # Juarez is in both sets; one triple is shown, and it is the shared one, marked
    assert second[0] == "(Juarez, directed_by, William Dieterle) <- both"
    assert second[1] == "... 1 more (?, directed_by, William Dieterle)"


def test_a_shared_entity_the_first_call_did_not_show_still_counts():
    # the first call shows one of Bette Davis's two films; the mark reads all it reached
    env = _env(conjunction_hints=True, max_triples_per_relation=1)
    shown = env.execute('get_triples("Bette Davis", ["starred_actors"])').entities
    second = env.execute('get_triples("William Dieterle", ["directed_by"])')
    assert "(Juarez, directed_by, William Dieterle) <- both" in second.text
    assert second.entities[1] == "Juarez"
    assert shown[1] in {"Juarez", "Jezebel"}


def test_the_same_start_twice_and_the_option_off_mark_nothing():
    env = _env(conjunction_hints=True)
    env.execute('get_triples("William Dieterle", ["directed_by"])')
    assert "<- both" not in env.execute('get_triples("William Dieterle", ["directed_by"])').text
    off = _env()
    off.execute('get_triples("Bette Davis", ["starred_actors"])')
    assert "<- both" not in off.execute('get_triples("William Dieterle", ["directed_by"])').text


def test_a_snapshot_keeps_what_was_reached():
    env = _env(conjunction_hints=True)
    start = env.snapshot()
    env.execute('get_triples("Bette Davis", ["starred_actors"])')
    after = env.snapshot()
    env.restore(start)
    assert "<- both" not in env.execute('get_triples("William Dieterle", ["directed_by"])').text
    env.restore(after)
    assert "<- both" in env.execute('get_triples("William Dieterle", ["directed_by"])').text


def test_read_answers():
    shown = ["Maria of Austria the Younger", "Juarez", "Jack Lemmon"]
    assert read_answers(["maria of austria the yonger", "juarez", "Juarez"], shown) == [
        "Maria of Austria the Younger",
        "Juarez",
    ]
    # nothing near enough: kept as written
    assert read_answers(["Zorro"], shown) == ["Zorro"]


def test_an_episode_reads_its_answer_under_near_only():
    for matching, expected in (("near", ["Juarez"]), ("exact", ["Juares"])):
        env = _env(answer_matching=matching)
        ep = Episode(EpisodeTask(QUESTION, ["William Dieterle"]))
        step(
            ep,
            env,
            '<kg-query>get_triples("William Dieterle", ["directed_by"])</kg-query>',
            None,
            final=False,
        )
        step(ep, env, '<answer>["Juares"]</answer>', None, final=False)
        assert ep.predicted_answers == expected
        assert '["Juares"]' in ep.messages[-1]["content"]  # what the policy wrote stays


def test_a_triples_list_names_the_topics_no_call_has_been_about():
    env = ToolEnvironment(
        KGGraph(movie_kg()),
        QUESTION,
        ToolConfig(conjunction_hints=True),
        topics=["Bette Davis", "William Dieterle"],
    )
    first = env.execute('get_triples("bette davis", ["starred_actors"])').text.splitlines()
    assert first[-1] == "(also in the question: William Dieterle)"
    env.execute('get_relations("William Dieterle")')
    second = env.execute('get_triples("William Dieterle", ["directed_by"])').text
    assert "also in the question" not in second
    # one topic (a chain), or the option off: no such line
    chain = ToolEnvironment(
        KGGraph(movie_kg()), QUESTION, ToolConfig(conjunction_hints=True), topics=["Bette Davis"]
    )
    assert "also in" not in chain.execute('get_triples("Bette Davis", ["starred_actors"])').text
    off = ToolEnvironment(KGGraph(movie_kg()), QUESTION, topics=["Bette Davis", "Juarez"])
    assert "also in" not in off.execute('get_triples("Bette Davis", ["starred_actors"])').text


def test_the_oracle_replays_the_branches_in_the_order_the_question_names_their_topics():
    """The user prompt lists a question's topics in the order it names them, and the oracle
    starts where the question does: the agent learns one rule it can read at eval time (run
    AE's shorter branch first did not match the prompt's order; PI fell 0.17 -> 0.06)."""
    from kgsynth.agent.prompt import user_prompt
    from kgsynth.agent.spaces import oracle_calls
    from kgsynth.agent.topics import in_mention_order

    row = {
        "structure": "PI",
        "topic_names": ["Kismet", "Juarez"],
        "topic_ids": ["k", "j"],
        "branches": [
            [
                {"relation": "directed_by", "inverse": False, "entity": "William Dieterle"},
                {"relation": "directed_by", "inverse": True, "entity": "Juarez"},
            ],
            [{"relation": "starred_actors", "inverse": False, "entity": "Bette Davis"}],
        ],
        "merge_at": [2, 1],
    }

    def starts(question: str) -> list[str]:
        ordered = in_mention_order({**row, "question": question})
        return [c.entity for c in oracle_calls(ordered, "graphwalker") if c.kind == "relations"]

    kismet_first = "what shares Kismet's director and stars the star of Juarez"
    juarez_first = "which films starring the star of JUAREZ share a director with Kismet"
    assert starts(kismet_first) == ["Kismet", "William Dieterle", "Juarez"]
    assert starts(juarez_first) == ["Juarez", "Kismet", "William Dieterle"]
    moved = in_mention_order({**row, "question": juarez_first})
    assert moved["topic_ids"] == ["j", "k"] and moved["merge_at"] == [1, 2]
    assert user_prompt(juarez_first, row["topic_names"]).endswith("Topic entities: Juarez, Kismet")
    # a name the question does not hold keeps its place after those it does
    assert user_prompt("who directed Kismet", ["Zorro", "Kismet"]).endswith("Kismet, Zorro")
