"""The words a question, an entity name and a relation name are read as (issue 43: KGs
kgsynth was never tuned on name things in capitals and with accents)."""

from __future__ import annotations

import random
import string

from kgsynth.agent.toolkit import _CHUNK_RE, _words, name_span, tokenize


def test_words_in_capitals_and_with_accents_stay_whole():
    assert tokenize("Which players are from the USA?") == [
        "which",
        "players",
        "are",
        "from",
        "the",
        "usa",
    ]
    assert tokenize("FC Barcelona") == ["fc", "barcelona"]
    assert tokenize("Pépé le Moko") == ["pépé", "le", "moko"]
    assert tokenize("Borussia Mönchengladbach") == ["borussia", "mönchengladbach"]
    # camelCase, acronyms before a word, snake_case, dotted names and numbers still split
    assert tokenize("starredActors") == ["starred", "actors"]
    assert tokenize("NBAPlayer") == ["nba", "player"]
    assert tokenize("ÉcoleNormale") == ["école", "normale"]
    assert tokenize("film.film.directed_by") == ["film", "film", "directed", "by"]
    assert tokenize("release_year2010") == ["release", "year", "2010"]


def test_a_name_is_found_in_a_question_whatever_its_case():
    words = tokenize("which club does the USA captain play for at FC barcelona")
    assert name_span(words, "FC Barcelona") is not None
    assert name_span(tokenize("who was born in the usa"), "USA") is not None


def test_the_ascii_pass_reads_the_words_the_general_one_does():
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits + " _.-*'"
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 24)))
        general = [w.lower() for chunk in _CHUNK_RE.findall(text) for w in _words(chunk)]
        assert tokenize(text) == general, text
