"""The kgr1 tool set as the KG-R1 paper has it (issue 42): flat-list observations, the
per-question 2-hop subgraph option, comma-separated answers. Citations are to
``kg-r1.txt`` (docs/papers/kg-r1.md)."""

import pytest

from kgsynth.agent.config import AgentConfig, AgentConfigError
from kgsynth.agent.episode import EpisodeTask, start_episode, step
from kgsynth.agent.rewards import Gold, f1_reward
from kgsynth.agent.spaces import parse_turn
from kgsynth.agent.spaces.registry import space
from kgsynth.agent.tools import ErrorType, ToolConfig, ToolEnvironment
from kgsynth.core.stage import Reject
from kgsynth.kg.graph import KGGraph
from tests.kgfixtures import movie_kg

# movie_kg: Kismet -directed_by-> William Dieterle <-directed_by- Juarez -starred_actors->
# Bette Davis <-starred_actors- Jezebel; Kismet stars Marlene Dietrich and Ronald Colman


@pytest.fixture(scope="module")
def graph():
    return KGGraph(movie_kg())


def kgr1_env(graph, question="", **settings):
    topics = settings.pop("topics", ())
    return ToolEnvironment(graph, question, ToolConfig(toolset="kgr1", **settings), topics=topics)


# --- 1. observations: the paper's flat lists (App. E examples, ablation A9) ------------------


def test_relations_are_one_flat_comma_separated_line(graph):
    env = kgr1_env(graph)
    tail = env.execute('get_tail_relations("Kismet")')
    assert (
        tail.text == 'Tail relations for entity "Kismet": directed_by, release_year, starred_actors'
    )
    assert tail.entities == ("Kismet",)
    head = env.execute('get_head_relations("William Dieterle")')
    assert head.text == 'Head relations for entity "William Dieterle": directed_by'


def test_entities_are_one_flat_line_naming_the_relation_and_the_entity(graph):
    env = kgr1_env(graph)
    tails = env.execute('get_tail_entities("Kismet", "directed_by")')
    assert tails.text == (
        'Tail entities for relation "directed_by" with head "Kismet": William Dieterle'
    )
    assert tails.entities == ("Kismet", "William Dieterle")
    heads = env.execute('get_head_entities("William Dieterle", "directed_by")')
    assert heads.text.startswith(
        'Head entities for relation "directed_by" with tail "William Dieterle": '
    )
    listed = heads.text.split(": ", 1)[1].split(", ")
    assert sorted(listed) == ["Juarez", "Kismet"] and heads.entities[1:] == tuple(listed)


def test_the_full_set_is_listed_without_a_cap_and_a_cap_says_so(graph):
    # five triples per relation was graphwalker's cap leaking into kgr1; the paper lists all
    many = ToolConfig(toolset="kgr1", max_triples_per_relation=1)
    env = ToolEnvironment(graph, config=many)
    stars = env.execute('get_tail_entities("Kismet", "starred_actors")')
    assert sorted(stars.text.split(": ", 1)[1].split(", ")) == ["Marlene Dietrich", "Ronald Colman"]
    capped = kgr1_env(graph, kgr1_max_entities=1, kgr1_max_relations=2)
    one = capped.execute('get_tail_entities("Kismet", "starred_actors")').text
    assert one.startswith(
        'Tail entities for relation "starred_actors" with head "Kismet" (showing 1 of 2, capped): '
    )
    rels = capped.execute('get_tail_relations("Kismet")').text
    assert rels == (
        'Tail relations for entity "Kismet" (showing 2 of 3, capped): directed_by, release_year'
    )


def test_a_long_list_is_cut_at_a_name_with_a_count(graph):
    env = kgr1_env(graph, max_observation_chars=76)  # the full line is 77
    text = env.execute('get_tail_relations("Kismet")').text
    assert text == 'Tail relations for entity "Kismet": directed_by, release_year, ... (1 more)'


