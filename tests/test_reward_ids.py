"""RL rewards on benchmark questions (issue 18): a predicted Freebase id or alias counts as the
gold answer it names, as eval's scoring does; MetaQA-style gold (names only) is unchanged."""

from pathlib import Path

from kgsynth.agent.loop import Episode, EpisodeTask
from kgsynth.agent.rewards.components import Gold, em_strict_reward, f1_reward, hit_reward
from kgsynth.train.grpo_run import read_rl_questions

FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"


def _episode(*answers: str) -> Episode:
    ep = Episode(EpisodeTask("q", ["X"]))
    ep.predicted_answers = list(answers)
    return ep


GOLD = Gold(
    answers=["Dead Ringers", "Eragon"],
    answer_ids=["m.03f7xg", "m.05c9zr"],
    aliases=[["Dead Ringers (film)"], []],
)


def test_ids_and_aliases_count_as_the_answers_they_name():
    assert em_strict_reward(_episode("m.03f7xg", "Eragon"), GOLD) == 1.0
    assert (
        em_strict_reward(
            _episode("http://rdf.freebase.com/ns/m.05c9zr", "dead ringers (film)"), GOLD
        )
        == 1.0
    )
    assert hit_reward(_episode("m.05c9zr"), GOLD) == 1.0
    assert f1_reward(_episode("m.03f7xg"), GOLD) == 2 / 3
    # an id of something else is not an answer, and neither is a name that only looks close
    assert hit_reward(_episode("m.0000", "Eragon 2"), GOLD) == 0.0


def test_names_only_gold_scores_as_before():
    gold = Gold(answers=["Kismet"])
    assert em_strict_reward(_episode("kismet"), gold) == 1.0
    assert hit_reward(_episode("m.03f7xg"), gold) == 0.0


def test_rl_questions_from_a_benchmark_carry_ids_and_aliases():
    qs = read_rl_questions(FIXTURES / "cwq.json")
    with_aliases = [q for q in qs if any(q.aliases)]
    assert with_aliases, "the CWQ fixture has aliases"
    for q in qs:
        assert len(q.answer_ids) == len(q.answers)
    webqsp = read_rl_questions(FIXTURES / "webqsp.json")
    assert any(i and i.startswith("m.") for q in webqsp for i in q.answer_ids)


def test_a_question_without_topic_entities_says_so():
    from kgsynth.agent.prompt import user_prompt

    assert user_prompt("Which films?", ["Kismet", "Juarez"]).endswith(
        "Topic entities: Kismet, Juarez"
    )
    assert user_prompt("Which films?", []).endswith(
        "Topic entities: none given (find them in the question)"
    )
