"""rpg_cli.stats (MATH.md section 8): interval coverage on simulated Bernoulli data, paired vs unpaired
widths, P(B > A) against enumeration, verdicts, seeds needed against the closed form, curve bands, the
t quantile, and bad input.

Simulation model (every coverage test): a problem's rate q ~ Beta, a training seed's effect a ~
Uniform(-c, c) moves every rate to q + a q (1 - q) (most on mid-difficulty problems; stays in [0, 1]),
and a run scores mean@8 = Binomial(8, rate) / 8 per problem. E[a] = 0, so the method's true score is
E[q] exactly, and one run's true score (over the problem population) is E[q] + a E[q (1 - q)].

Regimes: the coverage tests use designs where the method is valid -- 5-10 seeds, or 3 seeds when
problem sampling dominates (the usual case for a 30-problem benchmark), or one seed for that run's own
score. With few seeds and a seed variance larger than the problem variance the interval undercovers
(about 0.91 at 3 seeds and 0.94 at 5 in 4,000-simulation runs of the seed-heavy design, c = 1.0 with
Beta(2, 2) rates); the module docstring says so.
"""

from __future__ import annotations

import itertools
import math
import statistics
import subprocess
import sys

import numpy as np
import pytest

from rpg_cli import stats
from rpg_cli.stats import OVERALL, Interval, Runs

K = 8  # samples per problem
N_SIMS = 1000
N_RESAMPLES = 500  # per simulated interval (noise in the endpoints, if anything, lowers coverage slightly)


def simulate(
    rng: np.random.Generator, n_seeds: int, rates: np.ndarray, seed_effect: float
) -> tuple[np.ndarray, np.ndarray]:
    a = rng.uniform(-seed_effect, seed_effect, size=n_seeds)
    p = rates[None, :] + a[:, None] * rates * (1 - rates)
    return rng.binomial(K, p) / K, a


def beta_moments(alpha: float, beta: float) -> tuple[float, float]:
    """E[q] and E[q (1 - q)] for q ~ Beta(alpha, beta)."""
    return alpha / (alpha + beta), alpha * beta / ((alpha + beta) * (alpha + beta + 1))


# ---------------------------------------------------------------------------------------- coverage


@pytest.mark.parametrize(
    ("n_seeds", "n_problems", "seed_effect", "ab"),
    [
        (10, 30, 1.0, (2, 2)),  # seed and problem variance of the same size
        (3, 30, 0.3, (1, 1)),  # 3 seeds, problem sampling dominates (the demo's shape, AIME-sized)
        (1, 30, 0.6, (2, 2)),  # one seed: the interval covers that run's score over problems
    ],
)
def test_score_interval_covers_95_percent(n_seeds, n_problems, seed_effect, ab):
    mean_q, mean_qq = beta_moments(*ab)
    rng = np.random.default_rng(1000 * n_seeds + n_problems)
    hits = 0
    for i in range(N_SIMS):
        scores, a = simulate(rng, n_seeds, rng.beta(*ab, size=n_problems), seed_effect)
        interval = stats.score(Runs({"bench": scores}), "bench", n_resamples=N_RESAMPLES, rng_seed=i)
        truth = mean_q if n_seeds > 1 else mean_q + a[0] * mean_qq
        hits += interval.low <= truth <= interval.high
    assert 0.93 <= hits / N_SIMS <= 0.97


def test_overall_interval_covers_95_percent():
    """Three benchmarks of different sizes, one seed effect per run shared by all of them."""
    mean_q, _ = beta_moments(2, 2)
    rng = np.random.default_rng(7)
    hits = 0
    for i in range(N_SIMS):
        a = rng.uniform(-0.6, 0.6, size=5)
        blocks = {}
        for name, n_problems in (("aime24", 12), ("aime25", 20), ("amc23", 30)):
            q = rng.beta(2, 2, size=n_problems)
            blocks[name] = rng.binomial(K, q[None, :] + a[:, None] * q * (1 - q)) / K
        interval = stats.score(Runs(blocks), OVERALL, n_resamples=N_RESAMPLES, rng_seed=i)
        hits += interval.low <= mean_q <= interval.high
    assert 0.93 <= hits / N_SIMS <= 0.97


