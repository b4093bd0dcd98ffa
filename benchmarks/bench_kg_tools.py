"""Tool-call throughput on the MetaQA KG: embedded pyoxigraph store vs Oxigraph over HTTP.

MetaQA KB (or ``--store DIR``) -> a printed table and ``benchmarks/results/kg_tools.json``::

    .venv/bin/python benchmarks/bench_kg_tools.py                 # imports MetaQA into a temp dir
    .venv/bin/python benchmarks/bench_kg_tools.py --store runs/x/kg --calls 500

For a fixed, seeded sample of entity names drawn from the KG, each with a MetaQA-style
question (BM25 ranks relations against it), the script times

- ``get_relations("name")`` and ``get_triples("name", [1-2 of its relations])`` through
  :meth:`ToolEnvironment.execute`, cold (a fresh :class:`KGGraph`, empty LRU caches) and warm
  (the same calls again on that graph, caches hit), once per tool on its own fresh graph;
- the raw engine rate of the one-hop ``SELECT ?r ?o WHERE { <e> ?r ?o }`` for the same
  entities: ``pyoxigraph.Store.query``, ``EmbeddedKG.select``, the endpoint's ``KG.select``
  (a keep-alive connection per thread since 2026-11-23; SPARQLWrapper with one connection per
  query before) and a plain keep-alive ``http.client`` POST;

on the embedded store and on ``oxigraph serve-read-only`` loaded with the same triples, in the
same run, each measurement taken for both backends back to back so that machine noise hits
both alike. The observations of both backends are compared text for text.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyoxigraph as ox  # noqa: E402

from kgsynth.agent.tools import ToolConfig, ToolEnvironment  # noqa: E402
from kgsynth.kg import sparql  # noqa: E402
from kgsynth.kg.base import KG  # noqa: E402
from kgsynth.kg.embedded import STORE_SUBDIR, EmbeddedKG, is_store_dir  # noqa: E402
from kgsynth.kg.endpoint import SparqlEndpointKG  # noqa: E402
from kgsynth.kg.graph import KGGraph  # noqa: E402
from kgsynth.kg.importer import import_kg  # noqa: E402
from tests.servers import start_oxigraph  # noqa: E402

DEFAULT_KG = ROOT / "kgsynth" / "resources" / "metaqa" / "kb_partial.txt.gz"
RUN_DATE = "2026-11-22"

# MetaQA-style questions; BM25 ranks the entity's relations against them.
QUESTION_TEMPLATES = (
    "who directed the movies starring {name}?",
    "what movies did {name} write?",
    "which genres are the films of {name}?",
    "when was {name} released?",
    "what language is {name} in?",
    "who acted in the films directed by {name}?",
    "what are the tags of {name}?",
    "what is the imdb rating of {name}?",
)


# --- shared set-up (bench_walk.py imports these) ---------------------------------------------


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
        )
    except OSError:
        sha, dirty = "", False
    return {
        "date": RUN_DATE,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyoxigraph": ox.__version__,
        "git": sha + ("+dirty" if dirty else ""),
    }


def prepare_store(store: Path | None, kg_file: Path, workdir: Path) -> Path:
    """``store`` when given, else ``kg_file`` imported into ``workdir/store``."""
    if store is not None:
        if not is_store_dir(store):
            sys.exit(f"--store: {store} is not a kgsynth store directory (kg.json + oxigraph/)")
        return store
    out = workdir / "store"
    started = time.perf_counter()
    report = import_kg(kg_file, out, force=True)
    print(
        f"imported {kg_file.name}: {report.triples:,} triples, {report.entities:,} entities "
        f"in {time.perf_counter() - started:.1f}s",
        flush=True,
    )
    return out


def dump_ntriples(store_dir: Path, out: Path) -> Path:
    """The store's default graph as N-Triples (what the Oxigraph server loads)."""
    store = ox.Store.read_only(str(store_dir / STORE_SUBDIR))
    store.dump(str(out), ox.RdfFormat.N_TRIPLES, from_graph=ox.DefaultGraph())
    del store
    return out


