"""The ``template`` backend: offline, rule-based and deterministic.

It does not read the prompt; it writes from the structured row each task passes along
(``Request.task`` / ``Request.context``). Questions are composed from relation names and the
walk's shape, with intermediate entities never mentioned. Every manifest of a corpus made this
way says ``backend: template`` — these are templates, not a language model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kgsynth.llm.base import LLM, Completion, ProgressFn, Request


def relation_words(relation: str) -> str:
    """``film.film.directed_by`` / ``has_genre`` / ``P57`` -> plain words."""
    last = relation.split(".")[-1] if "." in relation else relation
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", last).replace("_", " ").strip().lower()
    return re.sub(r"^(has|is|in) ", "", words) or relation


def hop_phrase(noun_phrase: str, relation: str, inverse: bool) -> str:
    """A noun phrase for what is one hop from ``noun_phrase``.

    Forward ``X r ?``: "the genre of X"; forward ``X directed_by ?``: "the one X was
    directed by". Inverse ``? r X``: "the things whose genre is X" / "the things directed by X".
    """
    words = relation_words(relation)
    passive = relation.split(".")[-1].endswith("_by") or words.endswith(" by")
    if passive:
        return (
            f"the things {words} {noun_phrase}" if inverse else f"the one {noun_phrase} was {words}"
        )
    if inverse:
        verb = "include" if words.endswith("s") else "is"
        return f"the things whose {words} {verb} {noun_phrase}"
    return f"the {words} of {noun_phrase}"


def branch_phrase(topic: str, hops: Sequence[dict[str, Any]]) -> str:
    phrase = topic
    for hop in hops:
        phrase = hop_phrase(phrase, hop["relation"], bool(hop["inverse"]))
    return phrase


def question_from_walk(row: dict[str, Any]) -> str:
    """A question for a walk (chain, 2I, IP or PI) naming topics and relations only."""
    topics, branches, merge_at = row["topic_names"], row["branches"], row["merge_at"]
    if len(branches) == 1:
        phrase = branch_phrase(topics[0], branches[0])
        return f"{'What are' if phrase.startswith('the things') else 'What is'} {phrase}?"
    first = branch_phrase(topics[0], branches[0][: merge_at[0]])
    second = branch_phrase(topics[1], branches[1][: merge_at[1]])
    meet = f"the one that is both {first} and {second}"
    tail = branches[0][merge_at[0] :]
    if not tail:
        return f"What is both {first} and {second}?"
    phrase = branch_phrase(meet, tail)
    return f"{'What are' if phrase.startswith('the things') else 'What is'} {phrase}?"


class TemplateLLM(LLM):
    backend = "template"
    model = "rules-v1"

    def uses_context(self) -> bool:
        return True

    def _write(self, request: Request) -> str:
        ctx = request.context_dict()
        if request.task == "question":
            return f"<question>{question_from_walk(ctx)}</question>"
        if request.task == "thought":
            from kgsynth.synthesize.trajectories import template_thought

            return f"<think>{template_thought(ctx['kind'], ctx['entity'], ctx.get('hop'), ctx.get('answers', []))}</think>"
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
