"""The case-insensitive name index: normalized label -> entity IRIs, in SQLite.

Exact-name look-ups go to the KG itself (its own indexes answer them); this index answers the
case-insensitive fallback without scanning the KG per call. Embedded stores build it at import
time inside the store directory; endpoints build it once, on first need, in the user cache.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from kgsynth.core.errors import KGError
from kgsynth.kg.sparql import normalize_name

_SCHEMA = """
CREATE TABLE IF NOT EXISTS names (norm TEXT NOT NULL, label TEXT NOT NULL, iri TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


class NameIndexWriter:
    """Writes the index in batches of ``(normalized name, name, IRI)`` rows (bulk inserts, the
    lookup index made once at the end) to a temporary file, moved into place by :meth:`close`
    (nothing is left behind when it is not called: :meth:`discard`)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        self.tmp.unlink(missing_ok=True)
        self.rows = 0
        self._con = sqlite3.connect(self.tmp)
        # a file built once and then only read: no journal, no syncs while it is written
        self._con.execute("PRAGMA journal_mode=OFF")
        self._con.execute("PRAGMA synchronous=OFF")
        self._con.executescript(_SCHEMA)

    def add(self, rows: list[tuple[str, str, str]]) -> None:
        self._con.executemany("INSERT INTO names VALUES (?, ?, ?)", rows)
        self.rows += len(rows)

    def close(self) -> int:
        """Index, commit and move into place; returns the row count."""
        try:
            self._con.execute("CREATE INDEX names_norm ON names(norm)")
            self._con.execute("INSERT INTO meta VALUES ('rows', ?)", (str(self.rows),))
            self._con.commit()
        finally:
            self._con.close()
        os.replace(self.tmp, self.path)
        return self.rows

    def discard(self) -> None:
        self._con.close()
        self.tmp.unlink(missing_ok=True)


def build_name_index(path: Path, pairs: Iterable[tuple[str, str]]) -> int:
    """Write the index for ``(iri, label)`` pairs to ``path`` atomically; returns the row count."""
    writer = NameIndexWriter(path)
    try:
        batch: list[tuple[str, str, str]] = []
        for iri, label in pairs:
            batch.append((normalize_name(label), label, iri))
            if len(batch) >= 50_000:
                writer.add(batch)
                batch = []
        writer.add(batch)
    except BaseException:
        writer.discard()
        raise
    return writer.close()


class NameIndex:
    """Read side of the index; one connection per process, read-only."""

    def __init__(self, path: Path | None, connection: sqlite3.Connection | None = None) -> None:
        self.path = path
        self._con = connection or sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, check_same_thread=False
        )
        self._rows("SELECT 1 FROM names LIMIT 1")  # a damaged file fails here, at open

    @classmethod
    def in_memory(cls, pairs: Iterable[tuple[str, str]]) -> NameIndex:
        """An index held in memory (for in-memory stores; nothing is written to disk)."""
        con = sqlite3.connect(":memory:", check_same_thread=False)
        con.executescript(_SCHEMA)
        con.executemany(
            "INSERT INTO names VALUES (?, ?, ?)",
            ((normalize_name(label), label, iri) for iri, label in pairs),
        )
        con.execute("CREATE INDEX names_norm ON names(norm)")
        return cls(None, con)

    def _rows(self, sql: str, params: tuple[str, ...] = ()) -> list[tuple]:
        try:
            return self._con.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise KGError(
                f"{self.path}: a damaged name index ({exc}); import the KG again "
                "(kgsynth kg import FILE --out DIR --force)"
            ) from None

    def lookup(self, name: str) -> list[tuple[str, str]]:
        """``(iri, label)`` of every entity whose normalized label equals ``name``'s."""
        rows = self._rows(
            "SELECT DISTINCT iri, label FROM names WHERE norm = ? ORDER BY iri LIMIT 1000",
            (normalize_name(name),),
        )
        return [(r[0], r[1]) for r in rows]

    def all_iris(self) -> list[str]:
        """Every named entity's IRI, sorted."""
        return [r[0] for r in self._rows("SELECT DISTINCT iri FROM names ORDER BY iri")]

    def count(self) -> int:
        return int(self._rows("SELECT COUNT(*) FROM names")[0][0])

    def close(self) -> None:
        self._con.close()
