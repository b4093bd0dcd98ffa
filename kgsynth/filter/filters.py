"""The filters, one :class:`~kgsynth.filter.base.Filter` per reject reason, in their fixed order
(:data:`PHASES`), and the driver over one table (:func:`run_filters`): each filter rejects, with
its reason, rows no earlier filter rejected; then the accepted and rejected tables and the
stats."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from kgsynth.core.errors import ConfigError
from kgsynth.filter.base import Filter, FilterRun, Phase
from kgsynth.filter.checks import _message_parts, answer_checks, format_checks, leak_checks
from kgsynth.filter.columns import _counts, _rank_within, as_trajectory_table
from kgsynth.filter.config import FilterConfig, MaxSimilarity
from kgsynth.filter.outputs import group_key, run_stats, split_rows, upsample

log = logging.getLogger(__name__)

# Whitespace as Python's str.split() sees it (Unicode White_Space plus \x1c-\x1f).
_WS_RUN = r"[\s\x1c-\x1f]+"


class NoAnswer(Filter):
    """The predicted answer set is empty after normalization."""

    name = "no_answer"
    timed = False  # the answer filters read the "answers" step's arrays

    def rejects(self, run: FilterRun) -> np.ndarray:
        return ~run.answers.has_answer


class WrongAnswer(Filter):
    """The answers fail ``cfg.outcome``'s check (``em_strict``, ``hit``, ``f1`` or
    ``f1_above``)."""

    name = "wrong_answer"
    timed = False

    def rejects(self, run: FilterRun) -> np.ndarray:
        answers, cfg = run.answers, run.cfg
        if cfg.outcome == "em_strict":
            return answers.em_strict < 1.0
        if cfg.outcome == "hit":
            return answers.hit < 1.0
        if cfg.outcome == "f1_above":  # KBQA-R1 Table VII: F1 > 0.9
            return answers.f1 <= cfg.f1_threshold
        assert cfg.outcome == "f1"  # "none" turns the filter off
        return (answers.em_strict < 1.0) & (answers.f1 < cfg.f1_threshold)


class UngroundedAnswer(Filter):
    """Some answer is not among the entities the environment returned."""

    name = "ungrounded_answer"
    timed = False

    def rejects(self, run: FilterRun) -> np.ndarray:
        assert run.answers.grounded is not None  # checked with cfg.grounding
        return ~run.answers.grounded


class BadFormat(Filter):
    """Some assistant turn does not parse, or the last is no answer."""

    name = "bad_format"

    def reads_shared(self, cfg: FilterConfig) -> bool:
        return True

    def rejects(self, run: FilterRun) -> np.ndarray:
        content, rows, assistant = run.shared["messages"]
        ok, parsed = format_checks(content, rows, assistant, run.alive)
        run.details["format_rows_parsed_one_by_one"] = parsed
        return ~ok


class ReferenceLeak(Filter):
    """A referenced row's messages contain its hint text."""

    name = "reference_leak"

    def rejects(self, run: FilterRun) -> np.ndarray:
        leaked, checked = leak_checks(run.table, run.alive, run.cfg.leak_min_chars)
        run.details["reference_rows_checked"] = checked
        return leaked


class TooLong(Filter):
    """More than ``max_chars`` characters in all messages, or more than ``max_turns`` turns."""

    name = "too_long"

    def reads_shared(self, cfg: FilterConfig) -> bool:
        return cfg.max_chars is not None

    def rejects(self, run: FilterRun) -> np.ndarray:
        cfg = run.cfg
        long = np.zeros(run.n, dtype=bool)
        if cfg.max_chars is not None:
            content, rows, _ = run.shared["messages"]
            lengths = np.asarray(pc.utf8_length(content), dtype=np.float64)
            long |= _counts(rows, run.n, lengths) > cfg.max_chars
        if cfg.max_turns is not None:
            turns = np.asarray(pc.fill_null(run.table.column("num_turns"), 0), dtype=np.int64)
            long |= turns > cfg.max_turns
        return long


class Contamination(Filter):
    """The question is at or above ``contamination_threshold`` similarity to a benchmark one;
    each distinct question of the rows still kept is scored once."""

    name = "contamination"

    def rejects(self, run: FilterRun) -> np.ndarray:
        cfg = run.cfg
        assert run.max_similarity is not None  # the filter is on only with it
        alive = run.alive
        questions = pc.fill_null(run.table.column("question"), "")
        idx = np.flatnonzero(alive)
        codes = pc.dictionary_encode(questions.filter(pa.array(alive)).combine_chunks())
        distinct = codes.dictionary.to_pylist()
        sims = np.asarray(run.max_similarity(distinct) if distinct else [], dtype=np.float64)
        if sims.shape != (len(distinct),):
            raise ConfigError(
                f"max_similarity returned {sims.shape[0] if sims.ndim else 0} values for "
                f"{len(distinct)} questions"
            )
        row_sims = sims[np.asarray(codes.indices, dtype=np.int64)] if len(idx) else sims
        hit = np.zeros(run.n, dtype=bool)
        hit[idx] = row_sims >= cfg.contamination_threshold
        from kgsynth.datasets.contamination import contamination_report

        report = contamination_report(sims)
        report["threshold"] = cfg.contamination_threshold
        report["rows_checked"] = len(idx)
        run.reports["contamination"] = report
        return hit


