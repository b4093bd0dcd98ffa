"""`kgsynth walk`: real edges, fan-out limits, exact answer sets, determinism, resume, shards."""

import json
from collections import defaultdict

import pyarrow.parquet as pq
import pytest

from kgsynth.core.errors import ConfigError
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from kgsynth.walk import WalkConfig, WalkError, WalkState, run_walks, sample_walks
from tests.kgfixtures import freebase_kg, generated_movie_facts, movie_ntriples

FACTS = generated_movie_facts()
MIX = "chain-1:1,chain-2:1,chain-3:1,2I:1,IP:1,PI:1"


@pytest.fixture(scope="module")
def kg():
    return EmbeddedKG.from_ntriples(movie_ntriples(FACTS), get_profile("generic"))


def walk(kg, tmp_path, name="walks.parquet", **kw):
    cfg = WalkConfig(**{"n": 60, "seed": 3, "structures": MIX, "chunk_size": 7, **kw})
    result = run_walks(kg, cfg, tmp_path / name)
    return result, pq.read_table(tmp_path / name).to_pylist()


def adjacency():
    out, inv = defaultdict(set), defaultdict(set)
    for s, r, o in FACTS:
        out[(s, r)].add(o)
        inv[(o, r)].add(s)
    return out, inv


def step(names, hop, topics, out, inv):
    table = inv if hop["inverse"] else out
    return {x for n in names for x in table[(n, hop["relation"])]} - set(topics)


def brute_force(row):
    """Evaluate the walk's pattern over the fact list, topics removed after every hop."""
    out, inv = adjacency()
    topics = row["topic_names"]
    meets = []
    tails = []
    for topic, branch, merge in zip(topics, row["branches"], row["merge_at"], strict=True):
        current = {topic}
        for hop in branch[:merge]:
            current = step(current, hop, topics, out, inv)
        meets.append(current)
        tails.append(branch[merge:])
    answers = set.intersection(*meets)
    for hop in tails[0]:
        answers = step(answers, hop, topics, out, inv)
    return answers


def test_walks_are_real_exact_and_within_limits(kg, tmp_path):
    _, rows = walk(kg, tmp_path, min_fanout=1, max_fanout=6)
    assert len(rows) == 60
    out, inv = adjacency()
    graph = KGGraph(kg)
    for row in rows:
        # every hop is a real edge in the stated direction, from the previous entity on the path
        for topic, branch in zip(row["topic_names"], row["branches"], strict=True):
            prev = topic
            for hop in branch:
                table = inv if hop["inverse"] else out
                assert hop["entity"] in table[(prev, hop["relation"])], (row, hop)
                # the fan-out constraint d_min <= |N(e_t, r_t)| <= d_max
                assert 1 <= len(table[(prev, hop["relation"])] - {prev}) <= 6
                prev = hop["entity"]
        # no revisited entity on the sampled path
        path = row["topic_names"] + [h["entity"] for b in row["branches"] for h in b]
        if row["structure"].startswith("chain"):
            assert len(set(path)) == len(path)
        # the answer set is the full brute-force set, and the stored SPARQL reproduces it
        assert set(row["answer_names"]) == brute_force(row), row
        rows_sparql = {r["name"].value for r in kg.select(row["sparql"])}
        assert rows_sparql == set(row["answer_names"])
        assert row["sampled_answer"] in row["answer_names"]
        assert 1 <= len(row["answer_names"]) <= 10
        assert not set(row["answer_names"]) & set(row["topic_names"])
        assert row["hops"] == sum(len(b) for b in row["branches"])
    # conjunctions: two topics, different relations where the branches meet
    for row in rows:
        if row["structure"] in ("2I", "IP", "PI"):
            a, b = row["branches"]
            assert len(row["topic_names"]) == 2
            assert a[row["merge_at"][0] - 1]["relation"] != b[row["merge_at"][1] - 1]["relation"]
    assert graph  # the KG is unchanged and still usable


def test_structure_mix_follows_weights(kg, tmp_path):
    result, rows = walk(kg, tmp_path, n=60, structures="chain-2:0.5,2I:0.3,chain-1:0.2")
    counts = defaultdict(int)
    for r in rows:
        counts[r["structure"]] += 1
    assert dict(counts) == {"chain-2": 30, "2I": 18, "chain-1": 12}
    assert result["accepted_by_structure"] == {"2I": 18, "chain-1": 12, "chain-2": 30}
    assert sum(result["rejects"].values()) + 60 == result["attempts"]


