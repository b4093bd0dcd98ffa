"""``kgsynth walk``: constrained random walks with exact answer sets (GraphWalker CRW).

KG -> ``walks.parquet`` (+ ``manifest.json`` and ``walks_stats.png``)::

    kgsynth walk --kg data/metaqa/kb_partial.txt.gz --n 1000 --out runs/x/walks.parquet

Each hop picks one of the current entity's allowed relations, in either direction, among
those whose fan-out ``|N(e_t, r_t)|`` lies in ``[min_fanout, max_fanout]`` (GraphWalker Eq. 1),
weighting relation *types* by ``frequency ** -relation_balance`` so frequent relations do not
crowd out rare ones, then a neighbour uniformly. Entities are never revisited and every
entity crossed must be named (on the freebase profile unnamed CVT nodes are crossed inside a
flattened hop). The walk's pattern is then executed as one SPARQL query — stored as its
logical form — whose full result, topic entities excluded, is the answer set.

Structures: ``chain-k`` (k = 1..5), ``2I`` (two topic entities, one hop each, meeting at the
answer with different relations), ``IP`` (2I then one more hop), ``PI`` (a 2-hop chain whose
end is intersected with a second one-hop path).

Determinism and resumption: attempt ``j`` draws from ``Random(f"{seed}/{shard}/{j}")`` and the
structure quotas fill in attempt order, so the same seed and configuration give the same
file; accepted walks are written in chunks next to the output, and a re-run continues after
the last complete chunk with the same state.

Speed: the coming attempts (up to 256) are sampled side by side. Each is a generator that
says which look-ups (fan-outs, targets, names) it needs before it reads them; every round, the
look-ups of all of them are fetched in a few batched ``VALUES`` queries. An attempt's outcome
is then taken in attempt order, and only if the structure it assumed is the one it picks when
its turn comes (accepted walks change the structure weights); otherwise it is sampled again
alone. The outcome depends only on the KG's answers, never on how they were fetched, so the
walks are those of one attempt at a time with one query per look-up.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from kgsynth.config import option
from kgsynth.errors import ConfigError, InputFileError, KGSynthError
from kgsynth.kg import sparql
from kgsynth.kg.base import KG
from kgsynth.kg.graph import KGGraph, Relation
from kgsynth.kg.terms import Term
from kgsynth.schema import WALK_SCHEMA

log = logging.getLogger(__name__)

STRUCTURE_RE = re.compile(r"^(chain-[1-5]|2I|IP|PI)$")
DEFAULT_STRUCTURES = "chain-1:0.1,chain-2:0.25,chain-3:0.25,2I:0.2,IP:0.1,PI:0.1"


MAX_BLOCK = 256  # attempts sampled side by side, their look-ups batched
MIN_BLOCK = 16
T = TypeVar("T")


class WalkError(KGSynthError):
    """The KG could not yield the requested walks."""


@dataclass(frozen=True)
class WalkConfig:
    """Options of ``kgsynth walk``: one flag per field, named as the field."""

    n: int = option(1000, "Walks to accept.")
    seed: int = option(0, "Random seed.")
    structures: str = option(
        DEFAULT_STRUCTURES,
        "Structure mix name:weight,… of chain-1..chain-5, 2I, IP, PI.",
    )
    min_fanout: int = option(1, "d_min: fewest neighbours along a hop's relation.")
    max_fanout: int = option(20, "d_max: most neighbours along a hop's relation.")
    max_answers: int = option(10, "Reject walks with more answers.")
    relation_balance: float = option(
        0.5, "Relation weight = frequency ** -balance (0: uniform over relation types)."
    )
    relations: str | None = option(None, "Whitelist file: relation names, one per line.")
    exclude_relations: str | None = option(None, "Blacklist file: relation names, one per line.")
    seeds: str | None = option(None, "File of entity names to start walks from.")
    shard: str = option("0/1", "i/N: this run's share; shards merge without duplicates.")
    chunk_size: int = option(250, "Walks per resumable chunk.")
    max_attempts_per_walk: int = option(
        500, "Give a structure up when its attempts exceed this many per accepted walk (+1)."
    )
    workers: int = option(
        1, "Processes sampling attempts side by side; the output is the same as with 1."
    )

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"--n must be >= 1 (got {self.n})")
        if self.min_fanout < 1 or self.max_fanout < self.min_fanout:
            raise ConfigError(
                f"--min-fanout/--max-fanout: need 1 <= min <= max (got {self.min_fanout}, {self.max_fanout})"
            )
        if self.max_answers < 1:
            raise ConfigError(f"--max-answers must be >= 1 (got {self.max_answers})")
        if self.relation_balance < 0:
            raise ConfigError(f"--relation-balance must be >= 0 (got {self.relation_balance})")
        if self.chunk_size < 1 or self.max_attempts_per_walk < 1:
            raise ConfigError("--chunk-size and --max-attempts-per-walk must be >= 1")
        if not 1 <= self.workers <= 256:
            raise ConfigError(f"--workers must be between 1 and 256 (got {self.workers})")
        self.structure_weights()
        self.shard_index()

    def structure_weights(self) -> dict[str, float]:
        """``chain-2:0.3,2I:0.7`` as a dict; names and weights checked."""
        weights: dict[str, float] = {}
        for part in self.structures.split(","):
            if not part.strip():
                continue
            name, _, weight = part.strip().partition(":")
            if not STRUCTURE_RE.match(name):
                raise ConfigError(
                    f"--structures: unknown structure {name!r}; use chain-1..chain-5, 2I, IP, PI"
                )
            try:
                w = float(weight) if weight else 1.0
            except ValueError:
                raise ConfigError(
                    f"--structures: weight of {name} is not a number: {weight!r}"
                ) from None
            if not math.isfinite(w) or w < 0:
                raise ConfigError(
                    f"--structures: weight of {name} must be a finite number >= 0 (got {weight})"
                )
            weights[name] = weights.get(name, 0.0) + w
        if not weights or sum(weights.values()) <= 0:
            raise ConfigError("--structures: give at least one structure with a positive weight")
        return weights

    def shard_index(self) -> tuple[int, int]:
        m = re.fullmatch(r"(\d+)/(\d+)", self.shard.strip())
        if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
            raise ConfigError(f"--shard must be i/N with 0 <= i < N (got {self.shard!r})")
        return int(m.group(1)), int(m.group(2))

    def quotas(self) -> dict[str, int]:
        """Accepted walks per structure: ``n`` split by weight (largest remainder)."""
        weights = self.structure_weights()
        total = sum(weights.values())
        raw = {k: self.n * w / total for k, w in weights.items()}
        quotas = {k: math.floor(v) for k, v in raw.items()}
        rest = self.n - sum(quotas.values())
        for k in sorted(raw, key=lambda k: (-(raw[k] - quotas[k]), k))[:rest]:
            quotas[k] += 1
        return quotas


@dataclass(frozen=True)
class Hop:
    relation: Relation
    entity: str  # IRI (or literal value for a final literal answer)
    name: str
    is_iri: bool = True


@dataclass
class Walk:
    structure: str
    topics: list[tuple[str, str]]  # (iri, name)
    branches: list[list[Hop]]
    merge_at: list[int]
    sampled_answer: str = ""
    answers: list[tuple[str, str]] = field(default_factory=list)
    sparql: str = ""

    def key(self) -> str:
        paths = [
            [(h.relation.name, h.relation.direction, h.relation.path) for h in b]
            for b in self.branches
        ]
        topics = [t[0] for t in self.topics]
        if self.structure == "2I":  # the two branches are interchangeable
            pairs = sorted(zip(topics, [json.dumps(p) for p in paths], strict=True))
            topics, paths = [p[0] for p in pairs], [json.loads(p[1]) for p in pairs]
        return json.dumps([self.structure, topics, paths], sort_keys=True)


class Reject(Exception):
    """A walk attempt failed; ``reason`` is counted in the manifest."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big")


