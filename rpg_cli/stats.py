"""Uncertainty and comparisons of benchmark scores (MATH.md section 8). NumPy only; imports nothing
of the project.

What a report calls
-------------------
The input is `Runs`: one method's per-problem scores at one step, for each benchmark an array
(seeds, problems) of per-problem mean@k (the k samples of a problem already averaged), rows in the
order of `Runs.seeds`, columns in the order of `Runs.problems` (problem ids, optional but checked when
given: comparisons align B to A by id).

- A table cell: `score(runs, "aime24")` -> `Interval` (a whole row: `scores(runs)`, one per benchmark
  and OVERALL, the same intervals from one set of resamples). `.pm()` prints `52.1 ±3.4`, `.ci()` prints
  `[48.7, 55.5]`, `.as_dict()` carries both bounds for CSV/JSON; `.resampled`, `.n_seeds` and
  `.n_problems` are what the footer states ("problems only (one seed)" when there is one seed).
- The overall cell: `score(runs)` (benchmark `OVERALL`): the mean of the benchmark scores.
- A compare line: `compare(a, b, benchmark)` -> `Comparison` (B - A with its interval, P(B > A) with its
  interval, the seeds needed for 80% power, the verdict); `.text("GRPO", "DAPO")` is the line.
- A curve band: `curve_band([(steps, values) for each seed])` -> `Band` (mean over seeds per step,
  a 95% t interval of that mean; `BAND_MEANING` is the sentence for the figure).
- Every function takes `rng_seed` (default 0): the same store gives the same intervals.

What the store must provide: per run, step, benchmark and problem, the mean@k over the k samples.
The `samples` table has it for `rpg eval` results: the mean of `correct` grouped by run, step,
benchmark, scorer and problem (its index, which becomes the problem id), one scorer and one k per
cell (the protocol guard's business). Any per-problem score in [0, 1] works the same way (per-problem
pass@k, maj@k). verl's own validation logs only benchmark-level means
(`val-core/<source>/acc/mean@k`): for such cells `score_from_means` gives a seeds-only interval
(problem sampling not included, and its `resampled` text says so); with one seed there is no
interval (`Interval.low is None`) and the cell prints the number alone.

How the intervals are made (and why they are not the plain percentile interval)
-------------------------------------------------------------------------------
Seeds and problems are crossed (every run answers the same problems), so the bootstrap resamples
them independently: seeds (runs) with replacement, and problems with replacement within each
benchmark, one problem draw shared by every seed (and by both methods of a paired comparison).
Counts are drawn as multinomial vectors per resample and scores are matrix products (Python loops
only over blocks of 256 resamples). A factor's draws are a function of (rng_seed, its name): every
method of a table resamples the same problems of a benchmark, so the draws are cached and reused.

The percentile interval of that bootstrap is too narrow with few seeds: the bootstrap variance of a
mean over n units is (n - 1)/n of the unbiased one, its quantiles are normal rather than Student's t,
and resampling two crossed factors counts their interaction about three times (Owen 2007, "The
pigeonhole bootstrap"). For the means (a score, the overall score, a difference) the bootstrap
variance has a closed form in the data's two-way ANOVA decomposition, so the interval is the
percentile interval stretched about the estimate by

    f = (t_nu / z) * sqrt(V / V*),

V* the bootstrap variance, V the unbiased (method-of-moments) variance of the estimate with negative
variance components set to zero, nu its Satterthwaite degrees of freedom. tests/test_stats.py checks
the coverage (95-96% for a score from 3 to 10 seeds and 30 problems, for the overall score and for a
paired difference; 95% with one seed for that run's own score). Caveat: with few seeds *and* a seed
variance larger than the problem variance (each run's score spread by ~10 points on a 30-problem
benchmark), the Satterthwaite df is itself noisy and the interval still undercovers: about 91% at 3
seeds, 94% at 5, 84-90% at 2. On benchmarks of 30+ problems the problem term usually dominates a
score's interval, and then coverage is nominal from 3 seeds on. P(B > A) is not a mean: its interval
is the plain percentile interval (95% coverage at 5 seeds per method, about 92% at 3).
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
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

B_BETTER, A_BETTER, NO_DIFFERENCE = "B better", "A better", "no detectable difference"
VERDICTS = (B_BETTER, A_BETTER, NO_DIFFERENCE)

BAND_MEANING = (
    "mean over seeds; band: 95% confidence interval of that mean (t over seeds, per step, within the metric's range)"
)

# resampled: what an interval's randomness covers (the table footer prints it)
SEEDS_AND_PROBLEMS = "seeds and problems"
PROBLEMS_ONLY = "problems only (one seed)"
SEEDS_ONLY = "seeds only (one problem)"
MEANS_ONLY = "seeds only (benchmark means: problem sampling not included)"
NOTHING = "nothing (one seed, one problem: no interval)"

# Resamples drawn per block: a block's (resamples, problems) arrays stay small enough for the allocator
# to reuse them (fresh multi-MB arrays per draw cost page faults that dominated the run time). Fixed, so
# a factor's draws do not depend on what else a statistic resamples.
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
    """A point estimate and its confidence interval; low/high None when nothing could be resampled."""

    estimate: float
    low: float | None
    high: float | None
    n_seeds: int  # runs behind the estimate (per method; the smaller group in a comparison)
    n_problems: int | None  # problems over the benchmarks covered; None: not known (benchmark means)
    resampled: str  # what the interval covers (SEEDS_AND_PROBLEMS, PROBLEMS_ONLY, ...)
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float | None:
        return None if self.low is None or self.high is None else (self.high - self.low) / 2

    def excludes(self, value: float = 0.0) -> bool:
        return self.low is not None and self.high is not None and not (self.low <= value <= self.high)

    def pm(self, scale: float = 100.0, digits: int = 1, signed: bool = False) -> str:
        """'52.1 ±3.4' (± the half-width; the exact, possibly asymmetric bounds are in ci())."""
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
            "resampled": self.resampled,
            "confidence": self.confidence,
        }


@dataclass(frozen=True)
class SeedsNeeded:
    """Seeds per method for the observed difference to be detected at `power`; n None with a reason."""

    n: int | None
    reason: str = ""

    def text(self) -> str:
        return str(self.n) if self.n is not None else f"- ({self.reason})"


@dataclass(frozen=True)
class Comparison:
    benchmark: str
    difference: Interval  # B - A, paired by problem (and by seed when both have the same seeds)
    p_improvement: Interval  # P(B > A)
    seeds_needed: SeedsNeeded
    verdict: str  # one of VERDICTS
    seeds_paired: bool

    def text(self, a: str = "A", b: str = "B", scale: float = 100.0, digits: int = 1) -> str:
        """One compare line, e.g. 'aime24: DAPO - GRPO = +3.1 [-0.4, 6.6]; P(DAPO > GRPO) = 0.62 [0.48, 0.75];
        seeds for 80% power: 12; no detectable difference'."""
        d, p = self.difference, self.p_improvement
        verdict = {B_BETTER: f"{b} better", A_BETTER: f"{a} better"}.get(self.verdict, self.verdict)
        diff = f"{_fmt(d.estimate, scale, digits, signed=True)} {d.ci(scale, digits)}".rstrip()
        prob = f"{p.estimate:.2f}" + (
            f" [{p.low:.2f}, {p.high:.2f}]" if p.low is not None and p.high is not None else ""
        )
        return (
            f"{self.benchmark}: {b} - {a} = {diff}; P({b} > {a}) = {prob}; "
            f"seeds for {POWER:.0%} power: {self.seeds_needed.text()}; {verdict}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "difference": self.difference.as_dict(),
            "p_improvement": self.p_improvement.as_dict(),
            "seeds_needed": self.seeds_needed.n,
            "seeds_needed_reason": self.seeds_needed.reason,
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


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast below this point
        return 1.0 - _betainc(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return math.exp(log_front) * h / a


def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with df > 0 degrees of freedom (df may be fractional)."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + x * x))
    return 1.0 - tail if x >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t for p in [0.5, 1), df >= 1 (fractional df, as Satterthwaite gives)."""
    z = NormalDist().inv_cdf(p)
    if df > 1e7 or p == 0.5:
        return z
    # t_df(p) lies between the normal quantile and the Cauchy (df = 1) one; Newton inside that bracket.
    lo, hi = z, math.tan(math.pi * (p - 0.5))
    x = min(max(z + (z**3 + z) / (4 * df), lo), hi)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    for _ in range(200):
        err = t_cdf(x, df) - p
        if abs(err) < 1e-14 or hi - lo < 1e-12 * hi:
            break
        if err > 0:
            hi = x
        else:
            lo = x
        step = x - err / math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))
        x = step if lo < step < hi else (lo + hi) / 2
    return x


# -------------------------------------------------------------------------- the bootstrap machinery


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
    problems), a function of its key: the same whichever other benchmarks or methods a statistic
    involves, so a table's cells share one problem draw per benchmark and `scores` equals `score` cell
    by cell. Every method of a table resamples the same problems, so small ones are cached."""
    if n_resamples * n <= _CACHE_ELEMENTS:
        return _cached_weights(rng_seed, key, n_resamples, n)
    return _cached_weights.__wrapped__(rng_seed, key, n_resamples, n)


@dataclass(frozen=True, eq=False)
class _Term:
    """sign * (mean over benchmarks, weighted) of the (seeds, problems) blocks. Terms with the same
    `seeds` key are the same runs (one seed draw); the same `problems` key, one problem draw."""

    sign: float
    seeds: str
    problems: str
    blocks: Mapping[str, np.ndarray]


@dataclass(frozen=True)
class _Variance:
    boot: float  # variance of the bootstrap distribution (exact, from the decomposition)
    unbiased: float  # method-of-moments variance of the estimate, components >= 0
    df: float  # its Satterthwaite degrees of freedom
    per_seed: float  # the part that scales as 1/seeds, times the seeds: sum over seed keys of S * V_seed
    problems: float  # the part that more seeds do not reduce
    problems_df: float  # its Satterthwaite degrees of freedom
    seeds_estimable: bool  # every seed key has >= 2 seeds


def _estimate(terms: Sequence[_Term], weights: Mapping[str, float]) -> float:
    return float(sum(t.sign * weights[b] * y.mean() for t in terms for b, y in t.blocks.items()))


def _decompose(terms: Sequence[_Term], weights: Mapping[str, float]) -> _Variance:
    """Two-way (seed x problem) ANOVA of the linear statistic, per seed key, problem key and benchmark.

    With r the seed effects, c the problem effects and e the residuals (each weighted and signed), the
    bootstrap variance is sum r^2/S^2 + sum c^2/P^2 + sum e^2/(SP)^2 exactly; the unbiased estimates are
    V_seed = sum r^2/(S(S-1)) ~ s_a^2/S + s_e^2/(SP), V_prob = sum c^2/(P(P-1)) ~ s_b^2/P + s_e^2/(SP) and
    V_int = sum e^2/((S-1)(P-1)SP) ~ s_e^2/(SP), so V = sum V_seed + sum V_prob - sum V_int.
    """
    rows: dict[str, np.ndarray] = {}
    cols: dict[tuple[str, str], np.ndarray] = {}
    cells: dict[tuple[str, str, str], np.ndarray] = {}
    for t in terms:
        for bench, y in t.blocks.items():
            w = t.sign * weights[bench]
            grand, r, c = y.mean(), y.mean(axis=1) - y.mean(), y.mean(axis=0) - y.mean()
            rows[t.seeds] = rows.get(t.seeds, 0.0) + w * r
            cols[(t.problems, bench)] = cols.get((t.problems, bench), 0.0) + w * c
            key = (t.seeds, t.problems, bench)
            cells[key] = cells.get(key, 0.0) + w * (y - grand - r[:, None] - c[None, :])
    boot = sum(float(r @ r) / len(r) ** 2 for r in rows.values())
    boot += sum(float(c @ c) / len(c) ** 2 for c in cols.values())
    boot += sum(float((e * e).sum()) / e.size**2 for e in cells.values())

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
    seed_part = {k: max(v, int_by_seed.get(k, 0.0)) for k, (v, _) in v_seed.items()}
    prob_parts = {k: (max(v - int_by_prob.get(k, 0.0), 0.0), df) for k, (v, df) in v_prob.items()}
    prob_part = sum(v for v, _ in prob_parts.values())
    prob_denominator = sum(v * v / df for v, df in prob_parts.values())
    unbiased = sum(seed_part.values()) + prob_part
    denominator = sum(v * v / df for part in (v_seed, v_prob, v_int) for v, df in part.values())
    df = unbiased**2 / denominator if denominator > 0 else math.inf
    return _Variance(
        boot=boot,
        unbiased=unbiased,
        df=max(df, 1.0),
        per_seed=sum(len(rows[k]) * v for k, v in seed_part.items()),
        problems=prob_part,
        problems_df=prob_part**2 / prob_denominator if prob_denominator > 0 else math.inf,
        seeds_estimable=all(len(r) > 1 for r in rows.values()),
    )


def _replicates(terms: Sequence[_Term], n_resamples: int, rng_seed: int) -> dict[str, np.ndarray]:
    """Per benchmark, bootstrap replicates of sum_t sign_t * mean(Y_tb): one seed draw per seed key, one
    problem draw per problem key and benchmark, shared by the terms that carry the key."""
    n_seeds = {t.seeds: next(iter(t.blocks.values())).shape[0] for t in terms}
    n_problems = {(t.problems, b): y.shape[1] for t in terms for b, y in t.blocks.items()}
    w = {k: _resample_weights(rng_seed, f"seeds/{k}", n_resamples, s) for k, s in n_seeds.items()}
    v = {k: _resample_weights(rng_seed, f"problems/{k[0]}/{k[1]}", n_resamples, p) for k, p in n_problems.items()}
    out = {b: np.zeros(n_resamples) for t in terms for b in t.blocks}
    for t in terms:
        for bench, y in t.blocks.items():
            w_t, v_t, out_b = w[t.seeds], v[(t.problems, bench)], out[bench]
            for start, stop in _blocks(n_resamples):  # blocks keep the (resamples, problems) product small
                # each resample's seed-weighted per-problem means (w @ y), then its problem-weighted mean
                out_b[start:stop] += t.sign * np.einsum("np,np->n", w_t[start:stop] @ y, v_t[start:stop])
    return out


def _interval(
    terms: Sequence[_Term],
    weights: Mapping[str, float],
    replicates: Callable[[], Mapping[str, np.ndarray]],
    confidence: float,
    bounds: tuple[float, float],
    n_seeds: int,
    n_problems: int | None,
    resampled: str,
) -> Interval:
    """Percentile interval of the crossed bootstrap, stretched about the estimate by (t_nu/z)*sqrt(V/V*)."""
    estimate = _estimate(terms, weights)
    if resampled == NOTHING:
        return Interval(estimate, None, None, n_seeds, n_problems, resampled, confidence)
    var = _decompose(terms, weights)
    if var.boot <= 1e-30:  # every resample gives the estimate (constant data)
        return Interval(estimate, estimate, estimate, n_seeds, n_problems, resampled, confidence)
    by_bench = replicates()
    reps = sum(w * by_bench[b] for b, w in weights.items())
    q_low, q_high = np.quantile(reps, [(1 - confidence) / 2, (1 + confidence) / 2])
    p = (1 + confidence) / 2
    stretch = t_quantile(p, var.df) / NormalDist().inv_cdf(p) * math.sqrt(var.unbiased / var.boot)
    low = max(estimate - stretch * max(estimate - q_low, 0.0), bounds[0])
    high = min(estimate + stretch * max(q_high - estimate, 0.0), bounds[1])
    return Interval(estimate, float(low), float(high), n_seeds, n_problems, resampled, confidence)


def _check_resamples(n_resamples: int) -> None:
    if n_resamples < 100:
        raise StatsError(f"n_resamples={n_resamples} is too few for a {CONFIDENCE:.0%} interval; use >= 1000")


def _resampled(n_seeds: int, n_problems: int) -> str:
    if n_seeds > 1:
        return SEEDS_AND_PROBLEMS if n_problems > 1 else SEEDS_ONLY
    return PROBLEMS_ONLY if n_problems > 1 else NOTHING


def _weights(benchmarks: Sequence[str]) -> dict[str, float]:
    return {b: 1.0 / len(benchmarks) for b in benchmarks}


# ----------------------------------------------------------------------------------- the statistics


def _replicates_once(terms: Sequence[_Term], n_resamples: int, rng_seed: int) -> Callable[[], Mapping[str, np.ndarray]]:
    """The replicates on first use (an interval that needs none -- one seed and one problem, constant
    data -- draws nothing), then the same arrays for every interval built from them."""
    _check_resamples(n_resamples)
    return functools.cache(lambda: _replicates(terms, n_resamples, rng_seed))


def _score_interval(
    runs: Runs, benchmark: str, replicates: Callable[[], Mapping[str, np.ndarray]], confidence: float
) -> Interval:
    benches = runs.benchmarks(benchmark)
    term = _Term(1.0, "runs", "all", {b: runs.scores[b] for b in benches})
    n_problems = [runs.scores[b].shape[1] for b in benches]
    return _interval(
        [term],
        _weights(benches),
        replicates,
        confidence,
        (0.0, 1.0),
        runs.n_seeds,
        sum(n_problems),
        _resampled(runs.n_seeds, max(n_problems)),
    )


def score(
    runs: Runs,
    benchmark: str = OVERALL,
    *,
    n_resamples: int = N_RESAMPLES,
    rng_seed: int = RNG_SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """A method's score on a benchmark (the mean over seeds and problems of per-problem mean@k) and its
    interval from the hierarchical bootstrap (MATH.md section 8: resample seeds, then problems within
    the benchmark, the same problem draw for every seed). With one seed it covers problems only.

    OVERALL is the mean of the benchmark scores (each benchmark weighs the same, whatever its size, as
    the paper's per-benchmark columns do), its problems resampled within each benchmark (stratified: a
    benchmark keeps its size in every resample) and one seed draw shared by all benchmarks (a seed is
    one run, scored on every benchmark).
    """
    term = _Term(1.0, "runs", "all", {b: runs.scores[b] for b in runs.benchmarks(benchmark)})
    return _score_interval(runs, benchmark, _replicates_once([term], n_resamples, rng_seed), confidence)


def scores(
    runs: Runs, *, n_resamples: int = N_RESAMPLES, rng_seed: int = RNG_SEED, confidence: float = CONFIDENCE
) -> dict[str, Interval]:
    """`score` for every benchmark and OVERALL (a table row) from one set of resamples: the same
    intervals as one `score` call per cell, without resampling each benchmark twice."""
    replicates = _replicates_once([_Term(1.0, "runs", "all", runs.scores)], n_resamples, rng_seed)
    return {bench: _score_interval(runs, bench, replicates, confidence) for bench in [*runs.scores, OVERALL]}


def score_from_means(
    means: Sequence[float], *, n_resamples: int = N_RESAMPLES, rng_seed: int = RNG_SEED, confidence: float = CONFIDENCE
) -> Interval:
    """A benchmark score known only as one mean per run (verl's validation logs): the mean over seeds
    and a seeds-only interval (MATH.md section 8, the seed level alone: problem sampling is not in it).
    One run: no interval."""
    runs = Runs({"means": np.asarray(means, dtype=float).reshape(-1, 1)})
    terms = [_Term(1.0, "runs", "all", runs.scores)]
    return _interval(
        terms,
        {"means": 1.0},
        _replicates_once(terms, n_resamples, rng_seed),
        confidence,
        (0.0, 1.0),
        runs.n_seeds,
        None,
        MEANS_ONLY if runs.n_seeds > 1 else NOTHING,
    )


def _aligned(a: Runs, b: Runs, benchmark: str) -> tuple[list[str], dict[str, np.ndarray], dict[str, np.ndarray], bool]:
    """A's and B's blocks on the same problems in the same order; B's rows in A's seed order when both
    have the same seeds (then paired)."""
    if benchmark == OVERALL and set(a.scores) != set(b.scores):
        only_a, only_b = sorted(set(a.scores) - set(b.scores)), sorted(set(b.scores) - set(a.scores))
        raise StatsError(
            f"{OVERALL} needs the same benchmarks in A and B (only in A: {only_a}, only in B: {only_b}); compare one benchmark"
        )
    benches = a.benchmarks(benchmark)
    b.benchmarks(benchmark)
    seeds_paired = sorted(a.seeds) == sorted(b.seeds)
    rows = [b.seeds.index(s) for s in a.seeds] if seeds_paired else list(range(b.n_seeds))
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
    return benches, a_blocks, b_blocks, seeds_paired


def _difference_terms(
    a_blocks: Mapping[str, np.ndarray], b_blocks: Mapping[str, np.ndarray], seeds_paired: bool, problems_paired: bool
) -> list[_Term]:
    if seeds_paired and problems_paired:
        return [_Term(1.0, "pairs", "all", {k: b_blocks[k] - a_blocks[k] for k in a_blocks})]
    return [
        _Term(1.0, "B", "all" if problems_paired else "B", b_blocks),
        _Term(-1.0, "A", "all" if problems_paired else "A", a_blocks),
    ]


def difference(
    a: Runs,
    b: Runs,
    benchmark: str = OVERALL,
    *,
    paired: bool = True,
    n_resamples: int = N_RESAMPLES,
    rng_seed: int = RNG_SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """B - A and its interval (MATH.md section 8, paired comparison): per-problem differences on the same
    problems, bootstrapped like a score; seeds are paired (one draw for both) when A and B have the same
    seed labels, and resampled independently per method otherwise (all runs are used; the mean of B
    minus the mean of A is the same estimate either way). The interval excludes 0 iff the difference is
    detectable.

    paired=False is the two-sample interval (problems and seeds drawn independently for A and B): what
    comparing two separately computed intervals amounts to; it is here to show what pairing buys.
    """
    benches, a_blocks, b_blocks, seeds_paired = _aligned(a, b, benchmark)
    terms = _difference_terms(a_blocks, b_blocks, seeds_paired and paired, paired)
    n_seeds, n_problems = min(a.n_seeds, b.n_seeds), sum(a_blocks[k].shape[1] for k in benches)
    if seeds_paired and paired:
        resampled = _resampled(n_seeds, max(a_blocks[k].shape[1] for k in benches))
    else:
        resampled = _resampled(max(a.n_seeds, b.n_seeds), max(a_blocks[k].shape[1] for k in benches))
        resampled += " (seeds unpaired)" if resampled != NOTHING else ""
    return _interval(
        terms,
        _weights(benches),
        _replicates_once(terms, n_resamples, rng_seed),
        confidence,
        (-1.0, 1.0),
        n_seeds,
        n_problems,
        resampled,
    )


def _wins(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(S_B, S_A, P): 1 where run i of B beats run j of A on problem p, 1/2 on a tie, else 0."""
    return 0.5 + 0.5 * np.sign(b[:, None, :] - a[None, :, :])


def p_improvement(
    a: Runs,
    b: Runs,
    benchmark: str = OVERALL,
    *,
    n_resamples: int = N_RESAMPLES,
    rng_seed: int = RNG_SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """P(B > A), rliable's probability of improvement (Agarwal et al. 2021; MATH.md section 8) with
    problems as its tasks: the probability that a random run of B scores higher than a random run of A
    (ties count 1/2) on a random problem, averaged over all (B run, A run) pairs and the problems of a
    benchmark; OVERALL averages the benchmarks. Interval: percentile bootstrap, runs of A and of B
    resampled independently (the estimand pairs every run with every run), one problem draw per
    benchmark shared by both.
    """
    benches, a_blocks, b_blocks, _ = _aligned(a, b, benchmark)
    weights = _weights(benches)
    wins = {k: _wins(a_blocks[k], b_blocks[k]) for k in benches}
    estimate = float(sum(weights[k] * wins[k].mean() for k in benches))
    n_problems = sum(a_blocks[k].shape[1] for k in benches)
    resampled = _resampled(max(a.n_seeds, b.n_seeds), max(a_blocks[k].shape[1] for k in benches))
    if resampled == NOTHING:
        return Interval(estimate, None, None, min(a.n_seeds, b.n_seeds), n_problems, resampled, confidence)
    _check_resamples(n_resamples)
    w_a = _resample_weights(rng_seed, "seeds/A", n_resamples, a.n_seeds)
    w_b = _resample_weights(rng_seed, "seeds/B", n_resamples, b.n_seeds)
    reps = np.zeros(n_resamples)
    for k in benches:
        s_b, s_a, n_p = wins[k].shape
        v, flat_wins = (
            _resample_weights(rng_seed, f"problems/all/{k}", n_resamples, n_p),
            wins[k].reshape(s_b * s_a, n_p).T,
        )
        for start, stop in _blocks(n_resamples):
            # per resample: the problem-weighted win rate of every (B run, A run) pair, then the run-weighted mean
            per_pair = (v[start:stop] @ flat_wins).reshape(stop - start, s_b, s_a)
            reps[start:stop] += weights[k] * np.einsum("nb,nba,na->n", w_b[start:stop], per_pair, w_a[start:stop])
    low, high = np.quantile(reps, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Interval(estimate, float(low), float(high), min(a.n_seeds, b.n_seeds), n_problems, resampled, confidence)


def seeds_needed(
    a: Runs, b: Runs, benchmark: str = OVERALL, *, power: float = POWER, alpha: float = ALPHA
) -> SeedsNeeded:
    """Seeds per method for the observed B - A to be detected at `power` by a two-sided test at level
    `alpha` (MATH.md section 8, the paired comparison), on the same problems.

    With the paired difference's variance components estimated as in the interval (between-seed s_a^2,
    problem s_b^2, seed x problem s_e^2), the estimate from n seeds has variance
    V(n) = (s_a^2 + s_e^2/P)/n + s_b^2/P. The answer is the smallest n >= 2 with

        |d| >= (t_{nu, 1-alpha/2} + t_{nu, power}) * sqrt(V(n)),

    nu the Satterthwaite degrees of freedom of V(n) (n - 1 for the seed part, P - 1 for the problem
    part), the t version of the normal sample-size formula n = (s_a^2 + s_e^2/P) /
    ((d / (z_{1-alpha/2} + z_power))^2 - s_b^2/P), which undercounts when n is small (t_2 = 4.3, not
    1.96). Assumptions: the observed difference and variances are the true ones (a post-hoc power
    calculation: a rough guide, not a promise), normal errors, equal seeds per method, seeds paired
    when both groups have the same ones, the same problems. None when it cannot be said: one seed of a
    method (its seed variance is unknown), no difference, or a difference below the problem-sampling
    noise of these benchmarks (no number of seeds detects it; more problems would).
    """
    benches, a_blocks, b_blocks, seeds_paired = _aligned(a, b, benchmark)
    terms = _difference_terms(a_blocks, b_blocks, seeds_paired, True)
    weights = _weights(benches)
    d = abs(_estimate(terms, weights))
    var = _decompose(terms, weights)
    if not var.seeds_estimable:
        return SeedsNeeded(None, "needs 2+ seeds of each method to estimate the seed variance")
    if d == 0.0:
        return SeedsNeeded(None, "no difference observed")
    too_small = SeedsNeeded(None, "smaller than the problem-sampling noise: more problems needed, not seeds")
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    budget = (d / z) ** 2 - var.problems
    if budget <= 0:
        return too_small

    def detected(n: int) -> bool:
        # per_seed sums both methods' parts when the seeds are unpaired: n seeds each
        seed_part = var.per_seed / n
        v = seed_part + var.problems
        if v == 0.0:
            return True
        df = v * v / (seed_part**2 / (n - 1) + (var.problems**2 / var.problems_df if var.problems > 0 else 0.0))
        return d >= (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * math.sqrt(v)

    low = max(2, math.ceil(var.per_seed / budget))  # t quantiles exceed z ones: never fewer than this
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
    n_resamples: int = N_RESAMPLES,
    rng_seed: int = RNG_SEED,
    confidence: float = CONFIDENCE,
) -> Comparison:
    """Everything `rpg compare` prints for one benchmark (or OVERALL): B - A with its interval, P(B > A)
    with its interval, the seeds needed for 80% power, and the verdict (MATH.md section 8)."""
    diff = difference(a, b, benchmark, n_resamples=n_resamples, rng_seed=rng_seed, confidence=confidence)
    prob = p_improvement(a, b, benchmark, n_resamples=n_resamples, rng_seed=rng_seed, confidence=confidence)
    return Comparison(
        benchmark, diff, prob, seeds_needed(a, b, benchmark), verdict(diff), sorted(a.seeds) == sorted(b.seeds)
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
