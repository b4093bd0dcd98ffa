"""The agent loop shared by trajectory synthesis, RL rollouts and eval.

For each episode: the policy generates until ``</kg-query>`` or ``</answer>``; the turn is
parsed; a query runs through the tool environment and its ``<information>`` observation is
appended; repeat. At the turn limit the policy is asked once for a final answer. Episodes are
stepped together, one ``generate_batch`` per turn, so API and local backends batch.

Messages are recorded OpenAI-style: ``system``, ``user``, ``assistant``, and ``tool`` for the
environment's observations (sent to the policy as ``user`` turns: the text protocol needs no
tool-call ids). Only the environment writes observations: ``<information>`` text that a model
writes itself is stripped before parsing and never counts as observed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgsynth.agent.protocol import (
    FINAL_ANSWER_PROMPT,
    NO_ACTION_HINT,
    STOP_SEQUENCES,
    close_action,
    parse_turn,
    render_observation,
)
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.llm.base import LLM, GenerationParams, Request
from kgsynth.prompts import render

TOOL_HELP = {
    "graphwalker": [
        {
            "usage": 'get_relations("Entity Name")',
            "description": "the entity's relations (outgoing and incoming), most relevant first",
        },
        {
            "usage": 'get_triples("Entity Name", ["relation", ...])',
            "description": "the facts along those relations, by name",
        },
    ],
    "kgr1": [
        {
            "usage": 'get_tail_relations("Entity Name")',
            "description": "relations r with (entity, r, ?)",
        },
        {
            "usage": 'get_head_relations("Entity Name")',
            "description": "relations r with (?, r, entity)",
        },
        {
            "usage": 'get_tail_entities("Entity Name", "relation")',
            "description": "the tails of (entity, relation, ?)",
        },
        {
            "usage": 'get_head_entities("Entity Name", "relation")',
            "description": "the heads of (?, relation, entity)",
        },
    ],
}

PROMPT_STYLES = ("full", "short")
# A checkpoint trained on trajectories carries the system prompt it was trained with here;
# eval, RL and free rollouts of that checkpoint use it instead of rendering one.
SYSTEM_PROMPT_FILE = "agent_system_prompt.txt"


def system_prompt(toolset: str = "graphwalker", max_turns: int = 10, style: str = "full") -> str:
    """The agent's system prompt: ``full`` (protocol explained, for any model) or ``short``
    (one line of protocol and tool signatures, for small models trained from scratch)."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"system prompt style must be one of {', '.join(PROMPT_STYLES)}")
    name = "agent_system" if style == "full" else "agent_system_short"
    return render(name, tools=TOOL_HELP[toolset], max_turns=max_turns)


def stored_system_prompt(model_dir: str | Path | None) -> str | None:
    """The system prompt a checkpoint folder was trained with, if it stores one."""
    if not model_dir:
        return None
    path = Path(model_dir) / SYSTEM_PROMPT_FILE
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def user_prompt(question: str, topic_names: Sequence[str], reference: str | None = None) -> str:
    text = f"Question: {question}\nTopic entities: {', '.join(topic_names)}"
    if reference:
        text += (
            "\n\nA reference action sequence that answers this question (follow it, reasoning "
            f"in your own words):\n{reference}"
        )
    return text


@dataclass
class TurnRecord:
    """One assistant turn and what the environment made of it."""

    text: str
    think: str | None
    action: str | None
    query: str | None
    tool: str | None = None
    args: tuple = ()
    format_error: str | None = None  # why the turn broke the protocol
    tool_error: str | None = None  # the tool's ErrorType value
    llm_error: str | None = None  # the backend gave no text
    observation: str | None = None
    entities: tuple[str, ...] = ()
    completion_tokens: int = 0  # as the backend counted them


@dataclass
class EpisodeTask:
    question: str
    topic_names: list[str]
    reference: str | None = None  # referenced rejection sampling: shown, then stripped


@dataclass
class Episode:
    task: EpisodeTask
    messages: list[dict[str, str]] = field(default_factory=list)  # as stored (no reference)
    turns: list[TurnRecord] = field(default_factory=list)
    predicted_answers: list[str] = field(default_factory=list)
    answered: bool = False
    forced_answer: bool = False
    done: bool = False

    @property
    def tool_errors(self) -> int:
        return sum(1 for t in self.turns if t.tool_error)

    @property
    def format_errors(self) -> int:
        return sum(1 for t in self.turns if t.format_error)

    @property
    def generated_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)

    @property
    def tool_calls(self) -> list[str]:
        return [t.query for t in self.turns if t.query is not None]

    @property
    def observed_entities(self) -> list[str]:
        return list(dict.fromkeys(e for t in self.turns for e in t.entities))


def _for_policy(
    messages: list[dict[str, str]], reference_prompt: str | None
) -> list[dict[str, str]]:
    out = []
    for i, m in enumerate(messages):
        role = "user" if m["role"] == "tool" else m["role"]
        content = reference_prompt if (i == 1 and reference_prompt is not None) else m["content"]
        out.append({"role": role, "content": content})
    return out


