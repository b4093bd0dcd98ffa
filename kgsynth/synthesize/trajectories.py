"""``kgsynth synthesize trajectories``: questions.parquet -> trajectories.parquet.

Three modes, one agent loop and one tool environment (the same ranking and limits as RL and
eval):

- ``oracle`` (GraphWalker's GraphSynth): each question's walk is replayed as tool calls
  (``get_relations`` then ``get_triples`` per hop; both branches of a conjunction, then IP's
  last hop) through the real environment. A step whose gold relation is not among the ranked
  relations shown, or whose next entity on the path is not among the triples shown, rejects
  the trajectory with that reason. Then a thought is written for every step from the question,
  the history so far and the next gold action only (no future leakage); the template backend
  writes templated thoughts.
- ``referenced`` (KBQA-R1 Referenced Rejection Sampling): the policy runs with the oracle's
  action sequence in its prompt; stored messages carry the prompt without it (the ``reference``
  column keeps the hint so ``kgsynth filter`` can reject trajectories where hint text survives).
- ``free``: the policy runs without hints, ``samples`` episodes per question at ``temperature``
  (expert rollouts through an API, or a local checkpoint through ``hf``).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.agent.loop import (
    PROMPT_STYLES,
    EpisodeTask,
    episode_summary,
    run_episodes,
    system_prompt,
    user_prompt,
)
from kgsynth.agent.protocol import render_observation
from kgsynth.agent.rerank import LLMReranker
from kgsynth.agent.tools import (
    RELATION_RANKINGS,
    RERANK_MODES,
    ToolConfig,
    ToolEnvironment,
    prime_relation_ranking,
)
from kgsynth.errors import ConfigError
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.base import LLM, GenerationParams, Request
from kgsynth.metrics import normalize_answer
from kgsynth.prompts import prompt_hash, render

MODES = ("oracle", "referenced", "free")
STRATA = ("none", "structure", "hops")


@dataclass(frozen=True)
class TrajectoryConfig:
    """Options of ``kgsynth synthesize trajectories``."""

    mode: str = "oracle"
    samples: int = 1
    temperature: float = 0.7
    max_turns: int = 10
    max_tokens: int = 512
    toolset: str = "graphwalker"
    top_k_relations: int = 10
    max_triples: int = 5
    rerank: str = "none"  # none | llm: GraphWalker's LLM rerank of the BM25 top-20 relations
    relation_ranking: str = "bm25"  # bm25 | hybrid: BM25 plus sentence-encoder similarity
    seed: int = 0
    system_prompt: str = "full"  # full | short (see kgsynth.agent.loop.system_prompt)
    # free/referenced: sample with GraphRoll-style reflection instructions added to the system
    # prompt (prompts/reflection.j2); the stored trajectory keeps the plain prompt
    reflection: bool = False
    # oracle + template: replay the questions in N spawned processes over contiguous shards
    workers: int = 1
    fan_out: int = 1  # oracle: follow a chain's next hop from up to this many entities (replay)
    stratify: str = "none"  # none | structure | hops: how --limit draws its questions
    split: str = "all"  # all | train | heldout: a stable split by question_id hash (split_of)
    heldout_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.system_prompt not in PROMPT_STYLES:
            raise ConfigError(
                f"--system-prompt must be one of {', '.join(PROMPT_STYLES)} (got {self.system_prompt!r})"
            )
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)} (got {self.mode!r})")
        if self.toolset not in ("graphwalker", "kgr1"):
            raise ConfigError(f"--tools must be graphwalker or kgr1 (got {self.toolset!r})")
        if self.rerank not in RERANK_MODES:
            raise ConfigError(f"--rerank must be none or llm (got {self.rerank!r})")
        if self.relation_ranking not in RELATION_RANKINGS:
            raise ConfigError(
                f"--relation-ranking must be bm25 or hybrid (got {self.relation_ranking!r})"
            )
        if self.samples < 1 or self.max_turns < 1 or self.max_tokens < 1:
            raise ConfigError("--samples, --max-turns and --max-tokens must be >= 1")
        if self.split not in ("all", "train", "heldout"):
            raise ConfigError(f"--split must be all, train or heldout (got {self.split!r})")
        if not 0 < self.heldout_fraction < 1:
            raise ConfigError(f"--heldout-fraction must be in (0, 1) (got {self.heldout_fraction})")
        if not 1 <= self.workers <= 256:
            raise ConfigError(f"--workers must be between 1 and 256 (got {self.workers})")
        if self.reflection and self.mode == "oracle":
            raise ConfigError(
                "--reflection applies to sampled trajectories (--mode free or referenced); "
                "the oracle replays a walk and samples nothing"
            )
        if self.fan_out < 1:
            raise ConfigError(f"--fan-out must be >= 1 (got {self.fan_out})")
        if self.stratify not in STRATA:
            raise ConfigError(
                f"--stratify must be one of {', '.join(STRATA)} (got {self.stratify!r})"
            )

    def tool_config(self) -> ToolConfig:
        return ToolConfig(
            toolset=self.toolset,  # type: ignore[arg-type]
            top_k_relations=self.top_k_relations,
            max_triples_per_relation=self.max_triples,
            rerank=self.rerank,  # type: ignore[arg-type]
            relation_ranking=self.relation_ranking,  # type: ignore[arg-type]
        )


class OracleReject(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _ordered_hops(row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(start entity name, hop)`` in replay order: each branch up to the meeting point, then
    the hops after it (IP's last hop, from the meeting entity)."""
    main: list[tuple[str, dict[str, Any]]] = []
    tail: list[tuple[str, dict[str, Any]]] = []
    for topic, hops, merge in zip(
        row["topic_names"], row["branches"], row["merge_at"], strict=True
    ):
        cur = topic
        for i, hop in enumerate(hops):
            (main if i < merge else tail).append((cur, hop))
            cur = hop["entity"]
    return main + tail


