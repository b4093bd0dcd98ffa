"""Agent tools: parsing, the two tool sets, typed errors, ranking, truncation, CVT flattening."""

import pytest

from kgsynth.agent.protocol import parse_answer
from kgsynth.agent.spaces import parse_turn
from kgsynth.agent.strategies.entities import near_names
from kgsynth.agent.toolcall import ToolCall, ToolCallSyntaxError, parse_tool_call
from kgsynth.agent.tools import ErrorType, ToolConfig, ToolEnvironment, rank_relations, truncate
from kgsynth.kg.graph import KGGraph, Relation
from tests.kgfixtures import freebase_kg, movie_kg


@pytest.fixture(scope="module")
def graph():
    return KGGraph(movie_kg())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('get_relations("Kismet")', ToolCall("get_relations", ("Kismet",))),
        ("get_relations('Kismet')", ToolCall("get_relations", ("Kismet",))),
        ('  get_relations (  "Kismet"  ) ', ToolCall("get_relations", ("Kismet",))),
        ("get_relations(“Amélie”)", ToolCall("get_relations", ("Amélie",))),
        ('get_relations("Schindler’s List")', ToolCall("get_relations", ("Schindler’s List",))),
        (
            "get_triples('Kismet', [\"directed_by\", 'release_year'])",
            ToolCall("get_triples", ("Kismet", ("directed_by", "release_year"))),
        ),
        ('get_relations("The "Best" Film")', ToolCall("get_relations", ('The "Best" Film',))),
        (
            'get_triples("Tom "T" O\'Neil", ["r"])',
            ToolCall("get_triples", ('Tom "T" O\'Neil', ("r",))),
        ),
        ('`get_relations("X")`', ToolCall("get_relations", ("X",))),
    ],
)
def test_parse_tool_call(text, expected):
    assert parse_tool_call(text) == expected


@pytest.mark.parametrize(
    "text", ["", "get_relations(", "get_relations(Kismet)", "1 + 2", "x = 3", "get_relations(42)"]
)
def test_parse_tool_call_errors(text):
    with pytest.raises(ToolCallSyntaxError):
        parse_tool_call(text)


def test_get_relations_both_directions_ranked(graph):
    env = ToolEnvironment(graph, "which movies did William Dieterle direct")
    res = env.execute('get_relations("William Dieterle")')
    assert res.ok and res.tool == "get_relations"
    assert res.text.splitlines()[1:] == ["(?, directed_by, William Dieterle)"]
    env = ToolEnvironment(graph, "what year was Kismet released")
    lines = env.execute('get_relations("Kismet")').text.splitlines()
    assert lines[1] == "(Kismet, release_year, ?)"  # BM25 puts the matching relation first
    assert sorted(lines[1:]) == sorted(
        ["(Kismet, directed_by, ?)", "(Kismet, starred_actors, ?)", "(Kismet, release_year, ?)"]
    )


def test_get_triples_limits_and_entities(graph):
    env = ToolEnvironment(graph, config=ToolConfig(max_triples_per_relation=1))
    res = env.execute('get_triples("Kismet", ["starred_actors", "directed_by"])')
    assert res.ok
    assert res.text.splitlines() == [
        "(Kismet, starred_actors, Marlene Dietrich)",
        "... 1 more (Kismet, starred_actors, ?)",
        "(Kismet, directed_by, William Dieterle)",
    ]
    assert res.entities == ("Kismet", "Marlene Dietrich", "William Dieterle")


