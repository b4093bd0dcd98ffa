"""``kgsynth filter``: one hand-made trajectory per reject reason, the metric edges, the
fast format check against parse_turn, and the CLI on a small Parquet file."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.agent.spaces import parse_turn
from kgsynth.agent.spaces.registry import names
from kgsynth.cli import app
from kgsynth.core.errors import ConfigError, InputFileError
from kgsynth.core.schema import TRAJECTORY_SCHEMA
from kgsynth.filter import (
    ACCEPTED_SCHEMA,
    FAST_ANSWER_TURN,
    FAST_QUERY_TURN,
    REASONS,
    REJECTED_SCHEMA,
    FilterConfig,
    answer_checks,
    as_trajectory_table,
    format_checks,
    run_filters,
)
from kgsynth.metrics import em_strict, f1, hit

SYSTEM = {"role": "system", "content": "You answer questions with tools."}
CALL_1 = 'get_relations("Kismet")'
CALL_2 = 'get_triples("Kismet", ["directed_by"])'
REFERENCE = f"1. {CALL_1}\n2. {CALL_2}"


def query_turn(call: str, think: str = "I look at Kismet first.") -> dict[str, str]:
    return {"role": "assistant", "content": f"<think>{think}</think>\n<kg-query>{call}</kg-query>"}


def answer_turn(answers: list[str], think: str = "The facts answer it.") -> dict[str, str]:
    return {
        "role": "assistant",
        "content": f"<think>{think}</think>\n<answer>{json.dumps(answers)}</answer>",
    }


def observation(text: str) -> dict[str, str]:
    return {"role": "tool", "content": f"<information>{text}</information>"}


def traj(tid: str, **over: Any) -> dict[str, Any]:
    """A trajectory that passes every filter; ``over`` replaces fields."""
    answers = over.pop("answers", ["William Dieterle"])
    row: dict[str, Any] = {
        "trajectory_id": tid,
        "question_id": "q1",
        "walk_id": "w1",
        "mode": "oracle",
        "sample": 0,
        "question": "Who directed Kismet?",
        "topic_names": ["Kismet"],
        "structure": "chain-1",
        "hops": 1,
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Question: Who directed Kismet?\nTopic entities: Kismet"},
            query_turn(CALL_2),
            observation("(Kismet, directed_by, William Dieterle)"),
            answer_turn(answers),
        ],
        "predicted_answers": answers,
        "gold_answers": ["William Dieterle"],
        "answered": True,
        "forced_answer": False,
        "num_turns": 2,
        "tool_errors": 0,
        "format_errors": 0,
        "tool_calls": [CALL_2],
        "turns": [],
        "observed_entities": ["Kismet", "William Dieterle"],
        "reference": "",
        "generator": {"backend": "template", "model": "t", "prompt_hash": "h"},
    }
    row.update(over)
    return row


def reasons_of(rows: list[dict[str, Any]], cfg: FilterConfig | None = None, **kw: Any):
    accepted, rejected, stats = run_filters(rows, cfg or FilterConfig(), **kw)
    assert accepted.num_rows + rejected.num_rows == len(rows)
    out = {r["trajectory_id"]: None for r in accepted.to_pylist()}
    out.update({r["trajectory_id"]: r["reject_reason"] for r in rejected.to_pylist()})
    return out, accepted, rejected, stats


# --- one row per reason --------------------------------------------------------------------


def test_every_reason_on_its_own_row():
    long_think = "x" * 16_001
    rows = [
        traj("ok"),
        traj("no_answer", question_id="q2", answers=[]),
        traj("blank_answer", question_id="q3", answers=[" . "]),
        traj("wrong", question_id="q4", answers=["Kismet"]),
        traj("ungrounded", question_id="q5", observed_entities=["Kismet"]),
        traj(
            "format",
            question_id="q6",
            messages=[
                SYSTEM,
                {"role": "assistant", "content": f"<kg-query>{CALL_2}</kg-query>"},  # no think
                observation("(Kismet, directed_by, William Dieterle)"),
                answer_turn(["William Dieterle"]),
            ],
        ),
        traj(
            "leak",
            question_id="q7",
            mode="referenced",
            reference=REFERENCE,
            messages=[
                SYSTEM,
                query_turn(CALL_2, think=f"The hint says {CALL_1.join(['1. ', ''])}, so I go."),
                observation("(Kismet, directed_by, William Dieterle)"),
                answer_turn(["William Dieterle"]),
            ],
        ),
        traj(
            "long",
            question_id="q8",
            messages=[SYSTEM, answer_turn(["William Dieterle"], think=long_think)],
        ),
        traj("contaminated", question_id="q9", question="Who was the director of Kismet?"),
        traj("first", question_id="q10"),
        traj("dup", question_id="q10", tool_calls=[CALL_2.replace(", ", ",  ") + "\n"]),
        traj("cap1", question_id="q11", tool_calls=["a()"]),
        traj("cap2", question_id="q11", tool_calls=["b()"]),
        traj("cap3", question_id="q11", tool_calls=["c()"]),
        traj("cap4", question_id="q11", tool_calls=["d()"]),
        traj("2I_a", question_id="q12", structure="2I", hops=2),
        traj("2I_b", question_id="q13", structure="2I", hops=2),
    ]
    sims = {"Who was the director of Kismet?": 0.91}
    got, accepted, rejected, stats = reasons_of(
        rows,
        FilterConfig(max_per_structure=100, balance="none"),
        max_similarity=lambda qs: [sims.get(q, 0.2) for q in qs],
    )
    assert got == {
        "ok": None,
        "no_answer": "no_answer",
        "blank_answer": "no_answer",
        "wrong": "wrong_answer",
        "ungrounded": "ungrounded_answer",
        "format": "bad_format",
        "leak": "reference_leak",
        "long": "too_long",
        "contaminated": "contamination",
        "first": None,
        "dup": "duplicate_actions",
        "cap1": None,
        "cap2": None,
        "cap3": None,
        "cap4": "over_question_cap",
        "2I_a": None,
        "2I_b": None,
    }
    assert list(stats["rejects"]) == [r for r in REASONS if r != "balance"] + ["balance"]
    assert stats["rejects"]["no_answer"] == 2 and stats["rejects"]["balance"] == 0
    assert sum(stats["rejects"].values()) == rejected.num_rows == stats["rejected"]
    assert accepted.schema.equals(ACCEPTED_SCHEMA) and rejected.schema.equals(REJECTED_SCHEMA)
    assert stats["contamination"]["checked"] == 2  # distinct questions still kept by then
    # max_per_structure: chain-1 has 6 rows still kept by then (ok, contaminated, first,
    # cap1-3: no max_similarity this time), 2I has 2
    got, _, _, stats = reasons_of(rows, FilterConfig(max_per_structure=2))
    assert stats["rejects"]["balance"] == 4
    assert [t for t, r in got.items() if r is None] == ["ok", "contaminated", "2I_a", "2I_b"]


def test_first_failing_reason_wins_and_counts_add_up():
    row = traj(
        "many",
        answers=["Nobody"],  # wrong, ungrounded
        observed_entities=[],
        messages=[SYSTEM, {"role": "assistant", "content": "no tags at all"}],
    )
    got, *_ = reasons_of([row])
    assert got == {"many": "wrong_answer"}
    got, *_ = reasons_of([row], FilterConfig(outcome="none"))
    assert got == {"many": "ungrounded_answer"}
    got, *_ = reasons_of([row], FilterConfig(outcome="none", grounding=False))
    assert got == {"many": "bad_format"}
    got, *_ = reasons_of([row], FilterConfig(outcome="none", grounding=False, check_format=False))
    assert got == {"many": None}


def test_no_answer_only_when_an_answer_filter_is_on():
    row = traj("x", answers=[])
    assert reasons_of([row])[0] == {"x": "no_answer"}
    off = FilterConfig(outcome="none", grounding=False)
    assert reasons_of([row], off)[0] == {"x": None}  # `<answer>[]</answer>` still parses


# --- outcome -------------------------------------------------------------------------------


def test_f1_threshold_edges():
    gold = ["A", "B", "C"]
    partial = traj("p", answers=["A", "B"], gold_answers=gold, observed_entities=gold)
    exact_f1 = f1(["A", "B"], gold)  # 0.8
    assert reasons_of([partial], FilterConfig(f1_threshold=exact_f1))[0] == {"p": None}
    above = FilterConfig(f1_threshold=np.nextafter(exact_f1, 1.0))
    assert reasons_of([partial], above)[0] == {"p": "wrong_answer"}
    assert reasons_of([partial])[0] == {"p": "wrong_answer"}  # default 0.9
    assert reasons_of([partial], FilterConfig(outcome="em_strict"))[0] == {"p": "wrong_answer"}
    # KnowCoder-A1's rule: one gold answer among the predicted ones is enough
    assert reasons_of([partial], FilterConfig(outcome="hit"))[0] == {"p": None}
    miss = traj("m", answers=["Z"], gold_answers=gold, observed_entities=["Z"])
    assert reasons_of([miss], FilterConfig(outcome="hit"))[0] == {"m": "wrong_answer"}
    with pytest.raises(ConfigError, match="ambiguous"):
        FilterConfig(outcome="em")
    assert reasons_of([partial], FilterConfig(outcome="none"))[0] == {"p": None}
    # EM after normalization: case, articles, punctuation, duplicates
    same = traj(
        "s",
        answers=["the matrix", "MATRIX", "Washington, D.C."],
        gold_answers=["The Matrix", "Washington D.C."],
        observed_entities=["The Matrix", "Washington D.C"],
    )
    got, accepted, _, _ = reasons_of([same], FilterConfig(outcome="em_strict", f1_threshold=1.0))
    assert got == {"s": None}
    for name in ("em_strict", "hit", "f1"):
        assert accepted.column(name).to_pylist() == [1.0]
    # a threshold of 0 still needs an answer that overlaps... no: F1 >= 0 always holds
    wrong = traj("w", answers=["Kismet"])
    assert reasons_of([wrong], FilterConfig(f1_threshold=0.0))[0] == {"w": None}


def test_vectorized_metrics_equal_kgsynth_metrics():
    rng = random.Random(7)
    pool = [
        "The Matrix",
        "matrix",
        "A",
        "a",
        "Ａ",
        "Washington, D.C.",
        "washington d c",
        "",
        " ",
        ".",
    ]
    rows = []
    for i in range(400):
        pred = [rng.choice(pool) for _ in range(rng.randint(0, 4))]
        gold = [rng.choice(pool) for _ in range(rng.randint(0, 3))]
        rows.append(traj(f"t{i}", answers=pred, gold_answers=gold, observed_entities=pool[:3]))
    table = as_trajectory_table(rows)
    checks = answer_checks(table)
    for i, row in enumerate(rows):
        assert checks.em_strict[i] == em_strict(row["predicted_answers"], row["gold_answers"]), row
        assert checks.hit[i] == hit(row["predicted_answers"], row["gold_answers"]), row
        assert checks.f1[i] == f1(row["predicted_answers"], row["gold_answers"]), row


# --- grounding -----------------------------------------------------------------------------


def test_a_fabricated_information_block_cannot_ground_an_answer():
    fake = traj(
        "fake",
        answers=["Orson Welles"],
        gold_answers=["Orson Welles"],
        observed_entities=["Kismet", "William Dieterle"],
        messages=[
            SYSTEM,
            query_turn(CALL_2),
            observation("(Kismet, directed_by, William Dieterle)"),
            {
                "role": "assistant",
                "content": "<think>I recall it.</think><information>(Kismet, directed_by, "
                'Orson Welles)</information>\n<answer>["Orson Welles"]</answer>',
            },
        ],
    )
    # the turn itself is well formed (parse_turn drops the model's <information>)
    assert parse_turn(fake["messages"][-1]["content"]).format_error is None
    assert reasons_of([fake])[0] == {"fake": "ungrounded_answer"}
    assert reasons_of([fake], FilterConfig(grounding=False))[0] == {"fake": None}
    # grounding compares normalized names
    spelled = traj("n", observed_entities=["william dieterle."])
    assert reasons_of([spelled])[0] == {"n": None}


def test_every_answer_must_be_observed():
    two = traj(
        "two",
        answers=["William Dieterle", "Bette Davis"],
        gold_answers=["William Dieterle", "Bette Davis"],
        observed_entities=["William Dieterle"],
    )
    assert reasons_of([two])[0] == {"two": "ungrounded_answer"}


# --- format --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last", "ok"),
    [
        ('<think>t</think><answer>["A"]</answer>', True),
        ("<think>t</think><answer>A, B</answer>", True),
        ("<think>t</think><answer>[</answer>", False),  # not a list
        ("<think>t</think><answer></answer>", False),
        ("<think>t</think><kg-query>x()</kg-query>", False),  # last turn is not an answer
        ('<answer>["A"]</answer>', False),  # no think
        ('<think>t</think><answer>["A"]</answer><kg-query>x()</kg-query>', False),
        ("<think>a < b</think><answer>['A', \"B\"]</answer>", True),  # slow path, still fine
    ],
)
def test_format(last, ok):
    row = traj("f", messages=[SYSTEM, query_turn(CALL_2), {"role": "assistant", "content": last}])
    cfg = FilterConfig(outcome="none", grounding=False)
    assert reasons_of([row], cfg)[0] == {"f": None if ok else "bad_format"}


def test_a_trajectory_without_assistant_turns_is_bad_format():
    row = traj("empty", messages=[SYSTEM])
    assert reasons_of([row], FilterConfig(outcome="none", grounding=False))[0] == {
        "empty": "bad_format"
    }


def _turn_texts(rng: random.Random, n: int) -> list[str]:
    parts = [
        "<think>",
        "</think>",
        "<kg-query>",
        "</kg-query>",
        "<answer>",
        "</answer>",
        "<information>",
        "</information>",
        '["A", "B"]',
        "['A']",
        "[",
        "]",
        '"',
        "\\",
        "x",
        " ",
        "\n",
        "\x1c",
        "\u00a0",
        "\u2003",
        "\x85",
        "\f",
        ",",
        "<",
        "null",
        "[]",
    ]
    texts = []
    for _ in range(n):
        texts.append("".join(rng.choice(parts) for _ in range(rng.randint(0, 12))))
        body = rng.choice(
            ['["A"]', '[ "A" ,"B"]', "A", '["a\\"b"]', "[\f]", '["\x01"]', "\x1c[", "[\u3000]"]
            + [f"{space}[" for space in "\x0b\x1f\x85\xa0\u1680\u2003\u2028\u2029\u202f\u3000"]
        )
        texts.append(f"<think>t</think>{rng.choice(['', ' '])}<answer>{body}</answer>")
    return texts


def test_fast_format_regexes_accept_only_what_parse_turn_accepts():
    texts = _turn_texts(random.Random(3), 3000)
    arr = pa.chunked_array([pa.array(texts)])
    query_ok = pc.match_substring_regex(arr, FAST_QUERY_TURN).to_pylist()
    answer_ok = pc.match_substring_regex(arr, FAST_ANSWER_TURN).to_pylist()
    matched = 0
    for text, q, a in zip(texts, query_ok, answer_ok, strict=True):
        turn = parse_turn(text)
        if q:
            assert turn.format_error is None and turn.query is not None, repr(text)
        if a:
            assert turn.format_error is None and turn.answer is not None, repr(text)
        matched += q or a
    assert matched > 300  # the fast path is taken for ordinary turns


def test_format_checks_equal_parse_turn_row_by_row():
    rng = random.Random(5)
    texts = _turn_texts(rng, 300)
    rows = []
    for i in range(300):
        turns = [rng.choice(texts) for _ in range(rng.randint(0, 3))]
        messages = [SYSTEM] + [{"role": "assistant", "content": t} for t in turns]
        rows.append(traj(f"t{i}", messages=messages))
    table = as_trajectory_table(rows)
    flat = pc.list_flatten(table.column("messages"))
    content = pc.fill_null(pc.struct_field(flat, "content"), "")
    parents = np.asarray(pc.list_parent_indices(table.column("messages")))
    assistant = np.asarray(pc.equal(pc.struct_field(flat, "role"), "assistant"))
    ok, _ = format_checks(content, parents, assistant, np.ones(len(rows), dtype=bool))
    for i, row in enumerate(rows):
        texts = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        expected = False
        for toolset in names():  # every action space's turn format, each turn alike
            parsed = [parse_turn(t, toolset) for t in texts]
            expected |= (
                bool(parsed)
                and all(t.format_error is None for t in parsed)
                and parsed[-1].answer is not None
            )
        assert ok[i] == expected, row["messages"]


# --- reference leak ------------------------------------------------------------------------


def _referenced(tid: str, think: str, reference: str = REFERENCE, **over: Any) -> dict[str, Any]:
    return traj(
        tid,
        question_id=tid,
        mode=over.pop("mode", "referenced"),
        reference=reference,
        messages=[
            SYSTEM,
            query_turn(CALL_1, think=think),
            observation("Relations of Kismet: directed_by"),
            query_turn(CALL_2),
            observation("(Kismet, directed_by, William Dieterle)"),
            answer_turn(["William Dieterle"]),
        ],
        **over,
    )


def test_reference_leak():
    rows = [
        _referenced("line", f"Step 2 is {REFERENCE.splitlines()[1]}."),
        _referenced("own_calls", "I list the relations of Kismet."),  # calls alone: no leak
        _referenced("no_reference", f"Step: 2. {CALL_2}", reference=""),
        _referenced("blank_reference", f"Step: 2. {CALL_2}", reference="  \n "),
        _referenced("free_mode", f"Step: 2. {CALL_2}", mode="free"),
        _referenced("short_lines", "I try a() then b()", reference="1. a()\n2. b()"),
        _referenced("whole", "as told: 1. a()\n2. b() indeed", reference="1. a()\n2. b()"),
        _referenced("user_text", "fine"),
    ]
    rows[-1]["messages"] = [
        SYSTEM,
        {"role": "user", "content": f"Question: Who?\nHint:\n{REFERENCE}"},
        answer_turn(["William Dieterle"]),
    ]
    got, _, _, stats = reasons_of(rows)
    assert got == {
        "line": "reference_leak",
        "own_calls": None,
        "no_reference": None,
        "blank_reference": None,
        "free_mode": None,
        "short_lines": None,
        "whole": "reference_leak",
        "user_text": "reference_leak",  # any message counts, not only the model's
    }
    assert stats["reference_rows_checked"] == 5
    assert reasons_of(rows, FilterConfig(reference_leak=False))[0]["line"] is None
    assert reasons_of(rows, FilterConfig(leak_min_chars=42))[0]["line"] is None


# --- duplicates, cap, length, balance ------------------------------------------------------


def test_duplicate_tool_call_sequences():
    rows = [
        traj("a", tool_calls=[CALL_1, CALL_2]),
        traj("b", tool_calls=[" " + CALL_1, CALL_2.replace(" ", "\n\t ")]),  # same, spaced
        traj("c", tool_calls=[CALL_2, CALL_1]),  # other order
        traj("d", tool_calls=[CALL_1]),  # a prefix is another sequence
        traj("e", question_id="q2", tool_calls=[CALL_1, CALL_2]),  # other question
        traj("f", tool_calls=[CALL_1.replace('("', '( "'), CALL_2]),  # space added: differs
    ]
    got, *_ = reasons_of(rows, FilterConfig(max_per_question=None))
    assert got == {"a": None, "b": "duplicate_actions", "c": None, "d": None, "e": None, "f": None}
    # only kept rows count as "earlier": a rejected first row leaves the repeat in
    rows[0] = traj("a", answers=["Kismet"], tool_calls=[CALL_1, CALL_2])
    got, *_ = reasons_of(rows, FilterConfig(max_per_question=None))
    assert got["a"] == "wrong_answer" and got["b"] is None
    got, *_ = reasons_of(rows, FilterConfig(max_per_question=None, dedup_actions=False))
    assert got["b"] is None


def test_question_cap_keeps_the_first_k_still_kept():
    rows = [traj(f"r{i}", tool_calls=[f"c{i}()"]) for i in range(6)]
    rows[1] = traj("r1", answers=["Kismet"], tool_calls=["c1()"])  # rejected earlier
    got, *_ = reasons_of(rows, FilterConfig(max_per_question=2))
    assert got == {
        "r0": None,
        "r1": "wrong_answer",
        "r2": None,
        "r3": "over_question_cap",
        "r4": "over_question_cap",
        "r5": "over_question_cap",
    }
    got, *_ = reasons_of(rows, FilterConfig(max_per_question=0))  # 0: no cap
    assert list(got.values()).count(None) == 5


def test_max_length_by_chars_and_turns():
    row = traj("r")
    chars = sum(len(m["content"]) for m in row["messages"])
    assert reasons_of([row], FilterConfig(max_chars=chars))[0] == {"r": None}
    assert reasons_of([row], FilterConfig(max_chars=chars - 1))[0] == {"r": "too_long"}
    assert reasons_of([row], FilterConfig(max_turns=1))[0] == {"r": "too_long"}
    assert reasons_of([row], FilterConfig(max_turns=2, max_chars=0))[0] == {"r": None}


def test_balance_caps_groups_at_factor_times_the_smallest():
    rows = []
    for i in range(6):  # chain-1: 3 questions x 2 samples, in input order q0 q0 q1 q1 q2 q2
        rows.append(traj(f"c{i}", question_id=f"q{i // 2}", tool_calls=[f"x{i}()"]))
    rows.append(traj("i0", question_id="q9", structure="2I", hops=2))
    got, _, _, stats = reasons_of(rows, FilterConfig(balance="structure", balance_factor=3.0))
    # chain-1 capped at floor(3 * 1) = 3: the first row of each question goes first
    assert [t for t, r in got.items() if r is None] == ["c0", "c2", "c4", "i0"]
    assert got["c1"] == got["c3"] == got["c5"] == "balance"
    assert stats["balance"] == {
        "by": "structure",
        "smallest_group": 1,
        "cap": 3,
        "groups_before": {"2I": 1, "chain-1": 6},
    }
    got, *_ = reasons_of(rows, FilterConfig(balance="hops", balance_factor=1.0))
    assert [t for t, r in got.items() if r is None] == ["c0", "i0"]
    with pytest.raises(ConfigError, match="--balance-factor"):
        FilterConfig(balance="hops", balance_factor=0.5)


# --- contamination and counts --------------------------------------------------------------


def test_contamination_checks_each_distinct_question_once():
    rows = [
        traj("a", question_id="qa", question="Who directed Kismet?"),
        traj("b", question_id="qb", question="Who directed Kismet?"),
        traj("c", question_id="qc", question="Which films did Bette Davis act in?"),
        traj("d", question_id="qd", question="Rejected before", answers=["Kismet"]),
    ]
    seen: list[list[str]] = []

    def sims(texts: list[str]) -> list[float]:
        seen.append(list(texts))
        return [0.85 if "Kismet" in t else 0.84 for t in texts]

    got, _, _, stats = reasons_of(rows, max_similarity=sims)
    assert got == {"a": "contamination", "b": "contamination", "c": None, "d": "wrong_answer"}
    assert sorted(seen[0]) == ["Which films did Bette Davis act in?", "Who directed Kismet?"]
    assert stats["contamination"]["rows_checked"] == 3
    assert (
        reasons_of(rows, FilterConfig(contamination_threshold=0.9), max_similarity=sims)[0]["a"]
        is None
    )


def test_counts_add_up_on_a_random_mix():
    rng = random.Random(11)
    rows = []
    for i in range(300):
        rows.append(
            traj(
                f"t{i}",
                question_id=f"q{rng.randrange(40)}",
                answers=rng.choice([["William Dieterle"], [], ["Kismet"], ["Nobody"]]),
                tool_calls=[rng.choice([CALL_1, CALL_2])],
                structure=rng.choice(["chain-1", "2I", None]),
                hops=rng.choice([1, 2, None]),
                mode=rng.choice(["oracle", "free", "referenced"]),
                reference=rng.choice(["", REFERENCE]),
            )
        )
    accepted, rejected, stats = run_filters(rows, FilterConfig(balance="hops"))
    assert accepted.num_rows + rejected.num_rows == 300 == stats["rows_in"]
    assert sum(stats["rejects"].values()) == rejected.num_rows
    ids = (
        accepted.column("trajectory_id").to_pylist() + rejected.column("trajectory_id").to_pylist()
    )
    assert sorted(ids) == sorted(r["trajectory_id"] for r in rows)
    assert set(rejected.column("reject_reason").to_pylist()) <= set(REASONS)
    by_mode = stats["acceptance"]["mode"]
    assert sum(v["rows"] for v in by_mode.values()) == 300
    assert sum(v["accepted"] for v in by_mode.values()) == accepted.num_rows
    assert "null" in stats["acceptance"]["structure"]


def test_empty_input_and_bad_rows():
    accepted, rejected, stats = run_filters([], FilterConfig())
    assert accepted.num_rows == rejected.num_rows == 0 and stats["rows_in"] == 0
    empty = pa.Table.from_pylist([], schema=TRAJECTORY_SCHEMA)
    accepted, rejected, stats = run_filters(empty, FilterConfig(balance="structure"))
    assert accepted.num_rows == rejected.num_rows == 0
    bad = traj("x")
    del bad["observed_entities"]
    with pytest.raises(
        InputFileError, match=r"input rows:1: missing column\(s\) observed_entities"
    ):
        run_filters([bad], FilterConfig())
    with pytest.raises(InputFileError, match="missing column"):
        run_filters(pa.table({"trajectory_id": ["x"]}), FilterConfig())
    with pytest.raises(ConfigError, match="--outcome"):
        FilterConfig(outcome="bleu")


# --- CLI -----------------------------------------------------------------------------------


def test_cli_end_to_end(tmp_path):
    rows = [
        traj("ok"),
        traj("wrong", question_id="q2", answers=["Kismet"]),
        traj("dup", tool_calls=[CALL_2]),
        traj("ok2", question_id="q3", structure="2I", hops=2),
    ]
    src = tmp_path / "trajectories.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), src)
    out = tmp_path / "corpus"
    res = CliRunner().invoke(app, ["filter", "--in", str(src), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 of 4 trajectories accepted" in res.output
    for name in ("accepted.parquet", "rejected.parquet", "manifest.json", "filter_stats.png"):
        assert (out / name).is_file(), name
    assert (out / "filter_stats.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    accepted = pq.read_table(out / "accepted.parquet")
    rejected = pq.read_table(out / "rejected.parquet")
    assert accepted.schema.equals(ACCEPTED_SCHEMA) and rejected.schema.equals(REJECTED_SCHEMA)
    assert accepted.column("trajectory_id").to_pylist() == ["ok", "ok2"]
    assert rejected.column("reject_reason").to_pylist() == ["wrong_answer", "duplicate_actions"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "filter"
    assert manifest["input"]["rows"] == 4 and len(manifest["input"]["sha256"]) == 64
    assert manifest["output"]["accepted_rows"] == 2 and manifest["output"]["rejected_rows"] == 2
    assert manifest["rejects"]["wrong_answer"] == 1
    assert next(iter(manifest["rejects"])) == "no_answer"
    assert manifest["acceptance"]["structure"]["2I"] == {"rows": 1, "accepted": 1, "rate": 1.0}
    assert manifest["config"]["max_per_question"] == 3
    assert "answers" in manifest["seconds_by_step"] and manifest["elapsed_s"] > 0
    assert set(manifest["seconds_by_phase"]) == {"read", "filter", "write", "png"}

    # options and YAML map onto the config
    cfg = tmp_path / "f.yaml"
    cfg.write_text("filter:\n  outcome: none\n  max_per_question: 1\n  dedup_actions: false\n")
    res = CliRunner().invoke(
        app,
        ["filter", "--in", str(src), "--out", str(out), "--config", str(cfg), "--no-grounding"],
    )
    assert res.exit_code == 2 and "already holds an output" in res.output
    res = CliRunner().invoke(
        app,
        [
            *("filter", "--in", str(src), "--out", str(out), "--config", str(cfg)),
            "--no-grounding",
            "--overwrite",
        ],
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["outcome"] == "none" and manifest["config"]["grounding"] is False
    assert manifest["rejects"]["over_question_cap"] == 1


def test_cli_bad_input_names_the_file_and_column(tmp_path):
    missing = tmp_path / "nope.parquet"
    res = CliRunner().invoke(app, ["filter", "--in", str(missing), "--out", str(tmp_path / "o")])
    assert res.exit_code == 3 and str(missing) in res.output and "no such file" in res.output
    src = tmp_path / "t.parquet"
    table = pa.Table.from_pylist([traj("a")], schema=TRAJECTORY_SCHEMA)
    pq.write_table(table.drop_columns(["observed_entities", "tool_calls"]), src)
    res = CliRunner().invoke(app, ["filter", "--in", str(src), "--out", str(tmp_path / "o")])
    assert res.exit_code == 3
    line = res.output.strip()
    assert "\n" not in line
    assert str(src) in line and "missing column(s) tool_calls, observed_entities" in line
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    res = CliRunner().invoke(app, ["filter", "--in", str(junk), "--out", str(tmp_path / "o")])
    assert res.exit_code == 3 and str(junk) in res.output
    res = CliRunner().invoke(
        app, ["filter", "--in", str(src), "--out", str(tmp_path / "o"), "--balance", "size"]
    )
    assert res.exit_code == 2 and "--balance" in res.output
    assert not (tmp_path / "o").exists()
