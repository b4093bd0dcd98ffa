"""torch's thread count for a phase that has the machine to itself.

The Makefile keeps torch on one thread (``OMP_NUM_THREADS=1``): the tiny models train in one
process per core. A phase that runs alone in one process (the contamination guard's sentence
encoder, the early stopping's greedy answers after training) takes every core instead, and
gives the count back after. Worker processes leave Ctrl-C to their parent
(:func:`worker_ignores_interrupts`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def all_cores() -> Iterator[None]:
    """torch on every core of the machine inside, its thread count as it was after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(before, os.cpu_count() or 1))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def worker_ignores_interrupts() -> None:
    """In a worker process: leave Ctrl-C to the parent. The terminal sends SIGINT to the whole
    process group; a worker that took it would print its own KeyboardInterrupt traceback,
    while the parent already stops the pool and reports one line."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
