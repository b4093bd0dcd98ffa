"""The template backend's questions for constraint walks (``count``, ``superlative``,
``comparative``, ``time``): the walk's set (its topic and hops, as
:mod:`~kgsynth.llm.rule_questions` reads them) and the constraint its S-expression states, put
into English from the KG's own relation names.

Only the walk row is read: ``topic_names``, ``branches`` and ``sexpr`` (``(COUNT B)``,
``(ARGMAX B attr)``, ``(AND B (gt attr v))``, ``(TC B attr year)``). Each question picks one of
several forms with the walk's rng ("How many things were directed by X?", "Which of the things
directed by X has the latest release year?", "Name the things directed by X with a release year
after 1990?", "Among …, which have a release year in 1995?"). An attribute whose words name a
time (year, date, …) or whose value is a date reads as a time (latest, before, …); any other as a
quantity (highest, greater than, …). Without an rng, the first form of each choice.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from kgsynth.llm.relation_forms import (
    Phrase,
    hop_forms,
    hop_predicates,
    relation_form,
    relation_words,
)
from kgsynth.llm.rule_questions import _sentence, _walk_hops

CONSTRAINT_STRUCTURES = ("count", "superlative", "comparative", "time")
_TOKEN = re.compile(r'\s*(\(|\)|<[^>]*>|"(?:[^"\\]|\\.)*"(?:\^\^\S+?(?=[\s()]|$))?|[^\s()]+)')
_TIME_WORDS = frozenset({"year", "date", "time", "day", "born", "founded", "released", "died"})
_DATE_TYPES = ("#date", "#dateTime", "#gYear", "#gYearMonth")

SExpr = str | tuple[Any, ...]


def read_sexpr(text: str) -> SExpr:
    """The nested lists of an S-expression (only as far as the questions need: atoms stay
    text). Raises ``ValueError`` for unbalanced text."""
    stack: list[list[Any]] = [[]]
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"sexpr: cannot read at offset {pos}")
        token, pos = m.group(1), m.end()
        if token == "(":
            stack.append([])
        elif token == ")":
            if len(stack) < 2:
                raise ValueError(f"sexpr: unbalanced ')' at offset {m.start(1)}")
            done = tuple(stack.pop())
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    if len(stack) != 1 or len(stack[0]) != 1:
        raise ValueError("sexpr: not one balanced expression")
    return stack[0][0]


def _attribute_words(atom: str) -> str:
    """Plain words of an attribute atom: ``release_year`` or ``<http://x/release_year>``."""
    if atom.startswith("<") and atom.endswith(">"):
        atom = unquote(re.split(r"[/#]", atom[1:-1].rstrip("/"))[-1])
    return relation_words(atom)


def _value_text(atom: str) -> tuple[str, bool]:
    """A compared value as the question shows it, and whether it is a date."""
    if atom.startswith('"'):
        body, _, _ = atom[1:].rpartition('"')
        return body.replace('\\"', '"').replace("\\\\", "\\"), False
    value, _, datatype = atom.partition("^^")
    return value, datatype.endswith(_DATE_TYPES)


def _plural(words: str) -> str:
    if words.endswith("s"):
        return words
    if words.endswith("y") and not words.endswith(("ay", "ey", "oy", "uy")):
        return words[:-1] + "ies"
    return words + "s"


def _a(words: str) -> str:
    return f"an {words}" if words[:1] in "aeiou" else f"a {words}"


def member_phrases(x: Phrase, relation: str, inverse: bool) -> list[Phrase]:
    """Plural noun phrases for everything one hop from ``x`` ("the things directed by X", "the
    genres of X", "the actors who starred in X")."""
    if inverse:
        out = [f for f in hop_forms(x, relation, True) if f.role == "np"]
    else:
        form = relation_form(relation)
        t = x.text
        if form.kind == "participle_noun":
            out = [
                Phrase(f"the {form.noun} of {t}", plural=True),
                Phrase(f"the {form.noun} who {form.participle} in {t}", plural=True),
            ]
        elif form.kind == "noun":
            words = form.words if form.plural else _plural(form.words)
            out = [Phrase(f"the {words} of {t}", plural=True)]
            if x.role == "name":
                out.append(Phrase(f"{t}'s {words}", plural=True))
        elif x.subject_ok:
            be = ("were" if x.plural else "was") if form.kind == "passive" else "is"
            out = [Phrase(f"the ones {t} {be} {form.words}", plural=True)]
        else:
            out = []
    return out or [
        Phrase(f"the things {x.text} leads to by {relation_words(relation)}", plural=True)
    ]


class _Pick:
    """Draws from ``rng``, or takes the first option without one (the canonical form)."""

    def __init__(self, rng: random.Random | None) -> None:
        self.rng = rng

    def __call__(self, options: Sequence[Any]) -> Any:
        return self.rng.choice(list(options)) if self.rng is not None else options[0]


def _base(row: dict[str, Any], pick: _Pick) -> tuple[Phrase, Phrase, dict[str, Any]]:
    """The phrase for the walk's set, the phrase it was reached from, and its last hop."""
    hops = list(row["branches"][0])
    *inner, last = hops
    rng = pick.rng if pick.rng is not None else random.Random(0)
    x = _walk_hops(Phrase(row["topic_names"][0], "name"), inner, last, rng).phrase
    return pick(member_phrases(x, last["relation"], bool(last["inverse"]))), x, last


