"""Constraint walks and their S-expressions (issue 18), measured side by side on several KGs.

For each KG: import it, walk ``--n`` walks of the four constraint structures (``count``,
``superlative``, ``comparative``, ``time``, equal weights), then run every walk's S-expression
through the compiler (:func:`kgsynth.kg.sexpr.execute`, one SPARQL query each, through the KG's
guard) and compare with the answers the walker computed on its own (``answer_ids``; for
``count`` the number). Prints, per KG and structure, walks accepted, attempts, rejects by
reason, and how many compiled S-expressions returned exactly the walk's answers (the target is
all of them)::

    .venv/bin/python benchmarks/bench_constraints.py --work /tmp/kgs/constraints --n 400

KGs: the shipped MetaQA KB (years are entities named "1944"), and two from
``benchmarks/gen_kg.py`` as N-Triples (typed integer, gYear and date literals): generic, and
``--profile freebase`` (ids ``m.…``, CVT hops).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
KGSYNTH = [sys.executable, "-m", "kgsynth.cli"]
STRUCTURES = "count:1,superlative:1,comparative:1,time:1"


def _run(args: list[str]) -> None:
    subprocess.run(args, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def prepare(work: Path, facts: int) -> list[tuple[str, Path, list[str]]]:
    """(label, triple file, extra import flags) per KG, generating the synthetic ones."""
    kgs = [("MetaQA", ROOT / "kgsynth/resources/metaqa/kb_partial.txt.gz", [])]
    for profile in ("generic", "freebase"):
        out = work / f"gen_{profile}_{facts}.nt.gz"
        if not out.exists():
            gen = [sys.executable, str(ROOT / "benchmarks/gen_kg.py"), "--facts", str(facts)]
            _run([*gen, "--format", "nt", "--profile", profile, "--out", str(out)])
        flags = ["--profile", "freebase"] if profile == "freebase" else []
        kgs.append((f"gen_kg {profile} {facts // 1000} k facts", out, flags))
    return kgs


def agreement(kg_dir: Path, walks: list[dict]) -> dict[str, tuple[int, int]]:
    """structure -> (compiled S-expressions equal to the walk's answers, walks)."""
    from kgsynth.kg.graph import KGGraph
    from kgsynth.kg.open import open_kg
    from kgsynth.kg.sexpr import execute

    graph = KGGraph(open_kg(kg_dir))
    out: dict[str, list[int]] = {}
    for w in walks:
        got = execute(graph, w["sexpr"])
        want = w["answer_ids"]
        same = [str(got)] == want if isinstance(got, int) else {i for i, _ in got} == set(want)
        tally = out.setdefault(w["structure"], [0, 0])
        tally[0] += int(same)
        tally[1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="folder for KGs and walks")
    ap.add_argument("--n", type=int, default=400, help="walks per KG")
    ap.add_argument("--facts", type=int, default=200_000, help="facts of each generated KG")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    print("| KG | structure | walks | attempts | rejects by reason | compiled = walk answers |")
    print("|---|---|---|---|---|---|")
    for label, source, flags in prepare(args.work, args.facts):
        slug = label.split()[0] + ("_fb" if "freebase" in label else "")
        kg_dir, walks = args.work / f"kg_{slug}", args.work / f"walks_{slug}.parquet"
        _run([*KGSYNTH, "kg", "import", str(source), "--out", str(kg_dir), "--overwrite", *flags])
        t0 = time.perf_counter()
        walk = ["walk", "--kg", str(kg_dir), "--n", str(args.n), "--seed", str(args.seed)]
        _run([*KGSYNTH, *walk, "--structures", STRUCTURES, "--out", str(walks), "--overwrite"])
        seconds = time.perf_counter() - t0
        counts = json.loads(walks.with_suffix(".manifest.json").read_text())
        rows = pq.read_table(walks).to_pylist()
        agree = agreement(kg_dir, rows)
        by_structure = counts.get("rejects_by_structure", {})
        attempts = counts.get("attempts_by_structure", {})
        for structure, (same, n) in agree.items():
            rejects = by_structure.get(structure, {})
            top = ", ".join(f"{r} {c}" for r, c in sorted(rejects.items(), key=lambda x: -x[1]))
            tried = attempts.get(structure, n + sum(rejects.values()))
            print(f"| {label} | {structure} | {n} | {tried} | {top} | {same}/{n} |")
        print(f"| {label} | all | {len(rows)} | | walk wall time {seconds:.1f} s | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
