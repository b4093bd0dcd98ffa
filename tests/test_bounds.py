"""Every query is bounded: a row cap on every backend, timeouts on embedded stores too."""

from __future__ import annotations

import gc
import json
import resource
import time
from pathlib import Path

import psutil
import pyoxigraph as ox
import pytest

from kgsynth.core.errors import ConfigError, KGTimeoutError, QueryRefusedError, RowLimitError
from kgsynth.kg import open_kg
from kgsynth.kg.embedded import META_FILE, STORE_SUBDIR, EmbeddedKG
from kgsynth.kg.endpoint import SparqlEndpointKG
from kgsynth.kg.profiles import get_profile

CROSS = "SELECT * WHERE { ?a ?b ?c . ?d ?e ?f }"  # 3,000 triples: 9,000,000 rows
COUNT3 = "SELECT (COUNT(*) AS ?n) WHERE { ?a ?b ?c . ?d ?e ?f . ?g ?h ?i }"  # 2.7e10 to count
SORTED = "SELECT * WHERE { ?a ?b ?c . ?d ?e ?f } ORDER BY ?f ?a LIMIT 1"  # 9e6 rows held


def triples(n: int = 3_000) -> str:
    return "".join(
        f"<http://x.test/e{i}> <http://x.test/r{i % 7}> <http://x.test/e{(i * 13) % 2000}> .\n"
        for i in range(n)
    )


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store directory of 3,000 triples."""
    path = tmp_path_factory.mktemp("bounds-kg")
    store = ox.Store(str(path / STORE_SUBDIR))
    store.bulk_load(triples(), ox.RdfFormat.N_TRIPLES)
    store.flush()
    del store
    gc.collect()
    (path / META_FILE).write_text(json.dumps({"profile": "generic"}))
    return path


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_cross_product_stops_at_the_row_cap_in_seconds_with_bounded_memory(store_dir: Path):
    kg = EmbeddedKG.open(store_dir)
    assert kg.max_rows == 100_000
    rss = max_rss_mb()
    started = time.monotonic()
    with pytest.raises(RowLimitError, match="more than 100,000 rows"):
        kg.select(CROSS)
    assert time.monotonic() - started < 5
    assert max_rss_mb() - rss < 300  # 100,001 rows held at most, never the 9 million
    kg.close()


def test_cross_product_times_out_between_rows(store_dir: Path):
    kg = EmbeddedKG.open(store_dir, max_rows=10**9)
    started = time.monotonic()
    with pytest.raises(KGTimeoutError, match=r"timed out after 0\.3s"):
        kg.select(CROSS, timeout=0.3)
    assert time.monotonic() - started < 3
    kg.close()


def test_select_iter_caps_and_a_caller_may_stop_early(store_dir: Path):
    kg = EmbeddedKG.open(store_dir)
    rows = kg.select_iter(CROSS, max_rows=10)
    assert len([next(rows) for _ in range(10)]) == 10
    with pytest.raises(RowLimitError):
        next(rows)
    assert kg.select("SELECT ?s WHERE { ?s ?p ?o } LIMIT 5", max_rows=5)  # exactly at the cap
    kg.close()


@pytest.mark.parametrize("query", [COUNT3, SORTED])
def test_isolated_query_blocked_in_the_engine_is_killed_at_its_deadline(
    store_dir: Path, query: str
):
    """No row ever arrives: only a child process can be abandoned, and its memory is freed."""
    kg = EmbeddedKG.open(store_dir, isolate=True)
    assert kg.ask("ASK { ?s ?p ?o }")  # starts the child
    process = kg._process
    assert process is not None
    pid = process.pid
    assert pid is not None
    child = psutil.Process(pid)
    started = time.monotonic()
    with pytest.raises(KGTimeoutError, match="timed out after 1s"):
        kg.select(query, timeout=1)
    elapsed = time.monotonic() - started
    assert elapsed < 4
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert process.pid is None
    # the next query starts a new child and is answered
    assert len(kg.select("SELECT ?s WHERE { ?s ?p ?o } LIMIT 3")) == 3
    assert process.started == 2
    kg.close()


def test_isolated_row_cap_keeps_the_child(store_dir: Path):
    kg = EmbeddedKG.open(store_dir, isolate=True, max_rows=1_000)
    started = time.monotonic()
    with pytest.raises(RowLimitError, match="more than 1,000 rows"):
        kg.select(CROSS)
    assert time.monotonic() - started < 5
    assert len(kg.select("SELECT ?s WHERE { ?s ?p ?o } LIMIT 1000")) == 1000
    assert kg._process is not None and kg._process.started == 1
    with pytest.raises(QueryRefusedError):
        kg.select("SELECT * WHERE { ?s ?p ?o } ; DROP ALL")
    kg.close()


def test_isolated_and_inline_give_the_same_rows(store_dir: Path, embedded_kg: EmbeddedKG):
    inline = EmbeddedKG.open(store_dir)
    isolated = EmbeddedKG.open(store_dir, isolate=True)
    query = "SELECT ?s ?p ?o WHERE { ?s ?p ?o } ORDER BY ?s ?p ?o LIMIT 50"
    assert inline.select(query) == isolated.select(query)
    assert isolated.ask("ASK { ?s ?p ?o }") is True
    inline.close()
    isolated.close()


def test_isolation_needs_a_store_directory():
    with pytest.raises(ConfigError, match="isolate"):
        EmbeddedKG(ox.Store(), get_profile("generic"), isolate=True)


def test_open_kg_passes_the_bounds(store_dir: Path):
    kg = open_kg(store_dir, timeout=5, max_rows=7)
    assert (kg.timeout, kg.max_rows) == (5, 7)
    with pytest.raises(RowLimitError):
        kg.select(CROSS)
    kg.close()
    with pytest.raises(ConfigError, match="max_rows"):
        open_kg(store_dir, max_rows=0)


def test_endpoint_row_cap(oxigraph_endpoint: str):
    kg = SparqlEndpointKG(oxigraph_endpoint, get_profile("generic"))
    kg.max_rows = 5
    with pytest.raises(RowLimitError, match="more than 5 rows"):
        kg.select("SELECT * WHERE { ?s ?p ?o }")
    assert len(kg.select("SELECT * WHERE { ?s ?p ?o }", max_rows=1_000)) > 5
    kg.close()
