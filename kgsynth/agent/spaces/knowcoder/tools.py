"""KnowCoder-A1's tool set (issue 17): find types and graph patterns, then write and run SPARQL.

``SearchTypes("name or description")``
  The KG's types (objects of the profile's ``type_predicates``: rdf:type, Freebase's
  type.object.type, Wikidata's P31) matching the text, at most 10, each as IRI, name and
  number of instances. A type matches when its name is the text or shares a word with it
  (words of the name and the IRI's local name), ranked by the shared words plus BM25 scaled to
  [0, 1]; ``relation_ranking="hybrid"`` adds the MiniLM cosine of text and type words, and
  types sharing no word then match by similarity. A KG without types fails as ``no_results``.

``SearchGraphPatterns("SPARQL sketch", "semantic hint")``
  KnowCoder-A1's (``knowcoder_patterns="variable"``, the default): :mod:`.patterns`. The
  ``entities`` reading, here: the sketch's entities (IRIs written ``<...>``, prefixed names whose PREFIX the sketch
  declares, names in quotes resolved like every tool's names) and, around each, the one-hop
  patterns ``<e> <r> ?x`` / ``?x <r> <e>`` and two-hop patterns ``<e> <r1> ?m . ?m <r2> ?x``,
  ranked by the hint (else the question) as types are ranked, at most 10, each a SPARQL line
  to paste with a comment naming the hops by relation name and an example value. A second hop
  that only leads back to the entity (the first reversed, one neighbour) is left out.

``ExecuteSPARQL("full query")``
  The query through the read-only guard, the timeout and the row cap
  (:func:`kgsynth.agent.spaces.sparql.sparql_result`).

Bounds: the type catalogue is read once per :class:`~kgsynth.kg.graph.KGGraph` (the
``TYPE_CATALOGUE`` types with most instances); the dense score covers the matched types and the
``DENSE_TYPE_POOL`` most common. A pattern search takes at most ``MAX_SKETCH_ENTITIES``
entities, reads each one's relations in one cached look-up and expands the ``MAX_EXPANDED``
first-hop relations best matching the hint to a second hop through at most ``MAX_MIDDLES``
neighbours each (cached look-ups: ``KGGraph.targets`` up to ``TARGETS_LOOKUP_MAX``
neighbours, a ``LIMIT`` query past it; ``KGGraph.fanouts`` for each neighbour's relations).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rank_bm25 import BM25Okapi

from kgsynth.agent.spaces.sparql import sparql_result
from kgsynth.agent.toolkit import ErrorType, ToolFailure, ToolResult, relation_words, tokenize
from kgsynth.core.errors import RowLimitError
from kgsynth.kg import sparql
from kgsynth.kg.graph import Entity, KGGraph, Relation
from kgsynth.kg.terms import Term

if TYPE_CHECKING:
    from kgsynth.agent.toolkit import DenseScorer, ToolHost

MAX_SHOWN = 10  # types or patterns one call shows
TYPE_CATALOGUE = 50_000
DENSE_TYPE_POOL = 2_000
MAX_SKETCH_ENTITIES = 3
MAX_EXPANDED = 20
MAX_MIDDLES = 3
TARGETS_LOOKUP_MAX = 1_000

_HELP = {  # name: (usage, what it shows)
    "SearchTypes": (
        'SearchTypes("type name or description")',
        "the KG's types (classes) matching it, with IRI and instance count (at most 10)",
    ),
    "SearchGraphPatterns": (
        "SearchGraphPatterns('SELECT DISTINCT ?x WHERE { VALUES ?x { \"Entity Name\" } }', "
        '"semantic hint")',
        "the 1- and 2-hop subgraphs with ?x at their head or tail, as rows "
        '(?x, <r1> -> <r2>, "example value"), best for the hint first (at most 10)',
    ),
    "ExecuteSPARQL": (
        'ExecuteSPARQL("SELECT ... WHERE { ... }")',
        "run one SELECT or ASK query; rows are shown by name, at most 50",
    ),
}
USAGE = {name: usage for name, (usage, _) in _HELP.items()}
TOOL_HELP = [{"usage": usage, "description": text} for usage, text in _HELP.values()]


def _wrong(tool: str) -> ToolFailure:
    return ToolFailure(ErrorType.WRONG_ARGUMENTS, f"wrong arguments; use {USAGE[tool]}.")


def _dense(env: ToolHost) -> DenseScorer | None:
    """The sentence encoder's scorer with ``hybrid`` ranking (the environment's, else shared)."""
    if env.config.relation_ranking == "hybrid" and env.dense is None:
        from kgsynth.agent.relrank import shared_scorer

        env.dense = shared_scorer()
    return env.dense if env.config.relation_ranking == "hybrid" else None


def _lexical(
    words: Sequence[str], docs: Sequence[Sequence[str]], bm25: BM25Okapi | None
) -> list[float]:
    """Shared words plus BM25 scaled to [0, 1] by the best score (a shared word counts most;
    BM25 orders those with as many, shorter names first)."""
    if not words or not docs:
        return [0.0] * len(docs)
    wanted = set(words)
    overlap = [len(wanted & set(d)) for d in docs]
    raw = [float(s) for s in bm25.get_scores(list(words))] if bm25 is not None else []
    top = max(raw, default=0.0)
    scaled = [max(s, 0.0) / top for s in raw] if top > 0 else [0.0] * len(docs)
    return [o + s for o, s in zip(overlap, scaled, strict=True)]


def _bm25(docs: Sequence[Sequence[str]]) -> BM25Okapi | None:
    return BM25Okapi([list(d) or ["_"] for d in docs]) if len(docs) > 1 else None


def _words(*texts: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(w for t in texts for w in tokenize(t)))


# --- SearchTypes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KGType:
    """One type of the KG: its IRI, its name, how many entities have it, its words."""

    iri: str
    name: str
    instances: int
    words: tuple[str, ...]


_Catalogue = tuple[list[KGType], BM25Okapi | None]  # the types, most instances first; BM25
# One catalogue per graph, gone with the graph (a cache, like KGGraph's own look-ups).
_CATALOGUES: weakref.WeakKeyDictionary[KGGraph, _Catalogue] = weakref.WeakKeyDictionary()


def type_catalogue(graph: KGGraph) -> _Catalogue:
    """The KG's types (names, instance counts; most instances first, at most
    ``TYPE_CATALOGUE``; none for a KG without types) and their BM25 index; read once per graph."""
    found = _CATALOGUES.get(graph)
    if found is None:
        found = _CATALOGUES[graph] = _read_catalogue(graph)
    return found


def _read_catalogue(graph: KGGraph) -> _Catalogue:
    prof = graph.profile
    if not prof.type_predicates:
        return [], None
    has = " UNION ".join(f"{{ ?s {sparql.iri(p)} ?t }}" for p in prof.type_predicates)
    named = " UNION ".join(f"{{ ?t {sparql.iri(p)} ?l }}" for p in prof.label_predicates)
    langs = ", ".join(sparql.literal(lang) for lang in prof.label_langs)
    query = (
        f"SELECT ?t ?n ?l WHERE {{ {{ SELECT ?t (COUNT(DISTINCT ?s) AS ?n) WHERE {{ {has} "
        f"FILTER(isIRI(?t)) }} GROUP BY ?t ORDER BY DESC(?n) ?t LIMIT {TYPE_CATALOGUE} }} "
        f"OPTIONAL {{ {named} FILTER(LANG(?l) IN ({langs})) }} }}"
    )
    counts: dict[str, int] = {}
    labels: dict[str, list[Term]] = {}
    try:
        for row in graph.kg.select_iter(query, max_rows=4 * TYPE_CATALOGUE):
            iri = row["t"].value
            counts[iri] = int(row["n"].value)
            labels.setdefault(iri, []).extend([row["l"]] if "l" in row else [])
    except RowLimitError:
        pass  # rows come most common type first: keep those read
    types = []
    for iri, n in counts.items():
        name, local = graph.best_label(labels[iri]), prof.relation_name(iri)
        types.append(KGType(iri, name or local, n, _words(name or "", local)))
    types.sort(key=lambda t: (-t.instances, t.iri))
    return types, _bm25([t.words for t in types])


def search_types(env: ToolHost, text: object) -> ToolResult:
    """``SearchTypes``: the types best matching ``text`` (see the module doc)."""
    if not isinstance(text, str) or not text.strip():
        raise _wrong("SearchTypes")
    query = " ".join(text.split())
    types, bm25 = type_catalogue(env.graph)
    if not types:
        preds = ", ".join(map(env.graph.profile.relation_name, env.graph.profile.type_predicates))
        raise ToolFailure(
            ErrorType.NO_RESULTS,
            f"this KG has no types (no entity has a {preds or 'type'} fact); search graph "
            "patterns around the question's entities instead.",
        )
    exact = [t.name.casefold() == query.casefold() or t.iri == query for t in types]
    scores = _lexical(tokenize(query), [t.words for t in types], bm25)
    pool = [i for i, t in enumerate(types) if exact[i] or scores[i] >= 1.0]
    dense = _dense(env)
    if dense is not None:
        pool = sorted(set(pool) | set(range(min(DENSE_TYPE_POOL, len(types)))))
        cos = dense.scores(query, [" ".join(types[i].words) for i in pool])
        for i, c in zip(pool, cos, strict=True):
            scores[i] += float(c)
    if not pool:
        common = ", ".join(t.name for t in types[:5])
        raise ToolFailure(
            ErrorType.NO_RESULTS, f'no type matches "{query}"; the most common types: {common}.'
        )
    pool.sort(key=lambda i: (not exact[i], -scores[i], -types[i].instances, types[i].iri))
    shown = [types[i] for i in pool[:MAX_SHOWN]]
    lines = [f'Types matching "{query}" (showing {len(shown)} of {len(pool)}, best first):']
    for t in shown:
        plural = "" if t.instances == 1 else "s"
        lines.append(f"{sparql.iri(t.iri)} {t.name} ({t.instances} instance{plural})")
    names = tuple(dict.fromkeys(x for t in shown for x in (t.name, t.iri)))
    return ToolResult("\n".join(lines), entities=names)


# --- SearchGraphPatterns -------------------------------------------------------------------

_PREFIX_DECL = re.compile(r"(?i)\bPREFIX\s+([A-Za-z][\w.-]*)?:\s*<([^<>\s]*)>")
_QUOTED = re.compile(r'"((?:[^"\\\n]|\\.)*)"|\'((?:[^\'\\\n]|\\.)*)\'')
_IRI = re.compile(r"<([^<>\s\"{}|^`\\]+)>")
_PNAME = re.compile(r"(?<![\w?$:<])([A-Za-z][\w-]*)?:([\w%](?:[\w%.-]*[\w%-])?)")


@dataclass(frozen=True)
class GraphPattern:
    """A one-hop (``second`` None) or two-hop pattern from ``entity``; ``middle`` is the
    neighbour the second hop was read from."""

    entity: Entity
    first: Relation
    second: Relation | None = None
    middle: Term | None = None

    @property
    def words(self) -> tuple[str, ...]:
        return _words(*(relation_words(r) for r in (self.first, self.second) if r is not None))


def sketch_entities(graph: KGGraph, sketch: str) -> tuple[list[Entity], list[str]]:
    """The entities a sketch names, in order of appearance (at most ``MAX_SKETCH_ENTITIES``),
    and the quoted names that are no entity. IRIs that are no node with relations (the
    sketch's predicates) are skipped."""
    found: list[tuple[int, str, str]] = []  # (position, "iri" | "name", value)
    prefixes = {m.group(1) or "": m.group(2) for m in _PREFIX_DECL.finditer(sketch)}
    text = _PREFIX_DECL.sub(lambda m: " " * len(m.group(0)), sketch)
    found += [(m.start(), "name", m.group(m.lastindex or 0)) for m in _QUOTED.finditer(text)]
    text = _QUOTED.sub(lambda m: " " * len(m.group(0)), text)
    found += [(m.start(), "iri", m.group(1)) for m in _IRI.finditer(text)]
    text = _IRI.sub(lambda m: " " * len(m.group(0)), text)
    for m in _PNAME.finditer(text):
        if (m.group(1) or "") in prefixes:
            found.append((m.start(), "iri", prefixes[m.group(1) or ""] + m.group(2)))
    prof = graph.profile
    skip = {*prof.label_predicates, *prof.type_predicates}
    entities: dict[str, Entity] = {}
    missing: list[str] = []
    for _, kind, value in sorted(found)[:20]:
        if len(entities) >= MAX_SKETCH_ENTITIES:
            break
        if kind == "name":
            res = graph.resolve(value)
            if res is None:
                missing.append(value)
            else:
                entities.setdefault(res.entity.iri, res.entity)
        elif value in skip or value in entities or not sparql.is_sendable(value):
            continue
        elif graph.relations(value):  # no relations: a predicate of the sketch
            entities[value] = Entity(value, graph.label(value) or prof.relation_name(value))
    return list(entities.values()), missing


def _sample(graph: KGGraph, iri: str, rel: Relation, fanout: int, k: int) -> list[Term]:
    """Up to ``k`` neighbours along ``rel`` other than ``iri`` (IRIs first, by value)."""
    if fanout <= TARGETS_LOOKUP_MAX:
        terms = list(graph.targets(iri, rel))
    else:
        node = sparql.iri(iri)
        query = (
            f"SELECT DISTINCT ?o WHERE {{ {graph.pattern(node, rel, '?o')} "
            f"FILTER(?o != {node}) }} LIMIT {4 * k}"
        )
        terms = sorted((r["o"] for r in graph.kg.select(query) if "o" in r), key=lambda t: t.value)
    terms = [t for t in terms if t.value != iri]
    return sorted(terms, key=lambda t: t.kind != "iri")[:k]


def graph_patterns(
    graph: KGGraph, entity: Entity, rank_first: Callable[[list[Relation]], list[Relation]]
) -> list[GraphPattern]:
    """Every one-hop pattern of ``entity`` and the two-hop patterns through the neighbours of
    its first ``MAX_EXPANDED`` relations in ``rank_first`` order (``MAX_MIDDLES`` each)."""
    fanouts = graph.fanouts(entity.iri)
    patterns = [GraphPattern(entity, rel) for rel in fanouts]
    for rel in rank_first(list(fanouts))[:MAX_EXPANDED]:
        seen: set[Relation] = set()
        for middle in _sample(graph, entity.iri, rel, fanouts[rel], MAX_MIDDLES):
            if middle.kind != "iri":
                continue
            for second, n in graph.fanouts(middle.value).items():
                back = second.path == rel.path and second.direction != rel.direction
                if second in seen or (back and n <= 1):
                    continue
                seen.add(second)
                patterns.append(GraphPattern(entity, rel, second, middle))
    return patterns


def _clean(name: str) -> str:
    return " ".join(name.split())


def _hop(rel: Relation, subject: str, obj: str, mid: str) -> tuple[str, str]:
    """One hop as SPARQL (a flattened hop crosses ``mid``) and by relation name."""
    head, tail = (obj, subject) if rel.inverse else (subject, obj)
    iris = [sparql.iri(p) for p in rel.path]
    text = f"{head} {iris[0]} {tail} ."
    if len(iris) == 2:
        text = f"{head} {iris[0]} {mid} . {mid} {iris[1]} {tail} ."
    return text, f"{head} {rel.name} {tail}"


def _render(graph: KGGraph, p: GraphPattern) -> tuple[str, list[str]]:
    """The pattern as one SPARQL line with a comment: its hops by name and an example."""
    node, name = sparql.iri(p.entity.iri), _clean(p.entity.name)
    if p.second is None or p.middle is None:
        text, by_name = _hop(p.first, node, "?x", "?c1")
        fan = graph.fanouts(p.entity.iri).get(p.first, 0)
        examples = [("?x", t) for t in _sample(graph, p.entity.iri, p.first, fan, 1)]
    else:
        one, two = _hop(p.first, node, "?m", "?c1"), _hop(p.second, "?m", "?x", "?c2")
        text, by_name = f"{one[0]} {two[0]}", f"{one[1]} . {two[1]}"
        fan = graph.fanouts(p.middle.value).get(p.second, 0)
        ends = _sample(graph, p.middle.value, p.second, fan, 2)
        examples = [("?m", p.middle), *[("?x", t) for t in ends if t.value != p.entity.iri][:1]]
    seen, shown = [p.entity.name, p.entity.iri], []
    for var, term in examples:
        label = _clean(graph.display_name(term))
        shown.append(f"{var} = {label}")
        seen += [label, term.value] if term.kind == "iri" else [label]
    example = f"; e.g. {', '.join(shown)}" if shown else ""
    return f"{text}  # {by_name.replace(node, name)}{example}", seen


def search_graph_patterns(env: ToolHost, sketch: object, hint: object) -> ToolResult:
    """``SearchGraphPatterns``: patterns around the sketch's entities (see the module doc)."""
    if not isinstance(sketch, str) or not isinstance(hint, str) or not sketch.strip():
        raise _wrong("SearchGraphPatterns")
    graph = env.graph
    entities, missing = sketch_entities(graph, sketch)
    not_found = f" (no entity named {', '.join(repr(m) for m in missing[:5])})" if missing else ""
    if not entities:
        raise ToolFailure(
            ErrorType.ENTITY_NOT_FOUND,
            "the sketch names no entity of the KG; write entity IRIs as <...> or exact "
            f"entity names in double quotes{not_found}.",
        )
    hint = " ".join(hint.split()) or env.question
    words = tokenize(hint)
    dense = _dense(env) if hint else None

    def scores(items: Sequence[tuple[str, ...]]) -> list[float]:
        out = _lexical(words, items, _bm25(items))
        if dense is not None and items:
            cos = dense.scores(hint, [" ".join(d) for d in items])
            out = [s + float(c) for s, c in zip(out, cos, strict=True)]
        return out

    def rank_first(rels: list[Relation]) -> list[Relation]:
        s = scores([_words(relation_words(r)) for r in rels])
        return [rels[i] for i in sorted(range(len(rels)), key=lambda i: -s[i])]

    patterns = [p for e in entities for p in graph_patterns(graph, e, rank_first)]
    if not patterns:
        listed = ", ".join(f'"{e.name}"' for e in entities)
        raise ToolFailure(ErrorType.NO_RESULTS, f"no relations around {listed}.")
    s = scores([p.words for p in patterns])
    order = sorted(range(len(patterns)), key=lambda i: (-s[i], patterns[i].second is not None, i))
    around = ", ".join(f"{_clean(e.name)} {sparql.iri(e.iri)}" for e in entities)
    first = ", best match first" if words else ""
    shown = order[:MAX_SHOWN]
    lines = [f"Graph patterns around {around} (showing {len(shown)} of {len(patterns)}{first}):"]
    if not_found:
        lines.insert(0, f"Note:{not_found}.")
    rendered = [_render(graph, patterns[i]) for i in shown]
    lines += [line for line, _ in rendered]
    names = dict.fromkeys(name for _, seen in rendered for name in seen)
    return ToolResult("\n".join(lines), entities=tuple(names))


# --- ExecuteSPARQL -------------------------------------------------------------------------


def execute_sparql(env: ToolHost, query: object) -> ToolResult:
    """``ExecuteSPARQL``: the query, guarded and bounded."""
    if not isinstance(query, str) or not query.strip():
        raise _wrong("ExecuteSPARQL")
    return sparql_result(env, query, "ExecuteSPARQL")