def run_episodes(
    llm: LLM,
    tasks: Sequence[EpisodeTask],
    make_env: Callable[[EpisodeTask], ToolEnvironment],
    *,
    toolset: str = "graphwalker",
    max_turns: int = 10,
    params: GenerationParams | None = None,
    on_turn: Callable[[int, int], None] | None = None,
    system_text: str | None = None,
) -> list[Episode]:
    """Run every task to an answer or the turn limit; ``on_turn(turn, active)`` reports.
    ``system_text`` replaces the rendered system prompt (a checkpoint's stored one)."""
    base = params or GenerationParams(max_tokens=512)
    params = GenerationParams(
        temperature=base.temperature,
        top_p=base.top_p,
        max_tokens=base.max_tokens,
        stop=tuple(dict.fromkeys((*base.stop, *STOP_SEQUENCES))),
        seed=base.seed,
    )
    sys_text = system_text or system_prompt(toolset, max_turns)
    episodes = []
    envs = []
    for task in tasks:
        ep = Episode(task)
        ep.messages = [
            {"role": "system", "content": sys_text},
            {"role": "user", "content": user_prompt(task.question, task.topic_names)},
        ]
        episodes.append(ep)
        envs.append(make_env(task))
    for turn in range(max_turns + 1):
        active = [i for i, ep in enumerate(episodes) if not ep.done]
        if not active:
            break
        if on_turn:
            on_turn(turn, len(active))
        final = turn == max_turns
        if final:
            for i in active:
                episodes[i].messages.append({"role": "user", "content": FINAL_ANSWER_PROMPT})
                episodes[i].forced_answer = True
        requests = []
        for i in active:
            ep = episodes[i]
            ref = (
                user_prompt(ep.task.question, ep.task.topic_names, ep.task.reference)
                if ep.task.reference
                else None
            )
            requests.append(
                Request.make(
                    _for_policy(ep.messages, ref), params, task="agent_turn", context={"turn": turn}
                )
            )
        completions = llm.generate_batch(requests)
        for i, comp in zip(active, completions, strict=True):
            step(
                episodes[i],
                envs[i],
                comp.text if comp.ok else "",
                comp.error,
                final=final,
                completion_tokens=comp.completion_tokens if comp.ok else 0,
            )
    return episodes


def step(
    ep: Episode,
    env: ToolEnvironment,
    text: str,
    llm_error: str | None,
    *,
    final: bool,
    completion_tokens: int = 0,
) -> None:
    """Apply one generated turn to an episode."""
    if llm_error:
        ep.turns.append(TurnRecord("", None, None, None, llm_error=llm_error[:300]))
        ep.done = True
        return
    text = close_action(text)
    ep.messages.append({"role": "assistant", "content": text})
    turn = parse_turn(text)
    record = TurnRecord(
        text,
        turn.think,
        turn.action,
        turn.query,
        format_error=turn.format_error,
        completion_tokens=completion_tokens,
    )
    ep.turns.append(record)
    if turn.answer is not None:
        ep.predicted_answers = turn.answer
        ep.answered = True
        ep.done = True
        return
    if final:
        ep.done = True
        return
    if turn.query is not None:
        result = env.execute(turn.query)
        record.tool, record.args = result.tool, result.args
        if result.error is not None:
            record.tool_error = result.error.value
        record.observation = result.text
        record.entities = result.entities
        ep.messages.append({"role": "tool", "content": render_observation(result.text)})
        return
    ep.messages.append({"role": "tool", "content": render_observation(NO_ACTION_HINT)})


def episode_summary(ep: Episode) -> dict[str, Any]:
    """The per-episode fields of a trajectory row."""
    return {
        "messages": ep.messages,
        "predicted_answers": ep.predicted_answers,
        "answered": ep.answered,
        "forced_answer": ep.forced_answer,
        "num_turns": sum(1 for m in ep.messages if m["role"] == "assistant"),
        "tool_errors": ep.tool_errors,
        "format_errors": ep.format_errors,
        "tool_calls": ep.tool_calls,
        "turns": [turn_metadata(t) for t in ep.turns if not t.llm_error],
        "observed_entities": ep.observed_entities,
    }


def turn_metadata(t: TurnRecord) -> dict[str, Any]:
    """A turn's record as stored in trajectories.parquet."""
    return {
        "tool": t.tool,
        "args": json.dumps(list(t.args), ensure_ascii=False) if t.tool else None,
        "tool_error": t.tool_error,
        "format_error": t.format_error,
        "entities": list(t.entities),
    }


__all__ = [
    "FINAL_ANSWER_PROMPT",
    "Episode",
    "EpisodeTask",
    "TurnRecord",
    "close_action",
    "episode_summary",
    "run_episodes",
    "step",
    "stored_system_prompt",
    "system_prompt",
    "user_prompt",
]
