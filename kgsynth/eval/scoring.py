"""Aggregation: pure functions over prediction rows (one per question and run), from which
:func:`summarize` builds the metrics of one system (see :mod:`kgsynth.eval` for each
aggregate)."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from kgsynth.eval.config import (
    BREAKDOWNS,
    CI_LEVEL,
    CI_METHOD,
    CI_RESAMPLES,
    CI_SEED,
    METRICS,
    PASS_METRIC,
    SHOWN_METRICS,
    UNION_LABEL,
)
from kgsynth.metrics import (
    answer_set,
    match_predictions,
    mean_interval,
    normalize_answer,
    score,
)


def majority_choice(predictions: Sequence[Sequence[str]]) -> int:
    """Index of the run whose answer set wins the vote: the most frequent normalized set among
    the runs that answered; a tie goes to the first such run; 0 when no run answered."""
    keys = [frozenset(answer_set(p)) for p in predictions]
    counts = Counter(k for k in keys if k)
    if not counts:
        return 0
    best = max(counts.values())
    return next(i for i, k in enumerate(keys) if k and counts[k] == best)


def union_answers(predictions: Iterable[Sequence[str]]) -> list[str]:
    """All runs' answers, de-duplicated after normalization, in order of first appearance."""
    seen: set[str] = set()
    out: list[str] = []
    for pred in predictions:
        for answer in pred:
            key = normalize_answer(answer)
            if key and key not in seen:
                seen.add(key)
                out.append(answer)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_ks(runs: int) -> list[int]:
    """The k reported for ``runs`` runs: powers of two up to ``runs``, and ``runs`` itself."""
    ks = {1, runs}
    k = 2
    while k < runs:
        ks.add(k)
        k *= 2
    return sorted(ks)


def _mean(values: Iterable[float]) -> float:
    vals = list(values)
    return round(sum(vals) / len(vals), 6) if vals else 0.0


def _metric_means(scores: Sequence[dict[str, float]]) -> dict[str, float]:
    return {m: _mean(s[m] for s in scores) for m in METRICS}


def _scored(predicted: Sequence[str], gold: Sequence[str]) -> dict[str, float]:
    s = score(predicted, gold)
    return {m: getattr(s, m) for m in METRICS}


def _union_scored(merged: Sequence[str], gold: Sequence[str]) -> dict[str, float]:
    """Metrics of the N-run union. The union has no first answer, so its ``hits_at_1`` is
    KG-R1's N-run Hits@1: the question counts when any answer of any run is gold (``hit``)."""
    scores = _scored(merged, gold)
    scores["hits_at_1"] = scores["hit"]
    return scores


def _group_key(value: Any) -> str:
    return "unknown" if value is None else str(value)


def sorted_groups(keys: Iterable[str]) -> list[str]:
    def order(k: str) -> tuple[int, float, str]:
        if k == "unknown":
            return (2, 0.0, k)
        try:
            return (0, float(k), k)
        except ValueError:
            return (1, 0.0, k)

    return sorted(set(keys), key=order)


def _ci95(rows: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """``{metric: [lo, hi]}`` for the shown metrics of ``rows``, questions as the unit."""
    by_question: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_question[r["question_id"]].append(r)
    out: dict[str, list[float]] = {}
    for m in SHOWN_METRICS:
        groups = [[float(r[m]) for r in group] for group in by_question.values()]
        lo, hi = mean_interval(groups, resamples=CI_RESAMPLES, seed=CI_SEED, level=CI_LEVEL)
        out[m] = [round(lo, 6), round(hi, 6)]
    return out


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Metrics of one system's prediction rows (one per question and run; see the module
    docstring for each aggregate). Rows need ``question_id``, ``run``, ``predicted``, ``gold``,
    every metric of :data:`METRICS`; the breakdown and process columns, and a benchmark's
    ``gold_ids``/``gold_aliases`` (:func:`kgsynth.metrics.match_predictions`), are used where
    present."""
    if not rows:
        raise ValueError("no prediction rows to summarize")
    by_question: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_question.setdefault(row["question_id"], []).append(row)
    for group in by_question.values():
        group.sort(key=lambda r: r["run"])
    runs = sorted({r["run"] for r in rows})
    n_runs = len(runs)

    per_run = []
    for run in runs:
        these = [r for r in rows if r["run"] == run]
        per_run.append({"run": run, "questions": len(these), **_metric_means(these)})

    majority, union, first = [], [], []
    pass_k: dict[str, list[float]] = {str(k): [] for k in pass_ks(n_runs)}
    union_sizes = []
    for group in by_question.values():
        gold = group[0]["gold"]
        # benchmark answers matched by id or alias are voted and merged under their gold name
        ids, aliases = group[0].get("gold_ids"), group[0].get("gold_aliases")
        preds = [
            match_predictions(r["predicted"], gold, gold_ids=ids, aliases=aliases) for r in group
        ]
        first.append({m: group[0][m] for m in METRICS})
        majority.append(_scored(preds[majority_choice(preds)], gold))
        merged = union_answers(preds)
        union_sizes.append(len(answer_set(merged)))
        union.append(_union_scored(merged, gold))
        n, c = len(group), sum(1 for r in group if r[PASS_METRIC] == 1.0)
        for k in pass_k:
            if int(k) <= n:
                pass_k[k].append(pass_at_k(n, c, int(k)))

    std = {
        m: round(statistics.stdev(p[m] for p in per_run), 6) if n_runs > 1 else 0.0
        for m in SHOWN_METRICS
    }
    breakdowns: dict[str, dict[str, dict[str, Any]]] = {}
    for col in BREAKDOWNS:
        if not any(r.get(col) is not None for r in rows):
            continue
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            groups[_group_key(r.get(col))].append(r)
        breakdowns[col] = {
            k: {
                "questions": len({r["question_id"] for r in groups[k]}),
                **{m: _mean(r[m] for r in groups[k]) for m in SHOWN_METRICS},
                # intervals by hops only: the table that tells stages apart reads them
                **({"ci95": _ci95(groups[k])} if col == "hops" else {}),
            }
            for k in sorted_groups(groups)
        }

    def per_prediction(col: str) -> float:
        return _mean(float(r.get(col) or 0) for r in rows)

    return {
        "counts": {"questions": len(by_question), "runs": n_runs, "predictions": len(rows)},
        "overall": _metric_means(rows),
        "ci95": _ci95(rows),
        "ci95_method": CI_METHOD,
        "std_over_runs": std,
        "per_run": per_run,
        "first_run": _metric_means(first),
        "majority": _metric_means(majority),
        "union": {
            "label": UNION_LABEL,
            **_metric_means(union),
            "mean_answers": _mean(union_sizes),
        },
        "pass_at_k": {k: _mean(v) for k, v in pass_k.items()},
        "pass_at_k_metric": PASS_METRIC,
        "breakdowns": breakdowns,
        "process": {
            "turns_per_question": per_prediction("num_turns"),
            "tool_errors_per_question": per_prediction("tool_errors"),
            "format_errors_per_question": per_prediction("format_errors"),
            "llm_errors_per_question": per_prediction("llm_errors"),
            "generated_tokens_per_question": per_prediction("generated_tokens"),
            "resamples_per_question": per_prediction("resamples"),
            "answered": per_prediction("answered"),
            "forced_answer": per_prediction("forced_answer"),
        },
    }
