"""What KnowCoder-A1's observations show a copy drill and how its drills read
(:meth:`~kgsynth.agent.spaces.base.ActionSpace.observed_line`, ``drill_call``;
:mod:`kgsynth.train.drills`; the result table and the boxed answers are
:class:`~kgsynth.agent.spaces.sparql_oracle.SparqlSpace`'s).

The tools show: ``SearchGraphPatterns``'s heading, ``Graph patterns of ?x = Name <IRI>, …
(showing …):`` (the bound entities' names), and its rows, ``(?x, <r1> -> ^<r2>, "value")`` or
``("value", <r2> -> <r1>, ?x)`` (the relations walked and the value's name);
``ExecuteSPARQL``'s result table (read by the shared reader). ``?x`` is a variable, no name.

A drill's tool call is the oracle's first one (:meth:`KnowCoder.oracle_calls`): a
``SearchGraphPatterns`` sketch binding ``?x`` to the topic by name (:func:`.oracle.pattern_call`); a drill's observation is the result table
of an ``ExecuteSPARQL`` (``?answer`` and ``?name``, as the oracle's queries select them); its
answer is one ``\\boxed{}`` per name (§4.3.2).
"""

from __future__ import annotations

import json
import re

from kgsynth.agent.spaces.knowcoder.oracle import pattern_call
from kgsynth.agent.spaces.knowcoder.patterns import ARROW
from kgsynth.agent.spaces.observed import Observed

_HEADING = re.compile(r"^Graph patterns of \?\w+ = (.+) \(showing \d+ of \d+")
_BOUND = re.compile(r"(.+?) <[^<>\s]+>(?:, |$)")
_QUOTED = r'"((?:[^"\\]|\\.)*)"'
_ROW_OUT = re.compile(r"^\(\?\w+, (.+), " + _QUOTED + r"\)$")
_ROW_IN = re.compile(r"^\(" + _QUOTED + r", (.+), \?\w+\)$")
_PREDICATE = re.compile(r"^\^?<([^<>\s]+)>$")


def _unquoted(text: str) -> str:
    return json.loads(f'"{text}"') if "\\" in text else text


def observed_line(line: str, seen: Observed) -> None:
    """A pattern search's heading or row (see the module doc)."""
    heading = _HEADING.match(line)
    if heading:
        seen.names.extend(m.group(1) for m in _BOUND.finditer(heading.group(1)))
        return
    row = _ROW_OUT.match(line)
    path, value = (row.group(1), row.group(2)) if row else (None, None)
    if row is None:
        row = _ROW_IN.match(line)
        path, value = (row.group(2), row.group(1)) if row else (None, None)
    if path is None or value is None:
        return
    for step in path.split(ARROW):
        predicate = _PREDICATE.match(step.strip())
        if predicate:
            seen.relations.append(predicate.group(1))
    seen.names.append(_unquoted(value))


def drill_call(topic: str) -> str:
    """The oracle's ``SearchGraphPatterns`` on ``topic`` (:func:`.oracle.pattern_call`)."""
    return pattern_call({"topic_names": [topic], "topic_ids": [None]})