def test_get_triples_inverse(graph):
    res = ToolEnvironment(graph).execute("get_triples('Bette Davis', ['starred_actors'])")
    assert res.text.splitlines() == [
        "(Jezebel, starred_actors, Bette Davis)",
        "(Juarez, starred_actors, Bette Davis)",
    ]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ('get_relations("Nobody")', ErrorType.ENTITY_NOT_FOUND),
        ('get_triples("Kismet", ["no_such_rel"])', ErrorType.RELATION_NOT_FOUND),
        ('get_triples("Kismet", [])', ErrorType.RELATION_NOT_FOUND),
        ('search("Kismet")', ErrorType.UNKNOWN_TOOL),
        ('get_relations("Kismet", "extra")', ErrorType.WRONG_ARGUMENTS),
        ("get_triples(['Kismet'], ['x'])", ErrorType.WRONG_ARGUMENTS),
        ("get_relations(Kismet", ErrorType.BAD_SYNTAX),
        ('get_relations("bad\x00name")', ErrorType.ENTITY_NOT_FOUND),
    ],
)
def test_typed_errors(graph, call, error):
    res = ToolEnvironment(graph).execute(call)
    assert res.error == error
    assert res.text.startswith("Error (")
    assert len(res.text) < 300


def test_partial_relation_match_reports_missing(graph):
    res = ToolEnvironment(graph).execute('get_triples("Juarez", ["directed_by", "bogus"])')
    assert res.ok and res.text.endswith('(not relations of "Juarez": bogus)')


def test_case_insensitive_resolution(graph):
    res = ToolEnvironment(graph).execute('get_relations("kISMET")')
    assert res.ok and 'Relations of "Kismet"' in res.text


def test_ambiguous_name_picks_highest_degree_and_reports():
    from kgsynth.kg.embedded import EmbeddedKG
    from kgsynth.kg.profiles import get_profile

    label = "<http://www.w3.org/2000/01/rdf-schema#label>"
    nt = f"""
<http://x/a> {label} "Twin" .
<http://x/b> {label} "Twin" .
<http://x/b> <http://x/r> <http://x/c> .
<http://x/b> <http://x/r> <http://x/d> .
<http://x/a> <http://x/r> <http://x/c> .
<http://x/c> {label} "C" .
<http://x/d> {label} "D" .
"""
    graph = KGGraph(EmbeddedKG.from_ntriples(nt, get_profile("generic")))
    resolution = graph.resolve("Twin")
    assert resolution.entity.iri == "http://x/b" and resolution.candidates == 2
    res = ToolEnvironment(graph).execute('get_triples("Twin", ["r"])')
    assert res.text.splitlines()[0].startswith("2 entities are named")
    assert "(Twin, r, D)" in res.text


def test_kgr1_toolset(graph):
    # the triples form, kept as a named variant (the paper's flat lists: test_kgr1_paper.py)
    env = ToolEnvironment(graph, config=ToolConfig(toolset="kgr1", kgr1_observation="triples"))
    assert env.execute('get_head_relations("William Dieterle")').text.splitlines()[1:] == [
        "(?, directed_by, William Dieterle)"
    ]
    assert env.execute('get_tail_relations("William Dieterle")').error == ErrorType.NO_RESULTS
    heads = env.execute('get_head_entities("William Dieterle", "directed_by")')
    assert heads.text.splitlines() == [
        "(Juarez, directed_by, William Dieterle)",
        "(Kismet, directed_by, William Dieterle)",
    ]
    tails = env.execute('get_tail_entities("Kismet", "directed_by")')
    assert tails.text == "(Kismet, directed_by, William Dieterle)"
    wrong_way = env.execute('get_tail_entities("William Dieterle", "directed_by")')
    assert wrong_way.error == ErrorType.RELATION_NOT_FOUND
    assert env.execute('get_relations("Kismet")').error == ErrorType.UNKNOWN_TOOL


def test_truncation_marker():
    text = "\n".join(f"line {i}" for i in range(100))
    cut = truncate(text, 50)
    assert len(cut) < 90 and cut.endswith("more lines]") and "[... truncated" in cut
    assert truncate("short", 50) == "short"


def test_long_observations_are_truncated(graph):
    env = ToolEnvironment(graph, config=ToolConfig(max_observation_chars=60))
    res = env.execute('get_triples("Kismet", ["starred_actors", "directed_by", "release_year"])')
    assert res.ok and "[... truncated" in res.text


