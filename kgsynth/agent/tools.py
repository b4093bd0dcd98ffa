"""The KG tool environment an agent queries, with typed errors and bounded observations.

:class:`ToolEnvironment` runs one episode's tool calls against a
:class:`~kgsynth.kg.graph.KGGraph`. The tools are the action space's
(:mod:`kgsynth.agent.spaces`: its ``make_tools`` builds the table, its ``parse_action`` reads a
call); what the environment adds are the services every space's tools share:

- reading an entity name (:meth:`ToolEnvironment._entity`; ``entity_matching``), with the notes
  an observation shows first;
- a relation list (:meth:`ToolEnvironment.relation_list`): ranked by the configured strategy
  (:mod:`kgsynth.agent.strategies`), top-k, each relation with the question words it matches,
  or in the order a space gives;
- a triples list (:meth:`ToolEnvironment.triple_list`): along some relations, at most n per
  relation and direction, shown by name, with the conjunction hints where they are on.

Which neighbours a capped list shows (``neighbor_order``): ``relevance`` (default) puts those
whose names share words with the question first (not counting the topic entity's own words),
then a seeded order (a hash of the question, the entity, the relation and the neighbour, so
synthesis, RL and eval see the same list for the same question), and the topic entity itself
last (a round trip's way back reaches it again); ``alphabetical`` is the order before, which
skewed oracle data toward names early in the alphabet.

Tools never raise into the agent: every failure becomes a :class:`ToolResult` with an
:class:`ErrorType` that rewards and filters read, and a short text the agent reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kgsynth.agent.config import (
    NEIGHBOR_ORDERS,
    RELATION_RANKINGS,
    RERANK_MODES,
    AgentConfig,
    NeighborOrder,
    ToolSetName,
)
from kgsynth.agent.spaces.registry import space
from kgsynth.agent.strategies import EpisodeStrategies, episode_strategies
from kgsynth.agent.strategies.next_hop import LEAD_ON_POOL, WAY_BACK_SAMPLE, lead_on_first
from kgsynth.agent.strategies.ranking import Reranker
from kgsynth.agent.toolcall import ToolCall, ToolCallSyntaxError
from kgsynth.agent.toolkit import (
    MATCH_MARK,
    SHARED_MARK,
    DenseScorer,
    ErrorType,
    ToolFailure,
    ToolResult,
    order_neighbors,
    quoted_name,
    rank_relations,
    relation_pattern,
    relation_words,
    tokenize,
    truncate,
)
from kgsynth.core.errors import KGError, KGTimeoutError, KGUnavailableError
from kgsynth.kg.graph import Entity, KGGraph, Neighbor, Relation


@dataclass(frozen=True)
class _EpisodeState:
    """A snapshot of an episode's tool state (see ToolEnvironment.snapshot)."""

    session: Any
    strategies: tuple | None


# The tool environment reads the agent's one config (toolset, top_k_relations,
# max_triples_per_relation, max_observation_chars, neighbor_order, rerank, relation_ranking and
# the kgr1 caps), so that synthesis, RL and eval see the same observations.
ToolConfig = AgentConfig


def prime_relation_ranking(config: AgentConfig, questions: Iterable[str]) -> None:
    """Encode the questions in batches before the episodes when the ranking is ``hybrid``
    (one by one they cost about twice as much); nothing otherwise."""
    if config.relation_ranking == "hybrid" and space(config.toolset).ranks_relations:
        from kgsynth.agent.relrank import shared_scorer

        shared_scorer().prime(questions)


