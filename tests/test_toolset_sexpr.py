"""The ``sexpr`` tool set (KBQA-R1's S-expression actions, kgsynth.agent.spaces.sexpr.tools): each
action's observation and S-expression, expression numbering, typed errors, and RRCG relation
gating with the shipped MiniLM, on the movie KG fixture and a small KG with typed literals."""

from __future__ import annotations

import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.prompt import system_prompt
from kgsynth.agent.spaces.sexpr import tools as sexpr
from kgsynth.agent.spaces.sexpr.gate import (
    CORRECTED,
    EXACT,
    REJECTED,
    TENTATIVE,
    Candidate,
    WordOverlapScorer,
    gate,
)
from kgsynth.agent.spaces.sexpr.syntax import ActionSyntaxError, parse_action
from kgsynth.agent.toolkit import ToolFailure
from kgsynth.agent.tools import ErrorType, ToolEnvironment
from kgsynth.core.errors import ConfigError
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from tests.kgfixtures import LABEL, E, R, movie_kg

SEXPR = AgentConfig(toolset="sexpr")
XSD = "http://www.w3.org/2001/XMLSchema#"
RDF_TYPE = "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>"
KISMET = f"<{E}Kismet>"
DIETERLE = f"<{E}William%20Dieterle>"


def _films_nt() -> str:
    """Four films with dates, runtimes (typed literals) and a class; two entities named Twin."""
    lines = []

    def name(key: str, text: str) -> None:
        lines.append(f'<{E}{key}> {LABEL} "{text}" .')

    films = {  # key: (director, release date, runtime)
        "Alpha": ("Ann", "1990-05-01", 120),
        "Beta": ("Ann", "1994-07-02", 95),
        "Gamma": ("Ann", "1994-01-15", 140),
        "Delta": ("Bo", "2001-03-03", 100),
    }
    for film, (director, date, runtime) in films.items():
        name(film, film)
        lines.append(f"<{E}{film}> <{R}directed_by> <{E}{director}> .")
        lines.append(f'<{E}{film}> <{R}release_date> "{date}"^^<{XSD}date> .')
        lines.append(f'<{E}{film}> <{R}runtime> "{runtime}"^^<{XSD}integer> .')
        lines.append(f"<{E}{film}> {RDF_TYPE} <{R}Film> .")
    name("Ann", "Ann Lee")
    name("Bo", "Bo Chen")
    for person in ("Ann", "Bo"):
        lines.append(f"<{E}{person}> {RDF_TYPE} <{R}Person> .")
    name("Twin1", "Twin")  # the one with more facts wins
    name("Twin2", "Twin")
    lines.append(f"<{E}Twin1> <{R}directed_by> <{E}Ann> .")
    lines.append(f'<{E}Twin1> <{R}runtime> "80"^^<{XSD}integer> .')
    lines.append(f"<{E}Twin2> <{R}directed_by> <{E}Bo> .")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def movies() -> KGGraph:
    return KGGraph(movie_kg())


@pytest.fixture(scope="module")
def films() -> KGGraph:
    return KGGraph(EmbeddedKG.from_ntriples(_films_nt(), get_profile("generic")))


def env_for(graph: KGGraph, question: str = "", **config) -> ToolEnvironment:
    return ToolEnvironment(graph, question, AgentConfig(toolset="sexpr", **config))


def lines(text: str) -> list[str]:
    return text.splitlines()


# --- actions, observations, expressions -------------------------------------------------------


def test_find_relation_forwards_and_backwards_with_its_observation(movies: KGGraph):
    env = env_for(movies, "which films did the director of Kismet make")
    first = env.execute("Find_relation [ Kismet | (R directed_by) ]")
    assert (
        first.ok and first.tool == "Find_relation" and first.args == ("Kismet", "(R directed_by)")
    )
    assert lines(first.text) == [
        f"expression1 = (JOIN (R directed_by) {KISMET})",
        "1 result: William Dieterle",
        "Relations of expression1 (showing 1 of 1, most relevant first): directed_by",
    ]
    assert first.entities == ("Kismet", "William Dieterle")
    second = env.execute("Action2: find_relation [ expression1 | directed_by ]")
    assert lines(second.text)[:2] == [
        f"expression2 = (JOIN directed_by (JOIN (R directed_by) {KISMET}))",
        "2 results: Juarez; Kismet",
    ]
    relations = lines(second.text)[2]
    assert relations.startswith("Relations of expression2 (showing 4 of 4, most relevant first): ")
    assert set(relations.split(": ")[1].split(", ")) == {
        "(R directed_by)", "(R has_genre)", "(R release_year)", "(R starred_actors)"
    }  # fmt: skip
    # MetaQA's years are entities named "1944": a number attribute all the same
    assert lines(second.text)[3] == (
        "Attributes of expression2 (for Order, Compare, Time_constraint): release_year (number)"
    )
    assert [e.name for e in env.session.expressions] == ["expression1", "expression2"]


