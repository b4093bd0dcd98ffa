"""One step of an oracle's gold action sequence (:mod:`kgsynth.synthesize.oracle` builds the
graphwalker and kgr1 ones, :mod:`kgsynth.synthesize.oracle_sparql` the knowcoder and isp ones)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OracleCall:
    # relations | triples (graphwalker, kgr1); types | patterns | execute (knowcoder);
    # node | sparql (isp: kgsynth.synthesize.oracle_sparql)
    kind: str
    call: str
    entity: str  # the entity the call is about (the type name for types)
    hop: dict[str, Any] | None
    relations: tuple[str, ...] = ()  # the walk's relations, for a call that covers them all