def test_same_seed_same_file_other_seed_other_walks(kg, tmp_path):
    _, a = walk(kg, tmp_path, "a.parquet")
    _, b = walk(kg, tmp_path, "b.parquet")
    _, c = walk(kg, tmp_path, "c.parquet", seed=4)
    assert a == b
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert [r["walk_id"] for r in a] != [r["walk_id"] for r in c]
    assert len({r["walk_id"] for r in a}) == len(a)  # no duplicates


def test_resume_after_interrupt_gives_the_same_file(kg, tmp_path):
    _, full = walk(kg, tmp_path, "full.parquet")
    cfg = WalkConfig(n=60, seed=3, structures=MIX, chunk_size=7)
    target = tmp_path / "resumed.parquet"

    def die(state, accepted):
        if accepted == 25:
            raise KeyboardInterrupt  # what Ctrl-C does; kill -9 stops at the same point

    with pytest.raises(KeyboardInterrupt):
        run_walks(kg, cfg, target, progress=die)
    parts = tmp_path / "resumed.parquet.parts"
    assert not target.exists() and len(list(parts.glob("chunk-*.parquet"))) == 3
    # a kill -9 during a write leaves a temporary file and maybe a chunk without its state
    (parts / ".chunk-00003.parquet.tmp").write_bytes(b"partial")
    (parts / "chunk-00003.parquet").write_bytes(b"garbage")
    result = run_walks(kg, cfg, target)
    assert result["resumed_rows"] == 21
    assert pq.read_table(target).to_pylist() == full
    assert target.read_bytes() == (tmp_path / "full.parquet").read_bytes()
    assert not parts.exists()


def test_resume_refuses_other_options(kg, tmp_path):
    cfg = WalkConfig(n=60, seed=3, structures=MIX, chunk_size=7)

    def die(state, accepted):
        if accepted == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_walks(kg, cfg, tmp_path / "w.parquet", progress=die)
    with pytest.raises(ConfigError, match="other options"):
        run_walks(kg, WalkConfig(n=60, seed=4, structures=MIX), tmp_path / "w.parquet")
    assert (
        run_walks(kg, WalkConfig(n=5, seed=4), tmp_path / "w.parquet", overwrite=True)["accepted"]
        == 5
    )


def test_a_run_that_failed_before_its_first_chunk_does_not_block_the_next(kg, tmp_path):
    # issue 13: a failed walk left a .parts folder that refused the corrected command
    def die(state, accepted):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_walks(
            kg,
            WalkConfig(n=60, seed=3, structures=MIX, chunk_size=50),
            tmp_path / "w.parquet",
            progress=die,
        )
    assert not list((tmp_path / "w.parquet.parts").glob("chunk-*"))
    assert run_walks(kg, WalkConfig(n=5, seed=4), tmp_path / "w.parquet")["accepted"] == 5


def test_shards_merge_without_duplicates(kg, tmp_path):
    ids = []
    for i in range(2):
        _, rows = walk(kg, tmp_path, f"s{i}.parquet", n=30, shard=f"{i}/2")
        ids += [r["walk_id"] for r in rows]
    assert len(ids) == len(set(ids)) == 60


def test_whitelist_and_blacklist(kg, tmp_path):
    allow = tmp_path / "allow.txt"
    allow.write_text("directed_by\nstarred_actors\n")
    deny = tmp_path / "deny.txt"
    deny.write_text("starred_actors\n")
    _, rows = walk(kg, tmp_path, "w1.parquet", n=20, relations=str(allow), structures="chain-2:1")
    used = {h["relation"] for r in rows for b in r["branches"] for h in b}
    assert used <= {"directed_by", "starred_actors"}
    _, rows = walk(
        kg, tmp_path, "w2.parquet", n=20, exclude_relations=str(deny), structures="chain-1:1"
    )
    assert "starred_actors" not in {h["relation"] for r in rows for b in r["branches"] for h in b}


def test_unsatisfiable_constraints_end_with_counts(kg, tmp_path):
    with pytest.raises(WalkError, match="fanout="):
        run_walks(
            kg,
            WalkConfig(
                n=10, min_fanout=50, max_fanout=60, structures="chain-2:1", max_attempts_per_walk=20
            ),
            tmp_path / "none.parquet",
        )


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="--structures"):
        WalkConfig(structures="chain-9:1")
    with pytest.raises(ConfigError, match="--shard"):
        WalkConfig(shard="2/2")
    with pytest.raises(ConfigError, match="--min-fanout"):
        WalkConfig(min_fanout=5, max_fanout=2)