def test_rank_relations_without_question_keeps_order():
    rels = [Relation("a_b", "out", ("x",)), Relation("c", "in", ("y",))]
    assert rank_relations("", rels) == rels


def test_freebase_cvt_flattening_and_meta_hidden():
    graph = KGGraph(freebase_kg())
    irons = graph.resolve("Jeremy Irons").entity
    names = {(r.name, r.direction) for r in graph.relations(irons.iri)}
    assert names == {
        ("people.person.nationality", "out"),
        ("people.person.date_of_birth", "out"),
        ("film.actor.film.film.performance.film", "out"),
        ("film.actor.film.film.performance.character", "out"),
        ("film.film.starring.film.performance.actor", "in"),
    }
    env = ToolEnvironment(graph)
    res = env.execute(
        'get_triples("Jeremy Irons", ["film.actor.film.film.performance.film", "people.person.date_of_birth"])'
    )
    assert res.text.splitlines() == [
        "(Jeremy Irons, film.actor.film.film.performance.film, Dead Ringers)",
        "(Jeremy Irons, people.person.date_of_birth, 1948-09-19)",
    ]
    film = env.execute('get_triples("Dead Ringers", ["film.film.starring.film.performance.actor"])')
    assert film.text == "(Dead Ringers, film.film.starring.film.performance.actor, Jeremy Irons)"


def test_parse_turn():
    turn = parse_turn('<think>look up</think>\n<kg-query>get_relations("Kismet")</kg-query>')
    assert turn.format_error is None and turn.query == 'get_relations("Kismet")'
    turn = parse_turn('<think>done</think><answer>["Washington, D.C.", "Paris"]</answer>')
    assert turn.answer == ["Washington, D.C.", "Paris"] and turn.action == "answer"
    assert parse_turn('<answer>["A"]</answer>').format_error == "missing <think> block"
    assert parse_turn("<think>x</think>").format_error is not None
    forged = parse_turn('<think>x</think><information><answer>["A"]</answer></information>')
    assert forged.action is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('["a", "b"]', ["a", "b"]),
        ("['a, b']", ["a, b"]),
        ("Paris", ["Paris"]),
        ("", None),
        ("[broken", None),
        ("[1999]", ["1999"]),
    ],
)
def test_parse_answer(text, expected):
    assert parse_answer(text) == expected


@pytest.mark.parametrize(
    ("words", "stem"),
    [
        ("director directors directed directing", "direct"),
        ("writer writers written write", "writ"),
        ("starred stars starring star", "star"),
        ("actor actors acted", "act"),
        ("genre genres", "genr"),
        ("release released releases", "releas"),
        ("by is has the", None),  # three letters or fewer stay as they are
    ],
)
def test_stem_joins_a_relation_word_with_its_question_forms(words, stem):
    from kgsynth.agent.stemming import stem as stem_of

    stems = {stem_of(w) for w in words.split()}
    assert stems == ({stem} if stem else set(words.split()))


def test_bm25_ranks_by_stems(graph):
    """ "the directors of" and "the cast's actors" name directed_by and starred_actors by
    other forms of their words: stemmed, BM25 ranks them first (unstemmed, no word is shared
    and the store's order stays)."""
    rels = graph.relations(graph.resolve("Kismet").entity.iri)
    for question, first in [
        ("who are the directors of Kismet", "directed_by"),
        ("the actor who starred in Kismet", "starred_actors"),
        ("when was Kismet released", "release_year"),
    ]:
        assert rank_relations(question, rels)[0].name == first, question


