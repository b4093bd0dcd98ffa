"""Schema-style relation names read as their property, with the type as context (issue 43):
``__film__film__country`` is "country" in a template question, not "film film country"."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.cli import app
from kgsynth.kg.relnames import property_words, relation_parts, relation_phrase
from kgsynth.llm.relation_forms import relation_words


@pytest.mark.parametrize(
    ("name", "prop", "typ", "words", "phrase"),
    [
        ("directed_by", "directed_by", "", "directed by", "directed by"),
        ("film.film.directed_by", "directed_by", "film", "directed by", "directed by film"),
        ("/people/person/nationality", "nationality", "person", "nationality",
         "nationality person"),
        ("__film__film__country", "country", "film", "country", "country film"),
        ("/film/film/release_date_s./film/film_regional_release_date/film_release_region",
         "film_release_region", "film_regional_release_date", "film release region",
         "film release region regional date"),
        ("releaseYear", "releaseYear", "", "release year", "release year"),
    ],
)  # fmt: skip
def test_a_relation_name_is_its_property_with_its_type_as_context(
    name: str, prop: str, typ: str, words: str, phrase: str
) -> None:
    assert relation_parts(name) == (relation_parts(name).__class__(prop, typ))
    assert property_words(name) == words
    assert relation_phrase(name) == phrase
    assert relation_words(name) == words  # the template backend's reading


FACTS = [
    (f"Film {i}", rel, obj)
    for i in range(30)
    for rel, obj in (
        ("__film__film__country", f"Country {i % 4}"),
        ("/film/film/directed_by", f"Person {i % 7}"),
        ("__people__person__nationality", f"Country {i % 3}"),
    )
] + [(f"Person {j}", "__people__person__nationality", f"Country {j % 3}") for j in range(7)]


def test_template_questions_on_freebase_style_names_read_as_words(tmp_path: Path) -> None:
    kb = tmp_path / "kb.tsv"
    kb.write_text("\n".join("\t".join(f) for f in FACTS) + "\n")
    runner = CliRunner()
    for args in (
        ["kg", "import", str(kb), "--out", str(tmp_path / "kg")],
        ["walk", "--kg", str(tmp_path / "kg"), "--out", str(tmp_path / "w.parquet"), "--n", "40",
         "--structures", "chain-1,chain-2"],
        ["synthesize", "questions", "--walks", str(tmp_path / "w.parquet"), "--out",
         str(tmp_path / "q.parquet")],
    ):  # fmt: skip
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    texts = pq.read_table(tmp_path / "q.parquet").column("question").to_pylist()
    assert texts
    joined = " ".join(texts).lower()
    for bad in ("film film", "people person", "__", "/film/"):
        assert bad not in joined, [t for t in texts if bad in t.lower()][:3]
    assert "country" in joined or "nationality" in joined or "directed" in joined
