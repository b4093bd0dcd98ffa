"""Queries an agent writes are bounded in time and memory on a store directory (issue 41).

pyoxigraph checks no deadline inside the engine: an in-process ``COUNT`` over a cross product
or over a ``(p|^p)*`` path returns no row until it has computed everything, so before the
agent path ran in a killable child process one such query held its episode (and the eval, RL
or synthesis run around it) for as long as it computed. Each SPARQL-writing tool set is driven
here the way eval, synthesis and RL drive it (:func:`kgsynth.agent.episode.step` over a
:class:`~kgsynth.agent.tools.ToolEnvironment` whose config sets ``query_timeout_s``): the
runaway query comes back as a typed timeout within the limit plus a margin, and the episode
goes on. The store is a directory, as every store a user opens is.

The KG: the generated movie facts with 300 movies, 2,648 triples. In-process, the cartesian
COUNT below runs past 30 s and the path COUNT past 60 s (measured), far past the 1.5 s limit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kgsynth.agent.config import AgentConfig
from kgsynth.agent.episode import Episode, EpisodeTask, step
from kgsynth.agent.sparql_exec import AGENT_QUERY_TIMEOUT_S
from kgsynth.agent.tools import ErrorType, ToolEnvironment
from kgsynth.core.errors import ConfigError
from kgsynth.kg.embedded import EmbeddedKG
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.importer import import_kg
from tests.kgfixtures import generated_movie_facts

# a regression hangs inside the engine, where pytest-timeout's signal never lands: end the run
pytestmark = pytest.mark.timeout(240, method="thread")

E = "http://kgsynth.org/entity/"
R = "http://kgsynth.org/relation/"
LIMIT_S = 1.5
MARGIN_S = 3.0  # a kill, a wait for the child, the observation's rendering; never seconds more
CARTESIAN = "SELECT (COUNT(*) AS ?n) WHERE { ?a ?b ?c . ?d ?e ?f . ?g ?h ?i }"
STARRED = f"(<{R}starred_actors>|^<{R}starred_actors>)*"
PATH = f"SELECT (COUNT(*) AS ?n) WHERE {{ ?a {STARRED} ?b . ?b {STARRED} ?c }}"
NORMAL = f"SELECT ?d WHERE {{ <{E}Movie%200> <{R}directed_by> ?d }}"
# a sort that holds every row of a cross product (7 million): memory, long before time
SORTED = "SELECT * WHERE { ?a ?b ?c . ?d ?e ?f } ORDER BY ?f ?a LIMIT 1"

# each SPARQL-writing tool set's turn around a query, as the policy writes it
TURNS = {
    "isp": "<think>count</think><SPARQL>{query}</SPARQL>",
    "knowcoder": '<think>count</think><kg-query>ExecuteSPARQL("{query}")</kg-query>',
}


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The movie facts (300 movies) imported into a store directory."""
    root = tmp_path_factory.mktemp("agent-bounds")
    kb = root / "kb.txt"
    kb.write_text("\n".join("|".join(f) for f in generated_movie_facts(movies=300)) + "\n")
    import_kg(kb, root / "store", profile="generic", force=True)
    return root / "store"


@pytest.fixture
def kg(store_dir: Path):
    kg = EmbeddedKG.open(store_dir)
    yield kg
    kg.close()


def environment(kg: EmbeddedKG, toolset: str, timeout: float = LIMIT_S) -> ToolEnvironment:
    """A tool environment as eval builds one: the agent's config sets the query timeout."""
    config = AgentConfig(toolset=toolset, query_timeout_s=timeout)  # type: ignore[arg-type]
    return ToolEnvironment(KGGraph(kg), "who directed Movie 0", config)


def timed_step(ep: Episode, env: ToolEnvironment, text: str) -> float:
    """Apply one policy turn; the seconds it took."""
    started = time.monotonic()
    step(ep, env, text, None, final=False)
    return time.monotonic() - started


@pytest.mark.parametrize("toolset", list(TURNS))
@pytest.mark.parametrize("query", [CARTESIAN, PATH], ids=["cartesian-count", "path-count"])
def test_a_runaway_query_is_a_typed_timeout_and_the_episode_goes_on(
    kg: EmbeddedKG, toolset: str, query: str
):
    env = environment(kg, toolset)
    ep = Episode(EpisodeTask(env.question, ["Movie 0"]))
    timed_step(ep, env, TURNS[toolset].format(query=NORMAL))  # the child starts here
    assert ep.turns[-1].tool_error is None, ep.turns[-1].observation
    elapsed = timed_step(ep, env, TURNS[toolset].format(query=query))
    turn = ep.turns[-1]
    assert turn.tool_error == ErrorType.TIMEOUT.value, turn.observation
    assert turn.observation == "Error (timeout): the KG query timed out; try a narrower call."
    assert LIMIT_S <= elapsed < LIMIT_S + MARGIN_S
    assert not ep.done
    # the killed child is replaced and the next query of the episode answers
    elapsed = timed_step(ep, env, TURNS[toolset].format(query=NORMAL))
    assert ep.turns[-1].tool_error is None
    assert ep.turns[-1].observation == "?d\nDirector 5"
    assert elapsed < MARGIN_S
    process = kg.agent_process()
    assert process is not None and process.started == 2


