"""The path oracle of the graphwalker and kgr1 spaces (GraphWalker's GraphSynth): each
question's walk becomes a relations call then a triples call per hop (both branches of a
conjunction, then IP's last hop; the space writes the calls, :meth:`PathSpace.hop_calls`), run
through the same :class:`~kgsynth.agent.tools.ToolEnvironment` (ranking, limits) as RL and eval.
A step whose gold relation or next entity the tools do not show turns the question down
(:class:`~kgsynth.core.stage.Reject`)."""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from typing import Any

from kgsynth.agent.spaces.oracle_call import OracleCall, oracle_answers
from kgsynth.agent.spaces.path_trial import dead_end_steps, dead_end_thought
from kgsynth.agent.toolkit import unmarked
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.core.stage import Reject
from kgsynth.kg.graph import KGGraph
from kgsynth.llm.constraint_questions import CONSTRAINT_STRUCTURES


def _ordered_hops(row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(start entity name, hop)`` in replay order: each branch up to the meeting point, in
    the row's order (``synthesize trajectories`` puts it in the order the question names the
    topics, :func:`~kgsynth.agent.prompt.in_mention_order`: where the second branch ends, the
    entities both reached are the answers), then the hops after it (IP's last hop, from the
    meeting entity)."""
    main: list[tuple[str, dict[str, Any]]] = []
    tail: list[tuple[str, dict[str, Any]]] = []
    branches = zip(row["topic_names"], row["branches"], row["merge_at"], strict=True)
    for topic, hops, merge in branches:
        cur = topic
        for i, hop in enumerate(hops):
            (main if i < merge else tail).append((cur, hop))
            cur = hop["entity"]
    return main + tail


class PathSpace(ABC):
    """The oracle of a space whose tools list an entity's relations and follow one: a
    subclass writes :meth:`hop_calls`, and ``look_ahead_call(entity)`` (the relations of an
    answer, a ``check``) where it has the look-ahead."""

    @abstractmethod
    def hop_calls(self, entity: str, hop: dict[str, Any]) -> tuple[OracleCall, OracleCall]:
        """The relations call and the triples call of one hop from ``entity``."""

    def oracle_calls(self, row: dict[str, Any], graph: KGGraph | None = None) -> list[OracleCall]:
        """The gold action sequence of a question's walk."""
        if row.get("structure") in CONSTRAINT_STRUCTURES and not _expressible(row):
            raise Reject("oracle_not_expressible")
        calls: list[OracleCall] = []
        for entity, hop in _ordered_hops(row):
            calls.extend(self.hop_calls(entity, hop))
        return calls

    # --trial-and-error: dead ends before an inner hop (kgsynth.agent.spaces.path_trial),
    # whose step that goes on has its own thought
    trial_and_error = True
    space_thought = staticmethod(dead_end_thought)

    def replay(
        self, row: dict[str, Any], env: ToolEnvironment, **options: Any
    ) -> list[tuple[OracleCall, Any]]:
        """The oracle's calls run in ``env`` (:func:`replay`)."""
        return replay(self, row, env, **options)

    def trial(
        self, row: dict[str, Any], env: ToolEnvironment, steps: list[Any], rng: random.Random
    ) -> list[Any] | None:
        """The replay with dead ends listed before one inner hop (:mod:`.path_trial`)."""
        return dead_end_steps(self, row, env, steps, rng)

    def shows_relation(self, env: ToolEnvironment, result: Any, call: OracleCall) -> bool:
        """Whether a relations call's observation lists its hop's relation, in the hop's
        direction: a ``(X, r, ?)`` or ``(?, r, X)`` line (marks aside), X the entity the
        list's header names. A space whose lists read otherwise says so here."""
        m = _LISTED_AS.search(result.text)
        shown = m.group(1) if m else call.entity
        hop = call.hop
        assert hop is not None
        pattern = (
            f"(?, {hop['relation']}, {shown})"
            if hop["inverse"]
            else f"({shown}, {hop['relation']}, ?)"
        )
        return pattern in map(unmarked, result.text.splitlines())

    def triples_shown(self, env: ToolEnvironment, result: Any, call: OracleCall) -> int | None:
        """How many triples a triples call's observation shows along its hop (one
        ``(X, r, Y)`` line each), or None where a line says some are left out (the display
        cap). A space whose triples read otherwise says so here."""
        hop = call.hop
        assert hop is not None
        lines = result.text.splitlines()
        if any(ln.startswith("... ") for ln in lines):
            return None
        if hop["inverse"]:
            return sum(ln.endswith(f", {hop['relation']}, {call.entity})") for ln in lines)
        return sum(ln.startswith(f"({call.entity}, {hop['relation']}, ") for ln in lines)


def _expressible(row: dict[str, Any]) -> bool:
    """Whether graphwalker's and kgr1's tools can show a constraint walk's answer: a count of
    a set one hop from the topic, which one triples call lists whole (checked in
    :func:`replay`). Superlatives, comparisons and time constraints need every member's value
    and arithmetic on them: they are left to the ``sexpr`` tool set."""
    return row["structure"] == "count" and len(row["branches"][0]) == 1


def _check_count(
    space: PathSpace, env: ToolEnvironment, row: dict[str, Any], call: OracleCall, result: Any
) -> None:
    """A count's triples call must show every member of its set (no display cap, one triple
    per member): the agent counts the triples it sees."""
    if call.hop is None:
        return
    shown = space.triples_shown(env, result, call)
    if shown is None or [str(shown)] != list(row["answer_names"]):
        raise Reject("count_not_observable")