def _read_lines(path: str, what: str) -> list[tuple[int, str]]:
    """``(line number, stripped line)`` of a names file, blank and ``#`` lines left out."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputFileError(path, f"cannot read {what} file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputFileError(
            path,
            f"{what} file is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
        ) from None
    return [
        (i, ln.strip())
        for i, ln in enumerate(lines, 1)
        if ln.strip() and not ln.lstrip().startswith("#")
    ]


def _read_list(path: str, what: str) -> list[str]:
    return [ln for _, ln in _read_lines(path, what)]


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


class WalkSampler:
    """Samples walks of one structure at a time; all KG access goes through ``graph``."""

    def __init__(self, graph: KGGraph, cfg: WalkConfig, seeds: list[str]) -> None:
        self.graph = graph
        self.cfg = cfg
        self.seeds = seeds
        self.allowed = (
            set(_read_list(cfg.relations, "relation whitelist")) if cfg.relations else None
        )
        self.excluded = (
            set(_read_list(cfg.exclude_relations, "relation blacklist"))
            if cfg.exclude_relations
            else set()
        )
        self.frequency = self._relation_frequency()
        self._weights: dict[Relation, float] = {}
        self._check_relation_names()

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
            for line, name in _read_lines(self.cfg.relations, "relation whitelist"):
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

    def _candidates(self, iri: str, *, check_fanout: bool = True) -> list[Relation]:
        fanouts = self.graph.fanouts(iri)
        if self.allowed is None and not self.excluded:
            rels = list(fanouts)
        else:
            rels = [r for r in fanouts if self._allowed(r)]
        if not rels:
            raise Reject("dead_end")
        if check_fanout:
            lo, hi = self.cfg.min_fanout, self.cfg.max_fanout
            rels = [r for r in rels if lo <= fanouts[r] <= hi]
            if not rels:
                raise Reject("fanout")
        return rels

    def _pick_relation(self, rng: random.Random, rels: list[Relation]) -> Relation:
        return rng.choices(rels, weights=[self._weight(r) for r in rels], k=1)[0]

    def _name(self, term: Term) -> str:
        if term.kind != "iri":
            return term.value
        name = self.graph.label(term.value)
        if name is None:
            raise Reject("unnamed_node")
        return name

    def _step(self, rng: random.Random, iri: str, visited: set[str], *, final: bool) -> Steps[Hop]:
        yield ((FANOUTS, iri),)
        rel = self._pick_relation(rng, self._candidates(iri))
        yield ((TARGETS, (iri, rel)),)
        targets = [t for t in self.graph.targets(iri, rel) if t.value not in visited]
        if not targets:
            raise Reject("cycle")
        target = rng.choice(targets)
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
        raise ConfigError(f"unknown structure {structure!r}")

    def _chain(self, k: int, rng: random.Random, seed: str) -> Steps[Walk]:
        topic = yield from self._seed(seed)
        visited = {topic[0]}
        hops: list[Hop] = []
        current = topic[0]
        for i in range(k):
            hop = yield from self._step(rng, current, visited, final=i == k - 1)
            hops.append(hop)
            visited.add(hop.entity)
            current = hop.entity
        return Walk(f"chain-{k}", [topic], [hops], [k])

    def _branch_to(
        self, rng: random.Random, answer: str, exclude: set[str], not_named: str | None
    ) -> Steps[tuple[tuple[str, str], Hop]]:
        """One hop from a new topic entity into ``answer``: sampled backwards from the answer,
        with the fan-out constraint checked from the topic's side."""
        yield ((FANOUTS, answer),)
        rels = [r for r in self._candidates(answer, check_fanout=False) if r.name != not_named]
        if not rels:
            raise Reject("no_second_branch")
        back = self._pick_relation(rng, rels)
        yield ((TARGETS, (answer, back)),)
        topics = [
            t
            for t in self.graph.targets(answer, back)
            if t.kind == "iri" and t.value not in exclude
        ]
        if not topics:
            raise Reject("cycle")
        topic = rng.choice(topics)
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

    # --- the logical form ----------------------------------------------------------------

    def _branch_patterns(self, walk: Walk) -> tuple[list[str], list[tuple[list[str], list[str]]]]:
        """The topics as SPARQL terms, and per branch its hop patterns and the variables they
        bind (``?answer``, ``?meet`` where IP's branches meet, ``?xN`` between)."""
        topics = [sparql.iri(t[0]) for t in walk.topics]
        branches: list[tuple[list[str], list[str]]] = []
        counter = iter(range(1, 100))
        meet = "?answer" if walk.structure != "IP" else "?meet"
        for b, (branch, merge) in enumerate(zip(walk.branches, walk.merge_at, strict=True)):
            patterns: list[str] = []
            variables: list[str] = []
            prev = topics[b]
            for i, hop in enumerate(branch):
                if i + 1 == merge:
                    var = meet
                elif i + 1 > merge:
                    var = "?answer"
                else:
                    var = f"?x{next(counter)}"
                mid = f"?c{next(counter)}"
                patterns.append(self.graph.pattern(prev, hop.relation, var, mid))
                variables.append(var)
                prev = var
            branches.append((patterns, variables))
        return topics, branches

    def _names_optional(self) -> str:
        label_values = " ".join(sparql.iri(p) for p in self.graph.profile.label_predicates)
        return f"OPTIONAL {{ VALUES ?lp {{ {label_values} }} ?answer ?lp ?name }}"

    @staticmethod
    def _filters(variables: list[str], topics: list[str]) -> str:
        return " ".join(
            f"FILTER({v} NOT IN ({', '.join(topics)}))" for v in dict.fromkeys(variables)
        )

    def to_sparql(self, walk: Walk) -> str:
        """One SELECT whose result is the walk's full answer set (topics excluded)."""
        topics, branches = self._branch_patterns(walk)
        patterns = [p for b in branches for p in b[0]]
        variables = [v for b in branches for v in b[1]]
        return (
            "SELECT DISTINCT ?answer ?name WHERE { "
            + " ".join(patterns)
            + f" {self._filters(variables, topics)} {self._names_optional()} }}"
        )

    def answer_query(self, walk: Walk) -> str:
        """The query :meth:`answer_set` runs: :meth:`to_sparql` for one branch; for several,
        the same answers with each branch in a sub-select of its own, joined on the variables
        the branches share.

        Why: on a large KG Oxigraph plans a PI's pattern by scanning every triple of the
        chain's second relation (1 s at 10 M facts, 0.4 ms for the chain alone); evaluated
        branch by branch, each starts from its topic. The answers are the same: branches
        share only ``?answer`` (and ``?meet``), every filter names one variable of its branch,
        and the intermediate variables only need to exist (DISTINCT)."""
        topics, branches = self._branch_patterns(walk)
        if len(branches) == 1:
            return self.to_sparql(walk)
        shared = {"?answer", "?meet"}
        groups = []
        for patterns, variables in branches:
            keep = " ".join(v for v in ("?meet", "?answer") if v in variables and v in shared)
            groups.append(
                f"{{ SELECT DISTINCT {keep} WHERE {{ {' '.join(patterns)} "
                f"{self._filters(variables, topics)} }} }}"
            )
        return (
            f"SELECT DISTINCT ?answer ?name WHERE {{ {' '.join(groups)} {self._names_optional()} }}"
        )

    def answer_set(self, walk: Walk) -> list[tuple[str, str]]:
        """Execute the walk's SPARQL; ``(value, name)`` per answer, sorted by (name, value)."""
        walk.sparql = self.to_sparql(walk)
        labels: dict[Term, list[Term]] = {}
        # rows are read as they come: an embedded store stops evaluating when one too many
        # answers has been seen (the outcome does not depend on the order they come in)
        for row in self.graph.kg.select_iter(self.answer_query(walk)):
            labels.setdefault(row["answer"], []).extend([row["name"]] if "name" in row else [])
            if len(labels) > self.cfg.max_answers:
                raise Reject("too_many_answers")
        out: list[tuple[str, str]] = []
        for term, cands in labels.items():
            name = self.graph.best_label(cands)
            if name is None:
                if term.kind == "literal":
                    name = term.value
                else:
                    raise Reject("unnamed_answer")
            out.append((term.value, name))
        if not out:
            raise Reject("no_answer")
        return sorted(out, key=lambda a: (a[1], a[0]))


