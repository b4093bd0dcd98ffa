"""Hindsight name correction for sampled trajectories (``--correct-names``).

With ``--entity-matching near`` the environment reads a name the KG lacks as the most similar
name of the episode's context and says so on the observation's first line:
``(no entity named "Jack Lemon": read as "Jack Lemmon")``. A rollout that went on from there
and answered right is good expert data except for the misspelt name. The corrected row is the
episode as if the policy had written the name it was read as: the call, the reasoning that
repeats it, the turn's record and ``tool_calls`` carry the KG's name, and the note is gone, so
every observation is the one an exact call returns. Answers are left as written: the outcome
filter judges what the policy answered.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kgsynth.agent.toolkit import READ_AS_NOTE, quoted_cut

_ANSWER = re.compile(r"(<answer>.*?(?:</answer>|$))", re.S)


def _replace_names(text: str, reads: dict[str, str]) -> str:
    """``text`` with each name of ``reads`` (as a whole word run) replaced by its reading, in
    one pass (the longest name first where two start at the same place)."""
    names = sorted(reads, key=len, reverse=True)
    pattern = r"(?<!\w)(?:" + "|".join(map(re.escape, names)) + r")(?!\w)"
    return re.sub(pattern, lambda m: reads[m[0]], text)


def _outside_answers(text: str, reads: dict[str, str]) -> str:
    parts = _ANSWER.split(text)  # odd indices are the answer blocks, kept as written
    return "".join(p if i % 2 else _replace_names(p, reads) for i, p in enumerate(parts))


def correct_read_names(episode: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``episode`` (an episode summary) with every name the environment read as another
    written as the name it was read as, and how many notes were removed. A note whose name
    was shown cut (over 80 characters) is left as it is, with the call that made it."""
    reads: dict[str, str] = {}
    removed = 0

    def drop(note: re.Match[str]) -> str:
        nonlocal removed
        if quoted_cut(note["said"]):
            return note[0]
        reads[note["said"]] = note["read"]
        removed += 1
        return ""

    messages = [
        {**m, "content": READ_AS_NOTE.sub(drop, m["content"])} if m["role"] == "tool" else m
        for m in episode["messages"]
    ]
    if not reads:
        return episode, 0
    messages = [
        {**m, "content": _outside_answers(m["content"], reads)} if m["role"] == "assistant" else m
        for m in messages
    ]
    turns = []
    for t in episode.get("turns", []):
        if t.get("args"):
            args = [reads.get(a, a) if isinstance(a, str) else a for a in json.loads(t["args"])]
            t = {**t, "args": json.dumps(args, ensure_ascii=False)}
        turns.append(t)
    calls = [_replace_names(c, reads) for c in episode.get("tool_calls", [])]
    return {**episode, "messages": messages, "turns": turns, "tool_calls": calls}, removed
