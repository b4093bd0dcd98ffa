"""`kgsynth kg import`: formats, names files, errors that name file and line, atomicity."""

import gzip
import json

import pytest

from kgsynth.core.errors import ConfigError, InputFileError
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.importer import import_kg
from kgsynth.kg.open import open_kg

METAQA_LINES = [
    "Kismet|directed_by|William Dieterle",
    "Kismet|starred_actors|Marlene Dietrich",
    "Kismet|release_year|1944",
    "Juarez|directed_by|William Dieterle",
    "Juarez|release_year|1939",
]


def write(path, lines, gz=False):
    data = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


def test_delimited_import_counts_and_names(tmp_path):
    src = write(tmp_path / "kb.txt", METAQA_LINES)
    report = import_kg(src, tmp_path / "store")
    assert (report.facts, report.entities, report.relations) == (5, 6, 3)
    assert report.triples == 5 + 6  # facts + one name per entity
    assert report.profile == "generic"
    kg = EmbeddedKG.open(tmp_path / "store")
    graph = KGGraph(kg)
    dieterle = graph.resolve("william dieterle")
    assert dieterle is not None and dieterle.match == "case-insensitive"
    rels = graph.relations(dieterle.entity.iri)
    assert [(r.name, r.direction) for r in rels] == [("directed_by", "in")]
    assert [n.name for n in graph.neighbors(dieterle.entity.iri, rels[0])] == ["Juarez", "Kismet"]
    meta = json.loads((tmp_path / "store" / "kg.json").read_text())
    assert meta["facts"] == 5 and meta["source_sha256"]


def test_iris_are_deterministic(tmp_path):
    src = write(tmp_path / "kb.txt", METAQA_LINES)
    import_kg(src, tmp_path / "a")
    import_kg(src, tmp_path / "b")
    q = "SELECT ?s WHERE { ?s ?p ?o } ORDER BY ?s"
    a = [r["s"].value for r in EmbeddedKG.open(tmp_path / "a").select(q)]
    b = [r["s"].value for r in EmbeddedKG.open(tmp_path / "b").select(q)]
    assert a == b and "http://kgsynth.org/entity/William%20Dieterle" in a


def test_tsv_gz_with_names_file(tmp_path):
    src = write(tmp_path / "train.tsv.gz", ["/m/01\t/film/film/directed_by\t/m/02"], gz=True)
    names = write(tmp_path / "names.txt", ["/m/01\tSome Film", "/m/02\tSome Director"])
    report = import_kg(src, tmp_path / "store", names_file=names)
    assert report.profile == "freebase"  # guessed from the /a/b/c relation paths
    graph = KGGraph(open_kg(tmp_path / "store"))
    film = graph.resolve("Some Film")
    assert film.entity.iri == "http://rdf.freebase.com/ns/m.01"
    (rel,) = graph.relations(film.entity.iri)
    assert rel.name == "film.film.directed_by"


def test_malformed_line_names_file_and_line(tmp_path):
    src = write(
        tmp_path / "kb.txt", [*METAQA_LINES[:2], "broken line without fields", METAQA_LINES[2]]
    )
    with pytest.raises(InputFileError) as info:
        import_kg(src, tmp_path / "store", delimiter="|")
    assert str(info.value).startswith(f"{src}:3:")
    # nothing half-written: neither the store nor a temporary directory remains
    assert not (tmp_path / "store").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["kb.txt"]


def test_ntriples_syntax_error_names_line(tmp_path):
    src = write(
        tmp_path / "kg.nt",
        [
            '<http://a> <http://www.w3.org/2000/01/rdf-schema#label> "A" .',
            "<http://a> <http://b> oops .",
        ],
    )
    with pytest.raises(InputFileError) as info:
        import_kg(src, tmp_path / "store")
    assert f"{src}:2:" in str(info.value)
    assert not (tmp_path / "store").exists()


def test_turtle_import(tmp_path):
    src = write(
        tmp_path / "kg.ttl",
        [
            "@prefix ex: <http://ex.org/> .",
            "@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .",
            'ex:a rdfs:label "Alpha" ; ex:knows ex:b .',
            'ex:b rdfs:label "Beta" .',
        ],
    )
    report = import_kg(src, tmp_path / "store")
    assert (report.facts, report.relations) == (1, 1)
    graph = KGGraph(open_kg(tmp_path / "store"))
    (rel,) = graph.relations(graph.resolve("Alpha").entity.iri)
    assert rel.name == "knows"


def test_existing_store_needs_force(tmp_path):
    src = write(tmp_path / "kb.txt", METAQA_LINES)
    import_kg(src, tmp_path / "store")
    with pytest.raises(ConfigError, match="--overwrite"):
        import_kg(src, tmp_path / "store")
    write(src, METAQA_LINES[:1])
    assert import_kg(src, tmp_path / "store", force=True).facts == 1


def test_force_replaces_only_a_store_never_other_files(tmp_path):
    # issue 13: `kg import r2/kb.txt --out r2 --force` deleted kb.txt and notes.txt
    folder = tmp_path / "r2"
    folder.mkdir()
    src = write(folder / "kb.txt", METAQA_LINES)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a kgsynth store"):
        import_kg(src, folder, force=True)
    assert src.read_text() and (folder / "notes.txt").read_text() == "mine"
    # an input inside the store it would replace is refused too
    import_kg(src, tmp_path / "store")
    inside = write(tmp_path / "store" / "kb2.txt", METAQA_LINES)
    with pytest.raises(ConfigError, match="holds the input"):
        import_kg(inside, tmp_path / "store", force=True)
    assert inside.is_file()
    # an empty folder is fine to fill
    (tmp_path / "empty").mkdir()
    assert import_kg(src, tmp_path / "empty", force=True).facts == len(METAQA_LINES)


def test_failed_forced_import_keeps_the_old_store(tmp_path):
    src = write(tmp_path / "kb.txt", METAQA_LINES)
    import_kg(src, tmp_path / "store")
    bad = write(tmp_path / "bad.txt", ["a|b"])
    with pytest.raises(InputFileError):
        import_kg(bad, tmp_path / "store", force=True)
    assert KGGraph(open_kg(tmp_path / "store")).resolve("Kismet") is not None


def test_kg_option_accepts_a_triple_file_and_caches_the_import(tmp_path):
    src = write(tmp_path / "kb.txt", METAQA_LINES)
    kg = open_kg(src)
    assert KGGraph(kg).resolve("Juarez") is not None
    again = open_kg(src)
    assert again.location == kg.location  # the cached store is reused


def test_kg_option_rejects_unknown(tmp_path):
    with pytest.raises(ConfigError, match="--kg"):
        open_kg(tmp_path / "missing")
