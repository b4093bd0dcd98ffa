"""The text protocol of one agent turn.

A turn is ``<think>…</think>`` followed by exactly one action: ``<kg-query>call</kg-query>``
or ``<answer>["A", "B"]</answer>``. The environment replies ``<information>…</information>``.
Anything a model writes inside ``<information>`` itself is never an observation: the parser
removes it before looking for the action, and only :func:`render_observation` produces one.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from kgsynth.text import clean_text

THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
QUERY_RE = re.compile(r"<kg-query>(.*?)</kg-query>", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
INFO_RE = re.compile(r"<information>.*?(</information>|$)", re.DOTALL)

# Generation stops after either closing tag (what a policy is sampled until).
STOP_SEQUENCES = ("</kg-query>", "</answer>")


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
            return "kg-query"
        if self.answer is not None:
            return "answer"
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
        error = "missing <think> block"
    if len(queries) + len(answers) == 0:
        return Turn(think, None, None, error or "no <kg-query> or <answer> action")
    if len(queries) + len(answers) > 1:
        error = error or "more than one action in a turn"
    if queries and (not answers or visible.find("<kg-query>") < visible.find("<answer>")):
        return Turn(think, queries[0].strip(), None, error)
    answer = parse_answer(answers[0])
    if answer is None:
        error = error or "answer is not a JSON list of strings"
    return Turn(think, None, answer, error)


def render_observation(text: str) -> str:
    """The environment's reply as the agent sees it."""
    return f"<information>{text}</information>"
