"""Every record kgsynth writes, and its Parquet schema.

Ids chain provenance: ``walk_id`` -> ``question_id`` -> ``trajectory_id``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kgsynth.core.errors import InputFileError

HOP = pa.struct([("relation", pa.string()), ("inverse", pa.bool_()), ("entity", pa.string())])

WALK_SCHEMA = pa.schema(
    [
        ("walk_id", pa.string()),
        ("structure", pa.string()),
        ("hops", pa.int32()),
        ("topic_names", pa.list_(pa.string())),
        ("topic_ids", pa.list_(pa.string())),
        # One inner list per path from a topic entity; ``entity`` is the name reached by the
        # hop on the sampled path. ``merge_at[i]`` is how many hops of branch i lead to the
        # node where the branches meet (hops after it, IP's last hop, follow the meeting).
        ("branches", pa.list_(pa.list_(HOP))),
        ("merge_at", pa.list_(pa.int32())),
        ("answer_names", pa.list_(pa.string())),
        ("answer_ids", pa.list_(pa.string())),
        ("sampled_answer", pa.string()),
        ("sparql", pa.string()),
        # constraint walks (count, superlative, comparative, time): their S-expression; "" on
        # the others and in files written before the column existed (read_rows fills it)
        ("sexpr", pa.string()),
        ("seed", pa.int64()),
        ("attempt", pa.int64()),
    ]
)

QUALITY = pa.struct(
    [("path_quality", pa.float32()), ("relevance", pa.float32()), ("coherence", pa.float32())]
)
GENERATOR = pa.struct(
    [("backend", pa.string()), ("model", pa.string()), ("prompt_hash", pa.string())]
)

# questions.parquet carries the walk's fields, so later stages need only this file.
QUESTION_SCHEMA = pa.schema(
    [
        ("question_id", pa.string()),
        ("walk_id", pa.string()),
        ("question", pa.string()),
        ("topic_names", pa.list_(pa.string())),
        ("topic_ids", pa.list_(pa.string())),
        ("answer_names", pa.list_(pa.string())),
        ("answer_ids", pa.list_(pa.string())),
        ("structure", pa.string()),
        ("hops", pa.int32()),
        ("branches", pa.list_(pa.list_(HOP))),
        ("merge_at", pa.list_(pa.int32())),
        ("sparql", pa.string()),
        ("sexpr", pa.string()),
        ("quality", QUALITY),
        ("max_similarity", pa.float32()),
        ("generator", GENERATOR),
    ]
)
REJECTED_QUESTION_SCHEMA = QUESTION_SCHEMA.append(pa.field("reject_reason", pa.string())).append(
    pa.field("raw_output", pa.string())
)

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
# Per assistant turn: the tool called, its arguments (JSON), the typed tool error, the format
# error, and the entity names the environment's observation showed.
TURN = pa.struct(
    [
        ("tool", pa.string()),
        ("args", pa.string()),
        ("tool_error", pa.string()),
        ("format_error", pa.string()),
        ("entities", pa.list_(pa.string())),
    ]
)
TRAJ_GENERATOR = pa.struct(
    [("backend", pa.string()), ("model", pa.string()), ("prompt_hash", pa.string())]
)

# trajectories.parquet: one agent episode per row (``kgsynth synthesize trajectories``).
# ``messages`` are OpenAI-style (system, user, assistant, tool); ``tool`` messages are the
# environment's ``<information>`` observations, the only source of ``observed_entities``.
TRAJECTORY_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("question_id", pa.string()),
        ("walk_id", pa.string()),
        ("mode", pa.string()),  # oracle | referenced | free
        ("sample", pa.int32()),  # index among the samples of one question
        ("question", pa.string()),
        ("topic_names", pa.list_(pa.string())),
        ("structure", pa.string()),
        ("hops", pa.int32()),
        ("messages", pa.list_(MESSAGE)),
        ("predicted_answers", pa.list_(pa.string())),  # empty when no answer parsed
        ("gold_answers", pa.list_(pa.string())),
        ("answered", pa.bool_()),  # the episode ended with a parseable <answer>
        ("forced_answer", pa.bool_()),  # the answer was asked for at the turn limit
        ("num_turns", pa.int32()),  # assistant turns
        ("tool_errors", pa.int32()),  # tool calls that came back with a typed error
        ("format_errors", pa.int32()),  # assistant turns that broke the turn protocol
        ("tool_calls", pa.list_(pa.string())),  # the kg-query texts, in order
        ("turns", pa.list_(TURN)),  # per-turn metadata, one entry per assistant turn
        ("observed_entities", pa.list_(pa.string())),  # names the environment returned
        (
            "reference",
            pa.string(),
        ),  # referenced mode: the hint the model saw (stripped from messages)
        ("generator", TRAJ_GENERATOR),
    ]
)
REJECTED_TRAJECTORY_SCHEMA = TRAJECTORY_SCHEMA.append(pa.field("reject_reason", pa.string()))


METRIC_FIELDS = [pa.field(name, pa.float64()) for name in ("em_strict", "hit", "f1")]
ACCEPTED_SCHEMA = pa.schema([*TRAJECTORY_SCHEMA, *METRIC_FIELDS])
"""``accepted.parquet``: a trajectory row plus its ``em_strict``, ``hit`` and ``f1``."""
REJECTED_SCHEMA = pa.schema([*REJECTED_TRAJECTORY_SCHEMA, *METRIC_FIELDS])
"""``rejected.parquet``: a trajectory row, its ``reject_reason``, ``em_strict``, ``hit`` and
``f1``."""

# One row of predictions.parquet: one question, one run, one system (the model or a baseline).
PREDICTION_SCHEMA = pa.schema(
    [
        ("system", pa.string()),  # model | untrained | no-tools
        ("model", pa.string()),  # checkpoint folder or model name
        ("question_id", pa.string()),
        ("line", pa.int32()),  # 1-based line (row) in the question file
        ("run", pa.int32()),
        ("question", pa.string()),
        ("topic_names", pa.list_(pa.string())),
        ("gold", pa.list_(pa.string())),
        ("predicted", pa.list_(pa.string())),  # empty when no answer parsed
        ("em_strict", pa.float64()),
        ("hit", pa.float64()),
        ("f1", pa.float64()),
        ("hits_at_1", pa.float64()),
        ("rhits_at_1", pa.float64()),
        ("precision", pa.float64()),
        ("recall", pa.float64()),
        ("hops", pa.int32()),
        ("qtype", pa.string()),
        ("structure", pa.string()),
        ("answered", pa.bool_()),
        ("forced_answer", pa.bool_()),
        ("num_turns", pa.int32()),
        ("tool_errors", pa.int32()),
        ("format_errors", pa.int32()),
        ("llm_errors", pa.int32()),
        ("generated_tokens", pa.int64()),
        ("tool_calls", pa.list_(pa.string())),
        ("messages", pa.list_(MESSAGE)),
        ("turns", pa.list_(TURN)),
    ]
)


# --- checking a stage's input ----------------------------------------------------------------

# Columns added after files were written without them, and what such a file holds in them.
FILLED_WHEN_MISSING: dict[str, str] = {"sexpr": ""}


def fill_missing(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with the columns of ``schema`` named in :data:`FILLED_WHEN_MISSING` that it
    lacks added, filled with their value (an older file reads as it did)."""
    for name, value in FILLED_WHEN_MISSING.items():
        if name in schema.names and name not in table.column_names:
            column = pa.array([value] * table.num_rows, schema.field(name).type)
            table = table.append_column(schema.field(name), column)
    return table


