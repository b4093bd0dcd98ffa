"""The KG tool environment an agent queries, with typed errors and bounded observations.

Two tool sets over the same :class:`~kgsynth.kg.graph.KGGraph`:

``graphwalker`` (default, GraphWalker):
  ``get_relations("Entity")`` — the entity's outgoing and incoming relations, ranked by BM25
  against the question (``relation_ranking="hybrid"``: plus a sentence encoder's similarity,
  see :mod:`kgsynth.agent.relrank`; ``"focus"``: only the question words the episode's
  ``get_triples`` calls have not used yet, nearest the topic's name first, see
  :mod:`kgsynth.agent.strategies`), top-k;
  ``get_triples("Entity", ["rel", …])`` — triples along those relations (either direction), at
  most n per relation and direction, shown by name.

``kgr1`` (KG-R1): ``get_tail_relations(e)`` relations with ``e`` as head (``e -r-> ?``),
  ``get_head_relations(e)`` relations with ``e`` as tail (``? -r-> e``),
  ``get_tail_entities(e, r)`` the tails of ``(e, r, ?)``, ``get_head_entities(e, r)`` the heads
  of ``(?, r, e)``. As in the paper, each returns the full set: relations by name, entities in
  the neighbour order below. ``kgr1_max_relations`` / ``kgr1_max_entities`` cap them; a cap
  that applies says so in the observation ("showing 10 of 37 (capped)").

Entity names (``entity_matching``): ``exact`` reads a name the KG has, in any case; ``near``
also reads a name the KG lacks as the most similar name of the episode's context (a word span of
the question or a name an observation showed; :func:`~kgsynth.agent.strategies.entities.near_names`), and
the observation's first line says which it read.

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
from kgsynth.agent.strategies import EpisodeStrategies, episode_strategies
from kgsynth.agent.toolcall import ToolCall, ToolCallSyntaxError, parse_tool_call
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
from kgsynth.errors import KGError, KGTimeoutError, KGUnavailableError
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
    if config.relation_ranking == "hybrid" and config.toolset == "graphwalker":
        from kgsynth.agent.relrank import shared_scorer

        shared_scorer().prime(questions)


@dataclass
class ToolEnvironment:
    """Runs the agent's tool calls against a KG for one question."""

    graph: KGGraph
    question: str = ""
    config: AgentConfig = field(default_factory=AgentConfig)
    # (question, entity name, BM25-ranked relations) -> reordered; needed with rerank="llm"
    reranker: Callable[[str, str, Sequence[Relation]], list[Relation]] | None = None
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
        self.strategies = episode_strategies(self.config, self.topics, self._encoder, self.reranker)
        tools: dict[str, tuple[int, Callable[..., ToolResult]]]
        if self.config.toolset == "graphwalker":
            tools = {"get_relations": (1, self.get_relations), "get_triples": (2, self.get_triples)}
        elif self.config.toolset == "kgr1":
            tools = {
                "get_head_relations": (1, lambda e: self._relations_one_way(e, "in")),
                "get_tail_relations": (1, lambda e: self._relations_one_way(e, "out")),
                "get_head_entities": (2, lambda e, r: self._entities_one_way(e, r, "in")),
                "get_tail_entities": (2, lambda e, r: self._entities_one_way(e, r, "out")),
            }
        else:  # the SPARQL-writing sets (KnowCoder-A1, ISP) live in their own modules
            from kgsynth.agent.toolsets import make_tools

            tools = make_tools(self)
        self.tools = tools

    # --- entry point ---------------------------------------------------------------------

    def execute(self, text: str) -> ToolResult:
        """Parse and run one tool call; never raises for anything the agent wrote."""
        try:
            if self.config.toolset == "sexpr":  # KBQA-R1's bracket syntax
                from kgsynth.agent.toolsets.sexpr_syntax import parse_action

                call = parse_action(text)
            else:
                call = parse_tool_call(text)
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
        from kgsynth.agent.prompt import tool_help

        return next(
            (
                h["usage"]
                for h in tool_help(self.config.toolset)
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

    def _relations_text(
        self, entity: Entity, rels: list[Relation], notes: tuple[str, ...]
    ) -> ToolResult:
        if not rels:
            raise ToolFailure(ErrorType.NO_RESULTS, f'"{entity.name}" has no relations to explore.')
        marked: dict[Relation, tuple[str, ...]] = {}  # the focus ranking's matched words
        if self.config.toolset == "kgr1":  # the full set, by name; a cap is an option
            cap = self.config.kgr1_max_relations
            ranked = sorted(rels, key=lambda r: (r.name, r.direction))[:cap]
            head = f'Relations of "{entity.name}"'
            if len(ranked) < len(rels):
                head += f" (showing {len(ranked)} of {len(rels)} (capped))"
            head += ":"
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
    ) -> tuple[list[Neighbor], int, frozenset[str]]:
        """Of ``neighbors`` (all of ``entity``'s along ``rel``), those an observation shows, in
        display order, how many there are in all (see ``neighbor_order`` and the caps in the
        module doc), and the IRIs of those ``conjunction_hints`` marks: neighbours in
        ``before`` (what earlier get_triples calls from other entities reached), listed
        first."""
        if self.config.toolset == "kgr1":
            limit = self.config.kgr1_max_entities
        else:
            limit = self.config.max_triples_per_relation
        total = len(neighbors)
        shared = frozenset(n.term.value for n in neighbors if n.term.value in before)
        if self.config.neighbor_order == "relevance" and total > 1:
            # a partial sort of the first ``limit`` unless the shared ones go first
            neighbors = order_neighbors(
                self.question,
                entity.iri,
                rel,
                neighbors,
                None if shared else limit,
                self.strategies.ranking.anchor,
            )
        if shared:  # a stable sort keeps the display order within each part
            neighbors = sorted(neighbors, key=lambda n: n.term.value not in shared)
        return neighbors[:limit], total, shared

    def _triples_text(
        self, entity: Entity, rels: list[Relation], notes: tuple[str, ...], missing: list[str]
    ) -> ToolResult:
        lines: list[str] = list(notes)
        seen: list[str] = [entity.name]
        hints = self.strategies.hints
        before = hints.start(entity.iri)
        for rel in rels:
            neighbors = self.graph.neighbors(entity.iri, rel)
            shown, total, shared = self.shown_neighbors(entity, rel, neighbors, before)
            for n in shown:
                mark = SHARED_MARK if n.term.value in shared else ""
                lines.append(self._triple(entity.name, rel, n) + mark)
                seen.append(n.name)
            if total > len(shown):
                more = f"... {total - len(shown)} more {relation_pattern(entity.name, rel)}"
                lines.append(more + (" (capped)" if self.config.toolset == "kgr1" else ""))
            hints.reach(neighbors)
        if len(seen) == 1:
            raise ToolFailure(ErrorType.NO_RESULTS, f'no triples found for "{entity.name}".')
        if missing:
            lines.append(f'(not relations of "{entity.name}": {", ".join(missing)})')
        lines.extend(hints.finish(entity.iri))
        return ToolResult("\n".join(lines), entities=tuple(dict.fromkeys(seen)), notes=notes)

    def _select_relations(
        self, entity: Entity, names: Sequence[str], direction: str | None = None
    ) -> tuple[list[Relation], list[str]]:
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
            raise ToolFailure(
                ErrorType.RELATION_NOT_FOUND,
                f'"{entity.name}" has no relation {listed}; call get_relations first'
                if self.config.toolset == "graphwalker"
                else f'"{entity.name}" has no such relation {listed}.',
            )
        return rels, missing

    # --- graphwalker tools ---------------------------------------------------------------

    def get_relations(self, name: str) -> ToolResult:
        entity, notes = self._entity(name)
        return self._relations_text(entity, self.graph.relations(entity.iri), notes)

    def get_triples(self, name: str, relations: str | Sequence[str]) -> ToolResult:
        entity, notes = self._entity(name)
        wanted = [relations] if isinstance(relations, str) else list(relations)
        rels, missing = self._select_relations(entity, wanted)
        result = self._triples_text(entity, rels, notes, missing)
        self.strategies.ranking.follow(rels)
        return result

    # --- KG-R1 tools ---------------------------------------------------------------------

    def _relations_one_way(self, name: str, direction: str) -> ToolResult:
        entity, notes = self._entity(name)
        rels = [r for r in self.graph.relations(entity.iri) if r.direction == direction]
        return self._relations_text(entity, rels, notes)

    def _entities_one_way(self, name: str, relation: object, direction: str) -> ToolResult:
        if not isinstance(relation, str):
            raise ToolFailure(ErrorType.WRONG_ARGUMENTS, "give one relation name as a string.")
        entity, notes = self._entity(name)
        rels, _ = self._select_relations(entity, [relation], direction)
        return self._triples_text(entity, rels, notes, [])


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
