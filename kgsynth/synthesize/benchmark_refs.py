"""References from a benchmark's gold SPARQL (issue 18, part 5b: Referenced Rejection Sampling).

A WebQSP/CWQ/GrailQA/GraphQ question's SPARQL that is a path or a conjunction of paths from
entities to the answer becomes a kgsynth walk row (``topic_names``, ``topic_ids``,
``branches`` of ``{relation, inverse, entity}`` hops, ``merge_at``, ``structure`` chain-k,
2I, PI, IP or ``conjunction``), so the oracle of :mod:`kgsynth.agent.spaces.paths` writes its
graphwalker or kgr1 actions (:func:`benchmark_reference`) and replays them through the real
tools::

    row = benchmark_walk_row(record, graph)          # or NotAPath(reason)
    text = benchmark_reference(record, graph, "graphwalker")

The query's shape comes from :func:`path_shape` (no KG); its variables are then bound on the KG
by running the query's own triple patterns (one binding, an answer from the gold set first),
its relations named by the profile (``people.person.nationality``), and a hop through an
unnamed node (a Freebase CVT) merged with the next into the flattened relation ``r1.r2`` the
tools show. A query that filters on values, orders, counts, constrains a class, or uses a
relation the tools hide is not a path: :class:`NotAPath` says which (``kind`` for counting,
``reason`` for people); nothing is guessed.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.agent.spaces.registry import names, space
from kgsynth.datasets.bench_sparql import (
    ParsedQuery,
    Pattern,
    SparqlSyntaxError,
    Term,
    parse_sparql,
)
from kgsynth.datasets.qafiles import QARecord
from kgsynth.kg import sparql as sp
from kgsynth.kg.graph import KGGraph
from kgsynth.metrics import entity_id


class NotAPath(ValueError):
    """A query that is not a path or a conjunction of paths. ``kind``: a short category
    (``ordering``, ``aggregate``, ``value_filter``, ``value_constraint``,
    ``class_constraint``, ``hidden_relation``, ``shape``, ``unnamed_node``, ``no_binding``,
    ``syntax``, ``no_sparql``, ``feature``); ``reason``: what exactly."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason


_LANG_FILTER = re.compile(
    r"\(!isliteral\(\?(\w+)\)(?:or|\|\|)lang\(\?\1\)=(?:''|\"\")(?:or|\|\|)"
    r"langmatches\(lang\(\?\1\),(?:'en'|\"en\")\)\)"
)
_INEQUALITY = re.compile(r"\(\?\w+!=(?:\?\w+|<[^>]*>|[\w.\-]*:[\w.\-]+)\)")


@dataclass(frozen=True)
class PathHop:
    """One hop: along ``predicate`` (an IRI), from subject to object, or back when
    ``inverse``; ``node`` is where it arrives (a variable or the answer)."""

    predicate: str
    inverse: bool
    node: Term


@dataclass(frozen=True)
class PathShape:
    """A query as walk branches: ``topics[i]`` (an entity IRI) starts ``branches[i]``; the
    branches meet after ``merge_at[i]`` hops each, and branch 0's hops after its meeting
    point lead on to the answer variable ``answer``."""

    answer: str
    topics: list[str]
    branches: list[list[PathHop]]
    merge_at: list[int]
    patterns: list[Pattern]


def _allowed_filter(text: str) -> bool:
    """The filters WebQSP/CWQ/GrailQA add to every query: the answer is not the topic
    (``?x != ns:m.0x``), and a literal answer is in English."""
    flat = "".join(text.split()).lower()
    return bool(_LANG_FILTER.fullmatch(flat) or _INEQUALITY.fullmatch(flat))


def _substituted(query: ParsedQuery) -> list[Pattern]:
    """The patterns with each ``VALUES ?v { <one IRI> }`` variable replaced by its IRI."""
    fixed: dict[str, Term] = {}
    for var, terms in query.values.items():
        if len(terms) != 1 or terms[0].kind != "iri":
            raise NotAPath(
                "feature", f"VALUES ?{var} with {len(terms)} values (a set, not one entity)"
            )
        fixed[var] = terms[0]

    def sub(t: Term) -> Term:
        return fixed.get(t.value, t) if t.kind == "var" else t

    return [Pattern(sub(p.s), p.p, sub(p.o)) for p in query.patterns]


def _check_plain(query: ParsedQuery) -> None:
    """:class:`NotAPath` for a query that orders, aggregates, filters on values or uses any
    other feature beyond a basic graph pattern."""
    for feature in query.features:
        raise NotAPath(_feature_kind(feature), feature)
    for text in query.filters:
        if not _allowed_filter(text):
            raise NotAPath("value_filter", f"FILTER {text}")


