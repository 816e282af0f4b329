"""Uncertainty and comparisons of benchmark scores (MATH.md section 8; docs/STATISTICS.md derives
every formula and gives the measured coverage). NumPy, and SciPy's t distribution imported on first
use; imports nothing of the project.

What a report calls
-------------------
The input is `Runs`: one method's per-problem scores at one step, for each benchmark an array
(seeds, problems) of per-problem mean@k (the k samples of a problem already averaged), rows in the
order of `Runs.seeds`, columns in the order of `Runs.problems` (problem ids, optional but checked when
given: comparisons align B to A by id).

- A table cell: `score(runs, "aime24")` -> `Interval` (a whole row: `scores(runs)`, one per benchmark
  and OVERALL). `.pm()` prints `52.1 ±3.4`, `.ci()` prints `[48.7, 55.5]`, `.as_dict()` carries both
  bounds for CSV/JSON; `.covers` says in words what the interval is about, `.caution` when its
  coverage is known to fall short (few seeds whose spread dominates).
- The overall cell: `score(runs)` (benchmark `OVERALL`): the mean of the benchmark scores.
- A compare line: `compare(a, b, benchmark)` -> `Comparison` (B - A with its interval, P(B > A) with its
  interval, the smallest difference this design detects at 80% power, with `effect=` the seeds per
  method that detect that effect, the verdict); `.text("GRPO", "DAPO")` is the line.
- A curve band: `curve_band([(steps, values) for each seed])` -> `Band`; its centre alone: `curve_mean`.
- P(B > A) is resampled; `rng_seed` (default 0) fixes its draws. Every other interval is closed-form.

What an interval is about (the estimand), chosen by `fixed_problems`
--------------------------------------------------------------------
False (the default): the expected score over new training seeds *and new problems from the same
population* ("new seeds and new problems"): a 30-problem benchmark keeps it near ±11 points however
many seeds are run. True: the expected score over new seeds on *these* problems, with their samples
("new seeds, these problems"), what most papers mean; one run per method then gives no interval.

How the intervals are made
--------------------------
Seeds and problems are crossed (every run answers the same problems): y_sp = mu + a_s + b_p + e_sp.
A mean (a score, the overall score, a difference) has the two-way ANOVA variance
s_a^2/S + s_b^2/P + s_e^2/(SP), estimated by the method of moments from the row, column and residual
mean squares (negative components set to zero), and the interval is estimate ± t_nu sqrt(V), nu the
Satterthwaite degrees of freedom. When the seed part is more than half of V, nu is at most the seed
part's own df (S - 1 for a score): Satterthwaite's df is noisy exactly there, and too many df made the
verdicts at 2-3 seeds too eager. With fixed problems V is the seed part alone (the variance of the
per-run means over S), with S - 1 df (Welch's df for two methods).

Comparisons pair problems (both methods answer the same ones) but not seeds: two runs with the same
seed number do not share their rollouts. `pair_seeds=True` pairs them by label for runs that share
their randomness, and says so. Measured (tests/test_stats.py): under no true difference, 'B better'
or 'A better' in at most 5% of datasets from 2 seeds on, plus Monte Carlo error. Caveat: with fewer
than 5 seeds and a seed spread larger than the problem spread (each run's score spread by ~10 points on
a 30-problem benchmark), a score's interval covers about 87% at 2 seeds and 92% at 3 (95% from about 5);
`Interval.caution` says so where it happens, and the table and compare footers print it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

OVERALL = "overall"
CONFIDENCE = 0.95
N_RESAMPLES = 10_000
RNG_SEED = 0
POWER = 0.8
ALPHA = 0.05
FEW_SEEDS = 5  # below this, an interval whose seed part dominates is flagged (Interval.caution)

B_BETTER, A_BETTER, NO_DIFFERENCE = "B better", "A better", "no detectable difference"
VERDICTS = (B_BETTER, A_BETTER, NO_DIFFERENCE)

BAND_MEANING = (
    "mean over seeds; band: 95% confidence interval of that mean (t over seeds, per step, within the metric's range)"
)

# covers: what an interval is about, in words (footers, compare lines, exports)
SEEDS_AND_PROBLEMS = "new seeds and new problems"
THESE_PROBLEMS = "new seeds, these problems"
PROBLEMS_ONLY = "new problems, this run (one seed)"
SEEDS_ONLY = "new seeds (one problem)"
MEANS_ONLY = "new seeds, these problems (benchmark means: problem sampling not included)"
SOME_SEEDS = "new problems; new seeds only of the method with several runs (the other has one)"
ONE_SEED = "nothing (one run: new seeds unknown, and --fixed-problems leaves no other source)"
NOTHING = "nothing (one seed, one problem: no interval)"
NO_INTERVAL = (ONE_SEED, NOTHING)

CAUTION = (
    f"fewer than {FEW_SEEDS} seeds and the seed-to-seed spread is most of the uncertainty: such intervals "
    "cover less than 95% (in simulation a score's about 87% at 2 seeds and 92% at 3, P(B > A)'s 84-88%); "
    "run more seeds"
)

# P(B > A)'s resampling: resamples drawn per block (small arrays the allocator reuses), and cached draws
_BLOCK = 256
_CACHE_ELEMENTS = 1 << 19  # cached resampling weights: at most 32 arrays of 4 MB


class StatsError(ValueError):
    """Bad input to a statistic; the message is one line naming the problem and the fix."""


# ------------------------------------------------------------------------------------------ inputs


@dataclass(frozen=True, eq=False)
class Runs:
    """One method's per-problem scores at one step: benchmark -> array (seeds, problems) of mean@k in
    [0, 1]. `seeds` labels the rows (default 0..S-1); `problems` (optional) labels each benchmark's
    columns. Every benchmark has a row for every seed (the same runs)."""

    scores: Mapping[str, np.ndarray]
    seeds: tuple[int, ...] = ()
    problems: Mapping[str, tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        if not self.scores:
            raise StatsError("no scores: give at least one benchmark with one run and one problem")
        arrays: dict[str, np.ndarray] = {}
        for bench, values in self.scores.items():
            if bench == OVERALL:
                raise StatsError(f"benchmark name {OVERALL!r} is reserved for the mean over benchmarks; rename it")
            a = np.asarray(values, dtype=float)
            if a.ndim != 2 or a.size == 0:
                raise StatsError(f"{bench}: scores must be a non-empty (seeds, problems) array, got shape {a.shape}")
            if not np.all((a >= 0) & (a <= 1)):  # also rejects NaN
                raise StatsError(
                    f"{bench}: scores must be per-problem accuracies in [0, 1] (found {a[~((a >= 0) & (a <= 1))][0]})"
                )
            arrays[bench] = a
        n_rows = {bench: a.shape[0] for bench, a in arrays.items()}
        if len(set(n_rows.values())) > 1:
            raise StatsError(
                f"every benchmark needs a row per run (seed), got {n_rows}; drop runs not scored on every benchmark"
            )
        n_seeds = next(iter(n_rows.values()))
        seeds = tuple(int(s) for s in self.seeds) or tuple(range(n_seeds))
        if len(seeds) != n_seeds or len(set(seeds)) != n_seeds:
            raise StatsError(f"seeds {seeds} must label the {n_seeds} rows once each")
        problems = None
        if self.problems is not None:
            problems = {bench: tuple(str(p) for p in ids) for bench, ids in self.problems.items()}
            if set(problems) != set(arrays):
                raise StatsError(
                    f"problems must name the columns of every benchmark ({sorted(arrays)}), got {sorted(problems)}"
                )
            for bench, ids in problems.items():
                if len(ids) != arrays[bench].shape[1] or len(set(ids)) != len(ids):
                    raise StatsError(
                        f"{bench}: {len(ids)} problem ids for {arrays[bench].shape[1]} columns (each id once)"
                    )
        object.__setattr__(self, "scores", arrays)
        object.__setattr__(self, "seeds", seeds)
        object.__setattr__(self, "problems", problems)

    @property
    def n_seeds(self) -> int:
        return len(self.seeds)

    def benchmarks(self, benchmark: str) -> list[str]:
        """The benchmarks a statistic covers: one, or all of them for OVERALL."""
        if benchmark == OVERALL:
            return list(self.scores)
        if benchmark not in self.scores:
            raise StatsError(f"no scores for benchmark {benchmark!r}; known: {', '.join(self.scores)} or {OVERALL}")
        return [benchmark]


# ----------------------------------------------------------------------------------------- results


def _fmt(x: float, scale: float, digits: int, signed: bool = False) -> str:
    return f"{x * scale:{'+' if signed else ''}.{digits}f}"


@dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval; low/high None when there is none."""

    estimate: float
    low: float | None
    high: float | None
    n_seeds: int  # runs behind the estimate (per method; the smaller group in a comparison)
    n_problems: int | None  # problems over the benchmarks covered; None: not known (benchmark means)
    covers: str  # what the interval is about, in words (SEEDS_AND_PROBLEMS, THESE_PROBLEMS, ...)
    confidence: float = CONFIDENCE
    caution: str = ""  # CAUTION where its coverage is known to fall short, else ""

    @property
    def half_width(self) -> float | None:
        return None if self.low is None or self.high is None else (self.high - self.low) / 2

    def excludes(self, value: float = 0.0) -> bool:
        return self.low is not None and self.high is not None and not (self.low <= value <= self.high)

    def pm(self, scale: float = 100.0, digits: int = 1, signed: bool = False) -> str:
        """'52.1 ±3.4' (± the half-width; the bounds, cut to the range a score can take, are in ci())."""
        text = _fmt(self.estimate, scale, digits, signed)
        hw = self.half_width
        return text if hw is None else f"{text} ±{_fmt(hw, scale, digits)}"

    def ci(self, scale: float = 100.0, digits: int = 1) -> str:
        """'[48.7, 55.5]', or '' without an interval."""
        if self.low is None or self.high is None:
            return ""
        return f"[{_fmt(self.low, scale, digits)}, {_fmt(self.high, scale, digits)}]"

    def as_dict(self) -> dict[str, Any]:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "n_seeds": self.n_seeds,
            "n_problems": self.n_problems,
            "covers": self.covers,
            "confidence": self.confidence,
            "caution": self.caution,
        }


