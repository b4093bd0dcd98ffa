"""The one agent turn loop, shared by trajectory synthesis, eval and RL rollouts.

For each episode: the policy generates until ``</kg-query>`` or ``</answer>`` (an isp step:
until its turn ends); the turn is applied by :func:`advance`, the one per-turn code the flat
loop and the tree rollouts (:mod:`kgsynth.agent.tree`) share: parsed, its action run through
the action space (:func:`kgsynth.agent.episode.step`) and its ``<information>`` observation
appended, the episode's end detected, else the reply handed to the policy; repeat. At the turn
limit the policy is asked once for a final answer. Live episodes are stepped together, a batch
per ``generate`` call, so API and local backends batch.

What generates a turn is a :class:`TurnPolicy`:

- :class:`TextPolicy` (here) — an LLM client (API, vLLM, HF, template); the messages go out as
  requests and text comes back. Synthesis and eval use it through :func:`run_episodes`.
- :class:`~kgsynth.agent.rollout.TokenTurns` — a local model sampled in token space; it keeps
  each episode's token ids, loss mask and log-probs beside the messages. GRPO uses it through
  :func:`~kgsynth.agent.rollout.run_rollouts`.

Messages are recorded OpenAI-style: ``system``, ``user``, ``assistant``, and ``tool`` for the
environment's observations (sent to the policy as ``user`` turns: the text protocol needs no
tool-call ids). Only the environment writes observations: ``<information>`` text that a model
writes itself is stripped before parsing and never counts as observed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kgsynth.agent.episode import (
    Episode,
    EpisodeTask,
    TurnRecord,
    ask_final_answer,
    episode_summary,
    start_episode,
    step,
    turn_metadata,
)
from kgsynth.agent.prompt import (
    PROMPT_STYLES,
    SYSTEM_PROMPT_FILE,
    policy_messages,
    stored_system_prompt,
    system_prompt,
    user_prompt,
)
from kgsynth.agent.protocol import FINAL_ANSWER_PROMPT
from kgsynth.agent.render import for_template
from kgsynth.agent.spaces.registry import space
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.llm.base import LLM, GenerationParams, Request

# why a turn ended its episode (advance's answer; a tree's leaves keep it)
ANSWERED = "answered"
FAILED = "failed"  # a step the caller ends on (a tree's failed branch)
FINAL = "final"  # ended without an answer: the forced final turn, or the backend gave no text
TIMEOUT = "timeout"


@dataclass
class Generated:
    """One generated assistant turn: its text, or the backend's error when it gave none.
    ``sampled`` is what a token policy keeps of it (ids, log-probs)."""

    text: str
    error: str | None = None
    completion_tokens: int = 0  # as the backend counted them
    sampled: Any = None


@dataclass
class LiveEpisode:
    """An episode while the loop runs it: its record, its tool environment and the policy's
    own per-episode state (a token policy's ids and mask; None for a text policy)."""

    episode: Episode
    env: ToolEnvironment
    state: Any = None
    started: float = field(default_factory=time.monotonic)


class TurnPolicy(Protocol):
    """What generates the next assistant turn of live episodes."""

    # live episodes per generate call; None: all of them at once
    batch_size: int | None

    def begin(self, episode: Episode) -> Any:
        """The policy's state for a new episode (its first two messages are set)."""

    def generate(self, live: Sequence[LiveEpisode], turn: int) -> list[Generated]:
        """One assistant turn for each live episode, in order."""

    def observe(
        self, live: LiveEpisode, generated: Generated, reply: dict[str, str], turn: int
    ) -> None:
        """The environment's ``reply`` to a turn, in an episode that goes on (``turn + 1`` may
        be the final-answer turn, whose request message is appended next)."""


def run_turns(
    policy: TurnPolicy,
    tasks: Sequence[EpisodeTask],
    make_env: Callable[[EpisodeTask], ToolEnvironment],
    *,
    system_text: str,
    max_turns: int,
    timeout_s: float | None = None,
    on_turn: Callable[[int, int], None] | None = None,
) -> list[LiveEpisode]:
    """Run every task to an answer, the turn limit (then one forced answer) or, with
    ``timeout_s``, its wall-time limit; ``on_turn(turn, active)`` reports each turn."""
    live = []
    for task in tasks:
        ep = start_episode(task, system_text)
        state = policy.begin(ep)
        live.append(LiveEpisode(ep, make_env(task), state))
    for turn in range(max_turns + 1):
        active = [s for s in live if not s.episode.done]
        if not active:
            break
        if on_turn:
            on_turn(turn, len(active))
        final = turn == max_turns
        if final:  # the turn limit: ask once for the final answer
            for s in active:
                ask_final_answer(s.episode, s.env)
        size = policy.batch_size or len(active)
        for start in range(0, len(active), size):
            chunk = active[start : start + size]
            for s, gen in zip(chunk, policy.generate(chunk, turn), strict=True):
                advance(policy, s, gen, turn, final=final, timeout_s=timeout_s)
    return live


def advance(
    policy: TurnPolicy,
    s: LiveEpisode,
    gen: Generated,
    turn: int,
    *,
    final: bool,
    timeout_s: float | None = None,
    ends: Callable[[TurnRecord], bool] | None = None,
) -> str | None:
    """Apply one generated turn to a live episode: parsed and its action run through the
    action space (:func:`~kgsynth.agent.episode.step`), then either the episode ends and this
    says why (:data:`ANSWERED`; :data:`FINAL` without an answer; :data:`TIMEOUT` past
    ``timeout_s``; :data:`FAILED` where ``ends(turn record)`` says the step ends it, as a
    tree's failed branch does), or the environment's reply goes to the policy
    (``policy.observe``) and None comes back."""
    ep = s.episode
    n_messages = len(ep.messages)
    step(ep, s.env, gen.text, gen.error, final=final, completion_tokens=gen.completion_tokens)
    if timeout_s is not None and time.monotonic() - s.started > timeout_s and not ep.done:
        ep.timed_out = True
        ep.done = True
    if ep.done:
        return TIMEOUT if ep.timed_out else ANSWERED if ep.answered else FINAL
    if ends is not None and ends(ep.turns[-1]):
        ep.done = True
        return FAILED
    # the environment's reply (an observation, or the hint after a turn without an action)
    if len(ep.messages) <= n_messages + 1:
        ep.done = True
        return FINAL
    policy.observe(s, gen, ep.messages[-1], turn)
    return None


class TextPolicy:
    """An LLM client as the turn policy: one ``generate_batch`` of chat requests per turn,
    sampling until a closing action tag (an isp step: until the turn ends, or the model starts
    an observation). A task's reference (referenced rejection sampling) is shown in the
    messages the policy sees (:func:`~kgsynth.agent.prompt.policy_messages`: the whole
    sequence in the user prompt, or the next gold action at each turn), never stored in the
    episode.

    ``resample_cut_turns`` > 0: a turn that reached ``max_tokens`` without a closing tag
    (run 2026-11-27 Y's stage 1 on dev: a name copied in a loop, "Maurice Pialatce Pialatce
    …", in 27 of 300 questions, all missed) is sampled again at ``resample_temperature``, the
    seed moved on with each try, until one closes or the episode has drawn that many new
    samples; the cut turn stands when none closes. The episode counts what it drew
    (``Episode.resamples``), and the turn's tokens count every sample."""

    batch_size = None

    def __init__(
        self,
        llm: LLM,
        params: GenerationParams | None = None,
        toolset: str | None = None,
        *,
        resample_cut_turns: int = 0,
        resample_temperature: float = 0.7,
    ) -> None:
        base = params or GenerationParams(max_tokens=512)
        self.llm = llm
        self.params = GenerationParams(
            temperature=base.temperature,
            top_p=base.top_p,
            max_tokens=base.max_tokens,
            stop=tuple(dict.fromkeys((*base.stop, *space(toolset).turns.stop_sequences))),
            seed=base.seed,
        )
        self.resample_cut_turns = resample_cut_turns
        self.resample_temperature = resample_temperature

    def begin(self, episode: Episode) -> None:
        return None

    def generate(self, live: Sequence[LiveEpisode], turn: int) -> list[Generated]:
        requests = []
        for s in live:
            messages = policy_messages(for_template(s.episode.messages), s.episode, s.env)
            requests.append(
                Request.make(messages, self.params, task="agent_turn", context={"turn": turn})
            )
        completions = self.llm.generate_batch(requests)
        out = [
            Generated(c.text, None, c.completion_tokens) if c.ok else Generated("", c.error)
            for c in completions
        ]
        if self.resample_cut_turns:
            self._resample_cut(live, requests, out)
        return out

    def _cut(self, text: str, completion_tokens: int) -> bool:
        """A turn that used the whole token budget and closed no action."""
        return completion_tokens >= self.params.max_tokens and not any(
            text.rstrip().endswith(s) for s in self.params.stop
        )

    def _resample_cut(
        self, live: Sequence[LiveEpisode], requests: list[Request], out: list[Generated]
    ) -> None:
        cut = [g.error is None and self._cut(g.text, g.completion_tokens) for g in out]
        for attempt in range(1, self.resample_cut_turns + 1):
            todo = [
                i
                for i in range(len(out))
                if cut[i] and live[i].episode.resamples < self.resample_cut_turns
            ]
            if not todo:
                return
            params = dataclasses.replace(
                self.params,
                temperature=self.resample_temperature,
                seed=(self.params.seed or 0) + attempt,
            )
            again = self.llm.generate_batch(
                [dataclasses.replace(requests[i], params=params) for i in todo]
            )
            for i, c in zip(todo, again, strict=True):
                live[i].episode.resamples += 1
                spent = out[i].completion_tokens + c.completion_tokens
                cut[i] = not c.ok or self._cut(c.text, c.completion_tokens)
                text = out[i].text if cut[i] else c.text
                out[i] = Generated(text, None, spent)

    def observe(
        self, live: LiveEpisode, generated: Generated, reply: dict[str, str], turn: int
    ) -> None:
        return None


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
    resample_cut_turns: int = 0,
    resample_temperature: float = 0.7,
) -> list[Episode]:
    """:func:`run_turns` with an LLM client (:class:`TextPolicy`, which also takes the
    resampling options); ``system_text`` replaces the rendered system prompt (a checkpoint's
    stored one)."""
    live = run_turns(
        TextPolicy(
            llm,
            params,
            toolset,
            resample_cut_turns=resample_cut_turns,
            resample_temperature=resample_temperature,
        ),
        tasks,
        make_env,
        system_text=system_text or system_prompt(toolset, max_turns),
        max_turns=max_turns,
        on_turn=on_turn,
    )
    return [s.episode for s in live]


__all__ = [
    "ANSWERED",
    "FAILED",
    "FINAL",
    "FINAL_ANSWER_PROMPT",
    "PROMPT_STYLES",
    "SYSTEM_PROMPT_FILE",
    "TIMEOUT",
    "Episode",
    "EpisodeTask",
    "Generated",
    "LiveEpisode",
    "TextPolicy",
    "TurnPolicy",
    "TurnRecord",
    "advance",
    "episode_summary",
    "run_episodes",
    "run_turns",
    "step",
    "stored_system_prompt",
    "system_prompt",
    "turn_metadata",
    "user_prompt",
]
