"""The ``isp`` tool set (kgsynth.agent.spaces.isp.tools): ``node`` templates ranked against the
question, their answer counts and bounds, and ``sparql`` run through the guard, on the movie KG
fixture and small KGs built here."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.spaces.isp import tools as isp
from kgsynth.agent.tools import ErrorType, ToolEnvironment, ToolResult
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from tests.kgfixtures import LABEL, NS, E, R, freebase_kg, movie_kg, movie_ntriples

LINE = re.compile(r"^(\d+)\. (.+?) \(((?:at least )?\d+) answers?\): (.+)$")
ISP = AgentConfig(toolset="isp")


@pytest.fixture(scope="module")
def movies() -> EmbeddedKG:
    return movie_kg()


def env_for(kg: EmbeddedKG, question: str) -> ToolEnvironment:
    return ToolEnvironment(KGGraph(kg), question, ISP)


def templates(result: ToolResult, cut_ok: bool = False) -> list[tuple[str, str, str]]:
    """(shape, count, patterns) of each template line, in the order shown (after the notes,
    the header and the PREFIX lines); nothing truncated unless ``cut_ok``."""
    assert result.ok, result.text
    lines = result.text.splitlines()[len(result.notes) + 1 :]
    if cut_ok and lines[-1].startswith("[... truncated: "):
        lines = lines[:-1]
    rows = [LINE.match(line) for line in lines if not line.startswith("PREFIX ")]
    assert all(rows), result.text
    return [(m.group(2), m.group(3), m.group(4)) for m in rows if m]


def prefixes(result: ToolResult) -> str:
    return "\n".join(line for line in result.text.splitlines() if line.startswith("PREFIX "))


def run_patterns(env: ToolEnvironment, patterns: str, declared: str) -> list[str]:
    """The answers a template's patterns give when the agent runs them with ``sparql``, the
    observation's PREFIX lines declared."""
    query = f"{declared}\nSELECT DISTINCT ?x WHERE {{ {patterns} }}"
    result = env.execute(f"sparql({query!r})")
    assert result.ok, result.text
    return [] if result.text == "no rows" else result.text.splitlines()[1:]


def test_node_ranks_directed_by_first_among_one_hop_templates(movies: EmbeddedKG):
    env = env_for(movies, "who directed Kismet")
    result = env.execute('node("Kismet")')
    assert result.tool == "node" and result.entities == ("Kismet", f"{E}Kismet")
    assert result.text.splitlines()[:3] == [
        'Templates of "Kismet" (entity:Kismet), most similar to the question first; '
        "?x is the answer; a query declares the prefixes it uses:",
        f"PREFIX entity: <{E}>",
        f"PREFIX relation: <{R}>",
    ]
    shown = templates(result)
    one_hop = [t for t in shown if "?m" not in t[0]]
    assert one_hop == [
        ("Kismet -directed_by-> ?x", "1", "entity:Kismet relation:directed_by ?x ."),
        ("Kismet -starred_actors-> ?x", "2", "entity:Kismet relation:starred_actors ?x ."),
        ("Kismet -release_year-> ?x", "1", "entity:Kismet relation:release_year ?x ."),
    ]
    # the one two-hop template that reaches more than Kismet: films by the same director
    assert [t for t in shown if "?m" in t[0]] == [
        (
            "Kismet -directed_by-> ?m <-directed_by- ?x",
            "1",
            "entity:Kismet relation:directed_by ?m . ?x relation:directed_by ?m . "
            "FILTER(?x != entity:Kismet)",
        )
    ]
    declared = prefixes(result)
    for _, count, patterns in shown:  # every count is what the patterns return
        assert len(run_patterns(env, patterns, declared)) == int(count)
    assert run_patterns(env, one_hop[0][2], declared) == ["William Dieterle"]
    assert run_patterns(env, shown[0][2] if "?m" in shown[0][0] else shown[1][2], declared) == [
        "Juarez"
    ]