_LISTED_AS = re.compile(r'^Relations of "(.*)" \(showing', re.MULTILINE)


def replay(
    space: PathSpace,
    row: dict[str, Any],
    env: ToolEnvironment,
    *,
    fan_out: int = 1,
    follow: str = "walked",
    look_ahead: bool = False,
) -> list[tuple[OracleCall, Any]]:
    """Run the oracle calls; returns ``(call, ToolResult)`` per step, or raises
    :class:`~kgsynth.core.stage.Reject` when a gold relation is not among the relations shown (same BM25
    ranking and top-k as inference), or when a conjunction's meeting entity is not among the
    triples shown.

    On a chain, when the walked entity is not among the neighbours the observation shows (the
    display cap), the replay goes on from the first shown entity (in display order) from which
    the next hop's relation leads on, so no chain is lost to the cap; only when none does is it
    rejected (``gold_entity_not_retrievable``). With ``follow="first"`` the chain always goes on
    from the first shown entity the next hop leads on from, walked or not: a rule the agent can
    read back from its observation (which of several films the walk passed through, it cannot).
    Its answers stay gold: on a chain, what the next hops reach from any entity a hop showed is
    in the walk's answer set.

    On a chain, a hop often reaches several entities (the films a person directed), and the
    answers are what the next hop reaches from all of them. With ``fan_out`` > 1, after the
    walked entity's next hop the same relation is followed from the others too (up to
    ``fan_out`` entities in all; those without the relation are passed over), so the replay
    observes the whole answer set instead of the part reached through the walked entity.
    The default (1) replays the walk alone: on the tiny CPU recipe, fan-out 4 made the agent
    go on after 1-hop answers and copy worse (benchmarks/README.md, learning sweep).

    With ``look_ahead`` (graphwalker), the last hop is followed by a ``get_relations`` of the
    first gold answer it shows (a step of kind ``check``; none when that answer is a value the
    tool cannot list). Every hop then ends the same way, with the relations of an entity it
    reached: after an inner hop the agent follows the next relation from that list, after the
    last it answers. Whether to go on is decided where the list is in the context, ranked by
    the question, instead of from the question alone."""
    calls = space.oracle_calls(row)
    continues_from = {c.entity for c in calls}
    chain = len(row["branches"]) == 1
    topics = set(row["topic_names"])
    steps = []
    others: list[str] = []  # the other entities the walked one's hop reached
    instead: dict[str, str] = {}  # walked entity -> the shown one the replay goes on from
    for k, c in enumerate(calls):
        if c.entity in instead:
            c = space.hop_calls(instead[c.entity], c.hop)[0 if c.kind == "relations" else 1]
        result = env.execute(c.call)
        if result.error is not None:
            raise Reject(f"oracle_{result.error.value}")
        if c.kind == "relations":
            if not space.shows_relation(env, result, c):
                raise Reject("gold_relation_not_retrievable")
            steps.append((c, result))
            continue
        if row.get("structure") == "count":
            _check_count(space, env, row, c, result)
        walked_shown = c.hop["entity"] in result.entities
        if c.hop["entity"] in continues_from and (follow == "first" or not walked_shown):
            nxt_hop = calls[k + 2].hop if chain and k + 2 < len(calls) else None
            sub = _shown_substitute(space, env, result, c, nxt_hop, topics) if nxt_hop else None
            if sub is not None:
                instead[c.hop["entity"]] = sub
            elif not walked_shown:
                raise Reject("gold_entity_not_retrievable")
        steps.append((c, result))
        if not chain:
            continue
        sources = [c.entity]
        reached = list(result.entities)
        for other in others:
            extra = space.hop_calls(other, c.hop)[1]
            got = env.execute(extra.call)
            if got.error is None:
                steps.append((extra, got))
                sources.append(other)
                reached.extend(got.entities)
        nxt = instead.get(c.hop["entity"], c.hop["entity"])
        seen = {nxt, *sources, *topics}
        others = []
        for entity in reached:
            if entity not in seen and len(others) < fan_out - 1:
                others.append(entity)
            seen.add(entity)
    if look_ahead and steps and steps[-1][0].kind == "triples":
        check = _check_call(space, row, steps[-1][1], topics)
        if check is not None:
            got = env.execute(check.call)
            if got.error is None:
                steps.append((check, got))
    return steps


def _check_call(
    space: Any, row: dict[str, Any], result: Any, topics: set[str]
) -> OracleCall | None:
    """The look-ahead after the last hop: ``get_relations`` of the first gold answer
    ``result`` shows (not a topic), or None when it shows none."""
    shown = [e for e in result.entities if e not in topics]
    first = next(iter(oracle_answers(row, shown, fallback=False)), None)
    return None if first is None else space.look_ahead_call(first)


def _shown_substitute(
    space: PathSpace,
    env: ToolEnvironment,
    result: Any,
    call: OracleCall,
    next_hop: dict[str, Any],
    topics: set[str],
) -> str | None:
    """The first entity ``result`` shows (display order; not the call's own entity or a topic)
    from which ``next_hop``'s relation returns triples. The probes are not part of the
    episode: the environment's episode state (the focus ranking's) is put back after them."""
    state = env.snapshot()
    try:
        for name in result.entities:
            if name == call.entity or name in topics:
                continue
            probe = space.hop_calls(name, next_hop)[1]
            if env.execute(probe.call).error is None:
                return name
        return None
    finally:
        env.restore(state)
