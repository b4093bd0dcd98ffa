"""Walk sampling speed: ``sample_walks`` as shipped vs a naive walker, embedded and over HTTP.

MetaQA KB (or ``--store DIR``) -> a printed table and ``benchmarks/results/walk.json``::

    .venv/bin/python benchmarks/bench_walk.py
    .venv/bin/python benchmarks/bench_walk.py --store runs/x/kg --n 500 --naive-budget 30

Both walkers run the same algorithm (:func:`kgsynth.walk.sample_walks` and its
:class:`WalkSampler`) with ``WalkConfig(n=--n, seed=--seed)``; they differ only in the
:class:`KGGraph` the sampler reads the KG through:

- fast: :class:`KGGraph` as shipped. It caches, so ``sample_walks`` samples the coming
  attempts side by side and fetches their look-ups in batched ``VALUES`` queries, a few per
  round (:meth:`KGGraph.prefetch_lookups`);
- naive: :class:`NaiveKGGraph` — ``cache_size=0``, so every LRU misses (checked from
  ``cache_stats()`` after the run) and ``sample_walks`` runs one attempt at a time; fan-outs
  are computed with one ``SELECT DISTINCT ?r`` per direction then one neighbour list per
  relation and direction; neighbours and names are one query per look-up.

The fast walker runs all ``--n`` walks, its clock read at every accepted walk; the naive
walker then runs until it has all ``--n`` walks or its time budget is spent (it stops at a walk
boundary, after K accepted walks); then the fast walker runs all walks again. The speed-up
compares both on the same K-walk prefix: the fast time is the mean of its two runs' clocks at
walk K (the same work, since both are deterministic; one run on each side of the naive run sees
the machine's load as it was during it). Walks must come out identical (same rows, same
walk_ids, same order, same attempts and rejections); the script checks it and, when they
differ, names the first differing walk and which look-up disagreed. Every query is timed by
kind, and each run's process CPU time is reported, so the output says where the time goes.
The same comparison then runs over ``oxigraph serve-read-only`` loaded with the same triples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_kg_tools import (  # noqa: E402
    DEFAULT_KG,
    isolated_cache,
    machine_info,
    oxigraph_endpoint,
    prepare_store,
    ratio,
    time_wait_sockets,
)

from kgsynth.kg import sparql  # noqa: E402
from kgsynth.kg.base import KG  # noqa: E402
from kgsynth.kg.embedded import EmbeddedKG  # noqa: E402
from kgsynth.kg.endpoint import SparqlEndpointKG  # noqa: E402
from kgsynth.kg.graph import KGGraph, Relation  # noqa: E402
from kgsynth.kg.terms import Row, Term  # noqa: E402
from kgsynth.walk import WalkConfig, WalkState, sample_walks  # noqa: E402

SPEEDUP_TARGET = 10.0


class NaiveKGGraph(KGGraph):
    """The baseline the issue names: "a naive sequential walker (one SPARQL query per
    neighbor/relation look-up, no caching, no batching)".

    The same sampler runs on it (so both walkers must produce the same walks), but every
    look-up is its own query and nothing is kept: an entity's relations are listed (one query
    per direction), each relation's neighbours are listed (one query per relation; the fan-out
    is their count), each listed neighbour's name is looked up (one query per neighbour), and
    nothing is prefetched. Only profiles without flattened unnamed nodes are supported.
    """

    def __init__(self, kg: KG, **kwargs: Any) -> None:
        kwargs["cache_size"] = 0
        super().__init__(kg, **kwargs)
        if self.profile.flatten_unnamed:
            raise SystemExit(
                f"the naive walker does not flatten unnamed nodes ({self.profile.name})"
            )

    def prefetch(self, iris: Any, *, max_targets: int = 0) -> None:
        return None  # no batching

    def prefetch_labels(self, iris: Any) -> None:
        return None  # no batching

    def _list(self, iri: str, rel: Relation) -> list[Term]:
        node = sparql.iri(iri)
        rows = self.kg.select(
            f"SELECT DISTINCT ?x WHERE {{ {self.pattern(node, rel, '?x')} FILTER(?x != {node}) }}"
        )
        return [r["x"] for r in rows]

    def _fetch_fanouts(self, iri: str) -> dict[Relation, int]:
        node = sparql.iri(iri)
        prof = self.profile
        rels: dict[Relation, int] = {}
        for direction, list_query in (
            ("out", f"SELECT DISTINCT ?r WHERE {{ {node} ?r ?o }}"),
            ("in", f"SELECT DISTINCT ?r WHERE {{ ?s ?r {node} }}"),
        ):
            for row in self.kg.select(list_query):
                predicate = row["r"].value
                if prof.is_hidden(predicate):
                    continue
                rel = Relation(prof.relation_name(predicate), direction, (predicate,))  # type: ignore[arg-type]
                n = len(self._list(iri, rel))
                if n > 0:
                    rels[rel] = n
        return dict(sorted(rels.items(), key=lambda kv: (kv[0].name, kv[0].direction, kv[0].path)))

    def _fetch_targets(self, iri: str, relation: Relation) -> tuple[Term, ...]:
        terms = self._list(iri, relation)
        for term in terms:  # a candidate list of (entity, name): one query per neighbour
            if term.kind == "iri":
                self.label(term.value)
        return tuple(sorted(terms, key=lambda t: t.value))


QUERY_KINDS = (
    ("neighbors", re.compile(r"^SELECT \?o \?l WHERE")),
    ("label", re.compile(r"^SELECT \?l WHERE")),
    ("fanouts: grouped count", re.compile(r"^SELECT \?r \(COUNT")),
    ("fanouts: relation list", re.compile(r"^SELECT DISTINCT \?r WHERE")),
    ("fanouts: one count", re.compile(r"^SELECT \(COUNT\(DISTINCT")),
    ("answer set", re.compile(r"^SELECT DISTINCT \?answer")),
    ("relation frequency", re.compile(r"^SELECT \?p \(COUNT\(\*\)")),
    ("batched fan-outs", re.compile(r"^SELECT \?k \?d \?r \(COUNT")),
    ("batched targets", re.compile(r"^SELECT DISTINCT \?k \?x WHERE")),
    ("batched names", re.compile(r"^SELECT \?x \?l WHERE \{ VALUES")),
    ("targets: one relation", re.compile(r"^SELECT DISTINCT \?o \?l WHERE")),
    ("neighbour list", re.compile(r"^SELECT DISTINCT \?x WHERE")),
)


def query_kind(query: str) -> str:
    """Which look-up a query is (by the shape KGGraph and WalkSampler write it in)."""
    for kind, pattern in QUERY_KINDS:
        if pattern.match(query):
            return kind
    return "other"


class CountingKG(KG):
    """Forwards to ``inner``, counts the queries, and hands out ``graph_cls`` graphs (passed
    to :func:`sample_walks`), so that the walker runs on the graph under test."""

    def __init__(self, inner: KG, graph_cls: type[KGGraph]) -> None:
        self.inner = inner
        self.graph_cls = graph_cls
        self.profile = inner.profile
        self.location = inner.location
        self.name_index = getattr(inner, "name_index", None)
        self.queries = 0
        self.by_kind: dict[str, list[float]] = {}  # kind -> [queries, seconds]
        self.graphs: list[KGGraph] = []

    def _select(self, query: str, timeout: float | None) -> list[Row]:
        self.queries += 1
        started = time.perf_counter()
        try:
            return self.inner._select(query, timeout)
        finally:
            entry = self.by_kind.setdefault(query_kind(query), [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - started

    def _select_iter(self, query: str, timeout: float | None) -> Iterator[Row]:
        """The inner backend's rows as they come (an embedded store stops evaluating when the
        reader stops); the time spent producing them is counted as query time."""
        self.queries += 1
        entry = self.by_kind.setdefault(query_kind(query), [0, 0.0])
        entry[0] += 1
        started = time.perf_counter()
        rows = self.inner._select_iter(query, timeout)
        entry[1] += time.perf_counter() - started
        while True:
            started = time.perf_counter()
            try:
                row = next(rows)
            except StopIteration:
                return
            finally:
                entry[1] += time.perf_counter() - started
            yield row

    def _ask(self, query: str, timeout: float | None) -> bool:
        self.queries += 1
        return self.inner._ask(query, timeout)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def graph(self, **kwargs: Any) -> KGGraph:
        graph = self.graph_cls(self, **kwargs)
        self.graphs.append(graph)
        return graph


def timed_walks(
    inner: KG,
    graph_cls: type[KGGraph],
    cfg: WalkConfig,
    *,
    budget_s: float | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run :func:`sample_walks` until the quotas are met or ``budget_s`` has passed (checked
    after each accepted walk); the rows and the measurements."""
    kg = CountingKG(inner, graph_cls)
    state = WalkState()
    rows: list[dict[str, Any]] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    walks: Iterator[dict[str, Any]] = sample_walks(kg, cfg, state=state, graph=kg.graph())
    stopped_by_budget = False
    # (seconds, attempts, rejects) when each walk was accepted
    clock: list[tuple[float, int, dict[str, int]]] = []
    for row in walks:
        rows.append(row)
        clock.append((time.perf_counter() - started, state.next_attempt, dict(state.rejects)))
        if budget_s is not None and time.perf_counter() - started > budget_s:
            stopped_by_budget = len(rows) < cfg.n
            break
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    query_s = sum(v[1] for v in kg.by_kind.values())
    stats = {
        **rates(len(rows), state.next_attempt, seconds),
        "cpu_seconds": round(cpu_seconds, 3),
        "queries": kg.queries,
        "queries_per_walk": round(kg.queries / max(1, len(rows)), 1),
        "query_seconds": round(query_s, 3),
        "python_seconds": round(seconds - query_s, 3),
        "queries_by_kind": {
            k: {
                "queries": int(v[0]),
                "seconds": round(v[1], 3),
                "ms_each": round(v[1] / v[0] * 1000, 3),
            }
            for k, v in sorted(kg.by_kind.items(), key=lambda kv: -kv[1][1])
        },
        "rejects": dict(state.rejects.most_common()),
        "accepted_by_structure": dict(sorted(state.accepted.items())),
        "cache_stats": kg.graphs[0].cache_stats(),
        "stopped_by_budget": stopped_by_budget,
        "_clock": clock,
    }
    return rows, stats


