"""``kgsynth filter``: trajectories.parquet -> an SFT corpus of accepted trajectories.

Input: rows in :data:`kgsynth.schema.TRAJECTORY_SCHEMA` (``kgsynth synthesize trajectories``).
Output: the accepted rows and the rejected rows, each with a ``reject_reason`` (the first
filter it failed), plus counts. Every input row ends up in exactly one of the two::

    kgsynth filter --in runs/x/trajectories.parquet --out runs/x/corpus
    kgsynth filter --in t.parquet --out corpus --outcome em_strict --balance structure --benchmark qa_dev.txt

    from kgsynth.filter import FilterConfig, run_filters
    accepted, rejected, stats = run_filters(table, FilterConfig(max_per_question=2))

Filters, in this fixed order; a row that fails one is not looked at by the later ones. The
filters of single rows (1-7) come first, then those over groups of rows (8-10), so a group's
slots (the first of a repeated action sequence, the per-question cap, balancing) only go to rows
that pass every row filter; that is why length and contamination run before the duplicate and
cap filters:

1. ``no_answer`` — the predicted answer set is empty after normalization (no ``<answer>``, an
   empty list, or only blank/punctuation answers). Checked when ``outcome`` is not ``none`` or
   ``grounding`` is on.
2. ``wrong_answer`` (``outcome``, a metric of :mod:`kgsynth.metrics`) — ``em_strict``: the
   predicted set must equal the gold set; ``hit``: some predicted answer must be gold
   (KnowCoder-A1's rejection rule, "at least one answer is gold"); ``f1``: ``em_strict`` = 1 or
   F1 >= ``f1_threshold`` (0.9, KBQA-R1); ``none``: off. Plain ``em`` is refused as ambiguous.
   All are set metrics over :func:`~kgsynth.metrics.normalize_answer` keys.
3. ``ungrounded_answer`` (``grounding``) — every predicted answer, normalized, must be the
   normalized form of a name in ``observed_entities``: names the environment returned (KnowCoder-A1,
   GraphWalker). Message text is never read here, so an ``<information>`` block the model
   wrote itself cannot ground an answer.
4. ``bad_format`` (``check_format``) — every assistant message parses with
   :func:`~kgsynth.agent.protocol.parse_turn` without a ``format_error`` (a ``<think>`` block
   and exactly one action), and the last assistant message is an ``<answer>`` that parses.
   A trajectory without assistant messages fails.
5. ``reference_leak`` (``reference_leak``; rows with ``mode == "referenced"`` and a non-blank
   ``reference`` only) — the stripped reference, or any of its lines that is at least
   ``leak_min_chars`` (12) characters long once stripped, occurs in some message's content.
   The reference the synthesizer writes numbers its lines (``1. get_relations("X")``), so the
   model's own ``<kg-query>get_relations("X")</kg-query>`` is no leak, but copied hint text is.
6. ``too_long`` — the messages' contents add up to more than ``max_chars`` characters (16,000)
   or ``num_turns`` is above ``max_turns`` (off by default).
7. ``contamination`` (only when ``run_filters`` is given ``max_similarity``; the CLI builds it
   from ``--benchmark`` files with :class:`~kgsynth.contamination.ContaminationGuard`) —
   the row's ``question`` is at or above ``contamination_threshold`` (0.85) cosine similarity
   to a benchmark question. Each distinct question of the rows still kept is embedded once.
8. ``duplicate_actions`` (``dedup_actions``) — same ``question_id`` and the same ``tool_calls``
   sequence (each call with whitespace runs collapsed to one space and the ends stripped) as
   an earlier row still kept; the first one in input order stays.
9. ``over_question_cap`` (``max_per_question``, 3, KnowCoder-A1) — rows of a question beyond
   its first ``max_per_question`` still kept, in input order.
10. ``balance`` — first ``max_per_structure``: at most that many rows per ``structure``; then
    ``balance`` (``structure`` or ``hops``): every group is capped at
    ``floor(balance_factor * size of the smallest group)`` (``balance_factor`` >= 1, default
    2; 1 makes all groups as small as the smallest). A null structure/hops is a group of its
    own. Within a group the rows kept are those of questions with the fewest rows kept before
    them (each question's 1st row, then 2nd rows, ...), ties in input order, so a capped group
    keeps as many different questions as it can.

Both outputs carry the input columns (:data:`~kgsynth.schema.TRAJECTORY_SCHEMA`, extra input
columns dropped) then ``em`` and ``f1`` (float64, computed for every row); in the rejected
rows ``reject_reason`` comes between the two (:data:`ACCEPTED_SCHEMA`, :data:`REJECTED_SCHEMA`).
``stats`` holds the counts per enabled reason in filter order, acceptance by structure, hops,
mode and turns, the contamination report, the balancing caps and the seconds of each step.

Speed: the filters run as column operations (Arrow compute, polars, numpy) over the whole
table. Per-row Python is left where nothing else will do, and kept small: each distinct answer
or entity string is normalized once (:func:`~kgsynth.metrics.normalize_answer`, dictionary
cache), assistant messages are matched against two regular expressions that accept only turns
``parse_turn`` also accepts and only the rows that miss them are parsed one by one, and the
reference-leak substring checks run only on ``referenced`` rows still kept.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from kgsynth.agent.protocol import parse_turn
from kgsynth.errors import ConfigError, InputFileError
from kgsynth.metrics import check_metric_name, normalize_answer
from kgsynth.schema import (  # noqa: F401  (ACCEPTED_ and REJECTED_SCHEMA re-exported)
    ACCEPTED_SCHEMA,
    METRIC_FIELDS,
    REJECTED_SCHEMA,
    REJECTED_TRAJECTORY_SCHEMA,
    TRAJECTORY_SCHEMA,
)

log = logging.getLogger(__name__)

REASONS = (
    "no_answer",
    "wrong_answer",
    "ungrounded_answer",
    "bad_format",
    "reference_leak",
    "too_long",
    "contamination",
    "duplicate_actions",
    "over_question_cap",
    "balance",
)
"""Every ``reject_reason``, in the order the filters run."""

OUTCOMES = ("em_strict", "hit", "f1", "none")
BALANCE_BY = ("structure", "hops", "none")

MaxSimilarity = Callable[[list[str]], Sequence[float] | np.ndarray]
"""Question texts -> the maximum cosine similarity of each to a benchmark question."""

# A turn parse_turn accepts with no format_error: one <think> block, one action, and no other
# '<' anywhere (so no <information>, no second block). Matching these is sufficient, never
# necessary: a message that misses them goes through parse_turn itself. Inside <answer>, the
# stripped text is either not a list (parse_answer then keeps it as one answer) or a JSON list
# of plain strings (no escapes or control characters, JSON whitespace only), which json.loads
# accepts. The first character of a non-list answer must be one str.strip() keeps: RE2's \s is
# ASCII only, while Python also strips Unicode spaces (\p{Z}), \x1c-\x1f and \x85.
_JSON_STR = r'"[^"\\<\x00-\x1f]*"'
_JSON_WS = r"[ \t\n\r]*"
_ANSWER_BODY = (
    r"\s*(?:[^\[<\s\p{Z}\x00-\x1f\x85][^<]*"
    rf"|\[{_JSON_WS}(?:{_JSON_STR}{_JSON_WS}(?:,{_JSON_WS}{_JSON_STR}{_JSON_WS})*)?\])\s*"
)
FAST_ANSWER_TURN = rf"^[^<]*<think>[^<]*</think>[^<]*<answer>{_ANSWER_BODY}</answer>[^<]*$"
FAST_QUERY_TURN = r"^[^<]*<think>[^<]*</think>[^<]*<kg-query>[^<]*</kg-query>[^<]*$"

# Whitespace as Python's str.split() sees it (Unicode White_Space plus \x1c-\x1f).
_WS_RUN = r"[\s\x1c-\x1f]+"

_WORKERS = max(1, min(4, pa.cpu_count()))


@dataclass(frozen=True)
class FilterConfig:
    """Options of ``kgsynth filter``; each field is the flag of the same name.

    An integer limit of 0 (or None) switches that limit off.
    """

    outcome: str = "f1"
    f1_threshold: float = 0.9
    grounding: bool = True
    check_format: bool = True
    reference_leak: bool = True
    leak_min_chars: int = 12
    max_chars: int | None = 16_000
    max_turns: int | None = None
    contamination_threshold: float = 0.85
    benchmark: tuple[str, ...] = ()
    dedup_actions: bool = True
    max_per_question: int | None = 3
    max_per_structure: int | None = None
    balance: str = "none"
    balance_factor: float = 2.0

    def __post_init__(self) -> None:
        if self.outcome == "em":
            check_metric_name("em", "--outcome")
        if self.outcome not in OUTCOMES:
            raise ConfigError(
                f"--outcome must be one of {', '.join(OUTCOMES)} (got {self.outcome!r})"
            )
        if not 0.0 <= self.f1_threshold <= 1.0:
            raise ConfigError(f"--f1-threshold must be within [0, 1] (got {self.f1_threshold})")
        if self.balance not in BALANCE_BY:
            raise ConfigError(
                f"--balance must be one of {', '.join(BALANCE_BY)} (got {self.balance!r})"
            )
        if not (isinstance(self.balance_factor, int | float) and self.balance_factor >= 1.0):
            raise ConfigError(f"--balance-factor must be >= 1 (got {self.balance_factor!r})")
        if not 0.0 < self.contamination_threshold <= 1.0:
            raise ConfigError(
                f"--contamination-threshold must be within (0, 1] (got {self.contamination_threshold})"
            )
        if not isinstance(self.leak_min_chars, int) or self.leak_min_chars < 1:
            raise ConfigError(
                f"--leak-min-chars must be an integer >= 1 (got {self.leak_min_chars!r})"
            )
        for name in ("max_chars", "max_turns", "max_per_question", "max_per_structure"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be an integer >= 0, 0 for no limit (got {value!r})")
            if value == 0:
                object.__setattr__(self, name, None)
        if isinstance(self.benchmark, str | Path):
            object.__setattr__(self, "benchmark", (str(self.benchmark),))
        else:
            object.__setattr__(self, "benchmark", tuple(str(b) for b in self.benchmark or ()))

    def enabled(self, *, contamination: bool = False) -> list[str]:
        """The reasons this configuration can reject for, in filter order."""
        on = {
            "no_answer": self.outcome != "none" or self.grounding,
            "wrong_answer": self.outcome != "none",
            "ungrounded_answer": self.grounding,
            "bad_format": self.check_format,
            "reference_leak": self.reference_leak,
            "too_long": self.max_chars is not None or self.max_turns is not None,
            "contamination": contamination,
            "duplicate_actions": self.dedup_actions,
            "over_question_cap": self.max_per_question is not None,
            "balance": self.max_per_structure is not None or self.balance != "none",
        }
        return [r for r in REASONS if on[r]]


# --- input ---------------------------------------------------------------------------------


def missing_columns(names: Sequence[str]) -> list[str]:
    """The :data:`TRAJECTORY_SCHEMA` columns not among ``names``, in schema order."""
    have = set(names)
    return [f.name for f in TRAJECTORY_SCHEMA if f.name not in have]


def as_trajectory_table(data: Any, source: str = "input rows") -> pa.Table:
    """``data`` (an Arrow table, a polars DataFrame or a sequence of row dicts) as a table in
    :data:`TRAJECTORY_SCHEMA`; extra columns are dropped.

    Raises :class:`InputFileError` naming ``source`` and the missing or mistyped column(s).
    """
    if isinstance(data, pl.DataFrame):
        data = data.to_arrow()
    if not isinstance(data, pa.Table):
        rows = list(data)
        for i, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                raise InputFileError(source, f"expected a mapping, got {type(row).__name__}", i)
            missing = missing_columns(list(row))
            if missing:
                raise InputFileError(source, f"missing column(s) {', '.join(missing)}", i)
        try:
            return pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise InputFileError(source, f"rows do not fit the trajectory schema: {exc}") from None
    missing = missing_columns(data.column_names)
    if missing:
        raise InputFileError(
            source,
            f"missing column(s) {', '.join(missing)}; found {', '.join(data.column_names)}",
        )
    table = data.select(TRAJECTORY_SCHEMA.names)
    if table.schema.equals(TRAJECTORY_SCHEMA):
        return table
    columns = []
    for f in TRAJECTORY_SCHEMA:
        col = table.column(f.name)
        try:
            columns.append(col if col.type == f.type else col.cast(f.type))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise InputFileError(
                source, f"column {f.name} is {col.type}, expected {f.type}: {exc}"
            ) from None
    return pa.Table.from_arrays(columns, schema=TRAJECTORY_SCHEMA)


# --- helpers -------------------------------------------------------------------------------


def _parallel(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]``; Arrow compute releases the GIL, so threads run it at once."""
    if len(items) <= 1 or _WORKERS == 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(_WORKERS) as pool:
        return list(pool.map(fn, items))


