"""Trajectory filter speed: ``run_filters`` and the ``kgsynth filter`` path on 1M synthetic rows.

Synthetic trajectories (``--rows``, default 1,000,000) -> a printed table and
``benchmarks/results/filter.json``::

    .venv/bin/python benchmarks/bench_filter.py
    .venv/bin/python benchmarks/bench_filter.py --rows 200000 --keep-data /tmp/traj.parquet

The rows have the shapes of real ``trajectories.parquet`` rows (see :func:`synthetic_table`):
3–8 messages of 50–400 characters (system, user, assistant ``<think>``+``<kg-query>`` turns
with their ``<information>`` replies, a final ``<answer>``), 1–3 predicted and gold answers,
5–20 observed entity names out of a pool of 200,000 names, oracle / referenced / free modes,
seven structures (1–4 hops), 1–6 samples per question, and a known share of each problem:
wrong and partial answers, answers the environment never showed, turns without ``<think>``,
hint lines copied from the reference, repeated tool-call sequences, over-long episodes. They
are written to a temporary Parquet file (``pq.write_table`` defaults, as ``synthesize
trajectories`` writes it) and then timed:

1. ``run_filters(table, FilterConfig(), max_similarity=stub)`` on the table in memory, best of
   ``--repeats``, with its own time split per step (``stats["seconds_by_step"]``). The stub
   stands in for :class:`~kgsynth.datasets.contamination.ContaminationGuard` (a hash of the text, 2% of
   questions "contaminated"), so the contamination step's plumbing is timed but not the
   embedding model, whose cost depends on the model and the device, not on this code;
2. the same with ``balance="structure"`` and ``max_turns=3`` (every filter on);
3. the per-row Python parts alone, one process against a ``fork`` pool of 2 workers:
   normalizing the distinct answer/entity strings, and ``parse_turn`` on the rows that miss
   the fast format regexes;
4. the CLI path: ``kgsynth filter --in FILE --out DIR`` in a subprocess (interpreter start,
   Parquet read, input hash, filters, both Parquet files, the stats PNG and the manifest).

It also checks that accepted + rejected rows equal the input, and that the vectorized strict EM,
hit and F1 equal :func:`kgsynth.metrics.em_strict` / :func:`~kgsynth.metrics.hit` /
:func:`~kgsynth.metrics.f1` on 5,000 sampled rows.
The target is 1,000,000 rows per minute on 2 cores. ``--keep-data PATH`` keeps the generated
Parquet file (and reuses it when it exists), which saves the ~70 s generation on re-runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_kg_tools import machine_info as shared_machine_info  # noqa: E402
from kgsynth.core.schema import TRAJECTORY_SCHEMA  # noqa: E402

TARGET_ROWS_PER_MIN = 1_000_000

_WORDS = [
    "red",
    "river",
    "stone",
    "night",
    "house",
    "garden",
    "blue",
    "winter",
    "king",
    "queen",
    "lost",
    "city",
    "dark",
    "star",
    "little",
    "love",
    "song",
    "road",
    "war",
    "time",
    "man",
    "woman",
    "child",
    "ghost",
    "summer",
    "island",
    "secret",
    "last",
    "first",
    "golden",
    "black",
    "white",
    "silent",
    "heart",
    "fire",
    "water",
    "storm",
    "dream",
    "world",
    "sky",
    "sea",
    "moon",
    "sun",
    "iron",
    "glass",
]
_RELATIONS = [
    "directed_by",
    "written_by",
    "starred_actors",
    "release_year",
    "in_language",
    "has_genre",
    "has_tags",
    "has_imdb_rating",
    "has_imdb_votes",
]
_STRUCTURES = (
    ("chain-1", 1),
    ("chain-2", 2),
    ("chain-3", 3),
    ("chain-4", 4),
    ("2I", 2),
    ("IP", 3),
    ("PI", 3),
    ("2I", 2),
)
_SYSTEM = (
    "You answer questions about a knowledge graph by calling tools. Each turn: reason inside "
    "<think></think>, then either call one tool inside <kg-query></kg-query> or give the final "
    'answer inside <answer>["…"]</answer>. Tools: get_relations("Entity Name"), '
    'get_triples("Entity Name", ["relation", ...]). You have 10 turns.'
)
_FORCED = (
    "You have used all your turns. Give your final answer now: <think>…</think> then "
    '<answer>["…"]</answer> with every entity you found.'
)


def _names(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct entity names; some with articles, punctuation and case variants."""
    out: dict[str, None] = {}
    while len(out) < n:
        k = rng.choice((1, 2, 2, 3))
        name = " ".join(rng.choice(_WORDS).capitalize() for _ in range(k))
        r = rng.random()
        if r < 0.1:
            name = "The " + name
        elif r < 0.15:
            name += ", Jr."
        name += f" {len(out)}" if rng.random() < 0.9 else ""
        out[name] = None
    return list(out)


