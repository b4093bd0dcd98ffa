"""The subjects (what is evaluated) answering the questions: the policy as a KG agent
(:func:`run_agent`, the same loop, tools, limits and system prompt as trajectory synthesis and
RL) and the policy alone without tools (:func:`run_no_tools`); one scored prediction row per
question and run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kgsynth.agent.loop import (
    Episode,
    EpisodeTask,
    episode_summary,
    run_episodes,
    user_prompt,
)
from kgsynth.agent.protocol import TaggedFormat
from kgsynth.agent.rerank import LLMReranker
from kgsynth.agent.tools import ToolEnvironment, prime_relation_ranking
from kgsynth.datasets.qafiles import QARecord
from kgsynth.eval.config import MODEL_SUBJECT, EvalConfig, question_id
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM, Completion, GenerationParams, Request
from kgsynth.metrics import score

# The no-tools baseline asks for the answer directly, in the same answer format as the agent.
NO_TOOLS_SYSTEM_PROMPT = (
    "Answer the question from your own knowledge; no tools are available. "
    "Think briefly inside <think></think>, then give every answer entity as a JSON list of "
    'strings inside <answer></answer>, for example <answer>["A", "B"]</answer>.'
)

# (done, total, info) as episodes finish.
EvalProgress = Callable[[int, int, str], None]

# a no-tools answer is read in the <think>/<answer> turn format
_ANSWER_FORMAT = TaggedFormat()


def _row(
    rec: QARecord, run: int, system: str, model: str, predicted: list[str], **fields: Any
) -> dict[str, Any]:
    # benchmark answers also match by id and alias (kgsynth.metrics.match_predictions)
    s = score(predicted, rec.answer_names, gold_ids=rec.answer_ids, aliases=rec.aliases)
    return {
        "system": system,
        "model": model,
        "question_id": question_id(rec),
        "line": rec.line,
        "run": run,
        "question": rec.question,
        "topic_names": list(rec.topic_names),
        "gold": list(rec.answer_names),
        "predicted": list(predicted),
        "em_strict": s.em_strict,
        "hit": s.hit,
        "f1": s.f1,
        "hits_at_1": s.hits_at_1,
        "rhits_at_1": s.rhits_at_1,
        "precision": s.precision,
        "recall": s.recall,
        "hops": rec.hops,
        "qtype": rec.qtype,
        "structure": rec.structure,
        # for summarize's majority vote and union; not columns of predictions.parquet
        "gold_ids": list(rec.answer_ids),
        "gold_aliases": [list(a) for a in rec.aliases],
        **fields,
    }


def _episode_fields(ep: Episode, tokens: int) -> dict[str, Any]:
    summary = episode_summary(ep)
    return {
        "answered": summary["answered"],
        "forced_answer": summary["forced_answer"],
        "num_turns": summary["num_turns"],
        "tool_errors": summary["tool_errors"],
        "format_errors": summary["format_errors"],
        "llm_errors": sum(1 for t in ep.turns if t.llm_error),
        "generated_tokens": tokens,
        "resamples": ep.resamples,
        "tool_calls": summary["tool_calls"],
        "messages": summary["messages"],
        "turns": summary["turns"],
    }


def topic_names(rec: QARecord, graph: KGGraph) -> list[str]:
    """The topic entities the agent is given: the record's names, or, for a benchmark that
    gives its topics by id only (CWQ), their names in the KG (an id the KG does not name is
    left out)."""
    if rec.topic_names or not rec.topic_ids:
        return list(rec.topic_names)
    names = (graph.label(graph.profile.entity_iri(tid)) for tid in rec.topic_ids)
    return [name for name in names if name]


def run_agent(
    records: Sequence[QARecord],
    llm: LLM,
    graph: KGGraph,
    cfg: EvalConfig,
    *,
    system: str = MODEL_SUBJECT,
    progress: EvalProgress | None = None,
) -> list[dict[str, Any]]:
    """Prediction rows of the agent: every question ``cfg.runs`` times, through the KG tools."""
    n, total = len(records), len(records) * cfg.runs
    rows: list[dict[str, Any]] = []
    tasks = [EpisodeTask(rec.question, topic_names(rec, graph)) for rec in records]
    index = {id(t): i for i, t in enumerate(tasks)}

    reranker = LLMReranker(llm) if cfg.agent.rerank == "llm" else None
    prime_relation_ranking(cfg.tool_config(), (rec.question for rec in records))

    def make_env(task: EpisodeTask) -> ToolEnvironment:
        # a fresh environment per episode: the question ranks the relations shown
        question = records[index[id(task)]].question
        return ToolEnvironment(
            graph, question, cfg.tool_config(), reranker, topics=task.topic_names
        )

    for run in range(cfg.runs):

        def on_turn(turn: int, active: int, run: int = run) -> None:
            if progress:
                progress(run * n + n - active, total, f"run {run + 1}/{cfg.runs}, turn {turn}")

        episodes = run_episodes(
            llm,
            tasks,
            make_env,
            toolset=cfg.agent.toolset,
            max_turns=cfg.agent.max_turns,
            params=cfg.params(run),
            on_turn=on_turn,
            system_text=cfg.agent.system_text,
            resample_cut_turns=cfg.agent.resample_cut_turns,
            resample_temperature=cfg.agent.resample_temperature,
        )
        for rec, ep in zip(records, episodes, strict=True):
            fields = _episode_fields(ep, ep.generated_tokens)
            rows.append(_row(rec, run, system, llm.model, ep.predicted_answers, **fields))
        if progress:
            progress((run + 1) * n, total, f"run {run + 1}/{cfg.runs} done")
    return rows


def run_no_tools(
    records: Sequence[QARecord],
    llm: LLM,
    cfg: EvalConfig,
    *,
    system: str = "no-tools",
    progress: EvalProgress | None = None,
) -> list[dict[str, Any]]:
    """Prediction rows of the LLM-only baseline: one generation per question and run asking for
    ``<answer>[...]</answer>`` directly, no tools; scored like the agent."""
    n, total = len(records), len(records) * cfg.runs
    rows: list[dict[str, Any]] = []
    for run in range(cfg.runs):
        base = cfg.params(run)
        params = GenerationParams(
            temperature=base.temperature,
            top_p=base.top_p,
            max_tokens=base.max_tokens,
            stop=("</answer>",),
            seed=base.seed,
        )
        prompts = [
            [
                {"role": "system", "content": NO_TOOLS_SYSTEM_PROMPT},
                {"role": "user", "content": user_prompt(rec.question, rec.topic_names)},
            ]
            for rec in records
        ]
        requests = [Request.make(p, params, task="no_tools_answer") for p in prompts]

        def on_done(i: int, c: Completion, run: int = run) -> None:
            if progress:
                progress(run * n + i + 1, total, f"run {run + 1}/{cfg.runs}")

        completions = llm.generate_batch(requests, on_done)
        for rec, messages, comp in zip(records, prompts, completions, strict=True):
            predicted: list[str] = []
            answered = False
            format_errors = 0
            stored = list(messages)
            if comp.ok:
                text = _ANSWER_FORMAT.close_action(comp.text)
                stored.append({"role": "assistant", "content": text})
                turn = _ANSWER_FORMAT.parse_turn(text)
                answered = turn.answer is not None
                predicted = turn.answer or []
                format_errors = int(turn.format_error is not None or not answered)
            rows.append(
                _row(
                    rec,
                    run,
                    system,
                    llm.model,
                    predicted,
                    answered=answered,
                    forced_answer=False,
                    num_turns=int(comp.ok),
                    tool_errors=0,
                    format_errors=format_errors,
                    llm_errors=int(not comp.ok),
                    generated_tokens=comp.completion_tokens,
                    tool_calls=[],
                    messages=stored,
                    turns=[],
                )
            )
        if progress:
            progress((run + 1) * n, total, f"run {run + 1}/{cfg.runs} done")
    return rows
