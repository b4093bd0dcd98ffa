"""``SearchGraphPatterns`` as KnowCoder-A1 defines it (``knowcoder_patterns="variable"``, the
default; ``knowcoder-a1.txt`` §4.1 and the App. F case study).

The sketch is a partial query, ``SELECT DISTINCT ?x WHERE { ... }``. Its selected variable (the
first one after SELECT: ``?x``, or ``?e`` as in App. F) is what the search expands around: the
sketch runs (guarded, timed, at most :data:`MAX_BINDINGS` rows) and the IRIs it binds to that
variable are the nodes whose one- and two-hop subgraphs are listed, the variable at their head
or tail (two predicates at most: a relation through an unnamed CVT node counts as its two hops,
and a path that only leads back to the node is left out). Each row reads ``(?x, <r1> -> <r2>, "value")``: the predicates from ``?x`` outwards
(``^<r>`` where a hop is walked against its direction, as SPARQL's inverse path writes it) and
one value reached at the end, by name. A row whose every hop points at ``?x`` is written the
other way round, ``("value", <r2> -> <r1>, ?x)``. The ``semantic`` argument ranks the rows (the
words of their relations, as ``SearchTypes`` ranks types; the question when it is empty); at
most :data:`~kgsynth.agent.spaces.knowcoder.tools.MAX_SHOWN` (10) are shown, one-hop rows before
two-hop ones at an equal score.

kgsynth's one addition: a name in double quotes inside a ``VALUES`` block
(``VALUES ?x { "Kismet" }``) stands for the entity of that name (resolved as every tool resolves
names), since kgsynth's prompts give topic entities by name where the paper gives Freebase ids.
The earlier reading, patterns around the entities a sketch names, is the option value
``entities`` (:func:`~kgsynth.agent.spaces.knowcoder.tools.search_graph_patterns`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kgsynth.agent.spaces.knowcoder import tools as kc
from kgsynth.agent.spaces.sparql import memory_failure
from kgsynth.agent.sparql_exec import agent_timeout, query_form
from kgsynth.agent.toolkit import ErrorType, ToolFailure, ToolResult, relation_words, tokenize
from kgsynth.core.errors import KGMemoryError, QueryRejectedError, RowLimitError
from kgsynth.kg import sparql
from kgsynth.kg.graph import Entity, KGGraph, Relation
from kgsynth.kg.terms import Term

if TYPE_CHECKING:
    from kgsynth.agent.toolkit import ToolHost

MAX_BINDINGS = 3
"""Values of the sketch's variable whose subgraphs are read (the sketch's first rows)."""
MAX_HOPS = 2
"""Predicates one row may cross (§4.1: one- and two-hop subgraphs)."""
ARROW = " -> "

_SELECTED = re.compile(r"(?is)\bSELECT\s+(?:DISTINCT\s+|REDUCED\s+)?[?$](\w+)")
_VALUES = re.compile(r"(?is)(\bVALUES\s+[?$]\w+\s*\{)([^{}]*)(\})")
_QUOTED = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_ROW_PREDICATE = re.compile(r"\^?(<[^<>\s]*>)")


def selected_variable(sketch: str) -> str | None:
    """The sketch's first selected variable, without its ``?`` (None when it selects none)."""
    m = _SELECTED.search(sketch)
    return m.group(1) if m else None


def resolve_values(graph: KGGraph, sketch: str) -> tuple[str, list[str]]:
    """``sketch`` with each quoted name of a ``VALUES`` block that names an entity written as
    that entity's IRI, and the quoted names that name none (left as literals)."""
    missing: list[str] = []

    def name_to_iri(m: re.Match[str]) -> str:
        res = graph.resolve(m.group(1))
        if res is None or not sparql.is_sendable(res.entity.iri):
            missing.append(m.group(1))
            return m.group(0)
        return sparql.iri(res.entity.iri)

    def block(m: re.Match[str]) -> str:
        return m.group(1) + _QUOTED.sub(name_to_iri, m.group(2)) + m.group(3)

    return _VALUES.sub(block, sketch), missing


def bindings(env: ToolHost, sketch: str, var: str) -> list[Term]:
    """The distinct values of ``?var`` in the sketch's first :data:`MAX_BINDINGS` rows (the
    agent's query path: guard, timeout, row cap)."""
    graph = env.graph
    seconds = agent_timeout(None, env.config)
    found: dict[str, Term] = {}
    try:
        for row in graph.kg.agent_select_iter(sketch, timeout=seconds, max_rows=MAX_BINDINGS):
            term = row.get(var)
            if term is not None:
                found.setdefault(term.value, term)
    except RowLimitError:
        pass  # the first rows are enough
    except QueryRejectedError as exc:
        reason = str(exc).removeprefix("refused: ")
        raise ToolFailure(ErrorType.QUERY_REFUSED, f"the sketch was refused: {reason}.") from None
    except KGMemoryError as exc:
        raise memory_failure(exc) from None
    return list(found.values())


def _steps(rel: Relation) -> list[tuple[str, bool]]:
    """The predicates of one relation walked away from ``?x``: (IRI, along its direction)."""
    if rel.inverse:
        return [(p, False) for p in reversed(rel.path)]
    return [(p, True) for p in rel.path]