@contextlib.contextmanager
def oxigraph_endpoint(store_dir: Path, workdir: Path) -> Iterator[str]:
    """An ``oxigraph serve-read-only`` on 127.0.0.1 holding the store's triples; yields the
    query URL and stops the server (by its pid) on exit."""
    nt = dump_ntriples(store_dir, workdir / "kg.nt")
    with start_oxigraph(nt, workdir / "oxigraph", start_timeout=120.0) as server:
        print(
            f"oxigraph pid {server.pid} serving {server.url} (load + start {server.startup_s:.1f}s)",
            flush=True,
        )
        yield server.url


def isolated_cache(workdir: Path) -> None:
    """Point ``$KGSYNTH_CACHE`` at the work dir: the endpoint's name index (keyed by its URL,
    whose port changes every run) is built there, not in the user's cache."""
    os.environ["KGSYNTH_CACHE"] = str(workdir / "cache")


def time_wait_sockets() -> int | None:
    """TCP sockets in TIME_WAIT on this machine (Linux): each SPARQLWrapper query opens and
    closes a connection, and a long run fills the ephemeral port range with them."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                count += sum(1 for line in fh if line.split()[3] == "06")
        except OSError:
            return None
    return count


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


# --- the sample ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One sampled entity and the calls made for it."""

    iri: str
    name: str
    question: str
    relations: tuple[str, ...]

    def get_relations(self) -> str:
        return f"get_relations({json.dumps(self.name, ensure_ascii=False)})"

    def get_triples(self) -> str:
        rels = json.dumps(list(self.relations), ensure_ascii=False)
        return f"get_triples({json.dumps(self.name, ensure_ascii=False)}, {rels})"


def sample_probes(kg: EmbeddedKG, n: int, seed: int) -> list[Probe]:
    """``n`` named entities drawn with ``Random(seed)`` from the sorted IRIs, each with a
    question and its first one or two relation names (in ``relations()`` order)."""
    rng = random.Random(seed)
    if kg.name_index is None:
        sys.exit(f"{kg.location}: the store has no names.sqlite; re-import it")
    iris = kg.name_index.all_iris()
    picked = rng.sample(iris, min(n, len(iris)))
    graph = KGGraph(kg)  # a throwaway graph: the timed passes start from fresh ones
    probes = []
    for iri in picked:
        name = graph.label(iri)
        rels = list(dict.fromkeys(r.name for r in graph.relations(iri)))
        if name is None or not rels:
            continue
        k = rng.choice((1, 2))
        question = rng.choice(QUESTION_TEMPLATES).format(name=name)
        probes.append(Probe(iri, name, question, tuple(rels[:k])))
    return probes


# --- timing ----------------------------------------------------------------------------------


def time_calls(
    graph: KGGraph,
    probes: list[Probe],
    call: Callable[[Probe], str],
    budget_s: float | None = None,
) -> tuple[float, list[str], int]:
    """Run one tool call per probe, stopping after the call that passes ``budget_s``;
    (seconds, observations, number of error results)."""
    config = ToolConfig()
    texts: list[str] = []
    errors = 0
    started = time.perf_counter()
    for probe in probes:
        result = ToolEnvironment(graph, probe.question, config).execute(call(probe))
        texts.append(result.text)
        errors += not result.ok
        if budget_s is not None and time.perf_counter() - started > budget_s:
            break
    return time.perf_counter() - started, texts, errors


def one_hop(iri: str) -> str:
    return f"SELECT ?r ?o WHERE {{ {sparql.iri(iri)} ?r ?o }}"


def time_store_query(store: ox.Store, iris: list[str]) -> tuple[float, int]:
    rows = 0
    started = time.perf_counter()
    for iri in iris:
        rows += len(list(store.query(one_hop(iri))))
    return time.perf_counter() - started, rows


def time_select(kg: KG, iris: list[str]) -> tuple[float, int]:
    rows = 0
    started = time.perf_counter()
    for iri in iris:
        rows += len(kg.select(one_hop(iri)))
    return time.perf_counter() - started, rows


