"""The LLM interface every stage uses: ``generate(messages, **params)`` and batches of it.

Three backends implement it — ``openai`` (any OpenAI-compatible server), ``hf`` (a local
transformers checkpoint) and ``template`` (offline, rule-based) — and :class:`CachedLLM` wraps
any of them with a persistent request cache.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

Message = dict[str, str]


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters; part of the cache key."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stop"] = list(self.stop)
        return data


@dataclass(frozen=True)
class Request:
    """One generation request. ``task`` and ``context`` carry the structured row for the
    template backend (the other backends read only ``messages``); they are not in the cache
    key unless the backend says so."""

    messages: tuple[tuple[str, str], ...]
    params: GenerationParams = field(default_factory=GenerationParams)
    task: str | None = None
    context: str | None = None  # JSON text of the structured row, for the template backend

    @classmethod
    def make(
        cls,
        messages: Sequence[Message],
        params: GenerationParams | None = None,
        *,
        task: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> Request:
        return cls(
            tuple((m["role"], m["content"]) for m in messages),
            params or GenerationParams(),
            task,
            json.dumps(context, sort_keys=True, default=str) if context is not None else None,
        )

    def message_dicts(self) -> list[Message]:
        return [{"role": r, "content": c} for r, c in self.messages]

    def context_dict(self) -> dict[str, Any]:
        return json.loads(self.context) if self.context else {}


@dataclass
class Completion:
    """What came back: the text (empty on error), why it stopped, token usage, whether it came
    from the cache, and the error after all retries, if any."""

    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class LLMStats:
    """What a client did. ``first_error`` keeps the first failure's text, so that a stage whose
    every request failed can say why in its one line (and its manifest records it)."""

    requests: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    errors: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_error: str | None = None

    def add(self, c: Completion) -> None:
        self.requests += 1
        self.errors += c.error is not None
        if c.error is not None and self.first_error is None:
            self.first_error = c.error
        self.prompt_tokens += c.prompt_tokens
        self.completion_tokens += c.completion_tokens


# Called as each completion arrives: (index in the batch, completion).
ProgressFn = Callable[[int, Completion], None]


class LLM(abc.ABC):
    """A text generator behind one of the backends."""

    backend: str = "?"
    model: str = "?"

    def __init__(self) -> None:
        self.stats = LLMStats()

    @property
    def key_fields(self) -> dict[str, Any]:
        """What identifies this generator in cache keys and manifests."""
        return {"backend": self.backend, "model": self.model}

    @property
    def cache_fields(self) -> dict[str, Any]:
        """What identifies this generator in cache keys (by default :attr:`key_fields`)."""
        return self.key_fields

    def uses_context(self) -> bool:
        """True when outputs depend on ``Request.task/context`` (the template backend)."""
        return False

    @abc.abstractmethod
    def generate_batch(
        self, requests: Sequence[Request], progress: ProgressFn | None = None
    ) -> list[Completion]:
        """Completions for ``requests``, in order; failures come back as ``error`` results."""

    def generate(self, messages: Sequence[Message], **params: Any) -> Completion:
        """One completion for ``messages`` (``params`` are :class:`GenerationParams` fields)."""
        task = params.pop("task", None)
        context = params.pop("context", None)
        if "stop" in params and params["stop"] is not None:
            params["stop"] = tuple(params["stop"])
        request = Request.make(messages, GenerationParams(**params), task=task, context=context)
        return self.generate_batch([request])[0]

    def describe(self) -> dict[str, Any]:
        return {**self.key_fields, "stats": asdict(self.stats)}

    def failure_note(self) -> str:
        """Why requests failed, for a one-line message: the first error, and where the server
        is when the backend has one (its base URL, credentials redacted)."""
        error = self.stats.first_error or "no reason given"
        where = self.key_fields.get("base_url")
        return f"LLM error at {where}: {error}" if where else f"LLM error: {error}"

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients or models."""