@dataclass(frozen=True)
class OracleCall:
    kind: str  # relations | triples
    call: str
    entity: str  # the entity the call is about
    hop: dict[str, Any]


def _calls_for(entity: str, hop: dict[str, Any], toolset: str) -> tuple[OracleCall, OracleCall]:
    """The relations call and the triples call of one hop from ``entity``."""
    rel = hop["relation"]
    if toolset == "graphwalker":
        return (
            OracleCall("relations", f"get_relations({_q(entity)})", entity, hop),
            OracleCall("triples", f"get_triples({_q(entity)}, [{_q(rel)}])", entity, hop),
        )
    side = "head" if hop["inverse"] else "tail"
    return (
        OracleCall("relations", f"get_{side}_relations({_q(entity)})", entity, hop),
        OracleCall("triples", f"get_{side}_entities({_q(entity)}, {_q(rel)})", entity, hop),
    )


def oracle_calls(row: dict[str, Any], toolset: str) -> list[OracleCall]:
    """The gold action sequence of a question's walk."""
    calls = []
    for entity, hop in _ordered_hops(row):
        calls.extend(_calls_for(entity, hop, toolset))
    return calls


def reference_text(row: dict[str, Any], toolset: str) -> str:
    return "\n".join(f"{i}. {c.call}" for i, c in enumerate(oracle_calls(row, toolset), 1))


_LISTED_AS = re.compile(r'^Relations of "(.*)" \(showing', re.MULTILINE)


