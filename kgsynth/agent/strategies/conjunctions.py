"""Conjunction hints, a strategy of the tool environment (``conjunction_hints``).

For a question with two topic entities, ``get_triples`` lists first, marked ``<- both``, the
entities an earlier ``get_triples`` call of the episode from another entity reached too (all
it reached, shown or not), and ends with a line naming the question's topics no call has been
about yet. The state is what each call reached and the entities the calls were about."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kgsynth.kg.graph import Neighbor


class NoHints:
    """``conjunction_hints`` off: nothing marked, nothing added, no state."""

    def visit(self, name: str) -> None:
        """A tool call was about the entity named ``name``."""

    def start(self, iri: str) -> frozenset[str]:
        """A get_triples call from ``iri`` begins: the IRIs to mark as reached before."""
        return frozenset()

    def reach(self, neighbors: Iterable[Neighbor]) -> None:
        """The call reached ``neighbors`` (all of one relation's, shown or not)."""

    def finish(self, iri: str) -> list[str]:
        """The call from ``iri`` listed its triples: the lines it ends with."""
        return []

    def snapshot(self) -> tuple:
        return ()

    def restore(self, state: tuple) -> None:
        pass


@dataclass
class ConjunctionHints(NoHints):
    """``conjunction_hints`` on (graphwalker, kgr1)."""

    topics: Sequence[str] = ()  # the question's topic entities, by name
    visited: tuple[str, ...] = ()  # the names (case-folded) of the entities calls were about
    # each get_triples call's start entity and all it reached (IRIs)
    reached: tuple[tuple[str, frozenset[str]], ...] = ()
    # what the get_triples call under way has reached so far
    _pending: set[str] = field(default_factory=set, repr=False, compare=False)

    def visit(self, name: str) -> None:
        self.visited += (name.casefold(),)

    def start(self, iri: str) -> frozenset[str]:
        self._pending = set()
        return frozenset().union(*(r for start, r in self.reached if start != iri))

    def reach(self, neighbors: Iterable[Neighbor]) -> None:
        self._pending.update(n.term.value for n in neighbors)

    def finish(self, iri: str) -> list[str]:
        if self._pending:
            self.reached += ((iri, frozenset(self._pending)),)
        left = [t for t in self.topics if t.casefold() not in self.visited]
        return [f"(also in the question: {', '.join(left)})"] if left else []

    def snapshot(self) -> tuple:
        return (self.visited, self.reached)

    def restore(self, state: tuple) -> None:
        self.visited, self.reached = state
