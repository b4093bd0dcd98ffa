"""torch's thread count for a phase that has the machine to itself.

The Makefile keeps torch on one thread (``OMP_NUM_THREADS=1``): the tiny models train in one
process per core. A phase that runs alone in one process (the contamination guard's sentence
encoder, the early stopping's greedy answers after training) takes every core instead, and
gives the count back after."""

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