def walk_id_of(walk: Walk) -> str:
    """Stable id from the duplicate key (structure, topic entities, relation paths)."""
    return "w-" + hashlib.sha1(walk.key().encode()).hexdigest()[:16]


def walk_to_row(walk: Walk, seed: int, attempt: int) -> dict[str, Any]:
    return {
        "walk_id": walk_id_of(walk),
        "structure": walk.structure,
        "hops": sum(len(b) for b in walk.branches),
        "topic_names": [t[1] for t in walk.topics],
        "topic_ids": [t[0] for t in walk.topics],
        "branches": [
            [
                {"relation": h.relation.name, "inverse": h.relation.inverse, "entity": h.name}
                for h in b
            ]
            for b in walk.branches
        ],
        "merge_at": walk.merge_at,
        "answer_names": [a[1] for a in walk.answers],
        "answer_ids": [a[0] for a in walk.answers],
        "sampled_answer": walk.sampled_answer,
        "sparql": walk.sparql,
        "seed": seed,
        "attempt": attempt,
    }


# --- the stage ----------------------------------------------------------------------------


@dataclass
class WalkState:
    """What a run has done so far (restored from the chunks when resuming)."""

    next_attempt: int = 0
    accepted: Counter = field(default_factory=Counter)  # per structure
    attempts: Counter = field(default_factory=Counter)  # per structure
    rejects: Counter = field(default_factory=Counter)  # per reason
    keys: set[str] = field(default_factory=set)  # walk_ids accepted so far
    exhausted: set[str] = field(default_factory=set)
    relations_available: int = 0


