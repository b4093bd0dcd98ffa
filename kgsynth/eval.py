"""``kgsynth eval``: benchmark questions + a policy + a KG -> predictions and metrics.

The policy (a local checkpoint through the ``hf`` backend, or a model behind an
OpenAI-compatible API) answers every question as a KG agent — the same loop, tools, limits and
system prompt as trajectory synthesis and RL (:func:`kgsynth.agent.loop.run_episodes`) —
``runs`` times (run ``r`` samples with seed ``seed + r``). Each prediction is scored with the
shared answer metrics (:mod:`kgsynth.metrics`: ``em_strict``, ``hit``, set ``f1``,
``hits_at_1``, ``rhits_at_1``, precision and recall, each defined there) and the runs are
aggregated (:func:`summarize`):

- ``overall``: the mean over every (question, run) prediction; ``per_run`` one entry per run,
  ``std_over_runs`` the spread of the per-run means;
- ``ci95``: a 95 % confidence interval ``[lo, hi]`` of each overall shown metric (and the
  same inside each ``breakdowns["hops"]`` group), with the question as the unit: the Wilson
  score interval when every question scores 0 or 1 (one run of a binary metric, or runs that
  agree), else a percentile bootstrap resampling questions (each with all its runs; 2,000
  resamples, seed 0) — see :func:`kgsynth.metrics.mean_interval`; ``ci95_method`` says so;
- ``first_run``: run 0 alone;
- ``majority``: per question, the most frequent normalized answer set among the runs (runs
  without an answer do not vote; a tie goes to the set that appears first, in run order);
- ``union``: per question, the union of all runs' answers — what KG-R1 reports as its
  "N runs" result; labelled ``KG-R1 N runs (union)``, never as a score of one run. The union
  has no first answer, so its ``hits_at_1`` is KG-R1's N-run Hits@1: some answer of some run
  is gold (union ["X", "A"] against gold {A, B} scores 1);
- ``pass_at_k``: the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` from ``n`` runs of which
  ``c`` are correct by ``hit`` (``pass_at_k_metric``), averaged over questions, for
  k = 1, 2, 4, … ≤ n and k = n;
- ``breakdowns`` by ``hops``, ``qtype`` and ``structure`` (those the questions carry);
- ``process``: assistant turns, tool errors, format errors, LLM errors and generated tokens
  (the backend's completion-token counts) per prediction, and answered / forced-answer rates.

Baselines use the same scoring: another model as the agent (``--baseline untrained``, the model a
checkpoint was trained from, found through the ``start_from`` chain of the training
manifests), or the evaluated model answering from its own knowledge with no tools
(``no-tools``: one generation per question and run). :func:`compare_runs` puts several
``metrics.json`` side by side (``kgsynth eval --compare``).

Usage::

    records = read_questions("data/metaqa/dev_sample/metaqa_dev_sample.jsonl")
    rows, metrics = evaluate(records, make_llm("hf", model="runs/x/stage1"), KGGraph(kg), EvalConfig(runs=3, temperature=1.0))
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgsynth.agent.loop import (
    Episode,
    EpisodeTask,
    close_action,
    episode_summary,
    run_episodes,
    user_prompt,
)
from kgsynth.agent.protocol import parse_turn
from kgsynth.agent.rerank import LLMReranker
from kgsynth.agent.tools import (
    RELATION_RANKINGS,
    RERANK_MODES,
    ToolConfig,
    ToolEnvironment,
    prime_relation_ranking,
)
from kgsynth.errors import ConfigError, InputFileError
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM, Completion, GenerationParams, Request
from kgsynth.metrics import answer_set, mean_interval, normalize_answer, score
from kgsynth.modelio import is_model_folder
from kgsynth.qafiles import QARecord
from kgsynth.schema import PREDICTION_SCHEMA

log = logging.getLogger(__name__)

METRICS = ("em_strict", "hit", "f1", "hits_at_1", "rhits_at_1", "precision", "recall")
SHOWN_METRICS = ("em_strict", "hit", "f1", "hits_at_1", "rhits_at_1")
METRIC_NAMES = {
    "em_strict": "EM (strict)",
    "hit": "Hit",
    "f1": "F1",
    "hits_at_1": "Hits@1",
    "rhits_at_1": "RHits@1",
}
PASS_METRIC = "hit"  # a run counts as correct for pass@k when some answer is gold
UNION_LABEL = "KG-R1 N runs (union)"
BREAKDOWNS = ("hops", "qtype", "structure")
BASELINES = ("untrained", "no-tools")
MODEL_SYSTEM = "model"
CI_LEVEL = 0.95
CI_RESAMPLES = 2000
CI_SEED = 0
METRIC_LEGEND = (
    "EM (strict): the predicted set equals the gold set; Hit: some predicted answer is gold "
    "(KnowCoder-A1's and GraphWalker's EM, KG-R1's and ISP's Hit); Hits@1: the first predicted "
    "answer is gold; RHits@1: the share of predicted answers that are gold (KnowCoder-A1's "
    "random pick, as its expected value); F1: set F1."
)
CI_METHOD = (
    "Wilson score interval over questions where every question scores 0 or 1, else "
    f"percentile bootstrap over questions with all their runs ({CI_RESAMPLES} resamples, "
    f"seed {CI_SEED})"
)

# The no-tools baseline asks for the answer directly, in the same answer format as the agent.
NO_TOOLS_SYSTEM_PROMPT = (
    "You answer questions about movies from your own knowledge; no tools are available. "
    "Think briefly inside <think></think>, then give every answer entity as a JSON list of "
    'strings inside <answer></answer>, for example <answer>["A", "B"]</answer>.'
)

# (done, total, info) as episodes finish.
EvalProgress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class EvalConfig:
    """Options of ``kgsynth eval`` (the agent's limits match synthesis and RL by default)."""

    runs: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_turns: int = 10
    max_tokens: int = 512
    toolset: str = "graphwalker"
    top_k_relations: int = 10
    max_triples: int = 5
    rerank: str = "none"  # none | llm: GraphWalker's LLM rerank of the BM25 top-20 relations
    relation_ranking: str = "bm25"  # bm25 | hybrid: BM25 plus sentence-encoder similarity
    report_to: str = "none"  # none | tensorboard | wandb: the summary metrics (kgsynth.tracking)
    seed: int = 0
    system_text: str | None = None  # the checkpoint's stored system prompt (hf), if any

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ConfigError(f"--runs must be >= 1 (got {self.runs})")
        if not 0.0 <= self.temperature <= 5.0:
            raise ConfigError(f"--temperature must be in [0, 5] (got {self.temperature})")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if self.max_turns < 1 or self.max_tokens < 1:
            raise ConfigError(
                f"--max-turns and --max-tokens must be >= 1 (got {self.max_turns}, {self.max_tokens})"
            )
        if self.toolset not in ("graphwalker", "kgr1"):
            raise ConfigError(f"--tools must be graphwalker or kgr1 (got {self.toolset!r})")
        if self.rerank not in RERANK_MODES:
            raise ConfigError(f"--rerank must be none or llm (got {self.rerank!r})")
        from kgsynth.tracking import check_report_to

        check_report_to(self.report_to)
        if self.relation_ranking not in RELATION_RANKINGS:
            raise ConfigError(
                f"--relation-ranking must be bm25 or hybrid (got {self.relation_ranking!r})"
            )
        if self.top_k_relations < 1 or self.max_triples < 1:
            raise ConfigError("--top-k-relations and --max-triples must be >= 1")

    def tool_config(self) -> ToolConfig:
        return ToolConfig(
            toolset=self.toolset,  # type: ignore[arg-type]
            top_k_relations=self.top_k_relations,
            max_triples_per_relation=self.max_triples,
            rerank=self.rerank,  # type: ignore[arg-type]
            relation_ranking=self.relation_ranking,  # type: ignore[arg-type]
        )

    def params(self, run: int) -> GenerationParams:
        """Sampling parameters of run ``run``: its own seed, so N runs are N samples."""
        return GenerationParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            seed=self.seed + run,
        )


