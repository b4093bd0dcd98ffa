"""`kg import` of delimited files in Arrow batches (issue 20): the same store, name index and
counts as the line-by-line reader, which still takes every file it must (and names bad lines)."""

import itertools
import json
import sqlite3
from pathlib import Path
from urllib.parse import quote

import polars as pl
import pyoxigraph as ox
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgsynth.core.errors import InputFileError
from kgsynth.kg import arrow_import, delimited
from kgsynth.kg.embedded import NAMES_FILE, STORE_SUBDIR
from kgsynth.kg.importer import import_kg
from kgsynth.kg.profiles import freebase_id
from kgsynth.kg.sparql import normalize_name

NAMES = [
    "Kismet",
    "William  Dieterle",
    "Émile Zola",
    "東京",
    'He said "hi"',
    "back\\slash",
    "50% off",
    "a/b?c#d&e=f",
    "tab\tinside",
    "ǅemal ﬁsh",  # NFKC and case-folding change these
    "ÅNGSTRÖM",
    "emoji 🎬",
    "~tilde_dot.dash-",
    "it's",
    "1944",
]


def store_state(path: Path) -> tuple[list[str], list[tuple], dict]:
    store = ox.Store.read_only(str(path / STORE_SUBDIR))
    triples = sorted(str(q) for q in store.quads_for_pattern(None, None, None))
    con = sqlite3.connect(path / NAMES_FILE)
    names = sorted(con.execute("SELECT norm, label, iri FROM names").fetchall())
    con.close()
    meta = json.loads((path / "kg.json").read_text())
    meta.pop("created")
    return triples, names, meta


