"""What an action space is: the one object synthesis, the filter, eval and RL ask about a tool
set (:class:`ActionSpace`). A space holds its tools, its turn format, its system prompt, its
oracle (the gold actions of a synthesized question) and what its thoughts and drills say; code
outside the space's package asks the space instead of testing its name."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from kgsynth.agent.protocol import ANSWER, KG_QUERY, TaggedFormat, Turn, tagged
from kgsynth.agent.spaces.observed import Observed, read_observation, triple_line
from kgsynth.agent.spaces.sparql import ToolTable
from kgsynth.agent.toolcall import ToolCall, parse_tool_call
from kgsynth.llm.relation_forms import relation_words
from kgsynth.prompts import render

if TYPE_CHECKING:
    import random

    from kgsynth.agent.toolkit import ToolResult
    from kgsynth.agent.tools import ToolEnvironment
    from kgsynth.kg.graph import KGGraph

ANSWER_THOUGHT = "The facts I found answer the question."
"""The template thought before an answer (and any step a space has no thought for)."""


class ActionSpace(ABC):
    """One agent action space. A subclass sets :attr:`name` and :attr:`tool_help` and writes
    :meth:`make_tools` and :meth:`oracle_calls`; the rest has defaults (the
    ``<kg-query>``/``<answer>`` turn format, ``prompts/agent_system*.j2``, a tool call per
    turn)."""

    name: ClassVar[str]
    tool_help: ClassVar[list[dict[str, str]]]  # [{"usage", "description"}] the prompt lists
    turns: ClassVar[TaggedFormat] = TaggedFormat()
    prompt: ClassVar[str] = "agent_system"  # prompts/<prompt>.j2 (full) and <prompt>_short.j2
    look_ahead: ClassVar[bool] = False  # the oracle can end on a look-ahead get_relations
    trial_and_error: ClassVar[bool] = False  # the oracle can insert a failed try and its fix
    cold_start: ClassVar[bool] = False  # --mode coldstart samples its expert data (KnowCoder-A1)
    # what the oracle builds the gold actions from: "walk" (the walk's hops), "sparql" (the
    # row's ``sparql``, the walk's logical form) or "sexpr" (its S-expression)
    oracle_from: ClassVar[str] = "walk"
    # ``hybrid`` ranking encodes the questions up front (the space ranks relation lists)
    ranks_relations: ClassVar[bool] = False

    # --- prompt and tools -------------------------------------------------------------

    def system_prompt(self, max_turns: int, style: str) -> str:
        """The system prompt: ``full`` or ``short`` (:data:`~kgsynth.agent.config.PROMPT_STYLES`)."""
        name = self.prompt if style == "full" else f"{self.prompt}_short"
        return render(name, tools=self.tool_help, max_turns=max_turns, **self.prompt_values())

    def prompt_values(self) -> dict[str, Any]:
        """Values the space's prompt template reads besides the tools and the turn limit."""
        return {}

    @abstractmethod
    def make_tools(self, env: ToolEnvironment) -> ToolTable:
        """The tool table of one episode's environment: name -> (arity, function)."""

    def parse_action(self, text: str) -> ToolCall:
        """A turn's action text as a tool call (raises ToolCallSyntaxError)."""
        return parse_tool_call(text)

    def run_turn(self, env: ToolEnvironment, turn: Turn) -> ToolResult:
        """Run a parsed turn's action: one tool call."""
        assert turn.query is not None
        return env.execute(turn.query)

    # --- oracle -----------------------------------------------------------------------

    @abstractmethod
    def oracle_calls(self, row: dict[str, Any], graph: KGGraph | None = None) -> list[Any]:
        """The gold action sequence of a synthesized question (a list of ``OracleCall``)."""

    @abstractmethod
    def replay(self, row: dict[str, Any], env: ToolEnvironment, **options: Any) -> list[Any]:
        """The oracle's calls run in ``env``: ``(OracleCall, ToolResult)`` per step; raises
        :class:`~kgsynth.core.stage.Reject` where the tools do not show what the walk took.
        ``options``: the path oracle's ``fan_out``, ``follow`` and ``look_ahead``."""

    def trial(
        self, row: dict[str, Any], env: ToolEnvironment, steps: list[Any], rng: random.Random
    ) -> list[Any] | None:
        """The replay ``steps`` with a failed try and its fix inserted (a space with
        :attr:`trial_and_error`), or None when no try of this question goes wrong."""
        return None

    def reference_text(self, row: dict[str, Any], graph: KGGraph | None = None) -> str:
        """The numbered gold actions a referenced rollout is shown, one per line."""
        calls = self.oracle_calls(row, graph)
        return "\n".join(f"{i}. {' '.join(c.call.splitlines())}" for i, c in enumerate(calls, 1))

    def reference_steps(self, row: dict[str, Any], graph: KGGraph | None = None) -> list[str]:
        """The gold actions one at a time, as per-step reference guidance shows each (KBQA-R1
        §IV-B1 step 2): the lines of :meth:`reference_text`."""
        return [line for line in self.reference_text(row, graph).splitlines() if line.strip()]

    def reference_progress(self, env: ToolEnvironment, episode: Any) -> int:
        """How many gold actions an episode has made, so per-step guidance shows the next one:
        its turns whose tool call ran without an error."""
        return sum(1 for t in episode.turns if t.query is not None and t.tool_error is None)

    @property
    def reads_sexpr(self) -> bool:
        """The oracle writes its actions from an S-expression: a walk's, or the one a benchmark
        question (GrailQA's, GraphQuestions') carries itself."""
        return self.oracle_from == "sexpr"

    @staticmethod
    def space_thought(
        kind: str,
        entity: str,
        hop: dict[str, Any] | None,
        relations: Sequence[str],
        mistake: dict[str, str] | None,
    ) -> str | None:
        """A space's own thought before an action of ``kind`` (the arguments as
        :meth:`thought`'s), None for a kind it leaves to the path spaces' thoughts. A space
        sets it to its thoughts module's function: ``space_thought = staticmethod(f)``."""
        return None

    def thought(
        self,
        kind: str,
        entity: str,
        hop: dict[str, Any] | None,
        relations: Sequence[str] = (),
        mistake: dict[str, str] | None = None,
    ) -> str:
        """The template thought before an oracle action of ``kind`` (an ``OracleCall``'s, or
        ``answer``), about ``entity`` along ``hop``; ``relations``: the walk's, for a step that
        covers them all; ``mistake``: what a corrected try got wrong. The template backend
        writes it (:mod:`kgsynth.synthesize.oracle_episodes` passes it along). First the space's
        own (:attr:`space_thought`), then the path spaces' kinds: ``relations`` (and ``check``,
        a look-ahead), ``triples``; anything else reads as the answer's."""
        own = self.space_thought(kind, entity, hop, relations, mistake)
        if own is not None:
            return own
        # Short on purpose: every token of a thought is trained on, and a thought names only
        # what the next action uses (the entity it starts from, the relation it follows).
        if kind in ("relations", "check"):
            return f"I list the relations of {entity}."
        if kind == "triples" and hop is not None:
            words = relation_words(hop["relation"])
            return f"The question asks for {words}: I follow {hop['relation']} from {entity}."
        return ANSWER_THOUGHT

    # --- what copy drills read and write (kgsynth.train.drills) -----------------------

    def observed(self, text: str) -> Observed:
        """What one observation of this space's tools shows (its triples, names and relations,
        in order), read back from its text: a result table's rows, then each line as
        :meth:`observed_line` reads it."""
        return read_observation(text, self.observed_line)

    def observed_line(self, line: str, seen: Observed) -> None:
        """What one (stripped) line of an observation shows, added to ``seen``: by default a
        ``(head, relation, tail)`` triple."""
        triple_line(line, seen)

    def drill_observation(self, head: str, relation: str, tails: Sequence[str]) -> str:
        """A copy drill's observation text showing ``tails`` reached from ``head`` along
        ``relation``: by default one ``(head, relation, tail)`` line each."""
        return "\n".join(f"({head}, {relation}, {t})" for t in tails)

    def drill_call(self, topic: str, relations: Sequence[str], rng: random.Random) -> str:
        """A copy drill's tool call about ``topic`` (a relation drawn from ``relations`` where
        it names one), drawn with ``rng``: by default ``get_relations`` or ``get_triples``,
        half and half."""
        q = json.dumps(topic, ensure_ascii=False)
        if rng.random() < 0.5:
            return f"get_relations({q})"
        rel = json.dumps([rng.choice(relations)], ensure_ascii=False)
        return f"get_triples({q}, {rel})"

    def drill_action(self, call: str) -> str:
        """A copy drill's assistant turn that makes ``call`` (:meth:`drill_call`'s): by default
        inside ``<kg-query>``."""
        return tagged(KG_QUERY, call)

    def drill_answer(self, names: Sequence[str]) -> str:
        """A copy drill's assistant turn that answers ``names``: by default a JSON list inside
        ``<answer>``."""
        return tagged(ANSWER, json.dumps(list(names), ensure_ascii=False))
