"""What every rollout engine is given and gives back (:mod:`kgsynth.agent.engines` holds the
engines and re-exports these): the sampling settings of a turn, a completion, the engine
protocol, and the error of an engine that cannot run here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class EngineUnavailable(RuntimeError):
    """The engine cannot run here (its package is missing, or there is no CUDA GPU)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn: at most ``max_new_tokens``, at ``temperature`` (> 0) with
    nucleus ``top_p``; stop after any of ``stop_ids`` (or once the text ends with one of
    ``stop_strings``)."""

    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    stop_strings: tuple[str, ...] = ()


@dataclass
class Completion:
    """The sampled token ids of one prompt and the log-prob of each."""

    ids: list[int]
    logprobs: list[float]


class RolloutEngine(Protocol):
    """Samples batches of token sequences; :meth:`refresh` after each optimizer update."""

    name: str

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]: ...

    def refresh(self, model: Any) -> None: ...
