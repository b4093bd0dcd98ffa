"""The fan-out table stored at import (issue 20): its counts and hub targets are what SPARQL
counts and lists on the same store, the walker picks the same targets from it, and a store
imported without it still walks, to the same file."""

import hashlib
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgsynth.kg import fanouts
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.fanouts import FANOUTS_DIR, FanoutTable
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.importer import import_kg
from kgsynth.kg.profiles import get_profile
from kgsynth.walk import WalkConfig, run_walks

ROOT = Path(__file__).resolve().parents[1]
METAQA = ROOT / "data" / "metaqa" / "kb_partial.txt.gz"

# every (entity, predicate, direction) with its distinct neighbours other than the entity:
# the walker's fan-out query, over the whole store at once
ALL_FANOUTS = """
SELECT ?e ?r ?d (COUNT(DISTINCT ?x) AS ?n) WHERE {
  { ?e ?r ?x BIND("out" AS ?d) } UNION { ?x ?r ?e BIND("in" AS ?d) }
  FILTER(?x != ?e) FILTER(isIRI(?e))
} GROUP BY ?e ?r ?d
"""


def sparql_counts(kg: EmbeddedKG) -> dict[tuple[str, str, str], int]:
    """The counts of every relation the walker sees (names and other hidden ones left out:
    a batched import does not count the name triples it writes)."""
    return {
        (r["e"].value, r["r"].value, r["d"].value): int(r["n"].value)
        for r in kg.select(ALL_FANOUTS, max_rows=10_000_000, timeout=600)
        if not kg.profile.is_hidden(r["r"].value)
    }


def table_counts(kg: EmbeddedKG, iris: list[str]) -> dict[tuple[str, str, str], int]:
    table = kg.fanout_table
    assert table is not None
    return {
        (iri, p, d): n
        for iri, rows in table.rows(iris).items()
        for p, d, n, _ in rows
        if not kg.profile.is_hidden(p)
    }


def all_iris(kg: EmbeddedKG) -> list[str]:
    rows = kg.select(
        "SELECT DISTINCT ?e WHERE { { ?e ?p ?o } UNION { ?s ?p ?e } FILTER(isIRI(?e)) }",
        max_rows=10_000_000,
    )
    return sorted(r["e"].value for r in rows)


def hub_rows_agree(kg: EmbeddedKG) -> int:
    """Every row whose targets the table holds lists, in order, what the targets query
    returns (no table); returns how many rows were checked."""
    table = kg.fanout_table
    plain = KGGraph(EmbeddedKG(kg.store, kg.profile), cache_size=0)
    graph = KGGraph(kg)
    checked = 0
    iris = all_iris(kg)
    graph.prefetch_lookups(iris)
    for iri in iris:
        for rel in graph.fanouts(iri):
            row = graph._hub_row(iri, rel)
            if row is None:
                continue
            start = int(table._target_start[row])
            stored = [table.iri(int(i)) for i in table._targets[start : start + table._count[row]]]
            assert stored == [t.value for t in plain.targets(iri, rel)]
            checked += 1
    return checked


@pytest.fixture(scope="module")
def metaqa(tmp_path_factory) -> EmbeddedKG:
    out = tmp_path_factory.mktemp("metaqa") / "kg"
    import_kg(METAQA, out)
    return EmbeddedKG.open(out)


def test_metaqa_table_counts_are_the_sparql_counts(metaqa):
    want = sparql_counts(metaqa)
    got = table_counts(metaqa, all_iris(metaqa))
    assert len(want) > 100_000
    assert got == want
    # hubs: relations with thousands of targets (a genre's films), read without listing them
    assert metaqa.fanout_table.meta["hub_rows"] > 10
    assert hub_rows_agree(metaqa) == metaqa.fanout_table.meta["hub_rows"]


def test_choose_target_picks_what_a_listed_choice_picks(metaqa):
    """For hub relations, the table's pick with a seeded rng (some targets left out) is the
    element ``rng.choice`` takes from the listed targets, and the rng ends in the same state."""
    graph = KGGraph(metaqa)
    plain = KGGraph(EmbeddedKG(metaqa.store, metaqa.profile))
    rng = random.Random(5)
    hubs = []
    for iri in random.Random(1).sample(all_iris(metaqa), 4000):
        hubs += [(iri, rel) for rel in graph.fanouts(iri) if graph._hub_row(iri, rel) is not None]
    assert len(hubs) >= 3
    for trial in range(200):
        iri, rel = hubs[trial % len(hubs)]
        listed = [t.value for t in plain.targets(iri, rel)]
        exclude = set(rng.sample(listed, 3)) | {iri, "http://kgsynth.org/entity/nobody"}
        a, b = random.Random(trial), random.Random(trial)
        picked = graph.choose_target(iri, rel, a, exclude, iris_only=True)
        assert picked is not None
        assert picked.value == b.choice([v for v in listed if v not in exclude])
        assert a.random() == b.random()


