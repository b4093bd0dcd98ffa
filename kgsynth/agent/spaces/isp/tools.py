"""ISP-KGR's tool set (``isp``): node exploration through relation-enumeration templates, and
SPARQL execution.

``node("Entity Name")`` — the entity's one- and two-hop templates, each a query shape the
agent can complete: one hop ``(e, r, ?x)`` or ``(?x, r, e)``, two hops
``(e, r1, ?m) (?m, r2, ?x)`` with each hop in either direction. Templates are ranked against
the question by the words of their relations (a template's text: ``directed by starred
actors``): the cosine similarity under the bundled all-MiniLM-L6-v2 encoder
(:func:`kgsynth.agent.relrank.shared_scorer`) plus BM25 scaled to [0, 1], the ``hybrid`` score
of :func:`~kgsynth.agent.toolkit.rank_relations`. The cosine alone misleads on short relation
names: for "who directed Kismet" it gives ``starred actors`` 0.37 and ``directed by`` 0.29;
a shared word counts most with BM25 added. When the encoder cannot load, BM25 alone ranks them
and the observation says so. The best :data:`MAX_TEMPLATES` are shown, one line each: the hops
by name, how many distinct answers ``?x`` the template reaches, and its SPARQL triple patterns
with the entity's IRI; IRIs are written as prefixed names where Oxigraph can parse them back,
after ``PREFIX`` lines the agent copies into its query (:class:`Prefixes`).

``sparql("SELECT ...")`` — runs the agent's query through the read-only guard, the timeout
(the agent's ``query_timeout_s``; on a store directory the query runs in a child process that
is killed at it) and the row cap (:func:`kgsynth.agent.spaces.sparql.sparql_result`); rows are shown
by name.

The work of one ``node`` call is bounded: only the :data:`MAX_FIRST_HOP` best-ranked first-hop
relations are expanded to a second hop, each through at most :data:`MAX_MIDS` of its
neighbours (chosen in the environment's seeded relevance order, see
:func:`~kgsynth.agent.toolkit.order_neighbors`). Answer counts come from
:class:`~kgsynth.kg.graph.KGGraph`'s cached look-ups: a one-hop count is the relation's
fan-out; a two-hop count is the union over the neighbours looked at, shown as "at least" when
the first hop has more neighbours than were looked at. The entity itself is not counted as an
answer of a two-hop template (its patterns then carry ``FILTER(?x != e)``), and a two-hop
template that reaches only the entity is not shown.

An agent step writes these as ISP-KGR's operations, ``<node>Kismet</node>`` and
``<SPARQL>SELECT …</SPARQL>``, several in one step (:mod:`kgsynth.agent.protocol`);
:func:`run_step` runs each through the environment (the same guard, timeout, row cap and
per-call bound as a single call, a typed error per operation) and returns their observations
together, in order, the whole cut at :data:`STEP_OBSERVATION_CALLS` calls' worth of text with
the visible truncation marker; a ``<node>`` operation's templates come inside
``<relation>…</relation>`` (ISP-KGR's prompt, Figure 8: relations in ``<relation>``, query
results in ``<information>``).

Built by :class:`~kgsynth.agent.tools.ToolEnvironment` when ``toolset="isp"``::

    ToolEnvironment(graph, "who directed Kismet", AgentConfig(toolset="isp")).execute('node("Kismet")')
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kgsynth.agent.spaces.sparql import ToolTable, sparql_result
from kgsynth.agent.sparql_exec import AGENT_MAX_ROWS
from kgsynth.agent.toolcall import ToolCall
from kgsynth.agent.toolkit import (
    DenseScorer,
    ErrorType,
    ToolFailure,
    ToolHost,
    ToolResult,
    order_neighbors,
    rank_relations,
    relation_words,
    truncate,
)
from kgsynth.kg import sparql
from kgsynth.kg.graph import Entity, KGGraph, Relation
from kgsynth.kg.terms import Term

if TYPE_CHECKING:
    from kgsynth.agent.protocol import Operation

log = logging.getLogger(__name__)

MAX_TEMPLATES = 10
"""Templates a ``node`` observation shows, most similar to the question first (ISP: top 10)."""
MAX_FIRST_HOP = 20
"""First-hop relations (the best-ranked) expanded to a second hop."""
MAX_MIDS = 5
"""Neighbours per expanded first-hop relation whose relations give the second hops."""
STEP_OBSERVATION_CALLS = 2
"""A step's combined observation is cut at this many calls' worth of characters (each call's
own bound is ``max_observation_chars``), so two explorations fit whole."""

TOOL_HELP = [
    {
        "usage": "<node>Entity Name</node>",
        "description": "the entity's one- and two-hop query templates, most relevant first, "
        "each with its answer count and SPARQL triple patterns (?x is the answer)",
    },
    {
        "usage": "<SPARQL>SELECT ... WHERE { ... }</SPARQL>",
        "description": "run a SELECT or ASK query over the KG; rows are shown by name",
    },
]
"""The operations as the system prompt shows them (the tools behind them are ``node`` and
``sparql``, which ``kg tool`` calls as ``node("Entity Name")``)."""

ENCODER_FALLBACK_NOTE = (
    "note: the sentence encoder could not be loaded; templates are ranked by BM25 instead."
)


@dataclass
class Template:
    """One relation-enumeration template of an entity: one or two hops, the answer ``?x``.

    ``mids`` are the first hop's neighbours (IRIs) through which the second hop was found;
    ``sampled`` says the first hop has more neighbours than ``mids`` (counts are then lower
    bounds)."""

    hops: tuple[Relation, ...]
    mids: tuple[str, ...] = ()
    sampled: bool = False
    answers: int = 0
    reaches_entity: bool = False

    @property
    def text(self) -> str:
        """What is ranked against the question: the relation words of the hops."""
        return " ".join(relation_words(r) for r in self.hops)

    def shape(self, name: str) -> str:
        """The hops by name: ``Kismet -directed_by-> ?m <-directed_by- ?x``."""
        parts = [name]
        for i, rel in enumerate(self.hops):
            var = "?x" if i == len(self.hops) - 1 else "?m"
            arrow = f"-{rel.name}->" if rel.direction == "out" else f"<-{rel.name}-"
            parts += [arrow, var]
        return " ".join(parts)

    def patterns(self, entity_iri: str, term: Callable[[str], str] = sparql.iri) -> str:
        """The SPARQL triple patterns of the template with the entity's IRI. A hop across an
        unnamed node (a flattened Freebase CVT) is two patterns through ``?c1``/``?c2``, as in
        WebQSP's queries; :meth:`KGGraph.pattern`'s filters that the node is unnamed are left
        out, they would triple a line's length. ``term`` writes an IRI (see :class:`Prefixes`)."""
        node = term(entity_iri)
        if len(self.hops) == 1:
            return hop_patterns(node, self.hops[0], "?x", "?c1", term)
        first = hop_patterns(node, self.hops[0], "?m", "?c1", term)
        text = f"{first} {hop_patterns('?m', self.hops[1], '?x', '?c2', term)}"
        return text + f" FILTER(?x != {node})" if self.reaches_entity else text


