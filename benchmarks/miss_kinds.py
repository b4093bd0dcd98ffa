"""Where a graphwalker agent's misses stop, by hop count, from an eval's predictions.

Each question the agent missed (Hits@1 0) falls in one kind:

- ``all hops``: it followed as many relations (``get_triples`` calls) as the question has
  hops, then answered wrong (a wrong relation, a name copied wrong, a wrong entity);
- ``early, unmarked list``: it answered after fewer ``get_triples`` calls than hops, right
  after a relations list on which the focus ranking marked no relation (no ``<-`` mark: no
  question word matched any listed relation), so the agent read the list as "nothing more
  is asked";
- ``early, marked list``: the same, but the list carried a mark;
- ``early, other``: it answered early after something else (a triples list, an error).

Usage::

    python benchmarks/miss_kinds.py runs/X/eval/stage1 [runs/Y/eval/stage1 ...]

Prints one table per folder (``predictions.parquet`` of ``kgsynth eval``): per hop count the
questions, the misses and each kind's count."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from kgsynth.agent.toolkit import MATCH_MARK

KINDS = ("all hops", "early, unmarked list", "early, marked list", "early, other")


def miss_kind(messages: list[dict], hops: int) -> str:
    """The kind of one missed episode (its chat messages) of a ``hops``-hop question."""
    calls = [m["content"] for m in messages if m["role"] == "assistant"]
    followed = sum("get_triples(" in str(c) for c in calls)
    if followed >= hops:
        return "all hops"
    tools = [str(m["content"]) for m in messages if m["role"] == "tool"]
    last = tools[-1] if tools else ""
    if "Relations of" not in last:
        return "early, other"
    return "early, marked list" if MATCH_MARK in last else "early, unmarked list"


def table(folder: Path) -> list[str]:
    import polars as pl

    preds = pl.read_parquet(folder / "predictions.parquet")
    out = [f"{folder}", "| hops | questions | misses | " + " | ".join(KINDS) + " |"]
    out.append("|---" * (3 + len(KINDS)) + "|")
    for hops in sorted(preds["hops"].unique().to_list()):
        part = preds.filter(pl.col("hops") == hops)
        missed = part.filter(pl.col("hits_at_1") == 0)
        kinds = Counter(miss_kind(r, hops) for r in missed["messages"].to_list())
        cells = " | ".join(str(kinds[k]) for k in KINDS)
        out.append(f"| {hops} | {part.height} | {missed.height} | {cells} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="kgsynth eval output folders")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not (folder / "predictions.parquet").is_file():
            print(f"{folder}: no predictions.parquet (a kgsynth eval output folder?)")
            return 2
        print("\n".join(table(folder)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
