"""``kgsynth synthesize trajectories``: questions.parquet -> trajectories.parquet.

Four modes, one agent loop and one tool environment (the same ranking and limits as RL and
eval):

- ``oracle`` (GraphWalker's GraphSynth; :mod:`kgsynth.agent.spaces.paths`,
  :mod:`kgsynth.synthesize.oracle_episodes`; for knowcoder, ``trial_and_error`` adds
  :mod:`kgsynth.agent.spaces.knowcoder.trial`'s demonstrations): each question's walk is replayed as tool calls
  through the real environment; a step whose gold relation or next entity the tools do not
  show rejects the question with that reason. Then a thought is written for every step from
  the question, the history so far and the next gold action only (no future leakage).
- ``referenced`` (KBQA-R1 Referenced Rejection Sampling) and ``free`` (expert or checkpoint
  rollouts, ``samples`` per question): :mod:`kgsynth.synthesize.rollouts`.
- ``coldstart`` (KnowCoder-A1 §4.2.1, knowcoder): an LLM sampled with trial-and-error demos,
  kept by outcome; the template backend's stand-in is the oracle with trial and error
  (:mod:`kgsynth.synthesize.coldstart`).

:func:`run` is the stage (``run(questions, cfg, *, graph, llm, progress) -> StageResult``): it
takes the ``split`` and the ``limit`` of the questions, runs the mode, and returns the
trajectory rows, the rejects (:class:`~kgsynth.core.stage.Rejected`, in question order) and the
counts for the manifest.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from kgsynth.agent.spaces import oracle_calls, reference_text, replay, space
from kgsynth.agent.spaces.oracle_call import TRIAL_MODE, OracleCall, oracle_answers
from kgsynth.agent.strategies.round_trips import with_round_trip_words
from kgsynth.core.errors import ConfigError
from kgsynth.core.stage import Progress, StageResult
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM
from kgsynth.prompts import prompt_hash
from kgsynth.synthesize.coldstart import COLDSTART_MODE, coldstart_trajectories
from kgsynth.synthesize.oracle_episodes import oracle_in_workers, oracle_trajectories
from kgsynth.synthesize.rollouts import rollout_trajectories
from kgsynth.synthesize.trajectory_config import MODES, SPLITS, STRATA, TrajectoryConfig
from kgsynth.synthesize.trajectory_rows import EMPTY_EPISODE, trajectory_id, trajectory_row

QUESTION_COLUMNS = {"question_id", "question", "topic_names", "answer_names"}
"""The questions.parquet columns every mode reads; the oracle and ``referenced`` also read the
walk (:func:`input_columns`)."""


def input_columns(cfg: TrajectoryConfig) -> set[str]:
    """The questions.parquet columns the stage reads in ``cfg.mode`` (and, for the tool sets
    whose oracle and reference are built from the walk's SPARQL, its ``sparql``; ``sexpr``
    reads the ``sexpr`` column where a file has it, else builds it from the branches)."""
    columns = QUESTION_COLUMNS | ({"branches", "merge_at"} if cfg.mode != "free" else set())
    if cfg.mode != "free" and space(cfg.agent.toolset).oracle_from == "sparql":
        columns = columns | {"sparql"}
    return columns


def select_questions(
    rows: Sequence[dict[str, Any]], limit: int, stratify: str = "none", seed: int = 0
) -> list[dict[str, Any]]:
    """``limit`` questions: the first ones (``stratify="none"``), or a stratified sample
    (GraphRoll's stratified sampling for expert rollouts): the rows grouped by ``structure``
    or ``hops``, each group shuffled with ``seed``, then taken round-robin over the groups (in
    sorted order) until ``limit``, so every stratum gets an equal share as far as it has rows.
    The result keeps the input order."""
    if stratify == "none" or limit >= len(rows):
        return list(rows[:limit])
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(str(row.get(stratify)), []).append(i)
    rng = random.Random(seed)
    queues = []
    for key in sorted(groups):
        members = groups[key][:]
        rng.shuffle(members)
        queues.append(members)
    picked: list[int] = []
    while len(picked) < limit:
        for q in queues:
            if q and len(picked) < limit:
                picked.append(q.pop())
    return [rows[i] for i in sorted(picked)]


def split_of(question_id: str, heldout_fraction: float) -> str:
    """``heldout`` for a stable ``heldout_fraction`` of question ids (by hash), else ``train``."""
    digest = hashlib.sha256(question_id.encode("utf-8")).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") / 2**64 < heldout_fraction else "train"


def questions_of(rows: Sequence[dict[str, Any]], cfg: TrajectoryConfig) -> list[dict[str, Any]]:
    """The questions the stage runs: those of ``cfg.split``, then ``cfg.limit`` of them."""
    rows = list(rows)
    if cfg.split != "all":
        rows = [r for r in rows if split_of(r["question_id"], cfg.heldout_fraction) == cfg.split]
    if cfg.limit is not None:
        rows = select_questions(rows, cfg.limit, cfg.stratify, cfg.seed)
    return rows


def run(
    inputs: Sequence[dict[str, Any]],
    cfg: TrajectoryConfig,
    *,
    graph: KGGraph,
    llm: LLM,
    progress: Progress | None = None,
    system_text: str | None = None,
) -> StageResult[list[dict[str, Any]]]:
    """The stage: trajectories for the questions of ``cfg.split`` (up to ``cfg.limit``).
    ``system_text``: the policy checkpoint's stored system prompt, used by free and referenced
    rollouts. ``progress`` gets ``(thoughts done, total, "thoughts")`` from the oracle and
    ``(turn, episodes active, "turn")`` from rollouts."""
    if cfg.mode not in ("oracle", COLDSTART_MODE) and llm.backend == "template":
        raise ConfigError(
            f"--mode {cfg.mode} needs a policy model (--llm openai or hf); the template backend "
            "only writes oracle thoughts"
        )
    cfg = with_round_trip_words(cfg, inputs)
    rows = questions_of(inputs, cfg)
    generator = {
        "backend": llm.backend,
        "model": llm.model,
        "prompt_hash": prompt_hash("agent_system", "thought"),
    }
    if cfg.workers > 1 and llm.backend not in ("template", "hf"):
        raise ConfigError(
            "--workers runs the template backend's oracle or the hf backend's generation in "
            "several processes; an API backend already sends its requests concurrently "
            "(--concurrency)"
        )
    tally: Counter[str] = Counter()  # --correct-names: rollouts_corrected, names_corrected
    if cfg.mode == "oracle" and cfg.workers > 1 and llm.backend == "template":
        accepted, rejected = oracle_in_workers(
            rows, cfg, graph=graph, generator=generator, progress=progress
        )
    elif cfg.mode == COLDSTART_MODE:  # KnowCoder-A1 §4.2.1
        accepted, rejected = coldstart_trajectories(
            rows, cfg, graph=graph, llm=llm, generator=generator, progress=progress,
            system_text=system_text, tally=tally,
        )  # fmt: skip
    elif cfg.mode == "oracle":
        accepted, rejected = oracle_trajectories(
            rows, cfg, graph=graph, llm=llm, generator=generator, progress=progress
        )
    else:
        accepted, rejected = rollout_trajectories(
            rows,
            cfg,
            graph=graph,
            llm=llm,
            generator=generator,
            progress=progress,
            system_text=system_text,
            tally=tally,
        )
    reasons = Counter(r.reason for r in rejected)
    stats = {
        "mode": cfg.mode,
        "questions": len(rows),
        "trajectories": len(accepted),
        "rejected": len(rejected),
        "rejects": dict(reasons.most_common()),
        "answered": sum(r["answered"] for r in accepted),
        "mean_turns": round(sum(r["num_turns"] for r in accepted) / max(1, len(accepted)), 3),
        "tool_errors": sum(r["tool_errors"] for r in accepted),
        "format_errors": sum(r["format_errors"] for r in accepted),
        "generator": generator,
    }
    if cfg.correct_names:  # hindsight correction: names read as others, in how many rollouts
        stats.update(
            names_corrected=tally["names_corrected"], rollouts_corrected=tally["rollouts_corrected"]
        )
    if cfg.trial_and_error > 0:  # KnowCoder-A1's trial-and-error demonstrations written
        stats["trial_and_error"] = sum(r["mode"] == TRIAL_MODE for r in accepted)
    return StageResult(accepted, rejected, stats)


def synthesize_trajectories(
    rows: Sequence[dict[str, Any]], cfg: TrajectoryConfig, **options: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """:func:`run` (same ``options``) as plain rows: (trajectory rows, rejected rows with
    ``reject_reason``, stats)."""
    result = run(rows, cfg, **options)
    return result.accepted, result.rejected_rows(), result.stats


__all__ = [
    "EMPTY_EPISODE",
    "MODES",
    "QUESTION_COLUMNS",
    "SPLITS",
    "STRATA",
    "OracleCall",
    "TrajectoryConfig",
    "input_columns",
    "oracle_answers",
    "oracle_calls",
    "questions_of",
    "reference_text",
    "replay",
    "run",
    "select_questions",
    "split_of",
    "synthesize_trajectories",
    "trajectory_id",
    "trajectory_row",
]
