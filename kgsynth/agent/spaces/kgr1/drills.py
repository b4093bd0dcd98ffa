"""What KG-R1's observations show a copy drill (:meth:`~kgsynth.agent.spaces.base.ActionSpace.observed`),
in either ``kgr1_observation`` form (:mod:`.observe`): a ``flat`` entity list,
``Tail entities for relation "r" with head "X": A, B`` (the triples ``(X, r, A)``,
``(X, r, B)``; ``Head entities … with tail "X"`` the other way), a flat relation list
(``Tail relations for entity "X": r1, r2``), or a ``triples`` line ``(X, r, Y)``. The
conjunction hints' marks and a cut list's ``... (N more)`` are left out."""

from __future__ import annotations

import re

from kgsynth.agent.spaces.observed import Observed, triple_line
from kgsynth.agent.toolkit import SHARED_MARK

_CAPPED = r"(?: \(showing \d+ of \d+, capped\))?"
_ENTITIES = re.compile(
    r'^(?:Tail|Head) entities for relation "(.+?)" with (head|tail) "(.+)"' + _CAPPED + r": (.+)$"
)
_RELATIONS = re.compile(r'^(?:Tail|Head) relations for entity ".+"' + _CAPPED + r": (.+)$")
_MORE = re.compile(r"^\.\.\. \(\d+ more\)$")


def observed_line(line: str, seen: Observed) -> None:
    """A flat entity list's triples, a flat relation list's relations, or a triple line."""
    listed = _ENTITIES.match(line)
    if listed:
        relation, end, entity, names = listed.groups()
        for name in names.split(", "):
            if _MORE.match(name):
                continue
            name = name.removesuffix(SHARED_MARK)
            if end == "head":
                seen.add_triple(entity, relation, name)
            else:
                seen.add_triple(name, relation, entity)
        return
    relations = _RELATIONS.match(line)
    if relations:
        seen.relations.extend(r for r in relations.group(1).split(", ") if not _MORE.match(r))
        return
    triple_line(line, seen)
