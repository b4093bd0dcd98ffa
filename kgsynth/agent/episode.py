"""One episode's record and how a turn advances it (shared by synthesis, eval and RL).

An :class:`Episode` holds its task, the conversation (OpenAI-style messages: ``system``,
``user``, ``assistant``, and ``tool`` for the environment's observations) and one
:class:`TurnRecord` per assistant turn. :func:`step` applies one generated turn: it parses it
(:mod:`kgsynth.agent.protocol`, in the format of the environment's tool set), runs a query
(an isp step: each of its operations) through the tool environment and appends the
``<information>`` observation, or ends the episode on an answer. Only the environment writes
observations. :func:`episode_summary` gives the per-episode fields of a trajectory row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kgsynth.agent.prompt import user_prompt
from kgsynth.agent.protocol import render_observation
from kgsynth.agent.strategies.entities import read_answers
from kgsynth.agent.tools import ToolEnvironment


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
    # per-step reference guidance (KBQA-R1 §IV-B1 step 2): the gold actions, each shown as
    # the next one while it is (kgsynth.agent.prompt.policy_messages); never stored
    reference_steps: tuple[str, ...] = ()


@dataclass
class Episode:
    task: EpisodeTask
    messages: list[dict[str, str]] = field(default_factory=list)  # as stored (no reference)
    turns: list[TurnRecord] = field(default_factory=list)
    predicted_answers: list[str] = field(default_factory=list)
    answered: bool = False
    forced_answer: bool = False
    timed_out: bool = False  # ended on its wall-time limit (RL rollouts)
    done: bool = False
    resamples: int = 0  # new samples drawn for turns cut before their action closed

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


def start_episode(task: EpisodeTask, system_text: str) -> Episode:
    """A new episode of ``task``: the system prompt and the question's user prompt."""
    ep = Episode(task)
    ep.messages = [
        {"role": "system", "content": system_text},
        {"role": "user", "content": user_prompt(task.question, task.topic_names)},
    ]
    return ep


def ask_final_answer(ep: Episode, env: ToolEnvironment) -> None:
    """The turn limit: ask once for the final answer, in the action space's format."""
    ep.messages.append({"role": "user", "content": env.space.turns.final_answer_prompt})
    ep.forced_answer = True


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
    turns = env.space.turns
    text = turns.close_action(text)
    ep.messages.append({"role": "assistant", "content": text})
    turn = turns.parse_turn(text)
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
        if env.config.answer_matching == "near":
            ep.predicted_answers = read_answers(turn.answer, ep.observed_entities)
        ep.answered = True
        ep.done = True
        return
    if final:
        ep.done = True
        return
    if turn.query is not None:
        result = env.space.run_turn(env, turn)
        record.tool, record.args = result.tool, result.args
        if result.error is not None:
            record.tool_error = result.error.value
        record.observation = result.text
        record.entities = result.entities
        ep.messages.append({"role": "tool", "content": render_observation(result.text)})
        return
    ep.messages.append({"role": "tool", "content": render_observation(turns.no_action_hint)})


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
