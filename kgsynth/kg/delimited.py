"""Delimited triple files (``s|r|o``, TSV) for ``kg import``: reading them, converting them to
N-Triples with the name index and the fan-out table, and doing that in a child process when
the file is large.

The conversion's memory grows with the input: the entity IRIs seen so far, the facts as ids,
the names, and what the allocators keep of them once they are freed (at 10 M facts the
process still held about 360 MB of it when the engine began to load, after ``gc.collect``
and ``malloc_trim``). A file of :data:`CHILD_MIN_BYTES` or more is therefore converted in a
child process whose memory goes back to the system when it exits, so the engine's
``bulk_load`` runs beside the parent's fixed footprint only. Smaller files are converted in
process: starting a child costs about a second of imports, most of a small import.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kgsynth.core.errors import InputFileError, KGSynthError
from kgsynth.kg import sparql
from kgsynth.kg.arrow_import import DelimitedResult, NeedsLineReader, delimited_to_ntriples
from kgsynth.kg.fanout_build import write_fanout_table
from kgsynth.kg.names import NameIndexWriter
from kgsynth.kg.profiles import KGProfile, get_profile

log = logging.getLogger(__name__)

# a source file (as stored: gzipped or not) of this size or more is converted in a child
# process; MetaQA's kb_partial.txt.gz is 1.1 MB, 1 M generated facts gzipped 12 MB, 10 M 134 MB
CHILD_MIN_BYTES = 32 << 20


def open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def open_bytes(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 text file (optionally gzipped); a file that is not
    UTF-8 text, or a broken gzip stream, is an :class:`InputFileError` naming the line."""
    try:
        with open_text(path) as fh:
            yield from enumerate(fh, 1)
    except UnicodeDecodeError:
        # the text layer decodes in chunks, so find the line again byte by byte
        with open_bytes(path) as raw:
            for lineno, data in enumerate(raw, 1):
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError as exc:
                    bad = data[exc.start : exc.start + 1].hex()
                    raise InputFileError(
                        path,
                        f"not UTF-8 text (byte 0x{bad} cannot be decoded); a binary file?",
                        lineno,
                    ) from None
        raise InputFileError(path, "not UTF-8 text; a binary file?") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise InputFileError(path, f"not a readable gzip file: {exc}") from None


def read_names(path: Path) -> dict[str, str]:
    """An ``id<TAB>name`` file as a dict; malformed lines are an error naming the line."""
    names: dict[str, str] = {}
    if not path.is_file():
        raise InputFileError(path, "--names: no such file")
    for lineno, line in text_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        key, sep, name = line.partition("\t")
        if not sep or not key.strip() or not name.strip():
            raise InputFileError(path, "expected 'id<TAB>name'", lineno)
        names.setdefault(key.strip(), name.strip())
    return names


def read_delimited(path: Path, delimiter: str) -> Iterator[tuple[int, str, str, str]]:
    """``(line number, subject, relation, object)`` for each non-blank line."""
    for lineno, line in text_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        parts = line.split(delimiter)
        if len(parts) != 3:
            raise InputFileError(
                path,
                f"expected 3 fields separated by {delimiter!r}, found {len(parts)}",
                lineno,
            )
        s, r, o = (p.strip() for p in parts)
        if not s or not r or not o:
            raise InputFileError(path, "empty subject, relation or object", lineno)
        yield lineno, s, r, o


def _line_by_line(
    src: Path, dest: Path, delimiter: str, profile: KGProfile, names: dict[str, str] | None
) -> None:
    """The reference conversion, one line at a time (it names the line of any fault)."""
    label_pred = sparql.iri(profile.label_predicate)
    labelled: set[str] = set()
    with open(dest, "w", encoding="utf-8") as out:
        for lineno, s, r, o in read_delimited(src, delimiter):
            try:
                s_iri, o_iri = profile.entity_iri(s), profile.entity_iri(o)
                triple = f"{sparql.iri(s_iri)} {sparql.iri(profile.relation_iri(r))} "
                out.write(f"{triple}{sparql.iri(o_iri)} .\n")
                for key, iri in ((s, s_iri), (o, o_iri)):
                    if iri in labelled:
                        continue
                    labelled.add(iri)
                    name = names.get(key) if names is not None else key
                    if name is not None:
                        literal = sparql.literal(name, profile.label_lang)
                        out.write(f"{sparql.iri(iri)} {label_pred} {literal} .\n")
            except ValueError as exc:
                raise InputFileError(src, f"cannot be written as RDF: {exc}", lineno) from None


