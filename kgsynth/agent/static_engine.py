"""The ``static`` rollout engine: batched decoding of a small Llama policy on its live weights,
with a preallocated KV cache and a prefix cache kept across an episode's turns.

``kgsynth train rl --rollout-engine static``. It keeps the contract of
:mod:`kgsynth.agent.engines` (token ids in; ids and their log-probs at the sampling
temperature out) and samples as the ``hf`` engine does (same processors, same RNG draws), but
each decode step is one fixed-shape forward that writes into a preallocated cache (and, unless
``exact_rng``, draws its tokens from the same distribution with other random numbers), and a
turn's prompt that extends an earlier sequence (the episode so far: prompt, sampled turn,
observation, next header) prefills only its new tokens
(:class:`~kgsynth.llm.static_decode.StaticDecoder`). For Llama-architecture policies (the tiny
model); any other architecture is refused in one line naming the engines that run it.

    engine = StaticEngine(model, tokenizer)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=64, temperature=1.0))
    engine.refresh(model)  # after each optimizer update: the stored prefixes are dropped
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kgsynth.agent.engine_api import Completion, SamplingParams
from kgsynth.llm.static_decode import DecodeParams, StaticDecoder


class StaticEngine:
    """Batched KV-cache decoding on the policy module's own weights (no copy to refresh).
    ``exact_rng``: draw as ``generate`` draws (``torch.multinomial``: from a seed, the hf
    engine's very tokens), else a ten times cheaper draw from the same distribution."""

    name = "static"

    def __init__(
        self, model: Any, tokenizer: Any, *, cache_bytes: int = 1 << 30, exact_rng: bool = False
    ) -> None:
        self.model = model
        self.tok = tokenizer
        self.decoder = StaticDecoder(model, tokenizer, cache_bytes=cache_bytes, exact_rng=exact_rng)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]:
        """One completion per prompt, sampled together; the torch global RNG."""
        decoded = self.decoder.generate(
            prompts,
            DecodeParams(
                max_new_tokens=params.max_new_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                stop_ids=params.stop_ids,
                stop_strings=params.stop_strings,
            ),
        )
        return [Completion(d.ids, d.logprobs) for d in decoded]

    def refresh(self, model: Any) -> None:
        """After an optimizer update: the weights are read live at each call; the keys and
        values stored from the old weights are dropped."""
        if model is not self.model:
            raise ValueError("the static engine samples from the policy module it was built with")
        self.decoder.weights_changed()


__all__ = ["StaticEngine"]