def _sentence(rng: random.Random, lo: int, hi: int) -> str:
    target = rng.randint(lo, hi)
    words: list[str] = []
    size = 0
    while size < target:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:target]


def synthetic_table(n: int, seed: int = 0) -> pa.Table:
    """``n`` trajectory rows in ``TRAJECTORY_SCHEMA`` with realistic shapes and known defects."""
    rng = random.Random(seed)
    names = _names(rng, 200_000)
    cols: dict[str, list[Any]] = {f.name: [] for f in TRAJECTORY_SCHEMA}
    generator = {"backend": "openai", "model": "synthetic", "prompt_hash": "0" * 16}
    q = 0
    i = 0
    while i < n:
        q += 1
        qid = f"q-{q:08x}"
        structure, hops = _STRUCTURES[rng.randrange(len(_STRUCTURES))]
        topic = rng.choice(names)
        gold = rng.sample(names, rng.choice((1, 1, 1, 2, 3)))
        question = f"Which {rng.choice(_RELATIONS)} of {topic} {_sentence(rng, 20, 80)}?"
        mode = rng.choice(("oracle", "oracle", "referenced", "free"))
        samples = 1 if mode == "oracle" else rng.randint(1, 6)
        gold_calls = [
            f'get_relations("{topic}")',
            f'get_triples("{topic}", ["{rng.choice(_RELATIONS)}"])',
        ]
        reference = (
            "\n".join(f"{k}. {c}" for k, c in enumerate(gold_calls, 1))
            if mode == "referenced"
            else ""
        )
        prev_calls: list[str] | None = None
        for s in range(samples):
            if i >= n:
                break
            i += 1
            n_msgs = rng.randint(3, 8)
            queries = (n_msgs - 3) // 2
            forced = n_msgs % 2 == 0
            if prev_calls is not None and rng.random() < 0.3:
                calls = list(prev_calls)  # a repeated action sequence
                queries = len(calls)
            else:
                calls = [
                    gold_calls[k]
                    if k < 2 and rng.random() < 0.7
                    else f'get_triples("{rng.choice(names)}", ["{rng.choice(_RELATIONS)}"])'
                    for k in range(queries)
                ]
            prev_calls = calls
            observed = rng.sample(names, rng.randint(5, 20))
            r = rng.random()
            if r < 0.6:
                predicted = list(gold)
            elif r < 0.7:
                predicted = gold[:1] + rng.sample(names, 1)
            elif r < 0.8:
                predicted = rng.sample(names, rng.randint(1, 3))
            elif r < 0.84:
                predicted = []
            else:
                predicted = [g.upper() for g in gold]  # same after normalization
            if rng.random() < 0.9:
                observed[: len(predicted)] = predicted  # the environment showed them
            messages = [
                {"role": "system", "content": _SYSTEM},
                {
                    "role": "user",
                    "content": f"Question: {question}\nTopic entities: {topic}",
                },
            ]
            leak = mode == "referenced" and rng.random() < 0.05
            bad_format = rng.random() < 0.04
            for k, call in enumerate(calls):
                think = _sentence(rng, 40, 250)
                if leak and k == 0:
                    think += " following " + reference.splitlines()[0]
                head = "" if (bad_format and k == 0) else f"<think>{think}</think>\n"
                messages.append(
                    {"role": "assistant", "content": f"{head}<kg-query>{call}</kg-query>"}
                )
                facts = "\n".join(
                    f"({rng.choice(observed)}, {rng.choice(_RELATIONS)}, {rng.choice(observed)})"
                    for _ in range(rng.randint(1, 8))
                )
                messages.append({"role": "tool", "content": f"<information>{facts}</information>"})
            if forced:
                messages.append({"role": "user", "content": _FORCED})
            answer = json.dumps(predicted, ensure_ascii=False)
            # 1% ramble: one very long final thought (the max-length filter's target)
            thought = _sentence(rng, 40, 250) + (" x" * 8_000 if rng.random() < 0.01 else "")
            messages.append(
                {
                    "role": "assistant",
                    "content": f"<think>{thought}</think>\n<answer>{answer}</answer>",
                }
            )
            for key, value in (
                ("trajectory_id", f"t-{i:012x}"),
                ("question_id", qid),
                ("walk_id", f"w-{q:08x}"),
                ("mode", mode),
                ("sample", s),
                ("question", question),
                ("topic_names", [topic]),
                ("structure", structure),
                ("hops", hops),
                ("messages", messages),
                ("predicted_answers", predicted),
                ("gold_answers", gold),
                ("answered", bool(predicted)),
                ("forced_answer", forced),
                ("num_turns", sum(m["role"] == "assistant" for m in messages)),
                ("tool_errors", 0),
                ("format_errors", int(bad_format)),
                ("tool_calls", calls),
                ("turns", []),
                ("observed_entities", observed),
                ("reference", reference),
                ("generator", generator),
            ):
                cols[key].append(value)
    return pa.Table.from_pydict(cols, schema=TRAJECTORY_SCHEMA)