def rates(walks: int, attempts: int, seconds: float) -> dict[str, Any]:
    return {
        "accepted": walks,
        "attempts": attempts,
        "seconds": round(seconds, 3),
        "walks_per_s": round(walks / seconds, 2) if seconds else None,
        "attempts_per_s": round(attempts / seconds, 1) if seconds else None,
    }


def diagnose(inner: KG, fast_row: dict[str, Any], naive_row: dict[str, Any]) -> list[str]:
    """Which look-ups of the two graphs disagree on the entities of two differing walks."""
    fast, naive = KGGraph(inner), NaiveKGGraph(inner)
    findings: list[str] = []
    iris = {*fast_row["topic_ids"], *naive_row["topic_ids"]}
    for iri in sorted(iris):
        f_fan, n_fan = fast.fanouts(iri), naive.fanouts(iri)
        if f_fan != n_fan:
            findings.append(
                f"fanouts({iri}) differ: KGGraph._fetch_fanouts {sorted((r.name, r.direction, n) for r, n in f_fan.items())} "
                f"vs naive {sorted((r.name, r.direction, n) for r, n in n_fan.items())}"
            )
            continue
        for rel in f_fan:
            if fast.neighbors(iri, rel) != naive.neighbors(iri, rel):
                findings.append(f"neighbors({iri}, {rel.name}/{rel.direction}) differ")
        if fast.label(iri) != naive.label(iri):
            findings.append(f"label({iri}) differs")
    return findings or ["no differing look-up on the topic entities; compare the hops by hand"]