def path_shape(query: ParsedQuery) -> PathShape:
    """The branches of a path or conjunction query (see :class:`PathShape`), or
    :class:`NotAPath` naming what the query does beyond following relations from entities."""
    _check_plain(query)
    if len(query.select) != 1 or query.select[0] == "*":
        raise NotAPath("shape", f"projects {query.select or 'nothing'}, not one variable")
    answer = query.select[0]
    patterns = _substituted(query)
    if not patterns:
        raise NotAPath("shape", "no triple pattern")
    edges: dict[str, list[tuple[int, str]]] = defaultdict(list)  # node -> (pattern, other)
    for k, pat in enumerate(patterns):
        if pat.p.kind != "iri":
            raise NotAPath("shape", f"variable predicate {pat.p}")
        for t in (pat.s, pat.o):
            if t.kind == "literal":
                raise NotAPath("value_constraint", f"{pat.p} {t}")
        a, b = _node(pat.s), _node(pat.o)
        if a == b:
            raise NotAPath("shape", f"self loop on {pat.p}")
        edges[a].append((k, b))
        edges[b].append((k, a))
    root = "?" + answer
    if root not in edges:
        raise NotAPath("shape", f"the answer ?{answer} is in no triple pattern")
    if len(edges) != len(patterns) + 1 or not _connected(edges, root):
        raise NotAPath("shape", "the patterns form a cycle or are not connected")
    leaves = [n for n, e in edges.items() if len(e) == 1 and n != root]
    for node in leaves:
        if node.startswith("?"):
            raise NotAPath("shape", f"dangling variable {node} (an existence constraint)")
    topics = [n for n in edges if not n.startswith("?")]
    for node in topics:
        if len(edges[node]) != 1:
            raise NotAPath("shape", f"the entity {node} is inside the query, not at an end")
    # each topic's path to the answer (unique: the patterns form a tree)
    parent = _parents(edges, root)
    paths = []
    for topic in sorted(topics, key=lambda t: _first_mention(patterns, t)):
        nodes, steps = [topic], []
        while nodes[-1] != root:
            k, up = parent[nodes[-1]]
            nodes.append(up)
            steps.append(k)
        paths.append((nodes, steps))
    meet = _meeting_node(paths)
    before = [nodes[: nodes.index(meet)] for nodes, _ in paths]
    if sum(map(len, before)) != len(set().union(*before)):
        raise NotAPath("shape", "the branches meet at more than one node")
    branches: list[list[PathHop]] = []
    merge_at: list[int] = []
    for nodes, steps in paths:
        at = nodes.index(meet)
        hops = [_hop(patterns[k], nodes[j]) for j, k in enumerate(steps)]
        branches.append(hops if not branches else hops[:at])
        merge_at.append(at)
    return PathShape(
        answer, [t[1:-1] for t in (nodes[0] for nodes, _ in paths)], branches, merge_at, patterns
    )


def _node(t: Term) -> str:
    return f"?{t.value}" if t.kind == "var" else f"<{t.value}>"


def _connected(edges: dict[str, list[tuple[int, str]]], root: str) -> bool:
    return len(_parents(edges, root)) + 1 == len(edges)


def _parents(edges: dict[str, list[tuple[int, str]]], root: str) -> dict[str, tuple[int, str]]:
    """Each node's (pattern, parent) on the way to ``root``."""
    parent: dict[str, tuple[int, str]] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        for k, other in edges[node]:
            if other != root and other not in parent:
                parent[other] = (k, node)
                todo.append(other)
    return parent


def _first_mention(patterns: list[Pattern], node: str) -> int:
    return next(k for k, p in enumerate(patterns) if node in (_node(p.s), _node(p.o)))


def _meeting_node(paths: list[tuple[list[str], list[int]]]) -> str:
    """The first node every topic's path passes through (the answer for one path)."""
    if len(paths) == 1:
        return paths[0][0][-1]
    common = set(paths[0][0]).intersection(*(set(nodes) for nodes, _ in paths[1:]))
    return next(n for n in paths[0][0] if n in common)


def _hop(pat: Pattern, start: str) -> PathHop:
    forward = _node(pat.s) == start
    return PathHop(pat.p.value, not forward, pat.o if forward else pat.s)


def _feature_kind(feature: str) -> str:
    word = feature.split()[0].lower()
    if word in ("order", "limit", "offset"):
        return "ordering"
    if word in ("aggregate", "group", "having"):
        return "aggregate"
    return "feature"


# --- on a KG ------------------------------------------------------------------------------------


@dataclass
class _Hop:
    predicates: tuple[str, ...]  # one IRI, or two across an unnamed node
    inverse: bool
    node: Term  # where it arrives (a variable, or the answer)


