"""The text of KBQA-R1's actions (the ``sexpr`` tool set, :mod:`kgsynth.agent.spaces.sexpr.tools`):
reading an action (``Action2: Find_relation [ Kismet | (R directed_by) ]``) into a call,
and reading its arguments into S-expression atoms (a value to compare with, a literal operand,
a relation as written and the forms an exact match may take)."""

from __future__ import annotations

import re
from typing import Any

from kgsynth.agent.spaces.sexpr.gate import Named
from kgsynth.agent.toolcall import ToolCall, ToolCallSyntaxError
from kgsynth.agent.toolkit import ErrorType, ToolFailure, tokenize
from kgsynth.core.text import clean_text
from kgsynth.kg import sexpr as sx
from kgsynth.kg.graph import Relation
from kgsynth.kg.profiles import KGProfile
from kgsynth.kg.terms import Term

_HELP = {  # name: (usage, what it does)
    "Find_relation": (
        "Find_relation [ Entity Name or expressionN | relation or (R relation) ]",
        "new expression: what has that relation to it (relation) or what it has by that "
        "relation ((R relation))",
    ),
    "Merge": ("Merge [ expressionA | expressionB ]", "new expression: the members of both"),
    "Order": (
        "Order [ argmax or argmin | expressionN | attribute ]",
        "new expression: the members of expressionN with the largest / smallest attribute",
    ),
    "Compare": (
        "Compare [ lt, le, gt or ge | attribute | value ]",
        "new expression: the entities whose attribute is <, <=, > or >= value (merge it)",
    ),
    "Time_constraint": (
        "Time_constraint [ attribute | year ]",
        "new expression: the members of the latest expression whose date falls in that year",
    ),
    "Count": ("Count [ expressionN ]", "new expression: how many members expressionN has"),
}
ACTIONS = tuple(_HELP)
USAGE = {name: usage for name, (usage, _) in _HELP.items()}
TOOL_HELP = [{"usage": usage, "description": text} for usage, text in _HELP.values()]
_CANONICAL = {name.casefold(): name for name in ACTIONS}

