"""Delimited triple files (``s|r|o``, TSV) -> N-Triples in Arrow batches, for ``kg import``.

The file is read once, in blocks, by Arrow's CSV reader (quoting off, three columns); each
block becomes N-Triples with vectorized string operations (polars): IRIs minted exactly as
:meth:`KGProfile.entity_iri` and :meth:`KGProfile.relation_iri` mint them, a name triple for
each entity the first time it is seen, and the rows of the case-insensitive name index. No
Python code runs per line; per entity, only names that are not printable ASCII are normalized
in Python. Memory holds one block, the entity IRIs seen so far and the facts as ids (10 bytes
a fact, for the fan-out table).

A file this reader cannot take exactly as the line-by-line reader would (a malformed line, an
empty field, a name no SPARQL literal can hold, an IRI that is not valid, text that is not
UTF-8, a byte-order mark) raises :class:`NeedsLineReader`; the importer then converts it line
by line, which names the file and line of the fault, or succeeds where that reader does (it
skips lines of whitespace, for one).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import quote

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv

from kgsynth.kg import sparql
from kgsynth.kg.profiles import FREEBASE_NS, KGProfile

BLOCK_BYTES = 4 << 20  # text per batch: ~120k lines of 35 bytes
# what Python's str.strip() strips (str.isspace), which the line-by-line reader applies
PY_WHITESPACE = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())
_ASCII_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_ASCII_UNSAFE = [chr(c) for c in range(128) if chr(c) not in _ASCII_SAFE]
_ECHAR = ["\\", '"', "'", "\n", "\r", "\t", "\b", "\f"]
_ECHAR_OUT = ["\\\\", '\\"', "\\'", "\\n", "\\r", "\\t", "\\b", "\\f"]
# sparql.literal's unsendable characters (lone surrogates cannot occur in decoded text)
_UNSENDABLE = r"[\x00-\x08\x0B\x0E-\x1F\x7F\x{FFFE}\x{FFFF}]"
_BAD_IRI = r'[\x00-\x20<>"{}|^`\\]'
_NON_ASCII = r"[^\x00-\x7F]"


class NeedsLineReader(Exception):
    """The file must be converted line by line (see the module docstring)."""


@dataclass
class DelimitedResult:
    """What the conversion saw: name triples written, distinct entity IRIs, relation IRIs."""

    names_written: int = 0
    entities: int = 0
    relation_iris: set[str] = field(default_factory=set)
    source_sha256: str = ""
    # the facts as ids (columns s, p, o) into ``entity_iris`` and ``predicate_iris``, for the
    # fan-out table (:mod:`kgsynth.kg.fanouts`)
    fact_ids: dict[str, np.ndarray] | None = None
    entity_iris: list[str] = field(default_factory=list)
    entity_names: pl.Series | None = None  # by id; null: unnamed
    predicate_iris: list[str] = field(default_factory=list)
    table_seconds: float = 0.0  # the fan-out table's build, when it was built from these
    # the store's triples per predicate IRI, when the table counted them (else None)
    relation_triples: dict[str, int] | None = None


def percent_encode(values: pl.Series) -> pl.Series:
    """``urllib.parse.quote(v, safe="")`` of every value, vectorized."""
    patterns = list(_ASCII_UNSAFE)
    replacements = [f"%{ord(c):02X}" for c in patterns]
    if (values.str.len_bytes() != values.str.len_chars()).any():
        for ch in values.str.extract_all(_NON_ASCII).explode().drop_nulls().unique().to_list():
            patterns.append(ch)
            replacements.append(quote(ch, safe=""))
    return values.str.replace_many(patterns, replacements)


def freebase_ids(values: pl.Series) -> pl.Series:
    """:func:`kgsynth.kg.profiles.freebase_id` of every value, vectorized."""
    dotted = (
        values.str.split("./")
        .list.eval(pl.element().str.strip_chars("/").str.replace_all("/", ".", literal=True))
        .list.join(".")
    )
    return pl.select(
        pl.when(values.str.starts_with("/")).then(dotted).otherwise(values)
    ).to_series()


def entity_iris(values: pl.Series, profile: KGProfile) -> pl.Series:
    """:meth:`KGProfile.entity_iri` of every value, vectorized; an IRI that
    :func:`sparql.iri` would refuse raises :class:`NeedsLineReader`."""
    if profile.name == "freebase":
        iris = FREEBASE_NS + freebase_ids(values)
        if iris.str.contains(_BAD_IRI).any():
            raise NeedsLineReader("an entity id is not a valid IRI")
        return iris
    # percent-encoded text holds no character an IRI may not
    return profile.entity_namespace + percent_encode(values)


def normalized_names(names: pl.Series) -> pl.Series:
    """:func:`sparql.normalize_name` of every name: vectorized for printable ASCII (where NFKC
    changes nothing and case-folding is lower-casing), in Python for the rest."""
    ascii_ = names.str.contains(r"^[\x20-\x7E]*$")
    fast = names.str.to_lowercase().str.replace_all(" +", " ").str.strip_chars(" ")
    if ascii_.all():
        return fast
    slow = names.map_elements(sparql.normalize_name, return_dtype=pl.String, skip_nulls=True)
    return pl.select(pl.when(ascii_).then(fast).otherwise(slow)).to_series()


def nt_literals(names: pl.Series, lang: str | None) -> pl.Series:
    """:func:`sparql.literal` of every name (ECHAR escapes, optional language tag)."""
    if names.str.contains(_UNSENDABLE).any():
        raise NeedsLineReader("a name holds control characters")
    body = '"' + names.str.replace_many(_ECHAR, _ECHAR_OUT) + '"'
    return body + f"@{lang}" if lang else body


class _HashingReader(io.RawIOBase):
    """Reads ``raw`` and hashes what it read (the source is read once)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        n = self.raw.readinto(buffer)
        if n:
            self.digest.update(memoryview(buffer)[:n])
        return n


