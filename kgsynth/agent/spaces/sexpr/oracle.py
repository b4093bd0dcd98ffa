"""Oracle trajectories and Referenced Rejection Sampling references for KBQA-R1's action space
(the ``sexpr`` tool set, :mod:`kgsynth.agent.spaces.sexpr.tools`).

A question's S-expression becomes the action sequence that builds it, post-order (each operand
before the operation on it), the way KBQA-R1 shows a reference::

    Action1: Find_relation [ Kismet | (R directed_by) ]
    Action2: Find_relation [ expression1 | directed_by ]
    Action3: Count [ expression2 ]

The S-expression is the row's ``sexpr`` column when it is not empty (constraint walks, GrailQA
rows), else it is built from the walk's branches: each branch a JOIN chain from its topic
entity up to where the branches meet, the branches joined with AND, then the hops after the
meeting (:func:`walk_sexpr`). Entities are written by name (the row's topic names for its
topic ids, else the KG's label), relations as the expression writes them (``rel`` or
``(R rel)``), values plainly (``1990``, ``2004-05-01``). ``(JOIN rel X)`` is
``Find_relation``, ``(AND A B)`` ``Merge`` (a class operand stays a class name), ``ARGMAX`` /
``ARGMIN`` ``Order``, ``lt``/``le``/``gt``/``ge`` ``Compare``, ``TC`` ``Time_constraint`` (on the
latest expression: its operand's, by the post-order) and ``COUNT`` ``Count``; a form outside
them (a relation path in ARGMAX, an entity alone) turns the question down
(``sexpr_unsupported``).

:func:`replay_sexpr` runs the actions through the real tool set: a step that fails
(``oracle_<error type>``) or is gated (``oracle_relation_gated``), a final expression whose
results are more than an observation shows (``answers_not_observed``), or whose results are not
the gold answers (``oracle_answers_differ``: for a count, the number) turns the question down;
results that are the gold answers plus topic entities (a path back through its own topic) are
kept, and the episode answers the gold ones.
A walk's own answers never go back through an entity its path passed (its SPARQL's ``NOT IN``
filters) while the S-expression's JOINs do, so a chain that turns back along its relation can
differ; constraint walks carry their own S-expression and answers, and agree.

A referenced rollout that copies a reference line with its ``ActionK:`` number into its query
(which the action syntax allows) keeps the reference's text in its messages, and the filter's
leak check, unchanged, turns it down; the same actions without the numbers pass.
"""

from __future__ import annotations

from typing import Any

from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.sexpr.syntax import parse_action
from kgsynth.agent.spaces.sexpr.tools import SHOWN_RESULTS
from kgsynth.agent.tools import ToolEnvironment, ToolResult
from kgsynth.core.stage import Reject
from kgsynth.kg import sexpr as sx
from kgsynth.kg.graph import KGGraph
from kgsynth.kg.profiles import FREEBASE_NS, get_profile
from kgsynth.metrics import normalize_answer

SEXPR_TOOLSET = "sexpr"
KINDS = ("find_relation", "merge", "order", "compare", "time_constraint", "count")
"""The oracle steps' kinds (one per action; the thought of each names what it does)."""
_COMPARE = ("lt", "le", "gt", "ge")
_NO_PROFILE = get_profile("generic")  # entity_atom reads none: a Freebase id is one IRI anywhere
_PLAIN_TYPES = (sx.XSD + "gYear", sx.XSD + "date", sx.XSD + "gYearMonth", sx.XSD + "dateTime")


def walk_sexpr(row: dict[str, Any]) -> tuple[sx.SExpr, dict[str, str]]:
    """The S-expression of a chain or conjunction walk and the names of its entity atoms:
    each branch's hops up to ``merge_at`` joined from its topic, the branches under AND, then
    the hops after the meeting (IP's last hop). A hop's relation is the walk's relation name."""
    ids = list(row.get("topic_ids") or [])
    names: dict[str, str] = {}
    main: list[sx.SExpr] = []
    tail: list[dict[str, Any]] = []
    for i, (topic, hops, merge) in enumerate(
        zip(row["topic_names"], row["branches"], row["merge_at"], strict=True)
    ):
        iri = ids[i] if i < len(ids) and ids[i] else f"urn:kgsynth:topic:{i}"
        atom = sx.entity_atom(iri, _NO_PROFILE)
        names[atom] = topic
        expr: sx.SExpr = atom
        for k, hop in enumerate(hops):
            if k < merge:
                expr = _hop(hop, expr)
            else:
                tail.append(hop)
        main.append(expr)
    tree = main[0]
    for other in main[1:]:
        tree = ("AND", tree, other)
    for hop in tail:
        tree = _hop(hop, tree)
    return tree, names


