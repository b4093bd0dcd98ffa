"""Benchmark question files -> one record shape (:class:`QARecord`).

Shared by the question stage's contamination guard and by ``kgsynth eval``. Formats, chosen
by the file name (each may be gzipped, ``.gz``):

* ``.txt`` / ``.tsv`` — MetaQA: ``question<TAB>answer1|answer2|...`` with every topic entity
  in ``[...]``; or PathQuestion, told by its three fields (``question<TAB>answer(a1/a2/)<TAB>
  topic#r1#e1#…#<end>#answer``, the topic the path's first element, hops its relations). Answers are split on ``|`` only (names contain commas: "Washington, D.C.").
  An optional question-type file (``qa_dev_qtype.txt``: one type such as
  ``movie_to_director_to_movie_to_language`` per question, same order) gives ``qtype`` and
  ``hops`` (the number of ``_to_``); for ``<dir>/qa_<split>.txt`` it is found by itself as
  ``qa_<split>_qtype.txt`` in the same folder or the one above (MetaQA's ``vanilla/`` layout).
* ``.jsonl`` — one object per line: ``question``, ``answer_names`` (list), ``topic_names``
  (list or one string; when absent, the ``[...]`` spans of the question), optional ``qtype``,
  ``hops``, ``structure`` (a walk structure such as ``chain-2`` or ``2I``) and ``question_id``;
  other fields are ignored.
* ``.parquet`` — the same columns (kgsynth's ``questions.parquet`` is one).
* ``.json`` — a benchmark in its published format: WebQSP, CWQ, GrailQA or GraphQuestions,
  told apart by the JSON's shape (or named with ``format=``); read by :mod:`kgsynth.datasets.benchmarks`,
  with gold logical forms, answer ids and aliases, and topic entities by id.

Usage::

    records = read_questions("metaqa/1-hop/vanilla/qa_dev.txt")  # qtype file found by itself
    texts = read_question_texts(["qa_dev_1hop.txt", "qa_dev_2hop.txt"])
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from kgsynth.core.errors import InputFileError
from kgsynth.datasets.qarecord import QARecord

PathLike = str | Path

_BRACKETED = re.compile(r"\[([^\[\]]*)\]")
_SUPPORTED = (
    ".txt/.tsv (MetaQA: question<TAB>answer1|answer2|..., topic entity in [...]), "
    ".jsonl or .parquet (fields question, answer_names, optional topic_names/qtype/hops), "
    ".json (WebQSP, CWQ, GrailQA or GraphQuestions as published); each optionally gzipped (.gz)"
)


def strip_brackets(text: str) -> tuple[str, list[str]]:
    """``text`` with ``[X]`` replaced by ``X``, and the bracketed names in order."""
    names = [m.strip() for m in _BRACKETED.findall(text)]
    return _BRACKETED.sub(lambda m: m.group(1), text), names


def hops_of_qtype(qtype: str) -> int | None:
    """Hops of a MetaQA question type: ``actor_to_movie`` -> 1; None when it has no ``_to_``."""
    return qtype.count("_to_") or None


def read_questions(
    path: PathLike,
    *,
    qtype_file: PathLike | Literal[False] | None = None,
    limit: int | None = None,
    format: str | None = None,
) -> list[QARecord]:
    """Records of the question file ``path``, in file order (blank lines skipped).

    ``qtype_file`` (MetaQA text files only) names the question-type file; None looks for
    MetaQA's ``qa_<split>_qtype.txt`` beside the file or one folder up, False disables that.
    Its line count must equal the question count. ``limit`` keeps the first ``limit`` records.
    ``format`` names a benchmark format (``webqsp``, ``cwq``, ``grailqa``, ``graphq``; see
    :mod:`kgsynth.datasets.benchmarks`); a ``.json`` file's format is told from its shape without it.
    Raises :class:`InputFileError` naming file, line and field for any malformed entry.
    """
    path = Path(path)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 (got {limit})")
    kind = "json" if format else _format_of(path)
    if not path.is_file():
        raise InputFileError(path, "no such file")
    if kind == "json":
        from kgsynth.datasets.benchmarks import read_benchmark

        if qtype_file:
            raise InputFileError(qtype_file, "a qtype file goes with MetaQA .txt questions")
        return read_benchmark(path, format, limit=limit)
    if kind == "txt":
        if _is_pathquestion(path):
            if qtype_file:
                raise InputFileError(qtype_file, "a qtype file goes with MetaQA questions")
            return _read_pathquestion(path, limit)
        return _read_metaqa(path, qtype_file, limit)
    if qtype_file:
        raise InputFileError(
            qtype_file,
            f"a qtype file goes with MetaQA .txt questions, not {kind} "
            f"(put qtype in the {kind} records instead)",
        )
    rows = _jsonl_rows(path) if kind == "jsonl" else _parquet_rows(path)
    records: list[QARecord] = []
    for line, row in rows:
        if limit is not None and len(records) >= limit:
            break
        records.append(_record_from_mapping(path, line, row))
    return records


def read_question_texts(paths: PathLike | Iterable[PathLike]) -> list[str]:
    """The ``question`` texts (brackets removed) of one or several question files, in order."""
    if isinstance(paths, str | Path):
        paths = [paths]
    return [rec.question for p in paths for rec in read_questions(p, qtype_file=False)]


# --- formats -------------------------------------------------------------------------------


def _format_of(path: Path) -> Literal["txt", "jsonl", "parquet", "json"]:
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".json"):
        return "json"
    if name.endswith((".txt", ".tsv")):
        return "txt"
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    suffix = "".join(path.suffixes) or "(none)"
    raise InputFileError(
        path, f"unsupported question file extension {suffix}; supported: {_SUPPORTED}"
    )


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its end) of the non-blank lines."""
    lineno = 0
    # Lines are decoded one by one (not by a text wrapper, which decodes ahead in blocks) so
    # bad UTF-8 is reported on its own line.
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as exc:
                    raise InputFileError(path, f"not UTF-8 text ({exc.reason})", lineno) from None
                if lineno == 1:
                    line = line.removeprefix("\ufeff")
                if line.strip():
                    yield lineno, line
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise InputFileError(path, f"cannot read: {exc}", lineno or None) from None


