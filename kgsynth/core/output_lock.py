"""One writer per output: an exclusive lock (``filelock``, an ``flock`` on Unix) on
``.STEM.lock`` beside it, so that a second run on the same output fails at once with a message
naming the holder's pid.

The lock is named after the output's stem, not its whole name, because a file output's sidecars
are: ``walks.parquet`` and ``walks.pq`` both write ``walks.manifest.json``, so two runs on them
are two writers of one file and must not run at once."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from filelock import FileLock, Timeout

from kgsynth.core.errors import OutputBusyError

# how long a second run tries before it reports the output busy: long enough to outlast a
# holder's release racing with it, short enough that a busy output fails at once to a person
RACE_WAIT = 0.2


def _write_pid(fd: int) -> None:
    """Leave this process's pid in the lock file, for a second run's message; on a full disk
    the lock is held without it."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


class OutputLock:
    """An exclusive, non-blocking lock on ``.STEM.lock`` beside ``out``.

    The lock file is removed on release, while still held (filelock itself keeps it: on Unix
    it never unlinks). A second run that opened the file just before that and locks it after
    finds it unlinked; filelock sees that (no links left) and tries again, which is why the
    lock waits :data:`RACE_WAIT` seconds before saying the output is busy. After a ``kill -9``
    the file stays behind, unlocked (the kernel drops the lock with the process); the next run
    takes it and removes it. On a file system without ``flock`` filelock falls back to a
    marker file."""

    def __init__(self, out: str | Path, flag: str = "--out") -> None:
        self.out = Path(out)
        self.flag = flag
        where = Path(os.path.abspath(self.out))  # "." and "" have no name to put a lock beside
        if not where.name:
            raise ValueError(f"{out}: an output needs a name (not the root folder)")
        self.path = where.with_name(f".{where.stem}.lock")
        self._lock: FileLock | None = None

    def _holder(self) -> str:
        try:
            return self.path.read_text(errors="replace").strip() or "unknown"
        except OSError:
            return "unknown"

    def acquire(self) -> OutputLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.path, mode=0o644, timeout=RACE_WAIT, on_acquired=_write_pid)
        try:
            lock.acquire()
        except Timeout:
            raise OutputBusyError(
                f"{self.flag}: {self.out} is being written by another kgsynth run (pid "
                f"{self._holder()}); wait for it to finish, or choose another {self.flag}"
            ) from None
        self._lock = lock
        return self

    def release(self) -> None:
        if self._lock is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._lock.release()
        self._lock = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