class _GroupFilter(Filter):
    """A filter over groups of rows; it reads the phase's ``group keys`` frame."""

    def reads_shared(self, cfg: FilterConfig) -> bool:
        return True

    @staticmethod
    def kept_keys(run: FilterRun, alive: np.ndarray | None = None) -> pl.DataFrame:
        """The ``group keys`` rows still kept (``alive``, by default ``run.alive``)."""
        keys: pl.DataFrame = run.shared["group keys"]
        return keys.filter(pl.Series(run.alive if alive is None else alive))


class DuplicateActions(_GroupFilter):
    """A repeat of an earlier kept row's question and tool-call sequence (whitespace runs
    collapsed, ends stripped)."""

    name = "duplicate_actions"

    def rejects(self, run: FilterRun) -> np.ndarray:
        kept = self.kept_keys(run)
        calls = pl.col("tool_calls").list.eval(
            pl.element().str.replace_all(_WS_RUN, " ").str.strip_chars(" ")
        )
        first = kept.select(
            pl.col("_row"),
            pl.struct(pl.col("question_id"), calls).is_first_distinct().alias("_first"),
        )
        dup = np.zeros(run.n, dtype=bool)
        dup[first.filter(~pl.col("_first"))["_row"].to_numpy()] = True
        return dup


class OverQuestionCap(_GroupFilter):
    """Rows of a question beyond its first ``max_per_question`` still kept."""

    name = "over_question_cap"

    def rejects(self, run: FilterRun) -> np.ndarray:
        assert run.cfg.max_per_question is not None
        kept = self.kept_keys(run)
        rank = kept.select(pl.int_range(pl.len()).over("question_id"))[:, 0].to_numpy()
        over = np.zeros(run.n, dtype=bool)
        over[kept["_row"].to_numpy()[rank >= run.cfg.max_per_question]] = True
        return over


class Balance(_GroupFilter):
    """``max_per_structure``, then ``balance``: each caps its groups, the second over the rows
    the first kept; the caps go to ``run.reports["balance"]``."""

    name = "balance"

    def rejects(self, run: FilterRun) -> np.ndarray:
        cfg = run.cfg
        info: dict[str, Any] = {}
        steps: list[tuple[str, int | None]] = []
        if cfg.max_per_structure is not None:
            steps.append(("structure", cfg.max_per_structure))
            info["max_per_structure"] = cfg.max_per_structure
        if cfg.balance != "none":
            steps.append((cfg.balance, None))
        alive = run.alive
        rejected = np.zeros(run.n, dtype=bool)
        for by, cap in steps:
            kept = self.kept_keys(run, alive).with_columns(
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
                    groups_before={group_key(k): int(v) for k, v in groups},
                )
            # each question's 1st kept row, then its 2nd, ...: a capped group keeps many questions
            rank = _rank_within(kept, by, ["_qrank", "_row"]).to_numpy()
            over = np.zeros(run.n, dtype=bool)
            over[kept["_row"].to_numpy()[rank >= cap]] = True
            rejected |= over
            alive &= ~over
        run.reports["balance"] = info
        return rejected


def _messages(run: FilterRun) -> tuple[pa.ChunkedArray, np.ndarray, np.ndarray]:
    """Every message's content, its row and whether it is an assistant's."""
    return _message_parts(run.table)


def _group_keys(run: FilterRun) -> pl.DataFrame:
    """The columns the group filters group and order by, with each row's index (``_row``)."""
    keys = pl.from_arrow(
        run.table.select(["question_id", "structure", "hops", "tool_calls"])
    ).with_row_index("_row")
    assert isinstance(keys, pl.DataFrame)
    return keys


PHASES = (
    Phase((NoAnswer(), WrongAnswer(), UngroundedAnswer())),
    Phase((BadFormat(), ReferenceLeak(), TooLong()), shared="messages", build=_messages),
    Phase((Contamination(),)),
    Phase(
        (DuplicateActions(), OverQuestionCap(), Balance()), shared="group keys", build=_group_keys
    ),
)
"""The filters in their order: those of single rows, then those over groups of rows (whose
slots go only to rows every row filter kept)."""


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
    run = FilterRun(
        table, cfg, np.zeros(n, dtype=np.int8), max_similarity=max_similarity, progress=progress
    )
    enabled = cfg.enabled(contamination=max_similarity is not None)
    with run.step("answers"):
        run.answers = answer_checks(table, grounding=cfg.grounding)
        run.details["distinct_answer_strings"] = run.answers.distinct_strings
    for phase in PHASES:
        phase.run(run, enabled)

    with run.step("outputs"):
        accepted, rejected = split_rows(run)
        stats = run_stats(run, enabled)
    assert accepted.num_rows + rejected.num_rows == n, "every input row is accepted or rejected"
    balance_info = run.reports.get("balance")
    if cfg.upsample_factor > 1.0 and accepted.num_rows:
        with run.step("upsample"):
            accepted, upsampled = upsample(accepted, cfg)
        balance_info = {**(balance_info or {}), "upsample": upsampled}
        stats["upsampled_rows"] = upsampled["rows"]
    stats.update(run.details)
    stats["contamination"] = run.reports.get("contamination")
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
