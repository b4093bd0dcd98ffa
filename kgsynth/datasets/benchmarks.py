"""KBQA benchmark files in their published formats -> :class:`~kgsynth.datasets.qafiles.QARecord`.

Four formats, each a JSON file as its authors release it (optionally gzipped):

* ``webqsp`` — WebQSP (Yih et al., 2016): ``{"Version": …, "Questions": [{"QuestionId",
  "RawQuestion", "ProcessedQuestion", "Parses": [{"ParseId", "Sparql", "TopicEntityMid",
  "TopicEntityName", "InferentialChain", "Constraints", "Answers": [{"AnswerType",
  "AnswerArgument", "EntityName"}]}]}]}``. The first parse gives the gold SPARQL, topic entity
  and answers (``AnswerType`` ``Entity``: the MID and its name; ``Value``: the value itself).
* ``cwq`` — ComplexWebQuestions (Talmor & Berant, 2018): a list of ``{"ID", "question",
  "webqsp_ID", "machine_question", "sparql", "answers": [{"answer", "answer_id",
  "aliases"}], "compositionality_type", …}``. CWQ names no topic entity: its topics are the
  entities of the gold SPARQL, by id (:func:`kgsynth.datasets.bench_sparql.entity_constants`).
* ``grailqa`` — GrailQA (Gu et al., 2021): a list of ``{"qid", "question", "answer":
  [{"answer_type", "answer_argument", "entity_name"}], "function", "num_node", "num_edge",
  "graph_query": {"nodes": [{"nid", "node_type", "id", "class", "friendly_name",
  "question_node", "function"}], "edges": […]}, "sparql_query", "domains", "level",
  "s_expression"}``. Topic entities are the graph query's ``entity`` nodes; a question may
  have none. The public test file has only ``qid`` and ``question``: its records have no gold.
* ``graphq`` — GraphQuestions (Su et al., 2016) as released: ``qid``, ``question``, ``answer``
  (names), optional ``answer_mid`` (ids, parallel to ``answer``), ``function``,
  ``commonness``, ``num_node``, ``num_edge``, ``graph_query``, ``sparql_query``; or its
  GrailQA-style conversion used by later work (answers as GrailQA's objects, ``s_expression``).

:func:`read_benchmark` tells the format from the JSON's shape (CWQ: ``webqsp_ID``/``ID`` with
``answers``; GraphQ: answers as strings, ``answer_mid`` or ``commonness``, or a file named
``graphquestions*``; GrailQA: ``qid`` with answer objects) unless it is named. Malformed
entries raise :class:`~kgsynth.core.errors.InputFileError` naming the file, the question (position
and id) and the field. :func:`benchmark_seed_ids` and :func:`benchmark_relations` derive
GraphWalker's seed set E (topic entities by id) and predicate set P (the relations of the gold
SPARQL) from a benchmark file::

    records = read_benchmark("WebQSP.test.json")             # format told from the shape
    seeds = benchmark_seed_ids("grailqa_v1.0_dev.json")        # ["m.0fpx6h", ...]
    relations = benchmark_relations("WebQSP.train.json", profile.relation_name)
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from kgsynth.core.errors import InputFileError
from kgsynth.datasets.bench_sparql import (
    SparqlSyntaxError,
    entity_constants,
    parse_sparql,
    predicate_paths,
)
from kgsynth.datasets.qarecord import QARecord
from kgsynth.metrics import entity_id

log = logging.getLogger(__name__)

FORMATS = ("webqsp", "cwq", "grailqa", "graphq")
_FORMS = "webqsp, cwq, grailqa or graphq"
_KIND_NAMES = {
    str: "a string",
    list: "a list",
    dict: "an object",
    int: "an integer",
    float: "a number",
}


class _Question:
    """Where one question is, for error messages: its position and id."""

    def __init__(self, path: Path, index: int, id_field: str, entry: Any) -> None:
        self.path, self.index = path, index
        qid = entry.get(id_field) if isinstance(entry, dict) else None
        self.where = f"question {index}" + (f" ({id_field} {qid!r})" if qid is not None else "")
        if not isinstance(entry, dict):
            self.fail("", f"must be a JSON object, got {type(entry).__name__}")
        self.entry = entry

    def fail(self, field: str, message: str) -> NoReturn:
        named = f"field {field} " if field else ""
        raise InputFileError(self.path, f"{self.where}: {named}{message}")

    def get(
        self,
        obj: dict[str, Any],
        key: str,
        where: str,
        kind: type | tuple[type, ...],
        *,
        need: bool,
    ) -> Any:
        """``obj[key]`` checked to be ``kind`` (None when absent or null and not ``need``)."""
        value = obj.get(key)
        if value is None:
            if need:
                self.fail(where + key, "is missing" if key not in obj else "is null")
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or isinstance(value, bool):
            wanted = " or ".join(_KIND_NAMES[k] for k in kinds)
            self.fail(where + key, f"must be {wanted}, got {value!r}"[:300])
        if isinstance(value, str) and need and not value.strip():
            self.fail(where + key, "is empty")
        return value

    def text(self, obj: dict[str, Any], key: str, where: str = "", *, need: bool = True) -> str:
        value = self.get(obj, key, where, str, need=need)
        return value.strip() if value else ""

    def items(self, obj: dict[str, Any], key: str, where: str = "") -> list[dict[str, Any]]:
        """``obj[key]`` as a list of objects ([] when absent)."""
        value = self.get(obj, key, where, list, need=False) or []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                self.fail(f"{where}{key}[{i}]", f"must be a JSON object, got {item!r}"[:300])
        return value


def _load(path: Path) -> Any:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError) as exc:
        raise InputFileError(path, f"cannot read: {exc}") from None
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise InputFileError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        message = f"invalid JSON: {exc.msg} (column {exc.colno})"
        raise InputFileError(path, message, exc.lineno) from None


def detect_format(data: Any, path: Path) -> str:
    """The benchmark format of loaded JSON ``data`` (see the module docstring)."""
    if isinstance(data, dict) and "Questions" in data:
        return "webqsp"
    if isinstance(data, list) and data and isinstance(data[0], dict):
        first = data[0]
        if "webqsp_ID" in first or ("ID" in first and "answers" in first):
            return "cwq"
        answer = first.get("answer")
        strings = isinstance(answer, list) and any(isinstance(a, str) for a in answer)
        if strings or "answer_mid" in first or "commonness" in first:
            return "graphq"
        if "qid" in first:
            return "graphq" if path.name.lower().startswith("graphquestions") else "grailqa"
    if isinstance(data, list) and not data:
        raise InputFileError(path, "holds no questions (an empty JSON list)")
    raise InputFileError(
        path,
        'not a benchmark file kgsynth knows: expected WebQSP ({"Questions": [...]}) or a JSON '
        "list of CWQ (ID, question, sparql, answers), GrailQA or GraphQuestions (qid, question, "
        "answer, graph_query) questions",
    )


def read_benchmark(
    path: str | Path, format: str | None = None, *, limit: int | None = None
) -> list[QARecord]:
    """The questions of a benchmark file (the first ``limit``), in file order; ``format``
    one of :data:`FORMATS`, told from the JSON's shape when None."""
    path = Path(path)
    if format is not None and format not in FORMATS:
        raise InputFileError(path, f"unknown benchmark format {format!r}; choose {_FORMS}")
    data = _load(path)
    fmt = format or detect_format(data, path)
    if fmt == "webqsp":
        if not isinstance(data, dict) or not isinstance(data.get("Questions"), list):
            raise InputFileError(path, 'a WebQSP file is an object with a "Questions" list')
        entries, id_field = data["Questions"], "QuestionId"
    else:
        if not isinstance(data, list):
            raise InputFileError(path, f"a {fmt} file is a JSON list of questions")
        entries, id_field = data, "ID" if fmt == "cwq" else "qid"
    reader = {"webqsp": _webqsp, "cwq": _cwq, "grailqa": _grailqa, "graphq": _graphq}[fmt]
    records = []
    for index, entry in enumerate(entries, 1):
        if limit is not None and len(records) >= limit:
            break
        records.append(reader(_Question(path, index, id_field, entry)))
    return records


