"""The ``template`` backend: offline, rule-based and deterministic.

It does not read the prompt; it writes from the structured row each task passes along
(``Request.task`` / ``Request.context``): questions from a walk's shape and relation names
(:mod:`kgsynth.llm.rule_questions`, paraphrase families seeded per walk), a short thought before
each oracle action (:func:`template_thought`), and a word-overlap order for a relation rerank
(:func:`rule_relation_order`). Every manifest of a corpus made this way says
``backend: template`` — these are templates, not a language model.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import Any

from kgsynth.llm.base import LLM, Completion, ProgressFn, Request
from kgsynth.llm.constraint_questions import CONSTRAINT_STRUCTURES, constraint_question
from kgsynth.llm.relation_forms import (
    Phrase,
    RelationForm,
    hop_forms,
    hop_gaps,
    hop_predicates,
    relation_form,
    relation_words,
)
from kgsynth.llm.rule_questions import (
    branch_phrase,
    conjunction_forms,
    frame_question,
    hop_phrase,
    paraphrase_question,
    path_question,
    shared_forms,
    walk_rng,
)


def question_from_walk(row: dict[str, Any], rng: random.Random | None = None) -> str:
    """The template question of a walk: a constraint walk's (count, superlative, comparative,
    time: :mod:`kgsynth.llm.constraint_questions`), else its path's
    (:func:`~kgsynth.llm.rule_questions.path_question`); canonical without ``rng``."""
    if row.get("structure") in CONSTRAINT_STRUCTURES:
        return constraint_question(row, rng)
    return path_question(row, rng)


def rule_relation_order(question: str, relations: Sequence[str]) -> list[int]:
    """The template backend's answer to a relation rerank (1-based numbers): relations with
    more of their words in the question first, ties in the given (BM25) order. A rule, not a
    model: it reads words, never meaning."""
    words = set(re.findall(r"[a-z0-9]+", question.lower()))

    def overlap(name: str) -> int:
        return len(words & set(re.findall(r"[a-z0-9]+", relation_words(name).lower())))

    ranked = sorted(range(len(relations)), key=lambda i: (-overlap(relations[i]), i))
    return [i + 1 for i in ranked]


def template_thought(
    kind: str,
    entity: str,
    hop: dict[str, Any] | None,
    answers: Sequence[str],
    relations: Sequence[str] = (),
    mistake: dict[str, str] | None = None,
) -> str:
    """The template backend's thought before an oracle action, for the trajectory synthesis of
    :mod:`kgsynth.synthesize.trajectories`. ``kind``: relations or triples (graphwalker,
    kgr1); types, patterns, execute or retry (knowcoder); node or sparql (isp); one of
    :data:`SEXPR_THOUGHTS` (sexpr); answer.
    ``relations``: the walk's relations, for a step that covers them all (a query, a pattern
    search); ``entity`` is the type name for ``types``; ``mistake`` (kind ``retry``, knowcoder
    trial and error): what the query before got wrong (kind, wrong and right relation, rows)."""
    # Short on purpose: every token of a thought is trained on, and a thought names only what
    # the next action uses (the entity it starts from, the relation it follows).
    if kind in ("relations", "check"):  # check: graphwalker's look-ahead (same action)
        return f"I list the relations of {entity}."
    if kind == "triples" and hop is not None:
        words = relation_words(hop["relation"])
        return f"The question asks for {words}: I follow {hop['relation']} from {entity}."
    if kind in SEXPR_THOUGHTS:  # KBQA-R1's actions (the sexpr tool set's oracle)
        return sexpr_thought(kind, entity, hop or {})
    words = " and ".join(dict.fromkeys(relation_words(r) for r in relations)) or "the question"
    if kind == "types":
        return f"The answers are of type {entity}: I look it up among the KG's types."
    if kind == "patterns":
        return f"I look for graph patterns around {entity} that match {words}."
    if kind == "node":
        return f"I explore the relations around {entity}."
    if kind in ("execute", "sparql"):
        return f"I query the KG from {entity}, following {', '.join(relations)}."
    if kind == "retry" and mistake:
        seen = "The query returned no rows" if mistake["rows"] == "0" else "Those rows do not fit"
        if mistake["kind"] == "direction":
            return f"{seen}: {mistake['right']} runs the other way. I reverse it and query again."
        return (
            f"{seen}: {mistake['wrong']} is the wrong relation. I query {mistake['right']} instead."
        )
    return "The facts I found answer the question."


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


def sexpr_thought(kind: str, entity: str, hop: dict[str, Any]) -> str:
    """The thought before one of KBQA-R1's actions (:data:`SEXPR_THOUGHTS`); ``hop`` holds
    the action's relation, ``op`` (argmax/argmin, lt/le/gt/ge) and ``value``."""
    relation = str(hop.get("relation") or "")
    op = str(hop.get("op") or "")
    return SEXPR_THOUGHTS[kind].format(
        entity=entity,
        relation=relation,
        words=relation_words(relation) if relation else "",
        extreme="largest" if op == "argmax" else "smallest",
        comparison=_COMPARISON_WORDS.get(op, op),
        value=hop.get("value", ""),
    )


class TemplateLLM(LLM):
    backend = "template"
    model = "rules-v3"

    @property
    def key_fields(self) -> dict[str, Any]:
        # In the manifest (and the cache key): questions are drawn from paraphrase families.
        return {**super().key_fields, "questions": "paraphrase families, seeded per walk"}

    def uses_context(self) -> bool:
        return True

    def _write(self, request: Request) -> str:
        ctx = request.context_dict()
        if request.task == "question":
            rng = walk_rng(request.params.seed, str(ctx["walk_id"]))
            return f"<question>{question_from_walk(ctx, rng)}</question>"
        if request.task == "thought":
            thought = template_thought(
                ctx["kind"],
                ctx["entity"],
                ctx.get("hop"),
                ctx.get("answers", []),
                ctx.get("relations", ()),
                ctx.get("mistake"),
            )
            return f"<think>{thought}</think>"
        if request.task == "rerank_relations":
            return f"<order>{json.dumps(rule_relation_order(ctx['question'], ctx['relations']))}</order>"
        raise ValueError(f"the template backend has no rule for task {request.task!r}")

    def generate_batch(
        self, requests: Sequence[Request], progress: ProgressFn | None = None
    ) -> list[Completion]:
        out = []
        for i, req in enumerate(requests):
            try:
                c = Completion(self._write(req), finish_reason="stop")
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                c = Completion("", error=f"template: {exc}")
            out.append(c)
            self.stats.add(c)
            if progress:
                progress(i, c)
        return out


__all__ = [
    "Phrase",
    "RelationForm",
    "TemplateLLM",
    "branch_phrase",
    "conjunction_forms",
    "frame_question",
    "hop_forms",
    "hop_gaps",
    "hop_phrase",
    "hop_predicates",
    "paraphrase_question",
    "question_from_walk",
    "relation_form",
    "relation_words",
    "rule_relation_order",
    "shared_forms",
    "template_thought",
    "walk_rng",
]