def time_keepalive_http(url: str, iris: list[str]) -> tuple[float, int]:
    """The same queries as plain POSTs over one keep-alive connection (no SPARQLWrapper)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    headers = {
        "Accept": "application/sparql-results+json",
        "Content-Type": "application/x-www-form-urlencoded",
    }
    rows = 0
    started = time.perf_counter()
    try:
        for iri in iris:
            body = urllib.parse.urlencode({"query": one_hop(iri)})
            conn.request("POST", parts.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                raise RuntimeError(f"{url} answered HTTP {response.status}: {data[:200]!r}")
            rows += len(json.loads(data)["results"]["bindings"])
    finally:
        conn.close()
    return time.perf_counter() - started, rows


def lookup_breakdown(kg: KG, probes: list[Probe]) -> dict[str, float]:
    """Milliseconds per uncached look-up, by kind, over ``probes`` (where cold time goes)."""
    graph = KGGraph(kg, cache_size=0)  # an LRU of size 0 never hits
    first = {p.iri: next(iter(graph.fanouts(p.iri))) for p in probes}
    kinds: dict[str, Callable[[Probe], object]] = {
        "resolve(name)": lambda p: graph.resolve(p.name),
        "  of which the exact-name query": lambda p: graph._exact_candidates(p.name),
        "label(iri)": lambda p: graph.label(p.iri),
        "fanouts(iri)": lambda p: graph.fanouts(p.iri),
        "neighbors(iri, first relation)": lambda p: graph.neighbors(p.iri, first[p.iri]),
    }
    out = {}
    for kind, fn in kinds.items():
        started = time.perf_counter()
        for probe in probes:
            fn(probe)
        out[kind] = round((time.perf_counter() - started) / len(probes) * 1000, 3)
    return out


def best(runs: list[tuple[float, int]]) -> tuple[float, int]:
    """The fastest of repeated runs (the least disturbed by other load on the machine)."""
    return min(runs, key=lambda r: r[0])


# --- the benchmark ---------------------------------------------------------------------------


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    isolated_cache(workdir)
    store_dir = prepare_store(args.store, args.kg, workdir)
    embedded = EmbeddedKG.open(store_dir)
    probes = sample_probes(embedded, args.calls, args.seed)
    iris = [p.iri for p in probes]
    print(f"{len(probes)} entities sampled (seed {args.seed})", flush=True)

    results: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "store": str(args.store) if args.store else None,
            "kg": str(args.kg),
            "calls": len(probes),
            "seed": args.seed,
            "repeats": args.repeats,
            "cold_budget_s": args.cold_budget,
            "breakdown": args.breakdown,
            "kg_meta": {k: embedded.meta.get(k) for k in ("triples", "facts", "entities")},
        },
    }

    with oxigraph_endpoint(store_dir, workdir) as url:
        endpoint = SparqlEndpointKG(url, embedded.profile, timeout=30.0)
        backends: dict[str, KG] = {"embedded": embedded, "http": endpoint}

        # Raw engine rate of the one-hop SELECT, best of --repeats.
        engine: dict[str, dict[str, float]] = {}
        runs: dict[str, list[tuple[float, int]]] = {
            k: [] for k in ("store_query", "embedded_select", "http_select", "http_keepalive")
        }
        for _ in range(args.repeats):
            runs["store_query"].append(time_store_query(embedded.store, iris))
            runs["embedded_select"].append(time_select(embedded, iris))
            runs["http_select"].append(time_select(endpoint, iris))
            runs["http_keepalive"].append(time_keepalive_http(url, iris))
        row_counts = {k: best(v)[1] for k, v in runs.items()}
        for key, timings in runs.items():
            seconds, rows = best(timings)
            engine[key] = {
                "queries_per_s": round(len(iris) / seconds, 1),
                "seconds": round(seconds, 3),
                "median_seconds": round(statistics.median(t for t, _ in timings), 3),
                "rows": rows,
            }
        print("one-hop SELECT measured", flush=True)

        breakdown_probes = probes[: args.breakdown]
        if breakdown_probes:
            results["lookup_ms"] = {
                name: lookup_breakdown(kg, breakdown_probes) for name, kg in backends.items()
            }
            print(f"look-ups timed on {len(breakdown_probes)} entities", flush=True)
        time_wait_before = time_wait_sockets()

        # Tool calls: cold on a fresh graph (embedded first: it fixes how many of the
        # sampled entities fit in --cold-budget, and HTTP runs the same prefix), then warm
        # on the same graph, best of --repeats passes.
        tools: dict[str, dict[str, Any]] = {}
        texts: dict[tuple[str, str, str], list[str]] = {}
        calls: dict[str, Callable[[Probe], str]] = {
            "get_relations": Probe.get_relations,
            "get_triples": Probe.get_triples,
        }
        for tool, call in calls.items():
            graphs = {name: KGGraph(kg) for name, kg in backends.items()}
            prefix = probes
            for phase in ("cold", "warm"):
                for name, graph in graphs.items():
                    queries_before = endpoint.stats["queries"]
                    if phase == "cold":
                        budget = args.cold_budget if name == "embedded" else None
                        seconds, out, errors = time_calls(graph, prefix, call, budget)
                        prefix = prefix[: len(out)]
                    else:
                        passes = [time_calls(graph, prefix, call) for _ in range(args.repeats)]
                        seconds, out, errors = min(passes, key=lambda r: r[0])
                    texts[(tool, phase, name)] = out
                    entry = {
                        "calls": len(out),
                        "calls_per_s": round(len(out) / seconds, 1),
                        "seconds": round(seconds, 3),
                        "error_results": errors,
                    }
                    if name == "http":
                        entry["http_queries"] = endpoint.stats["queries"] - queries_before
                    tools.setdefault(tool, {}).setdefault(phase, {})[name] = entry
                print(f"{tool} {phase} measured ({len(prefix)} calls)", flush=True)
            tools[tool]["calls"] = len(prefix)
            tools[tool]["cut_by_cold_budget"] = len(prefix) < len(probes)
            for name, graph in graphs.items():
                tools[tool]["cache_stats_" + name] = graph.cache_stats()
        results["http_retries"] = endpoint.stats["retries"]
        results["time_wait_sockets"] = {
            "before_tools": time_wait_before,
            "after": time_wait_sockets(),
        }

    # Consistency: both backends, and cold vs warm, must show the same observations.
    mismatches: dict[str, Any] = {}
    for tool in calls:
        for a, b in (
            (("cold", "embedded"), ("cold", "http")),
            (("cold", "embedded"), ("warm", "embedded")),
            (("cold", "http"), ("warm", "http")),
        ):
            left, right = texts[(tool, *a)], texts[(tool, *b)]
            if len(left) != len(right):
                mismatches[f"{tool}: {'/'.join(a)} vs {'/'.join(b)} lengths"] = [
                    len(left),
                    len(right),
                ]
                continue
            diff = [i for i, (x, y) in enumerate(zip(left, right, strict=True)) if x != y]
            if diff:
                i = diff[0]
                mismatches[f"{tool}: {'/'.join(a)} vs {'/'.join(b)}"] = {
                    "count": len(diff),
                    "first_call": calls[tool](probes[i]),
                    "left": left[i][:500],
                    "right": right[i][:500],
                }
    if len(set(row_counts.values())) != 1:
        mismatches["one-hop rows"] = row_counts

    ratios = {
        "engine_store_query_vs_http_select": ratio(
            engine["store_query"]["queries_per_s"], engine["http_select"]["queries_per_s"]
        ),
        "engine_embedded_select_vs_http_select": ratio(
            engine["embedded_select"]["queries_per_s"], engine["http_select"]["queries_per_s"]
        ),
        "engine_store_query_vs_http_keepalive": ratio(
            engine["store_query"]["queries_per_s"], engine["http_keepalive"]["queries_per_s"]
        ),
    }
    for tool, phases in tools.items():
        for phase in ("cold", "warm"):
            ratios[f"{tool}_{phase}_embedded_vs_http"] = ratio(
                phases[phase]["embedded"]["calls_per_s"], phases[phase]["http"]["calls_per_s"]
            )
        for name in backends:
            ratios[f"{tool}_{name}_warm_vs_cold"] = ratio(
                phases["warm"][name]["calls_per_s"], phases["cold"][name]["calls_per_s"]
            )
    results.update({"engine": engine, "tools": tools, "ratios": ratios, "mismatches": mismatches})
    return results


def print_table(results: dict[str, Any]) -> None:
    engine, tools, ratios = results["engine"], results["tools"], results["ratios"]
    n = results["config"]["calls"]
    m = results["machine"]
    print()
    print(f"kg tools benchmark — {n} entities, {m['cpus']} CPUs, pyoxigraph {m['pyoxigraph']}")
    print(f"{'measure':<40}{'embedded /s':>14}{'HTTP /s':>12}{'emb/HTTP':>10}")
    print("-" * 76)
    print(
        f"{'one-hop SELECT: Store.query vs KG.select':<40}"
        f"{engine['store_query']['queries_per_s']:>14,.0f}"
        f"{engine['http_select']['queries_per_s']:>12,.0f}"
        f"{ratios['engine_store_query_vs_http_select']:>9}x"
    )
    print(
        f"{'one-hop SELECT: both via KG.select':<40}"
        f"{engine['embedded_select']['queries_per_s']:>14,.0f}"
        f"{engine['http_select']['queries_per_s']:>12,.0f}"
        f"{ratios['engine_embedded_select_vs_http_select']:>9}x"
    )
    print(
        f"{'one-hop SELECT: HTTP keep-alive POST':<40}"
        f"{engine['store_query']['queries_per_s']:>14,.0f}"
        f"{engine['http_keepalive']['queries_per_s']:>12,.0f}"
        f"{ratios['engine_store_query_vs_http_keepalive']:>9}x"
    )
    for tool, phases in tools.items():
        for phase in ("cold", "warm"):
            emb, web = phases[phase]["embedded"], phases[phase]["http"]
            print(
                f"{tool + ' (' + phase + ')':<40}{emb['calls_per_s']:>14,.0f}"
                f"{web['calls_per_s']:>12,.0f}"
                f"{ratios[f'{tool}_{phase}_embedded_vs_http']:>9}x"
            )
    print("-" * 76)
    for tool, phases in tools.items():
        if phases["cut_by_cold_budget"]:
            print(
                f"{tool}: cold pass cut by --cold-budget: all {tool} rows are over the first "
                f"{phases['calls']} of the {n} sampled entities"
            )
        print(
            f"{tool}: warm/cold {ratios[f'{tool}_embedded_warm_vs_cold']}x embedded, "
            f"{ratios[f'{tool}_http_warm_vs_cold']}x HTTP; HTTP queries cold "
            f"{phases['cold']['http']['http_queries']:,}, warm {phases['warm']['http']['http_queries']:,}; "
            f"error results {phases['cold']['embedded']['error_results']}"
        )
    if "lookup_ms" in results:
        lookups = results["lookup_ms"]
        count = results["config"]["breakdown"]
        print(f"uncached look-ups, ms each (first {count} entities):")
        print(f"  {'look-up':<38}{'embedded':>12}{'HTTP':>12}")
        for kind, ms in lookups["embedded"].items():
            print(f"  {kind:<38}{ms:>12.3f}{lookups['http'][kind]:>12.3f}")
    if results["mismatches"]:
        print("MISMATCHES:")
        for key, value in results["mismatches"].items():
            print(f"  {key}: {json.dumps(value, ensure_ascii=False)[:600]}")
    else:
        print("observations identical: embedded vs HTTP, cold vs warm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="an imported store dir (default: import --kg)")
    parser.add_argument("--kg", type=Path, default=DEFAULT_KG, help="triple file to import")
    parser.add_argument("--calls", type=int, default=2000, help="entities (calls per pass)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of the one-hop SELECT and warm passes"
    )
    parser.add_argument(
        "--cold-budget",
        type=float,
        default=25.0,
        help="seconds per tool for the embedded cold pass; when it runs out, every pass of "
        "that tool uses the prefix of the sample done so far",
    )
    parser.add_argument(
        "--breakdown", type=int, default=30, help="entities for the per-look-up timing (0: none)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/kg_tools.json")
    args = parser.parse_args()
    if args.calls < 1 or args.repeats < 1:
        parser.error("--calls and --repeats must be >= 1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kgsynth-bench-") as tmp:
        results = run(args, Path(tmp))
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.out} ({results['elapsed_s']}s)")


if __name__ == "__main__":
    main()