def _structure(branches: Sequence[Sequence[Any]], merge_at: Sequence[int]) -> str:
    """The walk structure name of a shape: chain-k, 2I, IP, PI, else ``conjunction``."""
    if len(branches) == 1:
        return f"chain-{len(branches[0])}"
    tail = len(branches[0]) - merge_at[0]
    if len(branches) == 2 and (list(merge_at), tail) in (([1, 1], 0), ([1, 1], 1), ([2, 1], 0)):
        return {0: "2I", 1: "IP"}[tail] if merge_at[0] == 1 else "PI"
    return "conjunction"


def _bind(graph: KGGraph, shape: PathShape, gold_ids: set[str]) -> dict[str, Any]:
    """One binding of the shape's variables on the KG: its own triple patterns run as one
    query; a binding whose answer is a gold answer first, then the smallest (values in
    variable order)."""
    variables = sorted({t.value for p in shape.patterns for t in (p.s, p.o) if t.kind == "var"})
    triples = " ".join(
        f"{_written(p.s)} {sp.iri(p.p.value)} {_written(p.o)} ." for p in shape.patterns
    )
    filters = " ".join(f"FILTER(?{shape.answer} != {sp.iri(t)})" for t in shape.topics)
    query = (
        f"SELECT {' '.join('?' + v for v in variables)} WHERE {{ {triples} {filters} }} LIMIT 1000"
    )
    rows = [r for r in graph.kg.select(query) if all(v in r for v in variables)]
    if not rows:
        raise NotAPath("no_binding", "the query has no answer on this KG")

    def key(row: dict[str, Any]) -> tuple[bool, tuple[str, ...]]:
        answer = row[shape.answer]
        gold = answer.kind == "iri" and entity_id(answer.value) in gold_ids
        return (not gold, tuple(row[v].value for v in variables))

    return min(rows, key=key)


def _written(t: Term) -> str:
    return f"?{t.value}" if t.kind == "var" else sp.iri(t.value)


def _flattened(
    graph: KGGraph, hops: list[_Hop], binding: dict[str, Any], ends: set[int]
) -> list[_Hop]:
    """``hops`` with each hop into an unnamed node merged with the next (the flattened
    ``r1.r2`` relation kgsynth's tools show across a Freebase CVT). ``ends``: positions whose
    node must stay (a branch's meeting point, the answer)."""
    out: list[_Hop] = []
    j = 0
    while j < len(hops):
        hop = hops[j]
        value = binding[hop.node.value] if hop.node.kind == "var" else None
        unnamed = value is not None and value.kind == "iri" and graph.label(value.value) is None
        if not unnamed:
            out.append(hop)
            j += 1
            continue
        if not graph.profile.flatten_unnamed:
            raise NotAPath("unnamed_node", f"?{hop.node.value} is an unnamed node")
        if j in ends or j + 1 >= len(hops):
            raise NotAPath("unnamed_node", f"?{hop.node.value}, an unnamed node, ends a branch")
        nxt = hops[j + 1]
        if nxt.inverse != hop.inverse:
            raise NotAPath(
                "unnamed_node", f"the unnamed node ?{hop.node.value} is crossed in two directions"
            )
        # forward: X r1 ?c . ?c r2 Y; backward the KG path runs Y r1 ?c . ?c r2 X
        pair = hop.predicates + nxt.predicates
        out.append(_Hop(pair if not hop.inverse else pair[::-1], hop.inverse, nxt.node))
        j += 2
    return out