def test_difference_interval_coverage_and_false_positives():
    """Two methods on the same problems with a method x problem interaction and no true difference:
    the paired interval covers 0 about 95% of the time, so 'no detectable difference' is the verdict
    about 95% of the time (a false-positive rate near 5%)."""
    rng = np.random.default_rng(11)
    hits = 0
    for i in range(N_SIMS):
        q = rng.beta(2, 2, size=30)
        q_b = q + rng.uniform(-0.5, 0.5, size=30) * q * (1 - q)  # B is better on some problems, worse on others
        a, _ = simulate(rng, 5, q, 0.6)
        b, _ = simulate(rng, 5, q_b, 0.6)
        diff = stats.difference(Runs({"bench": a}), Runs({"bench": b}), "bench", n_resamples=N_RESAMPLES, rng_seed=i)
        hits += stats.verdict(diff) == stats.NO_DIFFERENCE
    assert 0.93 <= hits / N_SIMS <= 0.97


def test_bootstrap_variance_matches_its_closed_form():
    """The vectorized resampling (one seed draw shared by all problems and benchmarks, one problem draw
    shared by all seeds) has the variance the two-way decomposition predicts."""
    rng = np.random.default_rng(3)
    blocks = {"x": rng.random((4, 12)), "y": rng.random((4, 7))}
    term = stats._Term(1.0, "runs", "problems", blocks)
    weights = {"x": 0.5, "y": 0.5}
    by_bench = stats._replicates([term], 40_000, rng_seed=0)
    replicates = 0.5 * by_bench["x"] + 0.5 * by_bench["y"]
    predicted = stats._decompose([term], weights).boot
    assert replicates.var() == pytest.approx(predicted, rel=0.04)
    assert replicates.mean() == pytest.approx(stats._estimate([term], weights), abs=3 * math.sqrt(predicted / 40_000))


def test_one_seed_interval_is_the_t_interval_over_problems():
    """With one seed and symmetric data the stretched percentile interval is mean +- t_{P-1} s / sqrt(P)."""
    values = np.linspace(0.1, 0.9, 25)[None, :]
    interval = stats.score(Runs({"b": values}), "b", n_resamples=20_000)
    half = stats.t_quantile(0.975, 24) * values.std(ddof=1) / 5
    assert interval.resampled == stats.PROBLEMS_ONLY
    assert interval.estimate == pytest.approx(0.5)
    assert interval.low == pytest.approx(0.5 - half, abs=0.03 * half)
    assert interval.high == pytest.approx(0.5 + half, abs=0.03 * half)


# ------------------------------------------------------------------------------- paired vs unpaired


def width(interval: Interval) -> float:
    return interval.high - interval.low


def test_paired_interval_is_narrower_when_problems_are_correlated():
    """Both methods find the same problems easy or hard: pairing cancels the problem variance."""
    rng = np.random.default_rng(5)
    ratios = []
    for i in range(40):
        q = rng.beta(1, 1, size=30)
        a, b = Runs({"b": simulate(rng, 5, q, 0.3)[0]}), Runs({"b": simulate(rng, 5, q, 0.3)[0]})
        paired = stats.difference(a, b, "b", n_resamples=N_RESAMPLES, rng_seed=i)
        unpaired = stats.difference(a, b, "b", paired=False, n_resamples=N_RESAMPLES, rng_seed=i)
        ratios.append(width(paired) / width(unpaired))
    assert max(ratios) < 1.0
    assert statistics.fmean(ratios) < 0.6


def test_paired_and_unpaired_intervals_agree_in_expectation_when_problems_are_independent():
    """A and B drawn on unrelated problem rates: pairing buys nothing, and the widths agree on average.
    (Pairing costs degrees of freedom -- one seed factor instead of two -- which widens the paired t
    quantile slightly; with 10 seeds and 60 problems that is ~1%.)"""
    rng = np.random.default_rng(6)
    ratios = []
    for i in range(300):
        a = Runs({"b": simulate(rng, 10, rng.beta(1, 1, size=60), 0.3)[0]})
        b = Runs({"b": simulate(rng, 10, rng.beta(1, 1, size=60), 0.3)[0]})
        paired = stats.difference(a, b, "b", n_resamples=N_RESAMPLES, rng_seed=i)
        unpaired = stats.difference(a, b, "b", paired=False, n_resamples=N_RESAMPLES, rng_seed=i)
        ratios.append(width(paired) / width(unpaired))
    assert statistics.fmean(ratios) == pytest.approx(1.0, abs=0.03)


# ------------------------------------------------------------------------------------- P(B > A)