def _first_keys(
    s_iri: pl.Series, s: pl.Series, o_iri: pl.Series, o: pl.Series, *, exact: bool
) -> pl.DataFrame:
    """Each IRI of the batch once, with the key that first minted it in line order (subject
    before object). Only the freebase profile mints one IRI from two keys (``/m/0x`` and
    ``m.0x``), so only there the order is kept (``exact``): elsewhere any key is the first."""
    n = s.len()
    subjects = pl.DataFrame({"iri": s_iri, "key": s, "pos": pl.int_range(0, 2 * n, 2, eager=True)})
    objects = pl.DataFrame({"iri": o_iri, "key": o, "pos": pl.int_range(1, 2 * n, 2, eager=True)})
    both = pl.concat([subjects, objects])
    if exact:  # keep="first" is the first row only when the rows keep their order
        return both.sort("pos").unique("iri", keep="first", maintain_order=True).drop("pos")
    return both.unique("iri").drop("pos")


def delimited_to_ntriples(
    src: Path,
    dest: Path,
    delimiter: str,
    profile: KGProfile,
    names: dict[str, str] | None,
    on_names: Callable[[list[tuple[str, str, str]]], None],
) -> DelimitedResult:
    """Write ``src``'s facts and its entities' name triples to ``dest`` (N-Triples); each
    batch's new name-index rows ``(normalized name, name, IRI)`` go to ``on_names``. The
    triples are those the line-by-line reader writes (a name for the first key that mints an
    IRI, in line order, subject before object)."""
    with open(src, "rb") as raw:
        hashing = _HashingReader(raw)
        stream: pa.NativeFile = pa.PythonFile(io.BufferedReader(hashing, 1 << 20), mode="r")
        if src.name.endswith(".gz"):
            stream = pa.CompressedInputStream(stream, "gzip")
        try:
            result = _convert(stream, dest, delimiter, profile, names, on_names)
        except (pa.ArrowException, OSError, EOFError, ValueError) as exc:
            raise NeedsLineReader(str(exc)) from None
        for block in iter(lambda: raw.read(1 << 20), b""):  # bytes the reader left unread
            hashing.digest.update(block)
        result.source_sha256 = hashing.digest.hexdigest()
        return result


