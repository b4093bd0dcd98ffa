"""Contamination guard: real all-MiniLM-L6-v2 similarities, threshold reports, the disk cache."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from kgsynth.core.errors import ConfigError
from kgsynth.datasets.contamination import ContaminationGuard, contamination_report, flag

BENCHMARK = [
    "what films did Michelle Trachtenberg star in",
    "who directed the movies written by Edward Knoblock",
    "what languages are the films directed by William Dieterle in",
    "what films did Michelle Trachtenberg star in",  # duplicates are embedded once
]


class CountingModel:
    """Wraps a model and counts the texts it is asked to encode."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.encoded = 0

    def encode(self, texts: list[str], **kwargs: Any) -> np.ndarray:
        self.encoded += len(texts)
        return self.inner.encode(texts, **kwargs)


@pytest.fixture(scope="module")
def guard() -> ContaminationGuard:
    return ContaminationGuard(BENCHMARK, batch_size=2)


def test_importing_loads_no_model():
    code = (
        "import sys, kgsynth.datasets.contamination; print('sentence_transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_paraphrase_scores_high_and_unrelated_low(guard):
    questions = [
        "which movies did Michelle Trachtenberg act in",
        "what is the boiling point of water at sea level",
        "what films did Michelle Trachtenberg star in",
    ]
    sims, where = guard.nearest(questions)
    assert sims.shape == (3,) and sims.dtype == np.float32
    assert sims[0] > 0.85
    assert sims[1] < 0.5
    assert sims[2] == pytest.approx(1.0, abs=1e-5)
    assert guard.benchmark_texts[where[0]] == BENCHMARK[0]
    assert flag(sims) == [True, False, True]
    np.testing.assert_array_equal(guard.max_similarity(questions), sims)
    assert guard.max_similarity([]).shape == (0,)


def test_similarity_is_chunked_and_progress_reported(guard, monkeypatch):
    import kgsynth.datasets.contamination as contamination

    questions = [f"who directed the movies written by writer number {i}" for i in range(7)]
    whole = guard.max_similarity(questions)
    # A chunk of one row at a time gives the same answers.
    monkeypatch.setattr(contamination, "_CHUNK_ELEMENTS", 1)
    calls: list[tuple[int, int]] = []
    chunked = guard.max_similarity(
        questions, progress=lambda done, total: calls.append((done, total))
    )
    np.testing.assert_allclose(chunked, whole, atol=1e-6)
    assert calls == [(2, 7), (4, 7), (6, 7), (7, 7)]  # batch_size=2


def test_report_counts_and_fractions():
    sims = np.array([0.10, 0.79, 0.80, 0.84, 0.85, 0.899, 0.90, 0.97])
    report = contamination_report(sims)
    assert report["checked"] == 8
    assert report["counts"] == {">=0.80": 6, ">=0.85": 4, ">=0.90": 2}
    assert report["fractions"] == {">=0.80": 6 / 8, ">=0.85": 4 / 8, ">=0.90": 2 / 8}
    assert report["max"] == pytest.approx(0.97)
    assert contamination_report([0.5, 0.95], thresholds=[0.9])["counts"] == {">=0.90": 1}
    empty = contamination_report([])
    assert (empty["checked"], empty["counts"][">=0.85"], empty["fractions"][">=0.85"]) == (
        0,
        0,
        0.0,
    )
    assert flag([0.849, 0.85, 0.86], threshold=0.85) == [False, True, True]
    with pytest.raises(ConfigError, match="threshold"):
        flag(sims, threshold=1.5)


def test_benchmark_embeddings_come_from_the_disk_cache(guard, tmp_path, monkeypatch):
    monkeypatch.setenv("KGSYNTH_CACHE", str(tmp_path))
    first = CountingModel(guard.model)
    a = ContaminationGuard(BENCHMARK, model=first, model_name=guard.model_name)
    assert first.encoded == 3  # the distinct benchmark texts
    assert not a.embedded_from_cache
    assert a.cache_path is not None and a.cache_path.is_file()
    assert a.cache_path.parent == tmp_path / "embeddings"

    second = CountingModel(guard.model)
    b = ContaminationGuard(BENCHMARK, model=second, model_name=guard.model_name)
    assert second.encoded == 0 and b.embedded_from_cache
    np.testing.assert_array_equal(a.benchmark, b.benchmark)
    b.max_similarity(["who directed Kismet"])
    assert second.encoded == 1  # only the new question

    # Other texts or another model name: another cache entry.
    c = ContaminationGuard(BENCHMARK[:2], model=second, model_name=guard.model_name)
    d = ContaminationGuard(BENCHMARK, model=second, model_name="another model")
    assert len({a.cache_path, c.cache_path, d.cache_path}) == 3
    assert second.encoded == 1 + 2 + 3

    # A damaged cache file is ignored and rewritten.
    a.cache_path.write_bytes(b"garbage")
    third = CountingModel(guard.model)
    e = ContaminationGuard(BENCHMARK, model=third, model_name=guard.model_name)
    assert third.encoded == 3 and not e.embedded_from_cache
    np.testing.assert_allclose(e.benchmark, a.benchmark, atol=1e-6)
    assert np.load(a.cache_path).shape == a.benchmark.shape


def test_empty_benchmark_is_a_config_error(guard):
    with pytest.raises(ConfigError, match="at least one benchmark question"):
        ContaminationGuard([], model=guard.model)
