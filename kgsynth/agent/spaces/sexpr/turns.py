"""KBQA-R1's turn format (the ``sexpr`` space; Table I and §IV-A of the paper): reasoning in
``<think>…</think>``, then either one ``<action>…</action>`` block holding one or more actions
(one per line, or one after another: ``Find_relation [ A | r ] Count [ expression1 ]``), run in
the order written and observed together in one ``<information>`` block, or the final answer in
``<answer>…</answer>`` with the answers separated by spaces.

KBQA-R1's answers are Freebase MIDs or literal values, which hold no space; kgsynth's answers
are entity names, which often do, so a name holding a space (or a quote) is written in double
quotes, JSON-escaped: ``<answer>1944 "William Dieterle"</answer>`` reads as
``["1944", "William Dieterle"]``. A turn with both an action and an answer, or with two blocks,
is a format error (the first block written is read), as in the ``<kg-query>`` format::

    SEXPR_FORMAT.parse_turn("<think>t</think><action>Count [ expression1 ]</action>").query
"""

from __future__ import annotations

import json
import re
from typing import Any

from kgsynth.agent.protocol import (
    ANSWER,
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_RE,
    THINK,
    THINK_OPEN,
    THINK_RE,
    TaggedFormat,
    Turn,
    closing,
    opening,
    tagged,
)
from kgsynth.agent.spaces.sexpr.syntax import MAX_ACTIONS, split_actions
from kgsynth.agent.toolkit import ToolResult, truncate
from kgsynth.core.text import clean_text

ACTION = "action"
ACTION_OPEN, ACTION_CLOSE = opening(ACTION), closing(ACTION)
ACTION_RE = re.compile(f"{ACTION_OPEN}(.*?){ACTION_CLOSE}", re.DOTALL)
ANSWER_BLOCK_RE = re.compile(f"{ANSWER_OPEN}(.*?){ANSWER_CLOSE}", re.DOTALL)
BLOCK_TAGS = (ACTION, ANSWER)
_TOKEN_RE = re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')

NO_ACTION_HINT = (
    "Your reply had no action. Reason inside <think></think>, then write one or more actions "
    "inside <action></action>, or give the answer inside <answer></answer>, answers separated "
    'by spaces ("quoted" when a name holds a space).'
)
FINAL_ANSWER_PROMPT = (
    "You have used all your turns. Give your final answer now: <think>…</think> then "
    "<answer>…</answer> with every entity you found, separated by spaces."
)


def quote_answer(answer: str) -> str:
    """One answer as written inside ``<answer>``: bare when it holds no space or quote."""
    if answer and not any(c.isspace() or c == '"' for c in answer):
        return answer
    return json.dumps(answer, ensure_ascii=False)


def parse_answers(text: str) -> list[str] | None:
    """The answers of an ``<answer>`` block: space-separated, a double-quoted one JSON-unescaped;
    None when there is none or a quoted answer does not read."""
    answers: list[str] = []
    rest = _TOKEN_RE.sub(" ", text)
    if '"' in rest:  # an unclosed quote
        return None
    for m in _TOKEN_RE.finditer(text):
        if m.group(1) is not None:
            try:
                value = json.loads(f'"{m.group(1)}"')
            except json.JSONDecodeError:
                return None
        elif '"' in m.group(2):  # a quote inside a bare answer: a JSON list, a stray quote
            return None
        else:
            value = m.group(2)
        value = clean_text(value).strip()
        if value:
            answers.append(value)
    return answers or None


def parse_sexpr_turn(text: str) -> Turn:
    """One assistant turn in KBQA-R1's format (module doc); its ``query`` is the action block's
    text, every action in it."""
    visible = INFO_RE.sub("", text)
    thinks = THINK_RE.findall(visible)
    think = thinks[0].strip() if thinks else None
    error = None if thinks else f"missing {THINK_OPEN} block"
    actions = ACTION_RE.findall(visible)
    answers = ANSWER_BLOCK_RE.findall(visible)
    if not actions and not answers:
        return Turn(think, None, None, error or f"no {ACTION_OPEN} or {ANSWER_OPEN} block")
    if len(actions) + len(answers) > 1:
        error = error or f"more than one {ACTION_OPEN} or {ANSWER_OPEN} block in a turn"
    if actions and (not answers or visible.find(ACTION_OPEN) < visible.find(ANSWER_OPEN)):
        query = clean_text(actions[0]).strip()
        if not query:
            return Turn(think, None, None, error or f"empty {ACTION_OPEN} block")
        if len(split_actions(query)) > MAX_ACTIONS:
            error = error or f"more than {MAX_ACTIONS} actions in a turn"
        return Turn(think, query, None, error)
    answer = parse_answers(answers[0])
    if answer is None:
        error = error or "the answer holds no answers (separate them by spaces)"
    return Turn(think, None, answer, error)


class SexprFormat(TaggedFormat):
    """KBQA-R1's ``<think>`` + ``<action>``/``<answer>`` format (module doc)."""

    stop_sequences = (ACTION_CLOSE, ANSWER_CLOSE)
    token_stop_sequences = stop_sequences  # GRPO's token policy ends a turn there too
    no_action_hint = NO_ACTION_HINT
    final_answer_prompt = FINAL_ANSWER_PROMPT

    def parse_turn(self, text: str) -> Turn:
        return parse_sexpr_turn(text)

    def query_turn(self, thought: str, call: str) -> str:
        """An assistant turn that runs ``call`` (one action, or several, one per line)."""
        return f"{tagged(THINK, thought)}\n{tagged(ACTION, call)}"

    def answer_action(self, answers: list[str]) -> str:
        return tagged(ANSWER, " ".join(quote_answer(a) for a in answers))

    def close_action(self, text: str) -> str:
        """Cut a generation after its first block and restore a closing tag a stop sequence
        removed."""
        starts = [(text.find(opening(t)), t) for t in BLOCK_TAGS if opening(t) in text]
        if not starts:
            return text
        start, tag = min(starts)
        end = text.find(closing(tag), start)
        if end < 0:
            return text.rstrip() + closing(tag)
        return text[: end + len(closing(tag))]


SEXPR_FORMAT = SexprFormat()


def run_actions(env: Any, block: str) -> ToolResult:
    """Run the actions of one ``<action>`` block in order (the first :data:`MAX_ACTIONS`), each
    as one guarded call of ``env``, and return them as one result: one action's observation as
    it is; several each under an ``Action i (…):`` line, cut at that many observations' worth
    of characters; the first error (None when every action ran); the tools joined with ``+``;
    every argument and entity."""
    actions = split_actions(block)[:MAX_ACTIONS] or [block]
    results = [env.execute(a) for a in actions]
    if len(results) == 1:
        return results[0]
    parts = [
        f"Action {i} ({a}):\n{r.text}"
        for i, (a, r) in enumerate(zip(actions, results, strict=True), 1)
    ]
    return ToolResult(
        truncate("\n\n".join(parts), env.config.max_observation_chars * len(results)),
        next((r.error for r in results if r.error is not None), None),
        "+".join(r.tool or "?" for r in results),
        tuple(a for r in results for a in r.args),
        tuple(dict.fromkeys(e for r in results for e in r.entities)),
        tuple(n for r in results for n in r.notes),
    )


__all__ = [
    "ACTION",
    "ACTION_CLOSE",
    "ACTION_OPEN",
    "FINAL_ANSWER_PROMPT",
    "NO_ACTION_HINT",
    "SEXPR_FORMAT",
    "SexprFormat",
    "parse_answers",
    "parse_sexpr_turn",
    "quote_answer",
    "run_actions",
]
