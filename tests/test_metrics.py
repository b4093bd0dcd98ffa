"""Answer metrics on hand-made predictions, the documented normalization, and the confidence
intervals of mean scores (Wilson, clustered percentile bootstrap)."""

import pytest

from kgsynth.agent.protocol import parse_answer
from kgsynth.metrics import (
    OUTCOME_METRICS,
    bootstrap_interval,
    check_metric_name,
    em_strict,
    f1,
    f_beta,
    hit,
    hits_at_1,
    mean_interval,
    normalize_answer,
    relaxed_match,
    rhits_at_1,
    score,
    sign_test_p,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("The Matrix", "matrix"),
        ("  the   MATRIX ", "matrix"),
        ("Washington, D.C.", "washington d c"),
        ("ＡＢＣ", "abc"),
        ("Amélie", "amélie"),
        ("A Beautiful Mind", "beautiful mind"),
        ("Theory of Everything", "theory of everything"),  # "the" only as a whole word
        ("1999", "1999"),
        ("", ""),
    ],
)
def test_normalization(raw, key):
    assert normalize_answer(raw) == key


def test_comma_inside_a_name_is_one_answer():
    predicted = parse_answer('["Washington, D.C.", "Paris"]')
    assert predicted == ["Washington, D.C.", "Paris"]
    assert em_strict(predicted, ["Paris", "washington dc."]) == 0.0  # "d c" vs "dc"
    assert em_strict(predicted, ["Paris", "Washington, D.C."]) == 1.0


def test_set_metrics():
    gold = ["A", "B", "C", "D"]
    assert em_strict(["d", "c", "b", "a", "A"], gold) == 1.0  # order and duplicates ignored
    assert em_strict(["A", "B"], gold) == 0.0
    assert f1(["A", "B"], gold) == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert f1(["A", "X"], gold) == pytest.approx(2 * 0.5 * 0.25 / 0.75)
    assert f1([], gold) == 0.0 and f1(["A"], []) == 0.0 and em_strict([], []) == 0.0
    # beta < 1 leans to precision: one right answer out of four gold scores higher
    assert f_beta(["A"], gold, 0.5) > f1(["A"], gold) > f_beta(["A"], gold, 2.0)
    assert f_beta(["A"], gold, 0.5) == pytest.approx((1.25 * 1.0 * 0.25) / (0.25 * 1.0 + 0.25))
    with pytest.raises(ValueError):
        f_beta(["A"], gold, 0)


def test_hits_at_1_uses_the_first_answer():
    assert hits_at_1(["B", "X"], ["A", "B"]) == 1.0
    assert hits_at_1(["X", "B"], ["A", "B"]) == 0.0
    assert hits_at_1(["", " ", "b"], ["A", "B"]) == 1.0  # empty strings are skipped
    assert hits_at_1([], ["A"]) == 0.0


def test_relaxed_match_is_no_named_metric():
    s = score(["The Matrix Reloaded"], ["The Matrix"])
    assert s.relaxed_match == 1.0 and s.em_strict == 0.0 and s.hit == 0.0 and s.f1 == 0.0
    assert relaxed_match(["X"], ["Y"]) == 0.0


# The papers' definitions, computed by hand. Gold {A, B, C, D}.
#   P = [A, X]: strict EM 0 (sets differ); KnowCoder-A1 EM / KG-R1 Hit 1 (A is gold);
#     Hits@1 1 (first is A); RHits@1 1/2 (a random pick of {A, X} is gold half the time);
#     P 1/2, R 1/4, F1 2*(1/2)(1/4)/(3/4) = 1/3.
#   P = [X, A]: as above but Hits@1 0 (first is X).
#   P = [A, B, C, D]: all 1. P = [X, Y]: all 0. P = [A, a, the A]: one answer after
#     normalization ("the A" drops the article): RHits@1 1, not 3/3 of three draws.
@pytest.mark.parametrize(
    ("predicted", "strict", "hit_", "h1", "rh1", "f1_"),
    [
        (["A", "X"], 0.0, 1.0, 1.0, 0.5, 1 / 3),
        (["X", "A"], 0.0, 1.0, 0.0, 0.5, 1 / 3),
        (["A", "B", "C", "D"], 1.0, 1.0, 1.0, 1.0, 1.0),
        (["X", "Y"], 0.0, 0.0, 0.0, 0.0, 0.0),
        (["A", "a", "the A"], 0.0, 1.0, 1.0, 1.0, 2 * 1.0 * 0.25 / 1.25),
        (["X", "Y", "Z", "A"], 0.0, 1.0, 0.0, 0.25, 2 * 0.25 * 0.25 / 0.5),
        ([], 0.0, 0.0, 0.0, 0.0, 0.0),
    ],
)
def test_named_metrics_match_the_papers_definitions(predicted, strict, hit_, h1, rh1, f1_):
    gold = ["A", "B", "C", "D"]
    assert em_strict(predicted, gold) == strict
    assert hit(predicted, gold) == hit_
    assert hits_at_1(predicted, gold) == h1
    assert rhits_at_1(predicted, gold) == pytest.approx(rh1)
    assert f1(predicted, gold) == pytest.approx(f1_)
    s = score(predicted, gold)
    assert (s.em_strict, s.hit, s.hits_at_1) == (strict, hit_, h1)
    assert s.rhits_at_1 == pytest.approx(rh1) and s.f1 == pytest.approx(f1_)
    for name, fn in OUTCOME_METRICS.items():
        assert fn(predicted, gold) == pytest.approx(getattr(s, name))