def test_order_compare_merge_time_and_count_on_the_movie_kg(movies: KGGraph):
    env = env_for(movies)
    env.execute("Find_relation [ William Dieterle | directed_by ]")  # Juarez 1939, Kismet 1944
    latest = env.execute("ORDER [ argmax | expression1 | release_year ]")
    assert lines(latest.text)[:2] == [
        f"expression2 = (ARGMAX (JOIN directed_by {DIETERLE}) release_year)",
        "1 result: Kismet",
    ]
    after = env.execute("Compare [ gt | release_year | 1938 ]")
    assert lines(after.text)[:2] == [
        "expression3 = (gt release_year 1938)",
        "2 results: Juarez; Kismet",
    ]
    both = env.execute("Merge [ expression1 | expression3 ]")
    assert lines(both.text)[0] == (
        f"expression4 = (AND (JOIN directed_by {DIETERLE}) (gt release_year 1938))"
    )
    year = env.execute("Time_constraint [ release_year | 1939 ]")  # on the latest: expression4
    assert lines(year.text)[:2] == [
        f"expression5 = (TC (AND (JOIN directed_by {DIETERLE}) (gt release_year 1938)) "
        "release_year 1939)",
        "1 result: Juarez",
    ]
    count = env.execute("Count [ expression1 ]")
    assert lines(count.text) == [f"expression6 = (COUNT (JOIN directed_by {DIETERLE}))", "Count: 2"]
    assert count.entities == ("2",)
    # a count is no set: it cannot be followed, merged or counted again
    again = env.execute("Count [ expression6 ]")
    assert again.error == ErrorType.WRONG_ARGUMENTS and "is a count" in again.text


def test_typed_literals_dates_numbers_classes_and_literal_operands(films: KGGraph):
    env = env_for(films, "which of Ann Lee's films is the longest")
    ann = env.execute("Find_relation [ Ann Lee | directed_by ]")
    assert lines(ann.text)[1] == "4 results: Alpha; Beta; Gamma; Twin"
    assert lines(ann.text)[-1] == (
        "Attributes of expression1 (for Order, Compare, Time_constraint): "
        "release_date (date), runtime (number)"
    )
    assert "1 result: Gamma" in env.execute("Order [ argmax | expression1 | runtime ]").text
    assert "1 result: Alpha" in env.execute("Order [ argmin | expression1 | release_date ]").text
    over = env.execute("Compare [ gt | runtime | 100 ]")  # over every film: Delta runs 100
    assert lines(over.text)[:2] == ["expression4 = (gt runtime 100)", "2 results: Alpha; Gamma"]
    dated = env.execute("Compare [ ge | release_date | 1994-02-01 ]")
    assert lines(dated.text)[1] == "2 results: Beta; Delta"
    in_year = env.execute("Time_constraint [ release_date | 1994 ]")  # on expression5
    assert lines(in_year.text)[:2] == [
        "expression6 = (TC (ge release_date 1994-02-01) release_date 1994)",
        "1 result: Beta",
    ]
    films_only = env.execute("Merge [ expression1 | Film ]")  # a class on one side: no Twin
    assert lines(films_only.text)[:2] == [
        f"expression7 = (AND (JOIN directed_by <{E}Ann>) Film)",
        "3 results: Alpha; Beta; Gamma",
    ]
    runtimes = env.execute("Find_relation [ expression1 | (R runtime) ]")
    assert lines(runtimes.text)[1] == "4 results: 120; 140; 80; 95"
    assert runtimes.entities == ("120", "140", "80", "95")
    typed = env.execute(f"Find_relation [ 120^^{XSD}integer | runtime ]")
    assert lines(typed.text)[:2] == [
        f"expression9 = (JOIN runtime 120^^{XSD}integer)",
        "1 result: Alpha",
    ]
    bare = env.execute("Find_relation [ 95 | runtime ]")  # no entity is named 95: a number
    assert lines(bare.text)[:2] == ["expression10 = (JOIN runtime 95)", "1 result: Beta"]