def _discover_qtype(path: Path) -> Path | None:
    """MetaQA's ``qa_<split>_qtype.txt`` for ``qa_<split>.txt``, beside it or one folder up."""
    m = re.fullmatch(r"(qa_[^.]+?)\.(txt|tsv)(\.gz)?", path.name)
    if not m or m.group(1).endswith("_qtype"):
        return None
    for folder in (path.parent, path.parent.parent):
        for name in (f"{m.group(1)}_qtype.txt", f"{m.group(1)}_qtype.txt.gz"):
            if (folder / name).is_file():
                return folder / name
    return None


def _read_qtypes(path: Path) -> list[tuple[int, str]]:
    types = []
    for lineno, line in _lines(path):
        qtype = line.strip()
        if any(ch.isspace() for ch in qtype):
            raise InputFileError(path, f"qtype must be one word, got {qtype!r}", lineno)
        types.append((lineno, qtype))
    return types


def _is_pathquestion(path: Path) -> bool:
    """Whether a text file is PathQuestion's: its first line has three tab-separated fields,
    the last a ``topic#relation#entity…#<end>#answer`` path."""
    for _, line in _lines(path):
        fields = line.split("\t")
        return len(fields) == 3 and "#<end>#" in fields[2]
    return False


def _read_pathquestion(path: Path, limit: int | None) -> list[QARecord]:
    """PathQuestion (Zhou et al., COLING 2018): ``question<TAB>answer(a1/a2/…)<TAB>path``,
    the path ``topic#r1#e1#r2#…#answer#<end>#answer``; the topic entity is the path's first
    element and the question names it as written, so ``qtype`` is the relation path and
    ``hops`` its length."""
    records: list[QARecord] = []
    for lineno, line in _lines(path):
        if limit is not None and len(records) >= limit:
            break
        fields = line.split("\t")
        if len(fields) != 3:
            raise InputFileError(
                path, f"expected 3 tab-separated fields (question, answer(...), path), "
                f"found {len(fields)}", lineno
            )  # fmt: skip
        question, answer_field, route = (f.strip() for f in fields)
        if not question:
            raise InputFileError(path, "field question is empty", lineno)
        opened, closed = answer_field.find("("), answer_field.rfind(")")
        if opened < 0 or closed < opened:
            raise InputFileError(
                path, f"field answer is not name(a1/a2/...): {answer_field!r}", lineno
            )
        answers = [a.strip() for a in answer_field[opened + 1 : closed].split("/") if a.strip()]
        parts = route.split("#")
        if "<end>" not in parts or len(parts) < 4:
            raise InputFileError(
                path, f"field path has no topic#relation#…#<end>: {route!r}", lineno
            )
        relations = parts[1 : parts.index("<end>") : 2]
        if not answers:
            raise InputFileError(path, "field answer names no answer", lineno)
        records.append(
            QARecord(question, question, [parts[0]], answers, "#".join(relations),
                     len(relations), lineno)
        )  # fmt: skip
    return records


