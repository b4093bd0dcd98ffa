"""The fan-out table stored at import (issue 20): its counts and hub targets are what SPARQL
counts and lists on the same store, the walker picks the same targets from it, and a store
imported without it still walks, to the same file."""

import hashlib
import random
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgsynth.core.stage import Reject
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.fanouts import FANOUTS_DIR, FanoutTable, TooMany, _distinct
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.importer import import_kg
from kgsynth.kg.profiles import get_profile
from kgsynth.resources import default_kg
from kgsynth.walk import WalkConfig, run_walks
from kgsynth.walk.records import Walk
from kgsynth.walk.sampler import WalkSampler

METAQA = default_kg()
GENRE = "http://kgsynth.org/entity/Drama"

# every (entity, predicate, direction) with its distinct neighbours other than the entity:
# the walker's fan-out query, over the whole store at once
ALL_FANOUTS = """
SELECT ?e ?r ?d (COUNT(DISTINCT ?x) AS ?n) WHERE {
  { ?e ?r ?x BIND("out" AS ?d) } UNION { ?x ?r ?e BIND("in" AS ?d) }
  FILTER(?x != ?e) FILTER(isIRI(?e))
} GROUP BY ?e ?r ?d
"""

NON_IRI_ROWS = """
SELECT DISTINCT ?e ?r ?d WHERE {
  { ?e ?r ?x BIND("out" AS ?d) } UNION { ?x ?r ?e BIND("in" AS ?d) }
  FILTER(!isIRI(?x)) FILTER(isIRI(?e))
}
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
        for iri, found in table.rows(iris).items()
        for p, d, n, _ in (found[0] if found else [])
        if not kg.profile.is_hidden(p)
    }


def all_iris(kg: EmbeddedKG) -> list[str]:
    rows = kg.select(
        "SELECT DISTINCT ?e WHERE { { ?e ?p ?o } UNION { ?s ?p ?e } FILTER(isIRI(?e)) }",
        max_rows=10_000_000,
    )
    return sorted(r["e"].value for r in rows)


def targets_and_names_agree(kg: EmbeddedKG, iris: list[str]) -> int:
    """For each of ``iris``, every row whose targets the table holds lists, in order, what
    the targets query returns, and names are the store's; returns how many rows were checked."""
    table = kg.fanout_table
    plain = KGGraph(EmbeddedKG(kg.store, kg.profile), cache_size=0)
    graph = KGGraph(kg)
    graph.prefetch_lookups(iris)
    checked = 0
    for iri in iris:
        if table.has_labels:
            assert graph.label(iri) == plain.label(iri)
        for rel in graph.fanouts(iri):
            row = graph._table_row(iri, rel)
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
    iris = all_iris(metaqa)
    assert len(want) > 100_000
    assert table_counts(metaqa, iris) == want
    # targets and names of a sample, and of the hubs: relations with thousands of targets
    # (a genre's films), read without listing them
    count = metaqa.fanout_table._count
    hubs = {e for (e, _, _), n in want.items() if n > 300}
    assert len(hubs) > 5 and int(count.max()) > 4000
    assert targets_and_names_agree(metaqa, sorted(hubs) + random.Random(0).sample(iris, 300)) > 300
    graph = KGGraph(metaqa)
    assert list(graph.named_iris()) == graph.name_index().all_iris()
    named = graph.named_iris()
    assert [named[k] for k in (0, 7, len(named) - 1)] == [
        graph.name_index().all_iris()[k] for k in (0, 7, len(named) - 1)
    ]


def test_choose_target_picks_what_a_listed_choice_picks(metaqa):
    """For hub relations, the table's pick with a seeded rng (some targets left out) is the
    element ``rng.choice`` takes from the listed targets, and the rng ends in the same state."""
    graph = KGGraph(metaqa)
    plain = KGGraph(EmbeddedKG(metaqa.store, metaqa.profile))
    rng = random.Random(5)
    hubs = []
    for iri in random.Random(1).sample(all_iris(metaqa), 4000):
        hubs += [(iri, rel) for rel, n in graph.fanouts(iri).items() if n > 300]
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