def check_records(records: Sequence[QARecord], path: str | Path) -> None:
    """Fail on the first question that cannot be evaluated (no gold answer, no topic entity, a
    repeated ``question_id``), naming the file, line/row and field."""
    if not records:
        raise InputFileError(path, "holds no questions")
    first_line: dict[str, int] = {}
    for rec in records:
        qid = question_id(rec)
        if qid in first_line:
            raise InputFileError(
                path,
                f"field question_id {qid!r} repeats line {first_line[qid]}; runs are "
                "grouped by question_id, so each question needs its own",
                rec.line,
            )
        first_line[qid] = rec.line
        if not rec.answer_names:
            raise InputFileError(
                path, "field answer_names is empty; eval needs gold answers", rec.line
            )
        if not rec.topic_names:
            raise InputFileError(
                path,
                "field topic_names is missing or empty and the question has no [topic entity]; "
                "eval gives the agent its topic entities",
                rec.line,
            )


def question_id(rec: QARecord) -> str:
    return rec.question_id or f"line-{rec.line}"


def _row(
    rec: QARecord, run: int, system: str, model: str, predicted: list[str], **fields: Any
) -> dict[str, Any]:
    s = score(predicted, rec.answer_names)
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
        "tool_calls": summary["tool_calls"],
        "messages": summary["messages"],
        "turns": summary["turns"],
    }