def _match(strings: pa.ChunkedArray, pattern: str) -> np.ndarray:
    """Regex match per string (RE2, in ``_WORKERS`` threads); null strings do not match."""
    pieces = _pieces(strings)
    if not pieces:
        return np.zeros(0, dtype=bool)
    parts = _parallel(lambda s: pc.fill_null(pc.match_substring_regex(s, pattern), False), pieces)
    return np.concatenate([np.asarray(p, dtype=bool) for p in parts])


def _flat(column: pa.ChunkedArray) -> tuple[pa.ChunkedArray, np.ndarray]:
    """A list column's values and, for each value, the index of its row."""
    values = pc.list_flatten(column)
    parents = np.asarray(pc.list_parent_indices(column), dtype=np.int64)
    return values, parents


def _counts(rows: np.ndarray, n: int, weights: np.ndarray | None = None) -> np.ndarray:
    out = np.bincount(rows, weights=weights, minlength=n)
    return out if weights is not None else out.astype(np.int64)


def _pieces(values: pa.ChunkedArray, parts: int = _WORKERS) -> list[pa.Array]:
    """``values`` as at least ``parts`` zero-copy pieces (so threads can share the work)."""
    chunks = [c for c in values.chunks if len(c)]
    if len(chunks) >= parts:
        return chunks
    out = []
    for chunk in chunks:
        step = max(1, -(-len(chunk) // parts))
        out.extend(chunk.slice(i, step) for i in range(0, len(chunk), step))
    return out


def normalized_ids(columns: Sequence[pa.ChunkedArray]) -> tuple[list[np.ndarray], int, int]:
    """For each string of each column, the id of its normalized form (0 for "" and null).

    Every distinct string is normalized once: the columns are dictionary-encoded together
    (Arrow, in threads; dictionaries unified), then only the dictionary goes through
    :func:`~kgsynth.metrics.normalize_answer`. Returns the id arrays, how many distinct
    strings there were and how many distinct normalized forms.
    """
    lengths = [len(c) for c in columns]
    pieces = _pieces(pa.chunked_array([c for col in columns for c in col.chunks], pa.string()))
    if not pieces:
        return [np.zeros(0, dtype=np.int64) for _ in columns], 0, 1
    encoded = pa.chunked_array(_parallel(pc.dictionary_encode, pieces))
    unified = pa.Table.from_arrays([encoded], ["v"]).unify_dictionaries().column("v")
    dictionary = unified.chunk(0).dictionary.to_pylist()
    by_key: dict[str, int] = {"": 0}
    mapping = np.fromiter(
        (by_key.setdefault(normalize_answer(s), len(by_key)) for s in dictionary),
        dtype=np.int64,
        count=len(dictionary),
    )
    mapping = np.append(mapping, 0)  # null strings
    null_code = len(dictionary)
    codes = np.concatenate(
        [np.asarray(pc.fill_null(c.indices, null_code), dtype=np.int64) for c in unified.chunks]
    )
    ids = mapping[codes]
    return list(np.split(ids, np.cumsum(lengths)[:-1])), len(dictionary), len(by_key)


def _distinct_keys(keys: np.ndarray, nids: np.ndarray) -> np.ndarray:
    """The distinct (row, answer) keys, blank answers dropped."""
    return np.asarray(pl.Series(keys[nids != 0]).unique().to_numpy())


@dataclass
class _AnswerChecks:
    em_strict: np.ndarray
    hit: np.ndarray
    f1: np.ndarray
    has_answer: np.ndarray
    grounded: np.ndarray | None
    distinct_strings: int = 0


def answer_checks(table: pa.Table, *, grounding: bool = True) -> _AnswerChecks:
    """em_strict, hit, F1, "has an answer" and "every answer observed" for every row, as arrays.

    Equal to :func:`kgsynth.metrics.em_strict` / :func:`~kgsynth.metrics.hit` /
    :func:`~kgsynth.metrics.f1` row by row (same normalization, same float operations).
    """
    n = table.num_rows
    names = ["predicted_answers", "gold_answers"] + (["observed_entities"] if grounding else [])
    flat = [_flat(table.column(name)) for name in names]
    ids, distinct, keys = normalized_ids([values for values, _ in flat])
    # one int64 key per (row, normalized answer): set operations become joins on one column
    if n * keys >= 2**62:
        raise ValueError(f"too many rows x distinct answers to key ({n} x {keys})")
    pair_keys = [rows * keys + nid for (_, rows), nid in zip(flat, ids, strict=True)]
    pred = _distinct_keys(pair_keys[0], ids[0])
    gold = _distinct_keys(pair_keys[1], ids[1])
    n_pred = _counts(pred // keys, n)
    n_gold = _counts(gold // keys, n)
    hit = pl.DataFrame({"k": pred}).join(pl.DataFrame({"k": gold}), on="k", how="semi")
    hits = _counts(hit["k"].to_numpy() // keys, n)
    em = ((n_gold > 0) & (n_pred == n_gold) & (hits == n_gold)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n_pred > 0, hits / np.maximum(n_pred, 1), 0.0)
        r = np.where(n_gold > 0, hits / np.maximum(n_gold, 1), 0.0)
        # the same operations as metrics.f_beta with beta = 1: (1 + 1) * p * r / (1 * p + r)
        f1 = np.where(hits > 0, 2.0 * p * r / (p + r), 0.0)
    grounded = None
    if grounding:
        observed = pl.DataFrame({"k": pair_keys[2]})
        unseen = pl.DataFrame({"k": pred}).join(observed, on="k", how="anti")["k"].to_numpy()
        grounded = _counts(unseen // keys, n) == 0
    return _AnswerChecks(em, (hits > 0).astype(np.float64), f1, n_pred > 0, grounded, distinct)


def _message_parts(table: pa.Table) -> tuple[pa.ChunkedArray, np.ndarray, np.ndarray]:
    """Every message's content (nulls as ""), its row, and whether it is an assistant's."""
    flat, rows = _flat(table.column("messages"))
    content = pc.fill_null(pc.struct_field(flat, "content"), "")
    assistant = np.asarray(
        pc.fill_null(pc.equal(pc.struct_field(flat, "role"), "assistant"), False)
    )
    return content, rows, assistant


def _slow_format_ok(texts: list[str]) -> bool:
    """parse_turn on every assistant message of one trajectory (in order)."""
    if not texts:
        return False
    turns = [parse_turn(t) for t in texts]
    return all(t.format_error is None for t in turns) and turns[-1].answer is not None


def format_checks(
    content: pa.ChunkedArray, rows: np.ndarray, assistant: np.ndarray, alive: np.ndarray
) -> tuple[np.ndarray, int]:
    """Whether each row's assistant turns are well formed (rows not ``alive`` read as True),
    and how many rows needed ``parse_turn``."""
    n = len(alive)
    pick = np.flatnonzero(assistant & alive[rows])
    ok = np.ones(n, dtype=bool)
    if len(pick) == 0:
        ok[alive] = False  # a trajectory with no assistant turn
        return ok, 0
    arow = rows[pick]
    texts = content.filter(pa.array(assistant & alive[rows]))
    is_last = np.append(arow[1:] != arow[:-1], True)
    query_ok = _match(texts, FAST_QUERY_TURN)
    answer_ok = _match(texts, FAST_ANSWER_TURN)
    # a middle turn may be either action; the last one must be an answer
    turn_ok = np.where(is_last, answer_ok, query_ok | answer_ok)
    bad_turns = _counts(arow[~turn_ok], n)
    has_turn = _counts(arow, n) > 0
    fast_ok = has_turn & (bad_turns == 0)
    ok[alive] = fast_ok[alive]
    slow_rows = np.flatnonzero(alive & has_turn & ~fast_ok)
    if len(slow_rows):
        sel = np.isin(arow, slow_rows)
        grouped: dict[int, list[str]] = {}
        for r, t in zip(arow[sel].tolist(), texts.filter(pa.array(sel)).to_pylist(), strict=True):
            grouped.setdefault(r, []).append(t)
        for r, ts in grouped.items():
            ok[r] = _slow_format_ok(ts)
    return ok, len(slow_rows)


def _contents_per_row(messages: pa.ChunkedArray) -> pa.ChunkedArray:
    """``list<string>`` of each row's message contents (nulls as ""), without copying them."""
    chunks = []
    for chunk in messages.chunks:
        content = pc.fill_null(pc.struct_field(chunk.values, "content"), "")
        # a null list keeps its (empty) offsets range: it reads as no messages
        chunks.append(pa.ListArray.from_arrays(chunk.offsets, content))
    return pa.chunked_array(chunks, pa.list_(pa.string()))


def _leak_needles(reference: str, min_chars: int) -> tuple[str, ...]:
    lines = (line.strip() for line in reference.splitlines())
    needles = [reference.strip(), *(s for s in lines if len(s) >= min_chars)]
    return tuple(dict.fromkeys(s for s in needles if s))  # "" would be in every text


def leak_checks(table: pa.Table, alive: np.ndarray, min_chars: int) -> tuple[np.ndarray, int]:
    """True where a referenced row's hint text occurs in a message (only ``alive`` rows are
    checked), and how many rows were checked."""
    n = table.num_rows
    leaked = np.zeros(n, dtype=bool)
    referenced = np.asarray(pc.fill_null(pc.equal(table.column("mode"), "referenced"), False))
    reference = pc.fill_null(table.column("reference"), "")
    has_ref = np.asarray(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(reference)), 0))
    pick = alive & referenced & has_ref
    idx = np.flatnonzero(pick)
    if len(idx) == 0:
        return leaked, 0
    mask = pa.array(pick)
    per_row = _contents_per_row(table.column("messages")).filter(mask)
    # "\x00" separates messages, so a needle without "\x00" can only match inside one message
    joined = pc.fill_null(pc.binary_join(per_row, "\x00"), "").to_pylist()
    needles_of: dict[str, tuple[str, ...]] = {}
    for i, (text, ref) in enumerate(zip(joined, reference.filter(mask).to_pylist(), strict=True)):
        needles = needles_of.get(ref)
        if needles is None:
            needles = needles_of[ref] = _leak_needles(ref, min_chars)
        for needle in needles:
            if "\x00" in needle:
                hit = any(needle in c for c in per_row[i].as_py())
            else:
                hit = needle in text
            if hit:
                leaked[idx[i]] = True
                break
    return leaked, len(idx)


def _rank_within(frame: pl.DataFrame, by: str, order: list[str]) -> pl.Series:
    """0-based position of each row within its ``by`` group, ordered by ``order``; in the
    frame's row order."""
    return (
        frame.with_row_index("_pos")
        .sort(order, maintain_order=True)
        .with_columns(pl.int_range(pl.len()).over(by).alias("_rank"))
        .sort("_pos")["_rank"]
    )


# --- the stage -----------------------------------------------------------------------------


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


def _filter_rows(table: pa.Table, mask: np.ndarray) -> pa.Table:
    """``table.filter(mask)``, batch by batch in threads (the copy is most of the cost)."""
    batches = table.to_batches(max_chunksize=1 << 16)
    bounds = np.cumsum([0, *(b.num_rows for b in batches)])

    def one(i: int) -> pa.RecordBatch:
        return batches[i].filter(pa.array(mask[bounds[i] : bounds[i + 1]]))

    return pa.Table.from_batches(_parallel(one, range(len(batches))), schema=table.schema)


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


# --- figure --------------------------------------------------------------------------------


def filter_stats_png(stats: dict[str, Any], path: str | Path) -> None:
    """Rejects by reason, and acceptance by structure, hops and turns, from ``stats``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    labels = ["accepted", *stats["rejects"]]
    values = [stats["accepted"], *stats["rejects"].values()]
    colors = ["#228833"] + ["#cc6677"] * len(stats["rejects"])
    ax.barh(labels[::-1], values[::-1], color=colors[::-1])
    ax.set_title(f"{stats['rows_in']:,} trajectories: accepted and rejects by reason (in order)")
    ax.tick_params(axis="y", labelsize=8)
    for ax, col, title in (
        (axes[0][1], "structure", "structure"),
        (axes[1][0], "hops", "hops"),
        (axes[1][1], "num_turns", "assistant turns"),
    ):
        groups = stats["acceptance"][col]
        names = list(groups)
        kept = [groups[k]["accepted"] for k in names]
        dropped = [groups[k]["rows"] - groups[k]["accepted"] for k in names]
        ax.bar(names, kept, color="#228833", label="accepted")
        ax.bar(names, dropped, bottom=kept, color="#cc6677", label="rejected")
        for x, name in enumerate(names):
            ax.annotate(
                f"{groups[name]['rate']:.0%}",
                (x, groups[name]["rows"]),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.set_title(f"by {title} (share accepted on top)")
        ax.legend(fontsize=8)
        if len(names) > 8:
            ax.tick_params(axis="x", labelsize=7, rotation=90)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


__all__ = [
    "ACCEPTED_SCHEMA",
    "REASONS",
    "REJECTED_SCHEMA",
    "FilterConfig",
    "answer_checks",
    "as_trajectory_table",
    "filter_stats_png",
    "format_checks",
    "leak_checks",
    "missing_columns",
    "run_filters",
]
