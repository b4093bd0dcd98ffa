"""Oracle trajectories for the tool sets whose agents write SPARQL (issue 17): a question's
walk, with its stored logical form (the ``sparql`` column of the walk and question rows),
becomes the action sequence each paper's agent would take, replayed through the real
:class:`~kgsynth.agent.tools.ToolEnvironment`:

- ``knowcoder`` (KnowCoder-A1: types, then patterns, then execute):
  ``SearchTypes("<the answers' type>")`` when the KG has types (skipped on a KG without them,
  such as the MetaQA KB, rather than showing an error), then
  ``SearchGraphPatterns('SELECT ?x WHERE { "Kismet" ?r ?x }', "<the walk's relation words>")``
  (a sketch naming each topic entity by name in double quotes), then
  ``ExecuteSPARQL("<the stored SPARQL>")``;
- ``isp`` (ISP-KGR: node explorations, then the SPARQL), in ISP-KGR's action format
  (:mod:`kgsynth.agent.protocol`): one step exploring every topic entity at once,
  ``<node>Kismet</node>`` (2I, IP and PI have two topics: two ``<node>`` operations in that
  step), then a step ``<SPARQL><the stored SPARQL></SPARQL>``.

Every knowcoder call is written in the tool-call syntax
:func:`~kgsynth.agent.toolcall.parse_tool_call` reads (Python string literals), every isp step
in the operation tags :func:`~kgsynth.agent.protocol.parse_isp_turn` reads, and each is checked
to read back to the intended arguments. A call that
fails rejects the question (``oracle_<error type>``, as the graphwalker oracle does); so does a
query that fails (``oracle_query_failed``) or whose observation does not show every gold answer
(``answers_not_observed``: the row cap, a truncated observation). The answer then lists the gold
answers in the order the query's observation shows them (:func:`query_answers`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kgsynth.agent.protocol import (
    THINK,
    Operation,
    operations_text,
    parse_isp_turn,
    tagged,
)
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.toolcall import ToolCallSyntaxError, parse_tool_call
from kgsynth.agent.tools import ToolEnvironment, ToolResult
from kgsynth.core.stage import Reject
from kgsynth.kg import sparql
from kgsynth.llm.relation_forms import relation_words
from kgsynth.metrics import normalize_answer

"""The tool sets whose oracle is built here."""
QUERY_KINDS = ("execute", "sparql", "retry")
"""Kinds of the oracle step that runs the walk's query (its observation gives the answer;
``retry``: the gold query after a trial-and-error attempt, :mod:`~kgsynth.agent.spaces.knowcoder.trial`)."""
"""Gold answers whose types are read to choose the SearchTypes text."""


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _distinct(items: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def walk_relations(row: dict[str, Any]) -> tuple[str, ...]:
    """The walk's relation names, in replay order (each once)."""
    return _distinct(h["relation"] for hops in row["branches"] for h in hops)


def _sketch_node(name: str, iri: str | None) -> str:
    """A topic entity in the sketch: its name in double quotes, or its IRI when the name
    holds a character the sketch's quoted-name syntax cannot carry."""
    if not any(ch in name for ch in '"\\\n\r') or iri is None:
        return f'"{name}"'
    try:
        return sparql.iri(iri)
    except ValueError:
        return f'"{name}"'


def graph_sketch(row: dict[str, Any]) -> str:
    """The walk's shape as a SPARQL sketch: topics named, relations and other nodes as
    variables (``?x`` the answer, ``?m`` where IP's branches meet, ``?y1``… in between), e.g.
    ``SELECT ?x WHERE { "Kismet" ?r1 ?y1 . ?y1 ?r2 ?x }``."""
    branches, merges = row["branches"], row["merge_at"]
    ids = list(row.get("topic_ids") or [None] * len(branches))
    meet = "?m" if any(len(h) > m for h, m in zip(branches, merges, strict=True)) else "?x"
    n_rel = sum(len(h) for h in branches)
    rel_no, mid_no = iter(range(1, 100)), iter(range(1, 100))
    triples: list[str] = []
    for name, iri, hops, merge in zip(row["topic_names"], ids, branches, merges, strict=True):
        prev = _sketch_node(name, iri)
        for i, hop in enumerate(hops):
            var = meet if i + 1 == merge else "?x" if i + 1 > merge else f"?y{next(mid_no)}"
            rel = "?r" if n_rel == 1 else f"?r{next(rel_no)}"
            head, tail = (var, prev) if hop["inverse"] else (prev, var)
            triples.append(f"{head} {rel} {tail}")
            prev = var
    return f"SELECT ?x WHERE {{ {' . '.join(_distinct(triples))} }}"


def _gold_query(row: dict[str, Any]) -> str:
    """The walk's SPARQL; :class:`~kgsynth.core.stage.Reject` (``no_sparql``) for a row without."""
    query = row.get("sparql")
    if not query:
        raise Reject("no_sparql")
    return query