def sparql_walk_row(
    sparql: str,
    graph: KGGraph,
    *,
    question: str = "",
    answer_names: Sequence[str] = (),
    answer_ids: Sequence[str | None] = (),
) -> dict[str, Any]:
    """The walk row of a path or conjunction query on ``graph`` (see the module docstring);
    ``answer_names``/``answer_ids``: the gold answers (default: the query's answers on the
    KG). Raises :class:`NotAPath`."""
    try:
        query = parse_sparql(sparql)
    except SparqlSyntaxError as exc:
        raise NotAPath("syntax", str(exc)) from None
    profile = graph.profile
    _check_plain(query)
    for pat in query.patterns:
        if pat.p.kind == "iri" and pat.p.value in profile.type_predicates:
            raise NotAPath("class_constraint", f"{_local(pat.p.value, graph)} {pat.o}")
    shape = path_shape(query)
    for pat in shape.patterns:
        if profile.is_hidden(pat.p.value):
            name = profile.relation_name(pat.p.value)
            raise NotAPath("hidden_relation", f"{name} is hidden from the agent's tools")
    gold_ids = {i for i in (entity_id(a) for a in answer_ids if a) if i}
    binding = _bind(graph, shape, gold_ids)
    answer = binding[shape.answer]
    if answer.kind == "iri" and graph.label(answer.value) is None:
        raise NotAPath("unnamed_node", f"the answer ?{shape.answer} is an unnamed node")

    branches: list[list[_Hop]] = []
    merge_at = list(shape.merge_at)
    for b, path in enumerate(shape.branches):
        hops = [_Hop((h.predicate,), h.inverse, h.node) for h in path]
        ends = {merge_at[b] - 1, len(hops) - 1}
        flat = _flattened(graph, hops, binding, ends)
        # a merged pair lies wholly before or after the meeting point (``ends``): count the
        # merged hops that cover the hops before it
        covered = merge_at[b] = 0
        for h in flat:
            if covered >= shape.merge_at[b]:
                break
            covered += len(h.predicates)
            merge_at[b] += 1
        branches.append(flat)

    topics = []
    for topic in shape.topics:
        name = graph.label(topic)
        if name is None:
            raise NotAPath("no_binding", f"the entity <{topic}> has no name in the KG")
        topics.append((topic, name))
    rows = [
        [
            {
                "relation": ".".join(profile.relation_name(p) for p in h.predicates),
                "inverse": h.inverse,
                "entity": _name(graph, binding[h.node.value]),
            }
            for h in hops
        ]
        for hops in branches
    ]
    order = list(range(len(rows)))
    if len(rows[0]) == merge_at[0]:  # no hops after the meeting point: longest branch first
        order.sort(key=lambda b: -len(rows[b]))
    rows = [rows[b] for b in order]
    merge_at = [merge_at[b] for b in order]
    topics = [topics[b] for b in order]
    if not answer_names:
        answer_names, answer_ids = _query_answers(graph, shape, binding)
    return {
        "question": question,
        "structure": _structure(rows, merge_at),
        "hops": sum(len(b) for b in rows),
        "topic_names": [t[1] for t in topics],
        "topic_ids": [t[0] for t in topics],
        "branches": rows,
        "merge_at": merge_at,
        "answer_names": list(answer_names),
        "answer_ids": list(answer_ids),
        "sparql": sparql,
        "sexpr": "",
    }


def _name(graph: KGGraph, term: Any) -> str:
    return (graph.label(term.value) or term.value) if term.kind == "iri" else term.value


def _local(iri: str, graph: KGGraph) -> str:
    return graph.profile.relation_name(iri)


def _query_answers(
    graph: KGGraph, shape: PathShape, binding: dict[str, Any]
) -> tuple[list[str], list[str | None]]:
    """The names and ids of every answer of the query on the KG (when no gold is given)."""
    triples = " ".join(
        f"{_written(p.s)} {sp.iri(p.p.value)} {_written(p.o)} ." for p in shape.patterns
    )
    rows = graph.kg.select(f"SELECT DISTINCT ?{shape.answer} WHERE {{ {triples} }}")
    terms = sorted({r[shape.answer] for r in rows if shape.answer in r}, key=lambda t: t.value)
    names = [_name(graph, t) for t in terms]
    return names, [entity_id(t.value) if t.kind == "iri" else None for t in terms]


def benchmark_walk_row(record: QARecord, graph: KGGraph) -> dict[str, Any]:
    """The walk row of a benchmark question's gold SPARQL, with its gold answers and id
    (``question_id``); :class:`NotAPath` when it has none or it is not a path."""
    if not record.sparql:
        raise NotAPath("no_sparql", "the question has no gold SPARQL")
    row = sparql_walk_row(
        record.sparql,
        graph,
        question=record.question,
        answer_names=record.answer_names,
        answer_ids=record.answer_ids or [None] * len(record.answer_names),
    )
    row["question_id"] = record.question_id or f"line-{record.line}"
    return row


def benchmark_reference(record: QARecord, graph: KGGraph, toolset: str = "graphwalker") -> str:
    """The numbered gold actions (the action space's ``reference_text``) of a benchmark
    question whose SPARQL is a path or a conjunction, for a space whose oracle replays walks;
    raises :class:`NotAPath`."""
    actions = space(toolset)
    if actions.oracle_from != "walk":
        walks = ", ".join(n for n in names() if space(n).oracle_from == "walk")
        raise ValueError(f"toolset must be one of {walks} (got {toolset!r})")
    return actions.reference_text(benchmark_walk_row(record, graph))


def benchmark_walk_rows(
    records: Iterable[QARecord], graph: KGGraph
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The walk rows of the questions whose SPARQL is a path or conjunction, and how many
    of the others were turned down, by :attr:`NotAPath.kind`."""
    rows: list[dict[str, Any]] = []
    rejected: Counter[str] = Counter()
    for rec in records:
        try:
            rows.append(benchmark_walk_row(rec, graph))
        except NotAPath as exc:
            rejected[exc.kind] += 1
    return rows, rejected