def hop_patterns(
    subject: str, rel: Relation, obj: str, mid: str, term: Callable[[str], str] = sparql.iri
) -> str:
    """Triple patterns for ``subject --rel--> obj`` (SPARQL terms), through ``mid`` when the
    relation is a two-edge path."""
    head, tail = (obj, subject) if rel.inverse else (subject, obj)
    edges = [term(p) for p in rel.path]
    if len(edges) == 1:
        return f"{head} {edges[0]} {tail} ."
    return f"{head} {edges[0]} {mid} . {mid} {edges[1]} {tail} ."


# a prefixed name's local part kgsynth writes: letters, digits, _ - . and %XX (no final dot),
# at most one dot: Oxigraph 0.5's parser refuses ns:film.actor.film (valid SPARQL)
_LOCAL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]|%[0-9A-Fa-f]{2})*(?<!\.)$")
_PREFIX_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
# the W3C vocabularies' usual prefix names (their last path segments are not names)
_KNOWN = {
    "http://www.w3.org/1999/02/22-rdf-syntax-ns#": "rdf",
    "http://www.w3.org/2000/01/rdf-schema#": "rdfs",
    "http://www.w3.org/2001/XMLSchema#": "xsd",
    "http://www.w3.org/2002/07/owl#": "owl",
}


