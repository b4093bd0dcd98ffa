"""The text protocol of one agent turn, and every tag and fixed message it uses.

A turn is ``<think>…</think>`` followed by exactly one action: ``<kg-query>call</kg-query>``
or ``<answer>["A", "B"]</answer>``. The environment replies ``<information>…</information>``.
Anything a model writes inside ``<information>`` itself is never an observation: the parser
removes it before looking for the action, and only :func:`render_observation` produces one.

The ``isp`` tool set speaks ISP-KGR's format instead (:data:`ISP_FORMAT_HELP`): after the
``<think>`` block a step is either one or more operations — ``<node>Entity Name</node>``
(explore an entity) and ``<SPARQL>SELECT …</SPARQL>`` (run a query), at most
:data:`MAX_OPERATIONS`, run in the order written, their observations returned together in one
``<information>`` block, a node's relations inside ``<relation>`` — or the final answer, one
``\\boxed{…}`` per answer entity inside ``<answer>`` (``<answer>\\boxed{Juarez}
\\boxed{Kismet}</answer>``, as ISP-KGR's prompt, Figure 8; boxes without ``<answer>`` are read
too; a box holding a JSON list, ``\\boxed{["A", "B"]}``, is read as that list).
:class:`TaggedFormat` and :class:`IspFormat` parse, write and cut turns in each format; an action space (:mod:`kgsynth.agent.spaces`) names the one its agents speak.

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
from collections.abc import Callable
from dataclasses import dataclass

from kgsynth.core.text import clean_text

# Tag names, and the strings that open and close them.
THINK = "think"
KG_QUERY = "kg-query"
ANSWER = "answer"
INFORMATION = "information"
# ISP-KGR's operations (the isp tool set): explore an entity, run a query
NODE = "node"
SPARQL = "SPARQL"
ISP_OPERATION_TAGS: tuple[str, ...] = (NODE, SPARQL)
# ISP-KGR's environment returns a node's relations inside <relation> (Figure 8); not a
# protocol-wide tag (TAG_NAMES), so no other tool set's tokenizer or parser changes
RELATION = "relation"
RELATION_OPEN, RELATION_CLOSE = f"<{RELATION}>", f"</{RELATION}>"
TAG_NAMES: tuple[str, ...] = (THINK, KG_QUERY, ANSWER, INFORMATION, NODE, SPARQL)
ACTION_TAGS: tuple[str, ...] = (KG_QUERY, ANSWER)  # a turn's one action, in parse priority
OPERATION_TOOLS = {NODE: "node", SPARQL: "sparql"}
"""The tool an operation tag runs."""
MAX_OPERATIONS = 5
"""Operations one isp step may hold; those past it are not run (and the step is a format error)."""
BOXED = "\\boxed{"


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

NODE_OPEN, NODE_CLOSE = opening(NODE), closing(NODE)
SPARQL_OPEN, SPARQL_CLOSE = opening(SPARQL), closing(SPARQL)
# An isp operation: its tag, then its text up to the same tag's closing.
OPERATION_RE = re.compile(f"<({NODE}|{SPARQL})>(.*?)</\\1>", re.DOTALL)
_OPEN_OPERATION_RE = re.compile(f"<({NODE}|{SPARQL})>")

# Generation stops after either closing tag (what a policy is sampled until).
STOP_SEQUENCES = (QUERY_CLOSE, ANSWER_CLOSE)
# An isp step may hold several operations, so it ends at the end of the turn; it is cut where
# a model starts writing an observation itself.
ISP_STOP_SEQUENCES = (INFO_OPEN,)

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
ISP_NO_ACTION_HINT = (
    "Your reply had no action. Reason inside <think></think>, then explore entities with "
    "<node>Entity Name</node> or run queries with <SPARQL>…</SPARQL> (several in one step if "
    "you like), or give the answer as <answer>\\boxed{Name}</answer>, one box per answer."
)
ISP_FINAL_ANSWER_PROMPT = (
    "You have used all your turns. Give your final answer now: <think>…</think> then "
    "<answer>\\boxed{…}</answer> with one box for every entity you found."
)
ISP_FORMAT_HELP = (
    "Each step: reason inside <think></think>, then either explore entities with "
    "<node>Entity Name</node> and run queries with <SPARQL>SELECT ...</SPARQL> (up to "
    f"{MAX_OPERATIONS} operations in one step, results come back together, in order), or "
    "give the final answer inside <answer></answer>, one \\boxed{Name} per answer entity."
)
# Appended to an observation cut to the rollout's token cap (tools.truncate marks a
# character cut with its own "[... truncated: N more lines]").
TRUNCATION_MARK = " [... observation truncated]"


@dataclass(frozen=True)
class Operation:
    """One operation of an isp step: ``<node>text</node>`` or ``<SPARQL>text</SPARQL>``."""

    tag: str
    text: str

    @property
    def tool(self) -> str:
        """The tool that runs it (``node`` or ``sparql``)."""
        return OPERATION_TOOLS[self.tag]

    def render(self) -> str:
        return tagged(self.tag, self.text)


@dataclass(frozen=True)
class Turn:
    """A parsed assistant turn. ``format_error`` is None for a well-formed turn. An isp step
    that runs operations has them in ``ops`` (run in order) and their text, one per line, as
    its ``query``."""

    think: str | None
    query: str | None
    answer: list[str] | None
    format_error: str | None
    ops: tuple[Operation, ...] = ()

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
    :func:`~kgsynth.core.text.clean_text`: ``"\\ud83c"`` escapes decode to lone surrogates.
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


def parse_tagged_turn(
    text: str, read_answer: Callable[[str], list[str] | None] | None = None
) -> Turn:
    """Parse one assistant message in the ``<kg-query>``/``<answer>`` format; the reason for
    any format problem is kept. ``read_answer`` reads the text inside ``<answer>`` (default
    :func:`parse_answer`; a space may read its paper's form, as kgr1 reads comma-separated
    names)."""
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
    answer = (read_answer or parse_answer)(answers[0])
    if answer is None:
        error = error or "answer is not a JSON list of strings"
    return Turn(think, None, answer, error)


def operations_text(ops: tuple[Operation, ...] | list[Operation]) -> str:
    """An isp step's operations as written, one per line (its ``query``, its tool call)."""
    return "\n".join(op.render() for op in ops)


