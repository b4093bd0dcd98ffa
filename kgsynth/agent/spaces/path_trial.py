"""Trial-and-error demonstrations for the path oracle (graphwalker, kgr1): dead ends.

On a chain, a hop often reaches several entities, and on an incomplete KG some of them lack
the next hop's relation (a film with no genre). The plain replay goes on from an entity the
next relation leads on from; an agent that picks the first entity shown, lists its relations
and does not find the relation it needs has never seen what to do next, and answers with the
entities it has (dev: most 3-hop misses stop after such a list). A dead-end demonstration keeps
the plain replay and, at one inner hop, first lists the relations of the entities the hop
showed before the one the replay goes on from, in display order, each lacking the next
relation, then goes on as the replay did. The step that goes on is an
:class:`~kgsynth.agent.spaces.oracle_call.OracleCall` whose ``mistake`` (kind ``dead_end``)
names the entity that lacked the relation, so its thought says why it moves on.

A hop qualifies only where every entity shown before the one the replay goes on from (not the
call's own entity, not a topic) lists its relations without the next hop's relation: the rule
the demonstration teaches, "try the shown entities in order until one has the relation", then
holds for every entity it passes over. With ``--follow first`` that is every inner hop whose
first shown entity is passed over. At most :data:`MAX_DEAD_ENDS` entities are tried. The
answers stay the replay's."""

from __future__ import annotations

import random
from typing import Any

from kgsynth.agent.spaces.oracle_call import OracleCall

MAX_DEAD_ENDS = 2
"""The most entities a demonstration lists before the one it goes on from."""

Step = tuple[OracleCall, Any]


def _dead_ends(space: Any, env: Any, names: list[str], hop: dict[str, Any]) -> list[Step] | None:
    """The relations calls of ``names`` and their results, or None when one of them fails or
    lists ``hop``'s relation (it would not be a dead end). The calls leave the environment's
    episode state as it was."""
    state = env.snapshot()
    try:
        out = []
        for name in names:
            call = space.hop_calls(name, hop)[0]
            got = env.execute(call.call)
            if got.error is not None or space.shows_relation(env, got, call):
                return None
            out.append((call, got))
        return out
    finally:
        env.restore(state)


def dead_end_steps(
    space: Any, row: dict[str, Any], env: Any, steps: list[Step], rng: random.Random
) -> list[Step] | None:
    """The plain chain replay ``steps`` with dead ends listed before one inner hop (drawn with
    ``rng`` among those that qualify), or None when none does or the row is no chain."""
    if len(row["branches"]) != 1:
        return None
    topics = set(row["topic_names"])
    places = []
    for k in range(len(steps) - 1):
        call, result = steps[k]
        nxt = steps[k + 1][0]
        if call.kind != "triples" or nxt.kind != "relations" or nxt.hop is None:
            continue
        shown = [e for e in dict.fromkeys(result.entities) if e != call.entity and e not in topics]
        if nxt.entity not in shown:
            continue
        before = shown[: shown.index(nxt.entity)]
        if 0 < len(before) <= MAX_DEAD_ENDS:
            places.append((k, before))
    rng.shuffle(places)
    for k, before in places:
        nxt, nxt_result = steps[k + 1]
        assert nxt.hop is not None
        dead = _dead_ends(space, env, before, nxt.hop)
        if dead is None:
            continue
        note = {
            "kind": "dead_end",
            "wrong": before[-1],
            "right": nxt.entity,
            "relation": nxt.hop["relation"],
        }
        retry = OracleCall(nxt.kind, nxt.call, nxt.entity, nxt.hop, nxt.relations, note)
        return [*steps[: k + 1], *dead, (retry, nxt_result), *steps[k + 2 :]]
    return None


def dead_end_thought(
    kind: str,
    entity: str,
    hop: dict[str, Any] | None,
    relations: Any,
    mistake: dict[str, str] | None,
) -> str | None:
    """The path spaces' own thought (their ``space_thought``): before the relations call that
    goes on after a dead end; None for every other step (the shared path thoughts)."""
    if mistake is None or mistake.get("kind") != "dead_end":
        return None
    return f"{mistake['wrong']} has no {mistake['relation']}: I list the relations of {entity}."
