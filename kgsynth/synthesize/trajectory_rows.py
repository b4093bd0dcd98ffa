"""The row a synthesized trajectory is written as (``TRAJECTORY_SCHEMA``): the episode, the
question it answers, and how it was made."""

from __future__ import annotations

import hashlib
from typing import Any

from kgsynth.synthesize.trajectory_config import TrajectoryConfig

EMPTY_EPISODE = {
    "messages": [],
    "predicted_answers": [],
    "answered": False,
    "forced_answer": False,
    "num_turns": 0,
    "tool_errors": 0,
    "format_errors": 0,
    "tool_calls": [],
    "turns": [],
    "observed_entities": [],
}


def trajectory_id(question_id: str, mode: str, sample: int) -> str:
    return "t-" + hashlib.sha1(f"{question_id}|{mode}|{sample}".encode()).hexdigest()[:16]


def trajectory_row(
    question: dict[str, Any],
    sample: int,
    episode: dict[str, Any] | None,
    cfg: TrajectoryConfig,
    generator: dict[str, str],
    reference: str = "",
) -> dict[str, Any]:
    """Sample ``sample`` of ``question`` as a row: ``episode`` (an episode summary; None for a
    question turned down before it ran) and the question's own fields."""
    row = {**EMPTY_EPISODE, **(episode or {})}
    row.update(
        trajectory_id=trajectory_id(question["question_id"], cfg.mode, sample),
        question_id=question["question_id"],
        walk_id=question.get("walk_id"),
        mode=cfg.mode,
        sample=sample,
        question=question["question"],
        topic_names=list(question["topic_names"]),
        structure=question.get("structure"),
        hops=question.get("hops"),
        gold_answers=list(question["answer_names"]),
        reference=reference or "",
        generator=generator,
    )
    return row