def pattern_row(steps: Sequence[tuple[str, bool]], var: str, value: str) -> str:
    """One row: ``(?x, <r1> -> <r2>, "value")``, or ``("value", <r2> -> <r1>, ?x)`` when
    every hop points at ``?x``."""
    shown = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if not any(forward for _, forward in steps):
        path = ARROW.join(sparql.iri(p) for p, _ in reversed(steps))
        return f"({shown}, {path}, ?{var})"
    path = ARROW.join(("" if forward else "^") + sparql.iri(p) for p, forward in steps)
    return f"(?{var}, {path}, {shown})"


def row_predicates(text: str) -> list[str]:
    """The predicate IRIs (``<...>``) the rows of a ``SearchGraphPatterns`` observation show,
    in order, each once (the trial-and-error oracle's plausible wrong relations)."""
    found: dict[str, None] = {}
    for line in text.splitlines():
        parts = line.split(", ")
        if line.startswith("(") and len(parts) >= 3:
            for step in ", ".join(parts[1:-1]).split(ARROW):
                m = _ROW_PREDICATE.fullmatch(step.strip())
                if m:
                    found.setdefault(m.group(1), None)
    return list(found)


def _example(graph: KGGraph, p: kc.GraphPattern) -> Term | None:
    """One value at the end of the pattern (the entity itself excluded)."""
    if p.second is None or p.middle is None:
        fan = graph.fanouts(p.entity.iri).get(p.first, 0)
        ends = kc._sample(graph, p.entity.iri, p.first, fan, 1)
    else:
        fan = graph.fanouts(p.middle.value).get(p.second, 0)
        ends = [t for t in kc._sample(graph, p.middle.value, p.second, fan, 2)]
        ends = [t for t in ends if t.value != p.entity.iri]
    return ends[0] if ends else None


def search_variable_patterns(env: ToolHost, sketch: object, hint: object) -> ToolResult:
    """``SearchGraphPatterns`` around the sketch's selected variable (see the module doc)."""
    if not isinstance(sketch, str) or not isinstance(hint, str) or not sketch.strip():
        raise kc._wrong("SearchGraphPatterns")
    var = selected_variable(sketch)
    if var is None or query_form(sketch) != "SELECT":
        raise ToolFailure(
            ErrorType.WRONG_ARGUMENTS,
            "the sketch must be a SELECT query whose first variable is the one to expand, "
            'e.g. SELECT DISTINCT ?x WHERE { VALUES ?x { "Entity Name" } }.',
        )
    graph = env.graph
    query, missing = resolve_values(graph, sketch)
    nodes = [t for t in bindings(env, query, var) if t.kind == "iri"]
    if not nodes:
        named = f" (no entity named {', '.join(repr(m) for m in missing[:5])})" if missing else ""
        raise ToolFailure(
            ErrorType.NO_RESULTS,
            f"the sketch binds no entity to ?{var}{named}; bind it to an entity with "
            f'VALUES ?{var} {{ <IRI> }} or VALUES ?{var} {{ "Entity Name" }}.',
        )
    hint = " ".join(hint.split()) or env.question
    words = tokenize(hint)
    dense = kc._dense(env) if hint else None

    def scores(items: Sequence[tuple[str, ...]]) -> list[float]:
        out = kc._lexical(words, items, kc._bm25(items))
        if dense is not None and items:
            cos = dense.scores(hint, [" ".join(d) for d in items])
            out = [s + float(c) for s, c in zip(out, cos, strict=True)]
        return out

    def rank_first(rels: list[Relation]) -> list[Relation]:
        s = scores([kc._words(relation_words(r)) for r in rels])
        return [rels[i] for i in sorted(range(len(rels)), key=lambda i: -s[i])]

    entities = [Entity(t.value, graph.display_name(t)) for t in nodes]
    patterns: list[kc.GraphPattern] = []
    seen_paths: set[tuple[tuple[str, bool], ...]] = set()
    for e in entities:
        for p in kc.graph_patterns(graph, e, rank_first):
            path = tuple(_steps(p.first)) + tuple(_steps(p.second) if p.second else ())
            # one- and two-hop subgraphs: a flattened (CVT) relation is itself two hops
            if len(path) > MAX_HOPS or path in seen_paths or _example(graph, p) is None:
                continue  # longer, shown already (from another binding), or only back to ?x
            seen_paths.add(path)
            patterns.append(p)
    around = ", ".join(f"{kc._clean(e.name)} {sparql.iri(e.iri)}" for e in entities)
    if not patterns:
        raise ToolFailure(ErrorType.NO_RESULTS, f"no relations around ?{var} ({around}).")
    s = scores([p.words for p in patterns])
    order = sorted(range(len(patterns)), key=lambda i: (-s[i], patterns[i].second is not None, i))
    shown = order[: kc.MAX_SHOWN]
    best = ", best match first" if words else ""
    lines = [
        f"Graph patterns of ?{var} = {around} (showing {len(shown)} of {len(patterns)}{best}):"
    ]
    names: dict[str, None] = dict.fromkeys(x for e in entities for x in (e.name, e.iri))
    for i in shown:
        p = patterns[i]
        steps = _steps(p.first) + (_steps(p.second) if p.second else [])
        end = _example(graph, p)
        assert end is not None  # rows without a value were left out above
        value = kc._clean(graph.display_name(end))
        lines.append(pattern_row(steps, var, value))
        names.update(dict.fromkeys([value, end.value] if end.kind == "iri" else [value]))
    if missing:
        lines.insert(0, f"Note: no entity named {', '.join(repr(m) for m in missing[:5])}.")
    return ToolResult("\n".join(lines), entities=tuple(n for n in names if n))
