"""Regenerate ``dev_sample/metaqa_dev_sample.jsonl`` (beside this script, in
``kgsynth/resources/metaqa/``) from the MetaQA dev questions.

Draws ``--per-hop`` questions (default 100) of each of MetaQA's 1-, 2- and 3-hop dev sets with
``random.Random(seed)``, among only the questions whose gold answers the shipped KB
(``kb_partial.txt.gz``) reproduces (``derived/consistent_dev_{1,2,3}hop.idx``: 0-based line
numbers into ``{1,2,3}-hop/vanilla/qa_dev.txt``), and writes them as JSONL, interleaved
1-hop, 2-hop, 3-hop, 1-hop, … (each hop's questions in file order), so that the first K lines
(``kgsynth eval --limit K``) hold all three hop counts in equal shares::

    {"question_id": "metaqa-dev-2hop-L118", "question": "what ... [Joel Zwick]",
     "topic_names": ["Joel Zwick"], "answer_names": ["Greek"],
     "qtype": "director_to_movie_to_language", "hops": 2,
     "source": "2-hop/vanilla/qa_dev.txt", "source_line": 118}

``question`` keeps MetaQA's ``[...]`` around the topic entity; ``source_line`` is 1-based.
Same inputs and seed give the same bytes. ``--metaqa`` is the MetaQA download (default:
``../shared/data/metaqa``, from the repository root)::

    python kgsynth/resources/metaqa/make_dev_sample.py --metaqa ../shared/data/metaqa

``--exclude FILE`` (repeatable) leaves out every question of an earlier sample (by its
``source`` and ``source_line``), so a second sample shares none with the first. The check
sample, drawn once to test the trained agent outside the dev sample and never used to choose
anything::

    python kgsynth/resources/metaqa/make_dev_sample.py --seed 1 \
        --exclude kgsynth/resources/metaqa/dev_sample/metaqa_dev_sample.jsonl \
        --out kgsynth/resources/metaqa/dev_check/metaqa_dev_check.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_METAQA = Path("..") / "shared" / "data" / "metaqa"  # from the repository root
DEFAULT_OUT = HERE / "dev_sample" / "metaqa_dev_sample.jsonl"
BRACKETED = re.compile(r"\[([^\[\]]*)\]")


def sample_hop(
    metaqa: Path, hops: int, per_hop: int, rng: random.Random, taken: frozenset = frozenset()
) -> list[dict]:
    """``per_hop`` consistent questions of one hop count, none of whose 0-based line numbers
    (with their ``source``) is in ``taken``."""
    source = f"{hops}-hop/vanilla/qa_dev.txt"
    lines = (metaqa / source).read_text(encoding="utf-8").splitlines()
    qtypes = (metaqa / f"{hops}-hop" / "qa_dev_qtype.txt").read_text(encoding="utf-8").splitlines()
    if len(qtypes) != len(lines):
        raise SystemExit(f"{source}: {len(lines)} questions but {len(qtypes)} question types")
    consistent = [
        int(x) for x in (metaqa / "derived" / f"consistent_dev_{hops}hop.idx").read_text().split()
    ]
    consistent = [i for i in consistent if (source, i) not in taken]
    if len(consistent) < per_hop:
        raise SystemExit(f"{source}: {len(consistent)} questions left to draw, {per_hop} asked")
    rows = []
    for index in sorted(rng.sample(consistent, per_hop)):
        question, answers = lines[index].split("\t")
        rows.append(
            {
                "question_id": f"metaqa-dev-{hops}hop-L{index + 1}",
                "question": question.strip(),
                "topic_names": [m.strip() for m in BRACKETED.findall(question)],
                "answer_names": [a.strip() for a in answers.split("|")],
                "qtype": qtypes[index].strip(),
                "hops": hops,
                "source": source,
                "source_line": index + 1,
            }
        )
    return rows


def sampled(path: Path) -> list[tuple[str, int]]:
    """The (source, 0-based line) of every question of a sample file."""
    pairs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
            pairs.append((row["source"], int(row["source_line"]) - 1))
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"{path}, line {n}: needs source and source_line ({e})") from None
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metaqa", type=Path, default=DEFAULT_METAQA, help="MetaQA folder")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--per-hop", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--exclude", type=Path, action="append", default=[],
        help="an earlier sample (JSONL) whose questions this one leaves out; repeatable",
    )  # fmt: skip
    args = parser.parse_args()
    taken = frozenset(pair for path in args.exclude for pair in sampled(path))
    rng = random.Random(args.seed)
    by_hops = [sample_hop(args.metaqa, hops, args.per_hop, rng, taken) for hops in (1, 2, 3)]
    rows = [row for group in zip(*by_hops, strict=True) for row in group]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} questions -> {args.out}")


if __name__ == "__main__":
    main()
