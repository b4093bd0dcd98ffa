"""How a relation's name reads: the property it names, with its type as context.

Schema-style names pack a path into one name: Freebase's ``film.film.directed_by`` and
``/people/person/nationality``, FB15k-237's CVT paths
(``/film/film/release_date_s./film/film_regional_release_date/film_release_region``), exports
that write the separators as double underscores (``__film__film__country``). Read as a whole they
make "film film country"; the property (the last part) is what a question asks for, and the
part before it is the type whose property it is. Names without such separators (MetaQA's
``directed_by``, Wikidata's ``P57``) are their own property. Every place that turns a relation
into words (the template backend's questions, the oracle's thoughts, the sentence encoder's
relation texts, the tools' relation words) reads it by :func:`relation_parts`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CVT = re.compile(r"\.(?=/)")  # FB15k-237 joins a CVT path's two hops with "./"
_SEPARATOR = re.compile(r"/|\.|__")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")


@dataclass(frozen=True)
class RelationParts:
    """``property``: the last part of the name (``nationality``); ``type``: the part before it
    (``person``), or "" for a name of one part."""

    property: str
    type: str


def relation_parts(name: str) -> RelationParts:
    """The property and type a relation name holds (see the module)."""
    last = _CVT.split(name)[-1]
    parts = [p for p in _SEPARATOR.split(last) if p.strip("_ ")]
    if not parts:
        return RelationParts(name, "")
    return RelationParts(parts[-1], parts[-2] if len(parts) > 1 else "")


def words_of(part: str) -> str:
    """A name part as lower-case words: ``_`` and camelCase split (``releaseYear`` -> ``release
    year``)."""
    return " ".join(_CAMEL.sub(" ", part).replace("_", " ").split()).lower()


def property_words(name: str) -> str:
    """The words of a relation's property (``/people/person/nationality`` -> ``nationality``,
    ``film.film.directed_by`` -> ``directed by``)."""
    return words_of(relation_parts(name).property) or name


def relation_phrase(name: str) -> str:
    """The property's words with the type as context where it adds words (``/people/person/
    nationality`` -> ``nationality person``; ``__film__film__country`` -> ``country film``;
    ``directed_by`` -> ``directed by``)."""
    parts = relation_parts(name)
    words = words_of(parts.property)
    context = [w for w in words_of(parts.type).split() if w not in words.split()]
    return " ".join([words, *context]).strip() or name