def enumerate_p_improvement(a: np.ndarray, b: np.ndarray) -> float:
    """Every (B run, A run, problem) triple: 1 if B's accuracy is higher, 1/2 on a tie."""
    wins = [
        1.0 if b[i, p] > a[j, p] else 0.5 if b[i, p] == a[j, p] else 0.0
        for i, j, p in itertools.product(range(b.shape[0]), range(a.shape[0]), range(a.shape[1]))
    ]
    return sum(wins) / len(wins)


def test_p_improvement_equals_enumeration():
    a = np.array([[0.25, 0.5, 1.0], [0.0, 0.5, 0.75]])
    b = np.array([[0.5, 0.5, 1.0], [0.25, 0.0, 0.75], [0.0, 1.0, 1.0]])
    result = stats.p_improvement(Runs({"x": a}), Runs({"x": b}), "x")
    # by hand, (B run, A run) pairs per problem: problem 0: 3 wins + 2 ties = 4 of 6; problem 1: 2 wins
    # + 2 ties = 3; problem 2: 2 wins + 3 ties = 3.5
    assert result.estimate == pytest.approx(enumerate_p_improvement(a, b))
    assert result.estimate == pytest.approx((4.0 + 3.0 + 3.5) / 18)
    assert result.low <= result.estimate <= result.high
    swapped = stats.p_improvement(Runs({"x": b}), Runs({"x": a}), "x")
    assert swapped.estimate == pytest.approx(1 - result.estimate)


def test_p_improvement_with_one_seed_each_counts_problems():
    a = Runs({"x": [[0.1, 0.5, 0.9, 0.3]]})
    b = Runs({"x": [[0.2, 0.5, 0.8, 0.6]]})
    result = stats.p_improvement(a, b, "x")
    assert result.estimate == pytest.approx((1 + 0.5 + 0 + 1) / 4)
    assert result.resampled == stats.PROBLEMS_ONLY


def test_p_improvement_overall_is_the_mean_over_benchmarks():
    rng = np.random.default_rng(2)
    a = Runs({"x": rng.random((3, 5)), "y": rng.random((3, 9))})
    b = Runs({"x": rng.random((3, 5)), "y": rng.random((3, 9))})
    expected = (
        enumerate_p_improvement(a.scores["x"], b.scores["x"]) + enumerate_p_improvement(a.scores["y"], b.scores["y"])
    ) / 2
    assert stats.p_improvement(a, b).estimate == pytest.approx(expected)


# ------------------------------------------------------------------------------------------ verdicts


def test_identical_groups_give_no_detectable_difference():
    rng = np.random.default_rng(4)
    a = Runs({"x": rng.binomial(K, 0.4, size=(3, 30)) / K, "y": rng.binomial(K, 0.6, size=(3, 20)) / K})
    for bench in ("x", "y", OVERALL):
        result = stats.compare(a, a, bench)
        assert result.verdict == stats.NO_DIFFERENCE
        assert result.difference.estimate == 0.0
        assert not result.difference.excludes(0.0)
        assert result.p_improvement.estimate == pytest.approx(0.5)
        assert result.seeds_needed.n is None and "no difference" in result.seeds_needed.reason


def test_clear_separation_gives_the_right_verdict():
    rng = np.random.default_rng(8)
    q = rng.beta(2, 2, size=30)
    a = Runs({"x": simulate(rng, 3, q, 0.2)[0]})
    b = Runs({"x": simulate(rng, 3, np.clip(q + 0.3, 0, 1), 0.2)[0]})
    forward, backward = stats.compare(a, b, "x"), stats.compare(b, a, "x")
    assert forward.verdict == stats.B_BETTER and backward.verdict == stats.A_BETTER
    assert forward.difference.low > 0 and backward.difference.high < 0
    assert forward.p_improvement.estimate > 0.8
    assert "B better" in forward.text() and "DAPO better" in forward.text("GRPO", "DAPO")


def test_verdict_follows_the_interval():
    def interval(low, high):
        return Interval((low + high) / 2, low, high, 3, 30, stats.SEEDS_AND_PROBLEMS)

    assert stats.verdict(interval(0.01, 0.05)) == stats.B_BETTER
    assert stats.verdict(interval(-0.05, -0.01)) == stats.A_BETTER
    assert stats.verdict(interval(-0.01, 0.05)) == stats.NO_DIFFERENCE
    assert stats.verdict(interval(0.0, 0.05)) == stats.NO_DIFFERENCE  # touching 0 is not excluding it
    no_interval = Interval(0.1, None, None, 1, 1, stats.NOTHING)
    assert stats.verdict(no_interval) == stats.NO_DIFFERENCE


