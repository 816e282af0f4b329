"""accuracy@k metrics of rpg_cli.evaluation.metrics against exact combinatorics and hand-worked cases."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest

from rpg_cli.evaluation.metrics import maj_at_k, majority_answer, mean_at_k, pass_at_k, pass_at_k_curve, std_at_k


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_pass_at_k_matches_exact_binomials_for_all_small_cases():
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_where_binomials_are_astronomical():
    for n, c, k in [(1000, 3, 500), (1024, 1, 1), (1024, 700, 64), (5000, 2, 4999)]:
        assert pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), rel=1e-9)


def test_pass_at_k_edge_values_are_exact():
    assert pass_at_k(32, 0, 32) == 0.0  # never solved
    assert pass_at_k(32, 32, 1) == 1.0
    assert pass_at_k(32, 5, 28) == 1.0  # n - c = 27 < k: every draw of 28 contains a correct one
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # k = 1 is the plain success rate


@pytest.mark.parametrize(
    "n, c, k",
    [
        (0, 0, 1),
        (-1, 0, 1),
        (4, -1, 1),
        (4, 5, 1),
        (4, 2, 0),
        (4, 2, 5),
        (4.0, 2, 1),
        (4, 2, 1.5),
        (True, 0, 1),
        (4, "2", 1),
    ],
)
def test_pass_at_k_rejects_invalid_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_mean_at_k_averages_per_problem_rates():
    correct = [[True, False, False, True], [True, True, True, True], [False, False, False, False]]
    assert mean_at_k(correct) == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    # problems weigh equally even with different sample counts
    assert mean_at_k([[True], [False, False, False, True]]) == pytest.approx((1.0 + 0.25) / 2)


def test_mean_at_k_equals_average_pass_at_1():
    rng = random.Random(3)
    correct = [[rng.random() < 0.3 for _ in range(16)] for _ in range(25)]
    expected = sum(pass_at_k(16, sum(s), 1) for s in correct) / len(correct)
    assert mean_at_k(correct) == pytest.approx(expected)


@pytest.mark.parametrize("bad", [[], [[True], []]])
def test_metrics_reject_missing_samples(bad):
    for metric in (mean_at_k, std_at_k):
        with pytest.raises(ValueError):
            metric(bad)


def test_majority_vote_ignores_missing_answers_and_breaks_ties_by_first_appearance():
    assert majority_answer(["3", None, "5", "5", None, None]) == 2  # None never wins, though most frequent
    assert majority_answer(["7", "9", "9", "7"]) == 0  # tie 2-2: "7" appeared first
    assert majority_answer(["9", "7", "7", "9"]) == 0
    assert majority_answer([None, None]) is None


def test_maj_at_k_scores_the_winning_answer():
    answers = [
        ["12", "12", "13", None],  # "12" wins and is right
        ["4", "5", "5", "4"],  # tie, "4" first, and "4" is wrong
        [None, None, None, None],  # nothing extracted: 0
        ["8", "9", "9", "9"],  # wrong majority beats the right minority
    ]
    correct = [
        [True, True, False, False],
        [False, True, True, False],
        [False, False, False, False],
        [True, False, False, False],
    ]
    assert maj_at_k(answers, correct) == pytest.approx(1 / 4)


def test_maj_at_k_uses_the_first_sample_of_the_winning_answer():
    # the same extracted text can carry different verdicts (e.g. found by different rules); the earliest decides
    assert maj_at_k([["6", "6"]], [[False, True]]) == 0.0
    assert maj_at_k([["6", "6"]], [[True, False]]) == 1.0


def test_maj_at_k_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        maj_at_k([["1", "2"]], [[True]])
    with pytest.raises(ValueError):
        maj_at_k([["1"], ["2"]], [[True]])


def test_std_at_k_is_the_spread_of_single_sample_evaluations():
    correct = [[True, False], [True, True]]  # per sample index: acc_0 = 1.0, acc_1 = 0.5
    assert std_at_k(correct) == pytest.approx(0.25)
    assert std_at_k([[True], [False]]) == 0.0  # one sample index: no spread
    assert std_at_k([[True, False, True]] * 4) == pytest.approx(np.std([1.0, 0.0, 1.0]))


def test_std_at_k_agrees_with_numpy_on_random_data():
    rng = np.random.default_rng(0)
    correct = rng.random((30, 32)) < 0.4
    assert std_at_k(correct.tolist()) == pytest.approx(float(correct.mean(axis=0).std()))


def test_std_at_k_rejects_ragged_samples():
    with pytest.raises(ValueError, match="same number"):
        std_at_k([[True, False], [True]])


def test_pass_at_k_curve_keys_and_values():
    curve = pass_at_k_curve(32, [0, 5, 32, 1])
    assert list(curve) == [1, 2, 4, 8, 16, 32]
    assert curve[1] == pytest.approx((0 + 5 / 32 + 1 + 1 / 32) / 4)
    assert curve[32] == pytest.approx(3 / 4)  # solved at least once
    assert curve[8] == pytest.approx(sum(float(exact_pass_at_k(32, c, 8)) for c in [0, 5, 32, 1]) / 4)
    values = list(curve.values())
    assert all(a <= b + 1e-15 for a, b in zip(values, values[1:]))
    assert list(pass_at_k_curve(5, [2])) == [1, 2, 4, 5]
    assert list(pass_at_k_curve(1, [1])) == [1]


@pytest.mark.parametrize("n, c_list", [(0, [0]), (4, []), (4, [5]), (2.0, [1])])
def test_pass_at_k_curve_rejects_invalid_input(n, c_list):
    with pytest.raises(ValueError):
        pass_at_k_curve(n, c_list)
