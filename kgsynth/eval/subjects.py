"""The eval stage: every subject (what is evaluated: the model as a KG agent, and the
baselines) answers the questions; its predictions are scored and aggregated (:func:`run`, the
stage contract of :mod:`kgsynth.core.stage`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError, LLMFailuresError
from kgsynth.core.modelio import is_model_folder
from kgsynth.core.stage import StageResult
from kgsynth.datasets.qafiles import QARecord
from kgsynth.eval.checkpoints import untrained_model
from kgsynth.eval.config import MODEL_SUBJECT, NO_TOOLS_SUBJECT, EvalConfig
from kgsynth.eval.episodes import EvalProgress, run_agent, run_no_tools
from kgsynth.eval.scoring import summarize
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM


@dataclass(frozen=True)
class Subject:
    """One subject of the evaluation: its name in the outputs (their ``system`` column:
    ``model``, ``untrained``, ``no-tools``), the model it runs, and whether it acts through the
    KG tools."""

    name: str
    model: str
    tools: bool


def plan_subjects(model: str, backend: str, cfg: EvalConfig) -> list[Subject]:
    """What to evaluate: the model as an agent, then each baseline ``cfg`` asks for. The
    untrained model is ``cfg.baseline_model``, else found through the checkpoint's
    ``start_from`` chain."""
    if backend == "hf" and not is_model_folder(model):
        raise ConfigError(
            f"--model: {model} is not a transformers checkpoint folder (no config.json)"
        )
    plan = [Subject(MODEL_SUBJECT, model, True)]
    if "untrained" in cfg.baseline:
        if cfg.baseline_model:
            untrained = cfg.baseline_model
        elif backend == "openai":
            raise ConfigError(
                "--baseline untrained with --llm openai needs --baseline-model NAME "
                "(the base model's name on the same server)"
            )
        else:
            untrained = str(untrained_model(model))
        plan.append(Subject("untrained", untrained, True))
    if NO_TOOLS_SUBJECT in cfg.baseline:
        plan.append(Subject(NO_TOOLS_SUBJECT, model, False))
    return plan


def evaluate(
    records: Sequence[QARecord],
    llm: LLM,
    graph: KGGraph | None,
    cfg: EvalConfig,
    *,
    system: str = MODEL_SUBJECT,
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
    metrics["tools"] = cfg.agent.toolset if tools else None
    return rows, metrics


def run(
    questions: Sequence[QARecord],
    cfg: EvalConfig,
    *,
    graph: KGGraph,
    llm: Mapping[str, LLM],
    progress: EvalProgress | None = None,
) -> StageResult[list[dict[str, Any]]]:
    """Evaluate each system of ``llm`` (system name -> its client, the ``model`` system first;
    ``no-tools`` answers without the tools) on ``questions``. ``accepted`` holds every
    prediction row (``predictions.parquet``); ``stats`` the model's metrics with the
    configuration, the KG and each baseline's metrics (``metrics.json`` without its label and
    question file). ``progress`` counts the predictions of all systems together; its ``info``
    names the system."""
    per_system = len(questions) * cfg.runs
    rows: list[dict[str, Any]] = []
    results: dict[str, dict[str, Any]] = {}
    for i, (system, client) in enumerate(llm.items()):

        def on_progress(done: int, total: int, info: str, i: int = i, system: str = system) -> None:
            if progress:
                progress(i * per_system + done, len(llm) * per_system, f"{system}: {info}")

        tools = system != NO_TOOLS_SUBJECT
        system_rows, metrics = evaluate(
            questions,
            client,
            graph if tools else None,
            cfg,
            system=system,
            tools=tools,
            progress=on_progress,
        )
        rows.extend(system_rows)
        results[system] = metrics
    main = results.pop(MODEL_SUBJECT)
    stats = {
        "config": cfg.recorded(),
        "kg": graph.kg.describe(),
        **main,
        "baselines": results,
    }
    if cfg.greedy_repeats:
        stats["note"] = "several runs at temperature 0: greedy runs of a local model agree"
    return StageResult(accepted=rows, stats=stats)


def check_answered(
    rows: Sequence[dict[str, Any]],
    subjects: Sequence[Subject],
    clients: Mapping[str, LLM],
    out_dir: Path,
) -> None:
    """Raise :class:`LLMFailuresError` when every prediction of a subject ended on an LLM error
    (an unreachable server, a request the server refuses): its scores of 0 would read as
    answers that were all wrong. Called after the outputs were written; they stay, for
    inspection. ``clients``: model -> its client, for the first error and the server."""
    problems = []
    for subject in subjects:
        own = [r for r in rows if r["system"] == subject.name]
        if not own or any(not r["llm_errors"] for r in own):
            continue
        questions = len({r["question_id"] for r in own})
        runs = len({r["run"] for r in own})
        what = f"all {questions} questions failed" + (f" in all {runs} runs" if runs > 1 else "")
        if subject.name != MODEL_SUBJECT:
            what = f"the {subject.name} baseline: {what}"
        problems.append(f"{what} ({clients[subject.model].failure_note()})")
    if problems:
        raise LLMFailuresError(
            f"eval: {'; '.join(problems)}; nothing scored (the predictions and metrics in "
            f"{out_dir} are kept for inspection)"
        )
