"""KBQA-R1's action space (``sexpr``): S-expression actions that build a logical form step by
step, each step executed on the KG. One action per call (a turn's ``<action>`` block may hold
several: :mod:`.turns`), in KBQA-R1's bracket syntax, optionally numbered (``Action2: Merge [
expression1 | expression2 ]``), names case-insensitive:

- ``Find_relation [ Entity Name or expressionN | relation or (R relation) ]``: ``(JOIN
  relation X)``, the ``s`` with ``s relation x``, or ``(JOIN (R relation) X)``, the ``o`` with
  ``x relation o``, for ``x`` in X (an entity resolved by name like every tool's names, an
  earlier expression, or a typed literal ``1990^^xsd-IRI``);
- ``Merge [ expressionA | expressionB ]``: ``(AND A B)`` (one side may be a class name);
- ``Order [ argmax or argmin | expressionN | attribute ]``: ``(ARGMAX N attribute)``;
- ``Compare [ lt, le, gt or ge | attribute | value ]``: ``(gt attribute value)`` (then Merge);
- ``Time_constraint [ attribute | year ]``: ``(TC latest attribute year)``;
- ``Count [ expressionN ]``: ``(COUNT N)``.

Each action that succeeds makes the next expression (``expression1``, ``expression2`` …: the
episode's state, one :class:`Session` per :class:`~kgsynth.agent.tools.ToolEnvironment`, which
is one per question; tree rollouts restore each branch's own with
:meth:`~kgsynth.agent.tools.ToolEnvironment.restore`). The whole expression is compiled to one
SPARQL query (:func:`kgsynth.kg.sexpr.compile_sparql`) and run through the KG's read-only
guard, the agent's ``query_timeout_s`` and a row cap (as
:func:`~kgsynth.agent.sparql_exec.run_agent_query`; past the cap a COUNT query gives the
total). The agent composes that query, so it runs on the KG's agent path
(:meth:`~kgsynth.kg.base.KG.agent_select_iter`: a child process killed at the timeout or past
its memory limit); the gating look-ups stay in-process. The observation: ``expressionK = <S-expression>``, the number of results and the first
:data:`SHOWN_RESULTS` by name, the relations of the new set ranked against the question (top
``top_k_relations``, written as the agent writes them: ``rel`` / ``(R rel)``) and its number
and date attributes (what Order, Compare and Time_constraint take). An empty result makes no
expression (``no_results``). Relations and attributes are gated first
(:mod:`~kgsynth.agent.spaces.sexpr.gate`, KBQA-R1's RRCG, thresholds ``gate_high`` and
``gate_low``: run as written or as the best match, run tentatively with a note, or not found) against those of the set's first members (``SAMPLED_MEMBERS``); a relation
written exactly that only other members have is tried on the whole set before it is gated::

    env = ToolEnvironment(graph, "who directed Kismet", AgentConfig(toolset="sexpr"))
    env.execute("Find_relation [ Kismet | (R directed_by) ]")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kgsynth.agent.spaces.sexpr import gate as g
from kgsynth.agent.spaces.sexpr.gate import (
    attributes_of,
    classes_of,
    literal_relations,
    relations_of,
)
from kgsynth.agent.spaces.sexpr.syntax import (
    ACTIONS,
    COMPARISONS,
    TOOL_HELP,
    USAGE,
    ActionSyntaxError,
    display,
    expression_number,
    is_expression,
    join,
    key_matches,
    literal_operand,
    literal_terms,
    parse_action,
    plain_atom,
    reverse_inner,
    value_atom,
    words,
    written_forms,
    wrong,
    year_atom,
)
from kgsynth.agent.spaces.sparql import ToolTable, memory_failure
from kgsynth.agent.sparql_exec import AGENT_MAX_ROWS, agent_timeout
from kgsynth.agent.toolkit import ErrorType, ToolFailure, ToolResult, rank_relations
from kgsynth.core.errors import KGMemoryError, QueryRejectedError, RowLimitError
from kgsynth.kg import sexpr as sx
from kgsynth.kg.graph import Relation
from kgsynth.kg.terms import Term

if TYPE_CHECKING:
    from kgsynth.agent.toolkit import ToolHost

SHOWN_RESULTS = 20
"""Result names an observation shows."""
TENTATIVE_NOTE = "tentatively substituted"
"""The words of a tentative match's note (the gate's middle band)."""


@dataclass(frozen=True)
class Expression:
    """One expression of the episode: its tree and text, and what it gave (a set's first
    members and size, or a count's number)."""

    number: int
    tree: sx.SExpr
    text: str
    members: tuple[Term, ...] = ()
    total: int = 0
    count: int | None = None  # a COUNT expression's number

    @property
    def name(self) -> str:
        return f"expression{self.number}"


class Session:
    """The expressions an episode made, in order (expression1 first)."""

    def __init__(self) -> None:
        self.expressions: list[Expression] = []

    def snapshot(self) -> tuple[Expression, ...]:
        """The expressions so far (immutable: a tree branch keeps its own)."""
        return tuple(self.expressions)

    def restore(self, state: tuple[Expression, ...] | None) -> None:
        """Go back to a :meth:`snapshot` (None: no expression yet)."""
        self.expressions = list(state or ())

    def get(self, ref: str, *, need_set: bool = True) -> Expression:
        """The expression ``ref`` (``expressionN``) names; ``wrong_arguments`` when there is
        none, or (``need_set``) when it is a count."""
        n = expression_number(ref)
        if n is None:
            raise ToolFailure(ErrorType.WRONG_ARGUMENTS, f'"{ref}" is not an expressionN.')
        if not 1 <= n <= len(self.expressions):
            made = f"expression1 to expression{len(self.expressions)}" if self.expressions else ""
            raise ToolFailure(
                ErrorType.WRONG_ARGUMENTS,
                f"there is no expression{n}; "
                + (f"the expressions so far are {made}." if made else "no expression yet."),
            )
        expr = self.expressions[n - 1]
        if need_set and expr.count is not None:
            raise ToolFailure(
                ErrorType.WRONG_ARGUMENTS, f"{expr.name} is a count, not a set of entities."
            )
        return expr

    def latest(self) -> Expression | None:
        """The latest set expression (what Time_constraint and Compare apply to)."""
        return next((e for e in reversed(self.expressions) if e.count is None), None)


class SExprTools:
    """The six actions over one environment and its :class:`Session`."""

    def __init__(self, env: ToolHost, timeout: float | None, max_rows: int) -> None:
        self.env = env
        self.session = Session()
        self.timeout = agent_timeout(timeout, env.config)
        self.max_rows = max_rows

    # --- running an expression -------------------------------------------------------------

    def _compile(self, tree: sx.SExpr) -> str:
        try:
            return sx.compile_sparql(tree, self.env.graph.profile)
        except sx.SExprError as exc:
            msg = f"the expression is invalid: {exc}."
            raise ToolFailure(ErrorType.WRONG_ARGUMENTS, msg) from None

    def _rows(self, query: str, max_rows: int | None) -> tuple[list[dict[str, Term]], bool]:
        rows: list[dict[str, Term]] = []
        try:
            try:
                for row in self.env.graph.kg.agent_select_iter(
                    query, timeout=self.timeout, max_rows=max_rows
                ):
                    rows.append(row)
            except RowLimitError:
                return rows, True
        except QueryRejectedError as exc:
            reason = str(exc).removeprefix("refused: ")
            msg = f"the query was refused: {reason}."
            raise ToolFailure(ErrorType.QUERY_REFUSED, msg) from None
        except KGMemoryError as exc:
            raise memory_failure(exc) from None
        return rows, False

    def _count(self, tree: sx.SExpr) -> int:
        rows, _ = self._rows(self._compile(tree), 1)
        return int(rows[0]["count"].value) if rows and "count" in rows[0] else 0

    def _make(
        self, tree: sx.SExpr, notes: tuple[str, ...], entities: tuple[str, ...] = ()
    ) -> ToolResult:
        """Run ``tree``; on results, record it as the next expression and observe it."""
        text = sx.to_text(tree)
        number = len(self.session.expressions) + 1
        if sx.operator(tree) == "COUNT":
            n = self._count(tree)
            expr = Expression(number, tree, text, count=n)
            self.session.expressions.append(expr)
            lines = [*notes, f"{expr.name} = {text}", f"Count: {n}"]
            return ToolResult("\n".join(lines), entities=(*entities, str(n)), notes=notes)
        rows, capped = self._rows(self._compile(tree), self.max_rows)
        terms = list(dict.fromkeys(r["x"] for r in rows if "x" in r))
        if not terms:
            raise ToolFailure(
                ErrorType.NO_RESULTS,
                f"{text} has no results; no expression was made. Try another relation, "
                "direction or value.",
            )
        graph = self.env.graph
        graph.prefetch_labels(t.value for t in terms if t.kind == "iri")
        named = sorted(
            ((graph.display_name(t), t) for t in terms), key=lambda p: (p[0], p[1].value)
        )
        total = self._count(("COUNT", tree)) if capped else len(terms)
        expr = Expression(number, tree, text, tuple(t for _, t in named), total)
        self.session.expressions.append(expr)
        shown = [n for n, _ in named[:SHOWN_RESULTS]]
        plural = "" if total == 1 else "s"
        head = f"{total} result{plural}" + (
            f", the first {len(shown)}" if total > len(shown) else ""
        )
        lines = [*notes, f"{expr.name} = {text}", f"{head}: {'; '.join(shown)}"]
        lines += self._describe(expr)
        return ToolResult("\n".join(lines), entities=(*entities, *shown), notes=notes)

    def _describe(self, expr: Expression) -> list[str]:
        """The relation and attribute lines of a new set."""
        env, iris = self.env, [t.value for t in expr.members if t.kind == "iri"]
        lines = []
        rels = relations_of(env.graph, iris)
        if rels:
            ranked = rank_relations(env.question, rels, _dense(env))[: env.config.top_k_relations]
            order = ", most relevant first" if env.question else ""
            shown = ", ".join(display(env.graph.profile, r) for r in ranked)
            lines.append(
                f"Relations of {expr.name} (showing {len(ranked)} of {len(rels)}{order}): {shown}"
            )
        attrs = attributes_of(env.graph, iris)
        if attrs:
            listed = ", ".join(f"{a.atom} ({a.kind})" for a in attrs[: env.config.top_k_relations])
            lines.append(
                f"Attributes of {expr.name} (for Order, Compare, Time_constraint): {listed}"
            )
        return lines

    # --- gating ----------------------------------------------------------------------------

    def _gate(
        self, written: str, candidates: list[g.Candidate], where: str, what: str
    ) -> tuple[Any, tuple[str, ...]]:
        """The candidate's key to use (RRCG, :mod:`.gate`), and the note of a tentative match;
        raises ``relation_not_found`` with every candidate and its similarity below tau_low."""
        cfg = self.env.config
        exact_forms = written_forms(written)
        result = g.gate(
            words(reverse_inner(written) or written),
            candidates,
            self.env.dense or _shared_scorer(),
            high=cfg.gate_high,
            low=cfg.gate_low,
            is_exact=lambda c: c.text in exact_forms or key_matches(c.key, exact_forms),
        )
        extra = (result.note,) if result.note else ()
        if result.band in (g.EXACT, g.CORRECTED) and result.chosen is not None:
            return result.chosen.key, extra  # auto-validated: runs as r*, no annotation
        if result.band == g.TENTATIVE and result.chosen is not None:
            c, sim = result.ranked[0]
            note = (
                f"note: {where} has no {what} {written}; {TENTATIVE_NOTE} {c.text} "
                f"(similarity {sim:.2f}, below {cfg.gate_high}). Top candidates: "
                f"{g.listing(result.ranked)}. If this is not the {what} you meant, write the "
                "action again with another."
            )
            return c.key, (*extra, note)
        listed = f" Its {what}s by similarity: {g.listing(result.ranked)}." if result.ranked else ""
        raise ToolFailure(
            ErrorType.RELATION_NOT_FOUND,
            "\n".join([*extra, f"{where} has no {what} like {written}; nothing was run.{listed}"]),
        )

    def _unsampled(self, source: Expression, written: str, candidates: list[g.Candidate]) -> bool:
        """Whether ``written`` matches no candidate read from ``source``'s sampled members
        while ``source`` has more members than were sampled (it may be on the others)."""
        if source.total <= g.SAMPLED_MEMBERS:
            return False
        forms = written_forms(written)
        return not any(c.text in forms or key_matches(c.key, forms) for c in candidates)

    def _written_relation(self, written: str, direction: str) -> Relation | None:
        """The relation ``written`` names (a name or ``<IRI>``), None when it names none."""
        name = " ".join((reverse_inner(written) or written).split())
        try:
            atom = sx.parse(name)
        except sx.SExprError:
            return None
        if not isinstance(atom, str) or literal_operand(atom) is not None:
            return None
        prof = self.env.graph.profile
        iri = atom[1:-1] if atom.startswith("<") else prof.relation_iri(atom)
        return Relation(prof.relation_name(iri), direction, (iri,))  # type: ignore[arg-type]

    def _reaches(self, tree: sx.SExpr) -> bool:
        """Whether ``tree`` has a result (an invalid one has none)."""
        try:
            rows, capped = self._rows(self._compile(tree), 1)
        except ToolFailure as fail:
            if fail.error == ErrorType.WRONG_ARGUMENTS:
                return False
            raise
        return bool(rows) or capped

    # --- the actions -----------------------------------------------------------------------

    def find_relation(self, operand: str, relation: str) -> ToolResult:
        """``Find_relation [ X | rel ]``: ``(JOIN rel X)`` or ``(JOIN (R rel) X)``."""
        env, graph = self.env, self.env.graph
        if not operand or not relation:
            raise wrong("Find_relation")
        notes: tuple[str, ...] = ()
        entities: tuple[str, ...] = ()
        subject: sx.SExpr
        if is_expression(operand):
            source = self.session.get(operand)
            subject, where = source.tree, source.name
            rels = relations_of(graph, [t.value for t in source.members if t.kind == "iri"])
        else:
            literal = literal_operand(operand)
            typed = literal is not None and ("^^" in operand or operand.startswith('"'))
            try:
                if typed:  # a typed or quoted literal is never a name
                    raise ToolFailure(ErrorType.ENTITY_NOT_FOUND, operand)
                entity, notes = env._entity(operand)
            except ToolFailure:
                if literal is None:
                    raise
                subject, where = literal, operand
                rels = literal_relations(graph, literal_terms(literal))
            else:
                subject = sx.entity_atom(entity.iri, graph.profile)
                where, entities = f'"{entity.name}"', (entity.name,)
                rels = graph.relations(entity.iri)
        direction = "in" if reverse_inner(relation) is None else "out"
        candidates = [
            g.Candidate(display(graph.profile, r), words(r.name), r, r.direction == direction)
            for r in rels
        ]
        if is_expression(operand) and self._unsampled(source, relation, candidates):
            written = self._written_relation(relation, direction)
            if written is not None and self._reaches(join(graph.profile, written, subject)):
                return self._make(join(graph.profile, written, subject), notes, entities)
        rel, more = self._gate(relation, candidates, where, "relation")
        return self._make(join(graph.profile, rel, subject), (*notes, *more), entities)

    def merge(self, first: str, second: str) -> ToolResult:
        """``Merge [ A | B ]``: ``(AND A B)``, one side an expression, the other one or a class."""
        if not first or not second:
            raise wrong("Merge")
        sides = [self.session.get(x) if is_expression(x) else None for x in (first, second)]
        if sides[0] is None and sides[1] is None:
            raise ToolFailure(
                ErrorType.WRONG_ARGUMENTS, "Merge needs at least one expressionN; " + USAGE["Merge"]
            )
        notes: tuple[str, ...] = ()
        trees: list[sx.SExpr] = []
        for text, side, other in zip((first, second), sides, sides[::-1], strict=True):
            if side is not None:
                trees.append(side.tree)
                continue
            assert other is not None
            iris = [t.value for t in other.members if t.kind == "iri"]
            classes = classes_of(self.env.graph, iris)
            candidates = [g.Candidate(c.atom, words(c.name), c) for c in classes]
            named, more = self._gate(text, candidates, other.name, "class")
            trees.append(named.atom)
            notes += more
        return self._make(("AND", trees[0], trees[1]), notes)

    def order(self, mode: str, operand: str, attribute: str) -> ToolResult:
        """``Order [ argmax|argmin | N | attribute ]``: ``(ARGMAX N attribute)``."""
        op = {"argmax": "ARGMAX", "argmin": "ARGMIN"}.get(mode.strip().casefold())
        if op is None or not operand or not attribute:
            raise wrong("Order")
        source = self.session.get(operand)
        atom, notes = self._attribute(source, attribute)
        return self._make((op, source.tree, atom), notes)

    def compare(self, op: str, attribute: str, value: str) -> ToolResult:
        """``Compare [ op | attribute | value ]``: ``(op attribute value)``, the attribute gated
        against the latest expression's."""
        cmp = COMPARISONS.get(op.strip().casefold())
        if cmp is None or not attribute or not value:
            raise wrong("Compare")
        atom_value = value_atom(value)
        if atom_value is None:
            raise ToolFailure(
                ErrorType.WRONG_ARGUMENTS,
                f'"{value}" is not a value to compare: write a number, a date (YYYY-MM-DD) or '
                "VALUE^^DATATYPE-IRI.",
            )
        latest = self.session.latest()
        if latest is None:  # nothing to gate against: the attribute as written
            atom, notes = plain_atom(attribute), ()
        else:
            atom, notes = self._attribute(latest, attribute)
        return self._make((cmp, atom, atom_value), notes)

    def time_constraint(self, attribute: str, year: str) -> ToolResult:
        """``Time_constraint [ attribute | year ]``: ``(TC latest attribute year)``."""
        year_value = year_atom(year)
        if not attribute or year_value is None:
            raise wrong("Time_constraint")
        latest = self.session.latest()
        if latest is None:
            raise ToolFailure(
                ErrorType.WRONG_ARGUMENTS,
                "Time_constraint applies to the latest expression; there is none yet.",
            )
        atom, notes = self._attribute(latest, attribute)
        return self._make(("TC", latest.tree, atom, year_value), notes)

    def count(self, operand: str) -> ToolResult:
        """``Count [ N ]``: ``(COUNT N)``."""
        if not operand:
            raise wrong("Count")
        return self._make(("COUNT", self.session.get(operand).tree), ())

    def _attribute(self, source: Expression, written: str) -> tuple[str, tuple[str, ...]]:
        name = reverse_inner(written) or written  # (R release_year): release_year
        iris = [t.value for t in source.members if t.kind == "iri"]
        attrs = attributes_of(self.env.graph, iris)
        candidates = [g.Candidate(a.atom, words(a.name), a) for a in attrs]
        if self._unsampled(source, name, candidates):
            rel = self._written_relation(name, "out")
            if rel is not None and self._reaches(join(self.env.graph.profile, rel, source.tree)):
                return sx.relation_atom(rel.path[0], self.env.graph.profile), ()
        named, notes = self._gate(name, candidates, source.name, "number or date attribute")
        return named.atom, notes


def _shared_scorer() -> Any:
    from kgsynth.agent.relrank import shared_scorer

    return shared_scorer()


def _dense(env: ToolHost) -> Any:
    if env.config.relation_ranking != "hybrid" or not env.question:
        return None
    return env.dense or _shared_scorer()


def make_tools(
    env: ToolHost, *, timeout: float | None = None, max_rows: int = AGENT_MAX_ROWS
) -> ToolTable:
    """The ``sexpr`` tool table of ``env`` (its :class:`Session` becomes ``env.session``);
    ``timeout`` (None: the agent's ``query_timeout_s``) and ``max_rows`` bound its queries."""
    tools = SExprTools(env, timeout, max_rows)
    env.session = tools.session  # type: ignore[attr-defined]
    return {
        "Find_relation": (2, tools.find_relation),
        "Merge": (2, tools.merge),
        "Order": (3, tools.order),
        "Compare": (3, tools.compare),
        "Time_constraint": (2, tools.time_constraint),
        "Count": (1, tools.count),
    }


__all__ = [
    "ACTIONS",
    "SHOWN_RESULTS",
    "TOOL_HELP",
    "USAGE",
    "ActionSyntaxError",
    "Expression",
    "SExprTools",
    "Session",
    "is_expression",
    "make_tools",
    "parse_action",
]
