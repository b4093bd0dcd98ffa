"""Does the agent take the right first relation on MetaQA's multi-hop questions?

A MetaQA question's type names its path's entity types (``movie_to_director_to_movie_to_year``:
from the topic film to its director, to the director's films, to their years), so the relation
its first hop must follow is known without a gold query: ``directed_by`` here, ``starred_actors``
for ``actor_to_movie_...`` (MetaQA's KB keeps every relation film -> person or value). For each
eval output folder this prints, per hop count, how often the agent's first ``get_triples`` call
follows that relation and its Hits@1 when it does and when it does not; with ``--pair A B`` it
splits the questions B answers and A misses (gained) and the reverse (lost) by whether each
took the right first relation.

Usage::

    python benchmarks/first_relation.py runs/X/eval/stage1 runs/X/eval/rl [--pair]

(``--pair`` compares the first two folders, the second against the first.)"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from kgsynth.eval.config import MODEL_SUBJECT

# MetaQA's question-type words -> the KB relation between a film and that type
RELATION = {
    "director": "directed_by",
    "actor": "starred_actors",
    "writer": "written_by",
    "genre": "has_genre",
    "year": "release_year",
    "language": "in_language",
    "tags": "has_tags",
    "rating": "has_imdb_rating",
    "votes": "has_imdb_votes",
}


def wanted(qtype: str) -> str | None:
    """The relation the first hop of a MetaQA question of type ``qtype`` follows."""
    types = (qtype or "").split("_to_")
    if len(types) < 2:
        return None
    other = types[1] if types[0] == "movie" else types[0]
    return RELATION.get(other)


def first_followed(turns: list[dict]) -> str | None:
    """The first relation of the episode's first ``get_triples`` call (None: it made none)."""
    for turn in turns or []:
        if turn.get("tool") == "get_triples" and turn.get("args"):
            try:
                relations = json.loads(turn["args"])[1]
            except (ValueError, IndexError, TypeError):
                return None
            return relations[0] if relations else None
    return None


def load(folder: Path) -> dict[str, dict]:
    import polars as pl

    preds = pl.read_parquet(folder / "predictions.parquet")
    if "system" in preds.columns:
        preds = preds.filter(pl.col("system") == MODEL_SUBJECT)
    rows = {}
    for r in preds.iter_rows(named=True):
        want = wanted(r.get("qtype"))
        if want is None or r["hops"] < 2:
            continue
        right = first_followed(r["turns"]) == want
        rows[r["question_id"]] = {"hops": r["hops"], "right": right, "hit": r["hits_at_1"] > 0}
    return rows


def hit_rate(rows: list[dict]) -> str:
    return f"{sum(r['hit'] for r in rows) / len(rows):.3f}" if rows else "-"


def table(folder: Path, rows: dict[str, dict]) -> list[str]:
    out = [f"{folder}", "| hops | questions | first relation right | Hits@1 right | Hits@1 wrong |"]
    out.append("|---|---|---|---|---|")
    for hops in sorted({r["hops"] for r in rows.values()}):
        part = [r for r in rows.values() if r["hops"] == hops]
        right = [r for r in part if r["right"]]
        wrong = [r for r in part if not r["right"]]
        share = f"{len(right) / len(part):.3f}"
        out.append(f"| {hops} | {len(part)} | {share} | {hit_rate(right)} | {hit_rate(wrong)} |")
    return out


def pair(a: dict[str, dict], b: dict[str, dict]) -> list[str]:
    """Gained and lost questions of ``b`` against ``a`` by (a's first relation, b's) right."""
    kinds: Counter = Counter()
    for qid in a.keys() & b.keys():
        if a[qid]["hit"] == b[qid]["hit"]:
            continue
        change = "gained" if b[qid]["hit"] else "lost"
        kinds[(change, a[qid]["right"], b[qid]["right"])] += 1
    out = ["| change | first relation A -> B | questions |", "|---|---|---|"]
    word = {True: "right", False: "wrong"}
    for (change, ra, rb), n in sorted(kinds.items()):
        out.append(f"| {change} | {word[ra]} -> {word[rb]} | {n} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="kgsynth eval output folders")
    parser.add_argument("--pair", action="store_true", help="the second folder against the first")
    args = parser.parse_args(argv)
    loaded = []
    for folder in args.folders:
        if not (folder / "predictions.parquet").is_file():
            print(f"{folder}: no predictions.parquet (a kgsynth eval output folder?)")
            return 2
        loaded.append(load(folder))
        print("\n".join(table(folder, loaded[-1])) + "\n")
    if args.pair and len(loaded) >= 2:
        print("\n".join(pair(loaded[0], loaded[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
