"""One step of an oracle's gold action sequence (:mod:`kgsynth.agent.spaces.paths` builds the
graphwalker and kgr1 ones, :mod:`kgsynth.agent.spaces.sparql_oracle` the knowcoder and isp ones),
and the oracle's answer (:func:`oracle_answers`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kgsynth.metrics import normalize_answer

TRIAL_MODE = "oracle_trial"
"""The ``mode`` of a trial-and-error trajectory (a space's ``trial``: knowcoder, sexpr and the
path spaces)."""


def trial_rng(seed: int, question_id: str) -> random.Random:
    """The seeded draw of one question: whether it gets a trial, and which mistake."""
    return random.Random(f"trial-and-error|{seed}|{question_id}")


@dataclass(frozen=True)
class OracleCall:
    # relations | triples (graphwalker, kgr1); types | patterns | execute (knowcoder);
    # node | sparql (isp: kgsynth.agent.spaces.sparql_oracle); retry (oracle_trial); check
    # (graphwalker with --look-ahead: the relations of an answer, listed before answering)
    kind: str
    call: str
    entity: str  # the entity the call is about (the type name for types)
    hop: dict[str, Any] | None
    relations: tuple[str, ...] = ()  # the walk's relations, for a call that covers them all
    # try / retry (trial and error): what the attempt got wrong (kind, wrong, right, ...), for
    # the thoughts; kgsynth.agent.spaces.knowcoder.trial, kgsynth.agent.spaces.sexpr.trial
    mistake: dict[str, str] | None = None


def oracle_answers(
    row: dict[str, Any], observed: Sequence[str], *, fallback: bool = True
) -> list[str]:
    """The oracle's answer: the gold answers its observations showed, in the order and spelling
    they were first shown (so the answer copies the observation line by line, whatever order
    the tools list neighbours in), or the whole gold set when none was shown. A display cap or
    a replay through one of several entities can show only part of the set; the filter's
    outcome check then decides."""
    gold = {normalize_answer(a) for a in row["answer_names"]}
    shown: dict[str, str] = {}
    for name in observed:
        key = normalize_answer(name)
        if key in gold and key not in shown:
            shown[key] = name
    return list(shown.values()) or (list(row["answer_names"]) if fallback else [])