_ACTION_RE = re.compile(r"^(?:action\s*\d+\s*:\s*)?([A-Za-z_][\w-]*)\s*\[(.*)\]$", re.I | re.S)
_SECOND_ACTION_RE = re.compile(r"\]\s*(?:action\s*\d+\s*:\s*)?[A-Za-z_][\w-]*\s*\[", re.I)
_NEXT_ACTION_RE = re.compile(r"(?<=\])\s+(?=(?:action\s*\d+\s*:\s*)?[A-Za-z_][\w-]*\s*\[)", re.I)
MAX_ACTIONS = 5
"""Actions one ``<action>`` block may hold; past it the turn is a format error and only the
first ones run (KBQA-R1 gives no number; a bound on the queries one turn can start)."""
_EXPRESSION_RE = re.compile(r"^expression\s*(\d+)$", re.I)
_REVERSE_RE = re.compile(r"^\(\s*R\s+(.+?)\s*\)$", re.I | re.S)
_NUMBER_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)$")
_DATE_RE = re.compile(r"^\d{4}-\d{2}(?:-\d{2})?$")
_YEAR_RE = re.compile(r"^-?\d{1,4}$")
COMPARISONS = {"lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "<": "lt", "<=": "le", ">": "gt"}
COMPARISONS[">="] = "ge"


class ActionSyntaxError(ToolCallSyntaxError):
    """The text is not one action ``Name [ arg | arg ]``."""


def parse_action(text: str) -> ToolCall:
    """One action as a call: its canonical name (an unknown name as written) and its
    arguments split at ``|`` (Find_relation's at the last one, so a name may hold one).
    Raises :class:`ActionSyntaxError`."""
    text = clean_text(text).strip().strip("`").strip()
    if not text:
        raise ActionSyntaxError("empty action")
    m = _ACTION_RE.match(text)
    if m is None:
        raise ActionSyntaxError("expected one action such as Find_relation [ Entity | relation ]")
    body = m.group(2)
    if "\n" in text.strip() or _SECOND_ACTION_RE.search(body):
        raise ActionSyntaxError("one action at a time here (split_actions reads a block)")
    name = _CANONICAL.get(m.group(1).casefold(), m.group(1))
    parts = body.rsplit("|", 1) if name == "Find_relation" else body.split("|")
    return ToolCall(name, tuple(" ".join(p.split()) for p in parts))


def split_actions(text: str) -> list[str]:
    """The actions of one ``<action>`` block, in order: one per line, and on a line one after
    another (``Find_relation [ A | r ] Action2: Count [ expression1 ]``)."""
    out: list[str] = []
    for line in clean_text(text).splitlines():
        out.extend(a.strip() for a in _NEXT_ACTION_RE.split(line) if a.strip())
    return out


def is_expression(text: str) -> bool:
    """Whether ``text`` names an expression (``expression2``)."""
    return _EXPRESSION_RE.match(text.strip()) is not None


def wrong(action: str) -> ToolFailure:
    """The ``wrong_arguments`` failure of ``action``, with its usage."""
    return ToolFailure(ErrorType.WRONG_ARGUMENTS, f"wrong arguments; use {USAGE[action]}.")


def words(name: str) -> str:
    """A relation's or attribute's words (what gating compares)."""
    return " ".join(tokenize(name)) or name


def written_forms(written: str) -> set[str]:
    """What an exact match may equal: the text as written, single-spaced, and its IRI."""
    text = " ".join(written.split())
    forms = {text, re.sub(r"^\(\s*R\s+", "(R ", text, flags=re.I)}
    m = _REVERSE_RE.match(text)
    inner = m.group(1) if m else text
    if inner.startswith("<") and inner.endswith(">"):
        forms.add(("out:" if m else "in:") + inner[1:-1])
    return forms


def key_matches(key: Any, forms: set[str]) -> bool:
    """A relation written by its IRI, or by its name when it is shown as an IRI."""
    if isinstance(key, Named):
        return key.name in forms or f"in:{key.iri}" in forms
    if isinstance(key, Relation):
        side = "out:" if key.direction == "out" else "in:"
        named = key.name if key.direction == "in" else f"(R {key.name})"
        return named in forms or any(side + p in forms for p in key.path[:1])
    return False


def literal_operand(text: str) -> str | None:
    """``text`` as a literal operand (a typed literal, or a number or date), else None."""
    text = text.strip()
    if "^^" in text or text.startswith('"'):
        try:
            atom = sx.parse(text)
        except sx.SExprError:
            return None
        return atom if isinstance(atom, str) else None
    return value_atom(text)


def literal_terms(atom: str) -> list[str]:
    """The SPARQL terms a literal operand matches exactly (a bare number or date: typed as
    a number, a year or a date), for the relations that reach it."""
    from kgsynth.kg.sexpr_compile import literal_parts

    try:
        lit = literal_parts(atom)
    except sx.SExprError:
        return []
    if lit is None:
        return []
    if lit.bare:
        if "-" in lit.value.lstrip("-"):
            types = ["date", "gYearMonth", "dateTime"]
        else:
            types = ["integer", "gYear", "decimal", "double"]
        return [Term("literal", lit.value, sx.XSD + t).n3() for t in types]
    return [Term("literal", lit.value, lit.datatype, lit.lang).n3()]


def value_atom(text: str) -> str | None:
    """A value to compare with, as an atom: a bare number or date (``1990``, ``2004-05-01``,
    compared by value) or a typed literal ``VALUE^^DATATYPE``; None for anything else."""
    text = text.strip()
    if _NUMBER_RE.match(text) or _DATE_RE.match(text):
        return text
    if "^^" in text:
        return literal_operand(text)
    return None


def plain_atom(written: str) -> str:
    """An attribute written where there is nothing to gate it against, as one atom."""
    m = _REVERSE_RE.match(written)
    name = (m.group(1) if m else written).strip()
    try:
        atom = sx.parse(name)
    except sx.SExprError:
        raise wrong("Compare") from None
    if not isinstance(atom, str):
        raise wrong("Compare")
    return atom


def year_atom(text: str) -> str | None:
    """A year as Time_constraint takes it (``1944``), else None."""
    text = text.strip()
    return str(int(text)) if _YEAR_RE.match(text) else None


def reverse_inner(written: str) -> str | None:
    """``rel`` for ``(R rel)``, None for a relation written forwards."""
    m = _REVERSE_RE.match(written.strip())
    return m.group(1).strip() if m else None


def expression_number(ref: str) -> int | None:
    """N for ``expressionN`` (any case, a space allowed), else None."""
    m = _EXPRESSION_RE.match(ref.strip())
    return int(m.group(1)) if m else None


def display(prof: KGProfile, rel: Relation) -> str:
    """How the agent writes ``rel``: ``name`` (``(JOIN name X)``: what has it to X) for an
    incoming relation, ``(R name)`` for an outgoing one."""
    name = sx.relation_atom(rel.path[0], prof) if len(rel.path) == 1 else rel.name
    return f"(R {name})" if rel.direction == "out" else name


def join(prof: KGProfile, rel: Relation, subject: sx.SExpr) -> sx.SExpr:
    """``(JOIN rel X)`` / ``(JOIN (R rel) X)``; a relation across an unnamed node is two
    JOINs (``s r1 c . c r2 o``)."""
    atoms = [sx.relation_atom(p, prof) for p in rel.path]
    if rel.direction == "out":
        tree = subject
        for atom in atoms:
            tree = ("JOIN", ("R", atom), tree)
        return tree
    tree = subject
    for atom in reversed(atoms):
        tree = ("JOIN", atom, tree)
    return tree


__all__ = [
    "ACTIONS",
    "COMPARISONS",
    "MAX_ACTIONS",
    "TOOL_HELP",
    "USAGE",
    "ActionSyntaxError",
    "display",
    "expression_number",
    "is_expression",
    "join",
    "key_matches",
    "literal_operand",
    "literal_terms",
    "parse_action",
    "plain_atom",
    "reverse_inner",
    "split_actions",
    "value_atom",
    "words",
    "written_forms",
    "wrong",
    "year_atom",
]
