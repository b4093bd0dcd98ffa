"""The agent's prompts: the system prompt (the action space's, rendered for its turn limit and
style, or the one a checkpoint stores), the user prompt of a question, and what a referenced
rollout's policy is shown of its reference (:func:`policy_messages`).

    system_prompt("graphwalker", max_turns=10, style="short")
    user_prompt("who directed Kismet?", ["Kismet"])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kgsynth.agent.config import PROMPT_STYLES, AgentConfig
from kgsynth.agent.spaces.registry import space
from kgsynth.agent.topics import mention_order

# A checkpoint trained on trajectories carries the system prompt it was trained with here;
# eval, RL and free rollouts of that checkpoint use it instead of rendering one.
SYSTEM_PROMPT_FILE = "agent_system_prompt.txt"


def system_prompt(toolset: str = "graphwalker", max_turns: int = 10, style: str = "full") -> str:
    """The agent's system prompt for the action space ``toolset``: ``full`` (protocol
    explained, for any model) or ``short`` (one line of protocol and tool signatures, for small
    models trained from scratch)."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"system prompt style must be one of {', '.join(PROMPT_STYLES)}")
    return space(toolset).system_prompt(max_turns, style)


def agent_system_prompt(cfg: AgentConfig) -> str:
    """The system prompt an agent config asks for: its ``system_text`` (a checkpoint's stored
    prompt) when set, else the one rendered for its tool set, turn limit and style."""
    return cfg.system_text or system_prompt(cfg.toolset, cfg.max_turns, cfg.system_prompt)


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
    """The user turn: the question and its topic entities, in the order the question names
    them (:func:`mention_order`)."""
    # a benchmark question may name no topic entity (GrailQA): say so rather than leave it blank
    names = [topic_names[i] for i in mention_order(question, topic_names)]
    topics = ", ".join(names) or "none given (find them in the question)"
    text = f"Question: {question}\nTopic entities: {topics}"
    if reference:
        text += (
            "\n\nA reference action sequence that answers this question (follow it, reasoning "
            f"in your own words):\n{reference}"
        )
    return text


def reference_hint(steps: Sequence[str], done: int) -> str:
    """The per-step reference (KBQA-R1 §IV-B1 step 2): the gold action after the ``done``
    ones the episode has made, or, past the last, that the reference has no more."""
    if done < len(steps):
        return f"Reference for your next action: {steps[done]}"
    return "Reference: every reference action has run; give the answer from the results."


def policy_messages(messages: list[dict[str, str]], episode: Any, env: Any) -> list[dict[str, str]]:
    """The messages a referenced rollout's policy sees (``messages``: the episode's, rendered
    for the chat template), the stored ones never changed (KBQA-R1 §IV-B1 step 4). With
    ``reference_steps`` (per-step guidance), the last message ends with the next gold action:
    the action space's ``reference_progress`` says how many the episode has made. With a
    ``reference`` only, the user prompt shows the whole numbered sequence once."""
    task = episode.task
    out = list(messages)
    if task.reference_steps and out:
        done = env.space.reference_progress(env, episode)
        last = out[-1]
        hint = reference_hint(task.reference_steps, done)
        out[-1] = {"role": last["role"], "content": f"{last['content']}\n\n{hint}"}
    elif task.reference and len(out) > 1:
        prompt = user_prompt(task.question, task.topic_names, task.reference)
        out[1] = {"role": out[1]["role"], "content": prompt}
    return out