@pytest.mark.parametrize("shard", ["0/1", "1/3"])
def test_metaqa_walks_are_the_same_with_and_without_the_table(metaqa, tmp_path, shard):
    """A store imported before the table existed (no fanouts/) still walks, through the
    queries, to the same file byte for byte (a shard's seeds too: the table's lazy list of
    named entities is the name index's)."""
    old = tmp_path / "old"
    shutil.copytree(metaqa.location, old)
    shutil.rmtree(old / FANOUTS_DIR)
    assert EmbeddedKG.open(old).fanout_table is None
    with_table = walk_file(Path(metaqa.location), tmp_path / "a.parquet", shard=shard)
    without = walk_file(old, tmp_path / "b.parquet", shard=shard)
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
def test_generated_tables_match_sparql(tmp_path_factory, facts):
    """Batched import (s|r|o) and the store-read build (the same facts as N-Triples, with
    literals and blank nodes) both count what SPARQL counts, and every row's targets are the
    listed ones."""
    root = tmp_path_factory.mktemp("gen")
    src = generated_file(root / "kg.txt", facts)
    import_kg(src, root / "tsv")
    kg = EmbeddedKG.open(root / "tsv")
    assert table_counts(kg, all_iris(kg)) == sparql_counts(kg)
    assert targets_and_names_agree(kg, all_iris(kg)) == len(sparql_counts(kg))
    kg.close()
    x = "http://x/"
    lines = [f"<{x}e{s}> <{x}r{r}> <{x}e{o}> ." for s, r, o in facts]
    lines += [f'<{x}e{s}> <{x}v> "{o % 3}" .' for s, _, o in facts[::3]]
    lines += [f"_:b{o % 4} <{x}r{r}> <{x}e{s}> ." for s, r, o in facts[::4]]
    nt = root / "kg.nt"
    nt.write_text("\n".join(lines) + "\n")
    import_kg(nt, root / "nt")
    kg = EmbeddedKG.open(root / "nt")
    counts = sparql_counts(kg)
    assert table_counts(kg, all_iris(kg)) == counts
    # rows reaching a literal or a blank node are listed by the query, the others held
    mixed = {
        (r["e"].value, r["r"].value, r["d"].value)
        for r in kg.select(NON_IRI_ROWS)
        if not kg.profile.is_hidden(r["r"].value)
    }
    assert targets_and_names_agree(kg, all_iris(kg)) == len(counts) - len(mixed)
    kg.close()


def test_walks_through_table_rows_are_the_walks_of_queries(tmp_path, monkeypatch):
    """Targets picked from the table give the walk file a store without the table gives."""
    rng = random.Random(3)
    facts = [
        (rng.randrange(60), rng.randrange(5), int(rng.paretovariate(1.0)) % 60) for _ in range(900)
    ]
    import_kg(generated_file(tmp_path / "kg.txt", facts), tmp_path / "kg")
    table = FanoutTable.open(tmp_path / "kg")
    assert table is not None and table.meta["rows"] > 100
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


def answers_or_reason(sampler, walk):
    try:
        return sampler.answer_set(walk)
    except Reject as rej:
        return rej.reason


