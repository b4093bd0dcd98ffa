"""The filters in their fixed order over one table (:func:`run_filters`): each rejects, with its
reason, rows no earlier filter rejected; then the accepted and rejected tables and the stats."""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from kgsynth.errors import ConfigError
from kgsynth.filter.checks import (
    _AnswerChecks,
    _message_parts,
    answer_checks,
    format_checks,
    leak_checks,
)
from kgsynth.filter.columns import _counts, _filter_rows, _rank_within, as_trajectory_table
from kgsynth.filter.config import REASONS, FilterConfig, MaxSimilarity
from kgsynth.schema import METRIC_FIELDS, REJECTED_SCHEMA

log = logging.getLogger(__name__)

# Whitespace as Python's str.split() sees it (Unicode White_Space plus \x1c-\x1f).
_WS_RUN = r"[\s\x1c-\x1f]+"


@dataclass
class _Run:
    n: int
    reason: np.ndarray
    seconds: dict[str, float] = field(default_factory=dict)
    progress: Callable[[str], None] | None = None

    @property
    def alive(self) -> np.ndarray:
        return self.reason == 0

    def reject(self, name: str, mask: np.ndarray) -> None:
        """Give ``name`` to the rows in ``mask`` that no earlier filter rejected."""
        self.reason[mask & (self.reason == 0)] = REASONS.index(name) + 1

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        if self.progress is not None:
            self.progress(name)
        started = time.perf_counter()
        yield
        self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - started, 4)


