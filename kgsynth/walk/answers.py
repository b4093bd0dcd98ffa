"""A walk's logical form: the SPARQL query whose full result is its answer set, and that set.

:class:`AnswerQueries` is the part of :class:`~kgsynth.walk.sampler.WalkSampler` that reads the
KG through ``self.graph`` with the limits of ``self.cfg`` once a walk has been sampled.
"""

from __future__ import annotations

from kgsynth.kg import sparql
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.terms import Term
from kgsynth.stage import Reject
from kgsynth.walk.config import WalkConfig
from kgsynth.walk.records import Walk


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
