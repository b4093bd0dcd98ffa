"""Answer metrics on hand-made predictions, and the documented normalization."""

import pytest

from kgsynth.agent.protocol import parse_answer
from kgsynth.metrics import (
    exact_match,
    f1,
    f_beta,
    hits_at_1,
    normalize_answer,
    relaxed_match,
    score,
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
    assert exact_match(predicted, ["Paris", "washington dc."]) == 0.0  # "d c" vs "dc"
    assert exact_match(predicted, ["Paris", "Washington, D.C."]) == 1.0


def test_set_metrics():
    gold = ["A", "B", "C", "D"]
    assert exact_match(["d", "c", "b", "a", "A"], gold) == 1.0  # order and duplicates ignored
    assert exact_match(["A", "B"], gold) == 0.0
    assert f1(["A", "B"], gold) == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert f1(["A", "X"], gold) == pytest.approx(2 * 0.5 * 0.25 / 0.75)
    assert f1([], gold) == 0.0 and f1(["A"], []) == 0.0 and exact_match([], []) == 0.0
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


def test_relaxed_match_is_not_em():
    s = score(["The Matrix Reloaded"], ["The Matrix"])
    assert s.relaxed_match == 1.0 and s.em == 0.0 and s.f1 == 0.0
    assert relaxed_match(["X"], ["Y"]) == 0.0