def test_hybrid_ranking_orders_relations_by_meaning(graph):
    """BM25 sees no shared word (or stem) between "performed" and starred_actors; the bundled
    sentence encoder does. A shared word still wins, and bm25 stays the default."""
    from kgsynth.agent.relrank import shared_scorer

    hybrid = ToolConfig(relation_ranking="hybrid")
    question = "who performed in Kismet"
    bm25_first = ToolEnvironment(graph, question).execute('get_relations("Kismet")')
    assert bm25_first.text.splitlines()[1] != "(Kismet, starred_actors, ?)"  # the store's order
    lines = ToolEnvironment(graph, question, hybrid).execute('get_relations("Kismet")').text
    assert lines.splitlines()[1] == "(Kismet, starred_actors, ?)"
    lines = ToolEnvironment(graph, "who directed Kismet", hybrid).execute('get_relations("Kismet")')
    assert lines.text.splitlines()[1] == "(Kismet, directed_by, ?)"
    # primed questions are encoded once, in a batch, and give the same scores
    scorer = shared_scorer()
    scorer.prime(["when did Kismet come out"])
    cached = scorer.question_vector("when did Kismet come out")
    assert cached.shape == scorer.question_vector("who acted in Kismet").shape
    with pytest.raises(ValueError, match="relation_ranking"):
        ToolConfig(relation_ranking="dense")  # type: ignore[arg-type]


def test_focus_weights_use_up_a_followed_relation_nearest_the_topic():
    """Following written_by from X uses "written" and "by" next to X; "starred" is left.
    A word said twice stays once for a second hop along the same relation."""
    from kgsynth.agent.strategies.focus import focus_weights

    question = "who starred in the films written by Nick Gian"
    before = focus_weights(question, "Nick Gian", ())
    assert before["writ"] == 0.5 and before["by"] == 1.0  # one word between "written" and X
    assert before["star"] == pytest.approx(1 / 6)
    after = focus_weights(question, "Nick Gian", ["written_by"])
    assert "writ" not in after and "by" not in after and "star" in after
    twice = "the year of the films whose director directed Kismet"
    assert "direct" in focus_weights(twice, "Kismet", ["directed_by"])
    assert "direct" not in focus_weights(twice, "Kismet", ["directed_by", "directed_by"])
    # no anchor in the question: every word weighs 1
    assert set(focus_weights(question, "Somebody Else", ()).values()) == {1.0}


def test_a_round_trip_word_keeps_the_first_relation_for_the_way_back(graph):
    """ "The same director as X" goes out along directed_by and back along it: where "same" is
    one of the agent's round-trip words the second list marks directed_by again, and the way
    back lists X itself last; without round-trip words the first hop uses "director" up."""
    from kgsynth.agent.strategies.focus import focus_weights

    words = ("same", "share", "together")
    for question in (
        "which films have the same director as Kismet",
        "what films share a director with Kismet",
        "who directed films together with William Dieterle",
        "which films shared their director with Kismet",  # the stem of "share"
    ):
        anchor = "Kismet" if "Kismet" in question else "William Dieterle"
        assert "direct" in focus_weights(question, anchor, ["directed_by"], words), question
        assert "direct" not in focus_weights(question, anchor, ["directed_by"] * 2, words)
        # no round-trip words (an agent whose questions had no walk that comes back)
        assert "direct" not in focus_weights(question, anchor, ["directed_by"]), question
    # without a round-trip word in the question the relation's words are used up by its hop
    assert "direct" not in focus_weights("who directed Kismet", "Kismet", ["directed_by"], words)

    focus = ToolConfig(relation_ranking="focus", round_trip_words=["Same"])
    assert focus.round_trip_words == ("same",)  # YAML's list, read in lower case
    env = ToolEnvironment(graph, "which films have the same director as Kismet", focus)
    env.execute('get_relations("Kismet")')
    env.execute('get_triples("Kismet", ["directed_by"])')
    second = env.execute('get_relations("William Dieterle")').text.splitlines()
    assert second[1] == "(?, directed_by, William Dieterle) <- director"
    back = env.execute('get_triples("William Dieterle", ["directed_by"])').text.splitlines()
    # Kismet shares the question's word "Kismet", yet the topic is listed after Juarez
    assert back == [
        "(Juarez, directed_by, William Dieterle)",
        "(Kismet, directed_by, William Dieterle)",
    ]
    plain = ToolEnvironment(graph, "which films have the same director as Kismet", focus)
    assert (
        plain.execute('get_triples("William Dieterle", ["directed_by"])')
        .text.splitlines()[0]
        .startswith("(Kismet")
    )  # no topic named yet (no get_relations of it): question order