def test_empty_results_are_errors_in_the_flat_wording(graph):
    env = kgr1_env(graph)
    none = env.execute('get_tail_relations("William Dieterle")')
    assert none.error == ErrorType.NO_RESULTS
    assert none.text == 'Error (no results): no tail relations for entity "William Dieterle".'
    wrong_way = env.execute('get_tail_entities("William Dieterle", "directed_by")')
    assert wrong_way.error == ErrorType.RELATION_NOT_FOUND


def test_the_triples_variant_keeps_the_earlier_observations(graph):
    env = kgr1_env(graph, kgr1_observation="triples")
    assert env.execute('get_head_relations("William Dieterle")').text.splitlines()[1:] == [
        "(?, directed_by, William Dieterle)"
    ]
    tails = env.execute('get_tail_entities("Kismet", "directed_by")')
    assert tails.text == "(Kismet, directed_by, William Dieterle)"


def test_bad_kgr1_settings_fail_naming_the_field():
    with pytest.raises(AgentConfigError, match="kgr1_observation must be flat or triples"):
        AgentConfig(toolset="kgr1", kgr1_observation="tree")
    with pytest.raises(AgentConfigError, match="kgr1_subgraph_hops must be >= 1 or None"):
        AgentConfig(toolset="kgr1", kgr1_subgraph_hops=0)


def chain_row(answers=("Juarez",)):
    """Kismet's director's other film: a chain-2 walk row."""
    return {
        "question": "what else did the director of Kismet direct",
        "structure": "chain-2",
        "topic_names": ["Kismet"],
        "branches": [
            [
                {"relation": "directed_by", "inverse": False, "entity": "William Dieterle"},
                {"relation": "directed_by", "inverse": True, "entity": "Juarez"},
            ]
        ],
        "merge_at": [2],
        "answer_names": list(answers),
    }


def count_row(count):
    return {
        "question": "how many actors star in Kismet",
        "structure": "count",
        "topic_names": ["Kismet"],
        "branches": [
            [{"relation": "starred_actors", "inverse": False, "entity": "Marlene Dietrich"}]
        ],
        "merge_at": [1],
        "answer_names": [count],
    }


def test_the_oracle_replays_through_the_flat_observations(graph):
    row = chain_row()
    env = kgr1_env(graph, row["question"], topics=row["topic_names"])
    steps = space("kgr1").replay(row, env)
    assert [c.call for c, _ in steps] == [
        'get_tail_relations("Kismet")',
        'get_tail_entities("Kismet", "directed_by")',
        'get_head_relations("William Dieterle")',
        'get_head_entities("William Dieterle", "directed_by")',
    ]
    assert steps[0][1].text.startswith('Tail relations for entity "Kismet": ')
    assert "Juarez" in steps[3][1].entities
    # a count is observable when every member is listed; a capped list is not
    assert space("kgr1").replay(count_row("2"), kgr1_env(graph))
    with pytest.raises(Reject, match="count_not_observable"):
        space("kgr1").replay(count_row("3"), kgr1_env(graph))
    with pytest.raises(Reject, match="count_not_observable"):
        space("kgr1").replay(count_row("2"), kgr1_env(graph, kgr1_max_entities=1))


def test_a_relation_missing_from_the_flat_list_rejects_the_walk(graph):
    env = kgr1_env(graph, kgr1_max_relations=1)  # only directed_by is listed
    row = count_row("2")
    with pytest.raises(Reject, match="gold_relation_not_retrievable"):
        space("kgr1").replay(row, env)


# --- 2. the per-question 2-hop subgraph (§4.1, App. B.2) -------------------------------------


