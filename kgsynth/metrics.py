"""Answer metrics shared by filters, rewards and eval: EM, set F1 / F-beta, Hits@1.

Answers are compared as *sets of normalized strings*. Normalization (:func:`normalize_answer`):

1. Unicode NFKC, then case-folding ("ＡＢＣ" and "abc" match; accents are kept: "Amélie" is not
   "Amelie");
2. punctuation (Unicode category P*) becomes a space ("Washington, D.C." -> "washington d c");
3. one leading English article ("the", "a", "an") is dropped ("The Matrix" matches "Matrix");
4. whitespace is collapsed.

A prediction is a list of names, parsed from the model's ``<answer>`` as a JSON list (see
:func:`kgsynth.agent.protocol.parse_answer`) — never split on commas, so "Washington, D.C." is
one answer. Duplicates after normalization count once. Anything looser than EM (substring
matching) is reported as ``relaxed_match``, never as EM.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_ARTICLE = re.compile(r"^(the|a|an)\s+")


def normalize_answer(text: str) -> str:
    """The comparison key of one answer string (see the module docstring)."""
    text = unicodedata.normalize("NFKC", str(text)).casefold()
    text = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text)
    text = " ".join(text.split())
    return _ARTICLE.sub("", text)


def answer_set(answers: Iterable[str]) -> set[str]:
    """Normalized, de-duplicated, empty strings dropped."""
    return {k for k in (normalize_answer(a) for a in answers) if k}


def precision_recall(predicted: Iterable[str], gold: Iterable[str]) -> tuple[float, float]:
    pred, ref = answer_set(predicted), answer_set(gold)
    if not pred or not ref:
        return 0.0, 0.0
    hit = len(pred & ref)
    return hit / len(pred), hit / len(ref)


def f_beta(predicted: Iterable[str], gold: Iterable[str], beta: float = 1.0) -> float:
    """Set F-beta; beta < 1 leans to precision (KnowCoder-A1 uses 0.5 early in RL)."""
    if beta <= 0:
        raise ValueError("beta must be > 0")
    p, r = precision_recall(predicted, gold)
    if p == 0.0 and r == 0.0:
        return 0.0
    b2 = beta * beta
    return (1 + b2) * p * r / (b2 * p + r)


def f1(predicted: Iterable[str], gold: Iterable[str]) -> float:
    return f_beta(predicted, gold, 1.0)


def exact_match(predicted: Iterable[str], gold: Iterable[str]) -> float:
    """1.0 when the normalized predicted set equals the normalized gold set (both non-empty)."""
    pred, ref = answer_set(predicted), answer_set(gold)
    return float(bool(ref) and pred == ref)


def hits_at_1(predicted: Sequence[str], gold: Iterable[str]) -> float:
    """1.0 when the first predicted answer is a gold answer."""
    ref = answer_set(gold)
    for answer in predicted:
        key = normalize_answer(answer)
        if key:
            return float(key in ref)
    return 0.0


def relaxed_match(predicted: Iterable[str], gold: Iterable[str]) -> float:
    """1.0 when some predicted and some gold answer contain one another (not EM)."""
    pred, ref = answer_set(predicted), answer_set(gold)
    return float(any(p in g or g in p for p in pred for g in ref))


@dataclass(frozen=True)
class AnswerScores:
    em: float
    f1: float
    precision: float
    recall: float
    hits_at_1: float
    relaxed_match: float


def score(predicted: Sequence[str], gold: Sequence[str]) -> AnswerScores:
    """All metrics for one prediction."""
    p, r = precision_recall(predicted, gold)
    return AnswerScores(
        em=exact_match(predicted, gold),
        f1=f1(predicted, gold),
        precision=p,
        recall=r,
        hits_at_1=hits_at_1(predicted, gold),
        relaxed_match=relaxed_match(predicted, gold),
    )