@dataclass(frozen=True)
class Conversion:
    """One delimited file's conversion: where it reads and writes (picklable, for a child)."""

    src: Path
    nt: Path  # the N-Triples written for bulk_load
    delimiter: str
    profile: str
    names_file: Path | None
    names_index: Path  # the name index (sqlite)
    table_dir: Path | None  # the fan-out table's folder; None: the profile keeps no table


def convert(job: Conversion) -> DelimitedResult | None:
    """Run ``job``, in a child process when the source file is at least
    :data:`CHILD_MIN_BYTES`. Returns what the Arrow conversion saw, without the facts, IRIs
    and names it held (they stay in the process that built the table), or None when the file
    needed the line-by-line reader (the counts, names and table then come from the store).
    Errors are raised here as the conversion raised them."""
    if job.src.stat().st_size < CHILD_MIN_BYTES:
        return _run(job)
    started = time.perf_counter()
    # a fresh interpreter calling :func:`child`, not multiprocessing: a spawned process
    # would run the caller's main script again, which a script without a main guard cannot
    # take
    with tempfile.TemporaryDirectory(prefix=".convert-", dir=job.nt.parent) as tmp:
        job_file, result_file = Path(tmp) / "job.pickle", Path(tmp) / "result.pickle"
        job_file.write_bytes(pickle.dumps(job))
        code = spawn(
            [sys.executable, "-c", _CHILD, str(job_file), str(result_file)],
            log.getEffectiveLevel(),
        )
        if not result_file.is_file():
            raise KGSynthError(
                f"{job.src}: the conversion's child process ended with exit code {code} "
                "before it finished (out of memory?); nothing was imported"
            )
        ok, value = pickle.loads(result_file.read_bytes())
    if not ok:
        raise value
    log.info("converted in a child process in %.1fs", time.perf_counter() - started)
    return value


_CHILD = "import sys; from kgsynth.kg.delimited import child; child(*sys.argv[1:3])"


def spawn(argv: list[str], level: int) -> int:
    """Run the child (its log lines at the parent's ``level`` go to stderr); its exit code.
    The child imports the kgsynth this process runs, also where that is not installed."""
    here = str(Path(sys.modules["kgsynth"].__file__).resolve().parent.parent)  # the import root
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, KGSYNTH_CONVERT_LOG_LEVEL=str(level), PYTHONPATH=path)
    return subprocess.run(argv, env=env, check=False).returncode


def _run(job: Conversion) -> DelimitedResult | None:
    profile = get_profile(job.profile)
    names = read_names(job.names_file) if job.names_file else None
    writer = NameIndexWriter(job.names_index)
    try:
        result = delimited_to_ntriples(job.src, job.nt, job.delimiter, profile, names, writer.add)
    except NeedsLineReader as why:
        writer.discard()
        log.info("%s: converting line by line (%s)", job.src, why)
        _line_by_line(job.src, job.nt, job.delimiter, profile, names)
        return None
    except BaseException:
        writer.discard()
        raise
    writer.close()
    if job.table_dir is not None and result.fact_ids is not None:
        # the names are every entity's only name unless a fact of the file is a name
        # triple too
        complete = not result.relation_iris & set(profile.label_predicates)
        started = time.perf_counter()
        meta = write_fanout_table(
            job.table_dir,
            result.fact_ids,
            result.entity_iris,
            result.predicate_iris,
            profile=profile.name,
            labels=result.entity_names if complete else None,
        )
        result.table_seconds = time.perf_counter() - started
        if meta is not None and complete:
            # the store's triples per predicate: the facts' (the table counted them) and one
            # name triple per named entity
            result.relation_triples = dict(
                zip(result.predicate_iris, meta["predicate_facts"], strict=True)
            )
            if result.names_written:
                result.relation_triples[profile.label_predicate] = result.names_written
        log.info("fan-out table in %.1fs", result.table_seconds)
    result.fact_ids, result.entity_iris, result.entity_names = None, [], None
    return result


def child(job_file: str, result_file: str) -> None:
    """The child process: runs the pickled job, pickles its result or its error."""
    logging.basicConfig(
        level=int(os.environ.get("KGSYNTH_CONVERT_LOG_LEVEL", logging.WARNING)),
        format="%(levelname)s %(name)s: %(message)s",
    )
    job = pickle.loads(Path(job_file).read_bytes())
    try:
        out: tuple[bool, object] = (True, _run(job))
    except Exception as exc:  # raised again in the parent
        out = (False, exc)
    Path(result_file).write_bytes(pickle.dumps(out))