# --- formats -----------------------------------------------------------------------------------


def _record(q: _Question, question: str, fmt: str, **fields: Any) -> QARecord:
    answers = fields.pop("answers", [])
    return QARecord(
        question=question,
        raw_question=question,
        topic_names=fields.pop("topic_names", []),
        answer_names=[a[0] for a in answers],
        qtype=fields.pop("qtype", None),
        hops=fields.pop("hops", None),
        line=q.index,
        answer_ids=[a[1] for a in answers],
        aliases=[a[2] for a in answers],
        source_format=fmt,
        **fields,
    )


def _webqsp(q: _Question) -> QARecord:
    e = q.entry
    qid = q.text(e, "QuestionId")
    question = q.text(e, "RawQuestion", need=False) or q.text(e, "ProcessedQuestion")
    parses = q.items(e, "Parses")
    if not parses:
        return _record(q, question, "webqsp", question_id=qid)
    p, at = parses[0], "Parses[0]."
    answers = []
    for i, a in enumerate(q.items(p, "Answers", at)):
        where = f"{at}Answers[{i}]."
        kind = q.text(a, "AnswerType", where)
        arg = q.text(a, "AnswerArgument", where)
        name = q.text(a, "EntityName", where, need=False)
        answers.append(_typed_answer(q, kind, arg, name, where + "AnswerType"))
    mid = q.text(p, "TopicEntityMid", at, need=False)
    name = q.text(p, "TopicEntityName", at, need=False)
    chain = q.get(p, "InferentialChain", at, list, need=False)
    return _record(
        q,
        question,
        "webqsp",
        question_id=qid,
        answers=answers,
        topic_names=[name] if mid and name else [],
        topic_ids=[entity_id(mid) or mid] if mid else [],
        hops=len(chain) if chain else None,
        sparql=q.text(p, "Sparql", at, need=False) or None,
    )


