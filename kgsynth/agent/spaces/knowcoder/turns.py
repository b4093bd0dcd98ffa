"""KnowCoder-A1's turn format: ``<think>`` then one tool call in ``<kg-query>``, or the final
answer in ``<answer>`` with each answer in its own ``\\boxed{…}`` (``knowcoder-a1.txt`` §4.3.2:
the format reward asks for the answer box and the answer reward reads the predictions inside
it). ``<answer>\\boxed{Brenda Song}</answer>``; a box holding a JSON list,
``\\boxed{["A", "B"]}``, is read as that list.

An ``<answer>`` without a box is a format error and predicts nothing (the paper scores only what
the boxes hold); so is an empty or unclosed box. Tool calls, stop sequences and the cut after the
action are the shared tagged format's (:class:`~kgsynth.agent.protocol.TaggedFormat`).
"""

from __future__ import annotations

from kgsynth.agent.protocol import (
    ANSWER,
    ANSWER_CLOSE,
    ANSWER_OPEN,
    ANSWER_RE,
    BOXED,
    INFO_RE,
    KG_QUERY,
    THINK_CLOSE,
    THINK_OPEN,
    TaggedFormat,
    Turn,
    _box_answers,
    _boxes,
    boxed_answers,
    parse_tagged_turn,
    tagged,
)

NOT_BOXED = f"answer not in {BOXED}}}"
"""The format error of an ``<answer>`` that holds no box."""

KNOWCODER_NO_ACTION_HINT = (
    f"Your reply had no action. Reason inside {THINK_OPEN}{THINK_CLOSE}, then call one tool "
    f"inside {tagged(KG_QUERY, '')} or answer inside "
    f"{ANSWER_OPEN}{ANSWER_CLOSE} with one {BOXED}…}} per answer."
)
KNOWCODER_FINAL_ANSWER_PROMPT = (
    f"You have used all your turns. Give your final answer now: {THINK_OPEN}…{THINK_CLOSE} then "
    f"{ANSWER_OPEN}{BOXED}…}}{ANSWER_CLOSE} with one box for every entity you found."
)


def boxed_answer(body: str) -> tuple[list[str] | None, str | None]:
    """The answers the boxes of an ``<answer>`` body hold, and the format error (None when
    every box is closed and some box holds a name)."""
    contents, error = _boxes(body)
    if BOXED not in body:
        return [], NOT_BOXED
    answers = _box_answers(contents)
    if not answers:
        return [], error or f"empty {BOXED}}} answer"
    return answers, error


def parse_knowcoder_turn(text: str) -> Turn:
    """One assistant turn in KnowCoder-A1's format (see the module doc)."""
    turn = parse_tagged_turn(text)
    if turn.answer is None and turn.format_error is None:
        return turn
    if turn.query is not None or not ANSWER_RE.search(INFO_RE.sub("", text)):
        return turn
    body = ANSWER_RE.findall(INFO_RE.sub("", text))[0]
    answers, error = boxed_answer(body)
    # a problem the tagged parser found first (no <think>, two actions) still comes first
    tagged_error = turn.format_error
    if tagged_error and tagged_error.startswith("answer is not"):
        tagged_error = None
    return Turn(turn.think, None, answers, tagged_error or error)


class KnowCoderFormat(TaggedFormat):
    """``<kg-query>`` tool calls and a boxed ``<answer>`` (see the module doc)."""

    no_action_hint = KNOWCODER_NO_ACTION_HINT
    final_answer_prompt = KNOWCODER_FINAL_ANSWER_PROMPT

    def parse_turn(self, text: str) -> Turn:
        return parse_knowcoder_turn(text)

    def answer_action(self, answers: list[str]) -> str:
        return tagged(ANSWER, boxed_answers(answers))
