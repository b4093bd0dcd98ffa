"""KG-R1's per-question subgraph (``kgr1_subgraph_hops``; kg-r1.txt §4.1 and App. B.2): the
tools answer from the triples a breadth-first expansion of ``hops`` hops from the question's
topic entities crosses, not from the whole KG.

An expansion of ``h`` hops crosses every edge of an entity fewer than ``h`` hops from a topic
(it expands that entity), and no other edge. So an edge ``(u, r, v)`` is in the subgraph when
``u`` or ``v`` lies within ``h - 1`` hops, and an entity is in it when it lies within ``h - 1``
hops or has a neighbour that does. :class:`QuestionSubgraph` computes the ``h - 1`` ball once
(for the paper's ``h = 2``: the topics and their neighbours, one look-up per topic relation)
and decides everything else from the entity a tool is asked about and its own neighbours, so
an episode never pays for the whole 2-hop neighbourhood of a hub.

Hops count kgsynth's relations: on a profile that flattens unnamed (CVT) nodes a relation
crossing one is one hop. Literal values are nodes (two films sharing a year literal meet
there) but are not expanded from.
"""

from __future__ import annotations

from collections.abc import Sequence

from kgsynth.kg.graph import Entity, KGGraph, Neighbor, Relation


class QuestionSubgraph:
    """One question's ``hops``-hop subgraph around its topic entities (names, as the
    environment's ``topics``); built on first use."""

    def __init__(self, graph: KGGraph, topics: Sequence[str], hops: int) -> None:
        self.graph = graph
        self.topics = tuple(topics)
        self.hops = hops
        self._inner: frozenset[str] | None = None

    def inner(self) -> frozenset[str]:
        """The terms (IRIs, literal values) within ``hops - 1`` hops of a topic: each one's
        edges are all in the subgraph."""
        if self._inner is None:
            frontier = set()
            for name in self.topics:
                found = self.graph.resolve(name)
                if found is not None:
                    frontier.add(found.entity.iri)
            seen = set(frontier)
            for _ in range(self.hops - 1):
                reached: set[str] = set()
                for iri in frontier:
                    for rel in self.graph.relations(iri):
                        for n in self.graph.neighbors(iri, rel):
                            if n.term.value not in seen:
                                seen.add(n.term.value)
                                if n.term.kind != "literal":
                                    reached.add(n.term.value)
                frontier = reached
            self._inner = frozenset(seen)
        return self._inner

    def neighbors(self, iri: str, rel: Relation) -> list[Neighbor]:
        """The neighbours along ``rel`` whose edge from ``iri`` is in the subgraph."""
        every = self.graph.neighbors(iri, rel)
        inner = self.inner()
        return every if iri in inner else [n for n in every if n.term.value in inner]

    def relations(self, iri: str) -> list[Relation]:
        """``iri``'s relations with at least one edge in the subgraph (both directions)."""
        rels = self.graph.relations(iri)
        if iri in self.inner():
            return rels
        return [r for r in rels if self.neighbors(iri, r)]

    def has(self, entity: Entity) -> bool:
        """Whether ``entity`` is a node of the subgraph."""
        return entity.iri in self.inner() or bool(self.relations(entity.iri))


class WholeKG:
    """The view without ``kgr1_subgraph_hops``: every relation and edge of the KG."""

    def __init__(self, graph: KGGraph) -> None:
        self.graph = graph

    def neighbors(self, iri: str, rel: Relation) -> list[Neighbor]:
        return self.graph.neighbors(iri, rel)

    def relations(self, iri: str) -> list[Relation]:
        return self.graph.relations(iri)

    def has(self, entity: Entity) -> bool:
        return True
