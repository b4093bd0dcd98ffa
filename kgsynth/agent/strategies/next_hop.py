"""Two rules that read the KG one hop ahead for the hop a question names next, both on the
focus ranking's unused words: the way-back marks (``way_back_marks=True``,
:func:`way_back_marks`) and the lead-on order (``lead_on_order=True``, :func:`lead_on_first`).

**Way-back marks.**

A question can name a relation once and travel it twice: "what genres are the movies starred
by X actors" goes out from the film X along ``starred_actors`` to its actors and back along
``starred_actors`` to their other films, then on along ``has_genre``. The focus ranking uses
up a relation's words when the episode follows it, so at an actor the list shows no mark, and
an agent trained on the marks reads that as "nothing more is asked" and answers with the
actor. Round-trip words ("the same director as X",
:mod:`kgsynth.agent.strategies.round_trips`) keep the words for the way back where the
question says it comes back; this rule covers the questions that do not say so.

The signal is the KG's, not a word list's: at an entity the last hop reached along ``r``, on a
list that would show no mark, while a content word of the question nothing has used yet (not
a function word, not a topic's name; the noun after an opening which/what counts: "what genres
..." names ``has_genre``) is a word of the property of a relation that the entities reached
back along ``r`` have
(a few of them, first by name), the relation back along ``r`` is marked with that word and
listed first. "Go back the way you came" is the only move it suggests: the word it marks with
names the hop after it, which the next list marks as a plain match. Where the entities back
along ``r`` have no relation with such a word (the question asks for nothing more, or for
something the KG words otherwise), the list stays unmarked.

**Lead-on order.** A hop reaches several entities and the agent goes on from the first one
listed; where that one lacks the relation the question names next ("who acted in the movies
directed by X": X's first film has no ``starred_actors``), its list shows no mark and the
agent answers with the film. With the rule, ``get_triples`` lists first, of the first
:data:`LEAD_ON_POOL` entities in its order, those with a relation (other than the one followed)
whose property a content word nothing has used yet names; the order is otherwise kept.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from functools import lru_cache

from kgsynth.agent.stemming import joins
from kgsynth.agent.strategies.focus import FocusWord, joined
from kgsynth.agent.toolkit import ranking_terms
from kgsynth.kg.graph import Entity, Neighbor, Relation
from kgsynth.kg.relnames import property_words

Ranked = list[tuple[Relation, tuple[str, ...]]]
# lead_on_order looks at the relations of this many of a hop's entities, in display order
LEAD_ON_POOL = 20
# way_back_marks reads the relations of this many of the entities back along a hop
WAY_BACK_SAMPLE = 5
# (entity, relation) -> the relations of the entities reached from it along the relation
Reach = Callable[[Entity, Relation], Iterable[Relation]]


def way_back_marks(
    ranked: Ranked,
    entity: Entity,
    arrived: Relation | None,
    words: dict[str, FocusWord],
    reach: Reach,
) -> Ranked:
    """``ranked`` (the focus ranking of ``entity``'s relations, reached along ``arrived`` by
    the last hop) with the relation back along ``arrived`` marked and listed first where no
    relation is marked and one of ``words`` (the unused content words,
    :func:`~kgsynth.agent.strategies.focus.content_words`) is a word of a relation the entities
    back along it have; unchanged otherwise."""
    if arrived is None or not words or not ranked or any(marks for _, marks in ranked):
        return ranked
    back = next(
        (
            i
            for i, (rel, _) in enumerate(ranked)
            if rel.name == arrived.name and rel.direction != arrived.direction
        ),
        None,
    )
    if back is None:
        return ranked
    beyond = named_terms(reach(entity, ranked[back][0]), arrived.name)
    words = joined(words, [beyond])
    shared = sorted((words[t] for t in beyond & words.keys()), key=lambda w: w.position)
    if not shared:
        return ranked
    marks = tuple(dict.fromkeys(w.word for w in shared))
    return [(ranked[back][0], marks), *ranked[:back], *ranked[back + 1 :]]


@lru_cache(maxsize=4096)
def _property_terms(name: str) -> tuple[str, ...]:
    """The stemmed words of a relation's property (the same name is read on every call)."""
    return tuple(ranking_terms(property_words(name)))


def named_terms(rels: Iterable[Relation], followed: str) -> set[str]:
    """The stemmed words of the properties of ``rels``, the relation ``followed`` left out."""
    return {t for rel in rels if rel.name != followed for t in _property_terms(rel.name)}


def lead_on_first(
    neighbors: Sequence[Neighbor],
    followed: Relation,
    words: dict[str, FocusWord],
    relations_of: Callable[[str], Iterable[Relation]],
    topics: Collection[str] = (),
) -> list[Neighbor]:
    """``neighbors`` (a hop's entities along ``followed``, in display order) with those of
    the first :data:`LEAD_ON_POOL` that have a relation one of ``words`` names moved first, in
    their order; unchanged where ``words`` is empty or none does. ``relations_of``: an IRI's
    relations. The question's ``topics`` (by name) are never moved: a question does not ask
    for what it starts from."""
    if not words or len(neighbors) < 2:
        return list(neighbors)

    def _leads(n: Neighbor) -> bool:
        terms = named_terms(relations_of(n.term.value), followed.name)
        return any(joins(word, term) for word in words for term in terms)

    head = list(neighbors[:LEAD_ON_POOL])
    leads = [n for n in head if n.term.is_iri and n.name not in topics and _leads(n)]
    if not leads or len(leads) == len(head):
        return list(neighbors)
    chosen = {n.term.value for n in leads}
    rest = [n for n in head if n.term.value not in chosen]
    return [*leads, *rest, *neighbors[LEAD_ON_POOL:]]
