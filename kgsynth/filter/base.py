"""What a filter is (:class:`Filter`: a reject reason and the rows it rejects), the filters that
share one input (:class:`Phase`) and the state the driver passes each filter (:class:`FilterRun`:
the reason of every row, the shared inputs, the seconds of each step and the extra stats)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from kgsynth.filter.checks import _AnswerChecks
from kgsynth.filter.config import REASONS, FilterConfig, MaxSimilarity


@dataclass
class FilterRun:
    """One run of the filters over ``table``: ``reason`` holds each row's reason code (0 while
    no filter rejected it, else the index in :data:`REASONS` plus one)."""

    table: pa.Table
    cfg: FilterConfig
    reason: np.ndarray
    max_similarity: MaxSimilarity | None = None
    progress: Callable[[str], None] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    """The input of the running :class:`Phase`, under its name."""
    details: dict[str, Any] = field(default_factory=dict)
    """Extra counts for the stats, in the order the filters ran."""
    reports: dict[str, Any] = field(default_factory=dict)
    """Reports kept under a stats key of their own (``contamination``, ``balance``)."""
    answers: _AnswerChecks = field(init=False)
    """Set by the driver's first step; the answer filters, the metrics and the stats read it."""

    @property
    def n(self) -> int:
        return len(self.reason)

    @property
    def alive(self) -> np.ndarray:
        return self.reason == 0

    def reject(self, name: str, mask: np.ndarray) -> None:
        """Give ``name`` to the rows in ``mask`` that no earlier filter rejected."""
        self.reason[mask & (self.reason == 0)] = REASONS.index(name) + 1

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A step reported to ``progress`` as it starts and timed into ``seconds``."""
        if self.progress is not None:
            self.progress(name)
        started = time.perf_counter()
        yield
        self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - started, 4)


class Filter(ABC):
    """One filter: the rows it rejects (:meth:`rejects`) get ``name`` as their ``reject_reason``.

    It runs when ``name`` is among :meth:`FilterConfig.enabled`'s reasons and sees only the
    rows no earlier filter rejected (``run.alive``); a row it rejects that an earlier filter
    rejected keeps the earlier reason. A ``timed`` filter runs as a step of its own."""

    name: ClassVar[str]
    timed: ClassVar[bool] = True

    def reads_shared(self, cfg: FilterConfig) -> bool:
        """Whether it reads its phase's shared input with ``cfg``."""
        return False

    @abstractmethod
    def rejects(self, run: FilterRun) -> np.ndarray:
        """A bool mask over all rows: True where the row fails this filter."""


@dataclass(frozen=True)
class Phase:
    """Filters run in order; the input they share (``shared``, built by ``build`` as a step
    of that name) is built first when one of them that runs reads it, and dropped after."""

    filters: tuple[Filter, ...]
    shared: str | None = None
    build: Callable[[FilterRun], Any] | None = None

    def run(self, run: FilterRun, enabled: list[str]) -> None:
        """The phase's enabled filters over ``run``, in order."""
        active = [f for f in self.filters if f.name in enabled]
        if self.shared is not None and any(f.reads_shared(run.cfg) for f in active):
            assert self.build is not None
            with run.step(self.shared):
                run.shared[self.shared] = self.build(run)
        for f in active:
            if f.timed:
                with run.step(f.name):
                    run.reject(f.name, f.rejects(run))
            else:
                run.reject(f.name, f.rejects(run))
        if self.shared is not None:
            run.shared.pop(self.shared, None)