def _hop(hop: dict[str, Any], expr: sx.SExpr) -> sx.SExpr:
    rel = hop["relation"]
    return ("JOIN", rel, expr) if hop["inverse"] else ("JOIN", ("R", rel), expr)


def row_sexpr(row: dict[str, Any]) -> tuple[sx.SExpr, dict[str, str]]:
    """The question's S-expression (its ``sexpr`` column, else :func:`walk_sexpr`) and the
    names the row gives its entity atoms (topic ids to topic names)."""
    text = (row.get("sexpr") or "").strip()
    if not text:
        return walk_sexpr(row)
    try:
        tree = sx.parse(text)
    except sx.SExprError:
        raise Reject("sexpr_unparsable") from None
    names: dict[str, str] = {}
    for iri, name in zip(row.get("topic_ids") or [], row.get("topic_names") or [], strict=False):
        if iri and name:
            try:
                names[sx.entity_atom(iri, _NO_PROFILE)] = name
            except sx.SExprError:
                continue
    return tree, names


def _atom_iri(atom: str) -> str | None:
    if atom.startswith("<") and atom.endswith(">"):
        return atom[1:-1]
    if sx.FREEBASE_ID_RE.fullmatch(atom):
        return FREEBASE_NS + atom
    return None


def _plain_value(atom: str) -> str:
    """A literal as an action writes it: ``1990`` for ``1990^^…#integer`` or ``…#gYear``, a
    date for a date; other literals as the expression writes them."""
    from kgsynth.kg.sexpr_compile import literal_parts

    try:
        lit = literal_parts(atom)
    except sx.SExprError:
        raise Reject("sexpr_unsupported") from None
    if lit is None:
        raise Reject("sexpr_unsupported")
    if lit.bare or lit.datatype in sx.NUMERIC_TYPES or lit.datatype in _PLAIN_TYPES:
        return lit.value.removesuffix("Z")
    return atom


class _Builder:
    """Post-order actions of one S-expression (see the module doc)."""

    def __init__(self, names: dict[str, str], graph: KGGraph | None) -> None:
        self.names = names
        self.graph = graph
        self.calls: list[OracleCall] = []

    def emit(self, kind: str, action: str, args: list[str], about: str, **hop: Any) -> str:
        call = f"{action} [ {' | '.join(args)} ]"
        try:  # it reads back (as the agent's parser reads it) as written
            parsed = parse_action(call)
        except ValueError:
            raise Reject("oracle_call_unparsable") from None
        if parsed.name != action or parsed.args != tuple(args):
            raise Reject("oracle_call_unparsable")
        self.calls.append(OracleCall(kind, call, about, {"inverse": False, "entity": "", **hop}))
        return f"expression{len(self.calls)}"

    def operand(self, atom: str) -> str:
        """An entity by name, or a literal as the expression writes it (a typed literal is
        never read as a name)."""
        iri = _atom_iri(atom)
        if iri is None:
            _plain_value(atom)  # a literal (else the form is unsupported)
            return atom
        name = self.names.get(atom)
        if name is None and self.graph is not None:
            name = self.graph.label(iri)
        if not name:
            raise Reject("sexpr_entity_unnamed")
        return name

    def relation(self, rel: sx.SExpr) -> tuple[str, str, bool]:
        """(as written in the action, the relation's name, whether it is (R rel))."""
        if isinstance(rel, str):
            return rel, rel, False
        if sx.operator(rel) == "R" and isinstance(rel[1], str):
            return f"(R {rel[1]})", rel[1], True
        raise Reject("sexpr_unsupported")

    def visit(self, node: sx.SExpr) -> str:
        """The actions of ``node``; the expression that holds it."""
        op = sx.operator(node)
        if op == "JOIN":
            written, name, reverse = self.relation(node[1])
            target = node[2]
            operand = self.operand(target) if isinstance(target, str) else self.visit(target)
            return self.emit(
                "find_relation", "Find_relation", [operand, written], operand,
                relation=name, inverse=not reverse,
            )  # fmt: skip
        if op == "AND":
            sides = [self._and_side(x) for x in node[1:]]
            return self.emit("merge", "Merge", sides, " and ".join(sides))
        if op in ("ARGMAX", "ARGMIN") and isinstance(node[2], str):
            source = self.visit(node[1])
            mode = op.lower()
            return self.emit("order", "Order", [mode, source, node[2]], source, relation=node[2], op=mode)  # fmt: skip
        if op in _COMPARE and isinstance(node[1], str) and isinstance(node[2], str):
            value = _plain_value(node[2])
            return self.emit(
                "compare", "Compare", [op, node[1], value], node[1],
                relation=node[1], op=op, value=value,
            )  # fmt: skip
        if op == "TC" and isinstance(node[2], str) and isinstance(node[3], str):
            source = self.visit(node[1])
            year = _plain_value(node[3])
            return self.emit(
                "time_constraint", "Time_constraint", [node[2], year], source,
                relation=node[2], value=year,
            )  # fmt: skip
        if op == "COUNT":
            source = self.visit(node[1])
            return self.emit("count", "Count", [source], source)
        raise Reject("sexpr_unsupported")

    def _and_side(self, side: sx.SExpr) -> str:
        if isinstance(side, str):
            if _atom_iri(side) is not None or side.startswith('"') or "^^" in side:
                raise Reject("sexpr_unsupported")  # AND with an entity or a literal
            return side  # a class
        return self.visit(side)