def test_an_ambiguous_name_uses_the_entity_with_most_facts_and_says_so(films: KGGraph):
    env = env_for(films)
    result = env.execute("Find_relation [ Twin | (R directed_by) ]")
    assert lines(result.text)[:3] == [
        '2 entities are named "Twin"; using the one with the most facts.',
        f"expression1 = (JOIN (R directed_by) <{E}Twin1>)",
        "1 result: Ann Lee",
    ]
    assert result.notes == ('2 entities are named "Twin"; using the one with the most facts.',)


def test_a_failed_action_makes_no_expression_and_numbering_goes_on(movies: KGGraph):
    env = env_for(movies)
    assert env.execute("Find_relation [ Kismet | (R directed_by) ]").ok
    assert env.execute("Find_relation [ Kismet | banana ]").error == ErrorType.RELATION_NOT_FOUND
    assert [e.number for e in env.session.expressions] == [1]
    # a tentative match (KBQA-R1's middle band) runs, and makes the next expression
    assert env.execute("Find_relation [ Kismet | director ]").ok
    assert [e.number for e in env.session.expressions] == [1, 2]
    third = env.execute("Find_relation [ Kismet | (R starred_actors) ]")
    assert lines(third.text)[0].startswith("expression3 = (JOIN (R starred_actors) ")


def test_every_typed_error(movies: KGGraph):
    env = env_for(movies)
    env.execute("Find_relation [ Kismet | (R directed_by) ]")
    cases = {
        "": ErrorType.BAD_SYNTAX,
        "garbage": ErrorType.BAD_SYNTAX,
        "Find_relation [ Kismet | directed_by ] Count [ expression1 ]": ErrorType.BAD_SYNTAX,
        "Find_relation [ Kismet | directed_by ]\nCount [ expression1 ]": ErrorType.BAD_SYNTAX,
        "Find_path [ Kismet | directed_by ]": ErrorType.UNKNOWN_TOOL,
        "Find_relation [ Kismet ]": ErrorType.WRONG_ARGUMENTS,
        "Order [ biggest | expression1 | release_year ]": ErrorType.WRONG_ARGUMENTS,
        "Count [ expression7 ]": ErrorType.WRONG_ARGUMENTS,
        "Merge [ Kismet | Juarez ]": ErrorType.WRONG_ARGUMENTS,
        "Compare [ gt | release_year | soon ]": ErrorType.WRONG_ARGUMENTS,
        "Time_constraint [ release_year | last year ]": ErrorType.WRONG_ARGUMENTS,
        "Find_relation [ Nobody At All | directed_by ]": ErrorType.ENTITY_NOT_FOUND,
        "Find_relation [ Kismet | banana ]": ErrorType.RELATION_NOT_FOUND,
        "Find_relation [ expression1 | (R banana) ]": ErrorType.RELATION_NOT_FOUND,
        "Time_constraint [ release_year | 1800 ]": ErrorType.RELATION_NOT_FOUND,
    }
    for action, error in cases.items():
        result = env.execute(action)
        assert result.error == error, (action, result.text)
        assert result.text.startswith(f"Error ({error.value.replace('_', ' ')}): ")
    assert "use Find_relation [ Entity Name or expressionN | relation or (R relation) ]" in (
        env.execute("Find_relation [ Kismet ]").text
    )
    assert "available: Find_relation, Merge, Order, Compare, Time_constraint, Count" in (
        env.execute("Find_path [ x ]").text
    )
    assert "the expressions so far are expression1 to expression1" in (
        env.execute("Count [ expression7 ]").text
    )
    assert len(env.session.expressions) == 1  # none of them made an expression


def test_no_results_timeout_and_refused_queries_are_typed(movies: KGGraph):
    env = env_for(movies)
    env.execute("Find_relation [ William Dieterle | directed_by ]")  # 1939 and 1944
    empty = env.execute("Time_constraint [ release_year | 1950 ]")
    assert empty.error == ErrorType.NO_RESULTS and "has no results; no expression was made" in (
        empty.text
    )
    slow = env_for(movies)
    slow.tools = sexpr.make_tools(slow, timeout=1e-6)
    timed_out = slow.execute("Find_relation [ Kismet | (R directed_by) ]")
    assert timed_out.error == ErrorType.TIMEOUT, timed_out.text
    # the compiler only writes SELECTs; a refused query (the guard) is typed all the same
    tools = sexpr.SExprTools(env, 5.0, 10)
    with pytest.raises(ToolFailure) as refused:
        tools._rows("DELETE WHERE { ?s ?p ?o }", 10)
    assert refused.value.error == ErrorType.QUERY_REFUSED


