"""What an observation shows, read back from its text: the triples, names and relations a space's
tools printed (:meth:`~kgsynth.agent.spaces.base.ActionSpace.observed`), for the copy drills of
:mod:`kgsynth.train.drills`, which drill on the names a corpus's observations show.

The default reading (:func:`read_observation` with :func:`triple_line`) knows the forms the
tool sets share: ``(head, relation, tail)`` lines (the focus ranking's ``<- words`` mark off)
and a query's result table (a header line of ``?variables``, then one tab-separated row a line,
``[...`` lines left out). A space whose tools print other forms reads them line by line in its
own ``observed_line``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from kgsynth.agent.protocol import INFO_CLOSE, INFO_OPEN
from kgsynth.agent.toolkit import unmarked

_TRIPLE = re.compile(r"^\((.+), ([^\s,()]+), (.+)\)$")


@dataclass
class Observed:
    """What one observation shows, in the order it shows it: every name (a triple's head and
    tail, a result row's cells, a result list's members), every relation (a triple's, a
    relation list's), and the triples themselves."""

    names: list[str] = field(default_factory=list)
    relations: list[str] = field(default_factory=list)
    triples: list[tuple[str, str, str]] = field(default_factory=list)

    def add_triple(self, head: str, relation: str, tail: str) -> None:
        self.triples.append((head, relation, tail))
        self.relations.append(relation)
        self.names.extend((head, tail))


LineReader = Callable[[str, Observed], None]


def read_observation(text: str, read_line: LineReader) -> Observed:
    """An observation's text (with or without its ``<information>`` tags) read a line at a
    time: a result table's cells, then whatever ``read_line`` finds in the stripped line."""
    seen = Observed()
    lines = text.replace(INFO_OPEN, "").replace(INFO_CLOSE, "").splitlines()
    table = bool(lines) and lines[0].startswith("?")
    for i, line in enumerate(lines):
        if table and i and not line.startswith("[..."):
            seen.names.extend(line.split("\t"))
        read_line(line.strip(), seen)
    return seen


def triple_line(line: str, seen: Observed) -> None:
    """A ``(head, relation, tail)`` line (a match mark after it left out)."""
    t = _TRIPLE.match(unmarked(line))
    if t:
        seen.add_triple(t.group(1), t.group(2), t.group(3))
