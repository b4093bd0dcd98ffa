"""The attempt loop: attempts in order, each with its own random stream, until every structure's
quota is met or given up (:func:`sample_walks`)."""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kgsynth.core.errors import InputFileError, KGSynthError
from kgsynth.core.stage import Reject
from kgsynth.kg.base import KG
from kgsynth.kg.graph import KGGraph
from kgsynth.walk.benchmark_sets import benchmark_seed_iris
from kgsynth.walk.config import WalkConfig, WalkError, read_lines
from kgsynth.walk.records import Walk, WalkState, stable_hash, walk_id_of, walk_to_row
from kgsynth.walk.sampler import Outcome, WalkSampler, finish
from kgsynth.walk.workers import _WorkerPool

log = logging.getLogger(__name__)

MAX_BLOCK = 256  # attempts sampled side by side, their look-ups batched
MIN_BLOCK = 16


def seed_entities(graph: KGGraph, cfg: WalkConfig) -> Sequence[str]:
    """Candidate start entities (sorted IRIs): the ``--seeds`` names, the ``--seeds-from``
    benchmark's topic entities, else every named entity."""
    if cfg.seeds_from:
        return benchmark_seed_iris(cfg.seeds_from, graph)
    if cfg.seeds:
        iris = []
        for lineno, name in read_lines(cfg.seeds, "seeds"):
            res = graph.resolve(name)
            if res is None:
                raise InputFileError(cfg.seeds, f"no entity named {name!r}", lineno)
            iris.append(res.entity.iri)
        return sorted(set(iris))
    return graph.named_iris()


# what a worker found for an attempt's walk: its answer set, or why there is none
_Answers = list[tuple[str, str]] | str | KGSynthError | None


@dataclass
class _Attempts:
    """The attempt loop's working state beside the run's :class:`WalkState`: each attempt's
    random streams and the coming attempts sampled ahead, here or by the workers."""

    cfg: WalkConfig
    state: WalkState
    sampler: WalkSampler
    seeds: Sequence[str]
    pool: _WorkerPool | None
    shard: int
    num_shards: int
    give_up: int  # attempts per accepted walk before a structure is given up
    # where this run started (a resumed run starts with the walks of its chunks)
    accepted_before: int
    first_attempt: int
    # attempt -> (structure it assumed, outcome)
    ahead: dict[int, tuple[str, Outcome]] = field(default_factory=dict)
    # attempt -> its walk's answer set as a worker found it (or why there is none)
    answers_ahead: dict[int, _Answers] = field(default_factory=dict)
    rng_prefix: str = field(init=False)

    def __post_init__(self) -> None:
        self.rng_prefix = f"{self.cfg.seed}/{self.cfg.shard}"

    def seed_of(self, attempt: int) -> str:
        # its own random stream, so the start entities of coming attempts are known ahead
        return random.Random(f"{self.cfg.seed}/{self.cfg.shard}/{attempt}/seed").choice(self.seeds)

    def rng_of(self, attempt: int) -> random.Random:
        return random.Random(f"{self.rng_prefix}/{attempt}")

    def sample_ahead(self, first: int, open_structures: list[str], weights: list[int]) -> None:
        """Sample the coming attempts side by side with the structure weights as they are now.
        An attempt is taken from here only when it picks the same structure when its turn
        comes (accepted walks change the weights); it is sampled alone otherwise."""
        state = self.state
        # about as many attempts as the open quotas still need, at the rate seen so far
        done = state.next_attempt - self.first_attempt
        rate = (done + 1) / (sum(state.accepted.values()) - self.accepted_before + 1)
        # with workers, a round holds a block for each (fewer rounds for them to wait on)
        most = MAX_BLOCK * self.cfg.workers
        size = min(most, max(MIN_BLOCK, math.ceil(sum(weights) * rate * 1.1)))
        batch = []
        for k in range(first, first + size):
            rng = self.rng_of(k)
            structure = rng.choices(open_structures, weights=weights, k=1)[0]
            batch.append((k, structure, rng, self.seed_of(k)))
        self.ahead.clear()
        self.answers_ahead.clear()
        if self.pool is not None:
            # each worker makes an attempt's random stream again from its number (cheaper
            # than sending 512 generators' states each round)
            found = self.pool.sample(
                [(k, structure, seed) for k, structure, _, seed in batch],
                (self.rng_prefix, open_structures, weights),
            )
            self.ahead.update({k: (structure, found[k][0]) for k, structure, _, _ in batch})
            self.answers_ahead.update({k: found[k][1] for k, _, _, _ in batch})
            return
        outcomes = self.sampler.sample_many(batch)
        self.ahead.update({k: (structure, outcomes[k]) for k, structure, _, _ in batch})

    def take(self, j: int, structure: str, rng: random.Random) -> tuple[Walk, str] | str:
        """Attempt ``j``'s walk (sampled ahead where it assumed ``structure``, else now) with
        its id, or the reason it is rejected; a KG error is raised."""
        try:
            assumed, outcome = self.ahead.pop(j, ("", None))
            if assumed != structure:
                outcome = finish(self.sampler.sample(structure, rng, self.seed_of(j)))
            if isinstance(outcome, KGSynthError):
                raise outcome
            if isinstance(outcome, str):
                return outcome
            walk = outcome
            assert isinstance(walk, Walk)
            if not walk.sexpr:  # a constraint walk's answers came with it
                walk.sampled_answer = walk.branches[0][-1].name
            walk_id = walk_id_of(walk)
            if (
                self.num_shards > 1
                and stable_hash(json.dumps(sorted(t[0] for t in walk.topics))) % self.num_shards
                != self.shard
            ):
                raise Reject("other_shard")
            if walk_id in self.state.keys:
                raise Reject("duplicate")
            found = self.answers_ahead.pop(j, None) if assumed == structure else None
            if found is None:
                walk.answers = self.sampler.answer_set(walk)
            elif isinstance(found, KGSynthError):
                raise found
            elif isinstance(found, str):
                raise Reject(found)
            else:  # a worker ran the answer query
                walk.sparql = self.sampler.to_sparql(walk)
                walk.answers = found
            if not walk.sexpr and walk.branches[0][-1].entity not in {a[0] for a in walk.answers}:
                raise Reject("inconsistent_answer")
            return walk, walk_id
        except Reject as rej:
            return rej.reason

    def reject(self, structure: str, reason: str) -> None:
        """Count an attempt of ``structure`` rejected for ``reason``."""
        state = self.state
        state.rejects[reason] += 1
        state.rejects_by_structure[structure][reason] += 1
        # a structure whose acceptance rate falls under 1/give_up is given up, so a KG that
        # cannot yield it ends with the counts instead of sampling forever
        if state.attempts[structure] > self.give_up * (state.accepted[structure] + 1):
            log.warning("giving up on %s after %d attempts", structure, state.attempts[structure])
            state.exhausted.add(structure)


