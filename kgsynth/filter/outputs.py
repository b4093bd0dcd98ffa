"""What the filters' run turns into: the accepted and rejected tables with their metric columns
(:func:`split_rows`), the upsampled copies of small groups (:func:`upsample`) and the stats
(:func:`run_stats`)."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from kgsynth.core.schema import METRIC_FIELDS, REJECTED_SCHEMA
from kgsynth.filter.base import FilterRun
from kgsynth.filter.columns import _filter_rows
from kgsynth.filter.config import REASONS, FilterConfig


def group_key(value: Any) -> str:
    """A group's value as a stats key (``null`` for None)."""
    return "null" if value is None else str(value)


def split_rows(run: FilterRun) -> tuple[pa.Table, pa.Table]:
    """The kept rows (:data:`ACCEPTED_SCHEMA`) and the rejected ones with their
    ``reject_reason`` (:data:`REJECTED_SCHEMA`), both in input order, with the metrics."""
    answers = run.answers
    kept_mask = run.alive
    scores = [
        pa.array(values, type=pa.float64())
        for values in (answers.em_strict, answers.hit, answers.f1)
    ]
    keep_arr = pa.array(kept_mask)
    drop_arr = pa.array(~kept_mask)
    accepted = _filter_rows(run.table, kept_mask)
    for field_, values in zip(METRIC_FIELDS, scores, strict=True):
        accepted = accepted.append_column(field_, values.filter(keep_arr))
    codes = run.reason[~kept_mask].astype(np.int64) - 1
    reasons = pa.array(REASONS, type=pa.string()).take(pa.array(codes))
    rejected = _filter_rows(run.table, ~kept_mask)
    rejected = rejected.append_column(REJECTED_SCHEMA.field("reject_reason"), reasons)
    for field_, values in zip(METRIC_FIELDS, scores, strict=True):
        rejected = rejected.append_column(field_, values.filter(drop_arr))
    return accepted, rejected


def upsample(accepted: pa.Table, cfg: FilterConfig) -> tuple[pa.Table, dict[str, Any]]:
    """The accepted rows, then copies of the rows of every ``cfg.balance`` group smaller than
    the largest: a group of ``k`` rows grows to ``min(largest, floor(upsample_factor * k))``
    (whole copies of the group in input order, then a draw seeded by ``cfg.seed`` and the
    group). A copy's ``trajectory_id`` is the original's with ``~copyN``."""
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(accepted.column(cfg.balance).to_pylist()):
        groups.setdefault(key, []).append(i)
    largest = max(len(rows) for rows in groups.values())
    take: list[int] = []
    copies: dict[str, int] = {}
    for key in sorted(groups, key=lambda k: (k is None, str(k))):
        rows = groups[key]
        need = min(largest, math.floor(cfg.upsample_factor * len(rows))) - len(rows)
        if need <= 0:
            continue
        picked: list[int] = []
        while need >= len(rows):
            picked.extend(rows)
            need -= len(rows)
        rng = random.Random(f"upsample|{cfg.seed}|{group_key(key)}")
        picked.extend(sorted(rng.sample(rows, need)))
        take.extend(picked)
        copies[group_key(key)] = len(picked)
    info = {
        "by": cfg.balance,
        "factor": cfg.upsample_factor,
        "seed": cfg.seed,
        "copies": copies,
        "rows": len(take),
        "groups_after": {
            group_key(k): len(v) + copies.get(group_key(k), 0)
            for k, v in sorted(groups.items(), key=lambda kv: (kv[0] is None, str(kv[0])))
        },
    }
    if not take:
        return accepted, info
    extra = accepted.take(pa.array(take, type=pa.int64()))
    seen: Counter[str] = Counter()
    ids = []
    for tid in extra.column("trajectory_id").to_pylist():
        seen[tid] += 1
        ids.append(f"{tid}~copy{seen[tid]}")
    col = accepted.schema.get_field_index("trajectory_id")
    extra = extra.set_column(col, accepted.schema.field(col), pa.array(ids, pa.string()))
    return pa.concat_tables([accepted, extra]), info


def run_stats(run: FilterRun, enabled: list[str]) -> dict[str, Any]:
    """Row counts, rejects per enabled reason, acceptance by group and the mean metrics."""
    n = run.n
    answers = run.answers
    counts = np.bincount(run.reason, minlength=len(REASONS) + 1)
    accepted = int(counts[0])
    frame = pl.from_arrow(run.table.select(["structure", "hops", "mode", "num_turns"]))
    assert isinstance(frame, pl.DataFrame)
    frame = frame.with_columns(pl.Series("_kept", run.alive))
    acceptance: dict[str, dict[str, dict[str, Any]]] = {}
    for col in ("structure", "hops", "mode", "num_turns"):
        groups = (
            frame.group_by(col)
            .agg(pl.len().alias("rows"), pl.col("_kept").sum().alias("accepted"))
            .sort(col, nulls_last=True)
        )
        acceptance[col] = {
            group_key(k): {
                "rows": int(r),
                "accepted": int(a),
                "rate": round(a / r, 4) if r else 0.0,
            }
            for k, r, a in groups.iter_rows()
        }
    return {
        "rows_in": n,
        "accepted": accepted,
        "rejected": n - accepted,
        "acceptance_rate": round(accepted / n, 4) if n else 0.0,
        "filters": enabled,
        "rejects": {r: int(counts[i + 1]) for i, r in enumerate(REASONS) if r in enabled},
        "acceptance": acceptance,
        "answers": {
            "mean_em_strict": round(float(answers.em_strict.mean()), 4) if n else None,
            "mean_hit": round(float(answers.hit.mean()), 4) if n else None,
            "mean_f1": round(float(answers.f1.mean()), 4) if n else None,
        },
    }