def test_a_long_result_is_cut_and_its_total_counted(movies: KGGraph):
    from tests.kgfixtures import generated_movie_facts, movie_ntriples

    graph = KGGraph(
        EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))
    )
    env = env_for(graph)
    env.tools = sexpr.make_tools(env, max_rows=25)
    result = env.execute("Compare [ ge | release_year | 1990 ]")  # all 40 films
    assert lines(result.text)[1].startswith("40 results, the first 20: ")
    assert len(lines(result.text)[1].split(": ")[1].split("; ")) == 20
    env2 = env_for(graph, max_observation_chars=200)
    cut = env2.execute("Compare [ ge | release_year | 1990 ]")
    assert cut.text.splitlines()[-1].startswith("[... truncated: ")


def test_action_syntax_reads_kbqa_r1s_brackets():
    assert parse_action("Action3: Find_relation [ A | B | (R rel) ]").args == ("A | B", "(R rel)")
    assert parse_action("  action 12 :  COUNT[expression2]  ").name == "Count"
    assert parse_action("merge [ expression1 |  expression2 ]").args == (
        "expression1",
        "expression2",
    )
    assert parse_action("Time_Constraint [ date | 1990 ]").name == "Time_constraint"
    for bad in ("", "Count expression1", "Find_relation ( a | b )", "[ a | b ]"):
        with pytest.raises(ActionSyntaxError):
            parse_action(bad)


def test_the_system_prompt_names_the_actions():
    text = system_prompt("sexpr", 4)
    for usage in (
        "Find_relation [ Entity Name or expressionN | relation or (R relation) ]",
        "Merge [ expressionA | expressionB ]",
        "Order [ argmax or argmin | expressionN | attribute ]",
        "Compare [ lt, le, gt or ge | attribute | value ]",
        "Time_constraint [ attribute | year ]",
        "Count [ expressionN ]",
    ):
        assert usage in text and usage in system_prompt("sexpr", 4, "short")
    assert "<action>" in text and "<kg-query>" not in text and "at most 4 turns" in text


# --- RRCG: relation gating -----------------------------------------------------------------------


def test_gating_bands_with_the_real_minilm(movies: KGGraph):
    env = env_for(movies, "who directed Kismet")
    exact = env.execute("Find_relation [ Kismet | (R directed_by) ]")
    assert exact.ok and lines(exact.text)[0].startswith("expression1 = ")
    # the same words, the other way round: similarity 1.00 >= 0.95, the candidate is used
    # without annotation (KBQA-R1 §IV-A3's auto-validation)
    corrected = env.execute("Find_relation [ William Dieterle | (R directed_by) ]")
    assert lines(corrected.text)[0] == f"expression2 = (JOIN directed_by {DIETERLE})"
    spelled = env.execute("Find_relation [ Kismet | Directed By ]")
    assert lines(spelled.text)[0] == f"expression3 = (JOIN (R directed_by) {KISMET})"
    # 0.3 <= 0.58 < 0.95: run tentatively with the best match, the note lists the candidates
    gated = env.execute("Find_relation [ Kismet | director ]")
    assert gated.ok and gated.tool == "Find_relation"
    assert gated.text.startswith(
        'note: "Kismet" has no relation director; tentatively substituted (R directed_by) '
        "(similarity 0.58, below 0.95)"
    )
    assert "Top candidates: (R directed_by) (0.58)" in gated.text
    assert lines(gated.text)[1] == f"expression4 = (JOIN (R directed_by) {KISMET})"
    assert len(env.session.expressions) == 4
    # below 0.3: not found, every candidate listed with its similarity
    rejected = env.execute("Find_relation [ Kismet | banana ]")
    assert rejected.error == ErrorType.RELATION_NOT_FOUND and "by similarity: " in rejected.text
    # attributes are gated too: "year" is 0.71 from release_year; "release year" is it
    env.execute("Find_relation [ William Dieterle | directed_by ]")  # expression5
    year = env.execute("Order [ argmax | expression5 | year ]")
    assert year.ok and "tentatively substituted release_year (similarity 0.71" in year.text
    assert "1 result: Kismet" in year.text
    words = env.execute("Order [ argmax | expression5 | release year ]")
    assert "note:" not in words.text and "1 result: Kismet" in words.text
    # thresholds are options: with gate_low 0.6 "director" (0.58) is not found
    strict = env_for(movies, gate_low=0.6)
    assert strict.execute("Find_relation [ Kismet | director ]").error == (
        ErrorType.RELATION_NOT_FOUND
    )


