"""The agent's settings, declared once: :class:`AgentConfig`.

Trajectory synthesis, eval and RL run the same agent (tool set, turn limit, per-turn token cap,
system prompt, what the KG tools show), so these settings live in one frozen dataclass that the
tool environment reads (``ToolConfig`` is another name for it) and that RL's
:class:`~kgsynth.agent.rollout.RolloutConfig` extends with its token-space limits. Each field
documents itself (``kgsynth.core.config.option``): its help text is its ``--flag``'s, and older flag
names still work, with a deprecation line (``--tools``, ``--max-tokens``, ``--max-triples``).

Every stage that runs the agent nests it as its ``agent`` field (synthesis, eval, RL, and SFT's
early stopping and carried settings); a recipe gives its settings in one ``agent:`` block and
flags name them by their own names (:func:`kgsynth.core.config.flat_fields`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from kgsynth.agent.spaces.registry import BUILTIN
from kgsynth.agent.spaces.registry import names as space_names
from kgsynth.core.config import option
from kgsynth.core.errors import ConfigError
from kgsynth.kg.base import MAX_TIMEOUT_S

ToolSetName = Literal["graphwalker", "kgr1", "knowcoder", "isp", "sexpr"]
NeighborOrder = Literal["relevance", "alphabetical"]
TOOLSETS = tuple(BUILTIN)  # the built-in action spaces (kgsynth.agent.spaces)
NEIGHBOR_ORDERS = ("relevance", "alphabetical")
RERANK_MODES = ("none", "llm")
RELATION_RANKINGS = ("bm25", "hybrid", "focus")
ENTITY_MATCHINGS = ("exact", "near")
FIRST_HOP_FALLBACKS = ("none", "dense")
PROMPT_STYLES = ("full", "short")
KGR1_OBSERVATIONS = ("flat", "triples")
GRAPHWALKER_OBSERVATIONS = ("kgsynth", "paper")
KNOWCODER_PATTERNS = ("variable", "entities")
AGENT_QUERY_TIMEOUT_S = 10.0
"""Seconds an agent-written query may run by default (the store is shared by every rollout)."""


class AgentConfigError(ConfigError, ValueError):
    """A bad agent setting: a ConfigError (the CLI reports it in one line, exit code 2) that is
    also the ValueError library callers of ``ToolConfig`` have always caught."""


@dataclass(frozen=True)
class AgentConfig:
    """What the agent is and what its tools show; the same in synthesis, RL and eval so that
    all three see the same prompts and observations."""

    toolset: Literal["graphwalker", "kgr1", "knowcoder", "isp", "sexpr"] = option(
        "graphwalker",
        "Tool set: graphwalker (get_relations, get_triples), kgr1 (KG-R1's four one-way tools), "
        "knowcoder (KnowCoder-A1: SearchTypes, SearchGraphPatterns, ExecuteSPARQL), isp "
        "(ISP: node exploration and sparql) or sexpr (KBQA-R1: S-expression actions "
        "Find_relation, Merge, Order, Compare, Time_constraint, Count, with relation gating)",
        aliases=("--tools",),
        panel="Agent",
    )
    max_turns: int = option(
        10, "Assistant turns before the agent is asked for a final answer", panel="Agent"
    )
    max_turn_tokens: int | None = option(
        512,
        "Tokens the policy generates per assistant turn (rl: null takes its training recipe's)",
        aliases=("--max-tokens",),
        panel="Agent",
        advanced=True,
    )
    system_prompt: str = option(
        "full",
        "System prompt style: full (the protocol explained) or short (one line of protocol "
        "and the tool signatures, for small models trained from scratch)",
        panel="Agent",
        advanced=True,
    )
    system_text: str | None = option(
        None, "A system prompt to use instead of the rendered one (a checkpoint's)", cli=False
    )
    top_k_relations: int = option(
        10, "Relations get_relations shows, most relevant first", panel="Agent", advanced=True
    )
    max_triples_per_relation: int = option(
        5,
        "Triples get_triples shows per relation and direction",
        aliases=("--max-triples",),
        panel="Agent",
        advanced=True,
    )
    max_observation_chars: int = option(
        2_000, "Observation length cap (cut at a line, with a visible marker)", cli=False
    )
    neighbor_order: Literal["relevance", "alphabetical"] = option(
        "relevance",
        "Which neighbours a capped list shows: relevance (question words first, then a seeded "
        "order, the topic entity last) or alphabetical",
        cli=False,
    )
    # GraphWalker Table 8: an LLM reorders the BM25 top 20
    rerank: Literal["none", "llm"] = option(
        "none",
        "Relation rerank: none, or llm (an LLM reorders the BM25 top 20, GraphWalker)",
        panel="Agent",
        advanced=True,
    )
    relation_ranking: Literal["bm25", "hybrid", "focus"] = option(
        "bm25",
        "Relation ranking: bm25 (GraphWalker), hybrid (BM25 plus a sentence encoder's "
        "similarity), or focus (BM25 over the question words the episode has not used yet, "
        "nearest the topic first)",
        panel="Agent",
        advanced=True,
    )
    first_hop_fallback: Literal["none", "dense"] = option(
        "none",
        "focus ranking: where the topic entity's first relation list would show no match mark "
        "(the question names its relation in words the KG does not use), mark one: none (leave "
        "it unmarked) or dense (the best match of a short word, else the relation nearest the "
        "question under the bundled sentence encoder; kgsynth.agent.first_hop)",
        panel="Agent",
        advanced=True,
    )
    later_hop_fallback: Literal["none", "dense"] = option(
        "none",
        "focus ranking: where a list after a hop would show no match mark and the question "
        "still has a word nothing used (not a function word, a topic's name or the noun after "
        "an opening which/what), mark one: none, or dense (the relation whose words are "
        "nearest such a word under the bundled sentence encoder; kgsynth.agent.first_hop)",
        panel="Agent",
        advanced=True,
    )
    way_back_marks: bool = option(
        False,
        "focus ranking: where a list after a hop would show no match mark and a question word "
        "nothing used names a relation of the entities reached back along the hop's relation "
        '("the genres of the movies starred by X actors", at an actor), mark the way back '
        "with that word (kgsynth.agent.strategies.next_hop)",
        panel="Agent",
        advanced=True,
    )
    lead_on_order: bool = option(
        False,
        "focus ranking: get_triples lists first, of its first 20 entities, those with a "
        "relation a question word nothing used names (the agent goes on from the first one: "
        '"who acted in the movies directed by X", a film with starred_actors; '
        "kgsynth.agent.strategies.next_hop)",
        panel="Agent",
        advanced=True,
    )
    round_trip_words: tuple[str, ...] | None = option(
        None,
        "focus ranking: question words that say the question comes back along the relation it "
        'went out on ("the same director as X"); there the first relation followed keeps its '
        "words for the way back. Unset: synthesize trajectories reads them from its questions' "
        "walks (kgsynth.agent.strategies.round_trips) and the models trained on them carry "
        "them; elsewhere none",
        cli=False,
    )
    entity_matching: Literal["exact", "near"] = option(
        "exact",
        "How tools read an entity name (graphwalker, kgr1, isp's node, sexpr's "
        "Find_relation): exact (a name of the KG, in any case) or near (a name the KG lacks "
        "is read as the most similar name in the question or in the episode's observations, "
        "difflib ratio 0.6 or more, and the observation says so)",
        panel="Agent",
        advanced=True,
    )
    conjunction_hints: bool = option(
        False,
        "graphwalker and kgr1, for questions with two topic entities: get_triples lists "
        'first, marked "<- both", the entities an earlier get_triples call of the episode '
        "from another entity reached too (all it reached, shown or not), and ends with a line "
        "naming the question's topics no call has been about yet",
        panel="Agent",
        advanced=True,
    )
    answer_matching: Literal["exact", "near"] = option(
        "exact",
        "How the final answer's names are read: exact (as written) or near (a name no "
        "observation showed is read as the most similar name the episode's observations "
        "showed, difflib ratio 0.6 or more, else kept as written; repeats dropped)",
        panel="Agent",
        advanced=True,
    )
    resample_cut_turns: int = option(
        0,
        "Text policies (eval, synthesis, early stopping): a turn cut at --max-turn-tokens "
        "before it closes its action (a copy loop, as a rule) is sampled again at "
        "--resample-temperature (seeded), at most N times in an episode; the first sample that "
        "closes replaces it, else the cut turn stands. GRPO keeps every turn as sampled",
        panel="Agent",
        advanced=True,
    )
    resample_temperature: float = option(
        0.7,
        "--resample-cut-turns: the temperature of the new samples",
        panel="Agent",
        advanced=True,
    )
    # GraphWalker (graphwalker.txt) App. E.3 and App. H; kgsynth.agent.spaces.graphwalker.paper
    graphwalker_observations: Literal["kgsynth", "paper"] = option(
        "kgsynth",
        "graphwalker: how its tools' results read: kgsynth (a header, one (X, r, ?) relation "
        "line each, with the focus ranking's marks; one (X, r, Y) triple a line with a count of "
        "the rest; every relation asked is followed) or paper (GraphWalker App. E.3: the "
        "relation names as one comma-separated list, each triple as head, relation, tail in "
        "square brackets; App. H rule 6: get_triples follows only the first 4 relations it is "
        "given)",
        panel="Agent",
        advanced=True,
    )
    kgr1_max_relations: int | None = option(
        None, "kgr1: cap on the relations listed (none: the full set, as KG-R1)", cli=False
    )
    kgr1_max_entities: int | None = option(
        None, "kgr1: cap on the entities listed (none: the full set, as KG-R1)", cli=False
    )
    # KG-R1 (kg-r1.txt) App. E examples, ablation A9; kgsynth.agent.spaces.kgr1.observe
    kgr1_observation: Literal["flat", "triples"] = option(
        "flat",
        "kgr1: how its tools' results read: flat (KG-R1 App. E, ablation A9: one line each, "
        "the names comma-separated after a header, e.g. Tail relations for entity X: r1, r2) "
        "or triples (one (X, r, ?) or (X, r, Y) line each, kgsynth's earlier form)",
        panel="Agent",
        advanced=True,
    )
    # KG-R1 §4.1 and App. B.2: a 2-hop subgraph per question, as RoG
    kgr1_subgraph_hops: int | None = option(
        None,
        "kgr1: the tools answer from the question's subgraph only: the triples a breadth-first "
        "expansion from its topic entities crosses in this many hops (KG-R1 §4.1, App. B.2: 2); "
        "none: the whole KG",
        panel="Agent",
        advanced=True,
    )
    knowcoder_patterns: str = option(
        "variable",
        "knowcoder: what SearchGraphPatterns expands around: variable (KnowCoder-A1 §4.1: the "
        "values the sketch binds to its selected variable ?x, up to 10 one- and two-hop rows "
        '(?x, r1 -> r2, "value")) or entities (kgsynth\'s earlier reading: the entities the '
        "sketch names, rows as SPARQL lines)",
        panel="Agent",
        advanced=True,
    )
    # KBQA-R1's Relation Retrieval and Confidence Gating (kgsynth.agent.spaces.sexpr.gate)
    gate_high: float = option(
        0.95,
        "sexpr: a written relation whose most similar available relation (MiniLM cosine) is at "
        "least this is replaced by it (KBQA-R1 §IV-A3's tau_high, 0.95 in §V-A4)",
        panel="Agent",
        advanced=True,
    )
    gate_low: float = option(
        0.3,
        "sexpr: below --gate-high but at least this, the action runs tentatively with the most "
        "similar relation and its observation says so, with the top candidates and their "
        "scores; below it the relation is not found and every candidate is listed with its "
        "score (KBQA-R1 §IV-A3's tau_low, 0.3 in §V-A4)",
        panel="Agent",
        advanced=True,
    )
    query_timeout_s: float = option(
        AGENT_QUERY_TIMEOUT_S,
        "Seconds a query the agent wrote may run (knowcoder's ExecuteSPARQL, isp's sparql, the "
        "query an sexpr action compiles to); past it the query is stopped (on a store "
        "directory its child process is killed) and the agent reads a timeout error",
        panel="Agent",
        advanced=True,
    )

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, rule: str) -> None:
            """A failed check names the field, the rule, its flag(s) and the value."""
            if not ok:
                f = next(f for f in dataclasses.fields(self) if f.name == name)
                flags = "/".join(["--" + name.replace("_", "-"), *f.metadata.get("aliases", ())])
                raise AgentConfigError(
                    f"{name} must be {rule} ({flags}; got {getattr(self, name)!r})"
                )

        words = self.round_trip_words
        if words is not None:  # YAML and JSON give a list, or one word
            words = (words,) if isinstance(words, str) else words
            object.__setattr__(self, "round_trip_words", tuple(str(w).lower() for w in words))
        known = space_names()
        need(self.toolset in known, "toolset", f"{', '.join(known[:-1])} or {known[-1]}")
        need(self.max_turns >= 1, "max_turns", ">= 1")
        # None only where a stage fills it before it runs (rl's recipe: train.grpo_config)
        need(self.max_turn_tokens is None or self.max_turn_tokens >= 1, "max_turn_tokens", ">= 1")
        need(self.resample_cut_turns >= 0, "resample_cut_turns", ">= 0")
        need(self.resample_temperature > 0, "resample_temperature", "> 0")
        need(self.system_prompt in PROMPT_STYLES, "system_prompt", " or ".join(PROMPT_STYLES))
        need(self.rerank in RERANK_MODES, "rerank", "none or llm")
        need(
            self.rerank == "none" or self.relation_ranking != "focus",
            "rerank",
            "none with --relation-ranking focus (the focus ranking is not reordered)",
        )
        need(
            self.relation_ranking in RELATION_RANKINGS, "relation_ranking", "bm25, hybrid or focus"
        )
        need(self.entity_matching in ENTITY_MATCHINGS, "entity_matching", "exact or near")
        need(self.answer_matching in ENTITY_MATCHINGS, "answer_matching", "exact or near")
        need(
            self.graphwalker_observations in GRAPHWALKER_OBSERVATIONS,
            "graphwalker_observations",
            " or ".join(GRAPHWALKER_OBSERVATIONS),
        )
        need(self.first_hop_fallback in FIRST_HOP_FALLBACKS, "first_hop_fallback", "none or dense")
        need(self.later_hop_fallback in FIRST_HOP_FALLBACKS, "later_hop_fallback", "none or dense")
        need(
            self.later_hop_fallback == "none" or self.relation_ranking == "focus",
            "later_hop_fallback",
            "none unless --relation-ranking is focus (it marks the focus ranking's lists)",
        )
        need(
            not self.lead_on_order or self.relation_ranking == "focus",
            "lead_on_order",
            "false unless --relation-ranking is focus (it reads the focus ranking's words)",
        )
        need(
            not self.way_back_marks or self.relation_ranking == "focus",
            "way_back_marks",
            "false unless --relation-ranking is focus (it marks the focus ranking's lists)",
        )
        need(
            self.first_hop_fallback == "none" or self.relation_ranking == "focus",
            "first_hop_fallback",
            "none unless --relation-ranking is focus (it marks the focus ranking's lists)",
        )
        need(self.neighbor_order in NEIGHBOR_ORDERS, "neighbor_order", " or ".join(NEIGHBOR_ORDERS))
        for name in ("kgr1_max_relations", "kgr1_max_entities", "kgr1_subgraph_hops"):
            need(getattr(self, name) is None or getattr(self, name) >= 1, name, ">= 1 or None")
        need(self.kgr1_observation in KGR1_OBSERVATIONS, "kgr1_observation", "flat or triples")
        need(
            0 < self.query_timeout_s <= MAX_TIMEOUT_S,  # NaN fails too
            "query_timeout_s",
            f"a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]",
        )
        need(
            self.knowcoder_patterns in KNOWCODER_PATTERNS,
            "knowcoder_patterns",
            " or ".join(KNOWCODER_PATTERNS),
        )
        need(0.0 <= self.gate_low <= 1.0, "gate_low", "within [0, 1]")
        need(0.0 < self.gate_high <= 1.0, "gate_high", "within (0, 1]")
        need(
            self.gate_low < self.gate_high,
            "gate_low",
            f"below gate_high ({self.gate_high}; --gate-high), tau_low < tau_high",
        )

    def check_turn_tokens(self) -> None:
        """A stage that runs the agent as configured (eval, synthesis) needs a turn-token cap;
        only rl leaves it null, for its recipe to fill."""
        if self.max_turn_tokens is None:
            raise AgentConfigError(
                "max_turn_tokens must be a number of tokens (null is rl's: its recipe fills it)"
            )


AGENT_FIELDS = tuple(f.name for f in dataclasses.fields(AgentConfig))