def _cwq(q: _Question) -> QARecord:
    e = q.entry
    sparql = q.text(e, "sparql", need=False)
    answers = []
    for i, a in enumerate(q.items(e, "answers")):
        where = f"answers[{i}]."
        aid = q.text(a, "answer_id", where, need=False)
        name = q.text(a, "answer", where, need=not aid) or aid
        aliases = q.get(a, "aliases", where, list, need=False) or []
        if not all(isinstance(x, str) for x in aliases):
            q.fail(where + "aliases", f"must be a list of strings, got {aliases!r}"[:300])
        answers.append((name, entity_id(aid) if aid else None, [x for x in aliases if x.strip()]))
    kind = q.text(e, "compositionality_type", need=False)
    return _record(
        q,
        q.text(e, "question"),
        "cwq",
        question_id=q.text(e, "ID"),
        answers=answers,
        topic_ids=_sparql_entities(q, sparql, "sparql"),
        qtype=kind or None,
        sparql=sparql or None,
    )


def _sparql_entities(q: _Question, sparql: str, field: str) -> list[str]:
    if not sparql:
        return []
    try:
        iris = entity_constants(parse_sparql(sparql))
    except SparqlSyntaxError as exc:
        q.fail(field, f"is not SPARQL this reader can read: {exc}")
    return [i for i in (entity_id(iri) for iri in iris) if i is not None]


def _grail_answers(q: _Question, e: dict[str, Any]) -> list[tuple[str, str | None, list[str]]]:
    answers = []
    for i, a in enumerate(q.items(e, "answer")):
        where = f"answer[{i}]."
        kind = q.text(a, "answer_type", where)
        arg = str(q.get(a, "answer_argument", where, (str, int, float), need=True)).strip()
        name = q.text(a, "entity_name", where, need=False)
        answers.append(_typed_answer(q, kind, arg, name, where + "answer_type"))
    return answers


def _typed_answer(
    q: _Question, kind: str, arg: str, name: str | None, kind_field: str
) -> tuple[str, str | None, list[str]]:
    """An ``Entity`` answer (its name, else its id; its id) or a ``Value`` (the value, no id),
    as WebQSP's and GrailQA's answer lists type them."""
    if kind == "Entity":
        return (name or arg, entity_id(arg) or arg, [])
    if kind != "Value":
        q.fail(kind_field, f"must be Entity or Value, got {kind!r}")
    return (arg, None, [])