def replay(
    row: dict[str, Any], env: ToolEnvironment, *, fan_out: int = 1
) -> list[tuple[OracleCall, Any]]:
    """Run the oracle calls; returns ``(call, ToolResult)`` per step, or raises
    :class:`OracleReject` when a gold relation is not among the relations shown (same BM25
    ranking and top-k as inference), or when a conjunction's meeting entity is not among the
    triples shown.

    On a chain, when the walked entity is not among the neighbours the observation shows (the
    display cap), the replay goes on from the first shown entity (in display order) from which
    the next hop's relation leads on, so no chain is lost to the cap; only when none does is it
    rejected (``gold_entity_not_retrievable``).

    On a chain, a hop often reaches several entities (the films a person directed), and the
    answers are what the next hop reaches from all of them. With ``fan_out`` > 1, after the
    walked entity's next hop the same relation is followed from the others too (up to
    ``fan_out`` entities in all; those without the relation are passed over), so the replay
    observes the whole answer set instead of the part reached through the walked entity.
    The default (1) replays the walk alone: on the tiny CPU recipe, fan-out 4 made the agent
    go on after 1-hop answers and copy worse (benchmarks/README.md, learning sweep)."""
    toolset = env.config.toolset
    calls = oracle_calls(row, toolset)
    continues_from = {c.entity for c in calls}
    chain = len(row["branches"]) == 1
    topics = set(row["topic_names"])
    steps = []
    others: list[str] = []  # the other entities the walked one's hop reached
    instead: dict[str, str] = {}  # walked entity -> the shown one the replay goes on from
    for k, c in enumerate(calls):
        if c.entity in instead:
            c = _calls_for(instead[c.entity], c.hop, toolset)[0 if c.kind == "relations" else 1]
        result = env.execute(c.call)
        if result.error is not None:
            raise OracleReject(f"oracle_{result.error.value}")
        if c.kind == "relations":
            m = _LISTED_AS.search(result.text)
            shown = m.group(1) if m else c.entity
            hop = c.hop
            pattern = (
                f"(?, {hop['relation']}, {shown})"
                if hop["inverse"]
                else f"({shown}, {hop['relation']}, ?)"
            )
            if pattern not in result.text.splitlines():
                raise OracleReject("gold_relation_not_retrievable")
            steps.append((c, result))
            continue
        if c.hop["entity"] in continues_from and c.hop["entity"] not in result.entities:
            nxt_hop = calls[k + 2].hop if chain and k + 2 < len(calls) else None
            sub = _shown_substitute(env, result, c, nxt_hop, topics) if nxt_hop else None
            if sub is None:
                raise OracleReject("gold_entity_not_retrievable")
            instead[c.hop["entity"]] = sub
        steps.append((c, result))
        if not chain:
            continue
        sources = [c.entity]
        reached = list(result.entities)
        for other in others:
            extra = _calls_for(other, c.hop, env.config.toolset)[1]
            got = env.execute(extra.call)
            if got.error is None:
                steps.append((extra, got))
                sources.append(other)
                reached.extend(got.entities)
        nxt = instead.get(c.hop["entity"], c.hop["entity"])
        seen = {nxt, *sources, *topics}
        others = []
        for entity in reached:
            if entity not in seen and len(others) < fan_out - 1:
                others.append(entity)
            seen.add(entity)
    return steps


def _shown_substitute(
    env: ToolEnvironment, result: Any, call: OracleCall, next_hop: dict[str, Any], topics: set[str]
) -> str | None:
    """The first entity ``result`` shows (display order; not the call's own entity or a topic)
    from which ``next_hop``'s relation returns triples."""
    for name in result.entities:
        if name == call.entity or name in topics:
            continue
        probe = _calls_for(name, next_hop, env.config.toolset)[1]
        if env.execute(probe.call).error is None:
            return name
    return None


def oracle_answers(row: dict[str, Any], observed: Sequence[str]) -> list[str]:
    """The oracle's answer: the gold answers its observations showed, in the order and spelling
    they were first shown (so the answer copies the observation line by line, whatever order
    the tools list neighbours in), or the whole gold set when none was shown. A display cap or
    a replay through one of several entities can show only part of the set; the filter's
    outcome check then decides."""
    gold = {normalize_answer(a) for a in row["answer_names"]}
    shown: dict[str, str] = {}
    for name in observed:
        key = normalize_answer(name)
        if key in gold and key not in shown:
            shown[key] = name
    return list(shown.values()) or list(row["answer_names"])


def _history_text(messages: list[dict[str, str]]) -> str:
    lines = []
    for m in messages[2:]:
        if m["role"] == "assistant":
            lines.append(f"Action: {m['content']}")
        elif m["role"] == "tool":
            lines.append(f"Observation: {m['content']}")
    return "\n".join(lines)