# --- timing ---------------------------------------------------------------------------------


def _contamination_stub(questions: list[str]) -> list[float]:
    """2% of distinct questions at 0.9, the rest at 0.1 (deterministic across runs)."""
    return [0.9 if zlib.crc32(q.encode()) % 50 == 0 else 0.1 for q in questions]


def time_run_filters(table: pa.Table, cfg: Any, repeats: int) -> dict[str, Any]:
    from kgsynth.filter import run_filters

    best: dict[str, Any] | None = None
    for _ in range(repeats):
        started = time.perf_counter()
        accepted, rejected, stats = run_filters(table, cfg, max_similarity=_contamination_stub)
        seconds = time.perf_counter() - started
        assert accepted.num_rows + rejected.num_rows == table.num_rows
        del accepted, rejected
        if best is None or seconds < best["seconds"]:
            best = {
                "seconds": round(seconds, 3),
                "rows_per_min": round(table.num_rows / seconds * 60),
                "accepted": stats["accepted"],
                "rejects": stats["rejects"],
                "seconds_by_step": stats["seconds_by_step"],
                "format_rows_parsed_one_by_one": stats["format_rows_parsed_one_by_one"],
                "reference_rows_checked": stats["reference_rows_checked"],
                "distinct_answer_strings": stats["distinct_answer_strings"],
            }
    assert best is not None
    best["repeats"] = repeats
    return best


def _normalize_chunk(strings: list[str]) -> list[str]:
    from kgsynth.metrics import normalize_answer

    return [normalize_answer(s) for s in strings]


def _parse_chunk(texts: list[str]) -> int:
    from kgsynth.agent.protocol import parse_turn

    return sum(parse_turn(t).format_error is None for t in texts)


