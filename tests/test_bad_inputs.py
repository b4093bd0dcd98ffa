"""Every bad input gets one line (issue 13, part 6).

Each command is driven over a corpus of bad inputs — binary and non-UTF-8 files, empty and
blank files, Parquet files of the wrong shape, NaN and infinity, YAML values of the wrong type,
negative and zero counts, directories where files belong and files where directories belong,
corrupt and empty stores, unknown relation names, bad ports, unusable caches, every LLM
request failing — and each must end with:

- a non-zero exit code (the domain error's, where the case says which);
- exactly one ``error:`` line on stderr, the last thing written there, naming the file, the
  row or the field (the case's ``expect`` substrings), and no traceback;
- every input file unchanged (SHA-256 of the whole input folder before and after).
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.cli import app
from kgsynth.core.schema import QUESTION_SCHEMA, WALK_SCHEMA
from tests.kgfixtures import build_pipeline_inputs
from tests.servers import free_port

runner = CliRunner()


@dataclass(frozen=True)
class Case:
    """One bad input: the command line (``{name}`` fields are paths in the input folder,
    ``{out}`` a fresh output folder), the substrings its error line must hold, and the exit
    code when it is one particular code."""

    id: str
    argv: str
    expect: tuple[str, ...]
    code: int | None = None
    extra: list[str] = field(default_factory=list)  # arguments with spaces, appended as is


CASES: list[Case] = [
    # --- kg import: the triple file ----------------------------------------------------
    Case("import-binary", "kg import {bin.txt} --out {out}/s", ("bin.txt:2", "not UTF-8"), 3),
    Case("import-latin1", "kg import {latin1.txt} --out {out}/s", ("latin1.txt:2", "not UTF-8"), 3),
    Case("import-empty", "kg import {empty.txt} --out {out}/s", ("empty.txt", "no triples"), 3),
    Case("import-blank", "kg import {blank.txt} --out {out}/s", ("blank.txt", "no triples"), 3),
    Case("import-parquet", "kg import {table.parquet} --out {out}/s", ("table.parquet",), 3),
    Case("import-dir", "kg import {emptydir} --out {out}/s", ("emptydir", "directory"), 3),
    Case("import-missing", "kg import {out}/nope.txt --out {out}/s", ("nope.txt", "no such"), 3),
    Case(
        "import-not-gzip", "kg import {notgzip.txt.gz} --out {out}/s", ("notgzip.txt.gz", "gzip"), 3
    ),
    Case("import-cut-gzip", "kg import {cut.txt.gz} --out {out}/s", ("cut.txt.gz", "gzip"), 3),
    Case("import-nt-surrogate", "kg import {surrogate.nt} --out {out}/s", ("surrogate.nt:1",), 3),
    Case("import-nt-binary", "kg import {bin.txt} --format nt --out {out}/s", ("bin.txt",), 3),
    Case("import-names-only", "kg import {labels.nt} --out {out}/s", ("labels.nt", "no facts"), 3),
    Case("import-two-fields", "kg import {two_fields.txt} --out {out}/s", ("two_fields.txt:2",), 3),
    Case("import-format", "kg import {kb.txt} --format xml --out {out}/s", ("--format", "xml"), 2),
    Case("import-out-exists", "kg import {kb.txt} --out {store}", ("--out", "exists"), 2),
    Case(
        "import-names-binary",
        "kg import {ids.tsv} --names {bin.txt} --out {out}/s",
        ("bin.txt",),
        3,
    ),
    Case(
        "import-names-latin1",
        "kg import {ids.tsv} --names {latin1.txt} --out {out}/s",
        ("latin1.txt:2", "not UTF-8"),
        3,
    ),
    Case(
        "import-names-dir", "kg import {ids.tsv} --names {emptydir} --out {out}/s", ("emptydir",), 3
    ),
    # --- --kg: what is not a KG ----------------------------------------------------------
    Case("kg-parquet", "kg stats --kg {table.parquet}", ("--kg", "table.parquet", "Parquet"), 2),
    Case("kg-binary", "kg stats --kg {bin.txt}", ("bin.txt:2", "not UTF-8"), 3),
    Case("kg-empty-file", "kg stats --kg {empty.txt}", ("empty.txt", "no triples"), 3),
    Case("kg-empty-dir", "kg stats --kg {emptydir}", ("--kg", "emptydir"), 2),
    Case("kg-bad-json", "kg stats --kg {store_badjson}", ("store_badjson", "damaged"), 4),
    Case("kg-json-list", "kg stats --kg {store_jsonlist}", ("store_jsonlist", "damaged"), 4),
    Case("kg-corrupt-rocksdb", "kg stats --kg {store_corrupt}", ("store_corrupt", "damaged"), 4),
    Case("kg-empty-store", "kg stats --kg {store_empty}", ("store_empty", "damaged"), 4),
    Case("kg-half-store", "kg stats --kg {store_half}", ("--kg", "store_half", "incomplete"), 2),
    Case(
        "kg-bad-name-index",
        "kg tool --kg {store_badnames}",
        ("names.sqlite", "damaged"),
        4,
        ["get_relations('kismet')"],
    ),
    Case(
        "kg-port-99999", "kg stats --kg http://127.0.0.1:99999/sparql", ("--kg", "99999", "port"), 2
    ),
    Case("kg-port-0", "kg stats --kg http://127.0.0.1:0/sparql", ("--kg", "port"), 2),
    Case("kg-port-text", "kg stats --kg http://127.0.0.1:http/sparql", ("--kg", "port"), 2),
    Case("kg-no-host", "kg stats --kg http://:8080/sparql", ("--kg", "no host"), 2),
    Case(
        "kg-closed-port", "kg stats --kg http://127.0.0.1:{closed_port}/sparql", ("unavailable",), 4
    ),
    # --- kg stats / tool / query counts --------------------------------------------------
    Case("stats-top-negative", "kg stats --kg {store} --top -3", ("--top", "-3"), 2),
    Case("stats-top-zero", "kg stats --kg {store} --top 0", ("--top",), 2),
    Case(
        "tool-top-k-zero",
        "kg tool --kg {store} --top-k-relations 0",
        ("--top-k",),
        2,
        ["get_relations('Kismet')"],
    ),
    Case(
        "tool-max-triples-negative",
        "kg tool --kg {store} --max-triples-per-relation -1",
        ("--max-triples",),
        2,
        ["get_relations('Kismet')"],
    ),
    Case(
        "tool-unknown-toolset",
        "kg tool --kg {store} --toolset x",
        ("--tools",),
        1,
        ["get_relations('Kismet')"],
    ),
    Case(
        "query-timeout-negative",
        "kg query --kg {store} --timeout -1",
        ("--timeout",),
        2,
        ["SELECT * WHERE { ?s ?p ?o }"],
    ),
    Case(
        "query-timeout-nan",
        "kg query --kg {store} --timeout nan",
        ("--timeout",),
        2,
        ["ASK { ?s ?p ?o }"],
    ),
    # --- walk: numbers, YAML types, names files, --out -----------------------------------
    Case(
        "walk-structure-nan",
        "walk --kg {store} --out {out}/w.parquet --structures chain-2:nan",
        ("--structures", "nan"),
        2,
    ),
    Case(
        "walk-structure-inf",
        "walk --kg {store} --out {out}/w.parquet --structures chain-2:inf",
        ("--structures", "inf"),
        2,
    ),
    Case(
        "walk-structure-negative",
        "walk --kg {store} --out {out}/w.parquet --structures chain-2:-1",
        ("--structures",),
        2,
    ),
    Case(
        "walk-structure-unknown",
        "walk --kg {store} --out {out}/w.parquet --structures chain-9",
        ("--structures",),
        2,
    ),
    Case(
        "walk-balance-nan",
        "walk --kg {store} --out {out}/w.parquet --relation-balance nan",
        ("--relation-balance", "nan"),
        2,
    ),
    Case(
        "walk-balance-inf",
        "walk --kg {store} --out {out}/w.parquet --relation-balance inf",
        ("--relation-balance",),
        2,
    ),
    Case(
        "walk-balance-negative",
        "walk --kg {store} --out {out}/w.parquet --relation-balance -1",
        ("--relation-balance",),
        2,
    ),
    Case("walk-n-zero", "walk --kg {store} --out {out}/w.parquet --n 0", ("--n",), 2),
    Case("walk-n-negative", "walk --kg {store} --out {out}/w.parquet --n -5", ("--n",), 2),
    Case(
        "walk-chunk-zero",
        "walk --kg {store} --out {out}/w.parquet --chunk-size 0",
        ("--chunk-size",),
        2,
    ),
    Case(
        "walk-fanout",
        "walk --kg {store} --out {out}/w.parquet --min-fanout 5 --max-fanout 2",
        ("--min-fanout",),
        2,
    ),
    Case("walk-shard", "walk --kg {store} --out {out}/w.parquet --shard 2/2", ("--shard",), 2),
    Case(
        "walk-yaml-n-float",
        "walk --kg {store} --out {out}/w.parquet --config {n_float.yaml}",
        ("n_float.yaml", "n must be an integer", "10.7"),
        2,
    ),
    Case(
        "walk-yaml-n-true",
        "walk --kg {store} --out {out}/w.parquet --config {n_true.yaml}",
        ("n_true.yaml", "n must be an integer", "true"),
        2,
    ),
    Case(
        "walk-yaml-n-null",
        "walk --kg {store} --out {out}/w.parquet --config {n_null.yaml}",
        ("n_null.yaml", "n must be an integer", "null"),
        2,
    ),
    Case(
        "walk-yaml-n-string",
        "walk --kg {store} --out {out}/w.parquet --config {n_string.yaml}",
        ("n_string.yaml", "n must be an integer"),
        2,
    ),
    Case(
        "walk-yaml-structures-list",
        "walk --kg {store} --out {out}/w.parquet --config {structures_list.yaml}",
        ("structures_list.yaml", "structures must be a string"),
        2,
    ),
    Case(
        "walk-yaml-balance-nan",
        "walk --kg {store} --out {out}/w.parquet --config {balance_nan.yaml}",
        ("balance_nan.yaml", "relation_balance", "finite"),
        2,
    ),
    Case(
        "walk-yaml-seeds-int",
        "walk --kg {store} --out {out}/w.parquet --config {seeds_int.yaml}",
        ("seeds_int.yaml", "seeds"),
        2,
    ),
    Case(
        "walk-yaml-not-mapping",
        "walk --kg {store} --out {out}/w.parquet --config {list.yaml}",
        ("list.yaml", "mapping"),
        2,
    ),
    Case(
        "walk-yaml-broken",
        "walk --kg {store} --out {out}/w.parquet --config {broken.yaml}",
        ("broken.yaml", "not valid YAML"),
        2,
    ),
    Case(
        "walk-yaml-binary",
        "walk --kg {store} --out {out}/w.parquet --config {bin.txt}",
        ("bin.txt", "UTF-8"),
        2,
    ),
    Case(
        "walk-yaml-unknown",
        "walk --kg {store} --out {out}/w.parquet --config {unknown.yaml}",
        ("unknown.yaml", "unknown option"),
        2,
    ),
    Case(
        "walk-yaml-dir",
        "walk --kg {store} --out {out}/w.parquet --config {emptydir}",
        ("emptydir",),
        2,
    ),
    Case(
        "walk-unknown-relation",
        "walk --kg {store} --out {out}/w.parquet --n 3 --relations {relations_unknown.txt}",
        ("relations_unknown.txt:2", "directed_byy"),
        3,
    ),
    Case(
        "walk-relations-binary",
        "walk --kg {store} --out {out}/w.parquet --relations {bin.txt}",
        ("bin.txt", "UTF-8"),
        3,
    ),
    Case(
        "walk-relations-missing",
        "walk --kg {store} --out {out}/w.parquet --relations {out}/none.txt",
        ("none.txt",),
        3,
    ),
    Case(
        "walk-seeds-binary",
        "walk --kg {store} --out {out}/w.parquet --seeds {bin.txt}",
        ("bin.txt", "UTF-8"),
        3,
    ),
    Case(
        "walk-seeds-unknown",
        "walk --kg {store} --out {out}/w.parquet --seeds {seeds_unknown.txt}",
        ("seeds_unknown.txt:2", "Nobody"),
        3,
    ),
    Case("walk-out-dir", "walk --kg {store} --out {outdir}", ("--out", "outdir", "directory"), 2),
    Case(
        "walk-out-under-file", "walk --kg {store} --out {kb.txt}/w.parquet", ("--out", "kb.txt"), 2
    ),
    # --- synthesize questions: the walks file, counts, --out, --cache, the LLM ----------
    Case(
        "questions-walks-binary",
        "synthesize questions --walks {bin.txt} --out {out}/q.parquet",
        ("bin.txt", "Parquet"),
        3,
    ),
    Case(
        "questions-walks-dir",
        "synthesize questions --walks {emptydir} --out {out}/q.parquet",
        ("emptydir",),
        3,
    ),
    Case(
        "questions-walks-other-table",
        "synthesize questions --walks {table.parquet} --out {out}/q.parquet",
        ("table.parquet", "missing column"),
        3,
    ),
    Case(
        "questions-null-topics",
        "synthesize questions --walks {walks_null_topics.parquet} --out {out}/q.parquet",
        ("walks_null_topics.parquet", "row 2", "topic_names"),
        3,
    ),
    Case(
        "questions-null-topic-item",
        "synthesize questions --walks {walks_null_topic_item.parquet} --out {out}/q.parquet",
        ("walks_null_topic_item.parquet", "row 1", "topic_names[]"),
        3,
    ),
    Case(
        "questions-null-hop-entity",
        "synthesize questions --walks {walks_null_entity.parquet} --out {out}/q.parquet",
        ("walks_null_entity.parquet", "row 3", "branches[][].entity"),
        3,
    ),
    Case(
        "questions-null-branches",
        "synthesize questions --walks {walks_null_branches.parquet} --out {out}/q.parquet",
        ("walks_null_branches.parquet", "row 0", "branches"),
        3,
    ),
    Case(
        "questions-null-merge",
        "synthesize questions --walks {walks_null_merge.parquet} --out {out}/q.parquet",
        ("walks_null_merge.parquet", "row 4", "merge_at"),
        3,
    ),
    Case(
        "questions-merge-strings",
        "synthesize questions --walks {walks_merge_str.parquet} --out {out}/q.parquet",
        ("walks_merge_str.parquet", "merge_at", "string"),
        3,
    ),
    Case(
        "questions-topics-ints",
        "synthesize questions --walks {walks_topics_int.parquet} --out {out}/q.parquet",
        ("walks_topics_int.parquet", "topic_names", "int64"),
        3,
    ),
    Case(
        "questions-branches-strings",
        "synthesize questions --walks {walks_branches_str.parquet} --out {out}/q.parquet",
        ("walks_branches_str.parquet", "branches"),
        3,
    ),
    Case(
        "questions-merge-range",
        "synthesize questions --walks {walks_merge_range.parquet} --out {out}/q.parquet",
        ("walks_merge_range.parquet", "row 1", "merge_at"),
        3,
    ),
    Case(
        "questions-branch-count",
        "synthesize questions --walks {walks_len.parquet} --out {out}/q.parquet",
        ("walks_len.parquet", "row 1", "topic_names"),
        3,
    ),
    Case(
        "questions-limit-negative",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --limit -1",
        ("--limit", "-1"),
        2,
    ),
    Case(
        "questions-limit-zero",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --limit 0",
        ("--limit",),
        2,
    ),
    Case(
        "questions-out-dir",
        "synthesize questions --walks {walks.parquet} --out {outdir}",
        ("--out", "outdir"),
        2,
    ),
    Case(
        "questions-cache-dir",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --cache {emptydir}",
        ("--cache", "emptydir"),
        2,
    ),
    Case(
        "questions-cache-not-db",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --cache {latin1.txt}",
        ("--cache", "latin1.txt", "not a usable"),
        2,
    ),
    Case(
        "questions-max-failed-nan",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --max-failed-fraction nan",
        ("--max-failed-fraction",),
        2,
    ),
    Case(
        "questions-max-failed-big",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --max-failed-fraction 1.5",
        ("--max-failed-fraction",),
        2,
    ),
    Case(
        "questions-temperature-inf",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --temperature inf",
        ("--temperature", "finite"),
        2,
    ),
    Case(
        "questions-min-quality-nan",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --min-quality nan",
        ("--min-quality",),
        2,
    ),
    Case(
        "questions-yaml-judge-string",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --config {judge_string.yaml}",
        ("judge_string.yaml", "judge"),
        2,
    ),
    Case(
        "questions-yaml-tokens-float",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --config {tokens_float.yaml}",
        ("tokens_float.yaml", "max_tokens"),
        2,
    ),
    Case(
        "questions-llm-unknown",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --llm gpt",
        ("--llm",),
        2,
    ),
    Case(
        "questions-openai-no-model",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --llm openai",
        ("--model",),
        2,
    ),
    Case(
        "questions-concurrency-zero",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --llm openai --model m --api-key k --base-url http://127.0.0.1:{closed_port}/v1 --concurrency 0",
        ("--concurrency",),
        2,
    ),
    Case(
        "questions-timeout-zero",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --llm openai --model m --api-key k --base-url http://127.0.0.1:{closed_port}/v1 --timeout 0",
        ("--timeout",),
        2,
    ),
    Case(
        "questions-retries-negative",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --llm openai --model m --api-key k --base-url http://127.0.0.1:{closed_port}/v1 --max-retries -1",
        ("--max-retries",),
        2,
    ),
    Case(
        "questions-all-requests-fail",
        "synthesize questions --walks {walks.parquet} --out {out}/q.parquet --llm openai --model m --api-key k --base-url http://127.0.0.1:{closed_port}/v1 --max-retries 0 --limit 3",
        ("3 of 3 LLM requests failed", "--max-failed-fraction"),
        5,
    ),
    # --- synthesize trajectories: the questions file and the same options ---------------
    Case(
        "traj-null-question",
        "synthesize trajectories --questions {q_null_question.parquet} --kg {store} --out {out}/t.parquet",
        ("q_null_question.parquet", "row 1", "question"),
        3,
    ),
    Case(
        "traj-int-question",
        "synthesize trajectories --questions {q_int_question.parquet} --kg {store} --out {out}/t.parquet",
        ("q_int_question.parquet", "question", "int64"),
        3,
    ),
    Case(
        "traj-branches-strings",
        "synthesize trajectories --questions {q_branches_str.parquet} --kg {store} --out {out}/t.parquet",
        ("q_branches_str.parquet", "branches"),
        3,
    ),
    Case(
        "traj-null-merge",
        "synthesize trajectories --questions {q_null_merge.parquet} --kg {store} --out {out}/t.parquet",
        ("q_null_merge.parquet", "row 0", "merge_at"),
        3,
    ),
    Case(
        "traj-null-answer-item",
        "synthesize trajectories --questions {q_null_answer.parquet} --kg {store} --out {out}/t.parquet --mode free",
        ("q_null_answer.parquet", "row 2", "answer_names[]"),
        3,
    ),
    Case(
        "traj-questions-binary",
        "synthesize trajectories --questions {bin.txt} --kg {store} --out {out}/t.parquet",
        ("bin.txt", "Parquet"),
        3,
    ),
    Case(
        "traj-limit-negative",
        "synthesize trajectories --questions {questions.parquet} --kg {store} --out {out}/t.parquet --limit -3",
        ("--limit", "-3"),
        2,
    ),
    Case(
        "traj-limit-zero",
        "synthesize trajectories --questions {questions.parquet} --kg {store} --out {out}/t.parquet --limit 0",
        ("--limit",),
        2,
    ),
    Case(
        "traj-out-dir",
        "synthesize trajectories --questions {questions.parquet} --kg {store} --out {outdir}",
        ("--out", "outdir"),
        2,
    ),
    Case(
        "traj-samples-zero",
        "synthesize trajectories --questions {questions.parquet} --kg {store} --out {out}/t.parquet --samples 0",
        ("--samples",),
        2,
    ),
    Case(
        "traj-heldout-nan",
        "synthesize trajectories --questions {questions.parquet} --kg {store} --out {out}/t.parquet --split train --heldout-fraction nan",
        ("--heldout-fraction",),
        2,
    ),
    Case(
        "traj-yaml-mode-int",
        "synthesize trajectories --questions {questions.parquet} --kg {store} --out {out}/t.parquet --config {mode_int.yaml}",
        ("mode_int.yaml", "mode"),
        2,
    ),
    Case(
        "traj-kg-parquet",
        "synthesize trajectories --questions {questions.parquet} --kg {table.parquet} --out {out}/t.parquet",
        ("--kg", "table.parquet"),
        2,
    ),
    Case(
        "traj-all-requests-fail",
        "synthesize trajectories --questions {questions.parquet} --kg {store} --out {out}/t.parquet --mode free --llm openai --model m --api-key k --base-url http://127.0.0.1:{closed_port}/v1 --max-retries 0 --limit 2",
        ("LLM requests failed", "--max-failed-fraction"),
        5,
    ),
    # --- filter and eval -----------------------------------------------------------------
    Case("filter-out-file", "filter --in {walks.parquet} --out {kb.txt}", ("--out", "kb.txt"), 2),
    Case("filter-in-binary", "filter --in {bin.txt} --out {out}/f", ("bin.txt", "Parquet"), 3),
    Case(
        "filter-in-walks",
        "filter --in {walks.parquet} --out {out}/f",
        ("walks.parquet", "missing column"),
        3,
    ),
    Case(
        "filter-f1-nan",
        "filter --in {walks.parquet} --out {out}/f --f1-threshold nan",
        ("--f1-threshold",),
        2,
    ),
    Case(
        "filter-balance-inf",
        "filter --in {walks.parquet} --out {out}/f --balance-factor inf",
        ("--balance-factor",),
        2,
    ),
    Case(
        "filter-yaml-cap-float",
        "filter --in {walks.parquet} --out {out}/f --config {cap_float.yaml}",
        ("cap_float.yaml", "max_per_question"),
        2,
    ),
    Case(
        "eval-questions-binary",
        "eval --questions {bin.txt} --kg {store} --out {out}/e --llm openai --model m --api-key k",
        ("bin.txt",),
        3,
    ),
    Case(
        "eval-limit-negative",
        "eval --questions {eval.jsonl} --kg {store} --out {out}/e --llm openai --model m --api-key k --limit -2",
        ("--limit",),
        2,
    ),
    Case(
        "eval-runs-zero",
        "eval --questions {eval.jsonl} --kg {store} --out {out}/e --llm openai --model m --api-key k --runs 0",
        ("--runs",),
        2,
    ),
    Case(
        "eval-temperature-nan",
        "eval --questions {eval.jsonl} --kg {store} --out {out}/e --llm openai --model m --api-key k --temperature nan",
        ("--temperature",),
        2,
    ),
    # --- outputs never destroy inputs (issue 13, part 1) ----------------------------------
    Case(
        "questions-out-is-input",
        "synthesize questions --walks {walks.parquet} --out {walks.parquet}",
        ("would overwrite the input --walks", "walks.parquet"),
        2,
    ),
    Case(
        "trajectories-out-is-input",
        "synthesize trajectories --questions {questions.parquet} --kg {store} "
        "--out {questions.parquet}",
        ("would overwrite the input --questions",),
        2,
    ),
    Case(
        "import-force-over-other-files",
        "kg import {kb.txt} --out {notes} --force",
        ("not a kgsynth store", "notes"),
        2,
    ),
]


# --- the input folder ----------------------------------------------------------------------


def _write_walks(path: Path, rows: list[dict[str, Any]], schema: pa.Schema | None) -> None:
    table = pa.Table.from_pylist(rows, schema=schema) if schema else pa.Table.from_pylist(rows)
    pq.write_table(table, path)


def _variant(
    rows: list[dict[str, Any]], change: Callable[[list[dict[str, Any]]], None]
) -> list[dict[str, Any]]:
    rows = copy.deepcopy(rows)
    change(rows)
    return rows


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Good and bad inputs in one folder; the good ones made by the real commands."""
    root = tmp_path_factory.mktemp("bad-inputs")
    built = build_pipeline_inputs(root, walks=6, structures="chain-1,chain-2,2I")
    kb, store = built["kb"], built["store"]
    for name in ("manifest.json", "rejected.parquet", "llm_cache.sqlite", "walks_stats.png"):
        (root / name).unlink(missing_ok=True)

    (root / "bin.txt").write_bytes(bytes(range(256)) * 4)
    (root / "latin1.txt").write_bytes("a|b|c\nCafé|directed_by|Zoë\n".encode("latin-1"))
    (root / "empty.txt").write_text("")
    (root / "blank.txt").write_text("\n   \n\t\n")
    (root / "two_fields.txt").write_text("a|b|c\nonly|two\n")
    pq.write_table(pa.table({"a": [1, 2]}), root / "table.parquet")
    (root / "emptydir").mkdir()
    (root / "outdir").mkdir()
    (root / "notes").mkdir()
    (root / "notes" / "notes.txt").write_text("mine")
    (root / "notgzip.txt.gz").write_text("not gzip at all\n")
    (root / "cut.txt.gz").write_bytes(gzip.compress(kb.read_bytes())[:20])
    (root / "surrogate.nt").write_text('<http://a> <http://b> "x\\uD83C" .\n')
    label = "<http://www.w3.org/2000/01/rdf-schema#label>"
    (root / "labels.nt").write_text(f'<http://a> {label} "A" .\n<http://b> {label} "B" .\n')
    (root / "ids.tsv").write_text("m.1\tr\tm.2\n")
    (root / "relations_unknown.txt").write_text("directed_by\ndirected_byy\n")
    (root / "seeds_unknown.txt").write_text("Kismet\nNobody\n")
    (root / "eval.jsonl").write_text(
        '{"question": "who directed [Kismet]", "topic_names": ["Kismet"], '
        '"answer_names": ["William Dieterle"]}\n'
    )

    yaml_files = {
        "n_float.yaml": "n: 10.7\n",
        "n_true.yaml": "n: true\n",
        "n_null.yaml": "n: null\n",
        "n_string.yaml": "walk:\n  n: '5'\n",
        "structures_list.yaml": "structures: [chain-1, chain-2]\n",
        "balance_nan.yaml": "relation_balance: .nan\n",
        "seeds_int.yaml": "seeds: 3\n",
        "list.yaml": "- n: 3\n",
        "broken.yaml": "n: [1, 2\n",
        "unknown.yaml": "walks: 3\n",
        "judge_string.yaml": "questions:\n  judge: 'yes'\n",
        "tokens_float.yaml": "max_tokens: 12.5\n",
        "mode_int.yaml": "mode: 3\n",
        "cap_float.yaml": "filter:\n  max_per_question: 2.5\n",
    }
    for name, text in yaml_files.items():
        (root / name).write_text(text)

    # stores: damaged in every way a folder can be
    for name in ("store_badjson", "store_jsonlist", "store_corrupt", "store_badnames"):
        shutil.copytree(store, root / name)
    (root / "store_badjson" / "kg.json").write_text("{not json")
    (root / "store_jsonlist" / "kg.json").write_text("[1, 2]")
    (root / "store_corrupt" / "oxigraph" / "CURRENT").write_bytes(b"\x00garbage")
    (root / "store_badnames" / "names.sqlite").write_bytes(b"not a database" * 100)
    (root / "store_empty" / "oxigraph").mkdir(parents=True)
    (root / "store_empty" / "kg.json").write_text("{}")
    (root / "store_half" / "oxigraph").mkdir(parents=True)

    # walks and questions with nulls, wrong types and shapes that do not fit
    walks = pq.read_table(root / "walks.parquet").to_pylist()
    assert len(walks) == 6

    def set_(row: int, key: str, value: Any) -> Callable[[list[dict[str, Any]]], None]:
        return lambda rows: rows[row].__setitem__(key, value)

    def hop_entity_null(rows: list[dict[str, Any]]) -> None:
        rows[3]["branches"][0][0]["entity"] = None

    def topic_item_null(rows: list[dict[str, Any]]) -> None:
        rows[1]["topic_names"][0] = None

    typed = {
        "walks_null_topics": (set_(2, "topic_names", None), WALK_SCHEMA),
        "walks_null_topic_item": (topic_item_null, WALK_SCHEMA),
        "walks_null_entity": (hop_entity_null, WALK_SCHEMA),
        "walks_null_branches": (set_(0, "branches", None), WALK_SCHEMA),
        "walks_null_merge": (set_(4, "merge_at", None), WALK_SCHEMA),
        "walks_merge_range": (
            lambda rows: rows[1].__setitem__("merge_at", [9] * len(rows[1]["merge_at"])),
            WALK_SCHEMA,
        ),
        "walks_len": (set_(1, "topic_names", []), WALK_SCHEMA),
        "walks_merge_str": (
            lambda rows: [r.__setitem__("merge_at", [str(m) for m in r["merge_at"]]) for r in rows],
            None,
        ),
        "walks_topics_int": (
            lambda rows: [
                r.__setitem__("topic_names", [7 for _ in r["topic_names"]]) for r in rows
            ],
            None,
        ),
        "walks_branches_str": (
            lambda rows: [r.__setitem__("branches", [["x"] for _ in r["branches"]]) for r in rows],
            None,
        ),
    }
    for name, (change, schema) in typed.items():
        _write_walks(root / f"{name}.parquet", _variant(walks, change), schema)

    questions = pq.read_table(root / "questions.parquet").to_pylist()
    assert len(questions) >= 3

    def answer_item_null(rows: list[dict[str, Any]]) -> None:
        rows[2]["answer_names"] = [None]

    qvariants = {
        "q_null_question": (set_(1, "question", None), QUESTION_SCHEMA),
        "q_null_merge": (set_(0, "merge_at", None), QUESTION_SCHEMA),
        "q_null_answer": (answer_item_null, QUESTION_SCHEMA),
        "q_int_question": (lambda rows: [r.__setitem__("question", 5) for r in rows], None),
        "q_branches_str": (
            lambda rows: [r.__setitem__("branches", [["x"] for _ in r["branches"]]) for r in rows],
            None,
        ),
    }
    for name, (change, schema) in qvariants.items():
        rows = _variant(questions, change)
        if schema is None:
            for r in rows:  # a schema inferred from rows: keep the struct columns readable
                r.pop("quality"), r.pop("generator")
        _write_walks(root / f"{name}.parquet", rows, schema)
    return root