class Prefixes:
    """Short names for IRIs in an observation: a namespace (an IRI up to its last ``/`` or
    ``#``) gets ``PREFIX name:``, its usual name for a W3C vocabulary (``rdfs:``), else named
    after its last path segment (``entity:``, ``ns:``) when that is free, else ``ns1:``,
    ``ns2:`` …; an IRI whose local part is not a plain
    prefixed name (``Kismet_(1944)``), or has more than one dot (Freebase's
    ``film.actor.film``, which Oxigraph cannot parse), stays written in full."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # namespace -> prefix name

    def __call__(self, iri: str) -> str:
        cut = max(iri.rfind("/"), iri.rfind("#")) + 1
        space, local = iri[:cut], iri[cut:]
        if not cut or not _LOCAL.match(local) or local.count(".") > 1 or ">" in space:
            return sparql.iri(iri)
        name = self.names.get(space)
        if name is None:
            last = space.rstrip("/#").rsplit("/", 1)[-1].lower()
            taken = set(self.names.values())
            name = _KNOWN.get(space) or (last if _PREFIX_NAME.match(last) else "")
            name = "" if name in taken else name
            i = 1
            while not name or name in taken:
                name, i = f"ns{i}", i + 1
            self.names[space] = name
        return f"{name}:{local}"

    def declarations(self) -> list[str]:
        return [f"PREFIX {name}: <{space}>" for space, name in self.names.items()]


class TemplateRanker:
    """Orders template texts by similarity to the question: BM25 scaled to [0, 1] plus the
    sentence encoder's cosine (:func:`~kgsynth.agent.toolkit.rank_relations`' hybrid score), or
    BM25 alone when the encoder cannot load (then :attr:`fell_back` is set and every later call
    uses BM25)."""

    def __init__(self, question: str, dense: DenseScorer | None) -> None:
        self.question = question
        self._dense = dense
        self.fell_back = False

    def _scorer(self) -> DenseScorer | None:
        if self.fell_back:
            return None
        if self._dense is None:
            from kgsynth.agent.relrank import shared_scorer

            self._dense = shared_scorer()
        return self._dense

    def rank(self, templates: Sequence[Template]) -> list[Template]:
        """``templates`` most similar first; ties keep the given order (no question: as given)."""
        # rank_relations ranks relations by their names' words: one stand-in per template
        stand_ins = [Relation(t.text, "out", (str(i),)) for i, t in enumerate(templates)]
        scorer = self._scorer() if self.question else None
        try:
            ranked = rank_relations(self.question, stand_ins, scorer)
        except Exception as exc:  # any load failure (missing package, model files, device)
            log.warning("sentence encoder unavailable (%s); ranking templates by BM25", exc)
            self.fell_back = True
            ranked = rank_relations(self.question, stand_ins)
        return [templates[int(r.path[0])] for r in ranked]


def explore(
    env: ToolHost,
    entity: Entity,
    ranker: TemplateRanker,
    *,
    max_first_hop: int = MAX_FIRST_HOP,
    max_mids: int = MAX_MIDS,
) -> list[Template]:
    """Every template of ``entity`` within the bounds, ranked (answer counts not yet set:
    see :func:`count_answers`). One-hop templates are ranked first; the ``max_first_hop`` best
    first hops are expanded through ``max_mids`` of their neighbours each."""
    graph = env.graph
    fanouts = graph.fanouts(entity.iri)
    one_hop = ranker.rank([Template((r,), answers=n) for r, n in fanouts.items()])
    mids_of: dict[Relation, list[str]] = {}
    sampled: dict[Relation, bool] = {}
    for t in one_hop[:max_first_hop]:
        rel = t.hops[0]
        named = [n for n in graph.neighbors(entity.iri, rel) if n.term.kind == "iri"]
        chosen = order_neighbors(env.question, entity.iri, rel, named, max_mids)[:max_mids]
        mids_of[rel] = [n.term.value for n in chosen]
        sampled[rel] = len(named) > len(chosen)
    graph.prefetch_lookups(fanouts=[m for mids in mids_of.values() for m in mids])
    two_hop: dict[tuple[Relation, Relation], list[str]] = {}
    for r1, mids in mids_of.items():
        for mid in mids:
            for r2 in graph.fanouts(mid):
                two_hop.setdefault((r1, r2), []).append(mid)
    candidates = [
        Template((r1, r2), tuple(mids), sampled[r1]) for (r1, r2), mids in two_hop.items()
    ]
    everything = [*one_hop, *candidates]  # one ranking over both: BM25's scores need one corpus
    return ranker.rank(everything)


def count_answers(graph: KGGraph, entity: Entity, template: Template) -> None:
    """Set a two-hop template's answer count: the distinct answers reached through its
    ``mids`` (cached target look-ups), the entity itself left out."""
    if len(template.hops) == 1:
        return
    answers: set[Term] = set()
    for mid in template.mids:
        answers.update(graph.targets(mid, template.hops[1]))
    me = Term("iri", entity.iri)
    template.reaches_entity = me in answers
    answers.discard(me)
    template.answers = len(answers)


def node(
    env: ToolHost,
    name: str,
    ranker: TemplateRanker,
    *,
    max_templates: int = MAX_TEMPLATES,
    max_first_hop: int = MAX_FIRST_HOP,
    max_mids: int = MAX_MIDS,
) -> ToolResult:
    """ISP's node exploration of ``name``: the best ``max_templates`` templates (module doc)."""
    entity, notes = env._entity(name)
    graph = env.graph
    ranked = explore(env, entity, ranker, max_first_hop=max_first_hop, max_mids=max_mids)
    if not ranked:
        raise ToolFailure(ErrorType.NO_RESULTS, f'"{entity.name}" has no relations to explore.')
    graph.prefetch_lookups(
        targets=[
            (m, t.hops[1]) for t in ranked[: max_templates * 2] if len(t.hops) == 2 for m in t.mids
        ]
    )
    shown: list[Template] = []
    for t in ranked:
        count_answers(graph, entity, t)
        if t.answers > 0:  # a two-hop template that only comes back to the entity
            shown.append(t)
        if len(shown) == max_templates:
            break
    if ranker.fell_back:
        notes = (*notes, ENCODER_FALLBACK_NOTE)
    order = ", most similar to the question first" if env.question else ""
    term = Prefixes()
    body = []
    for i, t in enumerate(shown, 1):
        more = "at least " if t.sampled else ""
        count = f"{more}{t.answers} answer{'' if t.answers == 1 else 's'}"
        body.append(f"{i}. {t.shape(entity.name)} ({count}): {t.patterns(entity.iri, term)}")
    lines = [
        *notes,
        f'Templates of "{entity.name}" ({term(entity.iri)}){order}; ?x is the answer; '
        "a query declares the prefixes it uses:",
        *term.declarations(),
        *body,
    ]
    return ToolResult("\n".join(lines), entities=(entity.name, entity.iri), notes=notes)