def time_workers(table: pa.Table) -> dict[str, Any]:
    """The per-row Python parts: one process vs a fork pool of 2 workers (best of 2 each)."""
    import multiprocessing as mp

    from kgsynth.filter import FAST_ANSWER_TURN, FAST_QUERY_TURN

    values = [
        pc.list_flatten(table.column(c))
        for c in ("predicted_answers", "gold_answers", "observed_entities")
    ]
    distinct = pc.unique(pa.chunked_array([c for v in values for c in v.chunks])).to_pylist()
    flat = pc.list_flatten(table.column("messages"))
    assistant = pc.equal(pc.struct_field(flat, "role"), "assistant")
    content = pc.struct_field(flat, "content").filter(assistant)
    fast = pc.or_(
        pc.match_substring_regex(content, FAST_QUERY_TURN),
        pc.match_substring_regex(content, FAST_ANSWER_TURN),
    )
    slow = content.filter(pc.invert(fast)).to_pylist()
    out: dict[str, Any] = {}
    ctx = mp.get_context("fork")
    for name, fn, items in (
        ("normalize distinct strings", _normalize_chunk, distinct),
        ("parse_turn on fast-path misses", _parse_chunk, slow),
    ):
        half = len(items) // 2
        serial = pool = float("inf")
        for _ in range(2):
            started = time.perf_counter()
            fn(items)
            serial = min(serial, time.perf_counter() - started)
            started = time.perf_counter()
            with ctx.Pool(2) as workers:
                workers.map(fn, [items[:half], items[half:]])
            pool = min(pool, time.perf_counter() - started)
        out[name] = {
            "items": len(items),
            "one_process_s": round(serial, 3),
            "fork_pool_2_s": round(pool, 3),
            "pool_speedup": round(serial / pool, 2),
        }
    return out


def check_metrics(table: pa.Table, sample: int, seed: int) -> int:
    """Vectorized em_strict/hit/F1 against kgsynth.metrics on ``sample`` random rows; returns
    rows checked."""
    import numpy as np

    from kgsynth.filter import answer_checks
    from kgsynth.metrics import em_strict, f1, hit

    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(table.num_rows, size=min(sample, table.num_rows), replace=False))
    sub = table.take(pa.array(idx))
    checks = answer_checks(sub)
    for i, row in enumerate(sub.select(["predicted_answers", "gold_answers"]).to_pylist()):
        pred, gold = row["predicted_answers"], row["gold_answers"]
        assert checks.em_strict[i] == em_strict(pred, gold), (pred, gold)
        assert checks.hit[i] == hit(pred, gold), (pred, gold)
        assert checks.f1[i] == f1(pred, gold), (pred, gold)
    return len(idx)


def time_cli(path: Path, workdir: Path) -> dict[str, Any]:
    out = workdir / "corpus"
    exe = Path(sys.executable).with_name("kgsynth")
    started = time.perf_counter()
    proc = subprocess.run(
        [str(exe), "filter", "--in", str(path), "--out", str(out), "--overwrite"],
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"kgsynth filter failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    rows = manifest["input"]["rows"]
    assert manifest["output"]["accepted_rows"] + manifest["output"]["rejected_rows"] == rows
    return {
        "seconds": round(seconds, 3),
        "rows_per_min": round(rows / seconds * 60),
        "in_process_s": manifest["elapsed_s"],
        "seconds_by_phase": manifest["seconds_by_phase"],
        "accepted": manifest["accepted"],
        "output_mb": round(
            sum((out / f).stat().st_size for f in ("accepted.parquet", "rejected.parquet")) / 1e6,
            1,
        ),
    }


def machine_info() -> dict[str, Any]:
    """bench_kg_tools' machine record, plus what matters to this benchmark."""
    import polars as pl

    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        **shared_machine_info(),
        "load_average_before": load,
        "pyarrow": pa.__version__,
        "polars": pl.__version__,
    }


