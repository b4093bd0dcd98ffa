"""Regenerate ``data/metaqa/dev_sample/metaqa_dev_sample.jsonl`` from the MetaQA dev questions.

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
Same inputs and seed give the same bytes. Run from the repository root::

    python data/metaqa/make_dev_sample.py --metaqa ../shared/data/metaqa
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_METAQA = HERE.parents[2] / "shared" / "data" / "metaqa"
DEFAULT_OUT = HERE / "dev_sample" / "metaqa_dev_sample.jsonl"
BRACKETED = re.compile(r"\[([^\[\]]*)\]")


def sample_hop(metaqa: Path, hops: int, per_hop: int, rng: random.Random) -> list[dict]:
    source = f"{hops}-hop/vanilla/qa_dev.txt"
    lines = (metaqa / source).read_text(encoding="utf-8").splitlines()
    qtypes = (metaqa / f"{hops}-hop" / "qa_dev_qtype.txt").read_text(encoding="utf-8").splitlines()
    if len(qtypes) != len(lines):
        raise SystemExit(f"{source}: {len(lines)} questions but {len(qtypes)} question types")
    consistent = [
        int(x) for x in (metaqa / "derived" / f"consistent_dev_{hops}hop.idx").read_text().split()
    ]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metaqa", type=Path, default=DEFAULT_METAQA, help="MetaQA folder")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--per-hop", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    by_hops = [sample_hop(args.metaqa, hops, args.per_hop, rng) for hops in (1, 2, 3)]
    rows = [row for group in zip(*by_hops, strict=True) for row in group]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} questions -> {args.out}")


if __name__ == "__main__":
    main()
