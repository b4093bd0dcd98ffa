"""The rules that read the KG one hop ahead (kgsynth.agent.strategies.next_hop): the way-back
mark on a list a round trip the question does not announce leaves unmarked, and the lead-on
order that lists first the entities a hop reached which have the relation the question names
next. Episodes run through the real tool environment on a small embedded KG."""

from __future__ import annotations

from kgsynth.agent.strategies.focus import FocusWord
from kgsynth.agent.strategies.next_hop import lead_on_first
from kgsynth.agent.tools import ToolConfig, ToolEnvironment
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph, Relation
from kgsynth.kg.profiles import get_profile
from tests.kgfixtures import movie_ntriples

FACTS = [
    ("Bad Lieutenant", "starred_actors", "Harvey Keitel"),
    ("Bad Lieutenant", "has_genre", "Crime"),
    ("Mean Streets", "starred_actors", "Harvey Keitel"),
    ("Mean Streets", "has_genre", "Drama"),
    ("Blue Collar", "written_by", "Harvey Keitel"),
    ("Blue Collar", "has_genre", "Drama"),
    # Bruce Beresford's first film by name has no actors in the KG
    ("Crimes of the Heart", "directed_by", "Bruce Beresford"),
    ("Crimes of the Heart", "release_year", "1986"),
    ("Paradise Road", "directed_by", "Bruce Beresford"),
    ("Paradise Road", "starred_actors", "Glenn Close"),
]


def _graph() -> KGGraph:
    return KGGraph(EmbeddedKG.from_ntriples(movie_ntriples(FACTS), get_profile("generic")))


def _env(question: str, **options) -> ToolEnvironment:
    config = ToolConfig(relation_ranking="focus", neighbor_order="alphabetical", **options)
    return ToolEnvironment(_graph(), question, config, topics=())


ROUND_TRIP = "what genres are the movies starred by Bad Lieutenant actors"


def _at_the_actor(env: ToolEnvironment) -> list[str]:
    first = env.execute('get_relations("Bad Lieutenant")').text
    assert "(Bad Lieutenant, starred_actors, ?) <- starred, actors" in first
    assert env.execute('get_triples("Bad Lieutenant", ["starred_actors"])').ok
    return env.execute('get_relations("Harvey Keitel")').text.splitlines()


def test_an_unannounced_round_trip_marks_the_way_back_with_the_next_hops_word():
    lines = _at_the_actor(_env(ROUND_TRIP, way_back_marks=True))
    assert lines[1] == "(?, starred_actors, Harvey Keitel) <- genres"
    assert lines[2] == "(?, written_by, Harvey Keitel)"  # leads to a genre too, but is no way back
    # off (the default), the list is the "nothing more is asked" one
    off = _at_the_actor(_env(ROUND_TRIP))
    assert not any("<-" in line for line in off[1:])


def test_the_way_back_is_not_marked_where_the_question_asks_nothing_more():
    env = _env("who starred in Bad Lieutenant", way_back_marks=True)
    env.execute('get_relations("Bad Lieutenant")')
    env.execute('get_triples("Bad Lieutenant", ["starred_actors"])')
    assert "<-" not in env.execute('get_relations("Harvey Keitel")').text
    # nor for a word the entities back there have no relation for
    env = _env(
        "what languages are the movies starred by Bad Lieutenant actors", way_back_marks=True
    )
    assert not any("<-" in line for line in _at_the_actor(env)[1:])


def test_following_the_way_back_then_marks_the_named_relation():
    env = _env(ROUND_TRIP, way_back_marks=True)
    _at_the_actor(env)
    got = env.execute('get_triples("Harvey Keitel", ["starred_actors"])').text
    assert "(Mean Streets, starred_actors, Harvey Keitel)" in got
    listed = env.execute('get_relations("Mean Streets")').text.splitlines()
    assert listed[1] == "(Mean Streets, has_genre, ?) <- genres"


def test_the_way_back_mark_needs_the_focus_ranking():
    import pytest

    with pytest.raises(ValueError, match="way_back_marks"):
        ToolConfig(relation_ranking="bm25", way_back_marks=True)