def test_gate_threshold_arithmetic_with_the_word_overlap_scorer():
    """The bands at their edges, with the stand-in scorer (shared words / all words)."""
    cands = [
        Candidate("release_year", "release year", "year"),
        Candidate("release_date", "release date", "date", preferred=False),
        Candidate("runtime", "runtime", "runtime"),
    ]
    words = WordOverlapScorer()
    assert words.scores("release year", ["release year", "release date", "runtime"]) == [
        1.0, 1 / 3, 0.0
    ]  # fmt: skip
    exact = gate("x", cands, words, high=0.95, low=0.3, is_exact=lambda c: c.text == "runtime")
    assert (exact.band, exact.chosen.key) == (EXACT, "runtime")
    top = gate("release year", cands, words, high=1.0, low=0.3)  # at tau_high exactly
    assert (top.band, top.chosen.key, top.best) == (CORRECTED, "year", 1.0)
    half = gate("year", cands, words, high=0.95, low=0.5)  # 1/2 at tau_low exactly
    assert (half.band, half.chosen.key) == (TENTATIVE, "year")
    assert [c.key for c, _ in half.ranked] == ["year", "runtime", "date"]  # 0.0 ties: preferred
    below = gate("year", cands, words, high=0.95, low=0.51)
    assert below.band == REJECTED and below.chosen is None and below.best == 0.5
    assert len(below.ranked) == 3  # every candidate, with its score
    # a tie goes to the preferred candidate (the direction written)
    tie = gate("release", cands[:2], words, high=0.95, low=0.3)
    assert tie.band == TENTATIVE and tie.chosen.key == "year"
    assert gate("x", [], words, high=0.95, low=0.3).band == REJECTED
    with pytest.raises(ValueError, match="low < high"):
        gate("x", cands, words, high=0.3, low=0.3)


def test_gate_thresholds_are_checked_options():
    assert (SEXPR.gate_high, SEXPR.gate_low) == (0.95, 0.3)
    with pytest.raises(ConfigError, match="gate_low must be below gate_high"):
        AgentConfig(toolset="sexpr", gate_high=0.5, gate_low=0.6)
    with pytest.raises(ConfigError, match="--gate-high"):
        AgentConfig(gate_high=1.5)


def test_an_unloadable_encoder_falls_back_to_shared_words(movies: KGGraph):
    class Broken:
        def scores(self, question, texts):
            raise OSError("model files missing")

    env = ToolEnvironment(movies, "", SEXPR, dense=Broken())
    result = env.execute("Find_relation [ Kismet | directed ]")  # 1 of 2 words: 0.5
    assert result.ok and "matched by shared words" in result.text
    assert "(R directed_by) (0.50)" in result.text


# --- the episode's state --------------------------------------------------------------------------


def test_each_environment_has_its_own_expressions_and_branches_restore_theirs(movies: KGGraph):
    one, two = env_for(movies), env_for(movies)
    one.execute("Find_relation [ Kismet | (R directed_by) ]")
    assert two.execute("Count [ expression1 ]").error == ErrorType.WRONG_ARGUMENTS
    root = one.snapshot()
    one.execute("Find_relation [ expression1 | directed_by ]")  # Juarez, Kismet
    branch_a = one.snapshot()
    one.restore(root)  # a sibling branch starts from the same parent
    sibling = one.execute("Find_relation [ Kismet | (R starred_actors) ]")
    assert lines(sibling.text)[:2] == [
        f"expression2 = (JOIN (R starred_actors) {KISMET})",
        "2 results: Marlene Dietrich; Ronald Colman",
    ]
    one.restore(branch_a)  # back on the first branch, its expression2 is the films
    years = one.execute("Find_relation [ expression2 | (R release_year) ]")
    assert lines(years.text)[:2] == [
        f"expression3 = (JOIN (R release_year) (JOIN directed_by (JOIN (R directed_by) {KISMET})))",
        "2 results: 1939; 1944",
    ]
    one.restore(None)
    assert one.session.expressions == []
    assert ToolEnvironment(movies).snapshot() is None  # the stateless sets keep none


