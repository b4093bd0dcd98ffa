"""Sampling one walk of a structure: hop by hop under the fan-out constraint (GraphWalker Eq. 1),
the relation drawn as ``relation_sampling`` says (``weighted-both``: either direction, relation
types weighted by ``frequency ** -relation_balance``; ``uniform-out``: GraphWalker's Alg. 1,
App. B.1, the outgoing relations uniformly), and many attempts side by side with their look-ups
fetched in batched queries (:meth:`WalkSampler.sample_many`)."""

from __future__ import annotations

import logging
import random
from collections.abc import Generator, Sequence
from typing import Any, TypeVar

from kgsynth.core.errors import ConfigError, InputFileError, KGSynthError
from kgsynth.core.stage import Reject
from kgsynth.kg.graph import KGGraph, Relation
from kgsynth.kg.terms import Term
from kgsynth.walk.answers import AnswerQueries
from kgsynth.walk.benchmark_sets import benchmark_relation_set
from kgsynth.walk.config import CONSTRAINT_STRUCTURES, WalkConfig, read_lines, read_list
from kgsynth.walk.constraints import ConstraintSampling
from kgsynth.walk.records import Hop, Walk
from kgsynth.walk.values import AttributeCatalog

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a sampling step asks for before it reads the graph: ``(FANOUTS, iri)``,
# ``(TARGETS, (iri, relation))`` or ``(LABEL, iri)``, the :class:`KGGraph` look-ups of those
# names. Run alone, a step's requests are ignored and each look-up is a query of its own; run
# side by side (:meth:`WalkSampler.sample_many`), the requests of every attempt are fetched
# together in batched queries first.
FANOUTS, TARGETS, LABEL = "fanouts", "targets", "label"
Needs = tuple[tuple[str, Any], ...]
Steps = Generator[Needs, None, T]
# a walk, why it was rejected, or the error that stopped it (a reason, not a Reject: a
# stored exception's traceback would keep the frames it crossed alive in reference cycles)
Outcome = Walk | str | KGSynthError