def compare(
    inner: KG, fast_rows: list[dict[str, Any]], naive_rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """Do the naive rows equal the first len(naive_rows) fast rows?"""
    prefix = fast_rows[: len(naive_rows)]
    ids_match = [r["walk_id"] for r in prefix] == [r["walk_id"] for r in naive_rows]
    out: dict[str, Any] = {"walk_ids_match": ids_match, "rows_match": prefix == naive_rows}
    for i, (f, n) in enumerate(zip(prefix, naive_rows, strict=True)):
        if f != n:
            fields = sorted(k for k in f if f[k] != n.get(k))
            out["first_difference"] = {
                "index": i,
                "fields": fields,
                "fast": {k: f[k] for k in ("walk_id", "structure", "attempt")},
                "naive": {k: n[k] for k in ("walk_id", "structure", "attempt")},
                "diagnosis": diagnose(inner, f, n),
            }
            break
    return out


def prepare_names(inner: KG) -> None:
    """Build the endpoint's name index (cached on disk) before any timing, so neither walker
    pays for it."""
    graph = KGGraph(inner)
    started = time.perf_counter()
    count = graph.name_index().count()
    print(f"name index of {inner.location}: {count:,} names ({time.perf_counter() - started:.1f}s)")


def bench_backend(name: str, inner: KG, cfg: WalkConfig, budget_s: float) -> dict[str, Any]:
    """The fast walker's full run, the naive walker (budgeted, K walks), and the fast walker's
    full run again; then the checks. The fast rate on the naive prefix is K over the mean of
    the two fast runs' clocks at their K-th accepted walk (the same work, since both walkers
    are deterministic). On a shared machine the load changes during the naive run; a fast run
    on each side of it sees the same load on average, where one short run before it would
    see only the load of its few seconds."""
    # Warm the store's caches (RocksDB blocks, OS pages) with walks of another seed, so the
    # first timed run does not pay for them alone.
    timed_walks(inner, KGGraph, dataclasses.replace(cfg, n=100, seed=cfg.seed + 1), budget_s=None)
    time_wait = {"before": time_wait_sockets()}
    fast_rows, fast_full = timed_walks(inner, KGGraph, cfg, budget_s=None)
    time_wait["after_fast"] = time_wait_sockets()
    print(f"[{name}] fast: {fast_full['accepted']} walks in {fast_full['seconds']}s", flush=True)
    naive_rows, naive = timed_walks(inner, NaiveKGGraph, cfg, budget_s=budget_s)
    time_wait["after_naive"] = time_wait_sockets()
    k = len(naive_rows)
    print(f"[{name}] naive: {k} walks in {naive['seconds']}s", flush=True)
    again_rows, fast_again = timed_walks(inner, KGGraph, cfg, budget_s=None)
    print(
        f"[{name}] fast again: {fast_again['accepted']} walks in {fast_again['seconds']}s",
        flush=True,
    )
    first, attempts, rejects = fast_full["_clock"][k - 1] if k else (0.0, 0, {})
    second = fast_again["_clock"][k - 1][0] if k else 0.0
    fast_prefix = {
        **rates(k, attempts, (first + second) / 2),
        "seconds_each_run": [round(first, 3), round(second, 3)],
        "rejects": rejects,
    }
    check = compare(inner, fast_rows, naive_rows)
    check["attempts_match"] = attempts == naive["attempts"]
    check["rejects_match"] = rejects == naive["rejects"]
    check["fast_runs_match"] = again_rows == fast_rows
    check["naive_cache_hits"] = sum(c["hits"] for c in naive["cache_stats"].values())
    for stats in (fast_full, fast_again, naive):
        stats.pop("_clock")
    return {
        "prefix_walks": k,
        "prefix_cut_by_budget": naive["stopped_by_budget"],
        "fast_full": fast_full,
        "fast_again": fast_again,
        "naive_prefix": naive,
        "fast_prefix": fast_prefix,
        "speedup_walks_per_s": ratio(fast_prefix["walks_per_s"] or 0, naive["walks_per_s"] or 0),
        "speedup_attempts_per_s": ratio(
            fast_prefix["attempts_per_s"] or 0, naive["attempts_per_s"] or 0
        ),
        "meets_target": (fast_prefix["walks_per_s"] or 0)
        >= SPEEDUP_TARGET * (naive["walks_per_s"] or 0),
        "time_wait_sockets": time_wait,
        "check": check,
        "_rows": fast_rows,
    }


def print_table(results: dict[str, Any]) -> None:
    m, cfg = results["machine"], results["config"]
    print()
    print(
        f"walk benchmark — WalkConfig(n={cfg['n']}, seed={cfg['seed']}), {m['cpus']} CPUs, "
        f"pyoxigraph {m['pyoxigraph']}"
    )
    header = (
        f"{'backend / walker':<40}{'walks':>7}{'attempts':>10}{'seconds':>9}{'walks/s':>10}"
        f"{'attempts/s':>12}{'queries/walk':>14}{'query s':>9}{'cpu s':>8}"
    )
    print(header)
    print("-" * len(header))
    backends = [b for b in ("embedded", "http") if b in results]
    for backend in backends:
        r = results[backend]
        k = r["prefix_walks"]
        for label, key in (
            ("fast, full run", "fast_full"),
            ("fast, full run again", "fast_again"),
            (f"fast, first {k} (mean of both)", "fast_prefix"),
            (f"naive, first {k}", "naive_prefix"),
        ):
            s = r[key]
            per_walk = f"{s['queries_per_walk']:>14.1f}" if "queries" in s else f"{'':>14}"
            query_s = f"{s['query_seconds']:>9.2f}" if "queries" in s else f"{'':>9}"
            cpu_s = f"{s['cpu_seconds']:>8.2f}" if "cpu_seconds" in s else f"{'':>8}"
            print(
                f"{backend + ': ' + label:<40}{s['accepted']:>7}{s['attempts']:>10}"
                f"{s['seconds']:>9.2f}{s['walks_per_s']:>10.1f}{s['attempts_per_s']:>12.1f}"
                f"{per_walk}{query_s}{cpu_s}"
            )
    print("-" * len(header))
    for backend in backends:
        r = results[backend]
        c = r["check"]
        cut = (
            f"the naive run hit its time budget after {r['prefix_walks']} walks, so both rates "
            "are over that prefix"
            if r["prefix_cut_by_budget"]
            else "the naive run did all n walks"
        )
        print(
            f"{backend}: speed-up fast vs naive {r['speedup_walks_per_s']}x walks/s, "
            f"{r['speedup_attempts_per_s']}x attempts/s (target >= {SPEEDUP_TARGET:.0f}x: "
            f"{'met' if r['meets_target'] else 'NOT met'}); {cut}"
        )
        print(
            f"{backend}: naive vs fast on the prefix: walk_ids "
            f"{'match' if c['walk_ids_match'] else 'DIFFER'}, rows "
            f"{'match' if c['rows_match'] else 'DIFFER'}, attempts "
            f"{'match' if c['attempts_match'] else 'DIFFER'}, rejects "
            f"{'match' if c['rejects_match'] else 'DIFFER'}; naive cache hits {c['naive_cache_hits']}; "
            f"the two fast runs {'match' if c['fast_runs_match'] else 'DIFFER'}"
        )
        if "first_difference" in c:
            print(f"  first difference: {json.dumps(c['first_difference'])[:1500]}")
        print(f"{backend}: rejects (fast, full run): {r['fast_full']['rejects']}")
        for label, key in (("fast", "fast_full"), ("naive", "naive_prefix")):
            kinds = r[key]["queries_by_kind"]
            parts = ", ".join(
                f"{kind} {v['queries']:,} x {v['ms_each']:.2f}ms = {v['seconds']:.1f}s"
                for kind, v in kinds.items()
            )
            print(
                f"{backend}: {label} time in queries {r[key]['query_seconds']:.1f}s, "
                f"in Python {r[key]['python_seconds']:.1f}s: {parts}"
            )
        tw = r["time_wait_sockets"]
        if backend == "http" and tw["before"] is not None:
            print(
                f"http: TCP sockets in TIME_WAIT: {tw['before']:,} before, "
                f"{tw['after_fast']:,} after fast, {tw['after_naive']:,} after naive"
            )
        print(
            f"{backend}: fast seconds to walk {r['prefix_walks']} in each run: "
            f"{r['fast_prefix']['seconds_each_run']}"
        )
    if "embedded_vs_http" in results:
        e = results["embedded_vs_http"]
        print(
            f"embedded vs HTTP (fast, full run): walk_ids "
            f"{'match' if e['walk_ids_match'] else 'DIFFER'}, rows "
            f"{'match' if e['rows_match'] else 'DIFFER'}; embedded/HTTP walks/s "
            f"{e['walks_per_s_ratio']}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="an imported store dir (default: import --kg)")
    parser.add_argument("--kg", type=Path, default=DEFAULT_KG, help="triple file to import")
    parser.add_argument("--n", type=int, default=1000, help="walks (WalkConfig.n)")
    parser.add_argument("--seed", type=int, default=0, help="WalkConfig.seed")
    parser.add_argument(
        "--naive-budget", type=float, default=90.0, help="seconds for the embedded naive run"
    )
    parser.add_argument(
        "--http-naive-budget", type=float, default=75.0, help="seconds for the HTTP naive run"
    )
    parser.add_argument("--no-http", action="store_true", help="skip the Oxigraph server part")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/walk.json")
    args = parser.parse_args()
    cfg = WalkConfig(n=args.n, seed=args.seed)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "n": cfg.n,
            "seed": cfg.seed,
            "structures": cfg.structures,
            "store": str(args.store) if args.store else None,
            "kg": str(args.kg),
            "naive_budget_s": args.naive_budget,
            "http_naive_budget_s": args.http_naive_budget,
        },
    }
    with tempfile.TemporaryDirectory(prefix="kgsynth-bench-") as tmp:
        workdir = Path(tmp)
        isolated_cache(workdir)
        store_dir = prepare_store(args.store, args.kg, workdir)
        embedded = EmbeddedKG.open(store_dir)
        results["embedded"] = bench_backend("embedded", embedded, cfg, args.naive_budget)
        if not args.no_http:
            with oxigraph_endpoint(store_dir, workdir) as url:
                endpoint = SparqlEndpointKG(url, embedded.profile, timeout=60.0)
                prepare_names(endpoint)
                results["http"] = bench_backend("http", endpoint, cfg, args.http_naive_budget)
                results["http_retries"] = endpoint.stats["retries"]
            emb_rows, web_rows = results["embedded"]["_rows"], results["http"]["_rows"]
            results["embedded_vs_http"] = {
                "walk_ids_match": [r["walk_id"] for r in emb_rows]
                == [r["walk_id"] for r in web_rows],
                "rows_match": emb_rows == web_rows,
                "walks_per_s_ratio": ratio(
                    results["embedded"]["fast_full"]["walks_per_s"],
                    results["http"]["fast_full"]["walks_per_s"],
                ),
            }
        embedded.close()
    for backend in ("embedded", "http"):
        if backend in results:
            rows = results[backend].pop("_rows")
            results[backend]["fast_full"]["first_walk_ids"] = [r["walk_id"] for r in rows[:5]]
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.out} ({results['elapsed_s']}s)")


if __name__ == "__main__":
    main()
