"""Token-in/token-out multi-turn rollouts of a local policy against the KG tools (for GRPO).

The same turn loop, protocol and environment as synthesis and eval
(:func:`kgsynth.agent.loop.run_turns`, with :class:`TokenTurns` as its turn policy), but kept in
token space: each rollout holds the token ids the policy saw
and sampled, a loss mask (1 on sampled tokens, 0 on the prompt, on observation tokens and on
the end-of-turn tokens the environment closes a turn with) and the log-probability of every
sampled token under the sampling distribution. Observations are tokenized once, when they are
appended; the history is never decoded and re-encoded, so the ids trained on are exactly the
ids the policy produced (:func:`check_alignment` asserts it).

    policy = TokenPolicy(model, tokenizer)
    rollouts = run_rollouts(policy, tasks, make_env, RolloutConfig(max_turns=4), seed=0)

Turn segments come from the tokenizer's chat template (ChatML when it has none): after an
assistant turn the environment appends the rest of that turn's end-of-turn text, then the
observation rendered as a ``user`` turn and the opening of the next assistant turn — the same
text :mod:`kgsynth.agent.render` renders for SFT.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.agent.config import AgentConfig, AgentConfigError
from kgsynth.agent.engines import HFEngine, RolloutEngine, SamplingParams
from kgsynth.agent.episode import Episode, EpisodeTask
from kgsynth.agent.loop import Generated, LiveEpisode, run_turns
from kgsynth.agent.prompt import agent_system_prompt
from kgsynth.agent.protocol import (
    INFO_CLOSE,
    INFO_OPEN,
    STOP_SEQUENCES,
    TRUNCATION_MARK,
)
from kgsynth.agent.render import chat_text
from kgsynth.agent.spaces.registry import space
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.core.config import option

_SENTINEL = "\x1eASSISTANT-TURN\x1e"


@dataclass(frozen=True)
class RolloutConfig(AgentConfig):
    """The agent's settings plus the limits of one rollout in token space: observation tokens
    per tool call, sampling, and the wall time. A per-turn cap of 256 tokens unless set."""

    max_turn_tokens: int = option(256, "Tokens the policy samples per assistant turn")
    max_obs_tokens: int = option(512, "Observation tokens appended per tool call")
    temperature: float = option(1.0, "Sampling temperature")
    top_p: float = option(1.0, "Nucleus sampling: the top-p share of probability mass")
    timeout_s: float = option(
        120.0, "Wall time per rollout; a rollout past it ends where it is (timed_out)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_obs_tokens < 1:
            raise AgentConfigError(f"max_obs_tokens must be >= 1 (got {self.max_obs_tokens})")
        if not self.timeout_s > 0:
            raise AgentConfigError(f"timeout_s must be > 0 (got {self.timeout_s})")


@dataclass
class Rollout:
    """One episode in token space. ``turn_of[i]`` is the assistant turn token i belongs to
    (-1 for prompt and environment tokens)."""

    episode: Episode
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    turn_of: list[int]
    prompt_len: int
    timed_out: bool = False
    truncated_observations: int = 0
    generated_tokens: int = 0

    def __len__(self) -> int:
        return len(self.ids)

    def append(self, ids: Sequence[int], logprobs: Sequence[float] | None, turn: int) -> None:
        """Tokens the policy sampled in ``turn`` (with their log-probs), or, with ``logprobs``
        None, tokens the environment appended (masked out)."""
        self.ids.extend(ids)
        if logprobs is None:
            self.mask.extend([0] * len(ids))
            self.logprobs.extend([0.0] * len(ids))
            self.turn_of.extend([-1] * len(ids))
        else:
            self.mask.extend([1] * len(ids))
            self.logprobs.extend(logprobs)
            self.turn_of.extend([turn] * len(ids))
            self.generated_tokens += len(ids)


def check_alignment(r: Rollout) -> None:
    """Ids, mask, log-probs and turn indices line up; raises AssertionError when not."""
    n = len(r.ids)
    if not (len(r.mask) == len(r.logprobs) == len(r.turn_of) == n):
        raise AssertionError(
            f"rollout arrays differ in length: ids {n}, mask {len(r.mask)}, "
            f"logprobs {len(r.logprobs)}, turn_of {len(r.turn_of)}"
        )
    if any(r.mask[: r.prompt_len]):
        raise AssertionError("prompt tokens are masked in")
    for i, (m, lp, t) in enumerate(zip(r.mask, r.logprobs, r.turn_of, strict=True)):
        if m and (t < 0 or lp > 0.0):
            raise AssertionError(f"token {i}: sampled but no turn or a positive log-prob")
        if not m and (lp != 0.0 or t != -1):
            raise AssertionError(f"token {i}: not sampled but has a log-prob or a turn")
    if sum(r.mask) != r.generated_tokens:
        raise AssertionError("masked-in tokens differ from the generated-token count")


class TokenPolicy:
    """A causal LM and its tokenizer, sampling batches of token sequences with log-probs
    through a rollout engine (:mod:`kgsynth.agent.engines`: ``hf`` by default)."""

    def __init__(self, model: Any, tokenizer: Any, engine: RolloutEngine | None = None) -> None:
        self.model = model
        self.tok = tokenizer
        # what samples the tokens: generate on the model itself unless another engine is given
        self.engine: RolloutEngine = engine if engine is not None else HFEngine(model, tokenizer)
        eos = tokenizer.eos_token_id
        self.eos_ids = {eos} if eos is not None else set()
        # Stop tokens when the protocol's closing tags are single tokens (the tiny tokenizer,
        # models with added tags); otherwise stop strings.
        self.stop_at(STOP_SEQUENCES)

    def stop_at(self, sequences: Sequence[str]) -> None:
        """End a turn at any of ``sequences`` (a turn format's closing tags): as stop ids when
        every one is a single token, else as stop strings."""
        single = [self.tok.convert_tokens_to_ids(s) for s in sequences]
        unk = self.tok.unk_token_id
        self.stop_ids = {i for i in single if isinstance(i, int) and i != unk and i >= 0}
        self.stop_strings = [] if len(self.stop_ids) == len(sequences) else list(sequences)

    def chat(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return chat_text(self.tok, messages, generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode(self.chat(messages, generation_prompt=True))

    @functools.cached_property
    def _segments(self) -> tuple[str, str, str, str]:
        """The template's fixed text around turns, found once by rendering sentinels:
        (end of an assistant turn, start of a user turn, end of a user turn, start of an
        assistant turn)."""
        user = "\x1eUSER-TURN\x1e"
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL}]
        closed = self.chat(base, generation_prompt=False)
        with_user = self.chat([*base, {"role": "user", "content": user}], True)
        first = self.chat(base[:1], generation_prompt=False)
        opening = self.chat(base[:1], generation_prompt=True)[len(first) :]
        if not with_user.startswith(closed) or with_user[len(closed) :].count(user) != 1:
            raise ValueError("the chat template does not render conversations turn by turn")
        user_open, rest = with_user[len(closed) :].split(user)
        if not rest.endswith(opening):
            raise ValueError("the chat template does not open an assistant turn after a user turn")
        tail = closed[closed.rindex(_SENTINEL) + len(_SENTINEL) :]
        return tail, user_open, rest[: len(rest) - len(opening)], opening

    def turn_suffix(self, user_texts: Sequence[str], ended_with_eos: bool) -> str:
        """Text that closes an assistant turn, then the given ``user`` turns, then opens the
        next assistant turn. When the policy already sampled the end-of-turn token, that
        token's text is left out."""
        tail, user_open, user_close, opening = self._segments
        eos = self.tok.eos_token or ""
        if ended_with_eos and tail.startswith(eos):
            tail = tail[len(eos) :]
        return tail + "".join(user_open + t + user_close for t in user_texts) + opening

    def sample(
        self,
        batch: Sequence[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
    ) -> list[tuple[list[int], list[float], bool]]:
        """One turn for each sequence, sampled by the engine: (new ids, their log-probs, ended
        on end-of-turn). A turn ends at an end-of-turn or stop token, or at the first token
        after which the text ends with a stop string, whichever comes first."""
        params = SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop_ids=frozenset(self.eos_ids | self.stop_ids),
            stop_strings=tuple(self.stop_strings),
        )
        results = []
        for c in self.engine.generate(batch, params):
            toks, lps = c.ids, c.logprobs
            if self.stop_strings:
                for j in range(len(toks)):
                    if toks[j] not in params.stop_ids and self._ends_with_stop(toks[: j + 1]):
                        toks, lps = toks[: j + 1], lps[: j + 1]
                        break
            results.append((list(toks), list(lps), bool(toks) and toks[-1] in self.eos_ids))
        return results

    def refresh(self) -> None:
        """After an optimizer update: the engine takes the policy's new weights."""
        self.engine.refresh(self.model)

    def _ends_with_stop(self, toks: list[int]) -> bool:
        tail = self.tok.decode(toks[-8:], skip_special_tokens=False)
        return any(tail.endswith(s) for s in self.stop_strings)

    def cap_observation(self, text: str, max_tokens: int) -> tuple[str, bool]:
        """The observation text cut to ``max_tokens`` tokens, with a visible marker."""
        ids = self.encode(text)
        if len(ids) <= max_tokens:
            return text, False
        return self.tok.decode(ids[:max_tokens], skip_special_tokens=True) + TRUNCATION_MARK, True


class TokenTurns:
    """:class:`TokenPolicy` as the loop's turn policy: each episode's state is its
    :class:`Rollout`; sampled tokens are appended with their log-probs, the environment's
    reply as tokens the loss masks out."""

    def __init__(self, policy: TokenPolicy, cfg: RolloutConfig, batch_size: int = 64) -> None:
        self.policy = policy
        self.cfg = cfg
        self.batch_size = batch_size
        # a turn format that names the closing tags a sampled turn ends at (the sexpr space's
        # </action> and </answer>); the others end at STOP_SEQUENCES or end-of-turn
        stops = getattr(space(cfg.toolset).turns, "token_stop_sequences", None)
        if stops:
            policy.stop_at(stops)

    def begin(self, episode: Episode) -> Rollout:
        prompt = self.policy.prompt_ids(episode.messages)
        n = len(prompt)
        return Rollout(episode, list(prompt), [0] * n, [0.0] * n, [-1] * n, n)

    def generate(self, live: Sequence[LiveEpisode], turn: int) -> list[Generated]:
        sampled = self.policy.sample(
            [s.state.ids for s in live],
            max_new_tokens=self.cfg.max_turn_tokens,
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
        )
        out = []
        for s, (toks, lps, eos_end) in zip(live, sampled, strict=True):
            s.state.append(toks, lps, turn)
            text = self.policy.tok.decode(toks, skip_special_tokens=True)
            out.append(Generated(text, None, len(toks), sampled=eos_end))
        return out

    def observe(
        self, live: LiveEpisode, generated: Generated, reply: dict[str, str], turn: int
    ) -> None:
        r: Rollout = live.state
        content, cut = self.policy.cap_observation(reply["content"], self.cfg.max_obs_tokens)
        if cut:
            r.truncated_observations += 1
            reply["content"] = content + (INFO_CLOSE if content.startswith(INFO_OPEN) else "")
        # before the forced final answer, the environment also asks for it
        last = turn + 1 == self.cfg.max_turns
        users = [reply["content"]] + (
            [space(self.cfg.toolset).turns.final_answer_prompt] if last else []
        )
        suffix = self.policy.turn_suffix(users, ended_with_eos=generated.sampled)
        r.append(self.policy.encode(suffix), None, turn)


def run_rollouts(
    policy: TokenPolicy,
    tasks: Sequence[EpisodeTask],
    make_env: Callable[[EpisodeTask], ToolEnvironment],
    cfg: RolloutConfig,
    *,
    seed: int | None = None,
    batch_size: int = 64,
    on_turn: Callable[[int, int], None] | None = None,
) -> list[Rollout]:
    """:func:`~kgsynth.agent.loop.run_turns` with a local model in token space: every task to
    an answer, the turn limit (then one forced answer) or its timeout. Live episodes are
    sampled together, ``batch_size`` sequences per ``generate`` call."""
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    live = run_turns(
        TokenTurns(policy, cfg, batch_size),
        tasks,
        make_env,
        system_text=agent_system_prompt(cfg),
        max_turns=cfg.max_turns,
        timeout_s=cfg.timeout_s,
        on_turn=on_turn,
    )
    rollouts = [s.state for s in live]
    for r in rollouts:
        r.timed_out = r.episode.timed_out
    return rollouts


__all__ = [
    "Rollout",
    "RolloutConfig",
    "TokenPolicy",
    "TokenTurns",
    "check_alignment",
    "run_rollouts",
]
