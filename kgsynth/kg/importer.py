"""``kgsynth kg import``: a triple file -> an embedded store directory.

Input formats: N-Triples and Turtle (parsed by pyoxigraph), and delimited triple files
(``subject|relation|object`` like MetaQA's kb.txt, or TSV like FB15k-237), optionally gzipped.
Delimited files become RDF with deterministic IRIs minted from the names (or from ids, with
``--names id<TAB>name`` supplying the labels); each entity's name is written with the
profile's label predicate. The store is built in a sibling temporary directory and moved into
place only when complete, so a failed import leaves nothing half-written.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import pyoxigraph as ox

from kgsynth import __version__
from kgsynth.core.errors import ConfigError, InputFileError
from kgsynth.kg import sparql
from kgsynth.kg.arrow_import import DelimitedResult
from kgsynth.kg.delimited import (
    Conversion,
    convert,
    open_bytes,
    read_delimited,
    read_names,
    text_lines,
)
from kgsynth.kg.embedded import META_FILE, NAMES_FILE, STORE_SUBDIR, is_store_dir
from kgsynth.kg.fanout_build import table_from_store
from kgsynth.kg.fanouts import FANOUTS_DIR
from kgsynth.kg.names import build_name_index
from kgsynth.kg.profiles import KGProfile, get_profile, guess_profile_from_relations

log = logging.getLogger(__name__)

ImportFormat = Literal["nt", "ttl", "tsv"]


@dataclass(frozen=True)
class ImportReport:
    """What an import produced."""

    store: str
    profile: str
    format: str
    triples: int
    facts: int
    entities: int
    relations: int
    named_entities: int
    seconds: float
    store_bytes: int
    # the fan-out table's share of ``seconds`` when the conversion built it (else None)
    table_seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def detect_format(path: Path) -> ImportFormat:
    """Format from the file name (``.nt``, ``.ttl``; anything else is delimited)."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith((".nt", ".ntriples")):
        return "nt"
    if name.endswith((".ttl", ".turtle")):
        return "ttl"
    return "tsv"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sniff_delimiter(path: Path) -> str:
    for _, line in text_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        if line.count("\t") == 2:
            return "\t"
        if line.count("|") == 2:
            return "|"
        break
    return "\t"


def _sample_relations(src: Path, fmt: ImportFormat, delimiter: str) -> list[str]:
    rels: list[str] = []
    if fmt == "tsv":
        for i, (_, _, r, _) in enumerate(read_delimited(src, delimiter)):
            rels.append(r)
            if i >= 1000:
                break
        return rels
    for i, line in text_lines(src):
        parts = line.split()
        if len(parts) >= 3 and parts[1].startswith("<"):
            rels.append(parts[1].strip("<>"))
        if i > 2000:
            break
    return rels


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _count(store: ox.Store, query: str) -> int:
    result = store.query(query)
    return int(next(iter(result))["n"].value)


def _check_paths(src: Path, out: Path, *, force: bool) -> None:
    """Refuse a missing source, an ``out`` that must not be replaced, or one holding ``src``."""
    if not src.is_file():
        raise InputFileError(
            src, "is a directory; give a triple file" if src.is_dir() else "no such file"
        )
    if out.exists() and not force:
        raise ConfigError(
            f"--out: {out} already exists; pass --overwrite to replace it, or choose another --out"
        )
    if out.exists() and not (is_store_dir(out) or (out.is_dir() and not any(out.iterdir()))):
        # --force replaces a kgsynth store (kg.json + store/), never a folder of other files
        raise ConfigError(
            f"--out: {out} is not a kgsynth store (no {META_FILE} and {STORE_SUBDIR}/); "
            "--overwrite replaces only a store: choose a new folder"
        )
    if src.resolve().is_relative_to(out.resolve()):
        raise ConfigError(f"--out: {out} holds the input file {src}; choose another folder")


def _resolve_format(
    src: Path, fmt: ImportFormat | None, delimiter: str | None
) -> tuple[ImportFormat, str | None]:
    """The format (given or from the file name) and, for a delimited file, its delimiter."""
    fmt = fmt or detect_format(src)
    if fmt not in ("nt", "ttl", "tsv"):
        raise ConfigError(f"--format: unknown format {fmt!r}; choose nt, ttl or tsv")
    if fmt == "tsv":
        delimiter = delimiter or _sniff_delimiter(src)
        if delimiter == "\\t":
            delimiter = "\t"
    return fmt, delimiter


def _load(
    store: ox.Store,
    src: Path,
    tmp: Path,
    fmt: ImportFormat,
    delimiter: str | None,
    prof: KGProfile,
    names_file: str | Path | None,
) -> DelimitedResult | None:
    """Load ``src`` into ``store``; what the Arrow conversion of a delimited file saw (None
    for RDF files and files converted line by line)."""
    if fmt != "tsv":
        rdf_format = ox.RdfFormat.N_TRIPLES if fmt == "nt" else ox.RdfFormat.TURTLE
        try:
            with open_bytes(src) as fh:
                store.bulk_load(fh, rdf_format)
        except SyntaxError as exc:
            raise InputFileError(src, f"{fmt} syntax error: {exc.msg}", exc.lineno) from None
        return None
    nt = tmp / "import.nt"
    job = Conversion(
        src=src,
        nt=nt,
        delimiter=delimiter or "\t",
        profile=prof.name,
        names_file=Path(names_file) if names_file else None,
        names_index=tmp / NAMES_FILE,
        table_dir=None if prof.flatten_unnamed else tmp / FANOUTS_DIR,
    )
    # before bulk_load, and for a large file in a child process: the conversion's
    # memory is gone before the engine's own peak
    fast = convert(job)
    gc.collect()
    store.bulk_load(path=str(nt), format=ox.RdfFormat.N_TRIPLES)
    nt.unlink()
    return fast


