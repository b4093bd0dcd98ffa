"""The LLM layer: one interface, three backends (openai, hf, template), a persistent cache.

``make_llm("template")``, ``make_llm("openai", model=…, base_url=…)``,
``make_llm("hf", model="runs/…/stage1")``; pass ``cache=path`` to wrap it in :class:`CachedLLM`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError
from kgsynth.llm.base import LLM, Completion, GenerationParams, Request
from kgsynth.llm.cache import CachedLLM

BACKENDS = ("openai", "hf", "template")


def make_llm(backend: str, *, cache: str | Path | None = None, **options: Any) -> LLM:
    """Build a backend by name; unknown names and missing options are :class:`ConfigError`."""
    if backend == "template":
        from kgsynth.llm.template import TemplateLLM

        llm: LLM = TemplateLLM()
    elif backend == "openai":
        from kgsynth.llm.openai_backend import OpenAILLM

        if not options.get("model"):
            raise ConfigError("--model: the openai backend needs a model name")
        llm = OpenAILLM(
            options["model"],
            **{
                k: v
                for k, v in options.items()
                if k not in ("model", "device", "batch_size", "workers", "base_model")
                and v is not None
            },
        )
    elif backend == "hf":
        from kgsynth.llm.hf_backend import HFLLM

        if not options.get("model"):
            raise ConfigError("--model: the hf backend needs a checkpoint folder")
        llm = HFLLM(
            options["model"],
            **{
                k: v
                for k, v in options.items()
                if k in ("device", "batch_size", "workers", "base_model") and v is not None
            },
        )
    else:
        raise ConfigError(f"--llm: unknown backend {backend!r}; choose {', '.join(BACKENDS)}")
    return CachedLLM(llm, cache) if cache else llm


__all__ = ["BACKENDS", "LLM", "CachedLLM", "Completion", "GenerationParams", "Request", "make_llm"]