def run_filters(
    table_or_rows: Any,
    cfg: FilterConfig,
    *,
    max_similarity: MaxSimilarity | None = None,
    progress: Callable[[str], None] | None = None,
    source: str = "input rows",
) -> tuple[pa.Table, pa.Table, dict[str, Any]]:
    """Filter trajectories; returns ``(accepted, rejected, stats)``.

    ``table_or_rows``: an Arrow table, a polars DataFrame or row dicts with every
    :data:`TRAJECTORY_SCHEMA` column. ``accepted`` is in :data:`ACCEPTED_SCHEMA`,
    ``rejected`` in :data:`REJECTED_SCHEMA`, both in input order; together they hold every
    input row once. ``max_similarity`` turns the contamination filter on (see the module
    docstring for the filters and their order). ``progress`` is called with each step's name
    as it starts; ``source`` names the input in errors.
    """
    started = time.perf_counter()
    table = as_trajectory_table(table_or_rows, source)
    n = table.num_rows
    run = _Run(n, np.zeros(n, dtype=np.int8), progress=progress)
    enabled = cfg.enabled(contamination=max_similarity is not None)
    details: dict[str, Any] = {}

    with run.step("answers"):
        answers = answer_checks(table, grounding=cfg.grounding)
        details["distinct_answer_strings"] = answers.distinct_strings
    if "no_answer" in enabled:
        run.reject("no_answer", ~answers.has_answer)
    if cfg.outcome == "em_strict":
        run.reject("wrong_answer", answers.em_strict < 1.0)
    elif cfg.outcome == "hit":
        run.reject("wrong_answer", answers.hit < 1.0)
    elif cfg.outcome == "f1":
        run.reject("wrong_answer", (answers.em_strict < 1.0) & (answers.f1 < cfg.f1_threshold))
    if answers.grounded is not None:
        run.reject("ungrounded_answer", ~answers.grounded)

    content = rows = assistant = None
    if cfg.check_format or cfg.max_chars is not None:
        with run.step("messages"):
            content, rows, assistant = _message_parts(table)
    if cfg.check_format:
        assert content is not None and rows is not None and assistant is not None
        with run.step("bad_format"):
            ok, parsed = format_checks(content, rows, assistant, run.alive)
            run.reject("bad_format", ~ok)
            details["format_rows_parsed_one_by_one"] = parsed
    if cfg.reference_leak:
        with run.step("reference_leak"):
            leaked, checked = leak_checks(table, run.alive, cfg.leak_min_chars)
            run.reject("reference_leak", leaked)
            details["reference_rows_checked"] = checked
    if "too_long" in enabled:
        with run.step("too_long"):
            long = np.zeros(n, dtype=bool)
            if cfg.max_chars is not None:
                assert content is not None and rows is not None
                lengths = np.asarray(pc.utf8_length(content), dtype=np.float64)
                long |= _counts(rows, n, lengths) > cfg.max_chars
            if cfg.max_turns is not None:
                turns = np.asarray(pc.fill_null(table.column("num_turns"), 0), dtype=np.int64)
                long |= turns > cfg.max_turns
            run.reject("too_long", long)
    del content, rows, assistant

    contamination = None
    if max_similarity is not None:
        with run.step("contamination"):
            questions = pc.fill_null(table.column("question"), "")
            idx = np.flatnonzero(run.alive)
            codes = pc.dictionary_encode(questions.filter(pa.array(run.alive)).combine_chunks())
            distinct = codes.dictionary.to_pylist()
            sims = np.asarray(max_similarity(distinct) if distinct else [], dtype=np.float64)
            if sims.shape != (len(distinct),):
                raise ConfigError(
                    f"max_similarity returned {sims.shape[0] if sims.ndim else 0} values for "
                    f"{len(distinct)} questions"
                )
            row_sims = sims[np.asarray(codes.indices, dtype=np.int64)] if len(idx) else sims
            hit = np.zeros(n, dtype=bool)
            hit[idx] = row_sims >= cfg.contamination_threshold
            run.reject("contamination", hit)
            from kgsynth.contamination import contamination_report

            contamination = contamination_report(sims)
            contamination["threshold"] = cfg.contamination_threshold
            contamination["rows_checked"] = len(idx)

    group_steps = cfg.dedup_actions or cfg.max_per_question is not None or "balance" in enabled
    balance_info: dict[str, Any] | None = None
    if group_steps:
        with run.step("group keys"):
            keys = pl.from_arrow(
                table.select(["question_id", "structure", "hops", "tool_calls"])
            ).with_row_index("_row")
            assert isinstance(keys, pl.DataFrame)
        if cfg.dedup_actions:
            with run.step("duplicate_actions"):
                kept = keys.filter(pl.Series(run.alive))
                calls = pl.col("tool_calls").list.eval(
                    pl.element().str.replace_all(_WS_RUN, " ").str.strip_chars(" ")
                )
                first = kept.select(
                    pl.col("_row"),
                    pl.struct(pl.col("question_id"), calls).is_first_distinct().alias("_first"),
                )
                dup = np.zeros(n, dtype=bool)
                dup[first.filter(~pl.col("_first"))["_row"].to_numpy()] = True
                run.reject("duplicate_actions", dup)
        if cfg.max_per_question is not None:
            with run.step("over_question_cap"):
                kept = keys.filter(pl.Series(run.alive))
                rank = kept.select(pl.int_range(pl.len()).over("question_id"))[:, 0].to_numpy()
                over = np.zeros(n, dtype=bool)
                over[kept["_row"].to_numpy()[rank >= cfg.max_per_question]] = True
                run.reject("over_question_cap", over)
        if "balance" in enabled:
            with run.step("balance"):
                balance_info = _balance(run, keys, cfg)

    with run.step("outputs"):
        kept_mask = run.alive
        scores = [
            pa.array(values, type=pa.float64())
            for values in (answers.em_strict, answers.hit, answers.f1)
        ]
        keep_arr = pa.array(kept_mask)
        drop_arr = pa.array(~kept_mask)
        accepted = _filter_rows(table, kept_mask)
        for field_, values in zip(METRIC_FIELDS, scores, strict=True):
            accepted = accepted.append_column(field_, values.filter(keep_arr))
        codes = run.reason[~kept_mask].astype(np.int64) - 1
        reasons = pa.array(REASONS, type=pa.string()).take(pa.array(codes))
        rejected = _filter_rows(table, ~kept_mask)
        rejected = rejected.append_column(REJECTED_SCHEMA.field("reject_reason"), reasons)
        for field_, values in zip(METRIC_FIELDS, scores, strict=True):
            rejected = rejected.append_column(field_, values.filter(drop_arr))
        stats = _stats(table, run, enabled, answers)
    assert accepted.num_rows + rejected.num_rows == n, "every input row is accepted or rejected"
    if cfg.upsample_factor > 1.0 and accepted.num_rows:
        with run.step("upsample"):
            accepted, upsampled = _upsample(accepted, cfg)
        balance_info = {**(balance_info or {}), "upsample": upsampled}
        stats["upsampled_rows"] = upsampled["rows"]
    stats.update(details)
    stats["contamination"] = contamination
    stats["balance"] = balance_info
    stats["seconds_by_step"] = run.seconds
    stats["elapsed_s"] = round(time.perf_counter() - started, 3)
    log.info(
        "filter: %d in, %d accepted, rejects %s, %.1f s",
        n,
        accepted.num_rows,
        {k: v for k, v in stats["rejects"].items() if v},
        stats["elapsed_s"],
    )
    return accepted, rejected, stats


