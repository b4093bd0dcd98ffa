"""What kgr1's four tools return, in either form ``kgr1_observation`` names.

``flat`` (the default; kg-r1.txt App. E examples, ablation A9 "flat, comma-separated list"):
one line per result, a header naming what was asked, then the names::

    Tail relations for entity "Kismet": directed_by, release_year, starred_actors
    Head entities for relation "directed_by" with tail "William Dieterle": Juarez, Kismet

Relations are listed by name, entities in the environment's neighbour order (``neighbor_order``),
the full set unless ``kgr1_max_relations`` / ``kgr1_max_entities`` cap it ("(showing 1 of 2,
capped)" in the header). A list longer than ``max_observation_chars`` is cut after a whole name
with "... (N more)" (a plain cut would end inside a name). An empty result is an error
(``no tail relations for entity "X".``), as the paper's server answers "no relations found".

``triples`` is kgsynth's earlier form (one ``(X, r, ?)`` or ``(X, r, Y)`` line each, under a
``Relations of "X":`` header), kept as a named variant; it shows at most
``max_triples_per_relation`` entities when ``kgr1_max_entities`` is unset, as before.

Both read the KG through a view (:mod:`.subgraph`): the whole KG, or the question's subgraph.
"""

from __future__ import annotations

from typing import Any

from kgsynth.agent.toolkit import (
    SHARED_MARK,
    ErrorType,
    ToolFailure,
    ToolResult,
    quoted_name,
    relation_pattern,
)
from kgsynth.kg.graph import Entity, Relation

SIDES = {"out": "tail", "in": "head"}  # a relation's direction -> the paper's word for it
# the other end an entity list names: tails have a head, heads a tail
OTHER_END = {"out": "head", "in": "tail"}
MORE = ", ... ({n} more)"


def _entity(env: Any, view: Any, name: str) -> tuple[Entity, tuple[str, ...]]:
    """The entity ``name`` names, which must be in the view (the question's subgraph)."""
    entity, notes = env._entity(name)
    if not view.has(entity):
        raise ToolFailure(
            ErrorType.ENTITY_NOT_FOUND,
            f'"{quoted_name(entity.name)}" is not in this question\'s subgraph; use a name from '
            "the question or an earlier observation.",
        )
    return entity, notes


def flat_line(head: str, names: list[str], budget: int) -> tuple[str, list[str]]:
    """``head`` then ``names`` comma-separated, cut after a whole name so the line stays within
    ``budget`` characters (at least one name is kept); the line and the names it shows."""
    line = f"{head}: {', '.join(names)}"
    if len(line) <= budget:
        return line, names
    kept = 1
    while kept < len(names):
        tail = MORE.format(n=len(names) - kept - 1)
        if len(f"{head}: {', '.join(names[: kept + 1])}{tail}") > budget:
            break
        kept += 1
    return f"{head}: {', '.join(names[:kept])}{MORE.format(n=len(names) - kept)}", names[:kept]


def _budget(env: Any, notes: tuple[str, ...], after: list[str]) -> int:
    """The characters the list line may take beside the notes before and the lines after."""
    others = sum(len(line) + 1 for line in (*notes, *after))
    return env.config.max_observation_chars - others


def relations_one_way(env: Any, view: Any, name: str, direction: str) -> ToolResult:
    """The relations of ``name`` going ``direction``, by name, capped by
    ``kgr1_max_relations``."""
    entity, notes = _entity(env, view, name)
    rels = [r for r in view.relations(entity.iri) if r.direction == direction]
    cap = env.config.kgr1_max_relations
    ranked = sorted(rels, key=lambda r: (r.name, r.direction))[:cap]
    capped = f" (showing {len(ranked)} of {len(rels)}, capped)" if len(ranked) < len(rels) else ""
    if env.config.kgr1_observation == "triples":
        head = f'Relations of "{entity.name}"'
        if capped:
            head += f" (showing {len(ranked)} of {len(rels)} (capped))"
        return env.relation_list(entity, rels, notes, listed=(ranked, head + ":"))
    if not rels:
        text = f'no {SIDES[direction]} relations for entity "{quoted_name(entity.name)}".'
        raise ToolFailure(ErrorType.NO_RESULTS, text)
    head = f'{SIDES[direction].capitalize()} relations for entity "{entity.name}"{capped}'
    line, _ = flat_line(head, [r.name for r in ranked], _budget(env, notes, []))
    return ToolResult("\n".join([*notes, line]), entities=(entity.name,), notes=notes)


