"""A stage's rows in and out: its input Parquet read as rows with errors that name the file, the
column, the row and the field (:func:`read_rows`), and its accepted and rejected rows written
into its staged output (:func:`write_rows`, beside :class:`~kgsynth.core.stage_io.StagedOutput`)."""

from __future__ import annotations

from pathlib import Path

from kgsynth.core.errors import InputFileError
from kgsynth.core.stage_io import StagedOutput, recover_input, sidecar


def read_rows(path: Path, flag: str, need: set[str], produced_by: str, schema) -> list[dict]:
    """A stage's input Parquet as rows; errors name the file and the missing column, the
    column of the wrong type, or the row and field that is null or does not fit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kgsynth.core.schema import check_columns, check_types, fill_missing

    recover_input(path)  # a commit of it that a crash interrupted is finished first
    if not path.is_file():
        raise InputFileError(path, f"{flag}: no such file (run `{produced_by}` first)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputFileError(path, f"{flag}: not a readable Parquet file: {exc}") from None
    table = fill_missing(table, schema)
    missing = need - set(table.column_names)
    if missing:
        raise InputFileError(path, f"{flag}: missing column(s) {', '.join(sorted(missing))}")
    check_columns(table, path, flag, schema, need)
    check_types(table, path, flag, schema, set(schema.names) - need)
    rows = table.to_pylist()
    if {"topic_names", "branches", "merge_at"} <= need:
        for i, row in enumerate(rows):
            sizes = {len(row["topic_names"]), len(row["branches"]), len(row["merge_at"])}
            if len(sizes) != 1 or not row["branches"]:
                raise InputFileError(
                    path,
                    f"{flag}: row {i}: topic_names, branches and merge_at need one entry per "
                    f"branch (found {len(row['topic_names'])}, {len(row['branches'])}, "
                    f"{len(row['merge_at'])})",
                )
            for b, (hops, merge) in enumerate(zip(row["branches"], row["merge_at"], strict=True)):
                if not hops or not 0 < merge <= len(hops):
                    raise InputFileError(
                        path,
                        f"{flag}: row {i}: merge_at[{b}] = {merge} does not fit branch {b} "
                        f"of {len(hops)} hop(s)",
                    )
    return rows


def write_rows(
    staged: StagedOutput, accepted: list, schema, rejected: list, rejected_schema
) -> Path:
    """The stage's rows and its rejects (``NAME.rejected.parquet``), into the staged output;
    returns where the rejects will be once committed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(accepted, schema=schema), staged.path())
    pq.write_table(
        pa.Table.from_pylist(rejected, schema=rejected_schema), staged.sidecar("rejected.parquet")
    )
    return sidecar(staged.out, "rejected.parquet")


__all__ = ["read_rows", "write_rows"]