def synthesize_oracle(
    rows: Sequence[dict[str, Any]],
    cfg: TrajectoryConfig,
    *,
    graph: KGGraph,
    llm: LLM,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Oracle trajectories (accepted rows, rejected rows)."""
    sys_text = system_prompt(cfg.toolset, cfg.max_turns, cfg.system_prompt)
    reranker = LLMReranker(llm) if cfg.rerank == "llm" else None
    prime_relation_ranking(cfg.tool_config(), (row["question"] for row in rows))
    plans = []
    rejected = []
    for row in rows:
        env = ToolEnvironment(graph, row["question"], cfg.tool_config(), reranker)
        try:
            steps = replay(row, env, fan_out=cfg.fan_out)
        except OracleReject as rej:
            rejected.append((row, rej.reason))
            continue
        plans.append((row, steps))
    # one thought request per step: the question, the observations before it, the next action
    requests: list[Request] = []
    index: list[tuple[int, int]] = []
    tparams = GenerationParams(temperature=0.0, max_tokens=128, seed=cfg.seed)
    for p, (row, steps) in enumerate(plans):
        history: list[dict[str, str]] = [{}, {}]
        actions = [c.call for c, _ in steps] + [f"<answer>{_q_list(row['answer_names'])}</answer>"]
        for s, action in enumerate(actions):
            kind = steps[s][0].kind if s < len(steps) else "answer"
            hop = steps[s][0].hop if s < len(steps) else None
            entity = steps[s][0].entity if s < len(steps) else ""
            requests.append(
                Request.make(
                    [
                        {
                            "role": "user",
                            "content": render(
                                "thought",
                                question=row["question"],
                                history=_history_text(history),
                                action=action,
                            ),
                        }
                    ],
                    tparams,
                    task="thought",
                    context={
                        "kind": kind,
                        "entity": entity,
                        "hop": hop,
                        "answers": row["answer_names"],
                    },
                )
            )
            index.append((p, s))
            if s < len(steps):
                history.append({"role": "assistant", "content": action})
                history.append({"role": "tool", "content": render_observation(steps[s][1].text)})
    thoughts = llm.generate_batch(requests, (lambda i, c: progress(i)) if progress else None)
    by_plan: dict[int, list[str | None]] = {}
    for (p, _), comp in zip(index, thoughts, strict=True):
        by_plan.setdefault(p, []).append(_parse_thought(comp.text) if comp.ok else None)
    accepted = []
    for p, (row, steps) in enumerate(plans):
        texts = by_plan[p]
        if any(t is None for t in texts):
            rejected.append((row, "thought_unusable"))
            continue
        messages = [
            {"role": "system", "content": sys_text},
            {"role": "user", "content": user_prompt(row["question"], row["topic_names"])},
        ]
        observed: list[str] = []
        for (c, result), thought in zip(steps, texts, strict=False):
            messages.append(
                {
                    "role": "assistant",
                    "content": f"<think>{thought}</think>\n<kg-query>{c.call}</kg-query>",
                }
            )
            messages.append({"role": "tool", "content": render_observation(result.text)})
            observed.extend(result.entities)
        answers = oracle_answers(row, observed)
        messages.append(
            {
                "role": "assistant",
                "content": f"<think>{texts[-1]}</think>\n<answer>{_q_list(answers)}</answer>",
            }
        )
        accepted.append(
            {
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
                        "tool": result.tool,
                        "args": json.dumps(list(result.args), ensure_ascii=False),
                        "tool_error": None,
                        "format_error": None,
                        "entities": list(result.entities),
                    }
                    for _, result in steps
                ]
                + [
                    {
                        "tool": None,
                        "args": None,
                        "tool_error": None,
                        "format_error": None,
                        "entities": [],
                    }
                ],
                "observed_entities": list(dict.fromkeys(observed)),
                "_row": row,
                "_sample": 0,
                "_reference": "",
            }
        )
    return accepted, [{"_row": r, "_sample": 0, "_reason": why} for r, why in rejected]


def _q_list(answers: Sequence[str]) -> str:
    return json.dumps(list(answers), ensure_ascii=False)


def _parse_thought(text: str) -> str | None:
    m = re.search(r"<think>(.*?)</think>", text, re.DOTALL)
    thought = (m.group(1) if m else text).strip()
    thought = re.sub(r"</?(think|kg-query|answer|information)>", "", thought).strip()
    return " ".join(thought.split()) or None


def synthesize_rollouts(
    rows: Sequence[dict[str, Any]],
    cfg: TrajectoryConfig,
    *,
    graph: KGGraph,
    llm: LLM,
    on_turn: Callable[[int, int], None] | None = None,
    system_text: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``referenced`` and ``free`` episodes: the policy acts, the environment answers.
    ``system_text`` (a checkpoint's stored prompt) replaces the ``system_prompt`` style."""
    tasks: list[EpisodeTask] = []
    meta: list[tuple[dict[str, Any], int, str]] = []
    for row in rows:
        ref = reference_text(row, cfg.toolset) if cfg.mode == "referenced" else ""
        for sample in range(cfg.samples):
            tasks.append(EpisodeTask(row["question"], list(row["topic_names"]), ref or None))
            meta.append((row, sample, ref))
    by_task = {id(t): (row["question"]) for t, (row, _, _) in zip(tasks, meta, strict=True)}

    reranker = LLMReranker(llm) if cfg.rerank == "llm" else None
    prime_relation_ranking(cfg.tool_config(), (row["question"] for row in rows))

    def make_env(task: EpisodeTask) -> ToolEnvironment:
        return ToolEnvironment(graph, by_task[id(task)], cfg.tool_config(), reranker)

    stored_text = system_text or system_prompt(cfg.toolset, cfg.max_turns, cfg.system_prompt)
    sampling_text = stored_text
    if cfg.reflection:
        sampling_text = stored_text.rstrip("\n") + "\n" + render("reflection")

    # one seed per sample, so that N samples are N different requests (and cache entries)
    accepted: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for sample in range(cfg.samples):
        idx = [i for i, (_, s, _) in enumerate(meta) if s == sample]
        params = GenerationParams(
            temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed + sample
        )
        episodes = run_episodes(
            llm,
            [tasks[i] for i in idx],
            make_env,
            toolset=cfg.toolset,
            max_turns=cfg.max_turns,
            params=params,
            on_turn=on_turn,
            system_text=sampling_text,
        )
        for i, ep in zip(idx, episodes, strict=True):
            row, s, ref = meta[i]
            if cfg.reflection and ep.messages and ep.messages[0]["role"] == "system":
                # train on the agent's own prompt: the reflection text only shaped the sample
                ep.messages[0] = {"role": "system", "content": stored_text}
            if ep.turns and all(t.llm_error for t in ep.turns):
                rejected.append(
                    {
                        "_row": row,
                        "_sample": s,
                        "_reason": "llm_error",
                        **episode_summary(ep),
                        "_reference": ref,
                    }
                )
                continue
            accepted.append({**episode_summary(ep), "_row": row, "_sample": s, "_reference": ref})
    return accepted, rejected


# --- oracle replays in worker processes (--workers N) -------------------------------------


def _oracle_shard(
    location: str, profile: str, rows: list[dict[str, Any]], cfg: TrajectoryConfig, shard: int
) -> tuple[int, list[dict[str, Any]], list[tuple[int, dict[str, Any]]]]:
    """One worker: open the KG, replay its shard with the template backend. Rows go back by
    their index in the shard (a process boundary does not keep object identity)."""
    from kgsynth.kg.open import open_kg
    from kgsynth.llm.template import TemplateLLM

    graph = KGGraph(open_kg(location, profile=profile))
    acc, rej = synthesize_oracle(rows, cfg, graph=graph, llm=TemplateLLM())
    index = {id(r): i for i, r in enumerate(rows)}
    for a in acc:
        a["_row"] = index[id(a["_row"])]
    return shard, acc, [(index[id(r["_row"])], {**r, "_row": None}) for r in rej]


def _oracle_in_workers(
    rows: Sequence[dict[str, Any]],
    cfg: TrajectoryConfig,
    graph: KGGraph,
    progress: Callable[[str, int, int], None] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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
    results: dict[int, tuple[list, list]] = {}
    with ProcessPoolExecutor(
        max_workers=n, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        futures = [
            pool.submit(_oracle_shard, location, graph.kg.profile.name, shard, cfg, k)
            for k, shard in enumerate(shards)
        ]
        done = 0
        for fut in futures:
            k, acc, rej = fut.result()
            results[k] = (acc, rej)
            done += len(shards[k])
            if progress:
                progress("thoughts", done - 1, 0)
    accepted: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for k, shard in enumerate(shards):
        acc, rej = results[k]
        for a in acc:
            accepted.append({**a, "_row": shard[a["_row"]]})
        for i, r in rej:
            rejected.append({**r, "_row": shard[i]})
    return accepted, rejected


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


def trajectory_id(question_id: str, mode: str, sample: int) -> str:
    return "t-" + hashlib.sha1(f"{question_id}|{mode}|{sample}".encode()).hexdigest()[:16]


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


def to_row(
    item: dict[str, Any], cfg: TrajectoryConfig, generator: dict[str, str]
) -> dict[str, Any]:
    row = item["_row"]
    out = {**EMPTY_EPISODE, **{k: v for k, v in item.items() if not k.startswith("_")}}
    out.update(
        trajectory_id=trajectory_id(row["question_id"], cfg.mode, item["_sample"]),
        question_id=row["question_id"],
        walk_id=row.get("walk_id"),
        mode=cfg.mode,
        sample=item["_sample"],
        question=row["question"],
        topic_names=list(row["topic_names"]),
        structure=row.get("structure"),
        hops=row.get("hops"),
        gold_answers=list(row["answer_names"]),
        reference=item.get("_reference") or "",
        generator=generator,
    )
    if "_reason" in item:
        out["reject_reason"] = item["_reason"]
    return out


def synthesize_trajectories(
    rows: Sequence[dict[str, Any]],
    cfg: TrajectoryConfig,
    *,
    graph: KGGraph,
    llm: LLM,
    progress: Callable[[str, int, int], None] | None = None,
    system_text: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Run the stage; returns (trajectory rows, rejected rows, stats). ``system_text``: the
    policy checkpoint's stored system prompt, used by free and referenced rollouts."""
    if cfg.mode != "oracle" and llm.backend == "template":
        raise ConfigError(
            f"--mode {cfg.mode} needs a policy model (--llm openai or hf); the template backend "
            "only writes oracle thoughts"
        )
    generator = {
        "backend": llm.backend,
        "model": llm.model,
        "prompt_hash": prompt_hash("agent_system", "thought"),
    }
    if cfg.mode == "oracle" and cfg.workers > 1:
        if llm.backend != "template":
            raise ConfigError(
                "--workers replays oracle trajectories in several processes with the template "
                "backend; an API backend already sends its requests concurrently (--concurrency)"
            )
        acc, rej = _oracle_in_workers(rows, cfg, graph, progress)
    elif cfg.mode == "oracle":
        acc, rej = synthesize_oracle(
            rows,
            cfg,
            graph=graph,
            llm=llm,
            progress=(lambda i: progress("thoughts", i, 0)) if progress else None,
        )
    else:
        acc, rej = synthesize_rollouts(
            rows,
            cfg,
            graph=graph,
            llm=llm,
            on_turn=(lambda t, n: progress("turn", t, n)) if progress else None,
            system_text=system_text,
        )
    # rejects in question order, whichever phase (or process) rejected them
    position = {id(row): i for i, row in enumerate(rows)}
    rej = sorted(rej, key=lambda r: position.get(id(r["_row"]), len(rows)))
    accepted = [to_row(a, cfg, generator) for a in acc]
    rejected = [to_row(r, cfg, generator) for r in rej]
    reasons = Counter(r["reject_reason"] for r in rejected)
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
    return accepted, rejected, stats