def test_focus_ranking_puts_the_nearer_relation_first_even_between_two():
    """Two relations, each word in one of them: plain BM25's idf is 0 for both and keeps the
    store's order; focus ranks the one named next to the topic first."""
    from kgsynth.agent.strategies.focus import rank_relations_focused

    rels = [Relation("starred_actors", "in", ("x",)), Relation("written_by", "in", ("y",))]
    question = "who starred in the films written by Nick Gian"
    assert [r.name for r in rank_relations(question, rels)] == ["starred_actors", "written_by"]
    focused = rank_relations_focused(question, rels, "Nick Gian", ())
    assert [(r.name, marks) for r, marks in focused] == [
        ("written_by", ("written",)),  # "by" is weighed, but too short to show
        ("starred_actors", ("starred",)),
    ]
    after = rank_relations_focused(question, rels, "Nick Gian", ["written_by"])
    assert [(r.name, marks) for r, marks in after] == [
        ("starred_actors", ("starred",)),
        ("written_by", ()),
    ]
    done = rank_relations_focused(question, rels, "Nick Gian", ["written_by", "starred_actors"])
    assert all(marks == () for _, marks in done)  # nothing more is asked


def test_focus_marks_a_word_whose_stem_is_short():
    """The four-letter rule is on the word as written: "actors" and "tags" stem to "act" and
    "tag" and still mark the relation they name; "who" and "are" never do."""
    from kgsynth.agent.strategies.focus import rank_relations_focused

    rels = [Relation("has_tags", "out", ("x",)), Relation("starred_actors", "out", ("y",))]
    actors = rank_relations_focused("who are the actors in Fever Pitch", rels, "Fever Pitch", ())
    assert [(r.name, marks) for r, marks in actors] == [
        ("starred_actors", ("actors",)),
        ("has_tags", ()),
    ]
    acted = rank_relations_focused("who acted in Fever Pitch", rels, "Fever Pitch", ())
    assert acted[0] == (rels[1], ("acted",))
    tags = rank_relations_focused("which tags does Fever Pitch have", rels, "Fever Pitch", ())
    assert tags[0] == (rels[0], ("tags",))


def test_focus_ranking_follows_the_question_hop_by_hop(graph):
    """Kismet -directed_by-> William Dieterle <-directed_by- Juarez -release_year->: at Juarez
    plain BM25 ranks directed_by (the way back) first, focus the relation still asked for.
    Tree rollouts go back to a snapshot: the followed relations go back with it."""
    question = "the release year of the films whose director directed Kismet"
    plain = ToolEnvironment(graph, question)
    env = ToolEnvironment(graph, question, ToolConfig(relation_ranking="focus"))
    assert env.snapshot() is None  # an episode's start, as for the other rankings
    assert env.execute('get_relations("Kismet")').text.splitlines()[1:3] == [
        "(Kismet, directed_by, ?) <- directed",  # one word a stem: the nearest
        "(Kismet, release_year, ?) <- release, year",
    ]
    assert env.execute('get_triples("Kismet", ["directed_by"])').ok
    assert env.execute('get_relations("William Dieterle")').ok
    after_one = env.snapshot()
    assert env.execute('get_triples("William Dieterle", ["directed_by"])').ok
    assert plain.execute('get_relations("Juarez")').text.splitlines()[1] == (
        "(Juarez, directed_by, ?)"
    )
    assert env.execute('get_relations("Juarez")').text.splitlines()[1] == (
        "(Juarez, release_year, ?) <- release, year"
    )
    env.restore(after_one)
    assert env.strategies.ranking.followed == ("directed_by",)
    assert env.strategies.ranking.anchor == "Kismet"
    env.restore(None)
    assert env.strategies.ranking.followed == () and env.strategies.ranking.anchor is None
    with pytest.raises(ValueError, match="rerank must be none with --relation-ranking focus"):
        ToolConfig(relation_ranking="focus", rerank="llm")


