"""One system under test evaluated: its predictions scored and aggregated, with its speed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kgsynth.eval.config import MODEL_SYSTEM, EvalConfig
from kgsynth.eval.episodes import EvalProgress, run_agent, run_no_tools
from kgsynth.eval.scoring import summarize
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM
from kgsynth.qafiles import QARecord


def evaluate(
    records: Sequence[QARecord],
    llm: LLM,
    graph: KGGraph | None,
    cfg: EvalConfig,
    *,
    system: str = MODEL_SYSTEM,
    tools: bool = True,
    progress: EvalProgress | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Answer ``records`` with ``llm`` (as a KG agent over ``graph``, or without tools when
    ``tools`` is False), score, aggregate; returns (prediction rows, metrics)."""
    if tools and graph is None:
        raise ValueError("the agent needs a graph")
    started = time.perf_counter()
    if tools:
        rows = run_agent(records, llm, graph, cfg, system=system, progress=progress)  # type: ignore[arg-type]
    else:
        rows = run_no_tools(records, llm, cfg, system=system, progress=progress)
    elapsed = time.perf_counter() - started
    metrics = summarize(rows)
    tokens = sum(r["generated_tokens"] for r in rows)
    metrics["speed"] = {
        "elapsed_s": round(elapsed, 3),
        # (question, run) predictions per second of wall time, tools and KG included
        "questions_per_s": round(len(rows) / elapsed, 3) if elapsed > 0 else None,
        "generated_tokens_per_s": round(tokens / elapsed, 1) if elapsed > 0 else None,
    }
    metrics["system"] = system
    metrics["model"] = llm.model
    metrics["backend"] = llm.backend
    metrics["tools"] = cfg.toolset if tools else None
    return rows, metrics