LEADS_ON = "who acted in the movies directed by Bruce Beresford"


def _films(env: ToolEnvironment) -> list[str]:
    env.execute('get_relations("Bruce Beresford")')
    return env.execute('get_triples("Bruce Beresford", ["directed_by"])').text.splitlines()


def test_the_lead_on_order_lists_first_the_film_with_the_relation_named_next():
    assert _films(_env(LEADS_ON))[0].startswith("(Crimes of the Heart,")  # by name
    got = _films(_env(LEADS_ON, lead_on_order=True))
    assert got[0] == "(Paradise Road, directed_by, Bruce Beresford)"
    assert got[1] == "(Crimes of the Heart, directed_by, Bruce Beresford)"
    # the agent goes on from the first: its list marks the next hop
    env = _env(LEADS_ON, lead_on_order=True)
    _films(env)
    assert (
        "(Paradise Road, starred_actors, ?) <- acted"
        in env.execute('get_relations("Paradise Road")').text
    )


def test_the_lead_on_order_keeps_the_order_where_no_word_is_left():
    got = _films(_env("which movies did Bruce Beresford direct", lead_on_order=True))
    assert got[0].startswith("(Crimes of the Heart,")


def _neighbor(name: str):
    from kgsynth.kg.graph import Neighbor
    from kgsynth.kg.terms import Term

    return Neighbor(Term("iri", f"urn:{name}"), name)


def test_lead_on_first_moves_only_leads_of_its_pool_and_never_a_topic():
    followed = Relation("directed_by", "in", ("p",))
    has = {"urn:B": [Relation("starred_actors", "out", ("s",))], "urn:T": []}
    has["urn:T"] = has["urn:B"]
    words = {"act": FocusWord(1.0, "acted", 1)}
    ns = [_neighbor(n) for n in ("A", "T", "B")]
    got = lead_on_first(ns, followed, words, lambda iri: has.get(iri, []), topics=("T",))
    assert [n.name for n in got] == ["B", "A", "T"]
    assert lead_on_first(ns, followed, {}, lambda iri: has.get(iri, [])) == ns
    # the followed relation names nothing ahead (its words are used up)
    has["urn:B"] = [Relation("directed_by", "out", ("p",))]
    words = {"direct": FocusWord(1.0, "directed", 1)}
    assert lead_on_first(ns, followed, words, lambda iri: has.get(iri, [])) == ns


def test_irregular_past_forms_and_compounds_meet_the_relations_word():
    from kgsynth.agent.stemming import joins, stem
    from kgsynth.agent.strategies.focus import rank_relations_focused

    assert stem("wrote") == stem("written") == stem("writer") == "writ"
    assert joins(stem("screenwriter"), stem("written")) and not joins(stem("react"), "act")
    rels = [Relation("directed_by", "out", ("d",)), Relation("written_by", "out", ("w",))]
    for question, word in (
        ("who wrote Kismet", "wrote"),
        ("who is the screenwriter of Kismet", "screenwriter"),
    ):
        ranked = rank_relations_focused(question, rels, "Kismet", ())
        assert ranked[0] == (rels[1], (word,)) and ranked[1] == (rels[0], ())
    # following written_by uses the compound up: nothing is left to mark
    after = rank_relations_focused("the screenwriter of Kismet", rels, "Kismet", ("written_by",))
    assert all(marks == () for _, marks in after)


def test_a_round_trip_words_relation_goes_first_from_the_topic():
    from kgsynth.agent.strategies.focus import rank_relations_focused

    rels = [Relation("release_year", "out", ("y",)), Relation("directed_by", "out", ("d",))]
    question = "the films that share directors with the film Tarzan were released in which years"
    plain = rank_relations_focused(question, rels, "Tarzan", ())
    assert plain[0][0] == rels[0]  # "released" stands nearest the topic
    ranked = rank_relations_focused(question, rels, "Tarzan", (), round_trip={"share"})
    assert ranked[0] == (rels[1], ("directors",))