def test_two_hop_templates_in_both_directions_with_answer_counts(movies: EmbeddedKG):
    env = env_for(movies, "which actors starred in films directed by William Dieterle")
    result = env.execute('node("William Dieterle")')
    shown = templates(result)
    assert shown[0] == (
        "William Dieterle <-directed_by- ?m -starred_actors-> ?x",
        "3",
        "?m relation:directed_by entity:William%20Dieterle . ?m relation:starred_actors ?x .",
    )
    assert {shape: count for shape, count, _ in shown} == {
        "William Dieterle <-directed_by- ?m -starred_actors-> ?x": "3",
        "William Dieterle <-directed_by- ?m -release_year-> ?x": "2",
        "William Dieterle <-directed_by- ?m -has_genre-> ?x": "1",
        "William Dieterle <-directed_by- ?x": "2",
    }  # (<-directed_by- ?m -directed_by-> ?x) reaches only Dieterle himself: not shown
    assert sorted(run_patterns(env, shown[0][2], prefixes(result))) == [
        "Bette Davis",
        "Marlene Dietrich",
        "Ronald Colman",
    ]


def test_unknown_entity_and_entity_without_relations_are_typed_errors():
    nt = movie_ntriples() + f'<{E}Lonely> {LABEL} "Lonely" .\n'
    env = env_for(EmbeddedKG.from_ntriples(nt, get_profile("generic")), "who is Lonely")
    missing = env.execute('node("Nobody At All")')
    assert missing.error == ErrorType.ENTITY_NOT_FOUND and missing.tool == "node"
    assert missing.text.startswith('Error (entity not found): no entity named "Nobody At All"')
    bare = env.execute('node("Lonely")')
    assert bare.error == ErrorType.NO_RESULTS
    assert bare.text == 'Error (no results): "Lonely" has no relations to explore.'


def hub_kg(spokes: int = 25, members: int = 8) -> EmbeddedKG:
    """``Hub`` with ``spokes`` relations (one neighbour each, with one relation of its own) and
    ``Club`` with ``members`` neighbours along one relation (each with its own relation)."""
    facts = [("Hub", f"link_{i:02d}", f"Spoke {i}") for i in range(spokes)]
    facts += [(f"Spoke {i}", f"next_{i:02d}", f"Leaf {i}") for i in range(spokes)]
    facts += [("Club", "has_member", f"Member {i}") for i in range(members)]
    facts += [(f"Member {i}", f"role_{i:02d}", f"Role {i}") for i in range(members)]
    return EmbeddedKG.from_ntriples(movie_ntriples(facts), get_profile("generic"))


def test_top_ten_cap_and_first_hop_bound():
    env = env_for(hub_kg(), "what is linked to the hub")
    result = env.execute('node("Hub")')
    assert len(templates(result)) == isp.MAX_TEMPLATES == 10
    hub = env.graph.resolve("Hub")
    assert hub is not None
    ranker = isp.TemplateRanker(env.question, None)
    explored = isp.explore(env, hub.entity, ranker)
    one_hop = [t for t in explored if len(t.hops) == 1]
    two_hop = [t for t in explored if len(t.hops) == 2]
    assert len(one_hop) == 25
    # only the 20 best first hops are expanded; each reaches back (link_i in) and on (next_i)
    assert len({t.hops[0] for t in two_hop}) == isp.MAX_FIRST_HOP == 20
    assert len(two_hop) == 40
    assert len(isp.explore(env, hub.entity, ranker, max_first_hop=3)) == 25 + 6


def test_neighbours_per_first_hop_bound_and_lower_bound_counts():
    env = env_for(hub_kg(), "what roles do club members have")
    club = env.graph.resolve("Club")
    assert club is not None
    explored = isp.explore(env, club.entity, isp.TemplateRanker(env.question, None))
    two_hop = [t for t in explored if len(t.hops) == 2]
    roles = [t for t in two_hop if t.hops[1].name.startswith("role_")]
    assert len(roles) == isp.MAX_MIDS == 5  # 8 members, 5 of them looked at
    assert all(t.sampled and len(t.mids) == 1 for t in roles)
    shown = templates(env.execute('node("Club")'))
    assert ("Club -has_member-> ?x", "8") in [t[:2] for t in shown]
    role_lines = [t for t in shown if "-role_" in t[0]]
    assert len(role_lines) == 5 and all(t[1] == "at least 1" for t in role_lines)


class BrokenEncoder:
    def scores(self, question: str, relation_texts: Sequence[str]):
        raise OSError("model files missing")


def test_encoder_failure_falls_back_to_bm25_with_a_note(movies: EmbeddedKG):
    env = ToolEnvironment(KGGraph(movies), "who directed Kismet", ISP, dense=BrokenEncoder())
    result = env.execute('node("Kismet")')
    assert result.ok and result.notes == (isp.ENCODER_FALLBACK_NOTE,)
    assert result.text.splitlines()[0] == isp.ENCODER_FALLBACK_NOTE
    one_hop = [shape for shape, _, _ in templates(result) if "?m" not in shape]
    assert one_hop[0] == "Kismet -directed_by-> ?x"
    assert env.execute('node("Juarez")').notes == (isp.ENCODER_FALLBACK_NOTE,)


