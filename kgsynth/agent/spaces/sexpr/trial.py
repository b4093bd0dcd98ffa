"""Trial-and-error demonstrations for KBQA-R1's action space (``sexpr``): a relation guessed
wrong, the relation gate's answer (RRCG, :mod:`.gate`), and the gold action after it.

KBQA-R1 gates a written relation against the relations actually there (§IV-A3) so that the
agent can correct itself from the observation: a rejected relation lists every candidate with
its similarity, a tentative one runs the best match and lists the top candidates. An oracle
replay never guesses, so a policy trained on replays alone has never read either observation
and never corrected a guess (what kgsynth's tiny policy did: ``Find_relation [ Adam Arkin | (R
has_genre) ]``, rejected with ``starred_actors`` listed, then no correction). Like KnowCoder-A1's
trial-and-error demonstrations (:mod:`kgsynth.agent.spaces.knowcoder.trial`), a seeded share of
questions gets a second trajectory in which one ``Find_relation`` of the gold sequence is
first written with a wrong relation:

- the wrong relations are the ones the replay's own observations list (``Relations of
  expressionK (…): …``), in both directions, other than the gold step's relation: relations of
  this KG a reader of the episode has seen, tried in a seeded order;
- a try counts when the gate rejects it (``relation_not_found``: nothing runs) or
  substitutes tentatively (with its note) a relation whose results differ from the gold
  step's; a try the gate corrects into the gold results, and one along a relation the operand
  has (it runs as written, and only the question says it is wrong), are passed over;
- the gold action follows (kind ``retry``, its ``mistake`` says what the gate answered), and
  the rest of the gold sequence after it, with its ``expressionN`` references moved up by one
  when the wrong try made an expression; the trajectory must still end on the gold answers.

A question none of whose tries goes wrong gets no trial trajectory. This is a departure from
KBQA-R1, whose warm start samples a strong LLM with references (§IV-B) and keeps what it got
right: the template backend has no LLM that guesses, so the guess is scripted.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from typing import Any

from kgsynth.agent.spaces.observed import Observed
from kgsynth.agent.spaces.oracle_call import OracleCall
from kgsynth.agent.spaces.sexpr.drills import observed_line
from kgsynth.agent.spaces.sexpr.oracle import check_answers
from kgsynth.agent.spaces.sexpr.syntax import parse_action, reverse_inner
from kgsynth.agent.spaces.sexpr.tools import TENTATIVE_NOTE
from kgsynth.agent.toolkit import ErrorType, ToolResult
from kgsynth.agent.tools import ToolEnvironment
from kgsynth.core.stage import Reject

MAX_TRIES = 6
"""Wrong relations tried for one question before it is given up."""

Step = tuple[OracleCall, ToolResult]

_EXPRESSION = re.compile(r"\bexpression(\d+)\b")


def _bare(form: str) -> str:
    """``directed_by`` for ``(R directed_by)`` and ``directed_by``."""
    return reverse_inner(form) or form.strip()


def listed_relations(steps: list[Step]) -> list[str]:
    """Every relation the replay's observations list (``Relations of expressionK (…): …``),
    each written both ways, in the order first shown."""
    seen = Observed()
    for _, result in steps:
        for line in result.text.splitlines():
            observed_line(line, seen)
    found: dict[str, None] = {}
    for form in seen.relations:
        name = _bare(form)
        if name:
            found.setdefault(name, None)
            found.setdefault(f"(R {name})", None)
    return list(found)


def shifted(call: OracleCall, after: int) -> OracleCall:
    """``call`` with every ``expressionN`` for N > ``after`` written ``expression(N+1)``."""

    def move(text: str) -> str:
        return _EXPRESSION.sub(
            lambda m: f"expression{int(m.group(1)) + (int(m.group(1)) > after)}", text
        )

    return replace(call, call=move(call.call), entity=move(call.entity))


def _outcome(expr: Any) -> tuple[frozenset[str], int, int | None]:
    return frozenset(t.value for t in expr.members), expr.total, expr.count


def _attempt(
    row: dict[str, Any],
    env: ToolEnvironment,
    steps: list[Step],
    log: tuple[Any, ...],
    at: int,
    wrong: str,
) -> list[Step] | None:
    """The steps with a wrong try of step ``at`` along ``wrong`` before the gold one, or None
    when the try is no mistake or the sequence after it does not reach the gold answers.
    ``log``: the replay's expressions (one a step)."""
    gold = steps[at][0]
    operand = parse_action(gold.call).args[0]
    env.session.restore(log[:at])
    call = f"Find_relation [ {operand} | {wrong} ]"
    tried = env.execute(call)
    made = len(env.session.expressions) > at
    if made and (
        tried.error is not None
        or not any(TENTATIVE_NOTE in n for n in tried.notes)  # it has the relation: no signal
        or _outcome(env.session.expressions[at]) == _outcome(log[at])  # the gate found gold's
    ):
        return None
    if not made and tried.error is not ErrorType.RELATION_NOT_FOUND:
        return None
    note = {"kind": "substituted" if made else "rejected", "wrong": wrong}
    out: list[Step] = [
        *steps[:at],
        (OracleCall("try", call, gold.entity, gold.hop, mistake=note), tried),
    ]
    for k, (c, _) in enumerate(steps[at:]):
        c = shifted(c, at) if made else c
        if k == 0:
            c = replace(c, kind="retry", mistake=note)
        result = env.execute(c.call)
        if result.error is not None:
            return None
        out.append((c, result))
    check_answers(row, env)  # Reject: the caller passes this try over
    return out


def trial_steps(
    row: dict[str, Any], env: ToolEnvironment, steps: list[Step], rng: random.Random
) -> list[Step] | None:
    """The gold replay ``steps`` with one ``Find_relation`` first tried along a wrong relation
    (module doc), or None when none of the first :data:`MAX_TRIES` tries goes wrong. ``env``
    holds the replay's expressions, one a step, and is left holding them."""
    if env.session is None or len(env.session.expressions) != len(steps):
        return None
    log = env.session.snapshot()
    forms = listed_relations(steps)
    tries = []
    for at, (c, _) in enumerate(steps):
        if c.kind == "find_relation":
            right = _bare(str((c.hop or {}).get("relation", "")))
            tries.extend((at, f) for f in forms if _bare(f) != right)
    rng.shuffle(tries)
    try:
        for at, wrong in tries[:MAX_TRIES]:
            try:
                found = _attempt(row, env, steps, log, at, wrong)
            except Reject:
                found = None
            if found is not None:
                return found
        return None
    finally:
        env.session.restore(log)