@dataclass(frozen=True)
class _Counts:
    """What the store holds, for ``kg.json`` and the report."""

    triples: int
    facts: int
    entities: int
    relations: int
    named: int


def _counts(
    store: ox.Store, src: Path, tmp: Path, prof: KGProfile, fast: DelimitedResult | None
) -> _Counts:
    """Count the store's triples, facts, entities, relations and named entities (and write
    the name index where the conversion's may be incomplete); a store without facts is an
    error naming ``src``."""
    label_values = " ".join(sparql.iri(p) for p in prof.label_predicates)
    label_filter = f"FILTER(?p NOT IN ({', '.join(sparql.iri(p) for p in prof.label_predicates)}))"
    if fast is not None and not fast.relation_iris & set(prof.label_predicates):
        # the conversion wrote one name triple per named entity and no fact along a
        # name predicate: the counts follow without scanning the store again
        triples = len(store)
        facts = triples - fast.names_written
        entities = fast.entities
        relations = len(fast.relation_iris)
        named = fast.names_written
    else:
        if fast is not None:  # names written by the conversion may be joined by others
            (tmp / NAMES_FILE).unlink(missing_ok=True)
        triples = _count(store, "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }")
        facts = _count(store, f"SELECT (COUNT(*) AS ?n) WHERE {{ ?s ?p ?o {label_filter} }}")
        entities = relations = named = -1
    if facts == 0:  # a store without facts has no walks, no tools, nothing to learn
        raise InputFileError(
            src,
            "holds only names, no facts between entities"
            if triples
            else "holds no triples (an empty or blank file)",
        )
    if entities < 0:
        entities = _count(
            store,
            "SELECT (COUNT(DISTINCT ?e) AS ?n) WHERE { { ?e ?p ?o "
            f"{label_filter} }} UNION {{ ?s ?p ?e {label_filter} FILTER(!isLiteral(?e)) }} }}",
        )
        relations = _count(
            store, f"SELECT (COUNT(DISTINCT ?p) AS ?n) WHERE {{ ?s ?p ?o {label_filter} }}"
        )
        pairs = [
            (sol["e"].value, sol["l"].value)
            for sol in store.query(
                f"SELECT ?e ?l WHERE {{ VALUES ?lp {{ {label_values} }} ?e ?lp ?l FILTER(isIRI(?e)) }}"
            )
            if (sol["l"].language or "") in prof.label_langs
        ]
        named = build_name_index(tmp / NAMES_FILE, pairs)
    return _Counts(triples, facts, entities, relations, named)


def _relation_triples(store: ox.Store, fast: DelimitedResult | None) -> dict[str, int]:
    """The store's triples per predicate IRI: what every walk run reads first (relation
    frequencies), counted once here instead of once per run."""
    return (fast.relation_triples if fast is not None else None) or {
        sol["p"].value: int(sol["n"].value)
        for sol in store.query("SELECT ?p (COUNT(*) AS ?n) WHERE { ?s ?p ?o } GROUP BY ?p")
    }


def _move_into_place(tmp: Path, out: Path) -> None:
    """Replace ``out`` (if any) with the finished store in ``tmp``."""
    if out.exists():
        old = out.parent / f".{out.name}.replaced-{os.getpid()}"
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def import_kg(
    src: str | Path,
    out: str | Path,
    *,
    fmt: ImportFormat | None = None,
    delimiter: str | None = None,
    profile: str | None = None,
    names_file: str | Path | None = None,
    force: bool = False,
) -> ImportReport:
    """Import ``src`` into a new store directory ``out``; see the module docstring."""
    started = time.perf_counter()
    src, out = Path(src), Path(out)
    _check_paths(src, out, force=force)
    fmt, delimiter = _resolve_format(src, fmt, delimiter)
    prof = get_profile(
        profile or guess_profile_from_relations(_sample_relations(src, fmt, delimiter or "\t"))
    )
    if names_file and fmt != "tsv":
        read_names(Path(names_file))  # checked (a delimited file's conversion reads it)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.importing-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        store = ox.Store(str(tmp / STORE_SUBDIR))
        fast = _load(store, src, tmp, fmt, delimiter, prof, names_file)
        store.flush()
        if not prof.flatten_unnamed and not (tmp / FANOUTS_DIR).is_dir():
            # not converted in batches: the fan-out table from the store's triples
            table_from_store(store, tmp / FANOUTS_DIR, profile=prof.name)
        counts = _counts(store, src, tmp, prof, fast)
        relation_triples = _relation_triples(store, fast)
        del store
        gc.collect()

        meta = {
            "kgsynth_version": __version__,
            "profile": prof.name,
            "format": fmt,
            "delimiter": delimiter if fmt == "tsv" else None,
            "source": str(src),
            "source_sha256": fast.source_sha256
            if fast and fast.source_sha256
            else file_sha256(src),
            "names_file": str(names_file) if names_file else None,
            "triples": counts.triples,
            "facts": counts.facts,
            "entities": counts.entities,
            "relations": counts.relations,
            "named_entities": counts.named,
            "relation_triples": relation_triples,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ImportReport(
        store=str(out),
        profile=prof.name,
        format=fmt,
        triples=counts.triples,
        facts=counts.facts,
        entities=counts.entities,
        relations=counts.relations,
        named_entities=counts.named,
        seconds=round(time.perf_counter() - started, 3),
        store_bytes=_dir_bytes(out),
        table_seconds=round(fast.table_seconds, 3) if fast else None,
    )
