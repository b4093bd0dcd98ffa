"""A persistent request cache for any LLM backend (SQLite, one row per request).

The key is a hash of (backend, model, parameters, messages) — plus the task context for the
template backend. A local checkpoint (``hf``) is known by the digest of its files rather than
its path, so retrained weights never read an older answer, and a stage that kept its starting
weights answers from the entries its start wrote. Re-running a stage makes zero new requests.
Every insert is its own transaction in WAL mode, so a ``kill -9`` loses at most the request in
flight and never leaves a corrupt cache. Cached texts pass through
:func:`~kgsynth.core.text.clean_text` when read, so an entry written before replies were cleaned
cannot fail every re-run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kgsynth.core.errors import ConfigError
from kgsynth.core.text import clean_optional, clean_text
from kgsynth.llm.base import LLM, Completion, ProgressFn, Request


def request_key(llm: LLM, request: Request) -> str:
    data: dict[str, Any] = {
        **llm.cache_fields,
        "params": request.params.as_dict(),
        "messages": request.messages,
    }
    if llm.uses_context():
        data["task"] = request.task
        data["context"] = request.context
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class CachedLLM(LLM):
    """Wraps ``inner``: cached answers are returned without a request; errors are not cached."""

    def __init__(self, inner: LLM, path: str | Path) -> None:
        super().__init__()
        self.inner = inner
        self.backend = inner.backend
        self.model = inner.model
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError(
                f"--cache: {self.path} is a directory; give a file such as llm_cache.sqlite"
            )
        new = not self.path.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._con = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._con.execute("PRAGMA journal_mode=WAL")
            self._con.execute("PRAGMA synchronous=NORMAL")
            self._con.execute(
                "CREATE TABLE IF NOT EXISTS completions (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            self._con.execute("SELECT key, value FROM completions LIMIT 1").fetchall()
        except (sqlite3.Error, OSError) as exc:
            if new:  # a cache this run began (on a full disk, say) is not left behind empty
                con = getattr(self, "_con", None)
                if con is not None:
                    with contextlib.suppress(sqlite3.Error):
                        con.close()
                for leftover in (self.path, *(Path(f"{self.path}{s}") for s in ("-wal", "-shm"))):
                    with contextlib.suppress(OSError):
                        leftover.unlink()
            raise ConfigError(
                f"--cache: {self.path} is not a usable request cache ({exc}); "
                "give another path or --no-cache"
            ) from None

    @property
    def key_fields(self) -> dict[str, Any]:
        return self.inner.key_fields

    @property
    def cache_fields(self) -> dict[str, Any]:
        return self.inner.cache_fields

    def uses_context(self) -> bool:
        return self.inner.uses_context()

    def _get(self, key: str) -> Completion | None:
        row = self._con.execute("SELECT value FROM completions WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            data = json.loads(row[0])
            return Completion(
                text=clean_text(data["text"]),
                finish_reason=clean_optional(data.get("finish_reason")),
                prompt_tokens=int(data.get("prompt_tokens") or 0),
                completion_tokens=int(data.get("completion_tokens") or 0),
                cached=True,
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None  # an unreadable entry is a miss: asked again, then overwritten

    def _put(self, key: str, c: Completion) -> None:
        value = {
            "text": c.text,
            "finish_reason": c.finish_reason,
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens,
        }
        self._con.execute(
            "INSERT OR REPLACE INTO completions VALUES (?, ?)", (key, json.dumps(value))
        )

    def generate_batch(
        self, requests: Sequence[Request], progress: ProgressFn | None = None
    ) -> list[Completion]:
        keys = [request_key(self.inner, r) for r in requests]
        out: list[Completion | None] = [self._get(k) for k in keys]
        for i, c in enumerate(out):
            if c is not None:
                self.stats.cache_hits += 1
                self.stats.add(c)
                if progress:
                    progress(i, c)
        todo = [i for i, c in enumerate(out) if c is None]
        self.stats.cache_misses += len(todo)

        def on_done(j: int, c: Completion) -> None:
            # stored as it arrives, so an interrupted run keeps what it paid for
            i = todo[j]
            if c.ok:
                self._put(keys[i], c)
            self.stats.add(c)
            out[i] = c
            if progress:
                progress(i, c)

        if todo:
            results = self.inner.generate_batch([requests[i] for i in todo], on_done)
            for j, c in enumerate(results):
                if out[todo[j]] is None:  # a backend that did not report it
                    on_done(j, c)
        self.stats.retries = self.inner.stats.retries
        return [c for c in out if c is not None]

    def describe(self) -> dict[str, Any]:
        data = super().describe()
        data["cache"] = str(self.path)
        return data

    def close(self) -> None:
        self._con.close()
        self.inner.close()
