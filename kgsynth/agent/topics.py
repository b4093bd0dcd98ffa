"""The order of a question's topic entities: the order the question names them.

The user prompt lists the topics so (:func:`~kgsynth.agent.prompt.user_prompt`), and every
space's oracle replays a conjunction's branches so (:func:`in_mention_order`, applied by
:func:`kgsynth.agent.spaces.oracle_calls`, :func:`~kgsynth.agent.spaces.reference_text` and the
oracle of ``synthesize trajectories``): the agent learns to start where the question starts, a
rule it can read in any question at eval time. (Run AE's oracle took a PI walk's shorter branch
first while the prompt listed the walk's first topic first; PI questions fell from 0.17 to
0.06 Hits@1: benchmarks/README.md, "Large answer sets and conjunctions".)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# the walk's lists that run parallel to its topics (one entry per branch)
BRANCH_KEYS = ("topic_names", "topic_ids", "branches", "merge_at")


def mention_order(question: str, names: Sequence[str]) -> list[int]:
    """The indices of ``names`` in the order ``question`` first names them (case aside); the
    names it does not hold after those, in their own order."""
    text = question.lower()
    at = [text.find(n.lower()) if n else -1 for n in names]
    return sorted(range(len(names)), key=lambda i: (at[i] < 0, max(at[i], 0), i))


def in_mention_order(row: dict[str, Any]) -> dict[str, Any]:
    """A question row whose topics (and the branches that start from them) are in the order
    its question names them: the order the user prompt lists them in and the oracle replays
    a conjunction's branches in, so the agent learns to start where the question does."""
    names = list(row.get("topic_names") or ())
    order = mention_order(str(row.get("question") or ""), names)
    if order == list(range(len(names))):
        return row
    out = dict(row)
    for key in BRANCH_KEYS:
        values = row.get(key)
        if values is not None and len(values) == len(names):
            out[key] = [values[i] for i in order]
    return out


__all__ = ["BRANCH_KEYS", "in_mention_order", "mention_order"]