def test_flattened_relations_show_patterns_across_the_unnamed_node():
    env = env_for(freebase_kg(), "what films did Jeremy Irons act in")
    result = env.execute('node("Jeremy Irons")')
    assert prefixes(result) == "PREFIX ns: <http://rdf.freebase.com/ns/>"
    # Freebase's full relation IRIs fill the observation cap before ten templates
    shown = templates(result, cut_ok=True)
    film = next(
        t for t in shown if t[0] == "Jeremy Irons -film.actor.film.film.performance.film-> ?x"
    )
    assert film[1:] == (
        "1",
        f"ns:m.irons <{NS}film.actor.film> ?c1 . ?c1 <{NS}film.performance.film> ?x .",
    )
    assert run_patterns(env, film[2], prefixes(result)) == ["Dead Ringers"]


HOSTILE = {
    "DELETE WHERE { ?s ?p ?o }": ErrorType.QUERY_REFUSED,
    f'INSERT DATA {{ <{E}x> <{R}y> "z" }}': ErrorType.QUERY_REFUSED,
    "SELECT * WHERE { SERVICE <http://127.0.0.1:9/sparql> { ?s ?p ?o } }": ErrorType.QUERY_REFUSED,
    "CONSTRUCT { ?s ?p ?o } WHERE { ?s ?p ?o }": ErrorType.QUERY_REFUSED,
    "DESCRIBE ?s WHERE { ?s ?p ?o }": ErrorType.QUERY_REFUSED,
    "SELECT ?s WHERE { ?s ?p": ErrorType.QUERY_REFUSED,
}


@pytest.mark.parametrize("query", list(HOSTILE))
def test_hostile_sparql_is_a_typed_error_and_the_store_is_unchanged(query: str):
    kg = movie_kg()
    env, before = env_for(kg, "who directed Kismet"), len(kg.store)
    result = env.execute(f"sparql({query!r})")
    assert result.error == HOSTILE[query] and result.tool == "sparql", result.text
    assert result.text.startswith("Error (query refused): ")
    assert len(kg.store) == before == 24


def test_runaway_cross_join_times_out_as_a_typed_error():
    kg = movie_kg()
    env, before = env_for(kg, "who directed Kismet"), len(kg.store)
    env.tools = isp.make_tools(env, timeout=1e-6)
    runaway = "SELECT * WHERE { " + " ".join(f"?s{i} ?p{i} ?o{i} ." for i in range(6)) + " }"
    result = env.execute(f"sparql({runaway!r})")
    assert result.error == ErrorType.TIMEOUT, result.text
    assert len(kg.store) == before
    assert env.execute(f'sparql("ASK {{ <{E}Kismet> ?p ?o }}")').text == "true"


def test_good_sparql_returns_rows_by_name(movies: EmbeddedKG):
    env = env_for(movies, "which films did William Dieterle direct")
    query = (
        f"SELECT ?film WHERE {{ ?film <{R}directed_by> <{E}William%20Dieterle> }} ORDER BY ?film"
    )
    result = env.execute(f'sparql("{query}")')
    assert result.ok and result.tool == "sparql" and result.args == (query,)
    assert result.text == "?film\nJuarez\nKismet"
    assert result.entities == ("Juarez", "Kismet")
    capped = isp.make_tools(env, max_rows=2)["sparql"][1]("SELECT ?s WHERE { ?s ?p ?o }")
    assert capped.text.count("\n") == 3 and "more rows" in capped.text


def test_tool_help_names_both_operations_in_isps_format():
    assert [h["usage"] for h in isp.TOOL_HELP] == [
        "<node>Entity Name</node>",
        "<SPARQL>SELECT ... WHERE { ... }</SPARQL>",
    ]
    assert all(set(h) == {"usage", "description"} for h in isp.TOOL_HELP)


def test_a_wrong_number_of_arguments_is_wrong_arguments():
    from tests.kgfixtures import movie_kg

    env = ToolEnvironment(KGGraph(movie_kg()), "who directed Kismet", AgentConfig(toolset="isp"))
    result = env.execute('node("Kismet", "extra")')
    assert result.error == ErrorType.WRONG_ARGUMENTS
    assert result.text == "Error (wrong arguments): wrong arguments; use node(...)."
