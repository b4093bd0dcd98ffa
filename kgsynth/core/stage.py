"""The one contract every data stage keeps.

Each stage module (``walk``, ``synthesize.questions``, ``synthesize.trajectories``, ``filter``,
``eval``) exposes::

    run(inputs, cfg, *, graph=None, llm=None, progress=None) -> StageResult

- ``inputs``: the rows (or Arrow table) the stage reads, already checked against their schema
  by :mod:`kgsynth.core.stage_io`; ``None`` for ``walk``, which reads only the graph;
- ``cfg``: the stage's frozen config dataclass (built by :func:`kgsynth.core.config.build_config`);
- ``graph``: the :class:`~kgsynth.kg.graph.KGGraph` the stage queries, when it needs one;
- ``llm``: the :class:`~kgsynth.llm.base.LLM` client, when it needs one;
- ``progress``: an optional ``(done, total, info)`` callback.

It returns a :class:`StageResult`. The stage never writes files: the CLI hands the result to
:mod:`kgsynth.core.stage_io`, which writes the output, its rejects and its manifest atomically.

A row a stage turns down is a :class:`Rejected` (the row and a reason from the stage's reason
list). Code deep inside a stage raises :class:`Reject` with the reason; the stage's row loop
catches it and records the ``Rejected``. Vectorised stages (``filter``) keep their rejects as a
table with a ``reject_reason`` column, the same two facts a column at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Rows = TypeVar("Rows")

Progress = Callable[[int, int, str], None]
"""``(done, total, info)``, called as a stage goes."""


class Reject(Exception):
    """Raised inside a stage to turn the current row (or attempt) down; ``reason`` is one of
    the stage's reason names."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Rejected:
    """A row a stage turned down, and why (one of the stage's reason names)."""

    row: dict[str, Any]
    reason: str
    detail: str = ""


@dataclass
class StageResult(Generic[Rows]):
    """What a stage's ``run`` returns: the rows it produced, the rows it turned down, and the
    counts the manifest and the command's summary line report."""

    accepted: Rows
    rejected: Any = field(default_factory=list)  # list[Rejected], or a table with reject_reason
    stats: dict[str, Any] = field(default_factory=dict)

    def rejected_rows(self, reason_field: str = "reject_reason") -> list[dict[str, Any]]:
        """The rejects as plain rows, each with its reason in ``reason_field``."""
        if isinstance(self.rejected, list):
            return [{**r.row, reason_field: r.reason} for r in self.rejected]
        return self.rejected.to_pylist()

    def reject_counts(self) -> dict[str, int]:
        """Rejects per reason, most frequent first."""
        counts: dict[str, int] = {}
        if isinstance(self.rejected, list):
            for r in self.rejected:
                counts[r.reason] = counts.get(r.reason, 0) + 1
        else:
            for reason in self.rejected.column("reject_reason").to_pylist():
                counts[reason] = counts.get(reason, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