def _count_forms(np: Phrase, x: Phrase, last: dict[str, Any]) -> list[str]:
    t = np.text
    out = [f"What is the number of {t}"]
    if t.startswith("the ") and not t.startswith("the ones "):  # not "how many ones …"
        out += [f"How many {t[4:]} are there", f"Tell me how many {t[4:]} there are"]
    relation, inverse = last["relation"], bool(last["inverse"])
    if inverse:
        out += [f"How many things {plural}" for _, plural in hop_predicates(x, relation, True)]
    elif x.role == "name" and relation_form(relation).kind == "noun":
        form = relation_form(relation)
        words = form.words if form.plural else _plural(form.words)
        out.append(f"How many {words} does {x.text} have")
    return out


def _superlative_forms(np: Phrase, op: str, words: str, timed: bool) -> list[str]:
    if timed:
        adjectives = ("latest", "most recent") if op == "ARGMAX" else ("earliest", "oldest")
    else:
        adjectives = ("highest", "largest") if op == "ARGMAX" else ("lowest", "smallest")
    t = np.text
    return [
        form.format(t=t, adj=adj, a=words)
        for adj in adjectives
        for form in (
            "Which of {t} has the {adj} {a}",
            "Among {t}, which one has the {adj} {a}",
            "Of {t}, which has the {adj} {a}",
            "What is the one among {t} with the {adj} {a}",
        )
    ]


_WITH = {
    True: {
        "gt": ["after {v}"],
        "lt": ["before {v}"],
        "ge": ["of {v} or later"],
        "le": ["of {v} or earlier"],
    },
    False: {
        "gt": ["greater than {v}", "above {v}"],
        "lt": ["less than {v}", "below {v}"],
        "ge": ["of at least {v}"],
        "le": ["of at most {v}"],
    },
}
_IS = {
    True: {"gt": "after {v}", "lt": "before {v}", "ge": "{v} or later", "le": "{v} or earlier"},
    False: {
        "gt": "greater than {v}",
        "lt": "less than {v}",
        "ge": "at least {v}",
        "le": "at most {v}",
    },
}


def _comparative_forms(np: Phrase, op: str, words: str, value: str, timed: bool) -> list[str]:
    t, a = np.text, _a(words)
    out = []
    for with_ in _WITH[timed][op]:
        c = with_.format(v=value)
        out += [
            f"Which of {t} have {a} {c}",
            f"Among {t}, which have {a} {c}",
            f"Name {t} with {a} {c}",
        ]
    out.append(f"List {t} whose {words} is {_IS[timed][op].format(v=value)}")
    return out


def _time_forms(np: Phrase, words: str, year: str) -> list[str]:
    t = np.text
    return [
        f"Which of {t} have {_a(words)} in {year}",
        f"Among {t}, which have their {words} in {year}",
        f"Name {t} whose {words} falls in {year}",
        f"Which of {t} had their {words} in {year}",
    ]


def constraint_operation(row: dict[str, Any]) -> str:
    """What a constraint walk's S-expression asks of its set, in words, for an LLM's question
    prompt ("count the entities of the set", "keep the one(s) with the largest release year",
    …). Raises ``ValueError`` when the S-expression is not one of the four shapes."""
    expr = read_sexpr(str(row.get("sexpr") or ""))
    op = expr[0] if isinstance(expr, tuple) and expr else None
    if op == "COUNT":
        return "count the entities of the set (the answer is that number)"
    if op in ("ARGMAX", "ARGMIN") and len(expr) == 3:
        most = "largest" if op == "ARGMAX" else "smallest"
        return f"keep the one(s) of the set with the {most} {_attribute_words(expr[2])}"
    if op == "AND" and len(expr) == 3 and isinstance(expr[2], tuple) and len(expr[2]) == 3:
        cmp, attr, atom = expr[2]
        value, is_date = _value_text(atom)
        words = _attribute_words(attr)
        timed = is_date or bool(_TIME_WORDS & set(words.split()))
        return f"keep those of the set whose {words} is {_IS[timed][cmp].format(v=value)}"
    if op == "TC" and len(expr) == 4:
        return f"keep those of the set whose {_attribute_words(expr[2])} falls in {expr[3]}"
    raise ValueError(f"sexpr: not a constraint expression ({op!r})")


def constraint_question(row: dict[str, Any], rng: random.Random | None = None) -> str:
    """A question for a constraint walk, its forms drawn from ``rng`` (the first of each
    without one). Raises ``ValueError`` when the row's S-expression is not one of the four
    constraint shapes."""
    pick = _Pick(rng)
    expr = read_sexpr(str(row.get("sexpr") or ""))
    if not isinstance(expr, tuple) or not expr:
        raise ValueError("sexpr: not a constraint expression")
    np, x, last = _base(row, pick)
    op = expr[0]
    if op == "COUNT":
        forms = _count_forms(np, x, last)
    elif op in ("ARGMAX", "ARGMIN") and len(expr) == 3:
        words = _attribute_words(expr[2])
        forms = _superlative_forms(np, op, words, bool(_TIME_WORDS & set(words.split())))
    elif op == "AND" and len(expr) == 3 and isinstance(expr[2], tuple) and len(expr[2]) == 3:
        cmp, attr, atom = expr[2]
        words = _attribute_words(attr)
        value, is_date = _value_text(atom)
        timed = is_date or bool(_TIME_WORDS & set(words.split()))
        forms = _comparative_forms(np, cmp, words, value, timed)
    elif op == "TC" and len(expr) == 4:
        forms = _time_forms(np, _attribute_words(expr[2]), expr[3])
    else:
        raise ValueError(f"sexpr: not a constraint expression ({op!r})")
    text = pick(forms)
    if rng is None:
        return f"{text[0].upper()}{text[1:]}?"
    return _sentence(text, rng)