def test_answer_sets_from_the_table_are_the_query_results(tmp_path):
    """Every sampled walk's answer set (or reject: too many, unnamed, none) computed from the
    table is what its SPARQL query gives, self loops and topics in the paths included."""
    rng = random.Random(8)
    facts = [(rng.randrange(40), rng.randrange(4), rng.randrange(40) // 3) for _ in range(500)]
    facts += [(i, i % 4, i) for i in range(0, 40, 3)]  # self loops
    import_kg(generated_file(tmp_path / "kg.txt", facts), tmp_path / "kg")
    kg = EmbeddedKG.open(tmp_path / "kg")
    plain = EmbeddedKG(kg.store, kg.profile)
    mix = "chain-1:1,chain-2:1,chain-3:1,chain-4:1,2I:1,IP:1,PI:1"
    cfg = WalkConfig(n=10, structures=mix, max_fanout=30, max_answers=8)
    seeds = KGGraph(kg).named_iris()
    with_table = WalkSampler(KGGraph(kg), cfg, seeds)
    with_queries = WalkSampler(KGGraph(plain), cfg, seeds)
    assert with_table.graph.fanout_table is not None and with_queries.graph.fanout_table is None
    attempts = []
    for j in range(600):
        r = random.Random(j)
        attempts.append((j, r.choice(mix.split(",")).split(":")[0], r, r.choice(seeds)))
    walks = [w for w in with_table.sample_many(attempts).values() if isinstance(w, Walk)]
    assert len(walks) > 200
    results = [answers_or_reason(with_table, w) for w in walks]
    assert results == [answers_or_reason(with_queries, w) for w in walks]
    reasons = Counter(r if isinstance(r, str) else "answers" for r in results)
    assert reasons["answers"] > 50 and reasons["too_many_answers"] > 10, reasons


def test_follow_stops_at_too_many_or_gives_the_whole_union(metaqa):
    """A hop from thousands of entities (read chunk by chunk when a bound is given) raises
    TooMany exactly when the union passes the bound, and is the same union otherwise."""
    table = metaqa.fanout_table
    r = "http://kgsynth.org/relation/"
    drama = np.array([table.entities([GENRE])[GENRE][0]])
    films = table.follow(drama, f"{r}has_genre", "in")
    assert len(films) > 2000
    for predicate, direction in (
        ("directed_by", "out"),
        ("in_language", "out"),
        ("has_genre", "in"),
    ):
        whole = table.follow(films, f"{r}{predicate}", direction)
        for bound in (5, 50, len(whole) - 1, len(whole), 10**6):
            try:
                part = table.follow(films, f"{r}{predicate}", direction, more_than=bound)
            except TooMany:
                assert len(whole) > bound
            else:
                assert len(whole) <= bound and np.array_equal(part, whole)


@given(st.lists(st.integers(0, 2**32 - 1), max_size=300))
def test_distinct_is_np_unique(values):
    ids = np.array(values, dtype=np.uint32)
    got = _distinct(ids)
    assert got.dtype == np.uint32 and np.array_equal(got, np.unique(ids))


def test_batched_table_fanouts_are_the_query_fanouts_in_order(metaqa):
    """Fan-outs read for many entities at once (their rows put in relation order as arrays)
    are the fan-out queries', relation for relation in the same order; each relation's held
    row is the table's row; an IRI in no fact has none."""
    graph = KGGraph(metaqa)
    plain = KGGraph(EmbeddedKG(metaqa.store, metaqa.profile))
    nobody = "http://kgsynth.org/entity/nobody"
    iris = [GENRE, nobody, *random.Random(2).sample(all_iris(metaqa), 300)]
    graph.prefetch_lookups(fanouts=iris)
    table = metaqa.fanout_table
    checked = 0
    for iri in iris:
        got = graph.fanouts(iri)
        assert list(got.items()) == list(plain.fanouts(iri).items())
        found = table.rows([iri])[iri]
        rows = {(p, d): row for p, d, _, row in (found[0] if found else [])}
        for rel in got:
            row = rows[(rel.path[0], rel.direction)]
            assert graph._table_row(iri, rel) == (row if row >= 0 else None)
            checked += 1
    assert graph.fanouts(nobody) == {} and checked > 300


TRICKY_NT = """
<http://x/Émile%20Zola> <http://x/wrote> <http://x/Nana> .
<http://x/Émile%20Zola> <http://x/wrote> <http://x/Germinal> .
<http://x/Émile%20Zola> <http://x/note> "a \\"quoted\\"\\ttab\\nline" .
<http://x/Émile%20Zola> <http://x/note> "a \\"quoted\\"\\ttab\\nline"@fr .
<http://x/Émile%20Zola> <http://x/born> "1840"^^<http://www.w3.org/2001/XMLSchema#gYear> .
<http://x/Nana> <http://x/wrote> <http://x/Nana> .
_:b <http://x/wrote> <http://x/Germinal> .
<http://x/東京> <http://x/wrote> <http://x/Nana> .
<http://x/Nana> <http://www.w3.org/2000/01/rdf-schema#label> "Nana" .
"""


def test_table_from_an_n_triples_store_with_escapes_and_non_ascii(tmp_path):
    """The store-read build keeps non-ASCII IRIs and literals with escapes, language tags and
    datatypes apart as the store does."""
    nt = tmp_path / "kg.nt"
    nt.write_text(TRICKY_NT, encoding="utf-8")
    import_kg(nt, tmp_path / "kg")
    kg = EmbeddedKG.open(tmp_path / "kg")
    iris = all_iris(kg)
    assert "http://x/東京" in iris
    counts = table_counts(kg, iris)
    assert counts == sparql_counts(kg)
    assert counts[("http://x/Émile%20Zola", "http://x/note", "out")] == 2
    assert counts[("http://x/Germinal", "http://x/wrote", "in")] == 2
    # rows reaching a literal or a blank node are listed by queries; the others are held
    assert targets_and_names_agree(kg, iris) == len(counts) - 3


def test_entity_names_are_read_from_the_mapped_file_not_copied():
    """The IRIs and names stay in the memory-mapped entities.arrow (issue 20: a walk's heap
    must not grow with the KG); a column of several chunks is joined."""
    import pyarrow as pa

    from kgsynth.kg.fanouts import _one_array

    one = pa.chunked_array([pa.array(["a", "bc"], pa.large_string())])
    assert _one_array(one).buffers()[2].address == one.chunk(0).buffers()[2].address
    two = pa.chunked_array([["a"], ["bc"]], pa.large_string())
    assert _one_array(two).to_pylist() == ["a", "bc"]
