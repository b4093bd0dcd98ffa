"""Queries on an embedded store run in a child process that can be killed at their deadline.

pyoxigraph evaluates a query in-process and cannot be interrupted: a query blocked inside the
engine (an ``ORDER BY`` or ``COUNT`` over a cross product, a filter that matches nothing over
a huge join) holds its thread and its memory until it finishes. :class:`QueryProcess` runs
the queries of one store directory in a child (``python kgsynth/kg/query_process.py STORE``)
that opens the store read-only; the parent waits for each frame of the answer with the
query's deadline, and past it kills the child (``SIGKILL``: the operating system frees all of
its memory) and raises :class:`~kgsynth.core.errors.KGTimeoutError`. The next query starts a new
child. Frames are length-prefixed ``marshal`` payloads over the child's stdin/stdout.

A ``memory_limit`` bounds the child's memory too: once the store is open, the child caps its
address space (``RLIMIT_AS``) at what it then uses plus ``memory_limit`` bytes, so the limit is
what queries may add whatever the store's own footprint. A query past it fails an allocation;
the engine (Rust) then aborts the child, which the parent reports as kind ``memory`` (a Python
``MemoryError`` in the child is reported the same way) and the next query starts a new child.
A child is owned by the process that started it: after a ``fork`` the new process starts its
own rather than share the pipes. On Linux a child dies with its parent (``PR_SET_PDEATHSIG``):
a run killed mid-query leaves no query computing on (the signal follows the thread that
started the child: should that thread end first, the child is killed, a query it was running
fails as a store error, and the next query starts another).

The child answers only texts the parent sends, and the parent sends only texts the read-only
guard returned (:meth:`kgsynth.kg.base.KG.select`).
"""

from __future__ import annotations

import contextlib
import marshal
import math
import os
import select
import signal
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


def _readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` has data (or its end) within ``timeout`` seconds. ``poll`` where there
    is one: ``select`` refuses descriptors past 1023, which a process holding a model, its data
    and their files (an RL run) reaches."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(max(1, math.ceil(timeout * 1000))))
    return bool(select.select([fd], [], [], timeout)[0])


class QueryProcessError(Exception):
    """The child failed: ``kind`` is ``timeout``, ``memory``, ``syntax``, ``store`` or
    ``died``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class QueryProcess:
    """One child process answering queries on the store directory ``store`` (see module doc)."""

    def __init__(self, store: str | Path, *, memory_limit: int | None = None) -> None:
        self.store = str(store)
        self.memory_limit = memory_limit  # bytes a query may add to the open store (None: any)
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()  # the process whose child ``_proc`` is
        self._lock = threading.Lock()
        self.started = 0  # children started (a killed one is replaced on the next query)

    # --- the child's lifecycle -------------------------------------------------------------

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                self.store,
                str(self.memory_limit or 0),
                str(os.getpid()),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self._proc, self._owner = proc, os.getpid()
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
        if proc is None or self._owner != os.getpid():
            return  # a forked process leaves its parent's child alone
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
            if left <= 0 or not _readable(fd, left):
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
        frames: list[tuple[Any, ...]] = []
        with self._lock:
            if self._owner != os.getpid():
                self._proc = None  # forked: the parent's child and pipes stay the parent's
            if self._proc is None or self._proc.poll() is not None:
                self._proc = None
                self._start()
            # the query's time starts once a child is ready: starting one (after a kill, say)
            # takes part of a second that a short timeout would otherwise lose
            deadline = time.monotonic() + timeout
            self._send((query, form, max_rows))
            while True:
                try:
                    frame = self._read(deadline)
                except QueryProcessError as exc:
                    proc = self._proc
                    if exc.kind == "died" and proc is not None:
                        # its pipe closed as it exited: wait for its status before any kill
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            proc.wait(timeout=5)
                    self.kill()
                    if exc.kind == "died" and self._out_of_memory(proc):
                        raise self._memory_error() from None
                    raise
                kind = frame[0]
                if kind == "error":
                    if frame[1] == "memory":
                        self.kill()  # a child that ran out may hold a damaged heap
                        raise self._memory_error()
                    raise QueryProcessError(frame[1], frame[2])
                if kind == "end":
                    return frames
                frames.append(frame)
                if kind == "bool":
                    return frames

    def _out_of_memory(self, proc: subprocess.Popen[bytes] | None) -> bool:
        """Whether the child that just exited was stopped by its memory limit: the engine
        aborts (``SIGABRT``) when an allocation fails."""
        return (
            self.memory_limit is not None
            and proc is not None
            and proc.returncode == -signal.SIGABRT
        )

    def _memory_error(self) -> QueryProcessError:
        limit = "" if self.memory_limit is None else f" ({self.memory_limit / 2**30:g} GiB)"
        return QueryProcessError("memory", f"the query needed more than its memory limit{limit}")


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


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the child process
    """Ask Linux to kill this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``), and
    exit now if the parent is already gone; elsewhere nothing (the child still ends when its
    stdin closes, after the query it is running)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:
        os._exit(0)


def _limit_memory(extra: int) -> None:  # pragma: no cover - runs in the child process
    """Cap this process's address space at its present size plus ``extra`` bytes (Linux reads
    the size from ``/proc``; elsewhere the cap is ``extra`` alone, and may not be enforced)."""
    import resource

    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        size = 0
    limit = size + extra
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _child(
    store_path: str, memory_limit: int = 0, parent: int = 0
) -> None:  # pragma: no cover - runs in the child process
    _die_with_parent(parent)
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
    if memory_limit > 0:
        _limit_memory(memory_limit)
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
        except MemoryError:
            send(("error", "memory", "out of memory"))


if __name__ == "__main__":  # pragma: no cover
    limit, parent = ([int(a) for a in sys.argv[2:4]] + [0, 0])[:2]  # older callers pass neither
    _child(sys.argv[1], limit, parent)
