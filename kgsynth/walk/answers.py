"""A walk's logical form: the SPARQL query whose full result is its answer set, and that set.

:class:`AnswerQueries` is the part of :class:`~kgsynth.walk.sampler.WalkSampler` that reads the
KG through ``self.graph`` with the limits of ``self.cfg`` once a walk has been sampled.
"""

from __future__ import annotations

from functools import reduce

import numpy as np

from kgsynth.core.stage import Reject
from kgsynth.kg import sparql
from kgsynth.kg.fanouts import TooMany
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.terms import Term
from kgsynth.walk.config import WalkConfig
from kgsynth.walk.records import Hop, Walk


class AnswerQueries:
    """The logical form of a sampled walk (a mixin of the sampler)."""

    graph: KGGraph
    cfg: WalkConfig

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
        if walk.sexpr:  # a constraint walk wrote its own (kgsynth.walk.constraint_forms)
            return walk.sparql
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

    def answer_limit(self, walk: Walk) -> int:
        """The most answers ``walk`` may have: ``max_answers``, or ``wide_max_answers`` for a
        chain-1 walk where ``wide_share`` is on (its one hop's fan-out is its answer set)."""
        one_hop = len(walk.branches) == 1 and len(walk.branches[0]) == 1
        if one_hop and self.cfg.wide_share > 0:
            return max(self.cfg.max_answers, self.cfg.wide_max_answers)
        return self.cfg.max_answers

    def answer_set(self, walk: Walk) -> list[tuple[str, str]]:
        """Execute the walk's SPARQL; ``(value, name)`` per answer, sorted by (name, value).
        With a fan-out table the same set is computed from it (:meth:`_table_answers`)."""
        if walk.sexpr:  # a constraint walk's answers were computed when it was sampled
            return walk.answers
        walk.sparql = self.to_sparql(walk)
        answers = self._table_answers(walk)
        if answers is not None:
            return self._named_answers(answers)
        labels: dict[Term, list[Term]] = {}
        # rows are read as they come: an embedded store stops evaluating when one too many
        # answers has been seen (the outcome does not depend on the order they come in)
        for row in self.graph.kg.select_iter(self.answer_query(walk)):
            labels.setdefault(row["answer"], []).extend([row["name"]] if "name" in row else [])
            if len(labels) > self.answer_limit(walk):
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

    def _table_answers(self, walk: Walk) -> list[tuple[str, str | None]] | None:
        """The result of :meth:`answer_query` read from the fan-out table: each branch
        followed hop by hop from its topic as sets of entity ids (topics left out after every
        hop, as the query's filters do), intersected where the branches meet, then the hops
        after the meeting point. ``(IRI, name)`` per answer (name None: unnamed, or the table
        holds no names); None when the table cannot answer (no table, a flattened hop, a hop
        reaching literals), and the query is run instead.

        Why: on a large KG the query joins through hubs (milliseconds to seconds per walk at
        10 M facts); the table's sorted id arrays give the same set in a few array operations.
        """
        table = self.graph.fanout_table
        if table is None or any(len(h.relation.path) != 1 for b in walk.branches for h in b):
            return None
        if any(b[m:] for b, m in zip(walk.branches[1:], walk.merge_at[1:], strict=True)):
            return None  # only the first branch goes on after the meeting point
        found = table.entities(t[0] for t in walk.topics)
        if len(found) != len({t[0] for t in walk.topics}):
            return None
        topics = np.array(sorted(eid for eid, _ in found.values()), dtype=np.uint32)

        # the hop that ends the walk, when no intersection follows it: once it reaches more
        # than this, the answers are too many (the rest of the union is not built)
        last = walk.branches[0][-1] if len(walk.branches) == 1 or walk.structure == "IP" else None
        bound = self.answer_limit(walk) + len(topics)

        def follow(ids: np.ndarray | None, hop: Hop) -> np.ndarray | None:
            if ids is None:
                return None
            try:
                reached = table.follow(
                    ids,
                    hop.relation.path[0],
                    hop.relation.direction,
                    more_than=bound if hop is last else None,
                )
            except TooMany:
                raise Reject("too_many_answers") from None
            if reached is None:
                return None
            for topic in topics.tolist():  # two at most: masks beat np.setdiff1d
                reached = reached[reached != topic]
            return reached

        meets = []
        for (iri, _), branch, merge in zip(walk.topics, walk.branches, walk.merge_at, strict=True):
            ids: np.ndarray | None = np.array([found[iri][0]], dtype=np.uint32)
            for hop in branch[:merge]:
                ids = follow(ids, hop)
            if ids is None:
                return None
            meets.append(ids)
        answers: np.ndarray | None = reduce(np.intersect1d, meets)
        for hop in walk.branches[0][walk.merge_at[0] :]:
            answers = follow(answers, hop)
        if answers is None:
            return None
        if len(answers) > self.answer_limit(walk):
            raise Reject("too_many_answers")
        named = table.iris(answers)
        if not table.has_labels:
            named = [(iri, self.graph.label(iri)) for iri, _ in named]
        return named

    @staticmethod
    def _named_answers(answers: list[tuple[str, str | None]]) -> list[tuple[str, str]]:
        """The rejects and the order :meth:`answer_set` gives the query's rows."""
        out = []
        for iri, name in answers:
            if name is None:
                raise Reject("unnamed_answer")
            out.append((iri, name))
        if not out:
            raise Reject("no_answer")
        return sorted(out, key=lambda a: (a[1], a[0]))