def _config_fingerprint(cfg: WalkConfig, kg: KG) -> str:
    data = dataclasses.asdict(cfg)
    data.pop("chunk_size")  # chunking does not change the walks
    data.pop("workers")  # nor does the number of processes
    desc = kg.describe()
    data["kg"] = {k: desc.get(k) for k in ("location", "profile", "source_sha256", "triples")}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def seed_entities(graph: KGGraph, cfg: WalkConfig) -> list[str]:
    """Candidate start entities (sorted IRIs): the ``--seeds`` names, else every named entity."""
    if cfg.seeds:
        iris = []
        for lineno, name in _read_lines(cfg.seeds, "seeds"):
            res = graph.resolve(name)
            if res is None:
                raise InputFileError(cfg.seeds, f"no entity named {name!r}", lineno)
            iris.append(res.entity.iri)
        return sorted(set(iris))
    return graph.name_index().all_iris()


# --- worker processes (--workers N) -----------------------------------------------------
# Each worker opens the KG itself (a store directory read-only, or the endpoint) and samples
# the attempts it is sent, answer sets included; the parent takes the outcomes in attempt order
# exactly as it takes its own, so the walks are those of one process.

_worker: WalkSampler | None = None


def _worker_start(
    location: str, profile: str, timeout: float, max_rows: int, cfg: WalkConfig
) -> None:
    global _worker
    from kgsynth.kg.open import open_kg

    kg = open_kg(location, profile=profile, timeout=timeout, max_rows=max_rows)
    _worker = WalkSampler(KGGraph(kg), cfg, [])


