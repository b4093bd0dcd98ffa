"""Cost of the read-only guard on the queries kgsynth itself sends: walks with and without it.

MetaQA KB (or ``--store DIR``) -> a printed table and ``benchmarks/results/guard.json``::

    .venv/bin/python benchmarks/bench_guard.py --n 1000 --rounds 3

``sample_walks(WalkConfig(n, seed))`` runs on the embedded store, alternately with the guard
as shipped (its caches cleared before each run, so every run pays the parser for each shape
it meets) and with ``guard.ensure_read_only`` replaced by the identity, ``--rounds`` times
each; the walks must come out identical. The ratio is guarded time / unguarded time of the
medians. The guard's own time per query is also measured on the recorded query texts: cold
(no cache), warm shapes (text cache cleared, shape cache kept: a long run's steady state) and
warm texts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kgsynth.kg import guard  # noqa: E402
from kgsynth.kg.embedded import EmbeddedKG  # noqa: E402
from kgsynth.kg.importer import import_kg  # noqa: E402
from kgsynth.kg.open import DEFAULT_KG  # noqa: E402
from kgsynth.walk import WalkConfig, sample_walks  # noqa: E402


def run_walks(store: Path, cfg: WalkConfig, guarded: bool) -> tuple[float, list, list[str]]:
    real = guard.ensure_read_only
    sent: list[str] = []

    def identity(query: str) -> str:
        sent.append(query)
        return query

    if guarded:
        guard.clear_caches()
    else:
        guard.ensure_read_only = identity  # type: ignore[assignment]
    kg = EmbeddedKG.open(store)
    try:
        started = time.perf_counter()
        walks = list(sample_walks(kg, cfg))
        return time.perf_counter() - started, walks, sent
    finally:
        guard.ensure_read_only = real  # type: ignore[assignment]
        kg.close()


def per_query_us(queries: list[str], clear_texts: bool, clear_shapes: bool) -> float:
    if clear_texts and clear_shapes:
        guard.clear_caches()
    started = time.perf_counter()
    for query in queries:
        if clear_texts:
            guard._texts.clear()
        guard.ensure_read_only(query)
    return (time.perf_counter() - started) / len(queries) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="an imported store dir (default: import --kg)")
    parser.add_argument("--kg", type=Path, default=DEFAULT_KG)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/guard.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp) / "kg"
        if args.store is None:
            import_kg(args.kg, store)
        cfg = WalkConfig(n=args.n, seed=args.seed)
        run_walks(store, cfg, guarded=True)  # warm the OS cache and the imports (rdflib)
        times: dict[str, list[float]] = {"guarded": [], "unguarded": []}
        reference = None
        queries: list[str] = []
        for _ in range(args.rounds):
            for mode in ("unguarded", "guarded"):
                seconds, walks, sent = run_walks(store, cfg, guarded=mode == "guarded")
                times[mode].append(seconds)
                reference = reference or walks
                if walks != reference:
                    raise SystemExit(f"{mode}: the walks differ")
                queries = queries or sent
    guarded, unguarded = (statistics.median(times[m]) for m in ("guarded", "unguarded"))
    result = {
        "walks": args.n,
        "queries_per_run": len(queries),
        "seconds": times,
        "median_guarded_s": round(guarded, 3),
        "median_unguarded_s": round(unguarded, 3),
        "ratio": round(guarded / unguarded, 3),
        "guard_us_per_query": {
            "cold": round(per_query_us(queries, True, True), 1),
            "warm_shapes": round(per_query_us(queries, True, False), 1),
            "warm_texts": round(min(per_query_us(queries, False, False) for _ in range(2)), 1),
        },
        "distinct_shapes": len(guard._shapes),
        "distinct_texts": len(set(queries)),
    }
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