def run_agent(
    records: Sequence[QARecord],
    llm: LLM,
    graph: KGGraph,
    cfg: EvalConfig,
    *,
    system: str = MODEL_SYSTEM,
    progress: EvalProgress | None = None,
) -> list[dict[str, Any]]:
    """Prediction rows of the agent: every question ``cfg.runs`` times, through the KG tools."""
    n, total = len(records), len(records) * cfg.runs
    rows: list[dict[str, Any]] = []
    tasks = [EpisodeTask(rec.question, list(rec.topic_names)) for rec in records]
    index = {id(t): i for i, t in enumerate(tasks)}

    reranker = LLMReranker(llm) if cfg.rerank == "llm" else None
    prime_relation_ranking(cfg.tool_config(), (rec.question for rec in records))

    def make_env(task: EpisodeTask) -> ToolEnvironment:
        # a fresh environment per episode: the question ranks the relations shown
        question = records[index[id(task)]].question
        return ToolEnvironment(graph, question, cfg.tool_config(), reranker)

    for run in range(cfg.runs):

        def on_turn(turn: int, active: int, run: int = run) -> None:
            if progress:
                progress(run * n + n - active, total, f"run {run + 1}/{cfg.runs}, turn {turn}")

        episodes = run_episodes(
            llm,
            tasks,
            make_env,
            toolset=cfg.toolset,
            max_turns=cfg.max_turns,
            params=cfg.params(run),
            on_turn=on_turn,
            system_text=cfg.system_text,
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
                text = close_action(comp.text)
                stored.append({"role": "assistant", "content": text})
                turn = parse_turn(text)
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


# --- aggregation (pure functions over prediction rows) -------------------------------------


def majority_choice(predictions: Sequence[Sequence[str]]) -> int:
    """Index of the run whose answer set wins the vote: the most frequent normalized set among
    the runs that answered; a tie goes to the first such run; 0 when no run answered."""
    keys = [frozenset(answer_set(p)) for p in predictions]
    counts = Counter(k for k in keys if k)
    if not counts:
        return 0
    best = max(counts.values())
    return next(i for i, k in enumerate(keys) if k and counts[k] == best)


def union_answers(predictions: Iterable[Sequence[str]]) -> list[str]:
    """All runs' answers, de-duplicated after normalization, in order of first appearance."""
    seen: set[str] = set()
    out: list[str] = []
    for pred in predictions:
        for answer in pred:
            key = normalize_answer(answer)
            if key and key not in seen:
                seen.add(key)
                out.append(answer)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_ks(runs: int) -> list[int]:
    """The k reported for ``runs`` runs: powers of two up to ``runs``, and ``runs`` itself."""
    ks = {1, runs}
    k = 2
    while k < runs:
        ks.add(k)
        k *= 2
    return sorted(ks)


def _mean(values: Iterable[float]) -> float:
    vals = list(values)
    return round(sum(vals) / len(vals), 6) if vals else 0.0


def _metric_means(scores: Sequence[dict[str, float]]) -> dict[str, float]:
    return {m: _mean(s[m] for s in scores) for m in METRICS}


def _scored(predicted: Sequence[str], gold: Sequence[str]) -> dict[str, float]:
    s = score(predicted, gold)
    return {m: getattr(s, m) for m in METRICS}


def _union_scored(merged: Sequence[str], gold: Sequence[str]) -> dict[str, float]:
    """Metrics of the N-run union. The union has no first answer, so its ``hits_at_1`` is
    KG-R1's N-run Hits@1: the question counts when any answer of any run is gold (``hit``)."""
    scores = _scored(merged, gold)
    scores["hits_at_1"] = scores["hit"]
    return scores


def _group_key(value: Any) -> str:
    return "unknown" if value is None else str(value)


def _sorted_groups(keys: Iterable[str]) -> list[str]:
    def order(k: str) -> tuple[int, float, str]:
        if k == "unknown":
            return (2, 0.0, k)
        try:
            return (0, float(k), k)
        except ValueError:
            return (1, 0.0, k)

    return sorted(set(keys), key=order)


def _ci95(rows: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """``{metric: [lo, hi]}`` for the shown metrics of ``rows``, questions as the unit."""
    by_question: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_question[r["question_id"]].append(r)
    out: dict[str, list[float]] = {}
    for m in SHOWN_METRICS:
        groups = [[float(r[m]) for r in group] for group in by_question.values()]
        lo, hi = mean_interval(groups, resamples=CI_RESAMPLES, seed=CI_SEED, level=CI_LEVEL)
        out[m] = [round(lo, 6), round(hi, 6)]
    return out


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Metrics of one system's prediction rows (one per question and run; see the module
    docstring for each aggregate). Rows need ``question_id``, ``run``, ``predicted``, ``gold``,
    every metric of :data:`METRICS`; the breakdown and process columns are
    used where present."""
    if not rows:
        raise ValueError("no prediction rows to summarize")
    by_question: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_question.setdefault(row["question_id"], []).append(row)
    for group in by_question.values():
        group.sort(key=lambda r: r["run"])
    runs = sorted({r["run"] for r in rows})
    n_runs = len(runs)

    per_run = []
    for run in runs:
        these = [r for r in rows if r["run"] == run]
        per_run.append({"run": run, "questions": len(these), **_metric_means(these)})

    majority, union, first = [], [], []
    pass_k: dict[str, list[float]] = {str(k): [] for k in pass_ks(n_runs)}
    union_sizes = []
    for group in by_question.values():
        gold = group[0]["gold"]
        preds = [list(r["predicted"]) for r in group]
        first.append({m: group[0][m] for m in METRICS})
        majority.append(_scored(preds[majority_choice(preds)], gold))
        merged = union_answers(preds)
        union_sizes.append(len(answer_set(merged)))
        union.append(_union_scored(merged, gold))
        n, c = len(group), sum(1 for r in group if r[PASS_METRIC] == 1.0)
        for k in pass_k:
            if int(k) <= n:
                pass_k[k].append(pass_at_k(n, c, int(k)))

    std = {
        m: round(statistics.stdev(p[m] for p in per_run), 6) if n_runs > 1 else 0.0
        for m in SHOWN_METRICS
    }
    breakdowns: dict[str, dict[str, dict[str, Any]]] = {}
    for col in BREAKDOWNS:
        if not any(r.get(col) is not None for r in rows):
            continue
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            groups[_group_key(r.get(col))].append(r)
        breakdowns[col] = {
            k: {
                "questions": len({r["question_id"] for r in groups[k]}),
                **{m: _mean(r[m] for r in groups[k]) for m in SHOWN_METRICS},
                # intervals by hops only: the table that tells stages apart reads them
                **({"ci95": _ci95(groups[k])} if col == "hops" else {}),
            }
            for k in _sorted_groups(groups)
        }

    def per_prediction(col: str) -> float:
        return _mean(float(r.get(col) or 0) for r in rows)

    return {
        "counts": {"questions": len(by_question), "runs": n_runs, "predictions": len(rows)},
        "overall": _metric_means(rows),
        "ci95": _ci95(rows),
        "ci95_method": CI_METHOD,
        "std_over_runs": std,
        "per_run": per_run,
        "first_run": _metric_means(first),
        "majority": _metric_means(majority),
        "union": {
            "label": UNION_LABEL,
            **_metric_means(union),
            "mean_answers": _mean(union_sizes),
        },
        "pass_at_k": {k: _mean(v) for k, v in pass_k.items()},
        "pass_at_k_metric": PASS_METRIC,
        "breakdowns": breakdowns,
        "process": {
            "turns_per_question": per_prediction("num_turns"),
            "tool_errors_per_question": per_prediction("tool_errors"),
            "format_errors_per_question": per_prediction("format_errors"),
            "llm_errors_per_question": per_prediction("llm_errors"),
            "generated_tokens_per_question": per_prediction("generated_tokens"),
            "answered": per_prediction("answered"),
            "forced_answer": per_prediction("forced_answer"),
        },
    }


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


# --- checkpoints and their starting models ------------------------------------------------


def _manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def checkpoint_label(model: str) -> str:
    """A short name for a model: the training stage of a kgsynth checkpoint (``stage1``,
    ``stage2``, ``rl``), else the folder or model name."""
    path = Path(model)
    manifest = _manifest(path) if path.is_dir() else None
    stage = str((manifest or {}).get("stage", ""))
    if stage.startswith("train "):
        return stage.removeprefix("train ").strip()
    return path.name or model


def _weights_sha256(folder: Path) -> str | None:
    from kgsynth.manifest import sha256_file

    weights = folder / "model.safetensors"
    return sha256_file(weights) if weights.is_file() else None


def untrained_model(checkpoint: str | Path) -> Path:
    """The model a kgsynth checkpoint was first trained from: ``manifest.json``'s
    ``start_from.path``, followed back until a folder that was not trained by kgsynth (a tiny
    run's ``init-tiny``, or the base model). A relative path is tried from here, then inside
    and beside the folder that names it (a moved run folder); where the manifest recorded the
    starting weights' SHA-256, the folder must hold those weights."""
    ckpt = Path(checkpoint)
    current, seen = ckpt, {ckpt.resolve()}
    while True:
        manifest = _manifest(current)
        start_from = (manifest or {}).get("start_from") or {}
        start = start_from.get("path")
        if not start:
            break
        named = Path(start)
        candidates = list(
            dict.fromkeys(
                c
                for c in (named, current / named.name, current.parent / named.name)
                if is_model_folder(c)
            )
        )
        if not candidates:
            raise ConfigError(
                f"--baseline untrained: {current / 'manifest.json'} says the model started from "
                f"{start}, which is not a checkpoint folder here; pass --baseline-model PATH"
            )
        sha = start_from.get("weights_sha256")
        if sha:
            matching = [c for c in candidates if _weights_sha256(c) == sha]
            if not matching:
                raise ConfigError(
                    f"--baseline untrained: {candidates[0]} does not hold the weights "
                    f"{current / 'manifest.json'} records as the start (sha256 {sha[:12]}…); "
                    "pass --baseline-model PATH"
                )
            candidates = matching
        found = candidates[0]
        if found.resolve() in seen:
            raise ConfigError(
                f"--baseline untrained: the start_from chain of {ckpt} loops at {found}; "
                "pass --baseline-model PATH"
            )
        seen.add(found.resolve())
        current = found
    if current == ckpt:
        raise ConfigError(
            f"--baseline untrained: {ckpt} has no manifest.json with start_from (not a run of "
            "`kgsynth train`); pass --baseline-model PATH"
        )
    return current


# --- comparison of several evaluations -----------------------------------------------------


def find_metrics(path: str | Path) -> Path:
    """``DIR/metrics.json``, ``DIR/eval/metrics.json``, or the file itself."""
    path = Path(path)
    for candidate in (path, path / "metrics.json", path / "eval" / "metrics.json"):
        if candidate.is_file():
            return candidate
    raise InputFileError(
        path, "no metrics.json here nor in eval/ (run `kgsynth eval --out DIR` first)"
    )


def load_metrics(path: str | Path) -> dict[str, Any]:
    found = find_metrics(path)
    try:
        data = json.loads(found.read_text())
    except (OSError, ValueError) as exc:
        raise InputFileError(found, f"not a readable metrics.json: {exc}") from None
    if not isinstance(data, dict) or "overall" not in data:
        raise InputFileError(found, "not a metrics.json of `kgsynth eval` (no overall metrics)")
    return data


def _shown_ci(ci: dict[str, Any] | None) -> dict[str, list[float]]:
    """The shown metrics' intervals; empty for a metrics.json written before intervals."""
    return {k: list(ci[k]) for k in SHOWN_METRICS if k in (ci or {})}


def _table_row(label: str, m: dict[str, Any], source: str) -> dict[str, Any]:
    hops = m.get("breakdowns", {}).get("hops", {})
    return {
        "label": label,
        "source": source,
        "questions": m["counts"]["questions"],
        "runs": m["counts"]["runs"],
        **{k: m["overall"].get(k) for k in SHOWN_METRICS},
        "ci95": _shown_ci(m.get("ci95")),
        "ci95_method": m.get("ci95_method"),
        "union_hits_at_1": m["union"].get("hits_at_1") if m["counts"]["runs"] > 1 else None,
        "by_hops": {
            h: {**{k: v.get(k) for k in SHOWN_METRICS}, "ci95": _shown_ci(v.get("ci95"))}
            for h, v in hops.items()
        },
        "questions_per_s": (m.get("speed") or {}).get("questions_per_s"),
    }


def compare_runs(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """One table row per evaluation (and per baseline it ran): label, every shown metric
    overall with its 95 % interval (``ci95``, empty for an older metrics.json without them;
    a metric that file lacks is None), KG-R1's N-run union Hits@1 where there were several
    runs, and the shown metrics (with ``ci95``) by hops."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        m = load_metrics(path)
        label = m.get("label") or Path(path).name
        if any(r["label"] == label for r in rows):
            label = f"{label} ({path})"
        rows.append(_table_row(label, m, str(find_metrics(path))))
        for name, base in (m.get("baselines") or {}).items():
            rows.append(_table_row(f"{label} · {name}", base, str(find_metrics(path))))
    return rows


def hop_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    return _sorted_groups(h for r in rows for h in r["by_hops"])


def fmt_value(value: float | None, digits: int = 3) -> str:
    """A metric cell: the value with ``digits`` decimals, ``–`` without a value."""
    return "–" if value is None else f"{value:.{digits}f}"


def ci_cell(value: float | None, ci: Sequence[float] | None = None) -> str:
    """``0.620 [0.523, 0.708]``; the value alone without an interval; ``–`` without a value."""
    if value is None:
        return "–"
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{value:.3f}"


def _md_table(head: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in body]


def compare_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison in markdown: every shown metric overall as a ``mean [95 % CI]`` cell
    (and KG-R1's N-run union Hits@1), then Hits@1 by hops with its 95 % CI, then every shown
    metric by hops, then how the intervals were computed and what each metric means. Rows from
    a metrics.json without intervals show the mean alone."""
    hops = hop_columns(rows)
    with_union = any(r["union_hits_at_1"] is not None for r in rows)
    head = ["run", "questions", "runs", *(METRIC_NAMES[k] for k in SHOWN_METRICS)]
    head += [f"{UNION_LABEL} Hits@1"] if with_union else []
    body = []
    for r in rows:
        cells = [r["label"], str(r["questions"]), str(r["runs"])]
        cells += [ci_cell(r[k], r.get("ci95", {}).get(k)) for k in SHOWN_METRICS]
        cells += [fmt_value(r["union_hits_at_1"])] if with_union else []
        body.append(cells)
    lines = _md_table(head, body)
    if hops:
        hop_head = ["run", *(f"{h}-hop" for h in hops)]
        hits = []
        points = []
        for r in rows:
            by = [r["by_hops"].get(h) for h in hops]
            hits.append(
                [
                    r["label"],
                    *(
                        ci_cell(v.get("hits_at_1"), v.get("ci95", {}).get("hits_at_1"))
                        if v
                        else "–"
                        for v in by
                    ),
                ]
            )
            points.append(
                [
                    r["label"],
                    *(" / ".join(fmt_value(v[k]) for k in SHOWN_METRICS) if v else "–" for v in by),
                ]
            )
        lines += ["", "## Hits@1 by hops with 95 % CI", "", *_md_table(hop_head, hits)]
        shown = " / ".join(METRIC_NAMES[k] for k in SHOWN_METRICS)
        lines += ["", f"## {shown} by hops", "", *_md_table(hop_head, points)]
    methods = list(dict.fromkeys(r["ci95_method"] for r in rows if r.get("ci95_method")))
    if methods:
        lines += ["", "`mean [lo, hi]`: the mean and its 95 % CI; " + "; ".join(methods) + "."]
    lines += ["", METRIC_LEGEND]
    if any(not r.get("ci95") for r in rows):
        lines += ["", "A mean without an interval: its metrics.json predates intervals."]
    return "\n".join(lines) + "\n"


# --- figures -------------------------------------------------------------------------------

_COLORS = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb")


def _grouped_bars(
    ax: Any,
    groups: list[str],
    series: dict[str, list[float]],
    intervals: dict[str, list[Sequence[float] | None]] | None = None,
) -> None:
    """Bars per group and series; ``intervals[name][i]`` (``[lo, hi]`` or None) draws an
    error bar on that bar."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(groups))]
        cis = (intervals or {}).get(name)
        yerr = None
        if cis and any(cis):
            yerr = [
                # max(0, …): a percentile interval need not contain a rounded mean exactly
                [max(0.0, v - ci[0]) if ci else 0.0 for v, ci in zip(values, cis, strict=True)],
                [max(0.0, ci[1] - v) if ci else 0.0 for v, ci in zip(values, cis, strict=True)],
            ]
        bars = ax.bar(
            xs,
            values,
            width,
            yerr=yerr,
            capsize=2 if yerr else 0,
            label=name,
            color=_COLORS[i % len(_COLORS)],
        )
        ax.bar_label(bars, fmt="%.2f", fontsize=6)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)


def eval_png(metrics: dict[str, Any], path: str | Path) -> None:
    """Overall metrics per system (model, N-run aggregates, baselines), EM and F1 by hops per
    system, and F1 by question type (or structure) for the model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems: dict[str, dict[str, Any]] = {metrics.get("label") or MODEL_SYSTEM: metrics}
    systems.update(metrics.get("baselines") or {})
    runs = metrics["counts"]["runs"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    ax = axes[0][0]
    series = {name: [m["overall"][k] for k in SHOWN_METRICS] for name, m in systems.items()}
    if runs > 1:
        series["majority"] = [metrics["majority"][k] for k in SHOWN_METRICS]
        series[UNION_LABEL] = [metrics["union"][k] for k in SHOWN_METRICS]
    _grouped_bars(ax, [METRIC_NAMES[k] for k in SHOWN_METRICS], series)
    ax.set_title(
        f"{metrics['counts']['questions']} questions × {runs} run(s)"
        + (" (bars: mean over runs)" if runs > 1 else "")
    )
    for ax, metric in ((axes[0][1], "hits_at_1"), (axes[1][0], "f1")):
        hop_groups = _sorted_groups(
            h for m in systems.values() for h in m.get("breakdowns", {}).get("hops", {})
        )
        if not hop_groups:
            ax.text(0.5, 0.5, "the questions carry no hop counts", ha="center", va="center")
            ax.set_axis_off()
            continue
        series = {
            name: [
                m.get("breakdowns", {}).get("hops", {}).get(h, {}).get(metric, 0.0)
                for h in hop_groups
            ]
            for name, m in systems.items()
        }
        _grouped_bars(ax, [f"{h}-hop" for h in hop_groups], series)
        ax.set_title(f"{METRIC_NAMES[metric]} by hops")
    ax = axes[1][1]
    kinds = metrics.get("breakdowns", {})
    col = "qtype" if "qtype" in kinds else "structure" if "structure" in kinds else None
    if col is None:
        ax.text(0.5, 0.5, "the questions carry no type or structure", ha="center", va="center")
        ax.set_axis_off()
    else:
        top = sorted(kinds[col].items(), key=lambda kv: -kv[1]["questions"])[:20][::-1]
        bars = ax.barh([k for k, _ in top], [v["f1"] for _, v in top], color=_COLORS[0])
        ax.bar_label(bars, fmt="%.2f", fontsize=6)
        ax.set_xlim(0, 1.05)
        ax.tick_params(axis="y", labelsize=6)
        ax.set_title(f"F1 by {col} ({metrics.get('label') or MODEL_SYSTEM}; top 20 by count)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def compare_png(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Overall EM/F1/Hits@1 per evaluation, and Hits@1 by hops per evaluation; error bars
    are the 95 % intervals (none for an older metrics.json without them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    _grouped_bars(
        axes[0],
        labels,
        {METRIC_NAMES[k]: [r[k] or 0.0 for r in rows] for k in SHOWN_METRICS},
        {METRIC_NAMES[k]: [r.get("ci95", {}).get(k) for r in rows] for k in SHOWN_METRICS},
    )
    axes[0].set_title("overall (mean over runs; bars: 95 % CI)")
    axes[0].tick_params(axis="x", labelsize=7, rotation=20)
    hops = hop_columns(rows)
    if hops:
        by = {r["label"]: [r["by_hops"].get(h, {}) for h in hops] for r in rows}
        _grouped_bars(
            axes[1],
            [f"{h}-hop" for h in hops],
            {name: [v.get("hits_at_1", 0.0) for v in vs] for name, vs in by.items()},
            {name: [v.get("ci95", {}).get("hits_at_1") for v in vs] for name, vs in by.items()},
        )
        axes[1].set_title("Hits@1 by hops (bars: 95 % CI)")
    else:
        axes[1].set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


__all__ = [
    "BASELINES",
    "PREDICTION_SCHEMA",
    "UNION_LABEL",
    "EvalConfig",
    "check_records",
    "checkpoint_label",
    "ci_cell",
    "compare_markdown",
    "compare_png",
    "compare_runs",
    "eval_png",
    "evaluate",
    "find_metrics",
    "fmt_value",
    "load_metrics",
    "majority_choice",
    "pass_at_k",
    "pass_ks",
    "run_agent",
    "run_no_tools",
    "summarize",
    "union_answers",
    "untrained_model",
]
