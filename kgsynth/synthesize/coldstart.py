"""KnowCoder-A1's cold-start data (``knowcoder-a1.txt`` §4.2.1): ``kgsynth synthesize
trajectories --mode coldstart --toolset knowcoder``.

With a model (``--llm openai`` or ``hf``) a strong LLM is prompted with the knowcoder system
prompt plus hand-written trial-and-error demonstrations (``prompts/knowcoder_demos.j2``: made-up
questions on a toy library KG showing planning, tool use and recovery after an empty result or
a wrong kind of answer) and samples ``samples`` trajectories per question through the real tools.
Outcome-based rejection sampling then keeps what :func:`kgsynth.filter.run_filters` accepts under
the paper's two criteria: some predicted answer is gold (``hit``, the text's "EM"), and every
predicted answer was returned by a tool (``grounding``), with at most three trajectories per
question. Those it turns down are this stage's rejects, with the filter's reason. The stored
trajectories carry the plain system prompt: the demonstrations only shape the sample.

With ``--llm template`` (no model) it writes the offline stand-in instead, and says so in one
logged line: the scripted oracle replays with their trial-and-error variants
(:mod:`kgsynth.agent.spaces.knowcoder.trial`, ``--trial-and-error``), as ``--mode oracle``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kgsynth.agent.loop import system_prompt
from kgsynth.core.stage import Progress, Rejected
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM
from kgsynth.prompts import render
from kgsynth.synthesize.oracle_episodes import oracle_trajectories
from kgsynth.synthesize.rollouts import rollout_trajectories
from kgsynth.synthesize.trajectory_config import TrajectoryConfig

log = logging.getLogger(__name__)

COLDSTART_MODE = "coldstart"
DEMOS_PROMPT = "knowcoder_demos"
MAX_PER_QUESTION = 3
"""§4.2.1: at most three trajectories per question."""
TEMPLATE_NOTE = (
    "--mode coldstart with --llm template samples no LLM: writing the offline stand-in, scripted "
    "oracle replays with trial-and-error (--trial-and-error {share}), not §4.2.1's sampled data"
)


def sampling_prompt(stored: str) -> str:
    """The system prompt an LLM samples cold-start trajectories under: the agent's prompt,
    then the demonstrations."""
    return stored.rstrip("\n") + "\n\n" + render(DEMOS_PROMPT)


def outcome_filter(
    rows: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[Rejected]]:
    """§4.2.1's rejection sampling over sampled rows: ``hit`` and ``grounding`` (and the
    filter's format and length checks), at most :data:`MAX_PER_QUESTION` per question.
    Returns the rows kept and the others with the filter's reason, both in input order."""
    from kgsynth.filter import FilterConfig, run_filters

    if not rows:
        return [], []
    cfg = FilterConfig(outcome="hit", grounding=True, max_per_question=MAX_PER_QUESTION)
    _, rejected, _ = run_filters(rows, cfg, source="sampled cold-start trajectories")
    reasons = dict(
        zip(
            rejected.column("trajectory_id").to_pylist(),
            rejected.column("reject_reason").to_pylist(),
            strict=True,
        )
    )
    kept = [r for r in rows if r["trajectory_id"] not in reasons]
    turned = [
        Rejected(r, reasons[r["trajectory_id"]]) for r in rows if r["trajectory_id"] in reasons
    ]
    return kept, turned


def coldstart_trajectories(
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
    """The cold-start trajectories of ``rows`` and the rejects (see the module doc)."""
    if llm.backend == "template":
        log.warning(TEMPLATE_NOTE.format(share=cfg.trial_and_error))
        oracle_cfg = replace(cfg, mode="oracle")
        return oracle_trajectories(
            rows, oracle_cfg, graph=graph, llm=llm, generator=generator, progress=progress
        )
    stored = system_text or system_prompt(
        cfg.agent.toolset, cfg.agent.max_turns, cfg.agent.system_prompt
    )
    sampled, failed = rollout_trajectories(
        rows,
        cfg,
        graph=graph,
        llm=llm,
        generator=generator,
        progress=progress,
        system_text=sampling_prompt(stored),
        tally=tally,
    )
    for row in [*sampled, *(r.row for r in failed)]:
        messages = row.get("messages") or []
        if messages and messages[0].get("role") == "system":
            messages[0] = {**messages[0], "content": stored}
    kept, turned = outcome_filter(sampled)
    return kept, [*failed, *turned]