def walk_file(kg_dir: Path, out: Path, **kw) -> str:
    kg = EmbeddedKG.open(kg_dir)
    try:
        run_walks(kg, WalkConfig(**{"n": 300, "seed": 0, **kw}), out)
    finally:
        kg.close()
    return hashlib.sha256(out.read_bytes()).hexdigest()


def test_metaqa_walks_are_the_same_with_and_without_the_table(metaqa, tmp_path):
    """A store imported before the table existed (no fanouts/) still walks, through the
    queries, to the same file byte for byte."""
    old = tmp_path / "old"
    shutil.copytree(metaqa.location, old)
    shutil.rmtree(old / FANOUTS_DIR)
    assert EmbeddedKG.open(old).fanout_table is None
    with_table = walk_file(Path(metaqa.location), tmp_path / "a.parquet")
    without = walk_file(old, tmp_path / "b.parquet")
    assert with_table == without


def generated_file(path: Path, facts: list[tuple[int, int, int]]) -> Path:
    path.write_text("".join(f"e{s}|r{r}|e{o}\n" for s, r, o in facts))
    return path


FACTS = st.lists(
    st.tuples(
        st.integers(0, 30),  # few entities and relations: repeats, self loops and hubs
        st.integers(0, 3),
        st.integers(0, 30),
    ),
    min_size=1,
    max_size=300,
)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(facts=FACTS)
def test_generated_tables_match_sparql(tmp_path_factory, monkeypatch, facts):
    """Batched import (s|r|o) and the store-read build (the same facts as N-Triples, with
    literals and blank nodes) both count what SPARQL counts; with a small listing limit
    every hub row's targets are the listed ones."""
    monkeypatch.setattr(fanouts, "LISTED_TARGETS", 2)
    root = tmp_path_factory.mktemp("gen")
    src = generated_file(root / "kg.txt", facts)
    import_kg(src, root / "tsv")
    kg = EmbeddedKG.open(root / "tsv")
    assert table_counts(kg, all_iris(kg)) == sparql_counts(kg)
    hub_rows_agree(kg)
    kg.close()
    x = "http://x/"
    lines = [f"<{x}e{s}> <{x}r{r}> <{x}e{o}> ." for s, r, o in facts]
    lines += [f'<{x}e{s}> <{x}v> "{o % 3}" .' for s, _, o in facts[::3]]
    lines += [f"_:b{o % 4} <{x}r{r}> <{x}e{s}> ." for s, r, o in facts[::4]]
    nt = root / "kg.nt"
    nt.write_text("\n".join(lines) + "\n")
    import_kg(nt, root / "nt")
    kg = EmbeddedKG.open(root / "nt")
    assert table_counts(kg, all_iris(kg)) == sparql_counts(kg)
    hub_rows_agree(kg)
    kg.close()


def test_walks_through_hub_rows_are_the_walks_of_queries(tmp_path, monkeypatch):
    """With a listing limit of 2 most targets come from the table; the walk file is the
    one a store without the table gives, and the table was used."""
    monkeypatch.setattr(fanouts, "LISTED_TARGETS", 2)
    rng = random.Random(3)
    facts = [
        (rng.randrange(60), rng.randrange(5), int(rng.paretovariate(1.0)) % 60) for _ in range(900)
    ]
    import_kg(generated_file(tmp_path / "kg.txt", facts), tmp_path / "kg")
    table = FanoutTable.open(tmp_path / "kg")
    assert table is not None and table.meta["hub_rows"] > 20
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "kg", old)
    shutil.rmtree(old / FANOUTS_DIR)
    mix = "chain-1:1,chain-2:1,chain-3:1,2I:1,IP:1,PI:1"
    kw = {"n": 120, "seed": 4, "structures": mix, "max_fanout": 40, "max_answers": 30}
    picks = []
    real = FanoutTable.pick_target

    def counting(self, row, exclude, choose):
        picks.append(row)
        return real(self, row, exclude, choose)

    monkeypatch.setattr(FanoutTable, "pick_target", counting)
    a = walk_file(tmp_path / "kg", tmp_path / "a.parquet", **kw)
    assert len(picks) > 50
    assert walk_file(old, tmp_path / "b.parquet", **kw) == a


def test_a_table_of_another_profile_or_a_damaged_one_is_not_used(metaqa, tmp_path, caplog):
    other = EmbeddedKG(metaqa.store, get_profile("wikidata"), fanout_table=metaqa.fanout_table)
    assert KGGraph(other)._table is None
    assert KGGraph(metaqa)._table is not None
    broken = tmp_path / "kg"
    shutil.copytree(metaqa.location, broken)
    (broken / FANOUTS_DIR / "count.npy").write_bytes(b"not numpy")
    assert EmbeddedKG.open(broken).fanout_table is None
    assert "fan-out table not used" in caplog.text
