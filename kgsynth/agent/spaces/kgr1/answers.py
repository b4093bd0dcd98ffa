"""kgr1's answers as KG-R1 writes them: names separated by commas inside ``<answer>``
(kg-r1.txt App. E: every example ends ``<answer> Name One, Name Two </answer>``), read by
splitting, trimming and dropping repeats (§3.2: the answer text is normalised and
de-duplicated). A JSON or Python list is still read as a list, so "Washington, D.C." survives
when written ``["Washington, D.C."]``; kgr1's oracle writes such a list only when a name holds
a comma. The other spaces keep :func:`~kgsynth.agent.protocol.parse_answer`, which never
splits."""

from __future__ import annotations

import json
import re

from kgsynth.agent.protocol import (
    ANSWER,
    TaggedFormat,
    Turn,
    parse_answer,
    parse_tagged_turn,
    tagged,
)
from kgsynth.core.text import clean_text

_SEPARATORS = re.compile(r"[,\n]")

NO_ACTION_HINT = (
    "Your reply had no action. Reason inside <think></think>, then call one tool inside "
    "<kg-query></kg-query> or give the answers inside <answer></answer>, separated by commas."
)
FINAL_ANSWER_PROMPT = (
    "You have used all your turns. Give your final answer now: <think>…</think> then "
    "<answer>Name One, Name Two</answer>, every entity you found, separated by commas."
)


def read_listed_answer(text: str) -> list[str] | None:
    """The answers in ``text``: a JSON or Python list (or a quoted name) as such, otherwise
    the comma- or line-separated names; repeats (ignoring case and spacing) dropped. None when
    nothing is there."""
    body = text.strip()
    if not body:
        return None
    if body[0] in "[\"'":
        listed = parse_answer(body)
        if listed is not None and listed != [clean_text(body)]:
            return _unique(listed)
        if body[0] == "[":
            return None
    return _unique([clean_text(part.strip()) for part in _SEPARATORS.split(body)])


def _unique(names: list[str]) -> list[str] | None:
    seen: dict[str, str] = {}
    for name in names:
        if name:
            seen.setdefault(" ".join(name.casefold().split()), name)
    return list(seen.values()) or None


class Kgr1Format(TaggedFormat):
    """The ``<think>`` + ``<kg-query>``/``<answer>`` turns, answers comma-separated."""

    no_action_hint = NO_ACTION_HINT
    final_answer_prompt = FINAL_ANSWER_PROMPT

    def parse_turn(self, text: str) -> Turn:
        return parse_tagged_turn(text, read_listed_answer)

    def answer_action(self, answers: list[str]) -> str:
        """``<answer>A, B</answer>``; a JSON list where a name holds a comma or a line break
        (split, it would read as two)."""
        if any(_SEPARATORS.search(a) for a in answers):
            return tagged(ANSWER, json.dumps(list(answers), ensure_ascii=False))
        return tagged(ANSWER, ", ".join(answers))
