"""Parsing a tool call written by a model, e.g. ``get_triples("Kismet", ["directed_by"])``.

Single or double quotes, extra whitespace, unicode, typographic quotes around arguments and a
bare string where a list is expected are all accepted. What cannot be read becomes a
:class:`ToolCallSyntaxError`, which the environment turns into a typed ``bad_syntax`` result.
Arguments pass through :func:`~kgsynth.core.text.clean_text`: a model that writes ``"\\ud83c"``
gets U+FFFD in its query, not a lone surrogate that no query or Parquet file can hold.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from kgsynth.core.text import clean_text

_SMART = str.maketrans({"“": '"', "”": '"', "„": '"', "‘": "'", "’": "'"})
_CALL_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*\((.*)\)\s*;?\s*$", re.DOTALL)


class ToolCallSyntaxError(ValueError):
    """The text is not a call ``name(arg, …)`` with string or list-of-string arguments."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: tuple[str | tuple[str, ...], ...]


def _value(node: ast.expr) -> str | tuple[str, ...]:
    value = ast.literal_eval(node)
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ToolCallSyntaxError("arguments must be quoted strings or lists of quoted strings")


def _strict(text: str) -> ToolCall:
    tree = ast.parse(text.strip(), mode="eval")
    call = tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ToolCallSyntaxError('expected a call such as get_relations("Entity")')
    args = [*call.args, *(k.value for k in call.keywords)]
    return ToolCall(call.func.id, tuple(_value(a) for a in args))


def _unquote(text: str) -> str | None:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return None


def _lenient(text: str) -> ToolCall:
    """Quotes inside names (``get_relations("The "Best" Film")``) break Python syntax; read
    the outermost quotes as delimiters instead."""
    m = _CALL_RE.match(text)
    if not m:
        raise ToolCallSyntaxError('expected a call such as get_relations("Entity")')
    name, inner = m.group(1), m.group(2).strip()
    if not inner:
        return ToolCall(name, ())
    bracket = inner.rfind("[")
    if bracket > 0 and inner.endswith("]") and inner[:bracket].rstrip().endswith(","):
        first = _unquote(inner[:bracket].rstrip()[:-1])
        try:
            rels = ast.literal_eval(inner[bracket:].translate(_SMART))
        except (ValueError, SyntaxError):
            rels = None
        if first is None or not isinstance(rels, list) or not all(isinstance(r, str) for r in rels):
            raise ToolCallSyntaxError("could not read the arguments; quote each name")
        return ToolCall(name, (first, tuple(rels)))
    single = _unquote(inner)
    if single is None:
        raise ToolCallSyntaxError("could not read the arguments; quote each name")
    return ToolCall(name, (single,))


def _cleaned(call: ToolCall) -> ToolCall:
    args = tuple(
        clean_text(a) if isinstance(a, str) else tuple(clean_text(x) for x in a) for a in call.args
    )
    return ToolCall(call.name, args)


def parse_tool_call(text: str) -> ToolCall:
    """Parse ``text`` as one tool call; raises :class:`ToolCallSyntaxError`."""
    return _cleaned(_parse(clean_text(text)))


def _parse(text: str) -> ToolCall:
    text = text.strip().strip("`").strip()
    if not text:
        raise ToolCallSyntaxError("empty query")
    if len(text) > 10_000:
        raise ToolCallSyntaxError("query too long")
    for candidate in (text, text.translate(_SMART)):
        try:
            return _strict(candidate)
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            pass
    try:
        return _lenient(text)
    except ToolCallSyntaxError:
        return _lenient(text.translate(_SMART))
