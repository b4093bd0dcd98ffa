"""Queries on an embedded store run in a child process that can be killed at their deadline.

pyoxigraph evaluates a query in-process and cannot be interrupted: a query blocked inside the
engine (an ``ORDER BY`` or ``COUNT`` over a cross product, a filter that matches nothing over
a huge join) holds its thread and its memory until it finishes. :class:`QueryProcess` runs
the queries of one store directory in a child (``python kgsynth/kg/query_process.py STORE``)
that opens the store read-only; the parent waits for each frame of the answer with the
query's deadline, and past it kills the child (``SIGKILL``: the operating system frees all of
its memory) and raises :class:`~kgsynth.errors.KGTimeoutError`. The next query starts a new
child. Frames are length-prefixed ``marshal`` payloads over the child's stdin/stdout.

The child answers only texts the parent sends, and the parent sends only texts the read-only
guard returned (:meth:`kgsynth.kg.base.KG.select`).
"""

from __future__ import annotations

import contextlib
import marshal
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_HEADER = struct.Struct(">I")
CHUNK_ROWS = 512  # rows per frame
START_TIMEOUT_S = 60.0


class QueryProcessError(Exception):
    """The child failed: ``kind`` is ``timeout``, ``syntax``, ``store`` or ``died``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class QueryProcess:
    """One child process answering queries on the store directory ``store`` (see module doc)."""

    def __init__(self, store: str | Path) -> None:
        self.store = str(store)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.started = 0  # children started (a killed one is replaced on the next query)

    # --- the child's lifecycle -------------------------------------------------------------

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), self.store],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self._proc = proc
        self.started += 1
        try:
            kind, *rest = self._read(time.monotonic() + START_TIMEOUT_S)
        except QueryProcessError as exc:
            self.kill()
            raise QueryProcessError("died", f"the query process did not start: {exc}") from None
        if kind != "ready":
            self.kill()
            raise QueryProcessError("died", f"the query process did not start: {rest}")
        return proc

    def kill(self) -> None:
        """Kill the child now (its memory is freed); the next query starts another."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    close = kill

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # --- frames ----------------------------------------------------------------------------

    def _read_exact(self, n: int, deadline: float) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        chunks: list[bytes] = []
        while n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise QueryProcessError("timeout", "deadline passed")
            data = os.read(fd, min(n, 1 << 20))
            if not data:
                raise QueryProcessError("died", "the query process exited")
            chunks.append(data)
            n -= len(data)
        return b"".join(chunks)

    def _read(self, deadline: float) -> tuple[Any, ...]:
        (size,) = _HEADER.unpack(self._read_exact(_HEADER.size, deadline))
        return marshal.loads(self._read_exact(size, deadline))

    def _send(self, message: tuple[Any, ...]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        payload = marshal.dumps(message)
        try:
            self._proc.stdin.write(_HEADER.pack(len(payload)) + payload)
            self._proc.stdin.flush()
        except OSError:
            self.kill()
            raise QueryProcessError("died", "the query process exited") from None

    # --- queries ---------------------------------------------------------------------------

    def run(self, query: str, form: str, timeout: float, max_rows: int) -> list[tuple[Any, ...]]:
        """The frames of the answer: ``("vars", names)`` then ``("rows", [row, ...])``… for a
        SELECT (at most ``max_rows`` rows: the child stops evaluating after them), or
        ``("bool", value)`` for an ASK. Raises :class:`QueryProcessError`; a timeout or a lost
        child kills the child first."""
        deadline = time.monotonic() + timeout
        frames: list[tuple[Any, ...]] = []
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = None
                self._start()
            self._send((query, form, max_rows))
            while True:
                try:
                    frame = self._read(deadline)
                except QueryProcessError:
                    self.kill()
                    raise
                kind = frame[0]
                if kind == "error":
                    raise QueryProcessError(frame[1], frame[2])
                if kind == "end":
                    return frames
                frames.append(frame)
                if kind == "bool":
                    return frames


# --- the child -------------------------------------------------------------------------------


def _encode(node: Any, named: type, literal: type) -> Any:
    """A term as marshal-able data: an IRI as its string, a literal as (value, datatype,
    lang), a blank node as (value,)."""
    if node is None:
        return None
    kind = type(node)
    if kind is named:
        return node.value
    if kind is literal:
        return (node.value, node.datatype.value, node.language)
    return (node.value,)


def _child(store_path: str) -> None:  # pragma: no cover - runs in the child process
    import pyoxigraph as ox

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def send(message: tuple[Any, ...]) -> None:
        payload = marshal.dumps(message)
        stdout.write(_HEADER.pack(len(payload)) + payload)
        stdout.flush()

    try:
        store = ox.Store.read_only(store_path)
    except (OSError, ValueError) as exc:
        send(("error", "store", str(exc)))
        return
    send(("ready",))
    named, literal = ox.NamedNode, ox.Literal
    while True:
        header = stdin.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        (size,) = _HEADER.unpack(header)
        query, form, max_rows = marshal.loads(stdin.read(size))
        try:
            result = store.query(query)
            if form == "ask":
                if not isinstance(result, ox.QueryBoolean):
                    send(("error", "syntax", "expected an ASK query"))
                    continue
                send(("bool", bool(result)))
                continue
            if not isinstance(result, ox.QuerySolutions):
                send(("error", "syntax", "expected a SELECT query"))
                continue
            send(("vars", [v.value for v in result.variables]))
            rows: list[tuple[Any, ...]] = []
            sent = 0
            for solution in result:
                rows.append(tuple(_encode(node, named, literal) for node in solution))
                if len(rows) == CHUNK_ROWS or sent + len(rows) >= max_rows:
                    send(("rows", rows))
                    sent += len(rows)
                    rows = []
                    if sent >= max_rows:
                        break
            if rows:
                send(("rows", rows))
            send(("end",))
        except SyntaxError as exc:
            send(("error", "syntax", str(exc)))
        except OSError as exc:
            send(("error", "store", str(exc)))


if __name__ == "__main__":  # pragma: no cover
    _child(sys.argv[1])