@dataclass(frozen=True)
class SeedsNeeded:
    """Seeds per method that detect a named effect at `power`; n None with a reason."""

    n: int | None
    reason: str = ""

    def text(self) -> str:
        return str(self.n) if self.n is not None else f"- ({self.reason})"


@dataclass(frozen=True)
class Detectable:
    """The smallest |B - A| this design (its seeds, problems and variance) detects at `power`; None
    with a reason when its variance cannot be estimated."""

    difference: float | None
    reason: str = ""

    def text(self, scale: float = 100.0, digits: int = 1) -> str:
        return _fmt(self.difference, scale, digits) if self.difference is not None else f"- ({self.reason})"


@dataclass(frozen=True)
class Comparison:
    benchmark: str
    difference: Interval  # B - A, paired by problem (and by seed with pair_seeds)
    p_improvement: Interval  # P(B > A)
    detectable: Detectable  # the smallest difference detected at POWER with these seeds and problems
    verdict: str  # one of VERDICTS
    seeds_paired: bool
    effect: float | None = None  # the effect the user named (a fraction: 0.05 is 5 points)
    seeds_for_effect: SeedsNeeded | None = None  # seeds per method that detect `effect` at POWER

    def text(self, a: str = "A", b: str = "B", scale: float = 100.0, digits: int = 1) -> str:
        """One compare line, e.g. 'aime24: DAPO - GRPO = +3.1 [-0.4, 6.6]; P(DAPO > GRPO) = 0.62 [0.48,
        0.75]; detectable at 80% power: 7.5; no detectable difference (95% intervals over new seeds and
        new problems, seeds unpaired)'."""
        d, p = self.difference, self.p_improvement
        verdict = {B_BETTER: f"{b} better", A_BETTER: f"{a} better"}.get(self.verdict, self.verdict)
        diff = f"{_fmt(d.estimate, scale, digits, signed=True)} {d.ci(scale, digits)}".rstrip()
        prob = f"{p.estimate:.2f}" + (
            f" [{p.low:.2f}, {p.high:.2f}]" if p.low is not None and p.high is not None else ""
        )
        parts = [
            f"{self.benchmark}: {b} - {a} = {diff}",
            f"P({b} > {a}) = {prob}",
            f"detectable at {POWER:.0%} power: {self.detectable.text(scale, digits)}",
        ]
        if self.effect is not None and self.seeds_for_effect is not None:
            parts.append(f"seeds per method for {_fmt(self.effect, scale, digits)}: {self.seeds_for_effect.text()}")
        pairing = "seeds paired by label" if self.seeds_paired else "seeds unpaired"
        about = f"{d.confidence:.0%} intervals over {d.covers}" if d.low is not None else f"no interval: {d.covers}"
        return "; ".join(parts) + f"; {verdict} ({about}, {pairing})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "difference": self.difference.as_dict(),
            "p_improvement": self.p_improvement.as_dict(),
            "detectable_difference": self.detectable.difference,
            "detectable_difference_reason": self.detectable.reason,
            "power": POWER,
            "effect": self.effect,
            "seeds_for_effect": None if self.seeds_for_effect is None else self.seeds_for_effect.n,
            "seeds_for_effect_reason": None if self.seeds_for_effect is None else self.seeds_for_effect.reason,
            "verdict": self.verdict,
            "seeds_paired": self.seeds_paired,
        }


