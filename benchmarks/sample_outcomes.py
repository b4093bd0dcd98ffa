"""How the policy's own samples of each question came out, from a ``kgsynth filter`` output.

Rejection sampling's stage 2 (free rollouts of stage 1, several a question, kept by the filter)
trains on the successes; GRPO weighs a success by how rarely its group succeeds. This reads the
filter's ``accepted.parquet`` and ``rejected.parquet`` and prints, per question, how many of its
samples passed the outcome and grounding rules (a row rejected only as a repeat, by the
question cap or by balance passed them too): the histogram of successes, the mean success, the
mean within-question reward variance p(1-p) (what a GRPO group of this size has to climb), the
share of questions with both outcomes ("mixed"), and the successes that lie in questions
answered at most half the time. With ``--mixed-out FILE`` it writes the accepted rows of the
mixed questions, a stage-2 corpus without the questions every sample already answers.

Usage::

    python benchmarks/sample_outcomes.py runs/X/corpus_stage2 [--mixed-out mixed.parquet]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

# rejections after the outcome and grounding rules: the row itself was a success
PASSED = ("duplicate_actions", "over_question_cap", "balance", "contamination", "too_long")


def outcomes(folder: Path) -> pl.DataFrame:
    """One row per question: ``question_id``, ``structure``, ``samples``, ``successes``."""
    accepted = pl.read_parquet(folder / "accepted.parquet", columns=["question_id", "structure"])
    rejected = pl.read_parquet(
        folder / "rejected.parquet", columns=["question_id", "structure", "reject_reason"]
    )
    rows = pl.concat(
        [
            accepted.with_columns(ok=pl.lit(True)),
            rejected.select("question_id", "structure", ok=pl.col("reject_reason").is_in(PASSED)),
        ]
    )
    return (
        rows.group_by("question_id")
        .agg(
            pl.col("structure").first(),
            samples=pl.len(),
            successes=pl.col("ok").sum(),
        )
        .sort("question_id")
    )


def success_share(per_question: pl.DataFrame) -> pl.Series:
    """Each question's share of successful samples, from :func:`outcomes`."""
    return per_question["successes"] / per_question["samples"]


def summary(per_question: pl.DataFrame) -> dict:
    """The figures the module docstring lists, from :func:`outcomes`."""
    p = success_share(per_question)
    mixed = (p > 0) & (p < 1)
    return {
        "questions": per_question.height,
        "histogram": dict(per_question["successes"].value_counts().sort("successes").iter_rows()),
        "mean_success": float(per_question["successes"].sum() / per_question["samples"].sum()),
        "reward_variance": float((p * (1 - p)).mean()),
        "mixed": int(mixed.sum()),
        "never": int((p == 0).sum()),
        "always": int((p == 1).sum()),
        "successes_in_hard": int(per_question.filter(p <= 0.5)["successes"].sum()),
        "successes": int(per_question["successes"].sum()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a kgsynth filter output folder")
    parser.add_argument("--mixed-out", type=Path, help="write the mixed questions' accepted rows")
    args = parser.parse_args(argv)
    for name in ("accepted.parquet", "rejected.parquet"):
        if not (args.folder / name).is_file():
            print(f"sample_outcomes: no {name} in {args.folder}", file=sys.stderr)
            return 2
    per_question = outcomes(args.folder)
    s = summary(per_question)
    print(f"questions {s['questions']}; successes per question: {s['histogram']}")
    print(
        f"mean success {s['mean_success']:.3f}; within-question reward variance "
        f"{s['reward_variance']:.3f}; mixed {s['mixed']}, never {s['never']}, "
        f"always {s['always']}; successes in questions answered at most half the time "
        f"{s['successes_in_hard']} of {s['successes']}"
    )
    if args.mixed_out:
        p = success_share(per_question)
        keep = per_question.filter((p > 0) & (p < 1))["question_id"]
        rows = pl.read_parquet(args.folder / "accepted.parquet")
        rows = rows.filter(pl.col("question_id").is_in(keep.implode()))
        rows.write_parquet(args.mixed_out)
        print(f"{rows.height} accepted rows of {keep.len()} mixed questions -> {args.mixed_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