def test_plain_em_is_refused_as_ambiguous():
    from kgsynth.core.errors import ConfigError

    assert check_metric_name("hit", "--outcome") == "hit"
    with pytest.raises(ConfigError, match=r"ambiguous.*em_strict.*hit"):
        check_metric_name("em", "--outcome")
    with pytest.raises(ConfigError, match="unknown metric 'bleu'"):
        check_metric_name("bleu", "--outcome")


# --- confidence intervals -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("successes", "n", "interval"),
    [
        # the roots p of (k/n - p)^2 = z^2 p (1 - p) / n, z = 1.959964, solved independently
        (0, 10, (0.0, 0.277533)),
        (5, 10, (0.236593, 0.763407)),
        (10, 10, (0.722467, 1.0)),
        (1, 2, (0.094531, 0.905469)),
        (62, 100, (0.522098, 0.709024)),
    ],
)
def test_wilson_interval_known_values(successes, n, interval):
    lo, hi = wilson_interval(successes, n)
    assert (lo, hi) == pytest.approx(interval, abs=1e-6)
    # the interval is symmetric under swapping successes and failures
    assert wilson_interval(n - successes, n) == pytest.approx((1 - hi, 1 - lo), abs=1e-12)


def test_wilson_interval_level_and_bad_input():
    narrow, wide = wilson_interval(5, 10, 0.80), wilson_interval(5, 10, 0.99)
    assert wide[0] < 0.236593 < narrow[0] and narrow[1] < 0.763407 < wide[1]
    for bad in ((0, 0), (11, 10), (-1, 10)):
        with pytest.raises(ValueError, match="successes"):
            wilson_interval(*bad)
    with pytest.raises(ValueError, match="level"):
        wilson_interval(5, 10, 1.0)


def test_bootstrap_interval_two_questions_by_hand():
    # resampling two questions scoring 0 and 1: the mean is 0, 0.5 or 1 with probability
    # 1/4, 1/2, 1/4, so the 2.5 % and 97.5 % points are 0 and 1
    assert bootstrap_interval([[0.0], [1.0]]) == (0.0, 1.0)
    assert bootstrap_interval([[0.25], [0.25], [0.25]]) == (0.25, 0.25)
    # the question is the unit: four agreeing runs per question add no information ...
    assert bootstrap_interval([[0.0] * 4, [1.0] * 4]) == (0.0, 1.0)
    # ... while eight independent questions give a narrower interval
    lo, hi = bootstrap_interval([[0.0]] * 4 + [[1.0]] * 4)
    assert 0.0 < lo < 0.5 < hi < 1.0


def test_bootstrap_interval_is_seeded_and_contains_the_mean():
    groups = [[i % 7 / 6, (i * 3) % 5 / 4] for i in range(40)]
    mean = sum(sum(g) / 2 for g in groups) / 40
    lo, hi = bootstrap_interval(groups)
    assert bootstrap_interval(groups) == (lo, hi)  # the same seed, the same interval
    assert bootstrap_interval(groups, seed=1) != (lo, hi)
    assert lo < mean < hi and hi - lo < 0.3
    # fewer resamples of the same seed: another interval around the same mean
    lo100, hi100 = bootstrap_interval(groups, resamples=100)
    assert lo100 < mean < hi100
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_interval([])
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_interval([[1.0], []])
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_interval(groups, resamples=0)


def test_mean_interval_uses_wilson_for_binary_questions():
    assert mean_interval([[1.0]] * 5 + [[0.0]] * 5) == wilson_interval(5, 10)
    # runs that agree keep a question binary; the question is still the unit
    assert mean_interval([[1.0, 1.0]] * 5 + [[0.0, 0.0]] * 5) == wilson_interval(5, 10)
    # runs that disagree (or F1 between 0 and 1): bootstrap
    split = [[1.0, 0.0]] + [[1.0]] * 4 + [[0.0]] * 5
    assert mean_interval(split) == bootstrap_interval(split)
    assert mean_interval([[0.5], [1.0]]) == bootstrap_interval([[0.5], [1.0]]) == (0.5, 1.0)


@pytest.mark.parametrize(
    ("better", "worse", "p"),
    [
        (0, 0, 1.0),  # nothing changed
        (6, 0, 0.03125),  # 2 / 2^6
        (0, 6, 0.03125),  # two-sided: the mirror is as unlikely
        (4, 8, 0.387695),  # 2 * (1 + 12 + 66 + 220 + 495) / 4096
        (14, 4, 0.030884),  # 2 * sum C(18, k), k <= 4, / 2^18
        (5, 5, 1.0),  # capped at 1
    ],
)
def test_sign_test_known_values(better, worse, p):
    assert sign_test_p(better, worse) == pytest.approx(p, abs=1e-6)


def test_sign_test_bad_input():
    with pytest.raises(ValueError, match="counts"):
        sign_test_p(-1, 3)