def boxed_answers(answers: list[str] | tuple[str, ...]) -> str:
    """The isp answer: one ``\\boxed{…}`` per answer, space-separated."""
    return " ".join(f"{BOXED}{a}}}" for a in answers)


def _boxes(text: str) -> tuple[list[str], str | None]:
    """The contents of every ``\\boxed{…}`` in ``text`` (braces inside balanced), and an error
    when a box is never closed."""
    found: list[str] = []
    start = text.find(BOXED)
    while start >= 0:
        i = start + len(BOXED)
        depth = 1
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            return found, f"unclosed {BOXED}"
        found.append(text[start + len(BOXED) : i - 1])
        start = text.find(BOXED, i)
    return found, None


def _box_answers(contents: list[str]) -> list[str]:
    answers: list[str] = []
    for body in contents:
        body = body.strip()
        if body.startswith("["):
            listed = parse_answer(body)
            if listed is not None:
                answers.extend(listed)
                continue
        if body:
            answers.append(clean_text(body))
    return answers


def parse_isp_turn(text: str) -> Turn:
    """Parse one isp step (ISP-KGR's format, see the module doc). Operations and boxes are
    looked for outside ``<think>`` and ``<information>`` blocks. A step with both is read as
    the one written first and is a format error, as are a step past :data:`MAX_OPERATIONS`
    (the first ones run), an empty or unclosed operation, and an unclosed or empty box."""
    visible = INFO_RE.sub("", text)
    thinks = THINK_RE.findall(visible)
    think = thinks[0].strip() if thinks else None
    outside = THINK_RE.sub(" ", visible)
    errors: list[str] = [] if thinks else [f"missing {THINK_OPEN} block"]
    ops: list[Operation] = []
    for m in OPERATION_RE.finditer(outside):
        body = m.group(2).strip()
        if body:
            ops.append(Operation(m.group(1), clean_text(body)))
        else:
            errors.append(f"empty {opening(m.group(1))} operation")
    rest = OPERATION_RE.sub(" ", outside)
    unclosed = _OPEN_OPERATION_RE.search(rest)
    if unclosed:
        errors.append(f"unclosed {unclosed.group(0)} operation")
    contents, box_error = _boxes(rest)
    has_box = BOXED in rest
    if ops and has_box:
        errors.append(f"a step either runs operations or answers in {BOXED}}}, not both")
    # with both, the one written first is read (as with <kg-query> and <answer>)
    first_op = OPERATION_RE.search(outside)
    ops_first = first_op is not None and first_op.start() < outside.find(BOXED)
    if ops and (not has_box or ops_first):
        if len(ops) > MAX_OPERATIONS:
            errors.append(f"more than {MAX_OPERATIONS} operations in a step")
            ops = ops[:MAX_OPERATIONS]
        return Turn(think, operations_text(ops), None, errors[0] if errors else None, tuple(ops))
    if not has_box:
        none = f"no {NODE_OPEN}, {SPARQL_OPEN} or {BOXED}}} action"
        return Turn(think, None, None, errors[0] if errors else none)
    if box_error:
        errors.append(box_error)
    answers = _box_answers(contents)
    if not answers:
        errors.append(f"empty {BOXED}}} answer")
        return Turn(think, None, None, errors[0])
    return Turn(think, None, answers, errors[0] if errors else None)


