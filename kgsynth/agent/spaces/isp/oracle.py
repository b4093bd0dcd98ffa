"""ISP-KGR's cold-start trajectories (App. E.2): the gold query taken apart into the steps an
agent would take, by progressive and compositional decomposition.

Input: a question row with its walk (``topic_ids``, ``branches``, ``merge_at``, the stored
``sparql``) and the KG graph. Output: the isp oracle's steps (:func:`decomposed_calls`), each a
:class:`~kgsynth.agent.spaces.oracle_call.OracleCall` whose ``call`` is the step's operations::

    calls = decomposed_calls(row, graph)   # then replayed by SparqlSpace.replay

The rules (App. E.2):

- progressive: a branch of hops ``a -> b`` becomes one step per hop, each exploring the node the
  hop starts from (``<node>``: the topic entity, then the entity the walk reached) and running
  the sub-query of the hops so far (``<SPARQL>``: ``a``, then ``a`` and ``b``);
- compositional ("separate, then merge"): a walk of several branches (2I, IP, PI) gets each
  branch's steps on their own, then one step whose query joins them; hops after the branches
  meet (IP's last hop) go on progressively from the meeting node;
- the last step runs the stored gold query itself (so its rows show every gold answer), in the
  place of the last sub-query, or after it where the walk adds a COUNT or a constraint to the
  set its hops reach.

A step that explores a node is two turns, as the paper's step reads in order (App. E.2: "<think>,
<node>, <relation>, <sparql>, and <information>"; §4.3.2: "<node> and <SPARQL> operations appear
alternately"): the ``<node>`` alone, whose ``<relation>`` templates come back, then the
``<SPARQL>`` alone, written after those templates (which show the hop's pattern and the node's
IRI) are seen. A merge step only queries. So a walk's reasoning steps (the curriculum's count,
:mod:`.curriculum`) are its turns that query.

The queries are written as the ``<relation>`` templates write their patterns: IRIs as prefixed
names (``entity:Adam%20Arkin relation:starred_actors ?x``) after the ``PREFIX`` lines they use
(:func:`prefixed`), so the query turn copies what the turn before showed.

Every sub-query is built with the KG's own hop patterns (:meth:`KGGraph.pattern`, the walker's)
from the walk's relations, and selects the hop's variable with the topic entities left out. A
row this cannot decompose (no walk, a relation or entity the graph does not show) falls back to
one exploring step and the gold query (:func:`one_shot_calls`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.agent.protocol import NODE, SPARQL, Operation, operations_text
from kgsynth.agent.spaces.isp.tools import Prefixes
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.sparql_oracle import _gold_query, walk_relations
from kgsynth.kg import sparql
from kgsynth.kg.graph import KGGraph, Relation

_IRIREF = re.compile(r"<([^<>\s\"{}|^`\\]*:[^<>\s\"{}|^`\\]*)>")


def prefixed(query: str, first: Sequence[str] = ()) -> str:
    """``query`` with each IRI written as the ``<node>`` templates write it (a prefixed name
    where :class:`~kgsynth.agent.spaces.isp.tools.Prefixes` gives one, else in full), after
    the ``PREFIX`` lines of the names it uses: those of the IRIs ``first`` names that it holds
    (the topic entities: a template declares its entity's first), then in the order used. A
    query that already declares prefixes is left as it is."""
    if re.match(r"\s*PREFIX\b", query, re.IGNORECASE):
        return query
    term = Prefixes()
    for iri in first:
        if f"<{iri}>" in query:
            term(iri)
    body = _IRIREF.sub(lambda m: term(m.group(1)), query)
    return "\n".join([*term.declarations(), body])


def _query_call(
    kind: str,
    query: str,
    row: dict[str, Any],
    about: str,
    hop: dict[str, Any] | None,
    relations: tuple[str, ...],
) -> OracleCall:
    """A ``<SPARQL>`` turn running ``query`` in the templates' prefixed form."""
    text = prefixed(query, row.get("topic_ids") or ())
    return OracleCall(kind, operations_text([Operation(SPARQL, text)]), about, hop, relations)


def one_shot_calls(row: dict[str, Any]) -> list[OracleCall]:
    """Every topic explored in one turn, then the gold query (kgsynth's earlier isp oracle)."""
    query = _gold_query(row)
    topics = list(row["topic_names"])
    rels = walk_relations(row)
    about = " and ".join(topics)
    nodes = operations_text([Operation(NODE, t) for t in topics])
    first = row["branches"][0][0] if len(topics) == 1 else None
    return [
        OracleCall("node", nodes, about, first, rels),
        _query_call("sparql", query, row, about, None, rels),
    ]


@dataclass
class _Step:
    node: str | None  # the entity explored first (None: a merge step)
    patterns: list[str]
    var: str
    hop: dict[str, Any] | None
    relations: tuple[str, ...]
    # the topics explored so far (a sub-query leaves those out of its rows; one not yet
    # explored has not been shown, so the query cannot name it)
    seen: int | None = None


class _Undecomposable(Exception):
    pass


class _Builder:
    """The steps of one walk (see the module doc)."""

    def __init__(self, row: dict[str, Any], graph: KGGraph) -> None:
        self.row, self.graph = row, graph
        self.topics = [sparql.iri(t) for t in row["topic_ids"]]
        self.counter = iter(range(1, 100))
        self.meet = "?meet" if row.get("structure") == "IP" else "?answer"

    def relation(self, source_iri: str, hop: dict[str, Any]) -> Relation:
        for rel in self.graph.relations(source_iri):
            if rel.name == hop["relation"] and rel.inverse == bool(hop["inverse"]):
                return rel
        raise _Undecomposable(hop["relation"])

    def iri_of(self, name: str) -> str:
        found = self.graph.resolve(name)
        if found is None:
            raise _Undecomposable(name)
        return found.entity.iri

    def select(self, patterns: list[str], var: str, seen: int | None = None) -> str:
        keep = f"FILTER({var} NOT IN ({', '.join(self.topics[:seen])}))"
        return f"SELECT DISTINCT {var} WHERE {{ {' '.join(patterns)} {keep} }}"

    def hop_step(
        self,
        prev: tuple[str, str, str],
        hop: dict[str, Any],
        var: str,
        done: list[str],
        seen: int | None = None,
    ) -> _Step:
        """A progressive step: explore ``prev`` (term, IRI, name), then the hops so far."""
        term, iri, name = prev
        rel = self.relation(iri, hop)
        done.append(self.graph.pattern(term, rel, var, f"?c{next(self.counter)}"))
        return _Step(name, list(done), var, hop, (hop["relation"],), seen)

    def steps(self) -> list[_Step]:
        row = self.row
        steps: list[_Step] = []
        merged: list[str] = []
        for b, (hops, merge) in enumerate(zip(row["branches"], row["merge_at"], strict=True)):
            prev = (self.topics[b], row["topic_ids"][b], row["topic_names"][b])
            own: list[str] = []
            for i, hop in enumerate(hops[:merge]):
                var = self.meet if i + 1 == merge else f"?x{next(self.counter)}"
                steps.append(self.hop_step(prev, hop, var, own, b + 1))
                prev = (var, self.iri_of(hop["entity"]), hop["entity"])
            merged += own
        if len(row["branches"]) > 1:  # separate, then merge
            steps.append(_Step(None, list(merged), self.meet, None, walk_relations(row)))
        for hops, merge in zip(row["branches"], row["merge_at"], strict=True):
            for i in range(merge, len(hops)):
                before = hops[i - 1]["entity"]
                prev = (self.meet if i == merge else steps[-1].var, self.iri_of(before), before)
                var = "?answer" if i + 1 == len(hops) else f"?x{next(self.counter)}"
                steps.append(self.hop_step(prev, hops[i], var, merged))
        return steps


def _calls(step: _Step, query: str, kind: str, row: dict[str, Any]) -> list[OracleCall]:
    """A step's turns: ``<node>`` alone (its relations come back), then ``<SPARQL>`` alone;
    a merge step only queries."""
    about = step.node or " and ".join(row["topic_names"])
    hop = step.hop if step.node else None
    query_call = _query_call(kind, query, row, about, hop, step.relations)
    if not step.node:
        return [query_call]
    node = operations_text([Operation(NODE, step.node)])
    return [OracleCall("node", node, about, hop, step.relations), query_call]


def decomposed_calls(row: dict[str, Any], graph: KGGraph | None) -> list[OracleCall]:
    """The isp oracle's steps by ISP-KGR's decomposition (see the module doc)."""
    gold = _gold_query(row)
    if graph is None or not row.get("branches") or not row.get("topic_ids"):
        return one_shot_calls(row)
    builder = _Builder(row, graph)
    try:
        steps = builder.steps()
    except _Undecomposable:
        return one_shot_calls(row)
    if row.get("sexpr"):  # a COUNT or constraint on the set the hops reach: one step more
        steps.append(_Step(None, [], "", None, walk_relations(row)))
    calls = [
        call
        for s in steps[:-1]
        for call in _calls(
            s, builder.select(s.patterns, s.var, s.seen), "triples" if s.node else "merge", row
        )
    ]
    return calls + _calls(steps[-1], gold, "sparql", row)


__all__ = ["decomposed_calls", "one_shot_calls", "prefixed"]
