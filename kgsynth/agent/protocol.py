"""The text protocol of one agent turn, and every tag and fixed message it uses.

A turn is ``<think>…</think>`` followed by exactly one action: ``<kg-query>call</kg-query>``
or ``<answer>["A", "B"]</answer>``. The environment replies ``<information>…</information>``.
Anything a model writes inside ``<information>`` itself is never an observation: the parser
removes it before looking for the action, and only :func:`render_observation` produces one.

This module owns the protocol's spelling: the tag names, their opening and closing strings, the
stop sequences, the environment's fixed messages (the hint after a turn without an action, the
final-answer request at the turn limit) and the marker on a cut observation. Code that writes
or reads turns (trajectory synthesis, the filter, drills, the tiny tokenizer) imports them from
here instead of restating them.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from kgsynth.text import clean_text

# Tag names, and the strings that open and close them.
THINK = "think"
KG_QUERY = "kg-query"
ANSWER = "answer"
INFORMATION = "information"
TAG_NAMES: tuple[str, ...] = (THINK, KG_QUERY, ANSWER, INFORMATION)
ACTION_TAGS: tuple[str, ...] = (KG_QUERY, ANSWER)  # a turn's one action, in parse priority


def opening(tag: str) -> str:
    """``<tag>``."""
    return f"<{tag}>"


def closing(tag: str) -> str:
    """``</tag>``."""
    return f"</{tag}>"


def tagged(tag: str, text: str) -> str:
    """``text`` inside ``tag``: ``<tag>text</tag>``."""
    return f"{opening(tag)}{text}{closing(tag)}"


THINK_OPEN, THINK_CLOSE = opening(THINK), closing(THINK)
QUERY_OPEN, QUERY_CLOSE = opening(KG_QUERY), closing(KG_QUERY)
ANSWER_OPEN, ANSWER_CLOSE = opening(ANSWER), closing(ANSWER)
INFO_OPEN, INFO_CLOSE = opening(INFORMATION), closing(INFORMATION)
# Every tag string, opening before closing (the tiny tokenizer adds each as one token).
PROTOCOL_TAGS: tuple[str, ...] = tuple(s for t in TAG_NAMES for s in (opening(t), closing(t)))


def _block_re(tag: str) -> re.Pattern[str]:
    return re.compile(f"{opening(tag)}(.*?){closing(tag)}", re.DOTALL)


THINK_RE = _block_re(THINK)
QUERY_RE = _block_re(KG_QUERY)
ANSWER_RE = _block_re(ANSWER)
# An observation block, or an unclosed one running to the end of the text.
INFO_RE = re.compile(f"{INFO_OPEN}.*?({INFO_CLOSE}|$)", re.DOTALL)
# Any protocol tag, opening or closing (to strip tags out of free text).
ANY_TAG_RE = re.compile(f"</?({'|'.join(TAG_NAMES)})>")

# Generation stops after either closing tag (what a policy is sampled until).
STOP_SEQUENCES = (QUERY_CLOSE, ANSWER_CLOSE)

# The environment's reply to a turn with no action (wrapped as an observation).
NO_ACTION_HINT = (
    "Your reply had no action. Reason inside <think></think>, then call one tool inside "
    "<kg-query></kg-query> or answer inside <answer></answer>."
)
# Sent as a user turn when the turn limit is reached; the next turn is the last.
FINAL_ANSWER_PROMPT = (
    "You have used all your turns. Give your final answer now: <think>…</think> then "
    '<answer>["…"]</answer> with every entity you found.'
)
# Appended to an observation cut to the rollout's token cap (tools.truncate marks a
# character cut with its own "[... truncated: N more lines]").
TRUNCATION_MARK = " [... observation truncated]"


@dataclass(frozen=True)
class Turn:
    """A parsed assistant turn. ``format_error`` is None for a well-formed turn."""

    think: str | None
    query: str | None
    answer: list[str] | None
    format_error: str | None

    @property
    def action(self) -> str | None:
        if self.query is not None:
            return KG_QUERY
        if self.answer is not None:
            return ANSWER
        return None


def parse_answer(text: str) -> list[str] | None:
    """The answer list: a JSON list of strings (or a Python-style list with single quotes).

    Never splits on commas, so "Washington, D.C." stays one answer. A bare non-list string is
    taken as one answer. Returns None when nothing usable is there. Answers pass through
    :func:`~kgsynth.text.clean_text`: ``"\\ud83c"`` escapes decode to lone surrogates.
    """
    answers = _parse_answer(text)
    return None if answers is None else [clean_text(a) for a in answers]


def _parse_answer(text: str) -> list[str] | None:
    text = text.strip()
    if not text:
        return None
    for loader in (json.loads, ast.literal_eval):
        try:
            value = loader(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, (list, tuple)):
            return [str(v).strip() for v in value if str(v).strip()]
        if isinstance(value, (str, int, float)):
            return [str(value).strip()]
    if text.startswith("["):
        return None
    return [text]


def parse_turn(text: str) -> Turn:
    """Parse one assistant message; the reason for any format problem is kept."""
    visible = INFO_RE.sub("", text)
    thinks = THINK_RE.findall(visible)
    queries = QUERY_RE.findall(visible)
    answers = ANSWER_RE.findall(visible)
    think = thinks[0].strip() if thinks else None
    error: str | None = None
    if not thinks:
        error = f"missing {THINK_OPEN} block"
    if len(queries) + len(answers) == 0:
        return Turn(think, None, None, error or f"no {QUERY_OPEN} or {ANSWER_OPEN} action")
    if len(queries) + len(answers) > 1:
        error = error or "more than one action in a turn"
    if queries and (not answers or visible.find(QUERY_OPEN) < visible.find(ANSWER_OPEN)):
        return Turn(think, queries[0].strip(), None, error)
    answer = parse_answer(answers[0])
    if answer is None:
        error = error or "answer is not a JSON list of strings"
    return Turn(think, None, answer, error)


def render_observation(text: str) -> str:
    """The environment's reply as the agent sees it."""
    return tagged(INFORMATION, text)


def close_action(text: str) -> str:
    """Cut a generation after its first action and restore a closing tag that an API's stop
    sequence removed."""
    for tag in ACTION_TAGS:
        start = text.find(opening(tag))
        if start < 0:
            continue
        end = text.find(closing(tag), start)
        if end < 0:
            return text.rstrip() + closing(tag)
        return text[: end + len(closing(tag))]
    return text