# delimited_to_ntriples' arguments, passed through once the input stream is open
def _convert(
    stream: pa.NativeFile,
    dest: Path,
    delimiter: str,
    profile: KGProfile,
    names: dict[str, str] | None,
    on_names: Callable[[list[tuple[str, str, str]]], None],
) -> DelimitedResult:
    reader = _open_csv(stream, delimiter)
    result = DelimitedResult()
    label = sparql.iri(profile.label_predicate)
    names_df = (
        pl.DataFrame({"key": list(names), "name": list(names.values())}, orient="col")
        if names is not None
        else None
    )
    batches = _Batches(profile, label, names_df, on_names, result)
    first = True
    with open(dest, "wb") as out:
        for batch in reader:
            df = pl.from_arrow(batch)
            assert isinstance(df, pl.DataFrame)
            if first and df.height and df["s"][0].startswith("\ufeff"):
                raise NeedsLineReader("a byte-order mark")  # kept in the name line by line
            first = False
            df = df.with_columns(pl.all().str.strip_chars(PY_WHITESPACE))
            if df.select(pl.any_horizontal(pl.all().str.len_bytes() == 0).any()).item():
                raise NeedsLineReader("an empty subject, relation or object")
            lines = batches.lines(df)
            pl.concat(lines).write_csv(out, include_header=False, quote_style="never")
    return batches.finish()


def _open_csv(stream: pa.NativeFile, delimiter: str) -> pacsv.CSVStreamingReader:
    """Arrow's CSV reader over ``stream``: three string columns, quoting off, in blocks of
    :data:`BLOCK_BYTES`."""
    return pacsv.open_csv(
        stream,
        read_options=pacsv.ReadOptions(
            column_names=["s", "r", "o"], block_size=BLOCK_BYTES, use_threads=False
        ),
        parse_options=pacsv.ParseOptions(
            delimiter=delimiter, quote_char=False, escape_char=False, ignore_empty_lines=True
        ),
        convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in "sro"}, strings_can_be_null=False
        ),
    )


