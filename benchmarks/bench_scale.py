"""Import and walk speed from MetaQA's 130 k facts to 10 M (issue 20).

Sizes -> a printed table and ``benchmarks/results/scale.json``::

    .venv/bin/python benchmarks/bench_scale.py                      # metaqa and 1m (~1 min)
    .venv/bin/python benchmarks/bench_scale.py --sizes metaqa,1m,10m  # ~6 min, ~4 GB in --work

For each size (``metaqa``: the shipped ``kgsynth/resources/metaqa/kb_partial.txt.gz``; ``1m``, ``10m``:
``benchmarks/gen_kg.py --facts N`` with seed 0, 1 entity per 10 facts, gzipped ``s|r|o``), one
after another in the same run:

- ``kgsynth kg import FILE`` (a child process; wall time, the fan-out table's share of it,
  and the peak RSS of its process tree: a child converting a large file, then the engine
  loading in the parent);
- pyoxigraph ``Store.bulk_load`` of the same triples as N-Triples (the facts and the name
  triples ``kg import`` writes, made by its own converter beforehand, untimed), in a child
  process of its own: the engine's loading speed;
- ``kgsynth walk --n N --seed 0`` on the imported store (default mix), with ``--workers 1``
  then ``--workers 2``: walks/s and attempts/s over the command's wall time, and over the
  sampling alone (the ``elapsed_s`` of the manifest), and the peak RSS of the process tree.

Rates are triples of the resulting store per second. Generated files and stores live under
``--work`` (default: a temporary folder under /tmp) and are deleted at the end unless
``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
KGSYNTH = [PY, "-m", "kgsynth.cli"]
SIZES = {"metaqa": 0, "1m": 1_000_000, "10m": 10_000_000}


def tree_rss_mb(pid: int) -> tuple[float, float]:
    """RSS of a process and all its descendants now, and its anonymous part (heap, not
    mapped files), in MB, from /proc."""
    total, anon, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(status.split("VmRSS:")[1].split()[0])
            anon += int(status.split("RssAnon:")[1].split()[0])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
    return total / 1024, anon / 1024


def run_measured(cmd: list[str], **kw: Any) -> tuple[float, tuple[float, float], str]:
    """Wall seconds, the peak RSS (MB) of the child's process tree (the sum over its
    processes, sampled every 50 ms: a conversion child and the engine count together) and
    the peak of its anonymous part, and stdout."""
    import threading

    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, **kw
    )
    peak = [0.0, 0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            rss, anon = tree_rss_mb(proc.pid)
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, errs = proc.communicate()
    done.set()
    sampler.join()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{errs[-3000:]}")
    return wall, (peak[0], peak[1]), out


BULK_LOAD = """
import resource, sys, time, pyoxigraph as ox
t = time.perf_counter()
store = ox.Store(sys.argv[2])
store.bulk_load(path=sys.argv[1], format=ox.RdfFormat.N_TRIPLES)
store.flush()
n = len(store)
print(time.perf_counter() - t, n, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""

CONVERT = """
import sys
from pathlib import Path
from kgsynth.kg.arrow_import import delimited_to_ntriples
from kgsynth.kg.profiles import get_profile
delimited_to_ntriples(Path(sys.argv[1]), Path(sys.argv[2]), "|", get_profile("generic"), None,
                      lambda rows: None)
"""

IMPORT = """
import json, resource, sys, time
from kgsynth.kg import importer
t = time.perf_counter()
report = importer.import_kg(sys.argv[1], sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - t, "triples": report.triples,
                  "facts": report.facts, "entities": report.entities,
                  "table_s": report.table_seconds or 0.0,
                  "rss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

WALK = """
import json, resource, sys, time
from kgsynth.kg.open import open_kg
from kgsynth.walk import WalkConfig, WalkState, sample_walks
t = time.perf_counter()
kg = open_kg(sys.argv[1])
cfg = WalkConfig(n=int(sys.argv[2]), seed=0, workers=int(sys.argv[3]))
state = WalkState()
started = time.perf_counter()
cpu = time.process_time()
rows = list(sample_walks(kg, cfg, state=state))
end = time.perf_counter()
cpu = time.process_time() - cpu
ids = [r["walk_id"] for r in rows]
import hashlib
print(json.dumps({"walks": len(rows), "attempts": state.next_attempt, "total_s": end - t,
                  "sampling_s": end - started, "sampling_cpu_s": cpu, "ids_sha": hashlib.sha256("".join(ids).encode()).hexdigest(),
                  "rss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def bench_size(name: str, work: Path, n_walks: int) -> dict[str, Any]:
    facts = SIZES[name]
    if facts == 0:
        src = ROOT / "kgsynth" / "resources" / "metaqa" / "kb_partial.txt.gz"
    else:
        src = work / f"kg{name}.txt.gz"
        if not src.is_file():
            subprocess.run(
                [
                    PY,
                    str(ROOT / "benchmarks" / "gen_kg.py"),
                    "--facts",
                    str(facts),
                    "--out",
                    str(src),
                ],
                check=True,
            )
    out: dict[str, Any] = {"size": name, "source": str(src)}
    store = work / f"store-{name}"
    shutil.rmtree(store, ignore_errors=True)
    _, tree, text = run_measured([PY, "-c", IMPORT, str(src), str(store)])
    imp = json.loads(text)
    # the import's process tree (a conversion child and the engine together): the sampled sum,
    # or a single process's exact peak where that is higher (a spike between two samples)
    imp["rss_tree_sampled_mb"], imp["anon_tree_sampled_mb"] = tree
    imp["rss_mb"] = max(tree[0], imp["rss_self_mb"], imp["rss_children_mb"])
    out["import"] = imp
    nt = work / f"{name}.nt"
    run_measured([PY, "-c", CONVERT, str(src), str(nt)])
    engine = work / f"engine-{name}"
    shutil.rmtree(engine, ignore_errors=True)
    _, _, text = run_measured([PY, "-c", BULK_LOAD, str(nt), str(engine)])
    secs, triples, rss = text.split()
    out["bulk_load"] = {"seconds": float(secs), "triples": int(triples), "rss_mb": float(rss)}
    nt.unlink()
    shutil.rmtree(engine, ignore_errors=True)
    out["import"]["triples_per_s"] = imp["triples"] / imp["seconds"]
    out["bulk_load"]["triples_per_s"] = int(triples) / float(secs)
    out["import_ratio"] = out["import"]["triples_per_s"] / out["bulk_load"]["triples_per_s"]
    for workers in (1, 2):
        _, tree, text = run_measured([PY, "-c", WALK, str(store), str(n_walks), str(workers)])
        walk = json.loads(text)
        # the anonymous part: the heap, without the memory-mapped table's (reclaimable) pages
        walk["rss_tree_sampled_mb"], walk["anon_tree_sampled_mb"] = tree
        walk["attempts_per_s"] = walk["attempts"] / walk["total_s"]
        walk["walks_per_s"] = walk["walks"] / walk["total_s"]
        walk["sampling_attempts_per_s"] = walk["attempts"] / walk["sampling_s"]
        # per CPU second of the sampling process: steadier than wall time on a shared machine
        walk["attempts_per_cpu_s"] = walk["attempts"] / walk["sampling_cpu_s"]
        out[f"walk_w{workers}"] = walk
    out["same_walks_w1_w2"] = out["walk_w1"]["ids_sha"] == out["walk_w2"]["ids_sha"]
    out["speedup_w2"] = out["walk_w1"]["total_s"] / out["walk_w2"]["total_s"]
    shutil.rmtree(store, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="metaqa,1m")
    p.add_argument("--walks", type=int, default=1000)
    p.add_argument("--work", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.json"))
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="kgsynth-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for name in args.sizes.split(","):
            res = bench_size(name.strip(), work, args.walks)
            results.append(res)
            imp, bl = res["import"], res["bulk_load"]
            w1, w2 = res["walk_w1"], res["walk_w2"]
            print(
                f"{name}: import {imp['triples']:,} triples {imp['seconds']:.1f}s "
                f"(fan-out table {imp['table_s']:.1f}s; "
                f"{imp['triples_per_s']:,.0f}/s, peak {imp['rss_mb']:,.0f} MB) | bulk_load "
                f"{bl['seconds']:.1f}s ({bl['triples_per_s']:,.0f}/s, peak {bl['rss_mb']:,.0f} MB)"
                f" | ratio {res['import_ratio']:.2f}\n"
                f"  walk x1: {w1['walks']} walks {w1['attempts']} attempts {w1['total_s']:.1f}s "
                f"({w1['walks_per_s']:.0f} walks/s, {w1['attempts_per_s']:.0f} attempts/s; sampling "
                f"alone {w1['sampling_attempts_per_s']:.0f}/s, {w1['attempts_per_cpu_s']:.0f} per "
                f"CPU-s; peak {w1['rss_self_mb']:,.0f} MB, of it heap {w1['anon_tree_sampled_mb']:,.0f} MB)\n"
                f"  walk x2: {w2['total_s']:.1f}s, speed-up {res['speedup_w2']:.2f}, same walks "
                f"{res['same_walks_w1_w2']}; peak {w2['rss_self_mb']:,.0f} MB + workers "
                f"{w2['rss_children_mb']:,.0f} MB",
                flush=True,
            )
        base = results[0]["walk_w1"]["attempts_per_s"]
        base_cpu = results[0]["walk_w1"]["attempts_per_cpu_s"]
        for res in results:
            res["attempts_ratio_vs_first"] = res["walk_w1"]["attempts_per_s"] / base
            res["attempts_cpu_ratio_vs_first"] = res["walk_w1"]["attempts_per_cpu_s"] / base_cpu
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps({"os_cpus": os.cpu_count(), "results": results}, indent=2)
        )
        for res in results:
            print(
                f"{res['size']}: attempts/s vs {results[0]['size']}: "
                f"{res['attempts_ratio_vs_first']:.2f} (per CPU-s: "
                f"{res['attempts_cpu_ratio_vs_first']:.2f})"
            )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