def _balance(run: _Run, keys: pl.DataFrame, cfg: FilterConfig) -> dict[str, Any]:
    """``max_per_structure``, then ``balance``; both reject with ``balance``."""
    info: dict[str, Any] = {}
    steps: list[tuple[str, int | None]] = []
    if cfg.max_per_structure is not None:
        steps.append(("structure", cfg.max_per_structure))
        info["max_per_structure"] = cfg.max_per_structure
    if cfg.balance != "none":
        steps.append((cfg.balance, None))
    for by, cap in steps:
        kept = keys.filter(pl.Series(run.alive)).with_columns(
            pl.int_range(pl.len()).over("question_id").alias("_qrank")
        )
        if len(kept) == 0:
            break
        if cap is None:
            sizes = kept.group_by(by).len()
            smallest = int(sizes["len"].min())  # type: ignore[arg-type]
            cap = math.floor(cfg.balance_factor * smallest)
            groups = sorted(sizes.iter_rows(), key=lambda kv: (kv[0] is None, kv[0]))
            info.update(
                by=by,
                smallest_group=smallest,
                cap=cap,
                groups_before={_key(k): int(v) for k, v in groups},
            )
        # each question's 1st kept row, then its 2nd, ...: a capped group keeps many questions
        rank = _rank_within(kept, by, ["_qrank", "_row"]).to_numpy()
        over = np.zeros(run.n, dtype=bool)
        over[kept["_row"].to_numpy()[rank >= cap]] = True
        run.reject("balance", over)
    return info


def _upsample(accepted: pa.Table, cfg: FilterConfig) -> tuple[pa.Table, dict[str, Any]]:
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
        rng = random.Random(f"upsample|{cfg.seed}|{_key(key)}")
        picked.extend(sorted(rng.sample(rows, need)))
        take.extend(picked)
        copies[_key(key)] = len(picked)
    info = {
        "by": cfg.balance,
        "factor": cfg.upsample_factor,
        "seed": cfg.seed,
        "copies": copies,
        "rows": len(take),
        "groups_after": {
            _key(k): len(v) + copies.get(_key(k), 0)
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


def _key(value: Any) -> str:
    return "null" if value is None else str(value)


def _stats(
    table: pa.Table, run: _Run, enabled: list[str], answers: _AnswerChecks
) -> dict[str, Any]:
    n = run.n
    counts = np.bincount(run.reason, minlength=len(REASONS) + 1)
    accepted = int(counts[0])
    frame = pl.from_arrow(table.select(["structure", "hops", "mode", "num_turns"]))
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
            _key(k): {"rows": int(r), "accepted": int(a), "rate": round(a / r, 4) if r else 0.0}
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