@dataclass
class _Batches:
    """What :func:`_convert` keeps from one batch to the next: the IRIs minted so far with
    their ids, the facts as ids and the names written."""

    profile: KGProfile
    label: str  # the label predicate, as N-Triples
    names_df: pl.DataFrame | None  # (key, name) from ``--names``; None: a key is its name
    on_names: Callable[[list[tuple[str, str, str]]], None]
    result: DelimitedResult
    # entity IRIs written so far (exact: a name is never dropped), each with its id
    seen: dict[str, int] = field(default_factory=dict)
    relation_nt: dict[str, str] = field(default_factory=dict)
    relation_id: dict[str, int] = field(default_factory=dict)  # relation key -> its IRI's id
    predicate_ids: dict[str, int] = field(default_factory=dict)
    fact_parts: list[dict[str, np.ndarray]] = field(default_factory=list)
    name_parts: list[pl.DataFrame] = field(default_factory=list)  # (id, name) of the named

    def lines(self, df: pl.DataFrame) -> list[pl.DataFrame]:
        """A cleaned batch's N-Triples lines: its facts, then a name triple for each entity
        it is the first to mint (their name-index rows go to ``on_names``)."""
        self._add_relations(df["r"])
        s_iri = entity_iris(df["s"], self.profile)
        o_iri = entity_iris(df["o"], self.profile)
        facts = pl.select(
            pl.concat_str(
                [
                    pl.lit("<"),
                    s_iri,
                    pl.lit("> "),
                    df["r"].replace_strict(self.relation_nt, return_dtype=pl.String),
                    pl.lit(" <"),
                    o_iri,
                    pl.lit("> ."),
                ]
            ).alias("line")
        )
        named = self._new_named(df, s_iri, o_iri)
        lines = [facts]
        if named.height:
            lines.append(self._name_lines(named))
        return lines

    def _add_relations(self, rels: pl.Series) -> None:
        """Mint the IRI (and id) of each relation key not seen before."""
        for rel in rels.unique(maintain_order=True).to_list():
            if rel not in self.relation_nt:
                try:
                    iri = self.profile.relation_iri(rel)
                    self.relation_nt[rel] = sparql.iri(iri)
                except ValueError as exc:
                    raise NeedsLineReader(str(exc)) from None
                self.result.relation_iris.add(iri)
                self.relation_id[rel] = self.predicate_ids.setdefault(iri, len(self.predicate_ids))

    def _new_named(self, df: pl.DataFrame, s_iri: pl.Series, o_iri: pl.Series) -> pl.DataFrame:
        """Give the batch's new IRIs their ids, keep its facts as ids; the new entities that
        have a name (columns iri, key, id, name)."""
        entities = _first_keys(
            s_iri, df["s"], o_iri, df["o"], exact=self.profile.name == "freebase"
        )
        iris = entities["iri"].to_list()
        before = len(self.seen)
        ids = [self.seen.setdefault(iri, len(self.seen)) for iri in iris]
        self.fact_parts.append(_fact_ids(s_iri, df["r"], o_iri, iris, ids, self.relation_id))
        entities = entities.with_columns(pl.Series("id", ids, dtype=pl.UInt32)).filter(
            pl.col("id") >= before
        )
        if self.names_df is None:
            return entities.with_columns(pl.col("key").alias("name"))
        named = entities.join(self.names_df, on="key", how="left", maintain_order="left")
        return named.filter(pl.col("name").is_not_null())

    def _name_lines(self, named: pl.DataFrame) -> pl.DataFrame:
        """The name triples of ``named``; their name-index rows go to ``on_names``."""
        name_lines = pl.select(
            pl.concat_str(
                [
                    pl.lit("<"),
                    named["iri"],
                    pl.lit(f"> {self.label} "),
                    nt_literals(named["name"], self.profile.label_lang),
                    pl.lit(" ."),
                ]
            ).alias("line")
        )
        self.on_names(
            pl.DataFrame(
                {
                    "norm": normalized_names(named["name"]),
                    "name": named["name"],
                    "iri": named["iri"],
                }
            ).rows()
        )
        self.result.names_written += named.height
        self.name_parts.append(named.select("id", "name"))
        return name_lines

    def finish(self) -> DelimitedResult:
        """The result, with the entities, predicates, facts as ids and names by id."""
        result, seen = self.result, self.seen
        result.entities = len(seen)
        result.entity_iris = list(seen)
        result.predicate_iris = list(self.predicate_ids)
        result.fact_ids = {
            c: np.concatenate([part[c] for part in self.fact_parts] or [np.zeros(0, dtype=t)])
            for c, t in (("s", np.uint32), ("p", np.uint16), ("o", np.uint32))
        }
        self.fact_parts.clear()
        # each entity's name by id (null: unnamed)
        ids = pl.DataFrame({"id": pl.int_range(0, len(seen), dtype=pl.UInt32, eager=True)})
        parts = self.name_parts
        names_by_id = pl.concat(parts) if parts else pl.DataFrame(schema=_NAME_SCHEMA)
        by_id = ids.join(names_by_id, on="id", how="left", maintain_order="left")
        result.entity_names = by_id["name"]
        return result


_NAME_SCHEMA = {"id": pl.UInt32, "name": pl.String}


def _fact_ids(
    s_iri: pl.Series,
    rel: pl.Series,
    o_iri: pl.Series,
    iris: list[str],
    ids: list[int],
    relation_id: dict[str, int],
) -> dict[str, np.ndarray]:
    """A batch's facts as ids: ``iris`` (every IRI of the batch) have ``ids``."""
    block = pl.DataFrame({"iri": iris, "id": ids}, schema={"iri": pl.String, "id": pl.UInt32})
    s = s_iri.to_frame("iri").join(block, on="iri", how="left", maintain_order="left")["id"]
    o = o_iri.to_frame("iri").join(block, on="iri", how="left", maintain_order="left")["id"]
    p = rel.replace_strict(relation_id, return_dtype=pl.UInt16)
    # numpy arrays, not frames: their memory goes back to the system when the table is built
    return {
        "s": s.cast(pl.UInt32).to_numpy(),
        "p": p.to_numpy(),
        "o": o.cast(pl.UInt32).to_numpy(),
    }