def test_pairing_follows_seed_labels_and_problem_ids():
    """B given with its runs and problems in another order compares exactly as in A's order."""
    rng = np.random.default_rng(9)
    a_scores, b_scores = rng.random((3, 6)), rng.random((3, 6))
    ids = [f"p{i}" for i in range(6)]
    a = Runs({"x": a_scores}, seeds=(0, 1, 2), problems={"x": ids})
    b = Runs({"x": b_scores}, seeds=(0, 1, 2), problems={"x": ids})
    shuffled = Runs({"x": b_scores[[2, 0, 1]][:, ::-1]}, seeds=(2, 0, 1), problems={"x": ids[::-1]})
    assert stats.compare(a, shuffled, "x") == stats.compare(a, b, "x")
    assert stats.compare(a, b, "x").seeds_paired
    other_seeds = Runs({"x": b_scores}, seeds=(0, 1, 5), problems={"x": ids})
    unpaired = stats.compare(a, other_seeds, "x")
    assert not unpaired.seeds_paired and "unpaired" in unpaired.difference.resampled
    assert unpaired.difference.estimate == pytest.approx(b_scores.mean() - a_scores.mean())


def test_a_table_row_equals_its_cells():
    """`scores` (one set of resamples for a row) gives exactly the intervals of one `score` call per cell."""
    rng = np.random.default_rng(13)
    runs = Runs({"x": rng.random((3, 12)), "y": rng.random((3, 20)), "z": rng.random((3, 7))})
    row = stats.scores(runs)
    assert list(row) == ["x", "y", "z", OVERALL]
    for bench, interval in row.items():
        assert interval == stats.score(runs, bench)


def test_results_are_reproducible():
    rng = np.random.default_rng(10)
    a, b = Runs({"x": rng.random((4, 20))}), Runs({"x": rng.random((4, 20))})
    assert stats.compare(a, b, "x") == stats.compare(a, b, "x")
    assert stats.score(a, "x", rng_seed=1) != stats.score(a, "x", rng_seed=2)


# -------------------------------------------------------------------------------------- seeds needed


def smallest_detecting_n(d: float, seed_variance: float) -> int:
    """With seed variance only: the smallest n with d >= (t_{n-1, .975} + t_{n-1, .8}) * sqrt(var / n)."""
    n = 2
    while d < (stats.t_quantile(0.975, n - 1) + stats.t_quantile(0.8, n - 1)) * math.sqrt(seed_variance / n):
        n += 1
    return n


def test_seeds_needed_matches_the_closed_form():
    """B - A = d + a_s exactly: the seed variance is var(a), no problem or interaction variance."""
    seed_shift = np.array([-0.02, 0.0, 0.03, -0.01])
    a = np.full((4, 20), 0.5)
    for d, expected_normal in ((0.02, 10), (0.05, 2)):
        b = a + d + seed_shift[:, None] - seed_shift.mean()
        result = stats.seeds_needed(Runs({"x": a}), Runs({"x": b}), "x")
        z = statistics.NormalDist().inv_cdf(0.975) + statistics.NormalDist().inv_cdf(0.8)
        assert math.ceil(statistics.variance(seed_shift) / (d / z) ** 2) == expected_normal  # the normal formula
        assert result.n == smallest_detecting_n(d, statistics.variance(seed_shift))
        assert result.n > expected_normal  # few seeds: t quantiles ask for more than the normal formula


def test_seeds_needed_counts_the_problem_variance():
    """Problem variance that more seeds cannot remove: more seeds than without it, and at least the
    normal formula n = var(a) / ((d/z)^2 - var(b)/P)."""
    seed_shift, problem_shift, d = np.array([-0.02, 0.0, 0.03, -0.01]), np.linspace(-0.02, 0.02, 20), 0.02
    a = np.full((4, 20), 0.5)
    b = a + d + seed_shift[:, None] - seed_shift.mean()
    without = stats.seeds_needed(Runs({"x": a}), Runs({"x": b}), "x").n
    with_problems = stats.seeds_needed(Runs({"x": a}), Runs({"x": b + problem_shift[None, :]}), "x").n
    z = statistics.NormalDist().inv_cdf(0.975) + statistics.NormalDist().inv_cdf(0.8)
    normal = math.ceil(statistics.variance(seed_shift) / ((d / z) ** 2 - statistics.variance(problem_shift) / 20))
    assert with_problems > without and with_problems >= normal > 10


