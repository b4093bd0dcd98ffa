"""``kgsynth synthesize questions``: walks.parquet -> questions.parquet (+ rejected.parquet).

GraphWalker Phase 2 on any LLM backend: each walk's path is shown with its intermediate
entities masked (entity1, entity2, …) and its topic and answer names given; the model writes
one question inside ``<question>…</question>``. Then, each a keep-or-reason filter:

- parse: exactly one ``<question>`` with one '?', within the length cap (raw output kept);
- leakage (no LLM): every topic entity mentioned, no answer name and no masked intermediate
  name in the question (normalized, whole-word match);
- quality: an LLM judge scores reasoning-path quality, question–path relevance and question
  coherence (0–10 each); questions whose mean is below ``min_quality`` (9, as in GraphWalker)
  are rejected. The template backend has no judge: scores stay null and the manifest says so;
- contamination: max cosine similarity to benchmark questions (all-MiniLM-L6-v2); questions at
  or above the threshold (0.85) are dropped, counts at 0.80/0.85/0.90 go to the manifest.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.core.config import option
from kgsynth.core.errors import ConfigError
from kgsynth.core.stage import Progress, Rejected, StageResult
from kgsynth.kg.sparql import normalize_name
from kgsynth.llm.base import LLM, Completion, GenerationParams, Request
from kgsynth.llm.constraint_questions import CONSTRAINT_STRUCTURES, constraint_operation
from kgsynth.prompts import prompt_hash, render

QUESTION_RE = re.compile(r"<question>(.*?)</question>", re.DOTALL | re.IGNORECASE)
SCORES_RE = re.compile(r"<scores>(.*?)</scores>", re.DOTALL | re.IGNORECASE)
DIMENSIONS = ("path_quality", "relevance", "coherence")


@dataclass(frozen=True)
class QuestionConfig:
    """Options of ``kgsynth synthesize questions``: one flag per field, named as the field."""

    temperature: float = option(0.7, "Sampling temperature.")
    max_tokens: int = option(128, "Tokens per question.")
    judge_max_tokens: int = option(64, "Tokens per judge reply.")
    max_question_chars: int = option(300, "Reject longer questions (parse_too_long).")
    min_quality: float = option(
        9.0, "Keep questions whose mean judge score is at least this (0-10)."
    )
    judge: bool = option(True, "Score questions with the LLM judge.")
    contamination_threshold: float = option(
        0.85, "Drop questions at or above this cosine similarity."
    )
    seed: int = option(0, "Sampling seed sent with requests.")
    limit: int | None = option(None, "Use only the first K walks.", panel="Inputs")

    def __post_init__(self) -> None:
        if not 0 <= self.min_quality <= 10:
            raise ConfigError(f"--min-quality must be within 0..10 (got {self.min_quality})")
        if not 0 < self.contamination_threshold <= 1:
            raise ConfigError(
                f"--contamination-threshold must be within (0, 1] (got {self.contamination_threshold})"
            )
        if self.max_question_chars < 10:
            raise ConfigError("--max-question-chars must be >= 10")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1 (got {self.limit})")


# --- prompts --------------------------------------------------------------------------------


def _fact(subject: str, hop: dict[str, Any], obj: str) -> str:
    if hop["inverse"]:
        return f"{obj} --{hop['relation']}--> {subject}"
    return f"{subject} --{hop['relation']}--> {obj}"


def masked_paths(walk: dict[str, Any]) -> tuple[list[list[str]], list[str], list[str]]:
    """Fact lines per branch (up to the meeting point), lines after it, and the hidden names.

    Intermediate entities become entity1, entity2, …; on a chain the last hop ends at the
    answers (on a constraint walk, at "member": each entity of the set the constraint reads). On a conjunction the meeting point is "target" and IP's last hop ends at "answer";
    IP's meeting entity is hidden like any intermediate."""
    masked: list[str] = []
    counter = 0
    branches, merge_at = walk["branches"], walk["merge_at"]
    conj = len(branches) > 1
    # a constraint walk's path ends at each member of the set its constraint then reads
    constrained = walk.get("structure") in CONSTRAINT_STRUCTURES and bool(walk.get("sexpr"))
    answers = ", ".join(walk["answer_names"][:3]) + (" …" if len(walk["answer_names"]) > 3 else "")
    branch_lines: list[list[str]] = []
    tail_lines: list[str] = []
    for b, (topic, hops) in enumerate(zip(walk["topic_names"], branches, strict=True)):
        prev = topic
        lines: list[str] = []
        for i, hop in enumerate(hops):
            if conj and i + 1 == merge_at[b]:
                name = "target"
                if len(hops) > merge_at[b]:  # IP: the meeting entity is an intermediate
                    masked.append(hop["entity"])
            elif i == len(hops) - 1:
                name = "answer" if conj else ("member" if constrained else answers)
            else:
                counter += 1
                name = f"entity{counter}"
                masked.append(hop["entity"])
            (tail_lines if conj and i + 1 > merge_at[b] else lines).append(_fact(prev, hop, name))
            prev = name
        branch_lines.append(lines)
    return branch_lines, tail_lines, masked


