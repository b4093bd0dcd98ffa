"""GraphWalker's LLM relation rerank (its Table 8 setting): the BM25 top-20 relations of an
entity, reordered by an LLM, before the tool keeps its top k.

:class:`LLMReranker` is what :class:`~kgsynth.agent.tools.ToolEnvironment` calls when a tool
config says ``rerank="llm"``. The LLM sees the question, the entity and the candidates as
numbered patterns (``prompts/rerank_relations.j2``) and answers ``<order>[3, 1, 2]</order>``.
Numbers it leaves out keep their BM25 order after the ones it named; a reply that does not
parse (or an LLM error) keeps the BM25 order, and is counted in :attr:`LLMReranker.stats`.
Calls go through the LLM layer (its persistent cache where the stage has one) and are
memoized per (question, entity, candidates), so a rollout that lists one entity twice asks
once.

The offline ``template`` backend answers with a rule (relations whose words appear in the
question first), so the chain runs without a model; it is no LLM and says so in manifests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from kgsynth.agent.tools import relation_pattern
from kgsynth.kg.graph import Relation
from kgsynth.llm.base import LLM, GenerationParams, Request
from kgsynth.prompts import render

RERANK_CANDIDATES = 20  # GraphWalker: the BM25 top 20 go to the LLM
_ORDER = re.compile(r"<order>\s*(\[.*?\])\s*</order>", re.DOTALL)


def parse_order(text: str, n: int) -> list[int] | None:
    """0-based candidate indices from ``<order>[…]</order>`` (1-based numbers, each once, out
    of range ones dropped); None when there is no parsable list."""
    m = _ORDER.search(text)
    if m is None:
        return None
    try:
        values = json.loads(m.group(1))
    except ValueError:
        return None
    if not isinstance(values, list):
        return None
    order: list[int] = []
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= n and v - 1 not in order:
            order.append(v - 1)
    return order


@dataclass
class RerankStats:
    calls: int = 0
    memo_hits: int = 0
    unparsed: int = 0  # replies without a usable order (BM25 order kept)
    errors: int = 0  # LLM errors (BM25 order kept)


@dataclass
class LLMReranker:
    """Reorders BM25-ranked relations with an LLM (see the module doc)."""

    llm: LLM
    candidates: int = RERANK_CANDIDATES
    max_tokens: int = 128
    stats: RerankStats = field(default_factory=RerankStats)
    _memo: dict[tuple[str, str, tuple[str, ...]], list[int]] = field(default_factory=dict)

    def request(
        self, question: str, entity: str, head: Sequence[Relation], lines: Sequence[str]
    ) -> Request:
        """The rerank prompt for ``head``, shown as ``lines`` (their patterns)."""
        prompt = render("rerank_relations", question=question, entity=entity, candidates=lines)
        return Request.make(
            [{"role": "user", "content": prompt}],
            GenerationParams(temperature=0.0, max_tokens=self.max_tokens),
            task="rerank_relations",
            context={"question": question, "relations": [r.name for r in head]},
        )

    def __call__(self, question: str, entity: str, ranked: Sequence[Relation]) -> list[Relation]:
        head = list(ranked[: self.candidates])
        if len(head) < 2:
            return list(ranked)
        lines = tuple(relation_pattern(entity, r) for r in head)
        key = (question, entity, lines)
        order = self._memo.get(key)
        if order is None:
            self.stats.calls += 1
            completion = self.llm.generate_batch([self.request(question, entity, head, lines)])[0]
            parsed = None
            if completion.error:
                self.stats.errors += 1
            else:
                parsed = parse_order(completion.text, len(head))
                if parsed is None:
                    self.stats.unparsed += 1
            order = parsed or []
            self._memo[key] = order
        else:
            self.stats.memo_hits += 1
        rest = [i for i in range(len(head)) if i not in order]
        return [head[i] for i in [*order, *rest]] + list(ranked[self.candidates :])


__all__ = ["RERANK_CANDIDATES", "LLMReranker", "RerankStats", "parse_order"]
