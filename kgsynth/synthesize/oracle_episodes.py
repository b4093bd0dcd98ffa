"""Oracle trajectories: each question's walk replayed through the tools
(the action space's ``replay``: :mod:`kgsynth.agent.spaces`), then a thought written for every step from the
question, the history so far and the next gold action only (no future leakage; the template
backend writes templated thoughts). With ``workers`` > 1 (template backend) the questions are
replayed in spawned processes over contiguous shards, with the same rows as one process."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from kgsynth.agent.loop import system_prompt, user_prompt
from kgsynth.agent.protocol import ANY_TAG_RE, THINK_RE, render_observation
from kgsynth.agent.rerank import LLMReranker
from kgsynth.agent.spaces.oracle_call import TRIAL_MODE, oracle_answers, trial_rng
from kgsynth.agent.spaces.registry import space
from kgsynth.agent.spaces.sparql_oracle import QUERY_KINDS, query_answers
from kgsynth.agent.tools import ToolEnvironment, prime_relation_ranking
from kgsynth.agent.topics import in_mention_order
from kgsynth.core.errors import ConfigError
from kgsynth.core.stage import Progress, Reject, Rejected
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM, GenerationParams, Request
from kgsynth.prompts import render
from kgsynth.synthesize.trajectory_config import TrajectoryConfig
from kgsynth.synthesize.trajectory_rows import trajectory_id, trajectory_row

Outcomes = tuple[list[dict[str, Any]], list[Rejected]]
"""Trajectory rows accepted, and the questions turned down; both in question order."""


def _shows_reference(cfg: TrajectoryConfig, row: dict[str, Any]) -> bool:
    """The seeded draw of ``--reference-share``: whether this question's prompt shows its
    reference."""
    draw = random.Random(f"reference-share|{cfg.seed}|{row['question_id']}").random()
    return draw < cfg.reference_share


def _history_text(messages: list[dict[str, str]]) -> str:
    lines = []
    for m in messages[2:]:
        if m["role"] == "assistant":
            lines.append(f"Action: {m['content']}")
        elif m["role"] == "tool":
            lines.append(f"Observation: {m['content']}")
    return "\n".join(lines)


def _parse_thought(text: str) -> str | None:
    m = THINK_RE.search(text)
    thought = (m.group(1) if m else text).strip()
    thought = ANY_TAG_RE.sub("", thought).strip()
    return " ".join(thought.split()) or None


def _thought_requests(
    plans: list[tuple[int, dict[str, Any], list[tuple[Any, Any]]]], cfg: TrajectoryConfig
) -> tuple[list[Request], list[int]]:
    """One thought request per step of every plan (the question, the observations before the
    step, the step's action), and the plan each request belongs to."""
    requests: list[Request] = []
    owner: list[int] = []
    tparams = GenerationParams(temperature=0.0, max_tokens=128, seed=cfg.seed)
    the_space = space(cfg.agent.toolset)
    turns = the_space.turns
    for p, (_, row, steps) in enumerate(plans):
        history: list[dict[str, str]] = [{}, {}]
        answer = turns.answer_action(row["answer_names"])
        actions = [c.call for c, _ in steps] + [answer]
        for s, action in enumerate(actions):
            kind = steps[s][0].kind if s < len(steps) else "answer"
            hop = steps[s][0].hop if s < len(steps) else None
            entity = steps[s][0].entity if s < len(steps) else ""
            relations = steps[s][0].relations if s < len(steps) else ()
            content = render(
                "thought", question=row["question"], history=_history_text(history), action=action
            )
            context = {"kind": kind, "entity": entity, "hop": hop, "answers": row["answer_names"]}
            if relations:  # only the SPARQL tool sets' calls; other contexts stay as they were
                context["relations"] = list(relations)
            if s < len(steps) and steps[s][0].mistake:  # a trial-and-error correction
                context["mistake"] = dict(steps[s][0].mistake)
            # the template backend writes the space's thought (the LLM layer knows no space)
            context["thought"] = the_space.thought(
                kind, entity, hop, relations, context.get("mistake")
            )
            requests.append(
                Request.make(
                    [{"role": "user", "content": content}], tparams, task="thought", context=context
                )
            )
            owner.append(p)
            if s < len(steps):
                history.append({"role": "assistant", "content": action})
                history.append({"role": "tool", "content": render_observation(steps[s][1].text)})
    return requests, owner


def _episode(
    row: dict[str, Any],
    steps: list[tuple[Any, Any]],
    texts: list[str],
    sys_text: str,
    toolset: str = "graphwalker",
    reference: str = "",
) -> dict[str, Any]:
    """The episode summary of a replay with its thoughts (``texts``: one per step, then the
    answer's), its turns written in ``toolset``'s format; with ``reference``, the user prompt
    shows it (``--reference-share``)."""
    prompt = user_prompt(row["question"], row["topic_names"], reference or None)
    messages = [
        {"role": "system", "content": sys_text},
        {"role": "user", "content": prompt},
    ]
    observed: list[str] = []
    turns = space(toolset).turns
    for (c, result), thought in zip(steps, texts, strict=False):
        turn = turns.query_turn(thought, c.call)
        messages.append({"role": "assistant", "content": turn})
        messages.append({"role": "tool", "content": render_observation(result.text)})
        observed.extend(result.entities)
    # the SPARQL tool sets answer from their query's rows, in the order the rows show them;
    # a look-ahead's relations (kind check) come after the hop the answers are copied from
    last = next((s for s in reversed(steps) if s[0].kind != "check"), None)
    if last and last[0].kind in QUERY_KINDS:
        shown = query_answers(last[1])
    else:
        # the answer copies the last observation (the hop that reaches the answers); gold an
        # earlier hop showed counts only when the last showed none
        shown = list(last[1].entities) if last else []
        if not oracle_answers(row, shown, fallback=False):
            shown = observed
    answers = oracle_answers(row, shown)
    final = turns.answer_turn(texts[-1], answers)
    messages.append({"role": "assistant", "content": final})
    no_action = {"tool": None, "args": None, "tool_error": None, "format_error": None}
    return {
        "messages": messages,
        "predicted_answers": answers,
        "answered": True,
        "forced_answer": False,
        "num_turns": len(steps) + 1,
        "tool_errors": 0,
        "format_errors": 0,
        "tool_calls": [c.call for c, _ in steps],
        "turns": [
            {
                **no_action,
                "tool": result.tool,
                "args": json.dumps(list(result.args), ensure_ascii=False),
                "entities": list(result.entities),
            }
            for _, result in steps
        ]
        + [{**no_action, "entities": []}],
        "observed_entities": list(dict.fromkeys(observed)),
    }


def oracle_trajectories(
    rows: Sequence[dict[str, Any]],
    cfg: TrajectoryConfig,
    *,
    graph: KGGraph,
    llm: LLM,
    generator: dict[str, str],
    progress: Progress | None = None,
) -> Outcomes:
    """Oracle trajectories of ``rows``: replayed, then given thoughts. (Its keyword signature
    is :func:`~kgsynth.synthesize.rollouts.rollout_trajectories`' on purpose: the stage's
    ``run`` calls one or the other by mode.) With ``cfg.trial_and_error`` (knowcoder, sexpr,
    graphwalker, kgr1), a seeded share of the questions also gets a trial-and-error trajectory
    (the space's ``trial``), right after the question's plain one."""
    sys_text = system_prompt(cfg.agent.toolset, cfg.agent.max_turns, cfg.agent.system_prompt)
    reranker = LLMReranker(llm) if cfg.agent.rerank == "llm" else None
    prime_relation_ranking(cfg.tool_config(), (row["question"] for row in rows))
    results: list[dict[str, Any] | Rejected] = []
    plans = []
    trials: set[int] = set()  # the plans that are trial-and-error demonstrations
    for row in rows:
        # a conjunction's branches replayed in the order its question names their topics
        row = in_mention_order(row)
        env = ToolEnvironment(
            graph, row["question"], cfg.tool_config(), reranker, topics=list(row["topic_names"])
        )
        try:
            steps = env.space.replay(
                row, env, fan_out=cfg.fan_out, follow=cfg.follow, look_ahead=cfg.look_ahead
            )
        except Reject as rej:
            results.append(Rejected(trajectory_row(row, 0, None, cfg, generator), rej.reason))
            continue
        results.append({})  # filled in once its thoughts are written
        plans.append((len(results) - 1, row, steps))
        if cfg.trial_and_error > 0:
            rng = trial_rng(cfg.seed, row["question_id"])
            if rng.random() < cfg.trial_and_error:
                tried = env.space.trial(row, env, steps, rng)
                if tried is not None:
                    results.append({})
                    trials.add(len(plans))
                    plans.append((len(results) - 1, row, tried))
    requests, owner = _thought_requests(plans, cfg)
    report = (lambda i, c: progress(i + 1, len(requests), "thoughts")) if progress else None
    thoughts = llm.generate_batch(requests, report)
    by_plan: dict[int, list[str | None]] = {}
    for p, comp in zip(owner, thoughts, strict=True):
        by_plan.setdefault(p, []).append(_parse_thought(comp.text) if comp.ok else None)
    for p, (i, row, steps) in enumerate(plans):
        texts = by_plan[p]
        if any(t is None for t in texts):
            bad = trajectory_row(row, int(p in trials), None, cfg, generator)
            results[i] = Rejected(bad, "thought_unusable")
            continue
        reference = ""
        if cfg.reference_share > 0 and p not in trials and _shows_reference(cfg, row):
            reference = space(cfg.agent.toolset).reference_text(row, graph)
        episode = _episode(row, steps, texts, sys_text, cfg.agent.toolset, reference)  # type: ignore[arg-type]
        if p in trials:
            out = trajectory_row(row, 1, episode, cfg, generator)
            out.update(
                mode=TRIAL_MODE, trajectory_id=trajectory_id(row["question_id"], TRIAL_MODE, 1)
            )
            results[i] = out
        else:
            results[i] = trajectory_row(row, 0, episode, cfg, generator)
    accepted = [r for r in results if not isinstance(r, Rejected)]
    return accepted, [r for r in results if isinstance(r, Rejected)]


# --- oracle replays in worker processes (--workers N) -------------------------------------


def _oracle_shard(
    location: str,
    profile: str,
    rows: list[dict[str, Any]],
    cfg: TrajectoryConfig,
    generator: dict[str, str],
) -> Outcomes:
    """One worker: open the KG, replay its shard with the template backend."""
    from kgsynth.kg.open import open_kg
    from kgsynth.llm.template import TemplateLLM

    graph = KGGraph(open_kg(location, profile=profile))
    return oracle_trajectories(rows, cfg, graph=graph, llm=TemplateLLM(), generator=generator)


def oracle_in_workers(
    rows: Sequence[dict[str, Any]],
    cfg: TrajectoryConfig,
    *,
    graph: KGGraph,
    generator: dict[str, str],
    progress: Progress | None = None,
) -> Outcomes:
    """The oracle over ``cfg.workers`` contiguous shards in spawned processes (each opens the
    KG itself); shards are joined in order, so the rows are those of one process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    location = getattr(graph.kg, "location", "")
    if not location or location == ":memory:":
        raise ConfigError(
            "--workers: the worker processes open the KG themselves; give a store directory, "
            "a triple file or an endpoint (not an in-memory store)"
        )
    n = cfg.workers
    size = -(-len(rows) // n) if rows else 0
    shards = [list(rows[i : i + size]) for i in range(0, len(rows), size)] if size else []
    accepted: list[dict[str, Any]] = []
    rejected: list[Rejected] = []
    from kgsynth.core.cores import worker_ignores_interrupts

    with ProcessPoolExecutor(
        max_workers=n,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=worker_ignores_interrupts,
    ) as pool:
        futures = [
            pool.submit(_oracle_shard, location, graph.kg.profile.name, shard, cfg, generator)
            for shard in shards
        ]
        done = 0
        for shard, fut in zip(shards, futures, strict=True):
            acc, rej = fut.result()
            accepted.extend(acc)
            rejected.extend(rej)
            done += len(shard)
            if progress:
                progress(done, len(rows), "thoughts")
    return accepted, rejected