def test_an_sexpr_chain_that_explodes_is_a_typed_timeout_and_the_episode_goes_on(
    kg: EmbeddedKG,
):
    """KBQA-R1's actions compile to one query per step that the agent composes: a chain of
    Find_relation steps joins without a DISTINCT between hops, about ten times the work each
    step (in-process: 0.5 s at the sixth, 4 s at the seventh, 47 s at the eighth). A step may
    run two queries (its rows, then a COUNT when they pass the row cap), each bounded."""
    env = environment(kg, "sexpr")
    ep = Episode(EpisodeTask(env.question, ["Movie 0"]))
    turn = "<think>hop</think><action>Find_relation [ {} | {} ]</action>"  # KBQA-R1's format
    elapsed = timed_step(ep, env, turn.format("Movie 0", "(R starred_actors)"))
    assert ep.turns[-1].tool_error is None, ep.turns[-1].observation
    for n in range(1, 13):
        rel = "starred_actors" if n % 2 else "(R starred_actors)"
        elapsed = timed_step(ep, env, turn.format(f"expression{n}", rel))
        assert elapsed < 2 * LIMIT_S + MARGIN_S, (n, elapsed)
        if ep.turns[-1].tool_error is not None:
            break
    last = ep.turns[-1]
    assert last.tool_error == ErrorType.TIMEOUT.value, last.observation
    assert n >= 4  # the short chains answered
    elapsed = timed_step(ep, env, turn.format("Movie 1", "(R directed_by)"))
    assert ep.turns[-1].tool_error is None, ep.turns[-1].observation
    assert f"expression{n + 1} = (JOIN (R directed_by)" in (ep.turns[-1].observation or "")
    assert elapsed < MARGIN_S


def test_a_query_past_its_memory_limit_is_stopped_and_typed(store_dir: Path):
    kg = EmbeddedKG.open(store_dir, agent_memory=256 << 20)
    env = environment(kg, "isp", timeout=60.0)  # memory, not time, stops it
    ep = Episode(EpisodeTask(env.question, ["Movie 0"]))
    elapsed = timed_step(ep, env, TURNS["isp"].format(query=SORTED))
    turn = ep.turns[-1]
    assert turn.tool_error == ErrorType.TIMEOUT.value
    assert turn.observation == (
        "Error (timeout): the query needed more than its memory limit (0.25 GiB) and was "
        "stopped; try a narrower query."
    )
    assert elapsed < 30
    timed_step(ep, env, TURNS["isp"].format(query=NORMAL))
    assert ep.turns[-1].observation == "?d\nDirector 5"
    kg.close()
    with pytest.raises(ConfigError, match="agent_memory"):
        EmbeddedKG.open(store_dir, agent_memory=0)


def test_only_agent_queries_run_in_the_child(kg: EmbeddedKG):
    """kgsynth's own fixed-form look-ups stay in-process (thousands a second); the agent's
    queries share one child per store, which survives normal queries."""
    graph = KGGraph(kg)
    resolution = graph.resolve("Movie 0")
    assert resolution is not None and graph.relations(resolution.entity.iri)
    process = kg.agent_process()
    assert process is not None and process.pid is None  # nothing started it yet
    env = environment(kg, "knowcoder")
    for _ in range(3):
        assert env.execute(f'ExecuteSPARQL("{NORMAL}")').text == "?d\nDirector 5"
    assert env.execute(f'ExecuteSPARQL("ASK {{ <{E}Movie%200> ?p ?o }}")').text == "true"
    assert process.started == 1 and process.pid not in (None, os.getpid())


def test_a_store_in_memory_runs_agent_queries_in_process(kg: EmbeddedKG):
    """No directory, no child: the documented fallback (tests' in-memory stores)."""
    memory = EmbeddedKG(kg.store, kg.profile)
    assert memory.agent_process() is None
    env = environment(memory, "isp")
    assert env.execute(f'sparql("{NORMAL}")').text == "?d\nDirector 5"


def test_the_agent_query_timeout_is_a_setting():
    assert AgentConfig().query_timeout_s == AGENT_QUERY_TIMEOUT_S == 10.0
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match="query_timeout_s"):
            AgentConfig(query_timeout_s=bad)


def test_kg_tool_returns_within_the_agent_timeout(store_dir: Path):
    """``kgsynth kg tool`` builds the tool environment as eval does, with the default agent
    timeout: the cartesian COUNT, which ran until killed, is a timeout within it."""
    command = [sys.executable, "-m", "kgsynth.cli", "kg", "tool", "--kg", str(store_dir)]
    started = time.monotonic()
    done = subprocess.run(
        [*command, "--toolset", "isp", f'sparql("{CARTESIAN}")'],
        capture_output=True,
        text=True,
        timeout=AGENT_QUERY_TIMEOUT_S + 30,
        env={**os.environ, "COLUMNS": "200"},
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Error (timeout): the KG query timed out" in done.stdout
    assert "tool error type: timeout" in done.stderr
    assert elapsed < AGENT_QUERY_TIMEOUT_S + 10  # the CLI's start, then the query's limit


def test_kg_tool_takes_the_agent_query_timeout(store_dir: Path):
    """``kg tool --query-timeout-s 2``: the same runaway COUNT is a timeout within 2 s (plus the
    CLI's start), not the default 10."""
    command = [sys.executable, "-m", "kgsynth.cli", "kg", "tool", "--kg", str(store_dir)]
    started = time.monotonic()
    done = subprocess.run(
        [*command, "--toolset", "knowcoder", "--query-timeout-s", "2",
         f'ExecuteSPARQL("{CARTESIAN}")'],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert "Error (timeout)" in done.stdout, done.stdout + done.stderr
    assert elapsed < AGENT_QUERY_TIMEOUT_S, elapsed