def tree_digest(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` (and the set of folders), by relative path."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


def argv_of(case: Case, inputs: Path, out: Path, closed_port: int) -> list[str]:
    names = {p.name: str(p) for p in inputs.iterdir()}
    names.update(out=str(out), closed_port=str(closed_port))
    fill = re.compile(r"\{([^}]+)\}")
    return [fill.sub(lambda m: names[m.group(1)], part) for part in case.argv.split()] + case.extra


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_one_line(case: Case, inputs: Path, tmp_path: Path) -> None:
    before = tree_digest(inputs)
    res = runner.invoke(app, argv_of(case, inputs, tmp_path, free_port()))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code != 0, res.output
    if case.code is not None:
        assert res.exit_code == case.code, res.stderr
    stderr = res.stderr
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr
    for needle in case.expect:
        assert needle in errors[0], errors[0]
    assert tree_digest(inputs) == before


def test_the_corpus_covers_every_command() -> None:
    commands = {" ".join(c.argv.split()[:2]) for c in CASES}
    assert {
        "kg import",
        "kg stats",
        "kg tool",
        "kg query",
        "synthesize questions",
        "synthesize trajectories",
    } <= commands
    assert any(c.argv.startswith("walk ") for c in CASES)
    assert any(c.argv.startswith("filter ") for c in CASES)
    assert any(c.argv.startswith("eval ") for c in CASES)
    assert len({c.id for c in CASES}) == len(CASES) >= 100


def test_a_n_true_yaml_is_refused_not_run_with_one_walk(inputs: Path, tmp_path: Path) -> None:
    """``n: true`` once ran with n = 1 (bool is an int in Python)."""
    out = tmp_path / "w.parquet"
    args = ["walk", "--kg", str(inputs / "store"), "--out", str(out)]
    res = runner.invoke(app, [*args, "--config", str(inputs / "n_true.yaml")])
    assert res.exit_code == 2 and not out.exists()


def test_a_failed_run_writes_what_it_has_then_exits_non_zero(inputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.parquet"
    args = ["synthesize", "questions", "--walks", str(inputs / "walks.parquet"), "--out", str(out)]
    args += ["--llm", "openai", "--model", "m", "--api-key", "k", "--max-retries", "0"]
    args += ["--base-url", f"http://127.0.0.1:{free_port()}/v1", "--limit", "2"]
    res = runner.invoke(app, args)
    assert res.exit_code == 5
    assert pq.read_table(out).num_rows == 0
    rejected = pq.read_table(tmp_path / "q.rejected.parquet").to_pylist()
    assert [r["reject_reason"] for r in rejected] == ["llm_error", "llm_error"]
    # a lenient threshold allows some failures, not a run whose every request failed
    res = runner.invoke(app, [*args, "--max-failed-fraction", "1", "--overwrite"])
    assert res.exit_code == 5 and "all 2 of 2 LLM requests failed" in res.output, res.output


def test_filter_and_eval_refuse_an_out_that_would_destroy_their_input(
    inputs: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    accepted = corpus / "accepted.parquet"
    shutil.copy(inputs / "questions.parquet", accepted)
    before = accepted.read_bytes()
    res = runner.invoke(app, ["filter", "--in", str(accepted), "--out", str(corpus)])
    assert res.exit_code == 2 and "contains the input --in" in res.stderr, res.stderr
    assert accepted.read_bytes() == before
    # eval --out set to a checkpoint folder would replace the model's own manifest.json
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "manifest.json").write_text('{"mine": true}')
    res = runner.invoke(
        app,
        ["eval", "--questions", str(inputs / "eval.jsonl"), "--kg", str(inputs / "store"),
         "--model", str(ckpt), "--out", str(ckpt)],
    )  # fmt: skip
    assert res.exit_code == 2 and "is a model checkpoint" in res.stderr, res.stderr
    assert (ckpt / "manifest.json").read_text() == '{"mine": true}'