def question_messages(walk: dict[str, Any]) -> list[dict[str, str]]:
    branch_lines, tail_lines, _ = masked_paths(walk)
    if walk.get("structure") in CONSTRAINT_STRUCTURES and walk.get("sexpr"):
        text = render(
            "question_constraint",
            topic=walk["topic_names"][0],
            path_lines=branch_lines[0],
            hops=len(walk["branches"][0]),
            operation=constraint_operation(walk),
            answers=walk["answer_names"],
        )
    elif len(walk["branches"]) == 1:
        text = render(
            "question_path",
            topic=walk["topic_names"][0],
            path_lines=branch_lines[0],
            answers=walk["answer_names"],
            hops=len(walk["branches"][0]),
        )
    else:
        text = render(
            "question_conjunction",
            topics=walk["topic_names"],
            branch_lines=branch_lines,
            tail_lines=tail_lines,
            answers=walk["answer_names"],
        )
    return [{"role": "user", "content": text}]


def judge_messages(walk: dict[str, Any], question: str) -> list[dict[str, str]]:
    branch_lines, tail_lines, _ = masked_paths(walk)
    path_text = "\n".join(line for lines in branch_lines for line in lines)
    if tail_lines:
        path_text += "\n" + "\n".join(tail_lines)
    if walk.get("structure") in CONSTRAINT_STRUCTURES and walk.get("sexpr"):
        path_text += f"\nthen, over that set: {constraint_operation(walk)}"
    return [
        {
            "role": "user",
            "content": render(
                "quality_judge",
                question=question,
                path_text=path_text,
                answers=walk["answer_names"],
            ),
        }
    ]


# --- parsing and checks ---------------------------------------------------------------------


def parse_question(text: str, max_chars: int) -> tuple[str | None, str | None]:
    """``(question, None)`` or ``(None, reject_reason)``."""
    found = QUESTION_RE.findall(text or "")
    if not found:
        return None, "parse_no_question_tag"
    if len(found) > 1:
        return None, "parse_several_questions"
    q = " ".join(found[0].split())
    if not q:
        return None, "parse_empty_question"
    if q.count("?") != 1 or not q.endswith("?"):
        return None, "parse_question_mark"
    if len(q) > max_chars:
        return None, "parse_too_long"
    return q, None


def parse_scores(text: str) -> dict[str, float] | None:
    """The three judge scores (0–10), from ``<scores>{json}</scores>`` or bare JSON."""
    m = SCORES_RE.search(text or "")
    body = m.group(1) if m else (text or "")
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        data = json.loads(body[start : end + 1])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    scores: dict[str, float] = {}
    for dim in DIMENSIONS:
        value = data.get(dim)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if not 0 <= value <= 10:
            return None
        scores[dim] = float(value)
    return scores


def _mentions(text: str, name: str) -> bool:
    norm = normalize_name(name)
    if not norm:
        return False
    return re.search(rf"(?<!\w){re.escape(norm)}(?!\w)", normalize_name(text)) is not None


def leakage_reason(question: str, walk: dict[str, Any], masked: Sequence[str]) -> str | None:
    """None when the question names every topic and no answer or hidden entity."""
    for topic in walk["topic_names"]:
        if not _mentions(question, topic):
            return "leak_missing_topic"
    for answer in walk["answer_names"]:
        if _mentions(question, answer):
            return "leak_answer"
    for name in masked:
        if _mentions(question, name):
            return "leak_intermediate"
    return None


# --- the stage ------------------------------------------------------------------------------

WALK_COLUMNS = {"walk_id", "branches", "topic_names", "answer_names", "merge_at", "structure"}
"""The walks.parquet columns the stage reads."""


def question_id(walk_id: str, question: str) -> str:
    return "q-" + hashlib.sha1(f"{walk_id}\n{question}".encode()).hexdigest()[:16]


def _carry(walk: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "walk_id",
        "structure",
        "hops",
        "topic_names",
        "topic_ids",
        "branches",
        "merge_at",
        "answer_names",
        "answer_ids",
        "sparql",
        "sexpr",
    )
    return {k: walk.get(k) for k in keys}


@dataclass
class Candidate:
    """A question that passed parsing and the leakage check: its row, the walk it asks about
    and the model's raw output (kept with the row if a later filter turns it down)."""

    row: dict[str, Any]
    walk: dict[str, Any]
    raw: str


def _turned_down(row: dict[str, Any], reason: str, raw: str) -> Rejected:
    return Rejected({**row, "raw_output": raw}, reason)


