"""Referenced Rejection Sampling against plain rejection sampling (KBQA-R1 §IV-B; issue 18).

Reads the folder `make kbqa-r1` writes (RRS_DIR): ``referenced.parquet`` and ``plain.parquet``
(the same policy, questions, samples and temperature; referenced episodes were shown the gold
action sequence, stored without it) and what the filter kept of each (``referenced_kept/`` and
``plain_kept/``, ``accepted.parquet``), and prints, per mode and per walk structure, how many
episodes and questions were sampled and how many the filter accepted. KBQA-R1 reports 67.0 %
acceptance with the reference against 39.3 % without on GrailQA (its Table V)::

    python benchmarks/rrs_acceptance.py runs/kbqa-r1/rrs
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq


def _rows(path: Path, columns: list[str]) -> list[dict]:
    return pq.read_table(path, columns=columns).to_pylist() if path.exists() else []


def acceptance(folder: Path, mode: str) -> dict[str, object]:
    cols = ["question_id", "structure"]
    sampled = _rows(folder / f"{mode}.parquet", cols)
    kept = _rows(folder / f"{mode}_kept" / "accepted.parquet", cols)
    by_structure = Counter(r["structure"] for r in sampled)
    kept_by_structure = Counter(r["structure"] for r in kept)
    return {
        "episodes": len(sampled),
        "accepted": len(kept),
        "questions": len({r["question_id"] for r in sampled}),
        "questions_accepted": len({r["question_id"] for r in kept}),
        "by_structure": {s: (kept_by_structure[s], n) for s, n in sorted(by_structure.items())},
    }


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f} %" if b else "n/a"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    folder = Path(argv[0])
    if not (folder / "referenced.parquet").exists() or not (folder / "plain.parquet").exists():
        print(
            f"{folder}: needs referenced.parquet and plain.parquet (make kbqa-r1)", file=sys.stderr
        )
        return 1
    print(
        "| mode | episodes accepted | acceptance | questions with one accepted | by structure (accepted/sampled) |"
    )
    print("|---|---|---|---|---|")
    for mode, label in (
        ("referenced", "RRS (with reference)"),
        ("plain", "plain rejection sampling"),
    ):
        a = acceptance(folder, mode)
        structures = ", ".join(f"{s} {k}/{n}" for s, (k, n) in a["by_structure"].items())
        print(
            f"| {label} | {a['accepted']} of {a['episodes']} | {_pct(a['accepted'], a['episodes'])} "
            f"| {a['questions_accepted']} of {a['questions']} | {structures} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
