"""GraphWalker's predicate set P and seed set E from a benchmark file, for ``kgsynth walk
--relations-from FILE --seeds-from FILE`` (WebQSP, CWQ, GrailQA or GraphQuestions .json, read
by :mod:`kgsynth.benchmarks`): P is the relations the gold SPARQL uses (a two-edge path through
a Freebase CVT also as its flattened ``r1.r2`` hop), E the questions' topic entities, by id.
Both are kept to what the KG holds; what it lacks is logged, and nothing left is an error."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from kgsynth.benchmarks import benchmark_relations, benchmark_seed_ids
from kgsynth.errors import InputFileError
from kgsynth.kg.graph import KGGraph

log = logging.getLogger(__name__)


def benchmark_relation_set(
    path: str | Path, graph: KGGraph, known: Callable[[str], bool]
) -> set[str]:
    """The relation names of the benchmark's gold SPARQL that ``known`` says the KG has."""
    names = benchmark_relations(path, graph.profile.relation_name)
    present = {n for n in names if known(n)}
    if not present:
        shown = ", ".join(names[:5]) or "none"
        raise InputFileError(
            path,
            f"--relations-from: none of the {len(names)} relations its gold SPARQL uses is in "
            f"the KG (e.g. {shown})",
        )
    if len(present) < len(names):
        log.warning(
            "--relations-from: %d of %d relations of %s are not in the KG; walking the other %d",
            len(names) - len(present),
            len(names),
            path,
            len(present),
        )
    return present


def benchmark_seed_iris(path: str | Path, graph: KGGraph) -> list[str]:
    """The IRIs (sorted) of the benchmark's topic entities that are named entities of the KG."""
    ids = benchmark_seed_ids(path)
    iris = sorted({graph.profile.entity_iri(i) for i in ids})
    named = [iri for iri in iris if graph.label(iri) is not None]
    if not named:
        raise InputFileError(
            path,
            f"--seeds-from: none of its {len(iris)} topic entities is a named entity of the KG",
        )
    if len(named) < len(iris):
        log.warning(
            "--seeds-from: %d of %d topic entities of %s are not named entities of the KG",
            len(iris) - len(named),
            len(iris),
            path,
        )
    return named