def print_table(results: dict[str, Any]) -> None:
    n = results["config"]["rows"]
    print(
        f"filter benchmark — {n:,} synthetic trajectories, {results['machine']['cpus']} CPUs, "
        f"target {TARGET_ROWS_PER_MIN:,} rows/min"
    )
    header = f"{'measure':44} {'seconds':>8} {'rows/min':>12} {'x target':>9}"
    print(header)
    print("-" * len(header))
    for label, key in (
        ("run_filters, defaults (+ contamination stub)", "run_filters_default"),
        ("run_filters, every filter (balance, turns)", "run_filters_all"),
        ("kgsynth filter CLI (subprocess, Parquet I/O)", "cli"),
    ):
        r = results[key]
        print(
            f"{label:44} {r['seconds']:8.2f} {r['rows_per_min']:12,} "
            f"{r['rows_per_min'] / TARGET_ROWS_PER_MIN:8.2f}x"
        )
    print("-" * len(header))
    default = results["run_filters_default"]
    total = sum(default["seconds_by_step"].values())
    print("run_filters (defaults) time by step:")
    for step, sec in default["seconds_by_step"].items():
        print(f"  {step:24} {sec:7.2f}s  {sec / total:6.1%}")
    cli = results["cli"]
    phases = cli["seconds_by_phase"]
    other = cli["in_process_s"] - sum(phases.values())
    print(
        f"CLI: {cli['seconds']:.1f}s wall = "
        + " + ".join(f"{k} {v:.1f}s" for k, v in phases.items())
        + f" + other (input hash wait, manifest) {other:.1f}s"
        + f" + start-up {cli['seconds'] - cli['in_process_s']:.1f}s; outputs {cli['output_mb']} MB"
    )
    print("per-row Python, one process vs fork pool of 2:")
    for name, r in results["workers"].items():
        print(
            f"  {name:32} {r['items']:>9,} items  {r['one_process_s']:6.2f}s vs "
            f"{r['fork_pool_2_s']:6.2f}s  ({r['pool_speedup']}x)"
        )
    print(
        f"rejects (defaults): {default['rejects']}; accepted {default['accepted']:,}; "
        f"parse_turn on {default['format_rows_parsed_one_by_one']:,} rows; "
        f"leak check on {default['reference_rows_checked']:,} rows"
    )
    print(f"metrics check: EM/F1 equal kgsynth.metrics on {results['metrics_rows_checked']:,} rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--keep-data", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/filter.json")
    args = parser.parse_args()

    from kgsynth.filter import FilterConfig

    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="bench-filter-") as tmp:
        workdir = Path(tmp)
        path = args.keep_data or workdir / "trajectories.parquet"
        generate_s = None
        if args.keep_data is not None and args.keep_data.is_file():
            table = pq.read_table(path)
            if table.num_rows != args.rows:
                sys.exit(f"--keep-data: {path} has {table.num_rows:,} rows, not {args.rows:,}")
        else:
            started = time.perf_counter()
            table = synthetic_table(args.rows, args.seed)
            generate_s = round(time.perf_counter() - started, 1)
            pq.write_table(table, path)
        print(
            f"data: {table.num_rows:,} rows, {table.nbytes / 1e9:.2f} GB in memory, "
            f"{path.stat().st_size / 1e6:.0f} MB Parquet",
            flush=True,
        )
        results: dict[str, Any] = {
            "machine": machine,
            "config": {
                "rows": table.num_rows,
                "seed": args.seed,
                "repeats": args.repeats,
                "generate_s": generate_s,
                "parquet_mb": round(path.stat().st_size / 1e6, 1),
                "memory_gb": round(table.nbytes / 1e9, 2),
            },
            "target_rows_per_min": TARGET_ROWS_PER_MIN,
        }
        results["run_filters_default"] = time_run_filters(table, FilterConfig(), args.repeats)
        results["run_filters_all"] = time_run_filters(
            table, FilterConfig(balance="structure", max_turns=3), args.repeats
        )
        results["workers"] = time_workers(table)
        results["metrics_rows_checked"] = check_metrics(table, 5000, args.seed)
        del table
        results["cli"] = time_cli(path, workdir)
    for key in ("run_filters_default", "run_filters_all", "cli"):
        results[key]["x_target"] = round(results[key]["rows_per_min"] / TARGET_ROWS_PER_MIN, 2)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
