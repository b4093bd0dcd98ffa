"""The ``template`` backend: offline, rule-based and deterministic.

It does not read the prompt; it writes from the structured row each task passes along
(``Request.task`` / ``Request.context``): questions from a walk's shape and relation names
(:mod:`kgsynth.llm.rule_questions`, paraphrase families seeded per walk), a short thought before
each oracle action (the action space's own, ``ActionSpace.thought``, which the oracle passes in
the request's context: this layer knows no space), and a word-overlap order for a relation
rerank (:func:`rule_relation_order`). Every manifest of a corpus made this way says
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
            if not isinstance(ctx.get("thought"), str):
                raise ValueError(
                    "a thought request's context carries no 'thought' (the oracle passes the "
                    "action space's: ActionSpace.thought)"
                )
            return f"<think>{ctx['thought']}</think>"
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
    "walk_rng",
]