@dataclass
class ToolEnvironment:
    """Runs the agent's tool calls against a KG for one question."""

    graph: KGGraph
    question: str = ""
    config: AgentConfig = field(default_factory=AgentConfig)
    # (question, entity name, BM25-ranked relations) -> reordered; needed with rerank="llm"
    reranker: Reranker | None = None
    dense: DenseScorer | None = None  # hybrid ranking's scorer (default: relrank.shared_scorer)
    # the question's topic entities, by name (conjunction hints, the later-hop fallback)
    topics: Sequence[str] = ()
    # the episode's state of a stateful tool set (sexpr's expressions); None for the others
    session: Any = field(default=None, init=False, repr=False, compare=False)
    # the strategies the config names (ranking, entity matching, conjunction hints), with
    # their episode state (kgsynth.agent.strategies)
    strategies: EpisodeStrategies = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.config.rerank == "llm" and self.reranker is None:
            raise ValueError("rerank='llm' needs a reranker (kgsynth.agent.rerank.LLMReranker)")
        self.strategies = episode_strategies(
            self.config, self.topics, self._encoder, self.reranker, self._reach
        )
        self.space = space(self.config.toolset)
        self.tools: dict[str, tuple[int, Callable[..., ToolResult]]] = self.space.make_tools(self)

    # --- entry point ---------------------------------------------------------------------

    def execute(self, text: str) -> ToolResult:
        """Parse and run one tool call; never raises for anything the agent wrote."""
        try:
            call = self.space.parse_action(text)
        except ToolCallSyntaxError as exc:
            return self._error(ErrorType.BAD_SYNTAX, f"could not parse the query: {exc}.")
        return self.call(call)

    def call(self, call: ToolCall) -> ToolResult:
        entry = self.tools.get(call.name)
        if entry is None:
            names = ", ".join(self.tools)
            return self._error(
                ErrorType.UNKNOWN_TOOL, f"unknown tool {call.name!r}; available: {names}.", call
            )
        arity, fn = entry
        if len(call.args) != arity or not isinstance(call.args[0], str):
            usage = self.usage(call.name)
            return self._error(ErrorType.WRONG_ARGUMENTS, f"wrong arguments; use {usage}.", call)
        try:
            result = fn(*call.args)
        except ToolFailure as fail:
            return self._error(fail.error, fail.text, call)
        except KGTimeoutError:
            return self._error(
                ErrorType.TIMEOUT, "the KG query timed out; try a narrower call.", call
            )
        except KGUnavailableError:
            return self._error(ErrorType.KG_UNAVAILABLE, "the KG is unavailable right now.", call)
        except KGError as exc:
            return self._error(ErrorType.NO_RESULTS, f"the KG could not answer ({exc}).", call)
        self.strategies.entities.observe(result.entities)
        text = truncate(result.text, self.config.max_observation_chars)
        return ToolResult(text, None, call.name, call.args, result.entities, result.notes)

    def usage(self, name: str) -> str:
        """How to call tool ``name``, as the system prompt shows it."""
        return next(
            (
                h["usage"]
                for h in self.space.tool_help
                if h["usage"].startswith((name + "(", name + " ["))
            ),
            f"{name}(...)",
        )

    def snapshot(self) -> Any:
        """The episode state of a stateful tool set (sexpr's expressions) and of the
        strategies (the relations followed, the names shown, ...), None where there is none.
        Tree rollouts, whose branches share one environment, keep each branch's own."""
        session = None if self.session is None else self.session.snapshot()
        strategies = self.strategies.snapshot()
        return session if strategies is None else _EpisodeState(session, strategies)

    def restore(self, state: Any) -> None:
        """Go back to a :meth:`snapshot` (None: the episode's start)."""
        episode = state if isinstance(state, _EpisodeState) else _EpisodeState(state, None)
        self.strategies.restore(episode.strategies)
        if self.session is not None:
            self.session.restore(episode.session)

    def _error(self, error: ErrorType, text: str, call: ToolCall | None = None) -> ToolResult:
        return ToolResult(
            f"Error ({error.value.replace('_', ' ')}): {text}",
            error,
            call.name if call else None,
            call.args if call else (),
        )

    # --- shared pieces -------------------------------------------------------------------

    def _encoder(self) -> Any:
        """The sentence encoder's scorer (the process's one, loaded on first use)."""
        if self.dense is None:
            from kgsynth.agent.relrank import shared_scorer

            self.dense = shared_scorer()
        return self.dense

    def _reach(self, entity: Entity, rel: Relation) -> list[Relation]:
        """The relations of the first few entities (by name) reached from ``entity`` along
        ``rel``, values left out (``way_back_marks``)."""
        out: list[Relation] = []
        for n in self.graph.neighbors(entity.iri, rel)[:WAY_BACK_SAMPLE]:
            if n.term.is_iri:
                out.extend(self.graph.relations(n.term.value))
        return out

    def _entity(self, name: str) -> tuple[Entity, tuple[str, ...]]:
        """The entity ``name`` names, and the notes every tool shows first: how the name was
        read (``near``), and how many entities share it."""
        resolution, notes = self.strategies.entities.resolve(self.graph, name, self.question)
        if resolution is None:
            raise ToolFailure(
                ErrorType.ENTITY_NOT_FOUND,
                f'no entity named "{quoted_name(name)}"; use an exact name from the question or an '
                "earlier observation.",
            )
        self.strategies.hints.visit(resolution.entity.name)
        if resolution.candidates > 1:
            notes += (
                f'{resolution.candidates} entities are named "{resolution.entity.name}"; '
                "using the one with the most facts.",
            )
        return resolution.entity, notes

    @staticmethod
    def _triple(entity: str, rel: Relation, other: Neighbor) -> str:
        if rel.direction == "out":
            return f"({entity}, {rel.name}, {other.name})"
        return f"({other.name}, {rel.name}, {entity})"

    def relation_list(
        self,
        entity: Entity,
        rels: list[Relation],
        notes: tuple[str, ...],
        listed: tuple[list[Relation], str] | None = None,
    ) -> ToolResult:
        """``entity``'s relations ``rels`` as an observation: ranked by the configured
        strategy, top-k, each with the question words it matches; or, with ``listed``, the
        relations in the order a space shows them and the list's first line."""
        if not rels:
            raise ToolFailure(ErrorType.NO_RESULTS, f'"{entity.name}" has no relations to explore.')
        marked: dict[Relation, tuple[str, ...]] = {}  # the focus ranking's matched words
        if listed is not None:
            ranked, head = listed
        else:
            pairs = self.strategies.ranking.rank(self.question, entity, rels)
            marked = {r: words for r, words in pairs if words}
            ranked = [r for r, _ in pairs][: self.config.top_k_relations]
            head = f'Relations of "{entity.name}" (showing {len(ranked)} of {len(rels)}'
            head += ", most relevant first):" if self.question else "):"
        lines = [*notes, head]
        for r in ranked:
            words = marked.get(r)
            lines.append(
                relation_pattern(entity.name, r) + (MATCH_MARK + ", ".join(words) if words else "")
            )
        return ToolResult("\n".join(lines), entities=(entity.name,), notes=notes)

    def shown_neighbors(
        self,
        entity: Entity,
        rel: Relation,
        neighbors: Sequence[Neighbor],
        before: frozenset[str] = frozenset(),
        limit: int | None = None,
    ) -> tuple[list[Neighbor], int, frozenset[str]]:
        """Of ``neighbors`` (all of ``entity``'s along ``rel``), those an observation shows, in
        display order, how many there are in all (see ``neighbor_order`` and the caps in the
        module doc), and the IRIs of those ``conjunction_hints`` marks: neighbours in
        ``before`` (what earlier get_triples calls from other entities reached), listed
        first. ``limit``: how many it shows (None: ``max_triples_per_relation``)."""
        limit = self.config.max_triples_per_relation if limit is None else limit
        total = len(neighbors)
        shared = frozenset(n.term.value for n in neighbors if n.term.value in before)
        lead_on = self.config.lead_on_order and bool(self.question) and total > 1
        if self.config.neighbor_order == "relevance" and total > 1:
            # a partial sort of the first ``limit`` (lead-on: of its pool) unless the shared
            # ones go first
            neighbors = order_neighbors(
                self.question,
                entity.iri,
                rel,
                neighbors,
                None if shared else max(limit, LEAD_ON_POOL) if lead_on else limit,
                self.strategies.ranking.anchor,
            )
        if lead_on:
            words = self.strategies.ranking.next_words(self.question, [rel])
            neighbors = lead_on_first(neighbors, rel, words, self.graph.relations, self.topics)
        if shared:  # a stable sort keeps the display order within each part
            neighbors = sorted(neighbors, key=lambda n: n.term.value not in shared)
        return neighbors[:limit], total, shared

    def triple_list(
        self,
        entity: Entity,
        rels: list[Relation],
        notes: tuple[str, ...],
        missing: Sequence[str] = (),
        *,
        limit: int | None = None,
        capped: bool = False,
    ) -> ToolResult:
        """The triples of ``entity`` along ``rels`` as an observation: at most ``limit`` per
        relation and direction (None: ``max_triples_per_relation``), then a line counting the
        rest (ending "(capped)" where ``capped``); the relations asked for that ``entity``
        lacks (``missing``); the conjunction hints' lines."""
        lines: list[str] = list(notes)
        seen: list[str] = [entity.name]
        hints = self.strategies.hints
        before = hints.start(entity.iri)
        for rel in rels:
            neighbors = self.graph.neighbors(entity.iri, rel)
            shown, total, shared = self.shown_neighbors(entity, rel, neighbors, before, limit)
            for n in shown:
                mark = SHARED_MARK if n.term.value in shared else ""
                lines.append(self._triple(entity.name, rel, n) + mark)
                seen.append(n.name)
            if total > len(shown):
                more = f"... {total - len(shown)} more {relation_pattern(entity.name, rel)}"
                lines.append(more + (" (capped)" if capped else ""))
            hints.reach(neighbors)
        if len(seen) == 1:
            raise ToolFailure(ErrorType.NO_RESULTS, f'no triples found for "{entity.name}".')
        if missing:
            lines.append(f'(not relations of "{entity.name}": {", ".join(missing)})')
        lines.extend(hints.finish(entity.iri))
        return ToolResult("\n".join(lines), entities=tuple(dict.fromkeys(seen)), notes=notes)

    def select_relations(
        self,
        entity: Entity,
        names: Sequence[str],
        direction: str | None = None,
        unknown: str = "no such relation {listed}.",
    ) -> tuple[list[Relation], list[str]]:
        """The relations of ``entity`` named ``names`` (only those going ``direction`` where
        given) and the names it lacks; where it has none of them the call fails with
        ``unknown`` (``{listed}``: the names asked for)."""
        rels: list[Relation] = []
        missing: list[str] = []
        for name in dict.fromkeys(n.strip() for n in names if n.strip()):
            found = self.graph.find_relation(entity.iri, name)
            if direction:
                found = [r for r in found if r.direction == direction]
            if found:
                rels.extend(found)
            else:
                missing.append(name)
        if not rels:
            listed = ", ".join(missing) if missing else "(none given)"
            text = f'"{entity.name}" has ' + unknown.format(listed=listed)
            raise ToolFailure(ErrorType.RELATION_NOT_FOUND, text)
        return rels, missing


__all__ = [
    "NEIGHBOR_ORDERS",
    "RELATION_RANKINGS",
    "RERANK_MODES",
    "DenseScorer",
    "ErrorType",
    "NeighborOrder",
    "ToolConfig",
    "ToolEnvironment",
    "ToolResult",
    "ToolSetName",
    "order_neighbors",
    "prime_relation_ranking",
    "rank_relations",
    "relation_pattern",
    "relation_words",
    "tokenize",
    "truncate",
]