def test_endpoint_gives_the_same_walks(kg, tmp_path):
    from kgsynth.kg.open import open_kg
    from tests.servers import start_oxigraph

    nt = tmp_path / "kg.nt"
    nt.write_text(movie_ntriples(FACTS))
    _, embedded = walk(kg, tmp_path, "embedded.parquet", n=30)
    with start_oxigraph(nt, tmp_path / "oxi") as server:
        remote = open_kg(server.url)
        result = run_walks(
            remote,
            WalkConfig(n=30, seed=3, structures=MIX, chunk_size=7),
            tmp_path / "http.parquet",
        )
    http = pq.read_table(tmp_path / "http.parquet").to_pylist()
    assert result["accepted"] == 30
    assert http == embedded


def test_manifest_and_plot_from_the_cli(tmp_path):
    from typer.testing import CliRunner

    from kgsynth.cli import app

    kb = tmp_path / "kb.txt"
    kb.write_text("\n".join("|".join(f) for f in FACTS) + "\n")
    out = tmp_path / "run" / "walks.parquet"
    res = CliRunner().invoke(
        app, ["walk", "--kg", str(kb), "--n", "25", "--out", str(out), "--structures", MIX]
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "run" / "walks.manifest.json").read_text())
    assert manifest["accepted"] == 25 and manifest["output"]["rows"] == 25
    assert sum(manifest["rejects"].values()) + 25 == manifest["attempts"]
    assert manifest["relation_coverage"]["used"] >= 3
    assert (tmp_path / "run" / "walks_stats.png").stat().st_size > 10_000


def test_freebase_walks_cross_cvt_nodes_as_one_hop(tmp_path):
    from tests.kgfixtures import freebase_kg

    kg = freebase_kg()
    result = run_walks(kg, WalkConfig(n=5, seed=1, structures="chain-1:1"), tmp_path / "fb.parquet")
    rows = pq.read_table(tmp_path / "fb.parquet").to_pylist()
    assert result["accepted"] == 5
    relations = {h["relation"] for r in rows for b in r["branches"] for h in b}
    assert relations <= {
        "people.person.nationality",
        "people.person.date_of_birth",
        "film.actor.film.film.performance.film",
        "film.actor.film.film.performance.character",
        "film.film.starring.film.performance.actor",
        "film.film.starring.film.performance.character",
    }
    assert any(".film.performance." in r for r in relations)  # a flattened CVT hop was used
    assert not any(r.startswith(("type.", "common.")) for r in relations)
    for row in rows:  # the stored SPARQL (crossing the CVT) reproduces the answer set
        names = set()
        for r in kg.select(row["sparql"]):
            names.add(r["name"].value if "name" in r else r["answer"].value)
        assert names == set(row["answer_names"])


