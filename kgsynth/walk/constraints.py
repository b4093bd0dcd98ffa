"""Constraint walks: ``count``, ``superlative``, ``comparative`` and ``time``.

Each starts like a chain: from a topic entity, one or two hops (``--constraint-hops``) under
the fan-out constraint, the last reaching an entity (the *walked member*). The *base set* is
everything those hops reach from the topic (e.g. the films a person directed: ``(JOIN
directed_by <Dieterle>)``), read with one query. Then:

- ``count``: the answer is the size of the base set, as text ("3");
- ``superlative``: an attribute of the walked member (a relation whose values are numbers or
  dates, :mod:`kgsynth.walk.values`) and argmax or argmin: the members with the extreme value;
- ``comparative``: an attribute, an operator (gt, lt, ge, le) and a value drawn from the members'
  values so that the answers are some but not all of the members with a value;
- ``time``: a year-valued or date-valued attribute and the year of one member's value, again
  some but not all.

The answers are computed here, in Python, from the base set and its values; the walk stores
them with its S-expression and a SPARQL query of its own (:mod:`kgsynth.walk.constraint_forms`).
A walk that cannot be asked is rejected with a reason counted per structure:
``constraint_topic_in_base`` (the topic is among its own set: no S-expression can leave it out),
``constraint_base_too_small`` (fewer than 2 members), ``constraint_base_too_large`` (more than
``--max-base``), ``constraint_no_attribute`` (the walked member has no attribute of the kind),
``constraint_mixed_values`` (a member's value is not of the attribute's kind),
``constraint_too_few_values`` (fewer than 2 members, or fewer than half, have a value),
``constraint_all_tied`` (every member with a value has the extreme one),
``constraint_no_split`` (no value or year selects some but not all members),
``constraint_unwritable`` (an IRI or value no S-expression atom can write), ``too_many_answers``
and ``unnamed_answer``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from kgsynth.core.stage import Reject
from kgsynth.kg import sparql
from kgsynth.kg.graph import KGGraph, Relation
from kgsynth.kg.terms import Term
from kgsynth.walk.config import CONSTRAINT_STRUCTURES, WalkConfig
from kgsynth.walk.constraint_forms import Constraint, base_pattern, base_sexpr, to_sexpr, to_sparql
from kgsynth.walk.records import Hop, Walk
from kgsynth.walk.values import AttributeCatalog, AttributeKind, Value, parse_value

__all__ = [
    "CONSTRAINT_STRUCTURES",
    "ConstraintSampling",
    "compare_answers",
    "extreme_answers",
    "year_answers",
]

Values = dict[str, list[Value]]  # member IRI -> its values of the attribute

_COMPARE: dict[str, Callable[[float | str, float | str], bool]] = {
    "gt": lambda a, b: a > b,  # type: ignore[operator]
    "lt": lambda a, b: a < b,  # type: ignore[operator]
    "ge": lambda a, b: a >= b,  # type: ignore[operator]
    "le": lambda a, b: a <= b,  # type: ignore[operator]
}


def extreme_answers(values: Values, op: str) -> set[str]:
    """``argmax``/``argmin``: the members one of whose values is the largest (smallest) value
    of any member."""
    pick = max if op == "argmax" else min
    best = pick(v.key for vals in values.values() for v in vals)
    return {m for m, vals in values.items() if any(v.key == best for v in vals)}


def compare_answers(values: Values, op: str, value: Value) -> set[str]:
    """The members with a value ``op value`` (gt, lt, ge, le)."""
    test = _COMPARE[op]
    return {m for m, vals in values.items() if any(test(v.key, value.key) for v in vals)}


def year_answers(values: Values, year: int) -> set[str]:
    """The members with a value in ``year``."""
    return {m for m, vals in values.items() if any(v.year == year for v in vals)}


class ConstraintSampling:
    """The constraint structures of :class:`~kgsynth.walk.sampler.WalkSampler` (a mixin: it
    uses the sampler's graph, options and hop step)."""

    graph: KGGraph
    cfg: WalkConfig
    attributes: AttributeCatalog

    # provided by WalkSampler
    _step: Callable[..., object]
    _seed: Callable[..., object]
    _allowed: Callable[[Relation], bool]

    def _constraint(self, structure: str, rng: random.Random, seed: str):  # -> Steps[Walk]
        """One constraint walk (a generator like the sampler's other structures)."""
        topic = yield from self._seed(seed)  # type: ignore[misc]
        k = rng.randint(1, self.cfg.constraint_hops)
        visited = {topic[0]}
        hops: list[Hop] = []
        current = topic[0]
        for i in range(k):
            # the set's own size is bounded (a 1-hop set is the last hop's fan-out)
            bounds = None if i < k - 1 else (2 if k == 1 else 1, self.cfg.max_base)
            hop = yield from self._step(rng, current, visited, final=False, bounds=bounds)  # type: ignore[misc]
            hops.append(hop)
            visited.add(hop.entity)
            current = hop.entity
        walk = Walk(structure, [topic], [hops], [k])
        if structure == "count":
            members = self._base_members(walk)
            n = str(len(members))
            walk.answers = [(n, n)]
            walk.sampled_answer = n
            constraint = Constraint("count")
        else:
            attribute, kind = self._pick_attribute(rng, current, timed=structure == "time")
            _, values = self._base_values(walk, attribute, kind)
            constraint, chosen = self._choose(structure, rng, attribute, kind, values)
            walk.answers = self._named(chosen)
            names = dict(walk.answers)
            walk.sampled_answer = names.get(current, walk.answers[0][1])
        try:
            walk.sexpr = to_sexpr(
                base_sexpr(topic[0], hops, self.graph.profile), constraint, self.graph.profile
            )
            walk.sparql = to_sparql(topic[0], hops, constraint, self.graph.profile)
        except ValueError:  # an IRI or value the S-expression or SPARQL cannot write
            raise Reject("constraint_unwritable") from None
        return walk

    def _pick_attribute(
        self, rng: random.Random, member: str, *, timed: bool
    ) -> tuple[str, AttributeKind]:
        """An attribute of the walked member, uniformly among its relations that are (dated or
        yearly ones for a time constraint)."""
        found = []
        for rel in self.graph.fanouts(member):
            if rel.direction != "out" or len(rel.path) != 1 or not self._allowed(rel):
                continue
            kind = self.attributes.kind(rel.path[0])
            if kind is not None and (kind.timed or not timed):
                found.append((rel.path[0], kind))
        if not found:
            raise Reject("constraint_no_attribute")
        return rng.choice(found)

    def _checked(self, walk: Walk, members: Iterable[Term]) -> set[str]:
        """The base set's IRIs, after the checks every constraint walk shares."""
        found = {t.value for t in members}
        if walk.topics[0][0] in found:
            raise Reject("constraint_topic_in_base")
        if walk.branches[0][-1].entity not in found:
            raise Reject("inconsistent_answer")
        if len(found) < 2:
            raise Reject("constraint_base_too_small")
        return found

    def _base_members(self, walk: Walk) -> set[str]:
        pattern = base_pattern(walk.topics[0][0], walk.branches[0], "?x", "")
        members: set[Term] = set()
        # read as they come: the store stops once one too many has been seen
        for row in self.graph.kg.select_iter(f"SELECT DISTINCT ?x WHERE {{ {pattern} }}"):
            members.add(row["x"])
            if len(members) > self.cfg.max_base:
                raise Reject("constraint_base_too_large")
        return self._checked(walk, members)

    def _base_values(
        self, walk: Walk, attribute: str, kind: AttributeKind
    ) -> tuple[set[str], Values]:
        """The base set and each member's values of ``attribute`` (one query); a value not of
        ``kind`` rejects the walk."""
        pattern = base_pattern(walk.topics[0][0], walk.branches[0], "?x", "")
        labels = " ".join(sparql.iri(p) for p in self.graph.profile.label_predicates)
        query = (
            f"SELECT ?x ?o ?l WHERE {{ {pattern} OPTIONAL {{ ?x {sparql.iri(attribute)} ?o "
            f"OPTIONAL {{ VALUES ?lp {{ {labels} }} ?o ?lp ?l }} }} }}"
        )
        members: set[Term] = set()
        names: dict[tuple[str, Term], list[Term]] = {}
        for row in self.graph.kg.select_iter(query):
            members.add(row["x"])
            if len(members) > self.cfg.max_base:
                raise Reject("constraint_base_too_large")
            if "o" in row:
                names.setdefault((row["x"].value, row["o"]), []).extend(
                    [row["l"]] if "l" in row else []
                )
        found = self._checked(walk, members)
        values: Values = {}
        for (member, obj), cands in sorted(
            names.items(), key=lambda kv: (kv[0][0], kv[0][1].value)
        ):
            value = parse_value(obj, self.graph.best_label(cands) if obj.kind == "iri" else None)
            if value is None or not kind.admits(value, obj.kind == "literal"):
                raise Reject("constraint_mixed_values")
            values.setdefault(member, []).append(value)
        if len(values) < 2 or 2 * len(values) < len(found):
            raise Reject("constraint_too_few_values")
        return found, values

    def _choose(
        self,
        structure: str,
        rng: random.Random,
        attribute: str,
        kind: AttributeKind,
        values: Values,
    ) -> tuple[Constraint, set[str]]:
        """The constraint (operator, value or year) drawn with ``rng``, and its answers: some
        but not all of the members with a value."""
        limit = self.cfg.max_answers
        if structure == "superlative":
            op = rng.choice(("argmax", "argmin"))
            chosen = extreme_answers(values, op)
            if len(chosen) == len(values):
                raise Reject("constraint_all_tied")
            if len(chosen) > limit:
                raise Reject("too_many_answers")
            return Constraint(op, attribute, kind), chosen
        if structure == "comparative":
            op = rng.choice(("gt", "lt", "ge", "le"))
            distinct: dict[float | str, Value] = {}
            for v in sorted((v for vals in values.values() for v in vals), key=_order):
                distinct.setdefault(v.key, v)  # one spelling per value: the first in order
            options = [
                (Constraint(op, attribute, kind, value=v), compare_answers(values, op, v))
                for v in distinct.values()
            ]
        elif structure == "time":
            years = sorted({v.year for vals in values.values() for v in vals} - {None})
            options = [
                (Constraint("tc", attribute, kind, year=y), year_answers(values, y))
                for y in years
                if y is not None
            ]
        else:
            raise ValueError(f"not a constraint structure: {structure!r}")
        split = [(c, a) for c, a in options if 0 < len(a) < len(values)]
        if not split:
            raise Reject("constraint_no_split")
        small = [(c, a) for c, a in split if len(a) <= limit]
        if not small:
            raise Reject("too_many_answers")
        return rng.choice(small)

    def _named(self, chosen: set[str]) -> list[tuple[str, str]]:
        """``(IRI, name)`` per answer, sorted by (name, IRI)."""
        self.graph.prefetch_labels(sorted(chosen))
        out = []
        for iri in sorted(chosen):
            name = self.graph.label(iri)
            if name is None:
                raise Reject("unnamed_answer")
            out.append((iri, name))
        return sorted(out, key=lambda a: (a[1], a[0]))


def _order(value: Value) -> tuple[float | str, str]:
    return value.key, value.text