def _write_questions(
    walks: Sequence[dict[str, Any]],
    cfg: QuestionConfig,
    llm: LLM,
    gen: dict[str, str],
    rejected: list[Rejected],
    report: Callable[[str, int], Callable[[int, Completion], None] | None],
) -> list[Candidate]:
    """One question per walk, parsed and checked for leakage; rejects go to ``rejected``."""
    params = GenerationParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed)
    requests = [
        Request.make(question_messages(w), params, task="question", context=_carry(w))
        for w in walks
    ]
    completions = llm.generate_batch(requests, report("question", len(requests)))
    candidates: list[Candidate] = []
    for walk, comp in zip(walks, completions, strict=True):
        base = {
            **_carry(walk),
            "question_id": None,
            "question": None,
            "quality": None,
            "max_similarity": None,
            "generator": gen,
        }
        if not comp.ok:
            rejected.append(_turned_down(base, "llm_error", comp.error or ""))
            continue
        q, why = parse_question(comp.text, cfg.max_question_chars)
        if q is None:
            rejected.append(_turned_down(base, why or "parse_error", comp.text))
            continue
        row = {**base, "question_id": question_id(walk["walk_id"], q), "question": q}
        _, _, masked = masked_paths(walk)
        why = leakage_reason(q, walk, masked)
        if why:
            rejected.append(_turned_down(row, why, comp.text))
            continue
        candidates.append(Candidate(row, walk, comp.text))
    return candidates


def _judge(
    candidates: list[Candidate],
    cfg: QuestionConfig,
    llm: LLM,
    rejected: list[Rejected],
    report: Callable[[str, int], Callable[[int, Completion], None] | None],
) -> list[Candidate]:
    """The candidates whose mean judge score reaches ``cfg.min_quality``."""
    jparams = GenerationParams(temperature=0.0, max_tokens=cfg.judge_max_tokens, seed=cfg.seed)
    jreqs = [
        Request.make(judge_messages(c.walk, c.row["question"]), jparams, task="judge")
        for c in candidates
    ]
    jcomps = llm.generate_batch(jreqs, report("judge", len(jreqs)))
    kept = []
    for cand, jc in zip(candidates, jcomps, strict=True):
        scores = parse_scores(jc.text) if jc.ok else None
        if scores is None:
            reason = "judge_unparsable" if jc.ok else "judge_llm_error"
            rejected.append(_turned_down(cand.row, reason, jc.text or jc.error or ""))
            continue
        cand.row["quality"] = scores
        if sum(scores.values()) / len(scores) < cfg.min_quality:
            rejected.append(_turned_down(cand.row, "low_quality", cand.raw))
            continue
        kept.append(cand)
    return kept


def run(
    inputs: Sequence[dict[str, Any]],
    cfg: QuestionConfig,
    *,
    llm: LLM,
    max_similarity: Callable[[list[str]], Sequence[float]] | None = None,
    progress: Progress | None = None,
    graph: None = None,
) -> StageResult[list[dict[str, Any]]]:
    """The stage: a question per walk (the first ``cfg.limit`` walks), then the parse, leakage,
    quality and contamination filters (``max_similarity``: the contamination guard's score of
    each question, when benchmark questions are given). ``progress`` gets
    ``(done, total, "question" | "judge")``."""
    walks = list(inputs[: cfg.limit] if cfg.limit is not None else inputs)
    gen = {
        "backend": llm.backend,
        "model": llm.model,
        "prompt_hash": prompt_hash(
            "question_path", "question_conjunction", "question_constraint", "quality_judge"
        ),
    }

    def report(phase: str, total: int) -> Callable[[int, Completion], None] | None:
        return (lambda i, c: progress(i + 1, total, phase)) if progress else None

    rejected: list[Rejected] = []
    candidates = _write_questions(walks, cfg, llm, gen, rejected, report)
    judged = cfg.judge and llm.backend != "template"
    if judged and candidates:
        candidates = _judge(candidates, cfg, llm, rejected, report)

    contamination: dict[str, Any] | None = None
    if max_similarity is not None and candidates:
        sims = [float(s) for s in max_similarity([c.row["question"] for c in candidates])]
        contamination = {f">={t:.2f}": sum(s >= t for s in sims) for t in (0.80, 0.85, 0.90)}
        contamination["checked"] = len(sims)
        kept = []
        for cand, sim in zip(candidates, sims, strict=True):
            cand.row["max_similarity"] = sim
            if sim >= cfg.contamination_threshold:
                rejected.append(_turned_down(cand.row, "contamination", cand.raw))
            else:
                kept.append(cand)
        candidates = kept

    accepted = [c.row for c in candidates]
    reasons = Counter(r.reason for r in rejected)
    stats = {
        "walks": len(walks),
        "accepted": len(accepted),
        "rejected": len(rejected),
        "rejects": dict(reasons.most_common()),
        "quality_filter": (
            f"judge mean >= {cfg.min_quality}"
            if judged
            else "skipped (template backend: rule-based questions, no judge)"
            if llm.backend == "template"
            else "disabled"
        ),
        "contamination": contamination,
        "generator": gen,
    }
    return StageResult(accepted, rejected, stats)


def synthesize_questions(
    walks: Sequence[dict[str, Any]], cfg: QuestionConfig, **options: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """:func:`run` (same ``options``) as plain rows: (accepted rows, rejected rows with
    ``reject_reason`` and ``raw_output``, stats for the manifest)."""
    result = run(walks, cfg, **options)
    return result.accepted, result.rejected_rows(), result.stats
