"""What the sexpr tool set's observations show and how its copy drills read
(:meth:`~kgsynth.agent.spaces.base.ActionSpace.observed`, ``drill_observation``,
``drill_call``): an expression's results (``2 results: Juarez; Kismet``, ``12 results, the first
10: …``), a relation list (``Relations of expression1 (…): r1, r2``), and KBQA-R1's
``Find_relation [ topic | relation ]`` as the drilled action."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from kgsynth.agent.spaces.observed import Observed, triple_line

_RESULTS = re.compile(r"^\d+ results?(?:, the first \d+)?: (.+)$")
_RELATIONS = re.compile(r"^Relations of expression\d+ \([^)]*\): (.+)$")


def observed_line(line: str, seen: Observed) -> None:
    """An expression's result names, a relation list's relations, or a triple."""
    found = _RESULTS.match(line)
    if found:
        seen.names.extend(found.group(1).split("; "))
    listed = _RELATIONS.match(line)
    if listed:
        seen.relations.extend(listed.group(1).split(", "))
    triple_line(line, seen)


def drill_observation(tails: Sequence[str]) -> str:
    """An expression's results, as the tools show them."""
    return f"{len(tails)} result{'s' * (len(tails) > 1)}: {'; '.join(tails)}"


def drill_call(topic: str, relations: Sequence[str], rng: random.Random) -> str:
    """One ``Find_relation`` from ``topic`` along a relation drawn from ``relations``."""
    return f"Find_relation [ {topic} | {rng.choice(relations)} ]"
