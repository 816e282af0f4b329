"""Interval and comparison speed (`rpg_cli.stats`) on one core.

A results table of 100 runs (12 methods, 8-9 seeds each), 3 benchmarks x 30 problems of per-problem
mean@32: every method's interval per benchmark and overall (closed form) at two steps (Last and a
selected Best), each cell rendered; and `rpg compare` of two methods (3 benchmarks and overall:
difference, P(B > A) with 10,000 bootstrap resamples, the detectable difference, verdict).

Targets: the table < 2 s; the compare < 1 s, on one core: BLAS threads are set to 1, the process is
pinned to one CPU where the platform allows, and the verdict is on the process's CPU time (the time on
that one core; on a machine shared with other work the wall time, printed beside it, is longer). Each
repeat starts with an empty resampling-weights cache, so P(B > A)'s draws are timed too.

    python benchmarks/bench_stats.py [--runs 100] [--problems 30] [--resamples 10000]

BENCH_QUICK=1: 24 runs, 10 problems, 1,000 resamples; timings printed, not judged.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy is imported

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from rpg_cli import stats  # noqa: E402

QUICK = os.environ.get("BENCH_QUICK") == "1"  # CI: tiny sizes, timings printed but not judged
TABLE_TARGET_S = 2.0
COMPARE_TARGET_S = 1.0
N_METHODS = 12
BENCHMARKS = ("aime24", "aime25", "amc23")
K = 32


def method_runs(rng: np.random.Generator, n_seeds: int, n_problems: int, skill: float) -> stats.Runs:
    """Per-problem mean@32 of n_seeds runs: problem rates from a Beta, a per-run shift, binomial samples."""
    blocks = {}
    for bench in BENCHMARKS:
        q = rng.beta(1.0 + skill, 2.0, size=n_problems)
        shift = rng.normal(0, 0.3, size=(n_seeds, 1))
        blocks[bench] = rng.binomial(K, np.clip(q + shift * q * (1 - q), 0, 1)) / K
    return stats.Runs(
        blocks,
        seeds=tuple(range(n_seeds)),
        problems={b: tuple(f"{b}-{i}" for i in range(n_problems)) for b in BENCHMARKS},
    )


def timed(fn, repeat: int = 3) -> tuple[float, float, object]:
    """Best CPU seconds, best wall seconds, and the result."""
    cpu, wall, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        stats._cached_weights.cache_clear()  # every repeat draws its resamples afresh
        start, cpu_start = time.perf_counter(), time.process_time()
        out = fn()
        cpu, wall = min(cpu, time.process_time() - cpu_start), min(wall, time.perf_counter() - start)
    return cpu, wall, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24 if QUICK else 100)
    parser.add_argument("--problems", type=int, default=10 if QUICK else 30)
    parser.add_argument("--resamples", type=int, default=1_000 if QUICK else 10_000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    rng = np.random.default_rng(0)
    seeds_per_method = [args.runs // N_METHODS + (i < args.runs % N_METHODS) for i in range(N_METHODS)]
    steps = {
        which: [method_runs(rng, n, args.problems, skill=i / 4) for i, n in enumerate(seeds_per_method)]
        for which in ("last", "best")
    }

    def table() -> list[str]:
        return [cell.pm() for methods in steps.values() for runs in methods for cell in stats.scores(runs).values()]

    a, b = steps["last"][0], steps["last"][5]

    def compare() -> list[str]:
        return [
            stats.compare(a, b, bench, n_resamples=args.resamples).text("A", "B")
            for bench in (*BENCHMARKS, stats.OVERALL)
        ]

    table_cpu, table_wall, cells = timed(table)
    compare_cpu, compare_wall, lines = timed(compare)
    print(
        f"{args.runs} runs ({N_METHODS} methods), {len(BENCHMARKS)} benchmarks x {args.problems} problems, "
        f"{args.resamples:,} resamples per P(B > A) interval; one core"
    )
    print(f"{'measure':<52}{'cpu s':>8}{'wall s':>8}{'target':>8}{'ratio':>7}  verdict")
    results = [
        (f"table: {len(cells)} cells (Last and Best, 3 + overall)", table_cpu, table_wall, TABLE_TARGET_S),
        (
            f"compare: {a.n_seeds} vs {b.n_seeds} seeds, 3 benchmarks + overall",
            compare_cpu,
            compare_wall,
            COMPARE_TARGET_S,
        ),
    ]
    for name, cpu, wall, target in results:
        print(
            f"{name:<52}{cpu:>8.3f}{wall:>8.3f}{target:>8.1f}{cpu / target:>7.2f}  {'PASS' if cpu < target else 'FAIL'}"
        )
    print(f"sample cell: {cells[0]}; sample compare line: {lines[-1]}")
    return 0 if QUICK or all(cpu < target for _, cpu, _, target in results) else 1


if __name__ == "__main__":
    sys.exit(main())
