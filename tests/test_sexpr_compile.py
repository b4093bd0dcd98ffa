"""S-expressions (kgsynth.kg.sexpr): parse/to_text, the atoms, and the compiled SPARQL run on
real pyoxigraph stores against answers worked out by hand.

Three KGs: the MetaQA-like movie KG (years are entities named "1944") with one more 1939 film
for ties; a generic KG written here with xsd:integer/decimal/date/dateTime/gYear literals, a
plain "1800" and rdf:type classes; the Freebase-like KG with a CVT node. Every compiled query
is checked to pass the read-only guard unchanged. One test runs the same expressions on a
real Oxigraph server and Virtuoso 7.2 (about 4 s; skipped where Virtuoso is not installed).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kgsynth.agent.sparql_exec import query_form, run_agent_query
from kgsynth.core.errors import RowLimitError
from kgsynth.kg import guard
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from kgsynth.kg.sexpr import (
    SExprError,
    compile_sparql,
    entity_atom,
    execute,
    literal_atom,
    parse,
    quote,
    relation_atom,
    to_text,
    unquote,
)
from tests.kgfixtures import MOVIE_FACTS, freebase_kg, movie_ntriples

XSD = "http://www.w3.org/2001/XMLSchema#"
E = "http://kgsynth.org/entity/"
R = "http://kgsynth.org/relation/"
FB = "http://rdf.freebase.com/ns/"
GENERIC = get_profile("generic")
FREEBASE = get_profile("freebase")
MOTTO = 'say "hi" \\ } \n done'  # quotes, a backslash, a brace and a line break

# Dark Victory (1939) ties Juarez for Bette Davis's latest film.
MOVIE_FACTS_TIE = [
    *MOVIE_FACTS,
    ("Dark Victory", "starred_actors", "Bette Davis"),
    ("Dark Victory", "release_year", "1939"),
    ("Dark Victory", "has_genre", "Drama"),
]


def _nt(s: str, p: str, o: str) -> str:
    return f"<{E}{s}> <{p}> {o} ."


def _typed(value: str, dt: str) -> str:
    return f'"{value}"^^<{XSD}{dt}>'


CITIES = {  # name: (population literal, founded literal, class)
    "Springfield": (_typed("30000", "integer"), _typed("1850-04-12", "date"), "City"),
    "Shelbyville": (_typed("12000", "integer"), _typed("1901-01-01", "date"), "City"),
    "Ogdenville": (_typed("30000", "integer"), _typed("1850-09-30", "date"), "City"),
    "Capital_City": (_typed("2500.5", "decimal"), _typed("1790", "gYear"), "City"),
    "Hudson": (None, _typed("1850-06-01T10:30:00", "dateTime"), "River"),
}
GENERIC_NT = "\n".join(
    [
        line
        for name, (population, founded, cls) in CITIES.items()
        for line in (
            _nt(name, "http://www.w3.org/2000/01/rdf-schema#label", f'"{name.replace("_", " ")}"'),
            _nt(name, "http://www.w3.org/1999/02/22-rdf-syntax-ns#type", f"<{E}{cls}>"),
            _nt(name, R + "founded", founded),
            *([_nt(name, R + "population", population)] if population else []),
            _nt("Freedonia", R + "contains", f"<{E}{name}>"),
        )
    ]
    + [
        _nt("Freedonia", "http://www.w3.org/2000/01/rdf-schema#label", '"Freedonia"'),
        _nt("Freedonia", R + "founded", '"1800"'),  # a plain string
        _nt("Freedonia", R + "motto", '"say \\"hi\\" \\\\ } \\n done"'),
    ]
)


@pytest.fixture(scope="module")
def movie() -> KGGraph:
    return KGGraph(EmbeddedKG.from_ntriples(movie_ntriples(MOVIE_FACTS_TIE), GENERIC))


@pytest.fixture(scope="module")
def generic() -> KGGraph:
    return KGGraph(EmbeddedKG.from_ntriples(GENERIC_NT, GENERIC))


@pytest.fixture(scope="module")
def freebase() -> KGGraph:
    return KGGraph(freebase_kg())


def guarded(text: str, profile=GENERIC) -> str:
    """The compiled query, checked to pass the guard unchanged and to be a SELECT."""
    query = compile_sparql(parse(text), profile)
    assert guard.checked_query(query) == query
    assert query_form(query) == "SELECT"
    return query


def names(graph: KGGraph, text: str) -> set[str] | int:
    guarded(text, graph.profile)
    result = execute(graph, text)
    return result if isinstance(result, int) else {name for _, name in result}


def e(name: str) -> str:
    return f"<{E}{name.replace(' ', '%20')}>"


IN_FREEDONIA = f"(JOIN (R contains) {e('Freedonia')})"


# --- answers worked out by hand ----------------------------------------------------------------

DAVIS = f"(JOIN starred_actors {e('Bette Davis')})"
DIETERLE = f"(JOIN directed_by {e('William Dieterle')})"
DRAMA = f"(JOIN has_genre {e('Drama')})"
CVT = "(JOIN (R film.performance.film) (JOIN film.performance.actor m.irons))"
CITIES_IN_F = "Springfield Shelbyville Ogdenville Capital_City"
D, DT, GY = f"^^{XSD}date", f"^^{XSD}dateTime", f"^^{XSD}gYear"

ANSWERS = [  # (KG, expression, the names of its answers, "_" for a space)
    # JOIN both ways, chained; AND of two branches, with a class
    ("movie", f"(JOIN (R directed_by) {e('Kismet')})", "William_Dieterle"),
    ("movie", DIETERLE, "Kismet Juarez"),
    (
        "movie",
        f"(JOIN (R starred_actors) {DIETERLE})",
        "Marlene_Dietrich Ronald_Colman Bette_Davis",
    ),
    ("movie", f"(JOIN directed_by {e('Nobody')})", ""),
    ("movie", f"(AND {DIETERLE} {DAVIS})", "Juarez"),
    ("generic", f"(AND {e('City')} {IN_FREEDONIA})", CITIES_IN_F),
    ("generic", f"(AND {IN_FREEDONIA} {e('River')})", "Hudson"),
    # literal operands: a typed literal is that term; a bare number or date matches by value
    ("generic", f"(JOIN population 30000^^{XSD}integer)", "Springfield Ogdenville"),
    ("generic", f'(JOIN founded "1850-04-12"{D})', "Springfield"),
    ("generic", "(JOIN population 2500.5)", "Capital_City"),
    ("generic", "(JOIN founded 1800)", "Freedonia"),
    ("generic", '(JOIN founded "1800")', "Freedonia"),
    ("movie", "(JOIN release_year 1944)", "Kismet"),
    ("movie", "(JOIN release_year 1939)", "Juarez Dark_Victory"),
    # ARGMAX/ARGMIN: year entities with a tie; integers with a tie, a decimal; dates, a
    # dateTime and a gYear in one relation; nested; no number at all
    ("movie", f"(ARGMAX {DAVIS} release_year)", "Juarez Dark_Victory"),
    ("movie", f"(ARGMIN {DAVIS} release_year)", "Jezebel"),
    ("generic", f"(ARGMAX {IN_FREEDONIA} population)", "Springfield Ogdenville"),
    ("generic", f"(ARGMIN {IN_FREEDONIA} population)", "Capital_City"),
    ("generic", f"(ARGMAX {IN_FREEDONIA} founded)", "Shelbyville"),
    ("generic", f"(ARGMIN {IN_FREEDONIA} founded)", "Capital_City"),
    ("generic", f"(ARGMAX (AND {e('City')} (lt population 20000)) population)", "Shelbyville"),
    ("generic", f"(ARGMIN (ARGMAX {IN_FREEDONIA} population) founded)", "Springfield"),
    ("generic", f"(ARGMAX {IN_FREEDONIA} motto)", ""),
    # comparisons: integers, a decimal, a double
    ("generic", "(gt population 12000)", "Springfield Ogdenville"),
    ("generic", "(ge population 12000)", "Springfield Ogdenville Shelbyville"),
    ("generic", "(lt population 12000)", "Capital_City"),
    ("generic", "(le population 2500.5)", "Capital_City"),
    ("generic", f"(lt population 2500.5^^{XSD}decimal)", ""),
    ("generic", f"(gt population 1.2e4^^{XSD}double)", "Springfield Ogdenville"),
    # dates (the plain "1800" reads as a year; a dateTime on the day counts as that day)
    ("generic", f"(lt founded 1850-06-01{D})", "Springfield Capital_City Freedonia"),
    ("generic", f"(le founded 1850-06-01{D})", "Springfield Capital_City Freedonia Hudson"),
    ("generic", f"(ge founded 1850-06-01{D})", "Hudson Ogdenville Shelbyville"),
    ("generic", f"(gt founded 1850-06-01T10:30:00{DT})", "Ogdenville Shelbyville"),
    ("generic", f"(lt founded 1850-06^^{XSD}gYearMonth)", "Springfield Capital_City Freedonia"),
    # a number or a gYear against dates: their years
    ("generic", "(gt founded 1850)", "Shelbyville"),
    ("generic", "(lt founded 1850)", "Capital_City Freedonia"),
    ("generic", f"(le founded 1850{GY})", "Capital_City Freedonia Springfield Ogdenville Hudson"),
    # years as entities named "1944"
    ("movie", f"(AND {DAVIS} (gt release_year 1938))", "Juarez Dark_Victory"),
    ("movie", "(lt release_year 1939)", "Jezebel"),
    ("movie", "(le release_year 1939)", "Jezebel Juarez Dark_Victory"),
    ("movie", f"(ge release_year 1944{GY})", "Kismet"),
    # TC: year entities; two dates and a dateTime; a gYear
    ("movie", f"(TC {DRAMA} release_year 1939)", "Juarez Dark_Victory"),
    ("movie", f"(TC {DRAMA} release_year 1944)", ""),
    ("generic", f"(TC {IN_FREEDONIA} founded 1850)", "Springfield Ogdenville Hudson"),
    ("generic", f"(TC {IN_FREEDONIA} founded 1790{GY})", "Capital_City"),
    # Freebase ids, names and classes; a CVT hop; a class alone is its members
    ("freebase", "(JOIN (R people.person.nationality) m.irons)", "United_Kingdom"),
    ("freebase", CVT, "Dead_Ringers"),
    ("freebase", "(AND people.person (JOIN people.person.nationality m.uk))", "Jeremy_Irons"),
    ("freebase", f"(JOIN people.person.date_of_birth 1948-09-19{D})", "Jeremy_Irons"),
    ("freebase", '(JOIN type.object.name "Jeremy Irons")', "Jeremy_Irons"),  # also @en
    ("freebase", "(TC people.person people.person.date_of_birth 1948)", "Jeremy_Irons"),
    ("freebase", "(ARGMAX people.person people.person.date_of_birth)", "Jeremy_Irons"),
]


@pytest.mark.parametrize(("kg", "text", "expected"), ANSWERS)
def test_answers(request: pytest.FixtureRequest, kg: str, text: str, expected: str) -> None:
    graph = request.getfixturevalue(kg)
    assert names(graph, text) == {n.replace("_", " ") for n in expected.split()}


def test_count_returns_an_int(movie: KGGraph, generic: KGGraph, freebase: KGGraph) -> None:
    query = guarded(f"(COUNT {IN_FREEDONIA})")
    assert query.startswith("SELECT (COUNT(DISTINCT ?x) AS ?count) WHERE {")
    assert execute(generic, f"(COUNT {IN_FREEDONIA})") == 5
    assert execute(generic, f"(count (ARGMAX {IN_FREEDONIA} population))") == 2
    assert execute(movie, f"(COUNT (JOIN directed_by {e('Nobody')}))") == 0
    assert names(movie, f"(COUNT (JOIN (R starred_actors) {e('Kismet')}))") == 2
    assert execute(freebase, f"(COUNT <{FB}people.person>)") == 1  # an <IRI> alone: the entity


def test_atoms(freebase: KGGraph) -> None:
    assert entity_atom(FB + "m.irons", FREEBASE) == "m.irons"
    assert entity_atom(FB + "g.11b6ddbl7r", FREEBASE) == "g.11b6ddbl7r"
    assert entity_atom(FB + "people.person", FREEBASE) == f"<{FB}people.person>"
    assert entity_atom(E + "Kismet", GENERIC) == f"<{E}Kismet>"
    assert relation_atom(FB + "people.person.nationality", FREEBASE) == "people.person.nationality"
    assert relation_atom(R + "directed_by", GENERIC) == "directed_by"
    assert relation_atom(R + "1990", GENERIC) == f"<{R}1990>"  # not a literal
    rdf_type = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
    assert relation_atom(rdf_type, GENERIC) == f"<{rdf_type}>"
    assert execute(freebase, "(JOIN people.person.nationality m.uk)") == [
        (FB + "m.irons", "Jeremy Irons")
    ]


def test_atoms_of_every_fact_find_it_again(generic: KGGraph, freebase: KGGraph) -> None:
    """(JOIN rel literal_atom(o)) holds s and (JOIN (R rel) entity_atom(s)) holds o, for every
    fact: what the walk relies on to store an S-expression with its exact answers."""
    for graph in (generic, freebase):
        rows = graph.kg.select("SELECT ?s ?p ?o WHERE { ?s ?p ?o FILTER(isIRI(?s)) }")
        assert len(rows) > 10
        for row in rows:
            s, p, o = row["s"].value, row["p"], row["o"]
            rel = relation_atom(p.value, graph.profile)
            if o.kind == "literal" and o.lang:
                obj = f"{quote(o.value)}@{o.lang}"
            elif o.kind == "literal":
                obj = literal_atom(o.value, None if o.datatype == XSD + "string" else o.datatype)
            else:
                obj = entity_atom(o.value, graph.profile)
            subjects = execute(graph, f"(JOIN {rel} {obj})")
            assert isinstance(subjects, list) and s in {i for i, _ in subjects}, (rel, obj)
            objects = execute(graph, f"(JOIN (R {rel}) {entity_atom(s, graph.profile)})")
            assert isinstance(objects, list) and o.value in {i for i, _ in objects}, (s, rel)


def test_runs_through_the_agent_query_path(movie: KGGraph) -> None:
    query = guarded(f"(JOIN (R starred_actors) {e('Kismet')})")
    answer = run_agent_query(movie, query)
    assert set(answer.names) == {"Marlene Dietrich", "Ronald Colman"}


def test_execute_sorts_by_name_and_keeps_the_row_cap(generic: KGGraph) -> None:
    assert [n for _, n in execute(generic, IN_FREEDONIA)] == [  # type: ignore[union-attr]
        "Capital City",
        "Hudson",
        "Ogdenville",
        "Shelbyville",
        "Springfield",
    ]
    assert execute(generic, f"(JOIN (R founded) {e('Springfield')})") == [
        ("1850-04-12", "1850-04-12")
    ]
    with pytest.raises(RowLimitError):
        execute(generic, IN_FREEDONIA, max_rows=2)


# --- text ------------------------------------------------------------------------------------

GRAILQA_STYLE = [
    "(AND music.album (JOIN music.album.artist m.01vrncs))",
    "(COUNT (AND film.film (JOIN film.film.directed_by m.0bxtg)))",
    "(ARGMAX (AND aviation.aircraft_model (JOIN aviation.aircraft_model.manufacturer m.0k0vp)) aviation.aircraft_model.maximum_speed)",
    f"(AND book.written_work (JOIN book.written_work.date_of_first_publication 1990^^{XSD}gYear))",
    f"(AND sports.sports_team (lt sports.sports_team.founded 1950^^{XSD}gYear))",
    f"(AND location.citytown (ge location.location.area 2.5^^{XSD}float))",
    f'(AND people.person (JOIN (R film.film.directed_by) (JOIN film.film.initial_release_date "2004-05-01"^^{XSD}date)))',
    "(ARGMIN (AND astronomy.star (JOIN astronomy.star.constellation m.0dn4j)) astronomy.star.mass)",
    "(ARGMAX spaceflight.rocket (JOIN spaceflight.rocket.height_meters measurement_unit.dated_float_value.number))",
    "(TC (JOIN (R government.governmental_jurisdiction.governing_officials) m.09c7w0) government.government_position_held.from 2011)",
    "(AND (JOIN common.topic.notable_types m.01xryvm) (JOIN book.book_subject.works m.0bx_q))",
    "(COUNT (JOIN (R location.country.languages_spoken) m.0d060g))",
    f"(AND film.film (le film.film.runtime 90^^{XSD}float))",
    "(JOIN tv.tv_program.program_creator g.11b6ddbl7r)",
    "(AND music.composition (JOIN music.composition.lyricist (JOIN people.person.nationality m.0d0vqn)))",
    "(ARGMAX (JOIN (R <http://kgsynth.org/relation/directed_by>) <http://kgsynth.org/entity/Kismet_(1944_film)>) release_year)",
    '(JOIN common.topic.alias "Tom \\"Tiger\\" O\'Neil (Jr.)"@en)',
    f"(AND film.film (gt film.film.initial_release_date 1999-12-31T23:59:59Z^^<{XSD}dateTime>))",
]


@pytest.mark.parametrize("text", GRAILQA_STYLE)
def test_round_trip_of_grailqa_style_forms(text: str) -> None:
    expr = parse(text)
    assert to_text(expr) == text
    assert parse(to_text(expr)) == expr
    guarded(text, FREEBASE)


def test_parse_canonical_spellings_and_tree() -> None:
    text = "(JOIN (R directed_by) <http://x/Kismet>)"
    assert parse(text) == ("JOIN", ("R", "directed_by"), "<http://x/Kismet>")
    messy = "( and  film.film\n\t(AND (LT film.film.runtime 90)   (Join (r a) m.x ) ))"
    canonical = "(AND film.film (AND (lt film.film.runtime 90) (JOIN (R a) m.x)))"
    assert to_text(parse(messy)) == canonical
    assert parse("(argmin X (join A b))") == ("ARGMIN", "X", ("JOIN", "A", "b"))
    assert parse("  m.0abc ") == "m.0abc"
    assert to_text(("join", "r", "m.x")) == "(JOIN r m.x)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("(JOIN a", "unbalanced parenthesis: '(' at offset 0 is never closed"),
        ("(JOIN a b))", "unexpected text after the expression at offset 10"),
        ("(JOIN a b) c", "unexpected text after the expression at offset 11"),
        (")", "unbalanced parenthesis: ')' at offset 0 closes nothing"),
        ("(FOO a b)", "unknown operator 'FOO' at offset 1 (known: AND, ARGMAX"),
        ("(JOIN a)", "wrong number of operands for JOIN at offset 0: JOIN takes 2, got 1"),
        ("(AND a (COUNT b c))", "wrong number of operands for COUNT at offset 7"),
        ("(TC a b)", "TC takes 3, got 2"),
        ('(JOIN a "b)', "unterminated string starting at offset 8"),
        ("(JOIN a <http://x y>)", "unterminated IRI '<http://x' at offset 8"),
        ("()", "an empty list '()' at offset 0"),
        ("((JOIN a b) c)", "the list at offset 0 starts with a list, not an operator"),
        ("", "an empty S-expression"),
        ("   ", "an empty S-expression"),
        ('(JOIN a abc"d")', "atom 'abc' at offset 8 runs into '\"' at offset 11"),
        ("(JOIN a <http://x>y)", "runs into 'y' at offset 18"),
        ("(" * 70 + ")" * 70, "nested deeper than 64 lists"),
    ],
)
def test_parse_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(SExprError) as info:
        parse(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("(JOIN r foo)", "'foo' is not an entity (m.0abc, g.11x or <IRI>), a literal"),
        ("(COUNT (COUNT m.a))", "COUNT may only be the outermost operator: (COUNT m.a)"),
        ("(AND (COUNT m.a) c)", "COUNT may only be the outermost operator"),
        ("(lt r abc)", "lt compares with a number or a date"),
        ('(gt r "Drama")', "'Drama' is neither a number nor a date"),
        (f"(JOIN r abc^^{XSD}integer)", "'abc' is not a valid integer value"),
        (f"(JOIN r 1.5^^{XSD}integer)", "'1.5' is not a valid integer value"),
        (f"(lt r 2004-02-30x^^{XSD}date)", "is not a valid date value"),
        ("(JOIN r 2004-13-01)", "'2004-13-01' is not a valid date value"),
        (f"(gt r INF^^{XSD}double)", "'INF' is not a finite number"),
        ("(TC m.a r NOW)", "TC with NOW is not supported; give a year"),
        ("(TC m.a r 19x9)", "TC takes a year (2004), not 19x9"),
        (
            "(AND 1990 film.film)",
            "AND's operands are classes and expressions, not the literal '1990'",
        ),
        ("(R x)", "(R rel) is a relation, not a set"),
        ("(JOIN (AND a b) m.x)", "(AND a b) is not a relation: write a relation name"),
        (f"(JOIN 1990^^{XSD}integer m.x)", "is a literal where a relation or class was expected"),
        ('(JOIN r "a\\qb")', "unknown escape '\\q'"),
        ('(JOIN r "a\\U00110000")', "the escape '\\U00110000' is not a character"),
        ('(JOIN r "a\\ud800")', "cannot be sent"),
    ],
)
def test_compile_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(SExprError) as info:
        compile_sparql(parse(text), FREEBASE)
    assert message in str(info.value)


def test_literal_atom_forms() -> None:
    assert literal_atom("1990", XSD + "integer") == f"1990^^{XSD}integer"
    assert literal_atom("2004-05-01", XSD + "date") == f"2004-05-01^^{XSD}date"
    assert literal_atom("text", None) == '"text"'
    assert literal_atom("text", XSD + "string") == '"text"'
    assert literal_atom("two words", "http://x/dt") == '"two words"^^http://x/dt'
    assert literal_atom("v", "http://x/a(b)") == "v^^<http://x/a(b)>"
    assert parse(literal_atom("v", "http://x/a(b)")) == "v^^<http://x/a(b)>"
    with pytest.raises(SExprError, match="not a valid absolute IRI"):
        literal_atom("v", "no-scheme")
    for value, dt in (("abc", "integer"), ("2004-5-1", "date"), ("1.5", "int"), ("x", "gYear")):
        with pytest.raises(SExprError, match="is not a valid"):
            literal_atom(value, XSD + dt)


# --- hostile text ------------------------------------------------------------------------------

HOSTILE_VALUES = [
    MOTTO,
    '" } UNION { ?x ?p ?o } #',
    '\\" . } ; DROP ALL ; SELECT * { ?s ?p ?o',
    "line\r\nbreak\ttab \\n not-an-escape",
    "ends with a backslash \\",
]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_hostile_literals_stay_strings(generic: KGGraph, value: str) -> None:
    atom = literal_atom(value, None)
    assert parse(atom) == atom
    assert unquote(atom[1:-1]) == value
    text = f"(JOIN motto {atom})"
    query = guarded(text)
    outside_strings = re.sub(r'"(?:[^"\\\r\n]|\\.)*"', '""', query)
    assert outside_strings.count("{") == outside_strings.count("}") == 2
    assert "UNION" not in outside_strings and "DROP" not in outside_strings
    expected = {"Freedonia"} if value == MOTTO else set()
    assert names(generic, text) == expected
    assert names(generic, f"(COUNT {text})") == len(expected)


@pytest.mark.parametrize(
    "atom",
    [
        '<http://x/a"b>',
        "<http://x/a}b>",
        "<http://x/a{b>",
        "<http://x/a\\b>",
        "<http://x/a|b>",
        "<not-an-iri>",
    ],
)
def test_hostile_iris_are_refused(atom: str) -> None:
    for text in (f"(JOIN r {atom})", f"(JOIN {atom} m.x)", f"(AND {atom} (JOIN r m.x))"):
        with pytest.raises(SExprError, match="not a valid absolute IRI"):
            compile_sparql(parse(text), GENERIC)


def test_hostile_names_and_atoms() -> None:
    # a relation name with a brace: the generic profile percent-encodes it, Freebase refuses
    query = guarded("(JOIN a}b{c m.x)")
    assert "<http://kgsynth.org/relation/a%7Db%7Bc>" in query
    with pytest.raises(SExprError, match="not a valid absolute IRI"):
        compile_sparql(parse("(JOIN a}b{c m.x)"), FREEBASE)
    for iri in ("http://x/a b", 'http://x/a"}', "http://x/a\nb", "no-scheme"):
        with pytest.raises(SExprError, match="not a valid absolute IRI"):
            entity_atom(iri, GENERIC)
        with pytest.raises(SExprError, match="not a valid absolute IRI"):
            relation_atom(iri, GENERIC)
    with pytest.raises(SExprError, match="cannot be sent"):
        compile_sparql(parse("(JOIN r " + literal_atom("nul\x00byte", None) + ")"), GENERIC)
    with pytest.raises(SExprError, match="not one atom"):
        to_text(("JOIN", "r", "two words"))
    with pytest.raises(SExprError, match="not one atom"):
        to_text(("JOIN", "r", "a)b"))


# --- other engines -------------------------------------------------------------------------------

PARITY_CASES = [
    f"(ARGMAX {IN_FREEDONIA} population)",
    f"(ARGMIN {IN_FREEDONIA} founded)",
    f"(AND {e('City')} (ARGMAX {IN_FREEDONIA} founded))",
    f"(AND {IN_FREEDONIA} (le founded 1850-06-01^^{XSD}date))",
    f"(TC {IN_FREEDONIA} founded 1850)",
    "(lt founded 1850)",
    f"(COUNT (AND {e('City')} (gt population 2500)))",
    f"(JOIN motto {literal_atom(MOTTO, None)})",
    f"(ARGMAX (JOIN starred_actors {e('Bette Davis')}) release_year)",
    f"(AND (JOIN starred_actors {e('Bette Davis')}) (gt release_year 1938))",
    f"(TC (JOIN has_genre {e('Drama')}) release_year 1939)",
    "(JOIN release_year 1944)",
]


@pytest.mark.virtuoso
def test_same_answers_on_oxigraph_server_and_virtuoso(tmp_path: Path) -> None:
    from kgsynth.kg.endpoint import SparqlEndpointKG
    from tests.servers import start_oxigraph, start_virtuoso, virtuoso_missing_reason

    if virtuoso_missing_reason():
        pytest.skip(virtuoso_missing_reason())
    nt = tmp_path / "kg.nt"
    nt.write_text(GENERIC_NT + "\n" + movie_ntriples(MOVIE_FACTS_TIE), encoding="utf-8")
    embedded = EmbeddedKG.from_ntriples(nt.read_text(encoding="utf-8"), GENERIC)
    expected = [execute(embedded, text) for text in PARITY_CASES]
    assert all(expected)
    with (
        start_oxigraph(nt, tmp_path / "oxigraph") as oxigraph,
        start_virtuoso(nt, tmp_path / "virtuoso") as virtuoso,
    ):
        for url in (oxigraph.url, virtuoso.url):
            kg = SparqlEndpointKG(url, GENERIC, timeout=30, retries=1, backoff=0.01)
            assert [execute(kg, text) for text in PARITY_CASES] == expected, url
