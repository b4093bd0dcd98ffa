"""GraphWalker's observations as its paper shows them (``graphwalker_observations="paper"``).

graphwalker.txt, App. E.3 (the complete trajectories) and App. H (the KG interaction prompt):

- ``get_relations("X")`` reads as the relation names alone, one comma-separated list, most
  relevant first (App. E.3: ``sports.sports_team.venue, sports.sports_team.arena_stadium, …``);
  no header, no direction, no count. A relation X has both ways is listed once
  (``get_triples`` returns the triples "whose head or tail is e", §2.1).
- ``get_triples("X", [r1, r2, …])`` follows the first :data:`PAPER_RELATIONS_PER_CALL`
  relations of the list it is given, in that order, and drops the rest (App. H, KG Query
  Server Instructions rule 6: give all candidate relations ranked, "the top 4" are used); its
  triples read ``[h, r, t]``, comma-separated on one line (App. E.3), at most
  ``max_triples_per_relation`` per relation and direction (§2.2.1 Phase 3: up to 5 a
  relation) and no count of those left out.

What kgsynth adds around a paper observation stays as it is in the kgsynth style, each on a
line of its own: the notes on how an entity name was read, the relations asked for that the
entity lacks, the conjunction hints (where they are on). The focus ranking's match marks are
not shown (the paper's list is names only). Both tools keep the environment's services: the
ranking strategy, the neighbour order, the observation cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.toolkit import SHARED_MARK, ErrorType, ToolFailure, ToolResult
from kgsynth.kg.graph import Entity, Relation

PAPER_RELATIONS_PER_CALL = 4
"""get_triples follows this many relations of its list (GraphWalker App. H, rule 6)."""


def relation_list(env: Any, entity: Entity, rels: list[Relation], notes: tuple[str, ...]) -> Any:
    """``entity``'s relations as one comma-separated list of names: ranked by the configured
    strategy, each name once, the first ``top_k_relations``."""
    if not rels:
        raise ToolFailure(ErrorType.NO_RESULTS, f'"{entity.name}" has no relations to explore.')
    ranked = [r for r, _ in env.strategies.ranking.rank(env.question, entity, rels)]
    names = list(dict.fromkeys(r.name for r in ranked))[: env.config.top_k_relations]
    return ToolResult("\n".join([*notes, ", ".join(names)]), entities=(entity.name,), notes=notes)


def capped_relations(relations: str | Sequence[str]) -> list[str]:
    """The relation names ``get_triples`` follows: the first
    :data:`PAPER_RELATIONS_PER_CALL` distinct ones of the list, in its order."""
    wanted = [relations] if isinstance(relations, str) else list(relations)
    names = dict.fromkeys(n.strip() for n in wanted if isinstance(n, str) and n.strip())
    return list(names)[:PAPER_RELATIONS_PER_CALL]


def triple(entity: str, rel: Relation, other: str) -> str:
    """One triple as the paper writes it: ``[head, relation, tail]``."""
    head, tail = (entity, other) if rel.direction == "out" else (other, entity)
    return f"[{head}, {rel.name}, {tail}]"


def triple_list(
    env: Any,
    entity: Entity,
    rels: list[Relation],
    notes: tuple[str, ...],
    missing: Sequence[str] = (),
) -> ToolResult:
    """The triples of ``entity`` along ``rels``, ``[h, r, t]``, comma-separated on one line:
    per relation and direction the ones the environment's neighbour order shows first, at
    most ``max_triples_per_relation``."""
    shown_triples: list[str] = []
    seen: list[str] = [entity.name]
    hints = env.strategies.hints
    before = hints.start(entity.iri)
    for rel in rels:
        neighbors = env.graph.neighbors(entity.iri, rel)
        shown, _total, shared = env.shown_neighbors(entity, rel, neighbors, before)
        for n in shown:
            mark = SHARED_MARK if n.term.value in shared else ""
            shown_triples.append(triple(entity.name, rel, n.name) + mark)
            seen.append(n.name)
        hints.reach(neighbors)
    if len(seen) == 1:
        raise ToolFailure(ErrorType.NO_RESULTS, f'no triples found for "{entity.name}".')
    lines = [*notes, ", ".join(shown_triples)]
    if missing:
        lines.append(f'(not relations of "{entity.name}": {", ".join(missing)})')
    lines.extend(hints.finish(entity.iri))
    return ToolResult("\n".join(lines), entities=tuple(dict.fromkeys(seen)), notes=notes)


def shows_relation(result: Any, call: OracleCall) -> bool:
    """Whether a paper-style relation list names the call's hop's relation."""
    assert call.hop is not None
    listed = result.text.splitlines()[-1] if result.text else ""
    return call.hop["relation"] in listed.split(", ")


def triples_shown(result: Any, call: OracleCall) -> int:
    """How many ``[h, r, t]`` triples a paper-style observation shows along the call's hop (a
    count's members; the paper shows no count of those left out, so a capped list shows
    fewer than the answer and the count is turned down)."""
    hop = call.hop
    assert hop is not None
    rel = hop["relation"]
    text = result.text
    if hop["inverse"]:
        return text.count(f", {rel}, {call.entity}]")
    return text.count(f"[{call.entity}, {rel}, ")
