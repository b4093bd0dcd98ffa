"""The row checks behind the filters, a column at a time: answers against gold and against what
the environment returned, the format of every assistant turn, and reference-hint leaks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from kgsynth.agent.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    MAX_OPERATIONS,
    NODE_CLOSE,
    NODE_OPEN,
    QUERY_CLOSE,
    QUERY_OPEN,
    SPARQL_CLOSE,
    SPARQL_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
)
from kgsynth.agent.spaces.registry import names, space
from kgsynth.filter.columns import _counts, _flat, _match, _parallel, _pieces
from kgsynth.metrics import normalize_answer

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
_THINK = rf"^[^<]*{THINK_OPEN}[^<]*{THINK_CLOSE}[^<]*"
FAST_ANSWER_TURN = rf"{_THINK}{ANSWER_OPEN}{_ANSWER_BODY}{ANSWER_CLOSE}[^<]*$"
FAST_QUERY_TURN = rf"{_THINK}{QUERY_OPEN}[^<]*{QUERY_CLOSE}[^<]*$"
# The same for ISP-KGR's format (the isp tool set), which parse_turn(text, "isp") reads: one
# <think> block, then 1 to MAX_OPERATIONS operations, or boxes only. A node holds a name with a
# letter or digit and no '<'; a query may hold '<' (IRIs) but no '</'. Between the parts only
# text without '<' or '\' (no other tag, no box beside operations); a box holds no brace, '<' or
# '\' and at least one letter or digit, so it is never empty once stripped.
_NAME_BODY = r"[^<]*[\p{L}\p{N}][^<]*"
_QUERY_BODY = r"(?:[^<]|<[^/])*[\p{L}](?:[^<]|<[^/])*"
_OPERATION = rf"(?:{NODE_OPEN}{_NAME_BODY}{NODE_CLOSE}|{SPARQL_OPEN}{_QUERY_BODY}{SPARQL_CLOSE})"
_ISP_THINK = rf"^[^<\\]*{THINK_OPEN}[^<]*{THINK_CLOSE}[^<\\]*"
_BOX = r"\\boxed\{[^{}<\\]*[\p{L}\p{N}][^{}<\\]*\}"
FAST_ISP_STEP = rf"{_ISP_THINK}(?:{_OPERATION}[^<\\]*){{1,{MAX_OPERATIONS}}}$"
# the boxes inside <answer></answer> (ISP-KGR's Figure 8), or bare as parse_turn also reads them
FAST_ISP_ANSWER = (
    rf"{_ISP_THINK}(?:{ANSWER_OPEN}[^<\\]*(?:{_BOX}[^<\\]*)+{ANSWER_CLOSE}[^<\\]*"
    rf"|(?:{_BOX}[^<\\]*)+)$"
)


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


def turn_formats() -> tuple[object, ...]:
    """The turn formats a trajectory may be in (every turn alike): each action space's, once
    (the ``<kg-query>`` one first; isp's; the sexpr space's ``<action>`` one; a plug-in's)."""
    found: dict[type, object] = {}
    for name in names():
        turns = space(name).turns
        found.setdefault(type(turns), turns)
    return tuple(found.values())


def _slow_format_ok(texts: list[str], formats: Sequence[object]) -> bool:
    """parse_turn on every assistant message of one trajectory (in order), every turn alike in
    one of ``formats``."""
    if not texts:
        return False
    for turn_format in formats:
        turns = [turn_format.parse_turn(t) for t in texts]  # type: ignore[attr-defined]
        if all(t.format_error is None for t in turns) and turns[-1].answer is not None:
            return True
    return False


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
    has_turn = _counts(arow, n) > 0
    fast_ok = np.zeros(n, dtype=bool)
    # a trajectory is in one format, every turn: the <kg-query> one, or the isp one
    for query_re, answer_re in (
        (FAST_QUERY_TURN, FAST_ANSWER_TURN),
        (FAST_ISP_STEP, FAST_ISP_ANSWER),
    ):
        query_ok = _match(texts, query_re)
        answer_ok = _match(texts, answer_re)
        # a middle turn may be either action; the last one must be an answer
        turn_ok = np.where(is_last, answer_ok, query_ok | answer_ok)
        fast_ok |= has_turn & (_counts(arow[~turn_ok], n) == 0)
    ok[alive] = fast_ok[alive]
    slow_rows = np.flatnonzero(alive & has_turn & ~fast_ok)
    if len(slow_rows):
        sel = np.isin(arow, slow_rows)
        grouped: dict[int, list[str]] = {}
        for r, t in zip(arow[sel].tolist(), texts.filter(pa.array(sel)).to_pylist(), strict=True):
            grouped.setdefault(r, []).append(t)
        formats = turn_formats()
        for r, ts in grouped.items():
            ok[r] = _slow_format_ok(ts, formats)
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
