"""Results-store speed: ingesting training metrics, and reading them back for a runs table.

Writes 100 runs' metrics.jsonl in verl's file-logger format (400 steps x 25 keys each: 1,000,000
metric values), ingests them through `Store.ingest_metrics` into a fresh SQLite file, then reads the
latest value of a few keys for all 100 runs (what `rpg runs` and the sweep view show).

Targets: ingest 1,000,000 rows < 10 s; the 100-run latest-values read < 1 s.

    python benchmarks/bench_store.py [--runs 100] [--steps 400] [--keys 25]

BENCH_QUICK=1: 4 runs x 50 steps x 10 keys; only a wrong result fails (timings printed, not judged).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import open_store

QUICK = os.environ.get("BENCH_QUICK") == "1"  # CI: tiny sizes, timings printed but not judged
INGEST_TARGET_S = 10.0
READ_TARGET_S = 1.0
TABLE_KEYS = ["critic/score/mean", "actor/pg_loss", "response_length/mean"]


def write_metrics(path: Path, steps: int, keys: list[str], rng: random.Random) -> None:
    with open(path, "w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps({"step": step, "data": {k: rng.random() for k in keys}}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4 if QUICK else 100)
    parser.add_argument("--steps", type=int, default=50 if QUICK else 400)
    parser.add_argument("--keys", type=int, default=10 if QUICK else 25)
    args = parser.parse_args()

    keys = TABLE_KEYS + [f"actor/metric_{i}" for i in range(args.keys - len(TABLE_KEYS))]
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = open_store(f"sqlite:///{root / 'results.db'}")
        plans = [
            RunPlan(
                id=f"run{i:04d}",
                name=f"bench-run-{i}",
                sweep="bench",
                backend="local",
                spec={"seed": i},
                run_dir=root / f"run{i:04d}",
                entrypoint=["true"],
            )
            for i in range(args.runs)
        ]
        store.record_plans(plans)
        for plan in plans:
            plan.run_dir.mkdir()
            write_metrics(plan.run_dir / "metrics.jsonl", args.steps, keys, rng)

        start, cpu_start = time.perf_counter(), time.process_time()
        rows = sum(store.ingest_metrics(p.id, p.run_dir / "metrics.jsonl") for p in plans)
        ingest_s, ingest_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        again = sum(store.ingest_metrics(p.id, p.run_dir / "metrics.jsonl") for p in plans)

        start = time.perf_counter()
        table = store.latest_values([p.id for p in plans], TABLE_KEYS)
        steps = store.last_steps(p.id for p in plans)
        read_s = time.perf_counter() - start
        store.close()

    complete = len(table) == args.runs and all(len(v) == len(TABLE_KEYS) for v in table.values())
    complete = complete and set(steps.values()) == {args.steps} and again == 0
    print(f"{'measure':<40} {'value':>12} {'target':>10} {'ratio':>7}  verdict")
    for label, value, target in (
        (f"ingest {rows:,} rows (s)", ingest_s, INGEST_TARGET_S),
        (f"latest {len(TABLE_KEYS)} keys x {args.runs} runs (s)", read_s, READ_TARGET_S),
    ):
        verdict = "PASS" if value < target else "FAIL"
        print(f"{label:<40} {value:>12.3f} {target:>10.1f} {value / target:>7.2f}  {verdict}")
    print(f"{'ingest CPU time (s)':<40} {ingest_cpu_s:>12.3f}")  # wall minus this: waits, other load
    print(f"{'ingest rate (rows/s)':<40} {rows / ingest_s:>12,.0f}")
    print(f"{'re-ingest added rows':<40} {again:>12}")
    print(f"{'table complete':<40} {str(complete):>12}")
    ok = complete and (QUICK or (ingest_s < INGEST_TARGET_S and read_s < READ_TARGET_S))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
