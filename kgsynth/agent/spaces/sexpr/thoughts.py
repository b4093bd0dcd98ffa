"""KBQA-R1's template thoughts (:meth:`~kgsynth.agent.spaces.base.ActionSpace.thought`): one
per action of the sexpr tool set's oracle (:data:`SEXPR_THOUGHTS`), and for a trial-and-error
demonstration's guessed relation (``try``) and its fix (``retry``: :mod:`.trial`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kgsynth.llm.relation_forms import relation_words

SEXPR_THOUGHTS = {
    "find_relation": "The question asks for {words}: I follow {relation} from {entity}.",
    "merge": "Both conditions must hold: I keep what {entity} have in common.",
    "order": "The question asks for the {extreme} {words}: I order {entity} by {relation}.",
    "compare": "The question asks for {words} {comparison} {value}: I compare {relation} with "
    "{value}.",
    "time_constraint": "The question is about {value}: I keep the members of {entity} whose "
    "{words} falls in {value}.",
    "count": "The question asks how many: I count the members of {entity}.",
}
_COMPARISON_WORDS = {"lt": "below", "le": "at most", "gt": "above", "ge": "at least"}


def sexpr_thought(
    kind: str,
    entity: str,
    hop: dict[str, Any] | None,
    relations: Sequence[str],
    mistake: dict[str, str] | None,
) -> str | None:
    """The thought before one of KBQA-R1's actions (:data:`SEXPR_THOUGHTS`; None for another
    kind); ``hop`` holds the action's relation, ``op`` (argmax/argmin, lt/le/gt/ge) and
    ``value``."""
    hop = hop or {}
    if kind == "try":
        return f"I try {mistake['wrong'] if mistake else hop.get('relation', '')} from {entity}."
    if kind == "retry" and mistake:
        seen = (
            f"{entity} has no relation like {mistake['wrong']}"
            if mistake["kind"] == "rejected"
            else f"{mistake['wrong']} is not a relation of {entity}, and what ran instead does "
            "not fit"
        )
        return f"{seen}. {SEXPR_THOUGHTS['find_relation'].format(**_values(entity, hop))}"
    if kind not in SEXPR_THOUGHTS:
        return None
    return SEXPR_THOUGHTS[kind].format(**_values(entity, hop))


def _values(entity: str, hop: dict[str, Any]) -> dict[str, Any]:
    """What a :data:`SEXPR_THOUGHTS` template reads from an action's ``hop``."""
    relation = str(hop.get("relation") or "")
    op = str(hop.get("op") or "")
    return dict(
        entity=entity,
        relation=relation,
        words=relation_words(relation) if relation else "",
        extreme="largest" if op == "argmax" else "smallest",
        comparison=_COMPARISON_WORDS.get(op, op),
        value=hop.get("value", ""),
    )