def render_observation(text: str) -> str:
    """The environment's reply as the agent sees it."""
    return tagged(INFORMATION, text)


class TaggedFormat:
    """The ``<think>`` + ``<kg-query>``/``<answer>`` turn format (every space but isp): how
    a turn is parsed, written, cut and prompted for."""

    stop_sequences: tuple[str, ...] = STOP_SEQUENCES  # what a policy is sampled until
    no_action_hint: str = NO_ACTION_HINT  # the reply to a turn with no action
    final_answer_prompt: str = FINAL_ANSWER_PROMPT  # the request at the turn limit

    def parse_turn(self, text: str) -> Turn:
        return parse_tagged_turn(text)

    def query_turn(self, thought: str, call: str) -> str:
        """An assistant turn that runs ``call``."""
        return f"{tagged(THINK, thought)}\n{tagged(KG_QUERY, call)}"

    def answer_action(self, answers: list[str]) -> str:
        """The action that answers with ``answers``."""
        return tagged(ANSWER, json.dumps(list(answers), ensure_ascii=False))

    def answer_turn(self, thought: str, answers: list[str]) -> str:
        """An assistant turn that answers with ``answers``."""
        return f"{tagged(THINK, thought)}\n{self.answer_action(answers)}"

    def close_action(self, text: str) -> str:
        """Cut a generation after its first action and restore a closing tag that an API's
        stop sequence removed."""
        for tag in ACTION_TAGS:
            start = text.find(opening(tag))
            if start < 0:
                continue
            end = text.find(closing(tag), start)
            if end < 0:
                return text.rstrip() + closing(tag)
            return text[: end + len(closing(tag))]
        return text


class IspFormat(TaggedFormat):
    """ISP-KGR's step format (the isp space; see the module doc)."""

    stop_sequences = ISP_STOP_SEQUENCES
    no_action_hint = ISP_NO_ACTION_HINT
    final_answer_prompt = ISP_FINAL_ANSWER_PROMPT

    def parse_turn(self, text: str) -> Turn:
        return parse_isp_turn(text)

    def query_turn(self, thought: str, call: str) -> str:
        """``call`` is the step's operations as written."""
        return f"{tagged(THINK, thought)}\n{call}"

    def answer_action(self, answers: list[str]) -> str:
        """The boxes inside ``<answer>`` (ISP-KGR's prompt, Figure 8); the parser also reads
        boxes written without it."""
        return tagged(ANSWER, boxed_answers(answers))

    def close_action(self, text: str) -> str:
        """An isp step is cut where the model starts an observation itself."""
        cut = text.find(INFO_OPEN)
        return text if cut < 0 else text[:cut].rstrip()