def _read_metaqa(
    path: Path, qtype_file: PathLike | Literal[False] | None, limit: int | None
) -> list[QARecord]:
    qpath: Path | None
    if qtype_file is None:
        qpath = _discover_qtype(path)
    else:
        qpath = Path(qtype_file) if qtype_file else None
    qtypes: list[tuple[int, str]] | None = None
    if qpath is not None:
        if not qpath.is_file():
            raise InputFileError(qpath, "no such qtype file")
        qtypes = _read_qtypes(qpath)

    records: list[QARecord] = []
    total = 0  # every question counts for the qtype check, also those past the limit
    for lineno, line in _lines(path):
        total += 1
        if limit is not None and len(records) >= limit:
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise InputFileError(
                path,
                f"expected 2 tab-separated fields (question<TAB>answer1|answer2|...), "
                f"found {len(fields)}",
                lineno,
            )
        raw, answers_field = fields[0].strip(), fields[1]
        if not raw:
            raise InputFileError(path, "field question is empty", lineno)
        question, topics = strip_brackets(raw)
        if not topics or not all(topics):
            raise InputFileError(
                path, "field question has no [topic entity] in square brackets", lineno
            )
        answers = [a.strip() for a in answers_field.split("|")]
        if not all(answers):
            raise InputFileError(
                path, f"field answers has an empty answer in {answers_field!r}", lineno
            )
        qtype = hops = None
        if qtypes is not None and len(records) < len(qtypes):
            qtype = qtypes[len(records)][1]
            hops = hops_of_qtype(qtype)
        records.append(QARecord(question, raw, topics, answers, qtype, hops, lineno))

    if qtypes is not None and len(qtypes) != total:
        raise InputFileError(
            qpath,
            f"has {len(qtypes)} question types but {path} has {total} questions; "
            "a qtype file lists one type per question, in the same order",
        )
    return records


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    for lineno, line in _lines(path):
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputFileError(
                path, f"invalid JSON: {exc.msg} (column {exc.colno})", lineno
            ) from None


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # Parquet needs random access, so a gzipped file is decompressed into memory.
        source: Any = (
            pa.BufferReader(gzip.decompress(path.read_bytes()))
            if path.name.endswith(".gz")
            else path
        )
        pf = pq.ParquetFile(source)
    except (OSError, pa.ArrowException) as exc:
        raise InputFileError(path, f"not a readable Parquet file: {exc}") from None
    names = set(pf.schema_arrow.names)
    missing = [c for c in ("question", "answer_names") if c not in names]
    if missing:
        raise InputFileError(
            path, f"missing column(s) {', '.join(missing)}; found {', '.join(sorted(names))}"
        )
    wanted = (
        "question",
        "topic_names",
        "answer_names",
        "qtype",
        "hops",
        "structure",
        "question_id",
    )
    columns = [c for c in wanted if c in names]
    row = 0
    for batch in pf.iter_batches(batch_size=8192, columns=columns):
        for item in batch.to_pylist():
            row += 1
            yield row, item


def _string_list(path: Path, line: int, field: str, value: Any, *, allow_str: bool) -> list[str]:
    if allow_str and isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        kind = "a list of strings or one string" if allow_str else "a list of strings"
        raise InputFileError(path, f"field {field} must be {kind}, got {value!r}", line)
    out = [v.strip() for v in value]
    if not all(out):
        raise InputFileError(path, f"field {field} has an empty name in {value!r}", line)
    return out


def _record_from_mapping(path: Path, line: int, row: Any) -> QARecord:
    if not isinstance(row, dict):
        raise InputFileError(path, f"expected a JSON object, got {type(row).__name__}", line)
    raw = row.get("question")
    if not isinstance(raw, str) or not raw.strip():
        raise InputFileError(path, f"field question must be a non-empty string, got {raw!r}", line)
    raw = raw.strip()
    question, bracketed = strip_brackets(raw)
    if "answer_names" not in row:
        raise InputFileError(path, "field answer_names is missing", line)
    answers = _string_list(path, line, "answer_names", row["answer_names"], allow_str=False)
    topics_value = row.get("topic_names")
    topics = (
        bracketed
        if topics_value is None
        else _string_list(path, line, "topic_names", topics_value, allow_str=True)
    )
    qtype = row.get("qtype")
    if qtype is not None and (not isinstance(qtype, str) or not qtype.strip()):
        raise InputFileError(path, f"field qtype must be a non-empty string, got {qtype!r}", line)
    hops = row.get("hops")
    if hops is None:
        hops = hops_of_qtype(qtype) if qtype else None
    elif isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
        raise InputFileError(path, f"field hops must be a non-negative integer, got {hops!r}", line)
    structure = row.get("structure")
    if structure is not None and (not isinstance(structure, str) or not structure.strip()):
        raise InputFileError(
            path, f"field structure must be a non-empty string, got {structure!r}", line
        )
    qid = row.get("question_id")
    if qid is not None:
        if isinstance(qid, bool) or not isinstance(qid, str | int) or not str(qid).strip():
            raise InputFileError(
                path, f"field question_id must be a non-empty string or integer, got {qid!r}", line
            )
        qid = str(qid).strip()
    return QARecord(
        question,
        raw,
        topics,
        answers,
        qtype.strip() if qtype else None,
        hops,
        line,
        structure.strip() if structure else None,
        qid,
        # kgsynth's questions.parquet carries the walk's SPARQL (ISP's rewards read it)
        sparql=row.get("sparql") if isinstance(row.get("sparql"), str) else None,
    )
