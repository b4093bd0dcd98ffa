"""GraphWalker's predicate set P and seed set E from a benchmark file, for ``kgsynth walk
--relations-from FILE --seeds-from FILE`` (WebQSP, CWQ, GrailQA or GraphQuestions .json, read
by :mod:`kgsynth.datasets.benchmarks`): P is the relations the gold SPARQL uses (a two-edge path through
a Freebase CVT also as its flattened ``r1.r2`` hop), E the questions' topic entities, by id.
Both are kept to what the KG holds; what it lacks is logged, and nothing left is an error."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from kgsynth.core.errors import InputFileError
from kgsynth.datasets.benchmarks import benchmark_relations, benchmark_seed_ids
from kgsynth.kg.graph import KGGraph

log = logging.getLogger(__name__)


def _kept(path: str | Path, flag: str, what: str, wanted: list[str], kept: list[str]) -> None:
    """Fail when the KG holds none of ``wanted`` (the benchmark's ``what``); log what it lacks."""
    if not kept:
        shown = ", ".join(wanted[:5]) or "none"
        raise InputFileError(
            path, f"{flag}: none of the {len(wanted)} {what} is in the KG (e.g. {shown})"
        )
    if len(kept) < len(wanted):
        log.warning(
            "%s: %d of %d %s of %s are not in the KG; walking the other %d",
            flag,
            len(wanted) - len(kept),
            len(wanted),
            what,
            path,
            len(kept),
        )


def benchmark_relation_set(
    path: str | Path, graph: KGGraph, known: Callable[[str], bool]
) -> set[str]:
    """The relation names of the benchmark's gold SPARQL that ``known`` says the KG has."""
    names = list(benchmark_relations(path, graph.profile.relation_name))
    present = [n for n in names if known(n)]
    _kept(path, "--relations-from", "relations its gold SPARQL uses", names, present)
    return set(present)


def benchmark_seed_iris(path: str | Path, graph: KGGraph) -> list[str]:
    """The IRIs (sorted) of the benchmark's topic entities that are named entities of the KG."""
    iris = sorted({graph.profile.entity_iri(i) for i in benchmark_seed_ids(path)})
    named = [iri for iri in iris if graph.label(iri) is not None]
    _kept(path, "--seeds-from", "topic entities", iris, named)
    return named
