"""Dense relation scores for ``get_relations``' ``hybrid`` ranking.

BM25 only sees shared words: "who acted in X" shares none with ``starred_actors``, and the
relations are then listed in the store's order, so an agent that learnt to follow the first
relation listed follows whatever comes first. ``hybrid`` adds the cosine similarity of the
question and the relation's words under the bundled all-MiniLM-L6-v2 sentence encoder (the
model the contamination guard uses) to BM25's score scaled to [0, 1]: a shared word still
counts most, and related words ("acted", "starred actors") count where none is shared. Nothing
is fitted: the encoder is used as shipped, on any KG's relation names.

One encoder per process (:func:`shared_scorer`), loaded on first use; question and relation
vectors are cached, and :meth:`DenseRelationScorer.prime` encodes many questions in batches
(synthesis and eval know their questions up front).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

QUESTION_CACHE = 65_536


class DenseRelationScorer:
    """Cosine similarity of a question and relation names under a sentence encoder."""

    def __init__(self, model: Any | None = None) -> None:
        self._model = model
        self._questions: OrderedDict[str, np.ndarray] = OrderedDict()
        self._relations: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def model(self) -> Any:
        if self._model is None:
            from kgsynth.datasets.contamination import load_default_model

            self._model = load_default_model()
        return self._model

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        from kgsynth.datasets.contamination import embed

        return embed(self.model, list(texts), batch_size=128)

    def prime(self, questions: Iterable[str]) -> None:
        """Encode the questions not cached yet, in batches."""
        todo = list(dict.fromkeys(q for q in questions if q and q not in self._questions))
        for start in range(0, len(todo), 4096):
            chunk = todo[start : start + 4096]
            vecs = self._encode(chunk)
            with self._lock:
                for q, v in zip(chunk, vecs, strict=True):
                    self._remember(q, v)

    def _remember(self, question: str, vec: np.ndarray) -> None:
        self._questions[question] = vec
        self._questions.move_to_end(question)
        while len(self._questions) > QUESTION_CACHE:
            self._questions.popitem(last=False)

    def question_vector(self, question: str) -> np.ndarray:
        with self._lock:
            vec = self._questions.get(question)
        if vec is None:
            vec = self._encode([question])[0]
            with self._lock:
                self._remember(question, vec)
        return vec

    def relation_vectors(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._relations]
        if missing:
            vecs = self._encode(missing)
            with self._lock:
                self._relations.update(zip(missing, vecs, strict=True))
        return np.stack([self._relations[t] for t in texts])

    def sentence_scores(self, question: str, sentences: Sequence[str]) -> np.ndarray:
        """Cosine of ``question`` with each sentence, in order; the sentences are cached as
        questions are (least recently used first out), not kept like relation names."""
        if not sentences:
            return np.zeros(0, dtype=np.float32)
        self.prime([question, *sentences])  # in one batch; a vector pushed out is encoded again
        q = self.question_vector(question)
        return np.stack([self.question_vector(t) for t in sentences]) @ q

    def scores(self, question: str, relation_texts: Sequence[str]) -> np.ndarray:
        """Cosine of ``question`` with each relation text, in order."""
        if not relation_texts:
            return np.zeros(0, dtype=np.float32)
        return self.relation_vectors(relation_texts) @ self.question_vector(question)


_SHARED: DenseRelationScorer | None = None
_SHARED_LOCK = threading.Lock()


def shared_scorer() -> DenseRelationScorer:
    """The process's one scorer (the encoder is loaded once, on first use)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = DenseRelationScorer()
        return _SHARED