def sexpr_oracle_calls(row: dict[str, Any], graph: KGGraph | None = None) -> list[OracleCall]:
    """The gold action sequence of a question (see the module doc). Entities the row does not
    name are named by ``graph``'s labels; without it such a row raises
    :class:`~kgsynth.core.stage.Reject` (``sexpr_entity_unnamed``), as does an unsupported form."""
    tree, names = row_sexpr(row)
    if isinstance(tree, str):
        raise Reject("sexpr_unsupported")
    builder = _Builder(names, graph)
    builder.visit(tree)
    return builder.calls


def sexpr_reference(calls: list[OracleCall]) -> str:
    """The reference a referenced rollout is shown: ``Action1: Find_relation [ … ]``, one
    action a line (KBQA-R1's numbering)."""
    return "\n".join(f"Action{i}: {c.call}" for i, c in enumerate(calls, 1))


def final_answers(env: ToolEnvironment) -> list[str]:
    """The answer the last expression gives, as the last observation shows it: its members'
    names (every one: more than an observation shows raises ``answers_not_observed``), or a
    count's number."""
    session = env.session
    if session is None or not session.expressions:
        raise Reject("oracle_no_expression")
    last = session.expressions[-1]
    if last.count is not None:
        return [str(last.count)]
    if last.total > SHOWN_RESULTS or last.total > len(last.members):
        raise Reject("answers_not_observed")
    graph = env.graph
    return list(dict.fromkeys(graph.display_name(t) for t in last.members))


def replay_sexpr(row: dict[str, Any], env: ToolEnvironment) -> list[tuple[OracleCall, ToolResult]]:
    """Run the oracle actions through ``env`` (one expression each); ``(call, ToolResult)`` per
    step. Raises :class:`~kgsynth.core.stage.Reject` as the module doc says."""
    steps = []
    for c in sexpr_oracle_calls(row, env.graph):
        made = len(env.session.expressions) if env.session is not None else 0
        result = env.execute(c.call)
        if result.error is not None:
            raise Reject(f"oracle_{result.error.value}")
        if env.session is None or len(env.session.expressions) != made + 1:
            raise Reject("oracle_relation_gated")
        steps.append((c, result))
    check_answers(row, env)
    return steps


def check_answers(row: dict[str, Any], env: ToolEnvironment) -> None:
    """Raise ``oracle_answers_differ`` unless the last expression gives ``row``'s answers."""
    answers = {normalize_answer(a) for a in final_answers(env)}
    gold = {normalize_answer(a) for a in row["answer_names"]}
    # a walk's answers leave its topic entities out (its SPARQL filters them); an S-expression
    # that comes back through a topic (the films sharing an actor with Kismet: Kismet too) is
    # the walk's answer set plus that topic, and the episode answers without it
    topics = {normalize_answer(t) for t in row["topic_names"]}
    if answers != gold and answers - topics != gold:
        raise Reject("oracle_answers_differ")


__all__ = [
    "KINDS",
    "SEXPR_TOOLSET",
    "check_answers",
    "final_answers",
    "replay_sexpr",
    "row_sexpr",
    "sexpr_oracle_calls",
    "sexpr_reference",
    "walk_sexpr",
]