def _same_shape(found: pa.DataType, expected: pa.DataType) -> bool:
    """``found`` holds what ``expected`` does: string/large_string alike, any list kind, any
    integer width, structs with (at least) the expected fields."""
    t = pa.types
    if t.is_string(expected) or t.is_large_string(expected):
        return t.is_string(found) or t.is_large_string(found) or t.is_string_view(found)
    if t.is_integer(expected):
        return t.is_integer(found)
    if t.is_floating(expected):
        return t.is_floating(found) or t.is_integer(found)
    if t.is_list(expected) or t.is_large_list(expected):
        lists = (t.is_list, t.is_large_list, t.is_fixed_size_list, t.is_list_view)
        return any(f(found) for f in lists) and _same_shape(found.value_type, expected.value_type)
    if t.is_struct(expected):
        if not t.is_struct(found):
            return False
        names = [found.field(i).name for i in range(found.num_fields)]
        return all(
            expected.field(i).name in names
            and _same_shape(found.field(expected.field(i).name).type, expected.field(i).type)
            for i in range(expected.num_fields)
        )
    return found.equals(expected)


def _first_null(array: pa.Array, rows: np.ndarray, where: str) -> tuple[int, str] | None:
    """``(row, place)`` of the first null anywhere inside ``array`` (lists and structs are
    searched through; ``rows[i]`` is the table row of ``array[i]``), or None."""
    if array.null_count:
        index = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        return int(rows[index]), where
    kind = array.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        return _first_null(pc.list_flatten(array), rows[parents], f"{where}[]")
    if pa.types.is_struct(kind):
        for i, child in enumerate(array.flatten()):
            found = _first_null(child, rows, f"{where}.{kind.field(i).name}")
            if found:
                return found
    return None


def check_types(
    table: pa.Table, path: object, flag: str, schema: pa.Schema, columns: Iterable[str]
) -> None:
    """Each of ``columns`` that the table holds has ``schema``'s type (as in
    :func:`check_columns`, nulls allowed): a column a stage only carries through to its output
    is checked before any row is worked on, not when the output is written."""
    for name in sorted(columns):
        if name not in table.column_names or name not in schema.names:
            continue
        expected, found = schema.field(name).type, table.schema.field(name).type
        if not _same_shape(found, expected):
            raise InputFileError(
                path, f"{flag}: column {name} has type {found}; expected {expected}"
            )


def check_columns(
    table: pa.Table, path: object, flag: str, schema: pa.Schema, columns: Iterable[str]
) -> None:
    """Each of ``columns`` has ``schema``'s type (up to string, list and integer widths) and no
    nulls at any depth; otherwise an :class:`InputFileError` naming the file, the column and,
    for a null, the row (counted from 0)."""
    check_types(table, path, flag, schema, columns)
    for name in sorted(columns):
        column = table.column(name)
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        null = _first_null(array, np.arange(len(array)), name)
        if null is not None:
            row, where = null
            raise InputFileError(path, f"{flag}: row {row}: {where} is null")