def test_a_relation_three_hops_from_the_topic_is_outside_the_two_hop_subgraph(graph):
    # Kismet (0) -> William Dieterle (1) -> Juarez (2) -starred_actors-> Bette Davis (3)
    whole = kgr1_env(graph, topics=["Kismet"])
    assert "starred_actors" in whole.execute('get_tail_relations("Juarez")').text
    assert whole.execute('get_tail_entities("Juarez", "starred_actors")').ok
    sub = kgr1_env(graph, topics=["Kismet"], kgr1_subgraph_hops=2)
    # the edge back toward the topic is in it: the hop that reached Juarez
    juarez = sub.execute('get_tail_relations("Juarez")')
    assert juarez.text == 'Tail relations for entity "Juarez": directed_by'
    back = sub.execute('get_head_entities("William Dieterle", "directed_by")')
    assert sorted(back.entities[1:]) == ["Juarez", "Kismet"]
    # the third hop itself, and an entity three hops away, are not there
    third = sub.execute('get_tail_entities("Juarez", "starred_actors")')
    assert third.error == ErrorType.RELATION_NOT_FOUND
    far = sub.execute('get_head_relations("Bette Davis")')
    assert far.error == ErrorType.ENTITY_NOT_FOUND and "subgraph" in far.text
    assert whole.execute('get_head_relations("Bette Davis")').ok


def test_the_subgraph_keeps_every_edge_of_an_entity_one_hop_away(graph):
    sub = kgr1_env(graph, topics=["Juarez"], kgr1_subgraph_hops=2)
    # Bette Davis is one hop from Juarez: all her edges are in, Jezebel's are at hop 2
    assert sub.execute('get_head_entities("Bette Davis", "starred_actors")').ok
    assert sub.execute('get_tail_relations("Jezebel")').text == (
        'Tail relations for entity "Jezebel": has_genre, starred_actors'
    )  # Drama and Bette Davis are one hop from Juarez; William Wyler is not
    one = kgr1_env(graph, topics=["Juarez"], kgr1_subgraph_hops=1)
    assert one.execute('get_tail_relations("Jezebel")').error == ErrorType.ENTITY_NOT_FOUND


def test_without_topics_the_subgraph_option_is_the_whole_kg_nowhere(graph):
    sub = kgr1_env(graph, kgr1_subgraph_hops=2)
    res = sub.execute('get_tail_relations("Kismet")')
    assert res.error == ErrorType.ENTITY_NOT_FOUND


# --- 3. answers as the paper writes them (App. E examples) -----------------------------------


def test_kgr1_reads_comma_separated_answers_and_keeps_json_lists():
    def answer(text, toolset="kgr1"):
        return parse_turn(f"<think>done</think><answer>{text}</answer>", toolset)

    assert answer(" Juarez, Kismet ").answer == ["Juarez", "Kismet"]
    assert answer("Juarez,\nKismet, juarez").answer == ["Juarez", "Kismet"]
    assert answer('["Washington, D.C.", "Kismet"]').answer == ["Washington, D.C.", "Kismet"]
    assert answer("Kismet").answer == ["Kismet"]
    assert answer("").format_error is not None
    # the other spaces are unchanged: a bare string is one answer
    assert answer("Juarez, Kismet", "graphwalker").answer == ["Juarez, Kismet"]


def test_a_comma_separated_answer_scores_its_hits(graph):
    env = kgr1_env(graph, "which films did William Dieterle direct")
    ep = start_episode(EpisodeTask(env.question, ["William Dieterle"]), "system")
    step(ep, env, "<think>both</think><answer>Juarez, Kismet</answer>", None, final=False)
    assert ep.answered and ep.predicted_answers == ["Juarez", "Kismet"]
    assert f1_reward(ep, Gold(["Kismet", "Juarez"])) == 1.0


def test_kgr1_writes_its_answers_comma_separated():
    turns = space("kgr1").turns
    assert turns.answer_action(["Juarez", "Kismet"]) == "<answer>Juarez, Kismet</answer>"
    # a name with a comma in it would split: such a list is written as JSON
    assert turns.answer_action(["Washington, D.C."]) == '<answer>["Washington, D.C."]</answer>'
    for answers in (["Juarez", "Kismet"], ["Washington, D.C."]):
        turn = turns.parse_turn(turns.answer_turn("t", answers))
        assert turn.answer == answers and turn.format_error is None
    assert "comma" in turns.final_answer_prompt
