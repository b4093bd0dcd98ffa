"""Session fixtures: the fixture KG file, real Oxigraph and Virtuoso servers, an embedded KG.

Servers start at most once per session, only when a test asks for them; their start-up times
are printed in the terminal summary. ``KGSYNTH_CACHE`` points at a session temp dir so no test
writes to the user's cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import get_profile
from tests.kgfixtures import generated_movie_facts, generated_movie_questions, movie_ntriples
from tests.servers import (
    FIXTURE_NT,
    start_oxigraph,
    start_virtuoso,
    virtuoso_missing_reason,
    write_fixture_nt,
)

_STARTUP_TIMES = pytest.StashKey[dict[str, float]]()


@pytest.fixture(scope="session", autouse=True)
def kgsynth_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point ``KGSYNTH_CACHE`` at a session temp dir; restore the old value afterwards."""
    path = tmp_path_factory.mktemp("kgsynth-cache")
    old = os.environ.get("KGSYNTH_CACHE")
    os.environ["KGSYNTH_CACHE"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("KGSYNTH_CACHE", None)
        else:
            os.environ["KGSYNTH_CACHE"] = old


@pytest.fixture(scope="session")
def fixture_nt_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture KG (``tests.servers.FIXTURE_NT``) as an N-Triples file."""
    return write_fixture_nt(tmp_path_factory.mktemp("fixture-kg") / "kg.nt")


@pytest.fixture(scope="session")
def fb_small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Freebase-schema benchmark fixture KG (``tests/fixtures/benchmarks/fb_small.nt``)
    imported as `kgsynth kg import --profile freebase` does."""
    from typer.testing import CliRunner

    from kgsynth.cli import app

    nt = Path(__file__).resolve().parent / "fixtures" / "benchmarks" / "fb_small.nt"
    out = tmp_path_factory.mktemp("fb-small") / "kg"
    res = CliRunner().invoke(
        app, ["kg", "import", str(nt), "--out", str(out), "--profile", "freebase"]
    )
    assert res.exit_code == 0, res.output
    return out


def _record_startup(config: pytest.Config, name: str, seconds: float) -> None:
    config.stash.setdefault(_STARTUP_TIMES, {})[name] = seconds


@pytest.fixture(scope="session")
def oxigraph_endpoint(
    request: pytest.FixtureRequest,
    fixture_nt_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """URL of a read-only Oxigraph server holding the fixture KG."""
    with start_oxigraph(fixture_nt_path, tmp_path_factory.mktemp("oxigraph")) as server:
        _record_startup(request.config, "oxigraph load+start", server.startup_s)
        yield server.url


@pytest.fixture(scope="session")
def virtuoso_endpoint(
    request: pytest.FixtureRequest,
    fixture_nt_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """URL of a private Virtuoso 7.2 holding the fixture KG (skips when it is not installed)."""
    reason = virtuoso_missing_reason()
    if reason:
        pytest.skip(reason)
    with start_virtuoso(fixture_nt_path, tmp_path_factory.mktemp("virtuoso")) as server:
        _record_startup(request.config, "virtuoso start+load", server.startup_s)
        yield server.url


@pytest.fixture(scope="session")
def embedded_kg() -> Iterator[EmbeddedKG]:
    """The fixture KG in an in-memory pyoxigraph store."""
    kg = EmbeddedKG.from_ntriples(FIXTURE_NT, get_profile("generic"))
    yield kg
    kg.close()


@pytest.fixture(scope="session")
def movie_graph() -> KGGraph:
    """A generated movie KG (40 films), generic profile: the trial-and-error tests' graph."""
    kg = EmbeddedKG.from_ntriples(movie_ntriples(generated_movie_facts()), get_profile("generic"))
    return KGGraph(kg)


@pytest.fixture(scope="session")
def movie_questions(movie_graph: KGGraph, tmp_path_factory: pytest.TempPathFactory) -> list:
    """Template questions of 40 walks (seed 5) over :func:`movie_graph`."""
    return generated_movie_questions(movie_graph.kg, tmp_path_factory.mktemp("movie_questions"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    times = terminalreporter.config.stash.get(_STARTUP_TIMES, {})
    if times:
        terminalreporter.section("test SPARQL servers")
        for name, seconds in times.items():
            terminalreporter.write_line(f"{name}: {seconds:.2f}s")
