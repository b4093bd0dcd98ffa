"""One benchmark question as kgsynth reads it (:class:`QARecord`): the record shape shared by
:mod:`kgsynth.datasets.qafiles` (MetaQA, JSONL, Parquet question files) and :mod:`kgsynth.datasets.benchmarks`
(WebQSP, CWQ, GrailQA, GraphQuestions). A leaf: it imports nothing of kgsynth."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class QARecord:
    """One benchmark question with its gold answers.

    ``question`` is the text with the ``[ ]`` around topic entities removed; ``raw_question``
    the text as in the file. ``line`` is the 1-based line (row for Parquet) it came from.
    ``structure`` and ``question_id`` come from JSONL/Parquet records that carry them
    (kgsynth's ``questions.parquet`` does); MetaQA text files have neither.

    Benchmark files (:mod:`kgsynth.datasets.benchmarks`) also fill ``answer_ids`` (parallel to
    ``answer_names``; None for a value answer), ``aliases`` (one list per answer),
    ``topic_ids`` (entity ids such as ``m.0abc``; CWQ gives topics by id only, so its
    ``topic_names`` is empty), the gold ``sparql`` and ``sexpr`` (GrailQA's S-expression), and
    ``source_format`` (``webqsp``, ``cwq``, ``grailqa``, ``graphq``); for them ``line`` is the
    question's 1-based position in the file. A benchmark question may have no topic entity
    (GrailQA's questions about a class or a value).
    """

    question: str
    raw_question: str
    topic_names: list[str]
    answer_names: list[str]
    qtype: str | None
    hops: int | None
    line: int
    structure: str | None = None
    question_id: str | None = None
    answer_ids: list[str | None] = field(default_factory=list)
    aliases: list[list[str]] = field(default_factory=list)
    topic_ids: list[str] = field(default_factory=list)
    sparql: str | None = None
    sexpr: str | None = None
    source_format: str | None = None
