"""The escaping functions and the read-only guard."""

import pyoxigraph as ox
import pytest

from kgsynth.core.errors import QueryRejectedError
from kgsynth.kg import guard, sparql


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        'a "quoted" name',
        "it's",
        "back\\slash",
        "line\nbreak\ttab\r",
        '"} ; DROP ALL ; #',
        "Amélie",
        "😀",
    ],
)
def test_literal_round_trips_through_a_real_parser(text):
    store = ox.Store()
    rows = list(store.query(f"SELECT ?x WHERE {{ BIND({sparql.literal(text)} AS ?x) }}"))
    assert rows[0]["x"].value == text


def test_literal_with_language_tag():
    assert sparql.literal("x", "en") == '"x"@en'
    with pytest.raises(ValueError):
        sparql.literal("x", "en} DROP")


@pytest.mark.parametrize("text", ["\x00", "a\x07b", "\ud800", "\x7f"])
def test_unsendable_text_is_refused(text):
    assert not sparql.is_sendable(text)
    with pytest.raises(ValueError):
        sparql.literal(text)


@pytest.mark.parametrize(
    "bad", ["", "no-colon", "http://a b", "http://a>", "http://a\\b", 'http://a"']
)
def test_iri_rejects_invalid(bad):
    with pytest.raises(ValueError):
        sparql.iri(bad)


def test_iri_accepts_percent_encoded():
    assert sparql.iri("http://kgsynth.org/entity/A%20B") == "<http://kgsynth.org/entity/A%20B>"


def test_normalize_name():
    assert sparql.normalize_name("  The  MATRIX ") == "the matrix"
    assert sparql.normalize_name("ＡＢＣ") == "abc"  # NFKC folds full-width letters


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * WHERE { ?s ?p ?o }",
        "PREFIX ex: <http://ex/> SELECT ?s WHERE { ?s ex:drop ?o }",
        'ASK { ?s ?p "DROP ALL; INSERT DATA { }" }',
        "# DELETE in a comment\nSELECT ?s WHERE { ?s ?p ?o }",
        "CONSTRUCT { ?s ?p ?o } WHERE { ?s ?p ?o }",
        "select ?delete where { ?delete ?p ?o }",
    ],
)
def test_read_only_queries_pass(query):
    guard.ensure_read_only(query)


@pytest.mark.parametrize(
    "query",
    [
        "INSERT DATA { <http://a> <http://b> <http://c> }",
        "DROP ALL",
        "SELECT * WHERE { ?s ?p ?o } ; DELETE WHERE { ?s ?p ?o }",
        "PREFIX ex: <http://ex/> DELETE { ?s ?p ?o } WHERE { ?s ?p ?o }",
        "LOAD <http://evil/x.nt>",
        "clear default",
        "WITH <http://g> INSERT { ?s ?p ?o } WHERE { ?s ?p ?o }",
        "",
    ],
)
def test_updates_are_refused(query):
    with pytest.raises(QueryRejectedError):
        guard.ensure_read_only(query)
