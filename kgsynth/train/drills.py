"""Copy drills: short conversations that exercise the one skill a model trained from scratch lacks.

A pretrained LLM arrives able to copy a string it has read; a tiny model built from a config
does not, and until it can, every tool call and answer it writes is a fragment of a name. The
agent trajectories teach copying slowly (a few copied names among hundreds of tokens), so the
tiny recipe mixes in drills made from the names of the training corpus itself — the entities of
its observations — each a few dozen tokens whose assistant turn is nothing but copies, in the
forms the agent uses::

    user:      Names: Kismet; Vincente Minnelli
    assistant: <answer>["Kismet", "Vincente Minnelli"]</answer>

    user:      <information>(Kismet, directed_by, Vincente Minnelli)</information>
    assistant: <answer>["Vincente Minnelli"]</answer>

    user:      Topic entities: Kismet
    assistant: <kg-query>get_relations("Kismet")</kg-query>

Drills carry their own system line (``DRILL_SYSTEM``), so they never pose as agent episodes and
the checkpoint's stored agent prompt stays the trajectories' one. Only the corpus is read: no
evaluation question or answer is involved.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence

DRILL_SYSTEM = "Copy the names exactly as they are written."
_TRIPLE = re.compile(r"^\((.+), ([^\s,()]+), (.+)\)$")


def corpus_names(conversations: Sequence[Sequence[dict[str, str]]]) -> list[str]:
    """Entity names shown in the corpus's observations (triples), first-seen order."""
    seen: dict[str, None] = {}
    for conv in conversations:
        for m in conv:
            if m["role"] != "tool":
                continue
            for line in m["content"].splitlines():
                line = re.sub(r"</?information>", "", line).strip()
                t = _TRIPLE.match(line)
                if not t:
                    continue
                for name in (t.group(1), t.group(3)):
                    if name != "?" and '"' not in name and name.strip() == name:
                        seen.setdefault(name, None)
    return list(seen)


def _relations(conversations: Sequence[Sequence[dict[str, str]]]) -> list[str]:
    rels: dict[str, None] = {}
    for conv in conversations:
        for m in conv:
            if m["role"] == "tool":
                for line in m["content"].splitlines():
                    t = _TRIPLE.match(re.sub(r"</?information>", "", line).strip())
                    if t:
                        rels.setdefault(t.group(2), None)
    return list(rels) or ["related_to"]


def _q(names: Sequence[str]) -> str:
    return json.dumps(list(names), ensure_ascii=False)


def copy_drills(
    conversations: Sequence[Sequence[dict[str, str]]], n: int, seed: int = 0
) -> list[list[dict[str, str]]]:
    """``n`` drill conversations built from the corpus's own entity names (none if it shows
    fewer than two names)."""
    names = corpus_names(conversations)
    if n <= 0 or len(names) < 2:
        return []
    rels = _relations(conversations)
    rng = random.Random(f"copy-drills|{seed}")
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            picked = rng.sample(names, min(len(names), rng.randint(1, 4)))
            user = "Names: " + "; ".join(picked)
            reply = f"<answer>{_q(picked)}</answer>"
        elif kind == 1:
            head = rng.choice(names)
            rel = rng.choice(rels)
            tails = rng.sample(names, min(len(names), rng.randint(1, 4)))
            lines = "\n".join(f"({head}, {rel}, {t})" for t in tails)
            user = f"<information>{lines}</information>"
            reply = f"<answer>{_q(tails)}</answer>"
        else:
            topic = rng.choice(names)
            user = f"Topic entities: {topic}"
            if rng.random() < 0.5:
                reply = (
                    f"<kg-query>get_relations({json.dumps(topic, ensure_ascii=False)})</kg-query>"
                )
            else:
                rel = rng.choice(rels)
                reply = (
                    f"<kg-query>get_triples({json.dumps(topic, ensure_ascii=False)}, "
                    f"{_q([rel])})</kg-query>"
                )
        out.append(
            [
                {"role": "system", "content": DRILL_SYSTEM},
                {"role": "user", "content": user},
                {"role": "assistant", "content": reply},
            ]
        )
    return out
