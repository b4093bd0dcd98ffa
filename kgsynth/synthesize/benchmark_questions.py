"""A benchmark file as the questions of ``synthesize trajectories`` (issue 18, part 5): WebQSP,
CWQ, GrailQA or GraphQuestions questions (:mod:`kgsynth.datasets.benchmarks`) become question rows the
oracle, Referenced Rejection Sampling and free rollouts run on, so expert trajectories can be
sampled on a benchmark's train split with its gold logical forms as references::

    kgsynth synthesize trajectories --questions grailqa_train.json --kg KG --toolset sexpr \\
        --mode referenced --llm openai --model M --samples 4 --out t.parquet

What each row carries depends on what the mode needs:

- ``free``: the question, its topic entities (named from the KG when given by id only: CWQ)
  and its gold answers; every question with a topic entity and an answer is kept.
- ``oracle`` / ``referenced`` with ``--toolset sexpr``: the question's S-expression (GrailQA's and
  GraphQuestions' ``s_expression``), else the walk built from its SPARQL when that is a path or
  a conjunction; the sexpr oracle writes the actions from either.
- ``oracle`` / ``referenced`` with ``--toolset graphwalker|kgr1``: the walk built from its gold
  SPARQL (:func:`~kgsynth.synthesize.benchmark_refs.benchmark_walk_row`).

A question that cannot be used is left out and counted by reason (``no_topic_entity``,
``no_answer``, ``benchmark_<kind>`` for SPARQL that is not a path: ordering, aggregate,
class_constraint, …; ``no_reference`` for other tool sets), which the stage's manifest reports.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from kgsynth.agent.spaces.registry import space
from kgsynth.datasets.qafiles import QARecord
from kgsynth.kg.graph import KGGraph
from kgsynth.synthesize.benchmark_refs import NotAPath, benchmark_walk_row

BENCHMARK_SUFFIXES = (".json", ".json.gz")


def is_benchmark_file(path: str | Path) -> bool:
    """True for a benchmark's JSON file (read by :mod:`kgsynth.datasets.benchmarks`)."""
    return str(path).endswith(BENCHMARK_SUFFIXES)


def _topics(rec: QARecord, graph: KGGraph) -> tuple[list[str], list[str]]:
    """Topic names and ids; ids without names are named from the KG (an id it does not name
    is left out)."""
    names, ids = list(rec.topic_names), list(rec.topic_ids)
    if not names and ids:
        pairs = [(graph.label(graph.profile.entity_iri(i)), i) for i in ids]
        names = [n for n, _ in pairs if n]
        ids = [i for n, i in pairs if n]
    return names, ids


def _base_row(rec: QARecord, names: list[str], ids: list[str]) -> dict[str, Any]:
    qid = rec.question_id or f"{rec.source_format or 'q'}-{rec.line}"
    return {
        "question_id": qid,
        "walk_id": qid,
        "question": rec.question,
        "topic_names": names,
        "topic_ids": ids,
        "answer_names": list(rec.answer_names),
        "answer_ids": [i or "" for i in (rec.answer_ids or [])],
        "structure": rec.structure or rec.qtype or (rec.source_format or "benchmark"),
        "hops": rec.hops or 0,
        "branches": [],
        "merge_at": [],
        "sparql": rec.sparql or "",
        "sexpr": rec.sexpr or "",
    }


def benchmark_question_rows(
    records: list[QARecord], graph: KGGraph, toolset: str, mode: str
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The question rows of ``records`` for ``mode`` and ``toolset`` (module doc), and how many
    questions were left out, by reason."""
    rows: list[dict[str, Any]] = []
    left_out: Counter[str] = Counter()
    for rec in records:
        names, ids = _topics(rec, graph)
        if not rec.answer_names:
            left_out["no_answer"] += 1
            continue
        base = _base_row(rec, names, ids)
        actions = space(toolset)
        if mode == "free" or (actions.reads_sexpr and rec.sexpr):
            if not names and mode == "free":
                left_out["no_topic_entity"] += 1
                continue
            rows.append(base)
            continue
        if not (actions.oracle_from == "walk" or actions.reads_sexpr):
            left_out["no_reference"] += 1
            continue
        try:
            walk = benchmark_walk_row(rec, graph)
        except NotAPath as exc:
            left_out[f"benchmark_{exc.kind}"] += 1
            continue
        rows.append({**base, **walk, "question_id": base["question_id"], "sexpr": ""})
    return rows, left_out