@dataclass(frozen=True, eq=False)
class Band:
    """Per step: mean over the seeds that logged it, and its 95% band (NaN where < 2 seeds)."""

    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n_seeds: np.ndarray
    meaning: str = BAND_MEANING

    def records(self) -> list[dict[str, Any]]:
        """JSON/CSV rows; a missing band bound is None."""

        def num(x: float) -> float | None:
            return None if math.isnan(x) else float(x)

        return [
            {"step": s.item(), "mean": float(m), "low": num(lo), "high": num(hi), "n_seeds": int(n)}
            for s, m, lo, hi, n in zip(self.steps, self.mean, self.low, self.high, self.n_seeds)
        ]


# ------------------------------------------------------------------------------ Student's t quantile


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t for p in (0, 1), df > 0 (fractional df, as Satterthwaite gives): SciPy's
    (`scipy.special.stdtrit`, what `scipy.stats.t.ppf` computes, without importing scipy.stats: 0.7 s of
    every report's start), imported on first use so that `rpg --help` stays fast."""
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


# ------------------------------------------------------------------- the variance of a linear mean


@dataclass(frozen=True, eq=False)
class _Term:
    """sign * (mean over benchmarks, weighted) of the (seeds, problems) blocks. Terms with the same
    `seeds` key are the same runs; the same `problems` key, the same problems (paired)."""

    sign: float
    seeds: str
    problems: str
    blocks: Mapping[str, np.ndarray]


@dataclass(frozen=True)
class _Variance:
    population: float  # method-of-moments variance over new seeds and new problems, components >= 0
    population_df: float  # its Satterthwaite df (at most the seed part's own when that part dominates)
    fixed: float  # over new seeds on these problems: the seed part alone (variance of per-run means / S)
    fixed_df: float  # Welch's df of it
    seed_parts: tuple[tuple[float, int], ...]  # per seed key: (its part of `population` times its S, S)
    problems: float  # the part that more seeds do not reduce
    problems_df: float  # its Satterthwaite df
    seeds_estimable: bool  # every seed key has >= 2 seeds
    seed_dominated: bool  # the seed part is more than half of `population`
    min_seeds: int


def _estimate(terms: Sequence[_Term], weights: Mapping[str, float]) -> float:
    return float(sum(t.sign * weights[b] * y.mean() for t in terms for b, y in t.blocks.items()))


def _satterthwaite(parts: Sequence[tuple[float, float]]) -> float:
    """df of a sum of independent variance estimates (value, df); inf when the sum is 0."""
    total = sum(v for v, _ in parts)
    denominator = sum(v * v / df for v, df in parts if v > 0)
    return total * total / denominator if denominator > 0 else math.inf


def _decompose(terms: Sequence[_Term], weights: Mapping[str, float]) -> _Variance:
    """Two-way (seed x problem) ANOVA of the linear statistic, per seed key, problem key and benchmark.

    With r the seed effects, c the problem effects and e the residuals (each weighted and signed), the
    unbiased estimates are V_seed = sum r^2/(S(S-1)) ~ s_a^2/S + s_e^2/(SP), V_prob = sum c^2/(P(P-1)) ~
    s_b^2/P + s_e^2/(SP) and V_int = sum e^2/((S-1)(P-1)SP) ~ s_e^2/(SP), so the population variance is
    sum V_seed + sum V_prob - sum V_int, and the fixed-problems one sum V_seed.
    """
    rows: dict[str, np.ndarray] = {}
    cols: dict[tuple[str, str], np.ndarray] = {}
    cells: dict[tuple[str, str, str], np.ndarray] = {}
    for t in terms:
        for bench, y in t.blocks.items():
            w = t.sign * weights[bench]
            grand = y.mean()
            r, c = y.mean(axis=1) - grand, y.mean(axis=0) - grand
            rows[t.seeds] = rows.get(t.seeds, 0.0) + w * r
            cols[(t.problems, bench)] = cols.get((t.problems, bench), 0.0) + w * c
            key = (t.seeds, t.problems, bench)
            cells[key] = cells.get(key, 0.0) + w * (y - grand - r[:, None] - c[None, :])
    v_seed = {k: (float(r @ r) / (len(r) * (len(r) - 1)), len(r) - 1) for k, r in rows.items() if len(r) > 1}
    v_prob = {k: (float(c @ c) / (len(c) * (len(c) - 1)), len(c) - 1) for k, c in cols.items() if len(c) > 1}
    v_int = {
        k: (float((e * e).sum()) / ((e.shape[0] - 1) * (e.shape[1] - 1) * e.size), (e.shape[0] - 1) * (e.shape[1] - 1))
        for k, e in cells.items()
        if min(e.shape) > 1
    }
    int_by_seed: dict[str, float] = {}
    int_by_prob: dict[tuple[str, str], float] = {}
    for (seed_key, prob_key, bench), (v, _) in v_int.items():
        int_by_seed[seed_key] = int_by_seed.get(seed_key, 0.0) + v
        int_by_prob[(prob_key, bench)] = int_by_prob.get((prob_key, bench), 0.0) + v
    # negative variance components are set to zero: each factor contributes at least its interaction
    seed_part = {k: (max(v, int_by_seed.get(k, 0.0)), df) for k, (v, df) in v_seed.items()}
    prob_parts = [(max(v - int_by_prob.get(k, 0.0), 0.0), df) for k, (v, df) in v_prob.items()]
    seeds_total = sum(v for v, _ in seed_part.values())
    prob_total = sum(v for v, _ in prob_parts)
    population = seeds_total + prob_total
    mean_squares = [*v_seed.values(), *v_prob.values(), *v_int.values()]  # the residual's enters with a minus
    denominator = sum(v * v / df for v, df in mean_squares if v > 0)
    df = population * population / denominator if denominator > 0 else math.inf
    if seeds_total > population / 2:  # Satterthwaite's df is unreliable here: at most the seed part's own
        df = min(df, _satterthwaite(list(seed_part.values())))
    # the caution: the seed component proper (without the interaction each seed mean square carries) dominates
    seed_component = sum(max(v - int_by_seed.get(k, 0.0), 0.0) for k, (v, _) in v_seed.items())
    seed_dominated = population > 0 and seed_component > population / 2
    fixed = sum(v for v, _ in v_seed.values())
    return _Variance(
        population=population,
        population_df=max(df, 1.0),
        fixed=fixed,
        fixed_df=max(_satterthwaite(list(v_seed.values())), 1.0),
        seed_parts=tuple((len(rows[k]) * v, len(rows[k])) for k, (v, _) in seed_part.items()),
        problems=prob_total,
        problems_df=_satterthwaite(prob_parts),
        seeds_estimable=all(len(r) > 1 for r in rows.values()),
        seed_dominated=seed_dominated,
        min_seeds=min(len(r) for r in rows.values()),
    )


def _covers(terms: Sequence[_Term], n_problems: int, fixed_problems: bool) -> str:
    """What the interval of these terms is about, in words; one of NO_INTERVAL when there is none."""
    n_seeds = [next(iter(t.blocks.values())).shape[0] for t in terms]
    several = [n > 1 for n in n_seeds]
    if fixed_problems:
        return THESE_PROBLEMS if all(several) else ONE_SEED
    if all(several):
        return SEEDS_AND_PROBLEMS if n_problems > 1 else SEEDS_ONLY
    if n_problems == 1:
        return NOTHING
    return SOME_SEEDS if any(several) else PROBLEMS_ONLY


def _interval(
    terms: Sequence[_Term],
    weights: Mapping[str, float],
    confidence: float,
    bounds: tuple[float, float],
    n_seeds: int,
    n_problems: int,
    fixed_problems: bool,
    covers: str | None = None,
) -> Interval:
    """estimate ± t_nu sqrt(V), V over new seeds and new problems (or new seeds on these problems),
    cut to the range the statistic can take."""
    estimate = _estimate(terms, weights)
    largest = max(y.shape[1] for t in terms for y in t.blocks.values())
    covers = covers or _covers(terms, largest, fixed_problems)
    if covers in NO_INTERVAL:
        return Interval(estimate, None, None, n_seeds, n_problems, covers, confidence)
    var = _decompose(terms, weights)
    v, df = (var.fixed, var.fixed_df) if fixed_problems else (var.population, var.population_df)
    half = t_quantile((1 + confidence) / 2, df) * math.sqrt(v) if v > 0 else 0.0
    caution = CAUTION if not fixed_problems and var.seed_dominated and var.min_seeds < FEW_SEEDS else ""
    low, high = max(estimate - half, bounds[0]), min(estimate + half, bounds[1])
    return Interval(estimate, low, high, n_seeds, n_problems, covers, confidence, caution)


def _weights(benchmarks: Sequence[str]) -> dict[str, float]:
    return {b: 1.0 / len(benchmarks) for b in benchmarks}


# ----------------------------------------------------------------------------------- the statistics


def score(
    runs: Runs, benchmark: str = OVERALL, *, fixed_problems: bool = False, confidence: float = CONFIDENCE
) -> Interval:
    """A method's score on a benchmark (the mean over seeds and problems of per-problem mean@k) and its
    interval (module docstring): over new seeds and new problems, or with `fixed_problems` over new
    seeds on these problems. With one seed and new problems it covers that run's score over problems.

    OVERALL is the mean of the benchmark scores (each benchmark weighs the same, whatever its size, as
    the paper's per-benchmark columns do); a seed is one run, scored on every benchmark.
    """
    benches = runs.benchmarks(benchmark)
    term = _Term(1.0, "runs", "all", {b: runs.scores[b] for b in benches})
    n_problems = sum(runs.scores[b].shape[1] for b in benches)
    return _interval([term], _weights(benches), confidence, (0.0, 1.0), runs.n_seeds, n_problems, fixed_problems)


def scores(runs: Runs, *, fixed_problems: bool = False, confidence: float = CONFIDENCE) -> dict[str, Interval]:
    """`score` for every benchmark and OVERALL (a table row)."""
    return {
        bench: score(runs, bench, fixed_problems=fixed_problems, confidence=confidence)
        for bench in [*runs.scores, OVERALL]
    }


def score_from_means(
    means: Sequence[float], *, fixed_problems: bool = False, confidence: float = CONFIDENCE
) -> Interval:
    """A benchmark score known only as one mean per run (verl's validation logs): the mean over seeds
    and the t interval over seeds, which is about new seeds on these problems (problem sampling cannot
    be included; the `covers` text says so unless `fixed_problems` asked for exactly that). One run:
    no interval."""
    runs = Runs({"means": np.asarray(means, dtype=float).reshape(-1, 1)})
    term = _Term(1.0, "runs", "all", runs.scores)
    covers = (THESE_PROBLEMS if fixed_problems else MEANS_ONLY) if runs.n_seeds > 1 else NOTHING
    return _interval([term], {"means": 1.0}, confidence, (0.0, 1.0), runs.n_seeds, None, True, covers)


def _aligned(a: Runs, b: Runs, benchmark: str, pair_seeds: bool) -> tuple[list[str], dict, dict]:
    """A's and B's blocks on the same problems in the same order; with pair_seeds, B's rows in A's seed
    order (StatsError when their seeds differ)."""
    if benchmark == OVERALL and set(a.scores) != set(b.scores):
        only_a, only_b = sorted(set(a.scores) - set(b.scores)), sorted(set(b.scores) - set(a.scores))
        raise StatsError(
            f"{OVERALL} needs the same benchmarks in A and B (only in A: {only_a}, only in B: {only_b}); compare one benchmark"
        )
    benches = a.benchmarks(benchmark)
    b.benchmarks(benchmark)
    if pair_seeds and sorted(a.seeds) != sorted(b.seeds):
        raise StatsError(
            f"pairing seeds needs the same seeds in A ({', '.join(map(str, sorted(a.seeds)))}) and B "
            f"({', '.join(map(str, sorted(b.seeds)))}); leave seeds unpaired"
        )
    rows = [b.seeds.index(s) for s in a.seeds] if pair_seeds else list(range(b.n_seeds))
    a_blocks, b_blocks = {}, {}
    for bench in benches:
        ya, yb = a.scores[bench], b.scores[bench][rows]
        if a.problems is not None and b.problems is not None:
            ids_a, ids_b = a.problems[bench], b.problems[bench]
            if set(ids_a) != set(ids_b):
                raise StatsError(
                    f"{bench}: A and B were scored on different problems ({len(set(ids_a) - set(ids_b))} only in A, "
                    f"{len(set(ids_b) - set(ids_a))} only in B); evaluate both on the same problem set"
                )
            position = {p: i for i, p in enumerate(ids_b)}
            yb = yb[:, [position[p] for p in ids_a]]
        elif ya.shape[1] != yb.shape[1]:
            raise StatsError(
                f"{bench}: A has {ya.shape[1]} problems, B has {yb.shape[1]}; compare on the same problem set"
            )
        a_blocks[bench], b_blocks[bench] = ya, yb
    return benches, a_blocks, b_blocks


def _difference_terms(
    a_blocks: Mapping[str, np.ndarray], b_blocks: Mapping[str, np.ndarray], pair_seeds: bool, pair_problems: bool
) -> list[_Term]:
    if pair_seeds and pair_problems:
        return [_Term(1.0, "pairs", "all", {k: b_blocks[k] - a_blocks[k] for k in a_blocks})]
    return [
        _Term(1.0, "B", "all" if pair_problems else "B", b_blocks),
        _Term(-1.0, "A", "all" if pair_problems else "A", a_blocks),
    ]


def difference(
    a: Runs,
    b: Runs,
    benchmark: str = OVERALL,
    *,
    pair_seeds: bool = False,
    pair_problems: bool = True,
    fixed_problems: bool = False,
    confidence: float = CONFIDENCE,
) -> Interval:
    """B - A and its interval (MATH.md section 8): per-problem differences on the same problems (paired
    by problem); seeds unpaired (each method's runs are their own sample), or paired by label with
    `pair_seeds` (for runs that share their randomness). The interval excludes 0 iff the difference is
    detectable.

    pair_problems=False is the two-sample interval (problems treated as independent draws for A and B):
    what comparing two separately computed intervals amounts to; it is here to show what pairing buys.
    """
    benches, a_blocks, b_blocks = _aligned(a, b, benchmark, pair_seeds)
    terms = _difference_terms(a_blocks, b_blocks, pair_seeds, pair_problems)
    n_seeds, n_problems = min(a.n_seeds, b.n_seeds), sum(a_blocks[k].shape[1] for k in benches)
    return _interval(terms, _weights(benches), confidence, (-1.0, 1.0), n_seeds, n_problems, fixed_problems)


# ----------------------------------------------------------------------------- P(B > A), resampled


def _counts(rng: np.random.Generator, n_resamples: int, n: int) -> np.ndarray:
    """(n_resamples, n) weights: how often each of n units is drawn in n draws with replacement, / n."""
    if n == 1:
        return np.ones((n_resamples, 1))
    idx = rng.integers(0, n, size=(n_resamples, n))
    idx += n * np.arange(n_resamples)[:, None]
    return np.bincount(idx.ravel(), minlength=n_resamples * n).reshape(n_resamples, n) / n


def _blocks(n_resamples: int) -> list[tuple[int, int]]:
    return [(start, min(start + _BLOCK, n_resamples)) for start in range(0, n_resamples, _BLOCK)]


@functools.lru_cache(maxsize=32)
def _cached_weights(rng_seed: int, key: str, n_resamples: int, n: int) -> np.ndarray:
    rng = np.random.default_rng([rng_seed, zlib.crc32(key.encode())])
    out = np.concatenate([_counts(rng, stop - start, n) for start, stop in _blocks(n_resamples)])
    out.flags.writeable = False
    return out


def _resample_weights(rng_seed: int, key: str, n_resamples: int, n: int) -> np.ndarray:
    """(n_resamples, n) bootstrap weights of one resampled factor (a method's runs, a benchmark's
    problems), a function of its key: every comparison of a benchmark resamples its problems the same
    way, so small ones are cached."""
    if n_resamples * n <= _CACHE_ELEMENTS:
        return _cached_weights(rng_seed, key, n_resamples, n)
    return _cached_weights.__wrapped__(rng_seed, key, n_resamples, n)


def _check_resamples(n_resamples: int) -> None:
    if n_resamples < 100:
        raise StatsError(f"n_resamples={n_resamples} is too few for a {CONFIDENCE:.0%} interval; use >= 1000")


def _wins(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(S_B, S_A, P): 1 where run i of B beats run j of A on problem p, 1/2 on a tie, else 0."""
    return 0.5 + 0.5 * np.sign(b[:, None, :] - a[None, :, :])


def p_improvement(
    a: Runs,
    b: Runs,
    benchmark: str = OVERALL,
    *,
    fixed_problems: bool = False,
    n_resamples: int = N_RESAMPLES,
    rng_seed: int = RNG_SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """P(B > A), rliable's probability of improvement (Agarwal et al. 2021; MATH.md section 8) with
    problems as its tasks: the probability that a random run of B scores higher than a random run of A
    (ties count 1/2) on a random problem, averaged over all (B run, A run) pairs and the problems of a
    benchmark; OVERALL averages the benchmarks. It is not a mean, so its interval is the percentile
    bootstrap: runs of A and of B resampled independently (the estimand pairs every run with every
    run), one problem draw per benchmark shared by both (none with `fixed_problems`). It covers about
    95% from 5 seeds per method, 84-88% at 2-3 when the seed spread dominates (docs/STATISTICS.md).
    """
    benches, a_blocks, b_blocks = _aligned(a, b, benchmark, False)
    weights = _weights(benches)
    wins = {k: _wins(a_blocks[k], b_blocks[k]) for k in benches}
    estimate = float(sum(weights[k] * wins[k].mean() for k in benches))
    n_problems = sum(a_blocks[k].shape[1] for k in benches)
    terms = _difference_terms(a_blocks, b_blocks, False, True)
    covers = _covers(terms, max(a_blocks[k].shape[1] for k in benches), fixed_problems)
    n_seeds = min(a.n_seeds, b.n_seeds)
    if covers in NO_INTERVAL:
        return Interval(estimate, None, None, n_seeds, n_problems, covers, confidence)
    _check_resamples(n_resamples)
    w_a = _resample_weights(rng_seed, "seeds/A", n_resamples, a.n_seeds)
    w_b = _resample_weights(rng_seed, "seeds/B", n_resamples, b.n_seeds)
    reps = np.zeros(n_resamples)
    for k in benches:
        s_b, s_a, n_p = wins[k].shape
        flat_wins = wins[k].reshape(s_b * s_a, n_p).T
        if fixed_problems:
            per_pair_all = flat_wins.mean(axis=0).reshape(s_b, s_a)
            reps += weights[k] * np.einsum("nb,ba,na->n", w_b, per_pair_all, w_a)
            continue
        v = _resample_weights(rng_seed, f"problems/all/{k}", n_resamples, n_p)
        for start, stop in _blocks(n_resamples):
            # per resample: the problem-weighted win rate of every (B run, A run) pair, then the run-weighted mean
            per_pair = (v[start:stop] @ flat_wins).reshape(stop - start, s_b, s_a)
            reps[start:stop] += weights[k] * np.einsum("nb,nba,na->n", w_b[start:stop], per_pair, w_a[start:stop])
    low, high = np.quantile(reps, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Interval(estimate, float(low), float(high), n_seeds, n_problems, covers, confidence)


# ----------------------------------------------------------------------------------------- power


def _power_quantiles(df: float, power: float, alpha: float) -> float:
    return t_quantile(1 - alpha / 2, df) + t_quantile(power, df)


def _difference_variance(a: Runs, b: Runs, benchmark: str, pair_seeds: bool) -> tuple[float, _Variance]:
    benches, a_blocks, b_blocks = _aligned(a, b, benchmark, pair_seeds)
    terms = _difference_terms(a_blocks, b_blocks, pair_seeds, True)
    weights = _weights(benches)
    return _estimate(terms, weights), _decompose(terms, weights)


def detectable_difference(
    a: Runs,
    b: Runs,
    benchmark: str = OVERALL,
    *,
    pair_seeds: bool = False,
    fixed_problems: bool = False,
    power: float = POWER,
    alpha: float = ALPHA,
) -> Detectable:
    """The smallest true |B - A| that this design (these seeds and problems, the variance components
    estimated from them) detects with probability `power` by the two-sided level-`alpha` test the
    verdict makes: (t_{nu, 1-alpha/2} + t_{nu, power}) * sqrt(V), V and nu as in the interval. It does
    not use the observed difference (post-hoc power would), so it says what the experiment can see,
    not whether this difference is real."""
    _, var = _difference_variance(a, b, benchmark, pair_seeds)
    if not var.seeds_estimable:
        return Detectable(None, "needs 2+ seeds of each method to estimate the seed variance")
    v, df = (var.fixed, var.fixed_df) if fixed_problems else (var.population, var.population_df)
    return Detectable(_power_quantiles(df, power, alpha) * math.sqrt(v))


def seeds_needed(
    a: Runs,
    b: Runs,
    benchmark: str = OVERALL,
    *,
    effect: float,
    pair_seeds: bool = False,
    fixed_problems: bool = False,
    power: float = POWER,
    alpha: float = ALPHA,
) -> SeedsNeeded:
    """Seeds per method that detect a true |B - A| of `effect` (a fraction: 0.05 is 5 points, named by
    the user, not the observed difference) with probability `power`, on these problems, with the
    variance components estimated from these runs.

    With n seeds per method the difference has variance V(n) = (sum of the seed parts' per-seed
    variances)/n + the problem part (0 with fixed problems); the answer is the smallest n >= 2 with

        effect >= (t_{nu(n), 1-alpha/2} + t_{nu(n), power}) * sqrt(V(n)),

    nu(n) the Satterthwaite df (n - 1 per seed part). None when no number of seeds suffices: the
    problem part alone, which more seeds do not reduce, is too large for the effect (more problems
    would help), or when a method has one seed (its seed variance is unknown).
    """
    if not 0 < effect <= 1:
        raise StatsError(f"effect {effect * 100:g} points: give a positive difference of at most 100 points")
    _, var = _difference_variance(a, b, benchmark, pair_seeds)
    if not var.seeds_estimable:
        return SeedsNeeded(None, "needs 2+ seeds of each method to estimate the seed variance")
    problems = 0.0 if fixed_problems else var.problems
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    too_small = SeedsNeeded(
        None,
        "no number of seeds suffices: the problem-sampling part alone exceeds this effect; more problems would",
    )
    budget = (effect / z) ** 2 - problems
    if budget <= 0:
        return too_small
    per_seed = sum(part for part, _ in var.seed_parts)

    def detected(n: int) -> bool:
        parts = [(part / n, n - 1) for part, _ in var.seed_parts]
        if problems > 0:
            parts.append((problems, var.problems_df))
        v = sum(p for p, _ in parts)
        return v == 0.0 or effect >= _power_quantiles(_satterthwaite(parts), power, alpha) * math.sqrt(v)

    low = max(2, math.ceil(per_seed / budget))  # t quantiles exceed z ones: never fewer than this
    high = low
    while not detected(high):  # a doubling search, then bisection: `detected` is monotone in n
        if high > 1_000_000:
            return too_small
        low, high = high + 1, 2 * high
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if detected(mid) else (mid + 1, high)
    return SeedsNeeded(high)


def verdict(diff: Interval) -> str:
    """'B better' / 'A better' when the interval of B - A excludes 0 (MATH.md section 8), else 'no
    detectable difference'."""
    if not diff.excludes(0.0):
        return NO_DIFFERENCE
    return B_BETTER if diff.estimate > 0 else A_BETTER


def compare(
    a: Runs,
    b: Runs,
    benchmark: str = OVERALL,
    *,
    pair_seeds: bool = False,
    fixed_problems: bool = False,
    effect: float | None = None,
    n_resamples: int = N_RESAMPLES,
    rng_seed: int = RNG_SEED,
    confidence: float = CONFIDENCE,
) -> Comparison:
    """Everything `rpg compare` prints for one benchmark (or OVERALL): B - A with its interval, P(B > A)
    with its interval, the smallest difference detectable at 80% power, the seeds per method that
    detect `effect` (when given), and the verdict (MATH.md section 8)."""
    how = {"pair_seeds": pair_seeds, "fixed_problems": fixed_problems}
    diff = difference(a, b, benchmark, confidence=confidence, **how)
    prob = p_improvement(
        a,
        b,
        benchmark,
        fixed_problems=fixed_problems,
        n_resamples=n_resamples,
        rng_seed=rng_seed,
        confidence=confidence,
    )
    prob = dataclasses.replace(prob, caution=diff.caution)  # P(B > A) falls short where B - A does
    needed = None if effect is None else seeds_needed(a, b, benchmark, effect=effect, **how)
    return Comparison(
        benchmark,
        diff,
        prob,
        detectable_difference(a, b, benchmark, **how),
        verdict(diff),
        pair_seeds,
        effect,
        needed,
    )


def curve_band(
    curves: Sequence[tuple[Sequence[float], Sequence[float]]],
    confidence: float = CONFIDENCE,
    bounds: tuple[float | None, float | None] = (None, None),
) -> Band:
    """Training-curve band (MATH.md section 8, the seed level): `curves` holds one (steps, values) per
    seed; per step, the mean over the seeds that logged it and mean +- t_{n-1} * sd / sqrt(n), a
    pointwise confidence interval of the method's mean curve over training seeds (not a range of single
    runs). Steps with one seed get no band (NaN bounds). `bounds`: the range the metric cannot leave
    (entropy >= 0, an accuracy in [0, 1]); the interval is cut to it, which keeps its coverage (the true
    mean lies inside) and drops only impossible values, such as a negative entropy from 3 seeds' t."""
    if not curves:
        raise StatsError("no curves: give one (steps, values) pair per seed")
    for i, (steps, values) in enumerate(curves):
        if len(steps) != len(values):
            raise StatsError(f"curve {i}: {len(steps)} steps but {len(values)} values")
    all_steps = np.unique(np.concatenate([np.asarray(s, dtype=float) for s, _ in curves]))
    if all_steps.size == 0:
        raise StatsError("no points: every curve is empty")
    grid = np.full((len(curves), all_steps.size), np.nan)
    for i, (steps, values) in enumerate(curves):
        grid[i, np.searchsorted(all_steps, np.asarray(steps, dtype=float))] = np.asarray(values, dtype=float)
    if np.isinf(grid).any():
        raise StatsError("curve values must be finite (NaN marks a step a seed did not log)")
    n = (~np.isnan(grid)).sum(axis=0)
    keep = n > 0
    grid, n, all_steps = grid[:, keep], n[keep], all_steps[keep]
    mean = np.nanmean(grid, axis=0)
    half = np.full(mean.shape, np.nan)
    several = n > 1
    if several.any():
        sd = np.sqrt(np.nansum((grid[:, several] - mean[several]) ** 2, axis=0) / (n[several] - 1))
        quantiles = {df: t_quantile((1 + confidence) / 2, df) for df in np.unique(n[several] - 1)}
        t = np.array([quantiles[df] for df in n[several] - 1])
        half[several] = t * sd / np.sqrt(n[several])
    low, high = mean - half, mean + half
    floor, ceiling = bounds
    if floor is not None:
        low = np.where(np.isnan(low), low, np.maximum(low, floor))
    if ceiling is not None:
        high = np.where(np.isnan(high), high, np.minimum(high, ceiling))
    steps_out = all_steps.astype(int) if np.all(all_steps == np.round(all_steps)) else all_steps
    return Band(steps_out, mean, low, high, n)


def curve_mean(curves: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[Sequence[float], np.ndarray]:
    """(steps, mean): the centre of `curve_band(curves)` without its interval (MATH.md section 8), what a plot
    of many cells draws one unit per cell from. When every curve logged the same increasing steps (a grid's
    seeds), the (seeds, steps) matrix is summed directly: the same sum and division as the band's, without its
    step alignment and quantiles."""
    steps = curves[0][0] if curves else ()
    aligned = all(len(s) == len(v) and list(s) == list(steps) for s, v in curves)
    if not aligned or len(steps) == 0 or np.any(np.diff(np.asarray(steps, dtype=float)) <= 0):
        band = curve_band(curves)
        return band.steps, band.mean
    grid = np.array([v for _, v in curves], dtype=float)
    if not np.isfinite(grid).all():
        band = curve_band(curves)  # NaN marks a step not logged: the band's own alignment (or its error)
        return band.steps, band.mean
    return steps, grid.sum(axis=0) / len(curves)
