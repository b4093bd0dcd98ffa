"""One step of an oracle's gold action sequence (:mod:`kgsynth.synthesize.oracle` builds the
graphwalker and kgr1 ones, :mod:`kgsynth.synthesize.oracle_sparql` the knowcoder and isp ones)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OracleCall:
    # relations | triples (graphwalker, kgr1); types | patterns | execute (knowcoder);
    # node | sparql (isp: kgsynth.synthesize.oracle_sparql); retry (oracle_trial); check
    # (graphwalker with --look-ahead: the relations of an answer, listed before answering)
    kind: str
    call: str
    entity: str  # the entity the call is about (the type name for types)
    hop: dict[str, Any] | None
    relations: tuple[str, ...] = ()  # the walk's relations, for a call that covers them all
    # retry (knowcoder trial and error): what the attempt before got wrong (kind, wrong,
    # right, rows), for its thought; kgsynth.synthesize.oracle_trial
    mistake: dict[str, str] | None = None