def make_tools(
    env: ToolHost,
    *,
    timeout: float | None = None,
    max_rows: int = AGENT_MAX_ROWS,
) -> ToolTable:
    """The ``isp`` tool table of ``env``: ``node`` (arity 1) and ``sparql`` (arity 1);
    ``timeout`` (None: the agent's ``query_timeout_s``) and ``max_rows`` bound the agent's
    queries."""
    ranker = TemplateRanker(env.question, env.dense)

    def node_tool(name: str) -> ToolResult:
        ranker.question = env.question
        return node(env, name, ranker)

    def sparql_tool(query: str) -> ToolResult:
        return sparql_result(env, query, "sparql", timeout=timeout, max_rows=max_rows)

    tools: dict[str, tuple[int, Callable[..., ToolResult]]] = {
        "node": (1, node_tool),
        "sparql": (1, sparql_tool),
    }
    return tools


def _header(i: int, op: Operation) -> str:
    what = f'node "{op.text}"' if op.tool == "node" else "SPARQL"
    return f"Operation {i} ({what}):"


def _wrapped(op: Operation, result: ToolResult) -> ToolResult:
    """A ``<node>`` operation's relations inside ``<relation>`` tags, as ISP-KGR's KG system
    returns them (Figure 8); an error stays as it is."""
    if op.tool != "node" or result.error is not None:
        return result
    from kgsynth.agent.protocol import RELATION_CLOSE, RELATION_OPEN

    return dataclasses.replace(result, text=f"{RELATION_OPEN}\n{result.text}\n{RELATION_CLOSE}")


class StepHost(ToolHost, Protocol):
    """What :func:`run_step` needs of the environment: one guarded, bounded call at a time."""

    def call(self, call: ToolCall) -> ToolResult: ...


def run_step(env: StepHost, ops: Sequence[Operation]) -> ToolResult:
    """Run an isp step's operations in order, each as one call of ``env`` (guarded, bounded,
    its own typed error), and return them as one result: the observations in order (one alone
    as it is; several each under an ``Operation i (…):`` line), cut with the truncation marker
    at :data:`STEP_OBSERVATION_CALLS` calls' worth of characters; the first operation's error
    (None when every one ran); the tools joined with ``+``; every argument; every entity."""
    results = [_wrapped(op, env.call(ToolCall(op.tool, (op.text,)))) for op in ops]
    if len(results) == 1:
        return results[0]
    parts = [
        f"{_header(i, op)}\n{r.text}" for i, (op, r) in enumerate(zip(ops, results, strict=True), 1)
    ]
    limit = env.config.max_observation_chars * STEP_OBSERVATION_CALLS
    error = next((r.error for r in results if r.error is not None), None)
    return ToolResult(
        truncate("\n\n".join(parts), limit),
        error,
        "+".join(op.tool for op in ops),
        tuple(a for r in results for a in r.args),
        tuple(dict.fromkeys(e for r in results for e in r.entities)),
        tuple(n for r in results for n in r.notes),
    )


__all__ = [
    "MAX_FIRST_HOP",
    "MAX_MIDS",
    "MAX_TEMPLATES",
    "TOOL_HELP",
    "Template",
    "TemplateRanker",
    "count_answers",
    "explore",
    "make_tools",
    "node",
    "run_step",
]