def test_seeds_needed_says_why_it_cannot_answer():
    rng = np.random.default_rng(12)
    one_seed_a, one_seed_b = Runs({"x": rng.random((1, 10))}), Runs({"x": rng.random((1, 10))})
    assert "2+ seeds" in stats.seeds_needed(one_seed_a, one_seed_b, "x").reason
    a = rng.random((5, 10))
    b = np.clip(a + 0.001 + rng.normal(0, 0.2, size=(1, 10)), 0, 1)  # tiny difference, noisy problems
    b = np.where(b == a, np.clip(b + 0.001, 0, 1), b)
    result = stats.seeds_needed(Runs({"x": a}), Runs({"x": b}), "x")
    assert result.n is None and "more problems" in result.reason


# -------------------------------------------------------------------------------------------- bands


def test_curve_band_is_the_t_interval_of_the_mean_per_step():
    curves = [([0, 10, 20], [0.1, 0.3, 0.5]), ([0, 10, 20], [0.2, 0.4, 0.4]), ([0, 10], [0.3, 0.2])]
    band = stats.curve_band(curves)
    assert list(band.steps) == [0, 10, 20] and list(band.n_seeds) == [3, 3, 2]
    for i, values in enumerate(([0.1, 0.2, 0.3], [0.3, 0.4, 0.2], [0.5, 0.4])):
        half = stats.t_quantile(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        assert band.mean[i] == pytest.approx(statistics.fmean(values))
        assert band.high[i] - band.mean[i] == pytest.approx(half)
        assert band.mean[i] - band.low[i] == pytest.approx(half)


def test_curve_band_is_cut_to_the_metrics_range_and_only_there():
    curves = [([0, 1], [0.02, 0.9]), ([0, 1], [0.30, 0.99]), ([0, 1], [0.01, 0.2])]  # t with 2 df: wide
    free = stats.curve_band(curves)
    assert free.low[0] < 0 and free.high[1] > 1  # the bare t interval leaves [0, 1]
    cut = stats.curve_band(curves, bounds=(0.0, 1.0))
    assert list(cut.low) == pytest.approx(list(np.maximum(free.low, 0.0)))
    assert list(cut.high) == pytest.approx(list(np.minimum(free.high, 1.0)))
    assert free.high[0] < 1 and cut.high[0] == pytest.approx(free.high[0])  # inside the range: unchanged
    assert list(cut.mean) == pytest.approx(list(free.mean))
    one = stats.curve_band([([0], [0.5])], bounds=(0.0, 1.0))
    assert np.isnan(one.low[0]) and np.isnan(one.high[0])  # still no band from one seed


def test_curve_band_with_one_seed_has_no_band():
    band = stats.curve_band([([1, 2], [0.1, 0.2]), ([2], [0.4])])
    assert np.isnan(band.low[0]) and np.isnan(band.high[0]) and not np.isnan(band.low[1])
    records = band.records()
    assert records[0] == {"step": 1, "mean": 0.1, "low": None, "high": None, "n_seeds": 1}


# ----------------------------------------------------------------------------------- edge cases


def test_one_seed_one_problem_and_both():
    one_seed = stats.score(Runs({"x": [[0.2, 0.4, 0.9]]}), "x")
    assert one_seed.resampled == stats.PROBLEMS_ONLY and one_seed.n_seeds == 1 and one_seed.low < 0.5 < one_seed.high
    one_problem = stats.score(Runs({"x": [[0.2], [0.4], [0.5]]}), "x")
    assert one_problem.resampled == stats.SEEDS_ONLY and one_problem.n_problems == 1
    assert one_problem.low < one_problem.estimate < one_problem.high
    single = stats.score(Runs({"x": [[0.25]]}), "x")
    assert (single.estimate, single.low, single.high) == (0.25, None, None)
    assert single.pm() == "25.0" and single.ci() == ""
    assert stats.compare(Runs({"x": [[0.25]]}), Runs({"x": [[0.5]]}), "x").verdict == stats.NO_DIFFERENCE


def test_constant_scores_give_a_zero_width_interval_not_nan():
    interval = stats.score(Runs({"x": np.zeros((3, 10))}), "x")
    assert (interval.estimate, interval.low, interval.high) == (0.0, 0.0, 0.0)


def test_intervals_stay_in_range():
    interval = stats.score(Runs({"x": [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0]]}), "x")
    assert 0.0 <= interval.low <= interval.high <= 1.0