def _worker_sample(
    attempts: list[tuple[int, str, random.Random, str]],
) -> dict[int, tuple[Outcome, list[tuple[str, str]] | str | KGSynthError | None]]:
    """Outcomes of ``attempts`` and, for each walk, its answer set (or why it has none)."""
    assert _worker is not None
    out: dict[int, tuple[Outcome, list[tuple[str, str]] | str | KGSynthError | None]] = {}
    for j, outcome in _worker.sample_many(attempts).items():
        answers: list[tuple[str, str]] | str | KGSynthError | None = None
        if isinstance(outcome, Walk):
            try:
                answers = _worker.answer_set(outcome)
            except Reject as rej:
                answers = rej.reason
            except KGSynthError as exc:
                answers = exc.with_traceback(None)
        out[j] = (outcome, answers)
    return out


class _WorkerPool:
    """``n`` processes sampling attempts side by side (spawned: a forked RocksDB handle or
    HTTP connection is not safe to share)."""

    def __init__(self, kg: KG, cfg: WalkConfig, n: int) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        location = getattr(kg, "location", "")
        if not location or location == ":memory:":
            raise ConfigError(
                "--workers: the worker processes open the KG themselves; give a store "
                "directory, a triple file or an endpoint (not an in-memory store)"
            )
        self.n = n
        self.pool = ProcessPoolExecutor(
            max_workers=n,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_start,
            initargs=(
                location,
                kg.profile.name,
                float(getattr(kg, "timeout", 30.0)),
                int(getattr(kg, "max_rows", 100_000)),
                cfg,
            ),
        )

    def sample(
        self, attempts: list[tuple[int, str, random.Random, str]]
    ) -> dict[int, tuple[Outcome, list[tuple[str, str]] | str | KGSynthError | None]]:
        # interleaved shares: neighbouring attempts cost alike, so the shares do too
        shares = [attempts[i :: self.n] for i in range(self.n)]
        out: dict = {}
        for part in self.pool.map(_worker_sample, [s for s in shares if s]):
            out.update(part)
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


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
    give_up = cfg.max_attempts_per_walk
    # a graph without a cache could not keep what a batch fetched: it runs one attempt at a time
    side_by_side = graph.cache_size > 0
    ahead: dict[int, tuple[str, Outcome]] = {}  # attempt -> (structure it assumed, outcome)
    # attempt -> its walk's answer set as a worker found it (or why there is none)
    answers_ahead: dict[int, list[tuple[str, str]] | str | KGSynthError | None] = {}
    pool = _WorkerPool(kg, cfg, cfg.workers) if cfg.workers > 1 else None

    def seed_of(attempt: int) -> str:
        # its own random stream, so the start entities of coming attempts are known ahead
        return random.Random(f"{cfg.seed}/{cfg.shard}/{attempt}/seed").choice(seeds)

    def rng_of(attempt: int) -> random.Random:
        return random.Random(f"{cfg.seed}/{cfg.shard}/{attempt}")

    def sample_ahead(first: int, open_structures: list[str], weights: list[int]) -> None:
        """Sample the coming attempts side by side with the structure weights as they are now.
        An attempt is taken from here only when it picks the same structure when its turn
        comes (accepted walks change the weights); it is sampled alone otherwise."""
        # about as many attempts as the open quotas still need, at the rate seen so far
        done = state.next_attempt - first_attempt
        rate = (done + 1) / (sum(state.accepted.values()) - accepted_before + 1)
        # with workers, a round holds a block for each (fewer rounds for them to wait on)
        most = MAX_BLOCK * cfg.workers
        size = min(most, max(MIN_BLOCK, math.ceil(sum(weights) * rate * 1.1)))
        batch = []
        for k in range(first, first + size):
            rng = rng_of(k)
            structure = rng.choices(open_structures, weights=weights, k=1)[0]
            batch.append((k, structure, rng, seed_of(k)))
        ahead.clear()
        answers_ahead.clear()
        if pool is not None:
            found = pool.sample(batch)
            ahead.update({k: (structure, found[k][0]) for k, structure, _, _ in batch})
            answers_ahead.update({k: found[k][1] for k, _, _, _ in batch})
            return
        outcomes = sampler.sample_many(batch)
        ahead.update({k: (structure, outcomes[k]) for k, structure, _, _ in batch})

    accepted_before = sum(state.accepted.values())
    first_attempt = state.next_attempt
    try:
        while True:
            open_structures = [
                s for s in quotas if state.accepted[s] < quotas[s] and s not in state.exhausted
            ]
            if not open_structures:
                return
            j = state.next_attempt
            weights = [quotas[s] - state.accepted[s] for s in open_structures]
            if side_by_side and j not in ahead:
                sample_ahead(j, open_structures, weights)
            rng = rng_of(j)
            structure = rng.choices(open_structures, weights=weights, k=1)[0]
            state.next_attempt += 1
            state.attempts[structure] += 1
            reason: str | None = None
            try:
                assumed, outcome = ahead.pop(j, ("", None))
                if assumed != structure:
                    outcome = finish(sampler.sample(structure, rng, seed_of(j)))
                if isinstance(outcome, KGSynthError):
                    raise outcome
                if isinstance(outcome, str):
                    reason = outcome
                else:
                    walk = outcome
                    assert isinstance(walk, Walk)
                    walk.sampled_answer = walk.branches[0][-1].name
                    walk_id = walk_id_of(walk)
                    if (
                        num_shards > 1
                        and stable_hash(json.dumps(sorted(t[0] for t in walk.topics))) % num_shards
                        != shard
                    ):
                        raise Reject("other_shard")
                    if walk_id in state.keys:
                        raise Reject("duplicate")
                    found = answers_ahead.pop(j, None) if assumed == structure else None
                    if found is None:
                        walk.answers = sampler.answer_set(walk)
                    elif isinstance(found, KGSynthError):
                        raise found
                    elif isinstance(found, str):
                        raise Reject(found)
                    else:  # a worker ran the answer query
                        walk.sparql = sampler.to_sparql(walk)
                        walk.answers = found
                    if walk.branches[0][-1].entity not in {a[0] for a in walk.answers}:
                        raise Reject("inconsistent_answer")
            except Reject as rej:
                reason = rej.reason
            if reason is not None:
                state.rejects[reason] += 1
                # a structure whose acceptance rate falls under 1/give_up is given up, so a KG that
                # cannot yield it ends with the counts instead of sampling forever
                if state.attempts[structure] > give_up * (state.accepted[structure] + 1):
                    log.warning(
                        "giving up on %s after %d attempts", structure, state.attempts[structure]
                    )
                    state.exhausted.add(structure)
                if on_attempt:
                    on_attempt(state)
                continue
            state.keys.add(walk_id)
            state.accepted[structure] += 1
            if on_attempt:
                on_attempt(state)
            yield walk_to_row(walk, cfg.seed, j)

    finally:
        if pool is not None:
            pool.close()


