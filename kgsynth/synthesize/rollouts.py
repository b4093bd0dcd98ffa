"""Sampled trajectories: the policy acts and the environment answers.

- ``referenced`` (KBQA-R1 Referenced Rejection Sampling): the policy runs with the oracle's
  actions as guidance (``reference_guidance``: ``per_step``, KBQA-R1 §IV-B1 step 2, shows the
  next gold action at each turn; ``whole`` shows the numbered sequence once in the user
  prompt); stored messages carry no reference (step 4; the ``reference`` column keeps the
  whole hint so ``kgsynth filter`` can reject trajectories where hint text survives).
- ``free``: the policy runs without hints, ``samples`` episodes per question at ``temperature``
  (expert rollouts through an API, or a local checkpoint through ``hf``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from kgsynth.agent.loop import EpisodeTask, episode_summary, run_episodes, system_prompt
from kgsynth.agent.rerank import LLMReranker
from kgsynth.agent.spaces.registry import space
from kgsynth.agent.tools import ToolEnvironment, prime_relation_ranking
from kgsynth.core.stage import Progress, Reject, Rejected
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM, GenerationParams
from kgsynth.prompts import render
from kgsynth.synthesize.name_correction import correct_read_names
from kgsynth.synthesize.trajectory_config import TrajectoryConfig
from kgsynth.synthesize.trajectory_rows import trajectory_row


def rollout_trajectories(
    rows: Sequence[dict[str, Any]],
    cfg: TrajectoryConfig,
    *,
    graph: KGGraph,
    llm: LLM,
    generator: dict[str, str],
    progress: Progress | None = None,
    system_text: str | None = None,
    tally: Counter[str] | None = None,
) -> tuple[list[dict[str, Any]], list[Rejected]]:
    """``referenced`` and ``free`` episodes, ``cfg.samples`` per question: the rows of the
    episodes, and those turned down (every turn an LLM error; in ``referenced`` mode, a question
    whose reference cannot be built, with its oracle's reason), in question order.
    ``system_text`` (a checkpoint's stored prompt) replaces the ``system_prompt`` style;
    ``progress`` gets ``(turn, episodes still active, "turn")``; ``tally`` (with
    ``correct_names``) gets ``names_corrected`` and ``rollouts_corrected``."""
    tasks: list[EpisodeTask] = []
    meta: list[tuple[dict[str, Any], int, str]] = []
    accepted: list[tuple[int, dict[str, Any]]] = []
    rejected: list[tuple[int, Rejected]] = []
    actions = space(cfg.agent.toolset)
    per_step = cfg.reference_guidance == "per_step"
    for row in rows:
        try:
            ref = actions.reference_text(row, graph) if cfg.mode == "referenced" else ""
            steps = tuple(actions.reference_steps(row, graph)) if ref and per_step else ()
        except Reject as rej:  # no reference for it (no logical form, an unsupported one)
            out = trajectory_row(row, 0, None, cfg, generator)
            rejected.append((len(meta), Rejected(out, rej.reason)))
            continue
        shown = None if steps else (ref or None)
        for sample in range(cfg.samples):
            tasks.append(EpisodeTask(row["question"], list(row["topic_names"]), shown, steps))
            meta.append((row, sample, ref))
    by_task = {id(t): (row["question"]) for t, (row, _, _) in zip(tasks, meta, strict=True)}

    agent = cfg.tool_config()
    reranker = LLMReranker(llm) if cfg.agent.rerank == "llm" else None
    prime_relation_ranking(agent, (row["question"] for row in rows))

    def make_env(task: EpisodeTask) -> ToolEnvironment:
        return ToolEnvironment(graph, by_task[id(task)], agent, reranker, topics=task.topic_names)

    stored_text = system_text or system_prompt(
        cfg.agent.toolset, cfg.agent.max_turns, cfg.agent.system_prompt
    )
    sampling_text = stored_text
    if cfg.reflection:
        sampling_text = stored_text.rstrip("\n") + "\n" + render("reflection")

    # one seed per sample, so that N samples are N different requests (and cache entries)
    on_turn = (lambda t, n: progress(t, n, "turn")) if progress else None
    for sample in range(cfg.samples):
        idx = [i for i, (_, s, _) in enumerate(meta) if s == sample]
        params = GenerationParams(
            temperature=cfg.temperature,
            max_tokens=cfg.agent.max_turn_tokens,
            seed=cfg.seed + sample,
        )
        episodes = run_episodes(
            llm,
            [tasks[i] for i in idx],
            make_env,
            toolset=cfg.agent.toolset,
            max_turns=cfg.agent.max_turns,
            params=params,
            on_turn=on_turn,
            system_text=sampling_text,
            resample_cut_turns=agent.resample_cut_turns,
            resample_temperature=agent.resample_temperature,
        )
        for i, ep in zip(idx, episodes, strict=True):
            row, s, ref = meta[i]
            if cfg.reflection and ep.messages and ep.messages[0]["role"] == "system":
                # train on the agent's own prompt: the reflection text only shaped the sample
                ep.messages[0] = {"role": "system", "content": stored_text}
            summary = episode_summary(ep)
            if cfg.correct_names:
                summary, notes = correct_read_names(summary)
                if tally is not None:
                    tally["names_corrected"] += notes
                    tally["rollouts_corrected"] += notes > 0
            out = trajectory_row(row, s, summary, cfg, generator, ref)
            if ep.turns and all(t.llm_error for t in ep.turns):
                rejected.append((i, Rejected(out, "llm_error")))
            else:
                accepted.append((i, out))
    # accepted rows sample by sample (as sampled); rejects in question order (a question
    # without a reference before the next question's episodes: the sort is stable)
    return [r for _, r in accepted], [r for _, r in sorted(rejected, key=lambda ir: ir[0])]