def sample_walks(
    kg: KG,
    cfg: WalkConfig,
    *,
    state: WalkState | None = None,
    on_attempt: Callable[[WalkState], None] | None = None,
    graph: KGGraph | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield accepted walk rows in attempt order until the quotas are met (or exhausted).
    ``graph``: the cached access to ``kg`` to walk on (default: a fresh :class:`KGGraph`)."""
    graph = graph if graph is not None else KGGraph(kg)
    state = state or WalkState()
    shard, num_shards = cfg.shard_index()
    seeds = seed_entities(graph, cfg)
    if num_shards > 1:
        seeds = [s for s in seeds if stable_hash(s) % num_shards == shard]
    if not seeds:
        raise WalkError("no seed entities to start walks from (empty KG, seeds file or shard)")
    sampler = WalkSampler(graph, cfg, seeds)
    state.relations_available = len(sampler.frequency)
    quotas = cfg.quotas()
    # a graph without a cache could not keep what a batch fetched: it runs one attempt at a time
    side_by_side = graph.cache_size > 0
    pool = _WorkerPool(kg, cfg, cfg.workers) if cfg.workers > 1 else None
    attempts = _Attempts(
        cfg,
        state,
        sampler,
        seeds,
        pool,
        shard,
        num_shards,
        give_up=cfg.max_attempts_per_walk,
        accepted_before=sum(state.accepted.values()),
        first_attempt=state.next_attempt,
    )
    try:
        while True:
            open_structures = [
                s for s in quotas if state.accepted[s] < quotas[s] and s not in state.exhausted
            ]
            if not open_structures:
                return
            j = state.next_attempt
            weights = [quotas[s] - state.accepted[s] for s in open_structures]
            if side_by_side and j not in attempts.ahead:
                attempts.sample_ahead(j, open_structures, weights)
            rng = attempts.rng_of(j)
            structure = rng.choices(open_structures, weights=weights, k=1)[0]
            state.next_attempt += 1
            state.attempts[structure] += 1
            taken = attempts.take(j, structure, rng)
            if isinstance(taken, str):
                attempts.reject(structure, taken)
                if on_attempt:
                    on_attempt(state)
                continue
            walk, walk_id = taken
            state.keys.add(walk_id)
            state.accepted[structure] += 1
            if on_attempt:
                on_attempt(state)
            yield walk_to_row(walk, cfg.seed, j)

    finally:
        if pool is not None:
            pool.close()