class CountingKG(EmbeddedKG):
    """Counts the queries it answers; ``cache_size=0`` makes its graphs keep nothing, so the
    walker runs one attempt at a time with one query per look-up."""

    def __init__(self, *args, cache_size: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.queries = 0
        self.cache_size = cache_size

    def _select(self, query, timeout):
        self.queries += 1
        return super()._select(query, timeout)

    def _select_iter(self, query, timeout):
        self.queries += 1
        return super()._select_iter(query, timeout)

    def graph(self, **kwargs):
        if self.cache_size is not None:
            kwargs["cache_size"] = self.cache_size
        return KGGraph(self, **kwargs)


def counting(source: EmbeddedKG, cache_size: int | None = None) -> CountingKG:
    return CountingKG(source.store, source.profile, cache_size=cache_size)


ALL = "chain-1:1,chain-2:1,chain-3:1,chain-4:1,chain-5:1,2I:1,IP:1,PI:1"


@pytest.mark.parametrize(
    ("source", "cfg"),
    [
        ("movies", WalkConfig(n=80, seed=3, structures=ALL, max_fanout=6)),
        ("movies", WalkConfig(n=40, seed=9, structures=MIX, min_fanout=2, max_answers=3)),
        ("movies", WalkConfig(n=30, seed=1, shard="1/2")),
        ("freebase", WalkConfig(n=5, seed=1, structures="chain-1:1,chain-2:1")),
    ],
)
def test_side_by_side_sampling_gives_the_walks_of_one_at_a_time(kg, source, cfg):
    """Attempts sampled side by side with batched look-ups give the rows, attempts and
    rejections of attempts sampled one at a time with one query per look-up."""
    base = kg if source == "movies" else freebase_kg()
    runs = []
    for cache_size in (None, 0):
        one = counting(base, cache_size)
        state = WalkState()
        rows = list(sample_walks(one, cfg, state=state, graph=one.graph()))
        runs.append((rows, state.next_attempt, dict(state.rejects), one.queries))
    (batched, *batched_state, batched_queries), (single, *single_state, single_queries) = runs
    assert len(batched) >= min(cfg.n, 30)  # one config gives up on chain-3 after 37
    assert batched == single
    assert batched_state == single_state
    if source == "movies":  # flattened hops (freebase) are looked up one by one
        assert batched_queries * 4 < single_queries


SELF_LOOPS = """
<http://x/a> <http://x/r> <http://x/a> .
<http://x/a> <http://x/r> <http://x/b> .
<http://x/b> <http://x/r> <http://x/a> .
<http://x/a> <http://x/s> "7"^^<http://www.w3.org/2001/XMLSchema#integer> .
<http://x/a> <http://www.w3.org/2002/07/owl#sameAs> <http://x/c> .
<http://x/a> <http://www.w3.org/2000/01/rdf-schema#label> "A" .
<http://x/b> <http://www.w3.org/2000/01/rdf-schema#label> "Bé"@fr .
<http://x/b> <http://www.w3.org/2000/01/rdf-schema#label> "B"@en .
<http://x/c> <http://x/r> <http://x/c> .
"""


@pytest.mark.parametrize("source", ["self-loops", "movies"])
def test_batched_lookups_equal_one_by_one(kg, source):
    """``prefetch_lookups`` fills the caches with what the one-by-one look-ups return (self
    loops excluded, hidden relations left out, names by language), in the same order, and the
    look-ups then send no query."""
    base = (
        EmbeddedKG.from_ntriples(SELF_LOOPS, get_profile("generic")) if source != "movies" else kg
    )
    entities = sorted(
        {
            t.value
            for r in base.select("SELECT ?e WHERE { { ?e ?p ?o } UNION { ?o ?p ?e } }")
            for t in r.values()
            if t.kind == "iri"
        }
    )
    reference = KGGraph(base, cache_size=0)
    fanouts = {e: list(reference.fanouts(e).items()) for e in entities}
    targets = {(e, rel): reference.targets(e, rel) for e in entities for rel, _ in fanouts[e]}
    labels = {e: reference.label(e) for e in entities}
    one = counting(base)
    graph = KGGraph(one)
    graph.prefetch_lookups(entities, list(targets), entities)
    sent = one.queries
    assert {e: list(graph.fanouts(e).items()) for e in entities} == fanouts
    assert {pair: graph.targets(*pair) for pair in targets} == targets
    assert {e: graph.label(e) for e in entities} == labels
    assert one.queries == sent
    if source == "self-loops":
        a, b = "http://x/a", "http://x/b"
        assert [(r.name, r.direction, n) for r, n in fanouts[a]] == [
            ("r", "in", 1),
            ("r", "out", 1),
            ("s", "out", 1),
        ]
        assert labels == {a: "A", b: "B", "http://x/c": None}


def test_wide_chain_one_walks_have_large_exact_answer_sets(kg, tmp_path):
    """--wide-share: some chain-1 walks take a relation with more than --max-fanout neighbours
    (up to --wide-max-answers) and keep every answer; the other structures keep the limits."""
    _, rows = walk(
        kg,
        tmp_path,
        n=40,
        structures="chain-1:1,chain-2:1",
        max_fanout=4,
        max_answers=4,
        wide_share=1.0,
        wide_max_answers=30,
    )
    wide = [r for r in rows if len(r["answer_names"]) > 4]
    assert wide and all(r["structure"] == "chain-1" for r in wide)
    for row in rows:
        assert set(row["answer_names"]) == brute_force(row), row
        limit = 30 if row["structure"] == "chain-1" else 4
        assert 1 <= len(row["answer_names"]) <= limit
    _, plain = walk(
        kg, tmp_path, "plain.parquet", n=40, structures="chain-1:1", max_fanout=4, max_answers=4
    )
    assert all(len(r["answer_names"]) <= 4 for r in plain)
    with pytest.raises(ConfigError, match="--wide-max-answers must be above --max-fanout"):
        WalkConfig(wide_share=0.5, max_fanout=20, wide_max_answers=20)
    with pytest.raises(ConfigError, match="--wide-share"):
        WalkConfig(wide_share=1.5)
