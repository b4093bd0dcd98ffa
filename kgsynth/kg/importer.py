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
import gzip
import hashlib
import io
import json
import logging
import os
import shutil
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Literal

import pyoxigraph as ox

from kgsynth import __version__
from kgsynth.errors import ConfigError, InputFileError
from kgsynth.kg import sparql
from kgsynth.kg.arrow_import import DelimitedResult, NeedsLineReader, delimited_to_ntriples
from kgsynth.kg.embedded import META_FILE, NAMES_FILE, STORE_SUBDIR, is_store_dir
from kgsynth.kg.fanout_build import table_from_store, write_fanout_table
from kgsynth.kg.fanouts import FANOUTS_DIR
from kgsynth.kg.names import NameIndexWriter, build_name_index
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


def _open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 text file (optionally gzipped); a file that is not
    UTF-8 text, or a broken gzip stream, is an :class:`InputFileError` naming the line."""
    try:
        with _open_text(path) as fh:
            yield from enumerate(fh, 1)
    except UnicodeDecodeError:
        # the text layer decodes in chunks, so find the line again byte by byte
        with _open_bytes(path) as raw:
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


def _open_bytes(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sniff_delimiter(path: Path) -> str:
    for _, line in _text_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        if line.count("\t") == 2:
            return "\t"
        if line.count("|") == 2:
            return "|"
        break
    return "\t"


def read_names(path: Path) -> dict[str, str]:
    """An ``id<TAB>name`` file as a dict; malformed lines are an error naming the line."""
    names: dict[str, str] = {}
    if not path.is_file():
        raise InputFileError(path, "--names: no such file")
    for lineno, line in _text_lines(path):
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
    for lineno, line in _text_lines(path):
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


def _literal_nt(text: str, lang: str | None) -> str:
    return sparql.literal(text, lang)


def _delimited_to_ntriples(
    src: Path,
    dest: Path,
    delimiter: str,
    profile: KGProfile,
    names: dict[str, str] | None,
) -> None:
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
                        out.write(
                            f"{sparql.iri(iri)} {label_pred} {_literal_nt(name, profile.label_lang)} .\n"
                        )
            except ValueError as exc:
                raise InputFileError(src, f"cannot be written as RDF: {exc}", lineno) from None


def _convert_delimited(
    src: Path,
    dest: Path,
    delimiter: str,
    profile: KGProfile,
    names: dict[str, str] | None,
    names_index: Path,
) -> DelimitedResult | None:
    """Convert in Arrow batches, writing the name index as it goes; a file that needs the
    line-by-line reader (see :mod:`kgsynth.kg.arrow_import`) is converted by it and None is
    returned (the counts and names then come from the store)."""
    writer = NameIndexWriter(names_index)
    try:
        result = delimited_to_ntriples(src, dest, delimiter, profile, names, writer.add)
    except NeedsLineReader as why:
        writer.discard()
        log.info("%s: converting line by line (%s)", src, why)
        _delimited_to_ntriples(src, dest, delimiter, profile, names)
        return None
    except BaseException:
        writer.discard()
        raise
    writer.close()
    return result


def _sample_relations(src: Path, fmt: ImportFormat, delimiter: str) -> list[str]:
    rels: list[str] = []
    if fmt == "tsv":
        for i, (_, _, r, _) in enumerate(read_delimited(src, delimiter)):
            rels.append(r)
            if i >= 1000:
                break
        return rels
    for i, line in _text_lines(src):
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
    fmt = fmt or detect_format(src)
    if fmt not in ("nt", "ttl", "tsv"):
        raise ConfigError(f"--format: unknown format {fmt!r}; choose nt, ttl or tsv")
    if fmt == "tsv":
        delimiter = delimiter or _sniff_delimiter(src)
        if delimiter == "\\t":
            delimiter = "\t"
    prof = get_profile(
        profile or guess_profile_from_relations(_sample_relations(src, fmt, delimiter or "\t"))
    )
    names = read_names(Path(names_file)) if names_file else None

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.importing-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        store = ox.Store(str(tmp / STORE_SUBDIR))
        fast: DelimitedResult | None = None
        if fmt == "tsv":
            nt = tmp / "import.nt"
            fast = _convert_delimited(src, nt, delimiter or "\t", prof, names, tmp / NAMES_FILE)
            if fast is not None and fast.fact_ids is not None and not prof.flatten_unnamed:
                # before bulk_load: the ids are freed before the engine's own peak. The names
                # are every entity's only name unless a fact of the file is a name triple too
                complete = not fast.relation_iris & set(prof.label_predicates)
                table_started = time.perf_counter()
                write_fanout_table(
                    tmp / FANOUTS_DIR,
                    fast.fact_ids,
                    fast.entity_iris,
                    fast.predicate_iris,
                    profile=prof.name,
                    labels=fast.entity_names if complete else None,
                )
                log.info("fan-out table in %.1fs", time.perf_counter() - table_started)
            if fast is not None:
                fast.fact_ids, fast.entity_iris, fast.entity_names = None, [], None
                gc.collect()
            store.bulk_load(path=str(nt), format=ox.RdfFormat.N_TRIPLES)
            nt.unlink()
        else:
            rdf_format = ox.RdfFormat.N_TRIPLES if fmt == "nt" else ox.RdfFormat.TURTLE
            try:
                with _open_bytes(src) as fh:
                    store.bulk_load(fh, rdf_format)
            except SyntaxError as exc:
                raise InputFileError(src, f"{fmt} syntax error: {exc.msg}", exc.lineno) from None
        store.flush()
        if not prof.flatten_unnamed and not (tmp / FANOUTS_DIR).is_dir():
            # not converted in batches: the fan-out table from the store's triples
            table_from_store(store, tmp / FANOUTS_DIR, profile=prof.name)

        label_values = " ".join(sparql.iri(p) for p in prof.label_predicates)
        label_filter = (
            f"FILTER(?p NOT IN ({', '.join(sparql.iri(p) for p in prof.label_predicates)}))"
        )
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
        # what every walk run reads first (relation frequencies): one scan here instead of
        # one per run
        relation_triples = {
            sol["p"].value: int(sol["n"].value)
            for sol in store.query("SELECT ?p (COUNT(*) AS ?n) WHERE { ?s ?p ?o } GROUP BY ?p")
        }
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
            "triples": triples,
            "facts": facts,
            "entities": entities,
            "relations": relations,
            "named_entities": named,
            "relation_triples": relation_triples,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        if out.exists():
            old = out.parent / f".{out.name}.replaced-{os.getpid()}"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ImportReport(
        store=str(out),
        profile=prof.name,
        format=fmt,
        triples=triples,
        facts=facts,
        entities=entities,
        relations=relations,
        named_entities=named,
        seconds=round(time.perf_counter() - started, 3),
        store_bytes=_dir_bytes(out),
    )