def _one_relation(
    env: Any, view: Any, entity: Entity, relation: object, direction: str
) -> list[Relation]:
    """The relations named ``relation`` going ``direction`` that the view has for ``entity``."""
    if not isinstance(relation, str):
        raise ToolFailure(ErrorType.WRONG_ARGUMENTS, "give one relation name as a string.")
    rels, _ = env.select_relations(entity, [relation], direction)
    rels = [r for r in rels if view.neighbors(entity.iri, r)]
    if not rels:
        raise ToolFailure(
            ErrorType.RELATION_NOT_FOUND,
            f'"{quoted_name(entity.name)}" has no relation {relation} in this question\'s subgraph.',
        )
    return rels


def entities_one_way(
    env: Any, view: Any, name: str, relation: object, direction: str
) -> ToolResult:
    """The entities ``relation`` reaches from ``name`` going ``direction``, capped by
    ``kgr1_max_entities``; entities the conjunction hints mark end in " <- both"."""
    entity, notes = _entity(env, view, name)
    rels = _one_relation(env, view, entity, relation, direction)
    flat = env.config.kgr1_observation == "flat"
    cap = env.config.kgr1_max_entities
    hints = env.strategies.hints
    before = hints.start(entity.iri)
    listed: list[tuple[Relation, list[str], int]] = []  # relation, names shown, how many
    for rel in rels:
        neighbors = view.neighbors(entity.iri, rel)
        limit = cap if cap is not None or not flat else len(neighbors)
        shown, total, shared = env.shown_neighbors(entity, rel, neighbors, before, limit)
        hints.reach(neighbors)
        names = [n.name + (SHARED_MARK if n.term.value in shared else "") for n in shown]
        listed.append((rel, names, total))
    after = hints.finish(entity.iri)
    if flat:
        lines, names = _flat_lines(env, entity, notes, after, listed)
    else:
        lines, names = _triple_lines(entity, listed)
    text = "\n".join([*notes, *lines, *after])
    return ToolResult(text, entities=tuple(dict.fromkeys([entity.name, *names])), notes=notes)


def _triple_lines(
    entity: Entity, listed: list[tuple[Relation, list[str], int]]
) -> tuple[list[str], list[str]]:
    """The ``triples`` form: one ``(X, r, Y)`` line per entity, then "... N more (X, r, ?)
    (capped)"; the names shown."""
    lines: list[str] = []
    names: list[str] = []
    for rel, shown, total in listed:
        for marked in shown:
            name = marked.removesuffix(SHARED_MARK)
            mark = marked[len(name) :]
            triple = (
                f"({entity.name}, {rel.name}, {name})"
                if rel.direction == "out"
                else (f"({name}, {rel.name}, {entity.name})")
            )
            lines.append(triple + mark)
            names.append(name)
        if total > len(shown):
            more = f"... {total - len(shown)} more {relation_pattern(entity.name, rel)}"
            lines.append(more + " (capped)")
    return lines, names


def _flat_lines(
    env: Any,
    entity: Entity,
    notes: tuple[str, ...],
    after: list[str],
    listed: list[tuple[Relation, list[str], int]],
) -> tuple[list[str], list[str]]:
    """The ``flat`` form: a line per relation (one, unless the name matches it both ways), each
    cut to its share of the observation budget; the names shown."""
    budget = (_budget(env, notes, after) - (len(listed) - 1)) // len(listed)
    lines: list[str] = []
    names: list[str] = []
    for rel, shown, total in listed:
        capped = f" (showing {len(shown)} of {total}, capped)" if len(shown) < total else ""
        side, end = SIDES[rel.direction].capitalize(), OTHER_END[rel.direction]
        head = f'{side} entities for relation "{rel.name}" with {end} "{entity.name}"{capped}'
        line, kept = flat_line(head, shown, budget)
        lines.append(line)
        names.extend(n.removesuffix(SHARED_MARK) for n in kept)
    return lines, names
