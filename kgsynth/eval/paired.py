"""Stage against stage on the same questions (``kgsynth eval --compare``): whether a later
evaluation answers more questions than the one before it, told apart from chance.

Two evaluations of one question set are paired: each question's Hits@1 (its mean over runs)
in the later one minus that in the earlier one. The difference of the means gets a percentile
bootstrap interval over questions (the unit eval's own intervals use), and the questions that
one of the two gets right and the other wrong get an exact two-sided sign test (McNemar's
exact test when every question scores 0 or 1). Two overlapping 95 % intervals of the means do
not say that two stages are the same, and two separate ones are not needed to tell them apart:
the paired interval is the one that answers "did this stage add?".

The pairs are each evaluation against the one listed before it (``--compare stage1 stage2 rl``
gives stage2 - stage1 and rl - stage2), and each baseline an evaluation ran (untrained,
no-tools) against its model. Folders without ``predictions.parquet`` (written by hand, or
moved) and pairs without a question in common are listed as skipped, with the reason."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from kgsynth.eval.config import CI_LEVEL, CI_RESAMPLES, CI_SEED
from kgsynth.metrics import bootstrap_interval, sign_test_p

PREDICTIONS = "predictions.parquet"
MODEL_SYSTEM = "model"
METRIC = "hits_at_1"


def question_scores(predictions: Path) -> dict[str, dict[str, float]] | None:
    """``{system: {question_id: mean Hits@1 over runs}}`` of ``predictions`` (the model's
    rows and each baseline's); None when the file is missing or unreadable."""
    if not predictions.is_file():
        return None
    import polars as pl

    try:
        frame = pl.read_parquet(predictions, columns=["system", "question_id", METRIC])
    except Exception:  # an unreadable or foreign file: the pair is skipped, with the reason
        return None
    means = frame.group_by("system", "question_id").agg(pl.col(METRIC).fill_null(0.0).mean())
    out: dict[str, dict[str, float]] = {}
    for system, question, score in means.iter_rows():
        out.setdefault(system, {})[question] = float(score)
    return out


def sign_split(earlier: dict[str, float], later: dict[str, float]) -> tuple[int, int, float]:
    """``(better, worse, p)`` over the questions both answered: how many ``later`` scores
    above and below ``earlier``, and the exact two-sided sign test's p of that split (also
    what GRPO's early stopping asks of a checkpoint against its start)."""
    common = set(earlier) & set(later)
    better = sum(later[q] > earlier[q] for q in common)
    worse = sum(later[q] < earlier[q] for q in common)
    return better, worse, sign_test_p(better, worse)


def paired_difference(earlier: dict[str, float], later: dict[str, float]) -> dict[str, Any]:
    """Hits@1 of ``later`` minus ``earlier`` on the questions both answered: the mean
    difference, its 95 % bootstrap interval, how many questions got better, worse or stayed,
    and the exact sign test's two-sided p of better against worse."""
    common = sorted(set(earlier) & set(later))
    diffs = [later[q] - earlier[q] for q in common]
    better, worse, p = sign_split(earlier, later)
    lo, hi = bootstrap_interval(
        [[d] for d in diffs], resamples=CI_RESAMPLES, seed=CI_SEED, level=CI_LEVEL
    )
    return {
        "questions": len(common),
        "difference": round(sum(diffs) / len(diffs), 6),
        "ci95": [round(lo, 6), round(hi, 6)],
        "better": better,
        "worse": worse,
        "same": len(common) - better - worse,
        "sign_test_p": round(p, 6),
    }


def _pairs(rows: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(earlier, later) rows: each model row against the model row before it, and each
    baseline row against its model's row."""
    models = [r for r in rows if r["system"] == MODEL_SYSTEM]
    pairs = list(pairwise(models))
    for base in rows:
        if base["system"] != MODEL_SYSTEM:
            owner = next(r for r in models if r["source"] == base["source"])
            pairs.append((base, owner))
    return pairs


def paired_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per pair of compared rows (see the module's docstring): ``earlier``,
    ``later`` and :func:`paired_difference`'s figures, or ``skipped`` with the reason."""
    read: dict[str, dict[str, dict[str, float]] | None] = {}  # each file once
    out: list[dict[str, Any]] = []
    for earlier, later in _pairs(rows):
        entry: dict[str, Any] = {"earlier": earlier["label"], "later": later["label"]}
        scores = []
        for row in (earlier, later):
            source = row["source"]
            if source not in read:
                read[source] = question_scores(Path(source).parent / PREDICTIONS)
            found = (read[source] or {}).get(row["system"])
            if not found:
                entry["skipped"] = f"no {PREDICTIONS} beside {source}"
                break
            scores.append(found)
        if "skipped" not in entry:
            if set(scores[0]) & set(scores[1]):
                entry.update(paired_difference(scores[0], scores[1]))
            else:
                entry["skipped"] = "no question in common"
        out.append(entry)
    return out


def difference_cell(entry: dict[str, Any]) -> str:
    """``+0.033 [+0.007, +0.063]``: a pair's difference and its interval."""
    lo, hi = entry["ci95"]
    return f"{entry['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def p_cell(p: float) -> str:
    """A p value as a table shows it."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def paired_markdown(paired: Sequence[dict[str, Any]]) -> list[str]:
    """The pairs as markdown lines: a table and how to read it, then the skipped pairs."""
    if not paired:
        return []
    lines = ["## Stage against stage (paired, same questions)"]
    done = [e for e in paired if "skipped" not in e]
    if done:
        lines += [
            "",
            "| later − earlier | questions | Hits@1 difference [95 % CI] | better | worse | "
            "sign test p |",
            "|---|---|---|---|---|---|",
        ]
        for e in done:
            lines.append(
                f"| {e['later']} − {e['earlier']} | {e['questions']} | {difference_cell(e)} | "
                f"{e['better']} | {e['worse']} | {p_cell(e['sign_test_p'])} |"
            )
        lines += [
            "",
            "Each question's Hits@1 (mean over runs) in the later evaluation minus the earlier; "
            f"the interval is a percentile bootstrap over questions ({CI_RESAMPLES} resamples, "
            f"seed {CI_SEED}); better / worse count the questions that changed; the sign test is "
            "exact and two-sided on those. An interval that holds 0 does not tell the two apart.",
        ]
    skipped = [e for e in paired if "skipped" in e]
    if skipped:
        lines += [
            "",
            *(f"- {e['later']} − {e['earlier']}: skipped, {e['skipped']}" for e in skipped),
        ]
    return lines
