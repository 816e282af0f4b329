"""`rpg compare` end to end on a store with samples: the CLI command in this process, from opening the
database to the printed lines.

Fills a fresh SQLite store with 2 methods x 5 seeds, each evaluated by `rpg eval` at one step on 3
benchmarks x 30 problems x 32 samples (28,800 sample rows, with their protocol), then times
`rpg compare GRPO DAPO`: resolving the groups, the scores and the per-problem samples, the paired
difference (closed form), P(B > A) (10,000 resamples) and the detectable difference per benchmark and overall.

Target: < 1 s (the commands' imports are warmed once first, as in a shell session they are the
interpreter's start-up, the same for every command).

    python benchmarks/bench_compare.py [--seeds 5] [--problems 30]

BENCH_QUICK=1: 2 seeds x 5 problems; a compare that fails fails, its time is not judged.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from rpg_cli import stats
from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import open_store

QUICK = os.environ.get("BENCH_QUICK") == "1"  # CI: tiny sizes, timings printed but not judged
TARGET_S = 1.0
BENCHMARKS = ("aime24", "aime25", "amc23")
PROTOCOL = {"n": 32, "temperature": 1.0, "top_p": 0.7, "max_tokens": 4096, "seed": 0}


def fill(db: str, root: Path, n_seeds: int, n_problems: int) -> None:
    rng = np.random.default_rng(0)
    store = open_store(db)
    n = PROTOCOL["n"]
    rates = {b: rng.beta(1.5, 2.0, size=n_problems) for b in BENCHMARKS}
    for alg, shift in (("grpo", 0.0), ("dapo", 0.05)):
        for seed in range(n_seeds):
            run_id = f"{alg}-{seed}"
            spec = {
                "algorithm": alg,
                "kl": "none",
                "seed": seed,
                "optimizer": "adamw",
                "context": "4k",
                "model": "Qwen/Qwen3-4B",
            }
            store.record_plan(
                RunPlan(
                    id=run_id,
                    name=run_id,
                    sweep="bench",
                    backend="local",
                    spec=spec,
                    run_dir=root / run_id,
                    entrypoint=["true"],
                )
            )
            store.set_status(run_id, "succeeded")  # only finished runs are compared
            for bench in BENCHMARKS:
                correct = rng.binomial(n, np.clip(rates[bench] + shift, 0, 1))
                store.record_samples(
                    {
                        "run_id": run_id,
                        "step": 400,
                        "benchmark": bench,
                        "problem": f"{bench}-{p}",
                        "sample_index": j,
                        "scorer": "dapo",
                        **PROTOCOL,
                        "position": p,
                        "extracted": "1",
                        "correct": bool(j < c),
                        "response_length": 100,
                    }
                    for p, c in enumerate(correct)
                    for j in range(n)
                )
                store.record_evals(
                    [
                        {
                            "run_id": run_id,
                            "step": 400,
                            "benchmark": bench,
                            "metric": "mean@k",
                            "k": n,
                            "value": float(correct.mean() / n),
                            "scorer": "dapo",
                            "scorer_version": "1",
                            **PROTOCOL,
                        }
                    ]
                )
    store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2 if QUICK else 5)
    parser.add_argument("--problems", type=int, default=5 if QUICK else 30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'results.db'}"
        fill(db, Path(tmp), args.seeds, args.problems)
        runner = CliRunner()
        runner.invoke(app, ["compare", "GRPO", "GRPO", "--db", db])  # warm the imports
        best, output = float("inf"), ""
        for _ in range(3):
            stats._cached_weights.cache_clear()  # every repeat draws its resamples afresh
            start = time.perf_counter()
            result = runner.invoke(app, ["compare", "GRPO", "DAPO", "--db", db])
            best = min(best, time.perf_counter() - start)
            output = result.output
        if result.exit_code != 0:
            print(output)
            return 1
    print(output, end="")
    print(
        f"rpg compare, {args.seeds} seeds x 2 methods, 3 benchmarks x {args.problems} problems x 32 samples: "
        f"{best:.3f} s (target {TARGET_S:.1f} s, ratio {best / TARGET_S:.2f})"
    )
    return 0 if best < TARGET_S or QUICK else 1


if __name__ == "__main__":
    sys.exit(main())
