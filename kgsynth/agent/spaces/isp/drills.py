"""What ISP-KGR's observations show a copy drill and how its drills read
(:meth:`~kgsynth.agent.spaces.base.ActionSpace.observed`, ``drill_call``, ``drill_action``;
:mod:`kgsynth.train.drills`; the result table and the boxed answers are
:class:`~kgsynth.agent.spaces.sparql_oracle.SparqlSpace`'s).

An isp step's observation is one operation's result, or several, each under an
``Operation i (node "Name"):`` / ``Operation i (SPARQL):`` line (:func:`.tools.run_step`). What
it shows: the explored entity's name (the operation line and the ``Templates of "Name"`` line),
the relations of its templates (``Name -directed_by-> ?m <-starred_actors- ?x (3 answers): …``)
and the names of every query's result table (a ``?variable`` header line, then one
tab-separated row a line, up to the next blank or operation line).

A drill's tool call is the step the isp oracle starts every chain with, ``<node>Name</node>``
(:mod:`.oracle`), written as the step's whole action (no ``<kg-query>`` around it), and a
drill's answer is ``<answer>\\boxed{A} \\boxed{B}</answer>`` (Figure 8), as the oracle answers.
"""

from __future__ import annotations

import re

from kgsynth.agent.protocol import INFO_CLOSE, INFO_OPEN, NODE, Operation, operations_text
from kgsynth.agent.spaces.observed import Observed

_OPERATION = re.compile(r'^Operation \d+ \((?:node "(.*)"|SPARQL)\):$')
_TEMPLATES = re.compile(r'^Templates of "(.+?)" \(')
_TEMPLATE_LINE = re.compile(r"^\d+\. (.+?) \((?:at least )?\d+ answers?\): ")
_HOP = re.compile(r"(?:^| )(?:<-(\S+)-|-(\S+)->) \?[mx]")


def observed(text: str) -> Observed:
    """What one isp observation shows (see the module doc), in order."""
    seen = Observed()
    table = False
    lines = text.replace(INFO_OPEN, "").replace(INFO_CLOSE, "").splitlines()
    for raw in lines:
        line = raw.strip()
        op = _OPERATION.match(line)
        if not line or op:
            table = False
            if op and op.group(1):
                seen.names.append(op.group(1))
            continue
        if table:
            if not line.startswith("[..."):
                seen.names.extend(raw.split("\t"))
            continue
        if line.startswith("?"):  # a result table's header
            table = True
            continue
        named = _TEMPLATES.match(line)
        if named:
            seen.names.append(named.group(1))
            continue
        template = _TEMPLATE_LINE.match(line)
        if template:
            for into, out in _HOP.findall(template.group(1)):
                seen.relations.append(into or out)
    return seen


def drill_call(topic: str) -> str:
    """The oracle's exploring operation on ``topic``: ``<node>topic</node>``."""
    return operations_text([Operation(NODE, topic)])
