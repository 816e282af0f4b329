"""`rpg report --table` speed on a large store.

Fills a fresh SQLite store (bulk inserts) with 100 runs x 400 steps x 50 metric keys (2,000,000 metric
rows, 12 of the keys verl's val-core validation metrics logged at every step: the worst case), then
times building the Last/Best table from those logged validation metrics, and again from an `evals`
table (100 runs x 80 evaluated steps x 3 benchmarks x mean/pass/maj@32), rendering every format.

Target: each table (query + aggregation + rendering) < 1 s.

    python benchmarks/bench_report.py [--runs 100] [--steps 400] [--keys 50]

BENCH_QUICK=1: 12 runs x 20 steps x 20 keys; a table that cannot be built fails, timings are not judged.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from rpg_cli import report
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import open_store

QUICK = os.environ.get("BENCH_QUICK") == "1"  # CI: tiny sizes, timings printed but not judged
TARGET_S = 1.0
METHODS = [
    ("grpo", "none"),
    ("dapo", "none"),
    ("reinforce_pp", "none"),
    ("reinforce_pp_baseline", "none"),
    *[(alg, kl) for alg in ("rpg", "rpg_reinforce") for kl in ("fkl", "rkl", "ufkl", "urkl")],
]
SOURCES = ("math_dapo", "aime2025", "amc_23")
VAL_KEYS = [f"val-core/{s}/acc/{m}" for s in SOURCES for m in ("mean@32", "maj@32/mean", "best@32/mean", "std@32")]


def run_spec(i: int) -> dict:
    alg, kl = METHODS[i % len(METHODS)]
    optimizer = ("adamw", "schedule_free")[i // len(METHODS) % 2]
    return {
        "algorithm": alg,
        "kl": kl,
        "optimizer": optimizer,
        "context": "2k",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "seed": i // (2 * len(METHODS)),
        "clip": {"eps_low": 0.2, "eps_high": 0.28, "c": 10.0},
        "beta": 1e-4,
    }


def timed(fn, repeat: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def table_all_formats(store) -> report.Table:
    table = report.build_table(store, compare_paper=True)
    for render in report.RENDERERS.values():
        render(table)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12 if QUICK else 100)
    parser.add_argument("--steps", type=int, default=20 if QUICK else 400)
    parser.add_argument("--keys", type=int, default=20 if QUICK else 50)
    args = parser.parse_args()
    keys = ["critic/score/mean", "actor/entropy", "response_length/mean", "actor/kl_loss", *VAL_KEYS]
    keys += [f"actor/metric_{i}" for i in range(args.keys - len(keys))]
    rng = random.Random(0)

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "results.db"
        store = open_store(f"sqlite:///{db}")
        ids = [f"run{i:04d}" for i in range(args.runs)]
        store.record_plans(
            [
                RunPlan(
                    id=run_id,
                    name=f"bench-{run_id}",
                    sweep="bench",
                    backend="verl",
                    spec=run_spec(i),
                    run_dir=Path(tmp) / run_id,
                    entrypoint=["true"],
                )
                for i, run_id in enumerate(ids)
            ]
        )
        for run_id in ids:  # a table holds finished runs only
            store.set_status(run_id, "succeeded")
        start = time.perf_counter()
        con = sqlite3.connect(db)
        with con:  # one transaction, rows in primary-key order
            con.executemany(
                "INSERT INTO metrics (run_id, key, step, value) VALUES (?, ?, ?, ?)",
                ((r, k, s, rng.random()) for r in ids for k in sorted(keys) for s in range(1, args.steps + 1)),
            )
        con.close()
        fill_s = time.perf_counter() - start
        n_metrics = args.runs * args.steps * len(keys)

        val_s, val_table = timed(lambda: table_all_formats(store))

        store.record_evals(
            {
                "run_id": r,
                "step": s,
                "benchmark": b,
                "metric": f"{m}@32",
                "k": 32,
                "value": rng.random(),
                "scorer": "dapo",
                "scorer_version": "1",
                "n": 32,
                "temperature": 1.0,
                "top_p": 0.7,
                "max_tokens": 4096,
                "seed": 0,
            }
            for r in ids
            for s in range(5, args.steps + 1, 5)
            for b in ("aime24", "aime25", "amc23")
            for m in ("mean", "pass", "maj")
        )
        eval_s, eval_table = timed(lambda: table_all_formats(store))
        summary_s, summary = timed(lambda: report.runs_summary(store))
        store.close()

    rows = sum(len(g.rows) for g in eval_table.groups)
    print(
        f"store: {args.runs} runs x {args.steps} steps x {len(keys)} keys = {n_metrics:,} metric rows (filled in {fill_s:.1f} s)"
    )
    print(f"{'measure':<56}{'seconds':>10}{'target':>10}{'ratio':>8}")
    results = [
        (
            f"table from logged val metrics ({sum(len(g.rows) for g in val_table.groups)} rows, 5 formats)",
            val_s,
            TARGET_S,
        ),
        (f"table from evals ({rows} rows, 5 formats)", eval_s, TARGET_S),
        (f"runs summary ({len(summary)} runs)", summary_s, TARGET_S),
    ]
    for name, seconds, target in results:
        print(f"{name:<56}{seconds:>10.3f}{target:>10.1f}{seconds / target:>8.2f}")
    ok = all(seconds < target for _, seconds, target in results)
    print("PASS" if ok else "FAIL")
    return 0 if ok or QUICK else 1


if __name__ == "__main__":
    sys.exit(main())