def test_means_only_interval_covers_seeds():
    interval = stats.score_from_means([0.30, 0.35, 0.32, 0.36])
    assert interval.resampled == stats.MEANS_ONLY and interval.n_problems is None
    values = [0.30, 0.35, 0.32, 0.36]
    half = stats.t_quantile(0.975, 3) * statistics.stdev(values) / 2
    assert interval.high - interval.low == pytest.approx(2 * half, rel=0.1)
    assert stats.score_from_means([0.3]).low is None


def test_formatting():
    interval = Interval(0.521, 0.487, 0.555, 3, 30, stats.SEEDS_AND_PROBLEMS)
    assert interval.pm() == "52.1 ±3.4"
    assert interval.ci() == "[48.7, 55.5]"
    assert interval.as_dict()["low"] == 0.487 and interval.as_dict()["resampled"] == "seeds and problems"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Runs({}), "no scores"),
        (lambda: Runs({"x": np.zeros((0, 4))}), "non-empty"),
        (lambda: Runs({"x": [0.1, 0.2]}), "(seeds, problems)"),
        (lambda: Runs({"x": [[0.1, np.nan]]}), "[0, 1]"),
        (lambda: Runs({"x": [[0.1, 1.5]]}), "[0, 1]"),
        (lambda: Runs({"x": [[0.1]], "y": [[0.1], [0.2]]}), "a row per run"),
        (lambda: Runs({"x": [[0.1], [0.2]]}, seeds=(1, 1)), "label"),
        (lambda: Runs({"overall": [[0.1]]}), "reserved"),
        (lambda: Runs({"x": [[0.1, 0.2]]}, problems={"x": ["p1"]}), "problem ids"),
        (lambda: stats.score(Runs({"x": [[0.1]]}), "y"), "no scores for benchmark 'y'"),
        (lambda: stats.compare(Runs({"x": [[0.1, 0.2]]}), Runs({"x": [[0.1]]}), "x"), "same problem set"),
        (lambda: stats.compare(Runs({"x": [[0.1]], "y": [[0.1]]}), Runs({"x": [[0.1]]})), "same benchmarks"),
        (
            lambda: stats.compare(
                Runs({"x": [[0.1]]}, problems={"x": ["p1"]}), Runs({"x": [[0.1]]}, problems={"x": ["p2"]}), "x"
            ),
            "different problems",
        ),
        (lambda: stats.curve_band([]), "no curves"),
        (lambda: stats.curve_band([([], [])]), "no points"),
        (lambda: stats.curve_band([([1, 2], [0.1])]), "2 steps but 1 values"),
        (lambda: stats.score(Runs({"x": [[0.1, 0.2]]}), "x", n_resamples=10), "too few"),
    ],
)
def test_bad_input_is_a_one_line_value_error(make, message):
    with pytest.raises(ValueError) as excinfo:
        make()
    assert message in str(excinfo.value) and "\n" not in str(excinfo.value)


# ---------------------------------------------------------------------------------------- t quantile


@pytest.mark.parametrize(
    ("df", "expected"),  # two-sided 95% values of the standard t table
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (10, 2.2281), (30, 2.0423), (100, 1.9840), (1e9, 1.9600)],
)
def test_t_quantile_matches_the_table(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def test_t_quantile_inverts_the_cdf_for_fractional_df():
    for df in (1.3, 2.7, 7.5, 41.2):
        for p in (0.6, 0.9, 0.975, 0.999):
            assert stats.t_cdf(stats.t_quantile(p, df), df) == pytest.approx(p, abs=1e-10)
    # between neighbouring integer df
    assert stats.t_quantile(0.975, 3) > stats.t_quantile(0.975, 3.5) > stats.t_quantile(0.975, 4)


def test_stats_imports_nothing_of_the_project_and_no_heavy_library():
    code = "import sys, rpg_cli.stats; print(sorted(m for m in sys.modules if m.startswith(('rpg_cli', 'torch', 'scipy', 'pandas'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['rpg_cli', 'rpg_cli.stats']"