def _graph_topics(q: _Question, e: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Names and ids of the graph query's ``entity`` nodes."""
    graph = q.get(e, "graph_query", "", dict, need=False) or {}
    names, ids = [], []
    for i, node in enumerate(q.items(graph, "nodes", "graph_query.")):
        where = f"graph_query.nodes[{i}]."
        if q.text(node, "node_type", where) != "entity":
            continue
        nid = q.text(node, "id", where)
        ids.append(entity_id(nid) or nid)
        name = q.text(node, "friendly_name", where, need=False)
        if name:
            names.append(name)
    return names, ids


def _grail_fields(q: _Question, fmt: str, answers: list) -> QARecord:
    e = q.entry
    qid = q.get(e, "qid", "", (str, int), need=True)
    names, ids = _graph_topics(q, e)
    hops = q.get(e, "num_edge", "", int, need=False)
    level = q.text(e, "level", need=False)
    function = q.text(e, "function", need=False)
    return _record(
        q,
        q.text(e, "question"),
        fmt,
        question_id=str(qid),
        answers=answers,
        topic_names=names,
        topic_ids=ids,
        hops=hops,
        qtype=level or function or None,
        sparql=q.text(e, "sparql_query", need=False) or None,
        sexpr=q.text(e, "s_expression", need=False) or None,
    )


def _grailqa(q: _Question) -> QARecord:
    return _grail_fields(q, "grailqa", _grail_answers(q, q.entry))


def _graphq(q: _Question) -> QARecord:
    e = q.entry
    answer = q.get(e, "answer", "", list, need=False) or []
    if not answer or isinstance(answer[0], dict):  # the GrailQA-style conversion
        return _grail_fields(q, "graphq", _grail_answers(q, e))
    if not all(isinstance(a, str) and a.strip() for a in answer):
        q.fail("answer", f"must be a list of non-empty strings, got {answer!r}"[:300])
    mids = q.get(e, "answer_mid", "", list, need=False)
    if mids is not None and (len(mids) != len(answer) or not all(isinstance(m, str) for m in mids)):
        q.fail("answer_mid", f"must list one id string per answer ({len(answer)}), got {mids!r}")
    ids = [entity_id(m) for m in mids] if mids else [None] * len(answer)
    return _grail_fields(
        q, "graphq", [(a.strip(), i, []) for a, i in zip(answer, ids, strict=True)]
    )


# --- GraphWalker's seed set E and predicate set P -------------------------------------------


def benchmark_seed_ids(path: str | Path, format: str | None = None) -> list[str]:
    """The topic entities of every question of a benchmark file, by id, each once, in order
    of first appearance (GraphWalker's seed set E)."""
    seen: dict[str, None] = {}
    for rec in read_benchmark(path, format):
        for tid in rec.topic_ids:
            seen.setdefault(tid)
    return list(seen)


def benchmark_relations(
    path: str | Path, relation_name: Callable[[str], str], format: str | None = None
) -> list[str]:
    """The relations the gold SPARQL of a benchmark file uses (GraphWalker's predicate set P),
    sorted, named with ``relation_name`` (a profile's ``relation_name``): each predicate, and
    each two-edge path through a variable the query does not return, named ``r1.r2`` as
    kgsynth names a hop across a Freebase CVT node. A query this reader cannot parse is
    skipped and counted in the log."""
    path = Path(path)
    names: set[str] = set()
    skipped = 0
    for rec in read_benchmark(path, format):
        if not rec.sparql:
            continue
        try:
            paths = predicate_paths(parse_sparql(rec.sparql))
        except SparqlSyntaxError as exc:
            skipped += 1
            log.debug("%s: question %d: %s", path, rec.line, exc)
            continue
        names.update(".".join(relation_name(p) for p in ps) for ps in paths)
    if skipped:
        log.warning(
            "%s: %d gold SPARQL queries could not be read; their relations are left out",
            path,
            skipped,
        )
    return sorted(names)
