"""Answer metrics shared by filters, rewards and eval, each named for what it measures, and the
confidence intervals eval reports for their means (:func:`wilson_interval`,
:func:`bootstrap_interval`).

The papers use "EM" and "Hit" for different things, so no metric here is called plain "EM".
With P the predicted set and G the gold set (both normalized, below):

- ``em_strict``: 1 when P = G (and G is not empty). The strict reading of "exact match".
- ``hit``: 1 when P ∩ G is not empty: at least one predicted answer is gold. This is
  KnowCoder-A1's "EM" (and GraphWalker's, which reports EM above F1, so it cannot be the strict
  one), and ISP's and KG-R1's "Hit".
- ``hits_at_1``: 1 when the *first* predicted answer is gold (order matters).
- ``rhits_at_1``: KnowCoder-A1's RHits@1, "a randomly chosen predicted answer is gold", as its
  expected value |P ∩ G| / |P| (so no random draw: the same prediction always scores the same).
- ``f1`` and ``fbeta``: set F1 and F-beta over P and G; ``precision`` and ``recall``.

:data:`OUTCOME_METRICS` names the ones a filter or reward can take as its outcome.

Answers are compared as *sets of normalized strings*. Normalization (:func:`normalize_answer`):

1. Unicode NFKC, then case-folding ("ＡＢＣ" and "abc" match; accents are kept: "Amélie" is not
   "Amelie");
2. punctuation (Unicode category P*) becomes a space ("Washington, D.C." -> "washington d c");
3. one leading English article ("the", "a", "an") is dropped ("The Matrix" matches "Matrix");
4. whitespace is collapsed.

A prediction is a list of names, parsed from the model's ``<answer>`` as a JSON list (see
:func:`kgsynth.agent.protocol.parse_answer`) — never split on commas, so "Washington, D.C." is
one answer. Duplicates after normalization count once. Substring matching is reported as
``relaxed_match``, never under any of the names above.

Benchmarks with ids and aliases (WebQSP, CWQ, GrailQA, GraphQ: :mod:`kgsynth.datasets.benchmarks`) give
each gold answer an id (a Freebase MID ``m.0abc``/``g.11x`` or a Wikidata QID ``Q42``, also as a
full IRI) and aliases. :func:`match_predictions` first maps each prediction onto the gold answer
it names: a prediction that is an id (:func:`entity_id`) matches the gold answer with that id;
any other prediction matches a gold answer whose name or one of whose aliases it equals after
normalization. Every metric above then compares the mapped predictions with the gold names
(:func:`score` with ``gold_ids``/``aliases``). Without ids and aliases (MetaQA) predictions are
compared as written.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kgsynth.core.errors import ConfigError

_ARTICLE = re.compile(r"^(the|a|an)\s+")


def normalize_answer(text: str) -> str:
    """The comparison key of one answer string (see the module docstring)."""
    text = unicodedata.normalize("NFKC", str(text)).casefold()
    text = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text)
    text = " ".join(text.split())
    return _ARTICLE.sub("", text)


_FREEBASE_NS = "http://rdf.freebase.com/ns/"
_WIKIDATA_ENTITY = "http://www.wikidata.org/entity/"
_ID_PREFIXES = (_FREEBASE_NS, _WIKIDATA_ENTITY, "ns:", "fb:", "wd:")
_MID = re.compile(r"[mg]\.[0-9a-z_]+")
_QID = re.compile(r"Q[1-9][0-9]*")


def entity_id(text: str) -> str | None:
    """The entity id ``text`` is, or None: a Freebase MID (``m.0abc``, ``g.11b6``; also written
    ``ns:m.0abc``, ``/m/0abc`` or ``http://rdf.freebase.com/ns/m.0abc``) as ``m.0abc``, a
    Wikidata QID (``Q42``, ``wd:Q42``, ``http://www.wikidata.org/entity/Q42``) as ``Q42``."""
    value = str(text).strip().removeprefix("<").removesuffix(">")
    for prefix in _ID_PREFIXES:
        if value.startswith(prefix):
            value = value[len(prefix) :]
            break
    if value.startswith(("/m/", "/g/")):
        value = value[1] + "." + value[3:]
    return value if _MID.fullmatch(value) or _QID.fullmatch(value) else None


def match_predictions(
    predicted: Iterable[str],
    gold: Sequence[str],
    *,
    gold_ids: Sequence[str | None] | None = None,
    aliases: Sequence[Sequence[str]] | None = None,
) -> list[str]:
    """``predicted`` with each prediction that names a gold answer replaced by that answer's
    gold name: an id matches the gold answer with that id (``gold_ids``, parallel to ``gold``;
    None where an answer has none); any other prediction matches the gold answer whose name or
    alias (``aliases``, one list per gold answer) it equals after normalization. Predictions
    that match nothing are kept as written. Without ids and aliases, ``predicted`` as it is."""
    predicted = list(predicted)
    if not gold_ids and not aliases:
        return predicted
    by_id: dict[str, str] = {}
    for name, gid in zip(gold, gold_ids or (), strict=False):
        key = entity_id(gid) if gid else None
        if key is not None:
            by_id.setdefault(key, name)
    by_name: dict[str, str] = {}
    for name, names in zip(gold, aliases or (), strict=False):
        for alias in names:
            by_name.setdefault(normalize_answer(alias), name)
    for name in gold:  # a gold name wins over another answer's alias
        by_name[normalize_answer(name)] = name
    out = []
    for answer in predicted:
        pid = entity_id(answer)
        if pid is not None:
            out.append(by_id.get(pid, answer))
        else:
            out.append(by_name.get(normalize_answer(answer), answer))
    return out


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


def em_strict(predicted: Iterable[str], gold: Iterable[str]) -> float:
    """1.0 when the normalized predicted set equals the normalized gold set (both non-empty)."""
    pred, ref = answer_set(predicted), answer_set(gold)
    return float(bool(ref) and pred == ref)


def hit(predicted: Iterable[str], gold: Iterable[str]) -> float:
    """1.0 when at least one predicted answer is gold (KnowCoder-A1's and GraphWalker's "EM",
    ISP's and KG-R1's "Hit")."""
    return float(bool(answer_set(predicted) & answer_set(gold)))


def rhits_at_1(predicted: Iterable[str], gold: Iterable[str]) -> float:
    """KnowCoder-A1's RHits@1: the chance that a predicted answer drawn at random is gold,
    |P ∩ G| / |P| over the normalized, de-duplicated sets (0.0 with no prediction)."""
    pred, ref = answer_set(predicted), answer_set(gold)
    return len(pred & ref) / len(pred) if pred else 0.0


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


OUTCOME_METRICS: dict[str, Callable[[Sequence[str], Sequence[str]], float]] = {
    "em_strict": em_strict,
    "hit": hit,
    "hits_at_1": hits_at_1,
    "rhits_at_1": rhits_at_1,
    "f1": f1,
}
"""The answer metrics a filter (``--outcome``) or a reward can name."""


def check_metric_name(name: str, what: str) -> str:
    """``name`` when it is one of :data:`OUTCOME_METRICS`, else ConfigError; plain "em" is
    refused as ambiguous, with the two metrics it may mean."""
    if name in OUTCOME_METRICS:
        return name
    if name == "em":
        raise ConfigError(
            f"{what}: 'em' is ambiguous: say em_strict (the predicted set equals the gold set) "
            "or hit (some predicted answer is gold: KnowCoder-A1's and GraphWalker's EM)"
        )
    raise ConfigError(f"{what}: unknown metric {name!r}; valid: {', '.join(OUTCOME_METRICS)}")


@dataclass(frozen=True)
class AnswerScores:
    em_strict: float
    hit: float
    f1: float
    precision: float
    recall: float
    hits_at_1: float
    rhits_at_1: float
    relaxed_match: float


def score(
    predicted: Sequence[str],
    gold: Sequence[str],
    *,
    gold_ids: Sequence[str | None] | None = None,
    aliases: Sequence[Sequence[str]] | None = None,
) -> AnswerScores:
    """All metrics for one prediction; with ``gold_ids``/``aliases`` the predictions are first
    matched to the gold answers by id or alias (:func:`match_predictions`)."""
    predicted = match_predictions(predicted, gold, gold_ids=gold_ids, aliases=aliases)
    p, r = precision_recall(predicted, gold)
    return AnswerScores(
        em_strict=em_strict(predicted, gold),
        hit=hit(predicted, gold),
        f1=f1(predicted, gold),
        precision=p,
        recall=r,
        hits_at_1=hits_at_1(predicted, gold),
        rhits_at_1=rhits_at_1(predicted, gold),
        relaxed_match=relaxed_match(predicted, gold),
    )


# --- confidence intervals of a mean score -------------------------------------------------


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1) (got {level})")


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n`` (Wilson, 1927), as
    ``scipy.stats.binomtest(...).proportion_ci(method="wilson")`` computes it.

    Right for 0/1 scores and small ``n``: unlike the normal ("Wald") interval it stays inside
    [0, 1] and does not collapse to a point at 0/n or n/n (5/10 -> (0.2366, 0.7634), 0/10 ->
    (0.0, 0.2775)). ``level`` is the two-sided coverage (z = 1.96 for 0.95)."""
    _check_level(level)
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need n >= 1 and 0 <= successes <= n (got {successes}/{n})")
    from scipy.stats import binomtest  # ~0.5 s to import: only where an interval is asked for

    ci = binomtest(successes, n).proportion_ci(confidence_level=level, method="wilson")
    # the bounds are exactly 0 at 0/n and 1 at n/n; clamp the float error
    lo = 0.0 if successes == 0 else max(0.0, float(ci.low))
    hi = 1.0 if successes == n else min(1.0, float(ci.high))
    return lo, hi


def bootstrap_interval(
    groups: Sequence[Sequence[float]],
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of a mean score, resampling *groups* (one per question,
    holding that question's scores over its runs).

    Several runs of one question are correlated, so the question is the unit, not the
    prediction: each resample draws ``len(groups)`` groups with replacement and takes the mean
    of the groups' means. That is the plain bootstrap of the mean over the groups' means, so
    ``scipy.stats.bootstrap`` (``method="percentile"``, NumPy's generator seeded with
    ``seed``, so the interval is the same on every call) computes it, vectorized in batches
    (2,000 resamples of 40,000 questions are 80 million draws). The bounds are the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles of the resample means, linearly
    interpolated (NumPy's ``percentile``). One group: its mean, both ends."""
    _check_level(level)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1 (got {resamples})")
    if not groups or any(len(g) == 0 for g in groups):
        raise ValueError("need at least one group, each with at least one score")
    means = np.array([sum(g) / len(g) for g in groups], dtype=np.float64)
    if len(means) == 1:  # every resample is that one group (scipy refuses a sample of one)
        return float(means[0]), float(means[0])
    from scipy.stats import bootstrap  # ~0.5 s to import: only where an interval is asked for

    result = bootstrap(
        (means,),
        np.mean,
        n_resamples=resamples,
        batch=max(1, 4_000_000 // len(means)),  # resamples per batch: ~32 MB of indices at most
        confidence_level=level,
        method="percentile",
        rng=np.random.default_rng(seed),
        vectorized=True,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def sign_test_p(better: int, worse: int) -> float:
    """Exact two-sided sign test: the chance, if a change were as likely to help as to hurt,
    of a split between ``better`` and ``worse`` at least this uneven (McNemar's exact test for
    paired 0/1 scores; ``scipy.stats.binomtest``'s p-value at 1/2). 1.0 when nothing changed;
    6 better, 0 worse -> 0.03125."""
    if better < 0 or worse < 0:
        raise ValueError(f"counts must be >= 0 (got {better}, {worse})")
    if better + worse == 0:
        return 1.0
    from scipy.stats import binomtest  # ~0.5 s to import: only where a test is asked for

    return min(1.0, float(binomtest(better, better + worse, 0.5).pvalue))


def mean_interval(
    groups: Sequence[Sequence[float]],
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """The interval eval reports for a mean score over questions (``groups``: each question's
    scores over its runs): :func:`wilson_interval` over questions when every question's mean
    score is 0 or 1 (binary metrics of one run, or runs that agree), else
    :func:`bootstrap_interval`."""
    if groups and all(len(g) > 0 for g in groups):
        means = [sum(g) / len(g) for g in groups]
        if all(m in (0.0, 1.0) for m in means):
            return wilson_interval(int(sum(means)), len(means), level)
    return bootstrap_interval(groups, resamples=resamples, seed=seed, level=level)
