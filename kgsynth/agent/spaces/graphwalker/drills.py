"""What GraphWalker's observations show a copy drill (:meth:`~kgsynth.agent.spaces.base.ActionSpace.observed`):
the ``(h, r, t)`` lines of the kgsynth style, and the paper style's ``[h, r, t]`` triples,
comma-separated on one line (:mod:`.paper`); a triple an observation cap cut off is left out."""

from __future__ import annotations

import re

from kgsynth.agent.spaces.observed import Observed, triple_line

_BRACKETED = re.compile(r"\[([^\[\]]+)\]")
_INNER = re.compile(r"^(.+), ([^\s,]+), (.+)$")


def observed_line(line: str, seen: Observed) -> None:
    """A ``(h, r, t)`` line, or a line of ``[h, r, t]`` triples."""
    if not line.startswith("["):
        triple_line(line, seen)
        return
    for bracketed in _BRACKETED.finditer(line):
        t = _INNER.match(bracketed.group(1))
        if t:
            seen.add_triple(t.group(1), t.group(2), t.group(3))