def finish(steps: Steps[T]) -> T:
    """Run a sampling generator to its result, its look-ups fetched one by one as it reads."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


class WalkSampler(AnswerQueries, ConstraintSampling):
    """Samples walks of one structure at a time; all KG access goes through ``graph``."""

    def __init__(self, graph: KGGraph, cfg: WalkConfig, seeds: Sequence[str]) -> None:
        self.graph = graph
        self.cfg = cfg
        self.seeds = seeds
        self.allowed = (
            set(read_list(cfg.relations, "relation whitelist")) if cfg.relations else None
        )
        self.excluded = (
            set(read_list(cfg.exclude_relations, "relation blacklist"))
            if cfg.exclude_relations
            else set()
        )
        self.frequency = self._relation_frequency()
        if cfg.relations_from:
            self.allowed = benchmark_relation_set(cfg.relations_from, graph, self._known_relation)
        self._weights: dict[Relation, float] = {}
        self._check_relation_names()
        self.attributes = AttributeCatalog(graph)

    def _known_relation(self, name: str) -> bool:
        """A relation of the KG, or a flattened hop ``a.b`` across an unnamed node."""
        if name in self.frequency:
            return True
        return any(
            name[:i] in self.frequency and name[i + 1 :] in self.frequency
            for i, ch in enumerate(name)
            if ch == "."
        )

    def _check_relation_names(self) -> None:
        """A whitelisted relation the KG lacks is an error naming it (a typo would otherwise
        end every walk in ``dead_end``); a blacklisted one is only logged."""
        if self.cfg.relations:
            for line, name in read_lines(self.cfg.relations, "relation whitelist"):
                if not self._known_relation(name):
                    known = ", ".join(sorted(self.frequency)[:8])
                    raise InputFileError(
                        self.cfg.relations,
                        f"--relations: relation {name!r} is not in the KG (it has e.g. {known})",
                        line,
                    )
        unknown = sorted(r for r in self.excluded if not self._known_relation(r))
        if unknown:
            log.warning("--exclude-relations: not in the KG: %s", ", ".join(unknown[:20]))

    def _relation_frequency(self) -> dict[str, int]:
        prof = self.graph.profile
        # a store made by `kg import` counted them once (a scan of every triple: seconds on
        # a large KG); the same numbers as the query
        stored = getattr(self.graph.kg, "meta", {}).get("relation_triples")
        if isinstance(stored, dict):
            counts = [(p, int(n)) for p, n in stored.items()]
        else:
            rows = self.graph.kg.select("SELECT ?p (COUNT(*) AS ?n) WHERE { ?s ?p ?o } GROUP BY ?p")
            counts = [(r["p"].value, int(r["n"].value)) for r in rows if "p" in r]
        return {prof.relation_name(p): n for p, n in counts if not prof.is_hidden(p)}

    def _weight(self, rel: Relation) -> float:
        weight = self._weights.get(rel)
        if weight is None:
            freq = 1
            for p in rel.path:  # a flattened hop weighs like its rarer edge
                name = self.graph.profile.relation_name(p)
                freq = max(freq, min(self.frequency.get(name, 1), 10**12))
            weight = self._weights[rel] = freq ** (-self.cfg.relation_balance)
        return weight

    def _allowed(self, rel: Relation) -> bool:
        if rel.name in self.excluded:
            return False
        return self.allowed is None or rel.name in self.allowed

    def _candidates(
        self,
        iri: str,
        *,
        check_fanout: bool = True,
        bounds: tuple[int, int] | None = None,
        backwards: bool = False,
    ) -> list[Relation]:
        """The relations a hop from ``iri`` may take (``backwards``: a hop into ``iri``, read
        from its side). Under ``uniform-out`` only those a forward walk takes out of an entity:
        outgoing from ``iri``, or incoming to it when ``backwards``."""
        fanouts = self.graph.fanouts(iri)
        if self.allowed is None and not self.excluded:
            rels = list(fanouts)
        else:
            rels = [r for r in fanouts if self._allowed(r)]
        if self.cfg.relation_sampling == "uniform-out":
            rels = [r for r in rels if r.direction == ("in" if backwards else "out")]
        if not rels:
            raise Reject("dead_end")
        if check_fanout:
            lo, hi = bounds or (self.cfg.min_fanout, self.cfg.max_fanout)
            rels = [r for r in rels if lo <= fanouts[r] <= hi]
            if not rels:
                raise Reject("fanout")
        return rels

    def _pick_relation(self, rng: random.Random, rels: list[Relation]) -> Relation:
        if self.cfg.relation_sampling == "uniform-out":
            return rels[rng.randrange(len(rels))]  # Alg. 1 line 12: r_t ~ R_t, uniformly
        return rng.choices(rels, weights=[self._weight(r) for r in rels], k=1)[0]

    def _name(self, term: Term) -> str:
        if term.kind != "iri":
            return term.value
        name = self.graph.label(term.value)
        if name is None:
            raise Reject("unnamed_node")
        return name

    def _step(
        self,
        rng: random.Random,
        iri: str,
        visited: set[str],
        *,
        final: bool,
        bounds: tuple[int, int] | None = None,
    ) -> Steps[Hop]:
        """One hop from ``iri`` along a relation whose fan-out lies within ``bounds`` (default
        ``[min_fanout, max_fanout]``); ``final``: the walk may end at a literal."""
        yield ((FANOUTS, iri),)
        rel = self._pick_relation(rng, self._candidates(iri, bounds=bounds))
        yield ((TARGETS, (iri, rel)),)
        target = self.graph.choose_target(iri, rel, rng, visited)
        if target is None:
            raise Reject("cycle")
        if target.kind != "iri":
            if not final:
                raise Reject("dead_end")
        elif final:
            yield ((LABEL, target.value),)
        else:  # the next hop starts from the target: ask for its relations at the same time
            yield ((LABEL, target.value), (FANOUTS, target.value))
        return Hop(rel, target.value, self._name(target), target.kind == "iri")

    def _seed(self, iri: str) -> Steps[tuple[str, str]]:
        # every structure lists the start entity's relations next
        yield ((LABEL, iri), (FANOUTS, iri))
        return iri, self._name(Term("iri", iri))

    # --- structures ----------------------------------------------------------------------

    def sample(self, structure: str, rng: random.Random, seed: str) -> Steps[Walk]:
        """One walk of ``structure`` starting from the entity ``seed`` (the topic of a chain,
        the answer of a 2I/IP, the topic of PI's chain), as a generator that says which
        look-ups it needs before it reads them (run it with :func:`finish`)."""
        if structure.startswith("chain-"):
            return (yield from self._chain(int(structure.split("-")[1]), rng, seed))
        if structure == "2I":
            return (yield from self._two_i(rng, seed))
        if structure == "IP":
            walk = yield from self._two_i(rng, seed)
            visited = {t[0] for t in walk.topics} | {walk.branches[0][-1].entity}
            hop = yield from self._step(rng, walk.branches[0][-1].entity, visited, final=True)
            walk.branches[0].append(hop)
            walk.structure = "IP"
            return walk
        if structure == "PI":
            return (yield from self._pi(rng, seed))
        if structure in CONSTRAINT_STRUCTURES:
            return (yield from self._constraint(structure, rng, seed))
        raise ConfigError(f"unknown structure {structure!r}")

    def _chain(self, k: int, rng: random.Random, seed: str) -> Steps[Walk]:
        # a wide chain-1 takes a relation with more neighbours than --max-fanout (a large
        # answer set) from a neighbour of the seed: an entity with many neighbours is the
        # neighbour of many, where a seed drawn uniformly is rarely one
        wide = k == 1 and self.cfg.wide_share > 0 and rng.random() < self.cfg.wide_share
        bounds = (self.cfg.max_fanout + 1, self.cfg.wide_max_answers) if wide else None
        if wide:
            seed = yield from self._neighbor(rng, seed)
        topic = yield from self._seed(seed)
        visited = {topic[0]}
        hops: list[Hop] = []
        current = topic[0]
        for i in range(k):
            hop = yield from self._step(rng, current, visited, final=i == k - 1, bounds=bounds)
            hops.append(hop)
            visited.add(hop.entity)
            current = hop.entity
        return Walk(f"chain-{k}", [topic], [hops], [k])

    def _neighbor(self, rng: random.Random, iri: str) -> Steps[str]:
        """An entity one hop from ``iri``, along a relation drawn as a hop's is (any fan-out)."""
        yield ((FANOUTS, iri),)
        rel = self._pick_relation(rng, self._candidates(iri, check_fanout=False))
        yield ((TARGETS, (iri, rel)),)
        target = self.graph.choose_target(iri, rel, rng, {iri})
        if target is None or target.kind != "iri":
            raise Reject("fanout")
        return target.value

    def _branch_to(
        self, rng: random.Random, answer: str, exclude: set[str], not_named: str | None
    ) -> Steps[tuple[tuple[str, str], Hop]]:
        """One hop from a new topic entity into ``answer``: sampled backwards from the answer,
        with the fan-out constraint checked from the topic's side."""
        yield ((FANOUTS, answer),)
        rels = [
            r
            for r in self._candidates(answer, check_fanout=False, backwards=True)
            if r.name != not_named
        ]
        if not rels:
            raise Reject("no_second_branch")
        back = self._pick_relation(rng, rels)
        yield ((TARGETS, (answer, back)),)
        # a hub's targets are read from the fan-out table, not listed (same pick)
        topic = self.graph.choose_target(answer, back, rng, exclude, iris_only=True)
        if topic is None:
            raise Reject("cycle")
        forward = Relation(back.name, "in" if back.direction == "out" else "out", back.path)
        yield ((FANOUTS, topic.value), (LABEL, topic.value), (LABEL, answer))
        fan = self.graph.fanouts(topic.value).get(forward, 0)
        if not self.cfg.min_fanout <= fan <= self.cfg.max_fanout:
            raise Reject("fanout")
        name = self._name(topic)
        return (topic.value, name), Hop(forward, answer, self._name(Term("iri", answer)))

    def _two_i(self, rng: random.Random, seed: str) -> Steps[Walk]:
        answer, _ = yield from self._seed(seed)
        t1, hop1 = yield from self._branch_to(rng, answer, {answer}, None)
        t2, hop2 = yield from self._branch_to(rng, answer, {answer, t1[0]}, hop1.relation.name)
        return Walk("2I", [t1, t2], [[hop1], [hop2]], [1, 1])

    def _pi(self, rng: random.Random, seed: str) -> Steps[Walk]:
        chain = yield from self._chain(2, rng, seed)
        end = chain.branches[0][-1]
        if not end.is_iri:
            raise Reject("dead_end")
        visited = {chain.topics[0][0], chain.branches[0][0].entity, end.entity}
        t2, hop = yield from self._branch_to(rng, end.entity, visited, end.relation.name)
        return Walk("PI", [chain.topics[0], t2], [chain.branches[0], [hop]], [2, 1])

    def sample_many(
        self, attempts: list[tuple[int, str, random.Random, str]]
    ) -> dict[int, Outcome]:
        """Run many attempts ``(id, structure, rng, seed)`` side by side: each runs until it
        needs look-ups, the look-ups of all of them are fetched in batched queries, and they go
        on; a few rounds instead of several queries per attempt. Each outcome is what
        :meth:`sample` run alone gives (the graph's answers do not depend on how they were
        fetched)."""
        outcomes: dict[int, Outcome] = {}
        running = [(j, self.sample(structure, rng, seed)) for j, structure, rng, seed in attempts]
        while running:
            fanouts: list[str] = []
            targets: list[tuple[str, Relation]] = []
            labels: list[str] = []
            wanted = {FANOUTS: fanouts.append, TARGETS: targets.append, LABEL: labels.append}
            waiting = []
            for j, steps in running:
                try:
                    needs = next(steps)
                except StopIteration as stop:
                    outcomes[j] = stop.value
                    continue
                except Reject as rej:
                    outcomes[j] = rej.reason
                    continue
                except KGSynthError as exc:  # raised when the attempt is made
                    outcomes[j] = exc.with_traceback(None)
                    continue
                for kind, key in needs:
                    wanted[kind](key)
                waiting.append((j, steps))
            self.graph.prefetch_lookups(fanouts, targets, labels)
            running = waiting
        return outcomes