def import_both(tmp_path, monkeypatch, src, **kwargs):
    """Import ``src`` batched and line by line; returns both states (and checks the batched
    reader really ran)."""
    calls = []
    real = arrow_import.delimited_to_ntriples

    def spy(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(delimited, "delimited_to_ntriples", spy)
    fast = import_kg(src, tmp_path / "fast", **kwargs)
    assert calls, "the batched reader was not used"

    def refuse(*args, **kw):
        raise arrow_import.NeedsLineReader("test: line by line")

    monkeypatch.setattr(delimited, "delimited_to_ntriples", refuse)
    slow = import_kg(src, tmp_path / "slow", **kwargs)
    timings = {"seconds": 0, "store": "", "store_bytes": 0, "table_seconds": 0}
    assert fast.as_dict() | timings == slow.as_dict() | timings
    return store_state(tmp_path / "fast"), store_state(tmp_path / "slow")


def test_hostile_names_give_the_same_store(tmp_path, monkeypatch):
    n = len(NAMES)
    lines = [f"  {NAMES[i % n]} |rel {i % 3}/x|{NAMES[(i * 7 + 1) % n]}  " for i in range(40)]
    src = tmp_path / "kb.txt"
    src.write_text("\r\n".join(lines[:20]) + "\n\n" + "\n".join(lines[20:]) + "\n", "utf-8")
    fast, slow = import_both(tmp_path, monkeypatch, src)
    assert fast == slow
    assert len(fast[1]) == len(NAMES)


def test_small_batches_give_the_same_store(tmp_path, monkeypatch):
    """Names first seen in a later batch get their name triple once."""
    monkeypatch.setattr(arrow_import, "BLOCK_BYTES", 64)
    lines = [f"{NAMES[i % 15]}|r{i % 4}|{NAMES[(i * 3) % 15]} {i % 5}" for i in range(200)]
    src = tmp_path / "kb.txt"
    src.write_text("\n".join(lines) + "\n", "utf-8")
    fast, slow = import_both(tmp_path, monkeypatch, src)
    assert fast == slow


def test_freebase_keys_minting_one_iri_keep_the_first_name(tmp_path, monkeypatch):
    """``/m/0x`` and ``m.0x`` mint the same IRI: its name is the first key's, as line by line."""
    lines = [
        "/m/01\t/film/film/directed_by\t/m/02",
        "m.02\t/film/film/genre\t/m/03",
        "/m/03\t/film/film/genre\tm.01",
        "/m/04\t/film/film/release_date_s./film/film_regional_release_date/x\t/m/01",
    ]
    src = tmp_path / "train.tsv"
    src.write_text("\n".join(lines) + "\n", "utf-8")
    names = tmp_path / "names.txt"
    names.write_text("/m/01\tFirst\nm.01\tOther\n/m/02\tSecond\nm.02\tLater\n/m/04\tFour\n")
    fast, slow = import_both(tmp_path, monkeypatch, src, names_file=names)
    assert fast == slow
    assert {n[1] for n in fast[1]} == {"First", "Second", "Four"}


def test_wikidata_profile_and_language_tags(tmp_path, monkeypatch):
    names = [n for n in NAMES if "\t" not in n]
    src = tmp_path / "kb.tsv"
    src.write_text(
        "".join(f"{a}\tP{i}\t{b}\n" for i, (a, b) in enumerate(itertools.pairwise(names))), "utf-8"
    )
    fast, slow = import_both(tmp_path, monkeypatch, src, profile="wikidata")
    assert fast == slow


@pytest.mark.parametrize(
    "lines, message",
    [
        (["a|b|c", "a|b", "c|d|e"], "kb.txt:2"),
        (["a|b|c", "a| |c"], "kb.txt:2"),
        (["a|b|c", "a|b|c\x01"], "kb.txt:2"),
    ],
)
def test_bad_lines_are_still_named(tmp_path, lines, message):
    src = tmp_path / "kb.txt"
    src.write_text("\n".join(lines) + "\n", "utf-8")
    with pytest.raises(InputFileError, match=message):
        import_kg(src, tmp_path / "store")


def test_whitespace_lines_and_bom_are_read_as_line_by_line(tmp_path, monkeypatch):
    src = tmp_path / "kb.txt"
    src.write_text("\ufeffKismet|r|Juarez\n   \nJuarez|r|Kismet\n", "utf-8")
    fast = import_kg(src, tmp_path / "a")
    assert fast.facts == 2 and fast.entities == 3  # the BOM stays in the first name


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=8))
def test_vectorized_quote_and_normalize_match_python(values):
    series = pl.Series(values, dtype=pl.String)
    assert arrow_import.percent_encode(series).to_list() == [quote(v, safe="") for v in values]
    assert arrow_import.normalized_names(series).to_list() == [normalize_name(v) for v in values]
    assert arrow_import.freebase_ids(series).to_list() == [freebase_id(v) for v in values]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.from_regex(r"/[a-z0-9_./]{0,12}", fullmatch=True), min_size=1, max_size=8))
def test_vectorized_freebase_ids_match_python(values):
    series = pl.Series(values, dtype=pl.String)
    assert arrow_import.freebase_ids(series).to_list() == [freebase_id(v) for v in values]


def test_relation_counts_from_the_table_equal_the_stores(tmp_path):
    """kg.json's triples per predicate come from the fan-out table (no scan of the store):
    repeated facts once, self loops counted, the name triples under the label predicate."""
    lines = ["A|likes|A", "A|likes|B", "A|likes|B", "B|likes|A", "B|born|1950", "C|born|1950"]
    src = tmp_path / "kb.txt"
    src.write_text("\n".join(lines) + "\n", "utf-8")
    import_kg(src, tmp_path / "kg")
    meta = json.loads((tmp_path / "kg" / "kg.json").read_text())
    store = ox.Store.read_only(str(tmp_path / "kg" / STORE_SUBDIR))
    counted = {
        s["p"].value: int(s["n"].value)
        for s in store.query("SELECT ?p (COUNT(*) AS ?n) WHERE { ?s ?p ?o } GROUP BY ?p")
    }
    assert meta["relation_triples"] == counted
    assert sorted(counted.values()) == [2, 3, 4]  # born 2; likes 3 (one a loop); 4 names