def parts_dir(out: Path) -> Path:
    """Where a walk run into ``out`` keeps its resumable chunks."""
    return out.with_name(out.name + ".parts")


def _write_chunk(parts: Path, index: int, rows: list[dict[str, Any]], state: WalkState) -> None:
    """A chunk of rows and the state after it, each written atomically (rows first)."""
    table = pa.Table.from_pylist(rows, schema=WALK_SCHEMA)
    name = f"chunk-{index:05d}"
    tmp = parts / f".{name}.parquet.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, parts / f"{name}.parquet")
    st = {
        "next_attempt": state.next_attempt,
        "accepted": dict(state.accepted),
        "attempts": dict(state.attempts),
        "rejects": dict(state.rejects),
        "exhausted": sorted(state.exhausted),
    }
    tmp = parts / f".{name}.json.tmp"
    tmp.write_text(json.dumps(st))
    os.replace(tmp, parts / f"{name}.json")


def _restore(parts: Path, fingerprint: str) -> tuple[WalkState, list[pa.Table]]:
    state = WalkState()
    tables: list[pa.Table] = []
    info = parts / "run.json"
    if not info.is_file():
        return state, tables
    complete = (parts / "chunk-00000.json").is_file() and (parts / "chunk-00000.parquet").is_file()
    if not complete:
        # a run that failed before its first chunk left nothing to resume: start afresh
        for stale in parts.glob("*"):
            if stale.is_file():
                stale.unlink()
        return state, tables
    if json.loads(info.read_text()).get("fingerprint") != fingerprint:
        raise ConfigError(
            f"{parts} holds chunks of a run with other options; remove it (or use --overwrite)"
        )
    index = 0
    while (parts / f"chunk-{index:05d}.json").is_file() and (
        parts / f"chunk-{index:05d}.parquet"
    ).is_file():
        # cast: Parquet names list items "element", the schema names them "item"
        tables.append(pq.read_table(parts / f"chunk-{index:05d}.parquet").cast(WALK_SCHEMA))
        st = json.loads((parts / f"chunk-{index:05d}.json").read_text())
        index += 1
    if tables:
        state.next_attempt = st["next_attempt"]
        state.accepted = Counter(st["accepted"])
        state.attempts = Counter(st["attempts"])
        state.rejects = Counter(st["rejects"])
        state.exhausted = set(st["exhausted"])
        state.keys = {k for t in tables for k in t.column("walk_id").to_pylist()}
    # anything past the last complete chunk (a half-written chunk) is dropped
    for stale in parts.glob("chunk-*"):
        if int(stale.name[6:11]) >= index:
            stale.unlink()
    return state, tables