def knowcoder_oracle_calls(row: dict[str, Any], type_name: str | None = None) -> list[OracleCall]:
    """The knowcoder gold actions: ``SearchTypes`` (``type_name``; None leaves it out), then
    ``SearchGraphPatterns`` with the walk's sketch, then ``ExecuteSPARQL``."""
    query = _gold_query(row)
    rels = walk_relations(row)
    about = " and ".join(row["topic_names"])
    hint = " ".join(_distinct(relation_words(r) for r in rels))
    calls = []
    if type_name:
        calls.append(OracleCall("types", f"SearchTypes({_q(type_name)})", type_name, None, rels))
    sketch = f"SearchGraphPatterns({graph_sketch(row)!r}, {_q(hint)})"
    calls.append(OracleCall("patterns", sketch, about, None, rels))
    calls.append(OracleCall("execute", f"ExecuteSPARQL({_q(query)})", about, None, rels))
    return calls


def isp_operations(call: OracleCall) -> tuple[Operation, ...]:
    """An isp step's operations as the agent's parser reads them back; they must be the ones
    written (a name or query holding an operation's closing tag would not survive)."""
    turn = parse_isp_turn(f"{tagged(THINK, '.')}{call.call}")
    if turn.format_error is not None or operations_text(turn.ops) != call.call:
        raise Reject("oracle_call_unparsable")
    return turn.ops


def query_answers(result: ToolResult) -> list[str]:
    """The entity names the query observation's rows show, in row order (only the rows the
    text still holds: a truncated observation hides the rest)."""
    names = set(result.entities)
    shown: dict[str, None] = {}
    for line in result.text.splitlines()[1:]:
        for cell in line.split("\t"):
            if cell in names:
                shown.setdefault(cell, None)
    return list(shown)


def query_thought(entity: str, relations: Sequence[str]) -> str:
    """The template thought before a query from ``entity`` along the walk's ``relations``
    (knowcoder's ``ExecuteSPARQL``, isp's ``<SPARQL>``)."""
    return f"I query the KG from {entity}, following {', '.join(relations)}."


class SparqlSpace:
    """The oracle of a space whose agents write SPARQL (knowcoder, isp): its gold actions come
    from the walk's SPARQL, and :func:`replay_sparql` checks the query's observation. A
    subclass writes ``oracle_calls`` and ``run_oracle_call(env, call)``."""

    oracle_from = "sparql"

    def replay(self, row: dict[str, Any], env: Any, **options: Any) -> list[tuple[OracleCall, Any]]:
        """The oracle's calls run in ``env`` (:func:`replay_sparql`); no options apply."""
        return replay_sparql(self, row, env)

    # copy drills (kgsynth.train.drills): what the oracle's queries show and how it answers

    def drill_observation(self, head: str, relation: str, tails: Sequence[str]) -> str:
        """A query's result table naming ``tails`` (``?answer`` and its ``?name``, as the
        oracle's queries select them)."""
        return "\n".join(["?answer\t?name", *(f"{t}\t{t}" for t in tails)])

    def drill_answer(self, names: Sequence[str]) -> str:
        """One box per name inside ``<answer>``, as the oracle answers."""
        return self.turns.answer_action(list(names))  # type: ignore[attr-defined]


def replay_sparql(
    space: Any, row: dict[str, Any], env: ToolEnvironment
) -> list[tuple[OracleCall, Any]]:
    """Run ``space``'s oracle calls (knowcoder's or isp's) in ``env``; ``(call, ToolResult)``
    per step. Raises :class:`~kgsynth.core.stage.Reject` for a call that fails
    (``oracle_<error>``), a query that fails (``oracle_query_failed``) or one whose
    observation misses a gold answer (``answers_not_observed``)."""
    gold = {normalize_answer(a) for a in row["answer_names"]}
    steps = []
    for c in space.oracle_calls(row, env.graph):
        result = space.run_oracle_call(env, c)
        if c.kind in QUERY_KINDS:
            if result.error is not None:
                raise Reject("oracle_query_failed")
            if not gold <= {normalize_answer(n) for n in query_answers(result)}:
                raise Reject("answers_not_observed")
        elif result.error is not None:
            raise Reject(f"oracle_{result.error.value}")
        steps.append((c, result))
    return steps


def check_syntax(call: OracleCall) -> None:
    """The call must read back (as the agent's parser reads it) to a call of one tool with
    string arguments: the stored SPARQL's escaping survives the tool-call syntax."""
    try:
        parsed = parse_tool_call(call.call)
    except ToolCallSyntaxError:
        raise Reject("oracle_call_unparsable") from None
    if not all(isinstance(a, str) for a in parsed.args):
        raise Reject("oracle_call_unparsable")