def test_tree_branches_keep_their_own_expressions(movies: KGGraph, tmp_path):
    """Tree rollouts share one environment per question: each branch's step runs on its
    parent's expressions (ToolEnvironment.restore), not on its last sibling's."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kgsynth.agent.loop import EpisodeTask
    from kgsynth.agent.rollout import RolloutConfig, TokenPolicy
    from kgsynth.agent.tree import run_tree_rollouts
    from tests.kgfixtures import tiny_agent_model

    path = tiny_agent_model(tmp_path, vocab_size=600)
    policy = TokenPolicy(
        AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    )
    directed = "<think>a</think><action>Find_relation [ Kismet | (R directed_by) ]</action>"
    starred = "<think>b</think><action>Find_relation [ Kismet | (R starred_actors) ]</action>"
    script = [
        [directed, starred, directed.replace(">a<", ">c<")],  # the third: pruned
        [
            "<think>d</think><action>Find_relation [ expression1 | directed_by ]</action>",
            '<think>e</think><answer>"William Dieterle"</answer>',
            "<think>f</think><action>Find_relation [ expression1 | starred_actors ]</action>",
            '<think>g</think><answer>"Ronald Colman"</answer>',
        ],
    ]
    calls = {"n": 0}

    def sample(batch, *, max_new_tokens, temperature, top_p):
        texts = script[min(calls["n"], len(script) - 1)]
        calls["n"] += 1
        return [(policy.encode(texts[i % len(texts)]), [0.0] * 0, False) for i in range(len(batch))]

    policy.sample = sample
    (tree,) = run_tree_rollouts(
        policy,
        [EpisodeTask("who directed Kismet?", ["Kismet"])],
        lambda t: ToolEnvironment(movies, t.question, SEXPR),
        RolloutConfig(toolset="sexpr", max_turns=2, max_turn_tokens=64, max_obs_tokens=256),
        branches=3,
        max_live=4,
    )
    observed: dict[str, str] = {}  # each step's first observation (a forced last turn has none)
    for n in tree.nodes[1:]:
        turn = n.episode.turns[-1]
        if turn.observation:
            observed.setdefault(turn.think or "", turn.observation)
    assert observed["a"].startswith(f"expression1 = (JOIN (R directed_by) {KISMET})")
    assert observed["b"].startswith(f"expression1 = (JOIN (R starred_actors) {KISMET})")
    assert observed["d"].startswith(
        f"expression2 = (JOIN directed_by (JOIN (R directed_by) {KISMET}))\n2 results: Juarez; Kismet"
    )
    assert observed["f"].startswith(
        f"expression2 = (JOIN starred_actors (JOIN (R starred_actors) {KISMET}))\n1 result: Kismet"
    )
    assert tree.pruned >= 1 and torch is not None


def test_a_relation_only_unsampled_members_have_is_still_exact():
    """Relations and attributes are read from a set's first members; one the others alone
    have is tried on the whole set before it is gated."""
    facts = [(f"Film {i:02d}", "directed_by", "Dee") for i in range(14)]
    facts += [("Film 13", "written_by", "Wes"), ("Film 13", "release_year", "1999")]
    from tests.kgfixtures import movie_ntriples

    env = env_for(KGGraph(EmbeddedKG.from_ntriples(movie_ntriples(facts), get_profile("generic"))))
    films = env.execute("Find_relation [ Dee | directed_by ]")
    assert (
        lines(films.text)[1].startswith("14 results, the first 14: ") or "14 results" in films.text
    )
    assert "written_by" not in films.text and "Attributes" not in films.text  # not sampled
    writer = env.execute("Find_relation [ expression1 | (R written_by) ]")
    assert lines(writer.text)[:2] == [
        f"expression2 = (JOIN (R written_by) (JOIN directed_by <{E}Dee>))",
        "1 result: Wes",
    ]
    latest = env.execute("Order [ argmax | expression1 | release_year ]")
    assert "1 result: Film 13" in latest.text and "note:" not in latest.text
    # a relation no member has is still gated
    assert "tentatively substituted" in env.execute("Find_relation [ expression1 | written ]").text
