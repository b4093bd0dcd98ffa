"""One writer per output: an exclusive ``flock`` on ``.STEM.lock`` beside it, so that a second
run on the same output fails at once with a message naming the holder's pid.

The lock is named after the output's stem, not its whole name, because a file output's sidecars
are: ``walks.parquet`` and ``walks.pq`` both write ``walks.manifest.json``, so two runs on them
are two writers of one file and must not run at once."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from kgsynth.core.errors import OutputBusyError


class OutputLock:
    """An exclusive, non-blocking ``flock`` on ``.STEM.lock`` beside ``out``.

    The lock file is removed on release. After a ``kill -9`` it stays behind, unlocked (the
    kernel drops the lock with the process); the next run takes it and removes it."""

    def __init__(self, out: str | Path, flag: str = "--out") -> None:
        self.out = Path(out)
        self.flag = flag
        where = Path(os.path.abspath(self.out))  # "." and "" have no name to put a lock beside
        if not where.name:
            raise ValueError(f"{out}: an output needs a name (not the root folder)")
        self.path = where.with_name(f".{where.stem}.lock")
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise OutputBusyError(
                    f"{self.flag}: {self.out} is being written by another kgsynth run (pid "
                    f"{holder}); wait for it to finish, or choose another {self.flag}"
                ) from None
            # the holder may have removed the file between our open and our lock: then we hold
            # a lock on a file nobody else can see, so try again with the current one
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        # the pid only tells a second run who holds the lock: on a full disk, hold it without
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