def run_walks(
    kg: KG,
    cfg: WalkConfig,
    out: str | Path,
    *,
    write_to: str | Path | None = None,
    overwrite: bool = False,
    progress: Callable[[WalkState, int], None] | None = None,
) -> dict[str, Any]:
    """Sample walks into ``out`` (Parquet), resuming from chunks; returns the manifest data.

    With ``write_to`` the table goes there instead (a staging path) and the chunks stay for
    the caller to remove once the output is committed (:class:`kgsynth.stage_io.StagedOutput`)."""
    started = time.perf_counter()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = parts_dir(out)
    if overwrite:
        shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(exist_ok=True)
    fingerprint = _config_fingerprint(cfg, kg)
    state, tables = _restore(parts, fingerprint)
    (parts / "run.json").write_text(json.dumps({"fingerprint": fingerprint}))
    resumed = sum(t.num_rows for t in tables)
    buffer: list[dict[str, Any]] = []
    index = len(tables)

    def tick(st: WalkState) -> None:
        if progress:
            progress(st, sum(st.accepted.values()))

    for row in sample_walks(kg, cfg, state=state, on_attempt=tick):
        buffer.append(row)
        if len(buffer) >= cfg.chunk_size:
            _write_chunk(parts, index, buffer, state)
            tables.append(pa.Table.from_pylist(buffer, schema=WALK_SCHEMA))
            buffer, index = [], index + 1
    if buffer:
        _write_chunk(parts, index, buffer, state)
        tables.append(pa.Table.from_pylist(buffer, schema=WALK_SCHEMA))
    # one contiguous table, so the file's bytes do not depend on where a run was interrupted
    table = (pa.concat_tables(tables) if tables else WALK_SCHEMA.empty_table()).combine_chunks()
    accepted = table.num_rows
    if accepted == 0:
        raise WalkError(
            f"no walk satisfied the constraints after {state.next_attempt} attempts; rejects: "
            + ", ".join(f"{k}={v}" for k, v in state.rejects.most_common())
            + " (try a wider --max-fanout, more --max-answers, other --structures or relations)"
        )
    if write_to is not None:
        pq.write_table(table, write_to)
    else:
        tmp = out.with_name(f".{out.name}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, out)
        shutil.rmtree(parts, ignore_errors=True)
    return {
        "accepted": accepted,
        "resumed_rows": resumed,
        "attempts": state.next_attempt,
        "accepted_by_structure": dict(sorted(state.accepted.items())),
        "attempts_by_structure": dict(sorted(state.attempts.items())),
        "rejects": dict(state.rejects.most_common()),
        "quotas": cfg.quotas(),
        "exhausted_structures": sorted(state.exhausted),
        "relations_available": state.relations_available,
        "elapsed_s": round(time.perf_counter() - started, 3),
        "table": table,
    }