def test_near_names_ranks_the_episode_context_by_similarity():
    question = "which films did William Dieterle direct?"
    assert near_names("William Deiterle", question, ())[0] == "William Dieterle"
    # a name an observation showed counts as much as the question's words
    assert near_names("Juarz", question, ("Juarez", "Kismet")) == ["Juarez"]
    assert near_names("Marlene Dietrich", question, ()) == []  # nothing near enough
    assert near_names("  ", question, ()) == []


def test_near_entity_matching_reads_a_misspelt_name_as_the_context_name(graph):
    """exact fails on a name the KG lacks; near reads it as the question's or an observation's
    most similar name, says so, and snapshots carry the names shown (tree rollouts)."""
    question = "the release year of the films whose director directed Kismet"
    exact = ToolEnvironment(graph, question)
    assert exact.execute('get_relations("Kismit")').error == ErrorType.ENTITY_NOT_FOUND
    env = ToolEnvironment(graph, question, ToolConfig(entity_matching="near"))
    res = env.execute('get_relations("Kismit")')
    lines = res.text.splitlines()
    assert res.ok and lines[:2] == [
        '(no entity named "Kismit": read as "Kismet")',
        'Relations of "Kismet" (showing 3 of 3, most relevant first):',
    ]
    assert res.notes == (lines[0],)
    start = env.snapshot()
    assert env.execute('get_triples("Kismet", ["directed_by"])').ok
    assert (
        "William Dieterle" in env.strategies.entities.shown
    )  # now a name of the episode's context
    res = env.execute('get_triples("Wiliam Dieterle", ["directed_by"])')
    assert res.ok and res.text.startswith(
        '(no entity named "Wiliam Dieterle": read as "William Dieterle")'
    )
    env.restore(start)
    assert env.strategies.entities.shown == ("Kismet",)
    assert env.execute('get_relations("Wiliam Dieterle")').error == ErrorType.ENTITY_NOT_FOUND
    # a name like nothing in the context fails as before
    assert env.execute('get_relations("Zzyzx Road")').error == ErrorType.ENTITY_NOT_FOUND
    with pytest.raises(ValueError, match="entity_matching must be exact or near"):
        ToolConfig(entity_matching="fuzzy")


def test_entity_matching_reaches_every_stage_config():
    """The option is the agent's: eval, synthesis and RL configs take it under its own name
    and hand it to the tool environment."""
    from kgsynth.eval.config import EvalConfig
    from kgsynth.synthesize.trajectory_config import TrajectoryConfig
    from kgsynth.train.grpo_config import GRPOConfig

    assert (
        EvalConfig(agent=ToolConfig(entity_matching="near")).tool_config().entity_matching == "near"
    )
    assert (
        TrajectoryConfig(agent=ToolConfig(entity_matching="near")).tool_config().entity_matching
        == "near"
    )
    assert GRPOConfig(agent=ToolConfig(entity_matching="near")).agent.entity_matching == "near"
    assert EvalConfig().tool_config().entity_matching == "exact"


def test_near_entity_matching_in_the_isp_and_sexpr_tool_sets(graph):
    """Every tool that looks an entity up by name reads it the same way."""
    question = "who directed Kismet"
    near = ToolConfig(toolset="sexpr", entity_matching="near")
    res = ToolEnvironment(graph, question, near).execute(
        "Find_relation [ Kismit | (R directed_by) ]"
    )
    assert res.ok and res.text.splitlines()[0] == '(no entity named "Kismit": read as "Kismet")'
    assert "William Dieterle" in res.text
    exact = ToolConfig(toolset="sexpr")
    res = ToolEnvironment(graph, question, exact).execute(
        "Find_relation [ Kismit | (R directed_by) ]"
    )
    assert not res.ok
    isp = ToolConfig(toolset="isp", entity_matching="near")
    res = ToolEnvironment(graph, question, isp).execute('node("Kismit")')
    assert res.ok and '(no entity named "Kismit": read as "Kismet")' in res.text
