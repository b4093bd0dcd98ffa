"""Worker processes of ``kgsynth walk --workers N``.

Each worker opens the KG itself (a store directory read-only, or the endpoint) and samples the
attempts it is sent, answer sets included; the parent takes the outcomes in attempt order
exactly as it takes its own, so the walks are those of one process."""

from __future__ import annotations

import random

from kgsynth.core.errors import ConfigError, KGSynthError
from kgsynth.core.stage import Reject
from kgsynth.kg.base import KG
from kgsynth.kg.graph import KGGraph
from kgsynth.walk.config import WalkConfig
from kgsynth.walk.records import Walk
from kgsynth.walk.sampler import Outcome, WalkSampler

_worker: WalkSampler | None = None


def _worker_start(
    location: str, profile: str, timeout: float, max_rows: int, cfg: WalkConfig
) -> None:
    global _worker
    from kgsynth.core.cores import worker_ignores_interrupts
    from kgsynth.kg.open import open_kg

    worker_ignores_interrupts()

    kg = open_kg(location, profile=profile, timeout=timeout, max_rows=max_rows)
    _worker = WalkSampler(KGGraph(kg), cfg, [])


# how an attempt's random stream is made: (prefix, structures, weights); the stream of attempt
# k is ``random.Random(f"{prefix}/{k}")`` after it drew its structure from those
Streams = tuple[str, list[str], list[int]]


def _streams(attempts: list[tuple[int, str, str]], streams: Streams) -> list:
    """``(id, structure, rng, seed)`` of each attempt, its rng where the parent's was."""
    prefix, structures, weights = streams
    out = []
    for k, structure, seed in attempts:
        rng = random.Random(f"{prefix}/{k}")
        if rng.choices(structures, weights=weights, k=1)[0] != structure:
            raise AssertionError(f"attempt {k}: the worker's random stream is not the parent's")
        out.append((k, structure, rng, seed))
    return out


def _worker_sample(
    attempts: list[tuple[int, str, str]], streams: Streams
) -> dict[int, tuple[Outcome, list[tuple[str, str]] | str | KGSynthError | None]]:
    """Outcomes of ``attempts`` and, for each walk, its answer set (or why it has none)."""
    assert _worker is not None
    out: dict[int, tuple[Outcome, list[tuple[str, str]] | str | KGSynthError | None]] = {}
    for j, outcome in _worker.sample_many(_streams(attempts, streams)).items():
        answers: list[tuple[str, str]] | str | KGSynthError | None = None
        if isinstance(outcome, Walk):
            try:
                answers = _worker.answer_set(outcome)
            except Reject as rej:
                answers = rej.reason
            except KGSynthError as exc:
                answers = exc.with_traceback(None)
        out[j] = (outcome, answers)
    return out


class _WorkerPool:
    """``n`` processes sampling attempts side by side (spawned: a forked RocksDB handle or
    HTTP connection is not safe to share)."""

    def __init__(self, kg: KG, cfg: WalkConfig, n: int) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        location = getattr(kg, "location", "")
        if not location or location == ":memory:":
            raise ConfigError(
                "--workers: the worker processes open the KG themselves; give a store "
                "directory, a triple file or an endpoint (not an in-memory store)"
            )
        self.n = n
        self.pool = ProcessPoolExecutor(
            max_workers=n,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_start,
            initargs=(
                location,
                kg.profile.name,
                float(getattr(kg, "timeout", 30.0)),
                int(getattr(kg, "max_rows", 100_000)),
                cfg,
            ),
        )

    def sample(
        self, attempts: list[tuple[int, str, str]], streams: Streams
    ) -> dict[int, tuple[Outcome, list[tuple[str, str]] | str | KGSynthError | None]]:
        """Sample ``(id, structure, seed)`` attempts, whose random streams ``streams`` says
        how to make."""
        # interleaved shares: neighbouring attempts cost alike, so the shares do too
        shares = [s for s in (attempts[i :: self.n] for i in range(self.n)) if s]
        out: dict = {}
        for part in self.pool.map(_worker_sample, shares, [streams] * len(shares)):
            out.update(part)
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
