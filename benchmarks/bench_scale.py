"""A team's store at scale: each command's time on two stores 10x apart, and how it grows.

Builds two SQLite stores through the product's own ingestion paths: the small one holds one sweep of
--runs runs, the large one --sweeps such sweeps (each sweep its own learning rate, so its cells are its
own, as a team's sweeps are). Every run logs --steps steps x 25 metric keys to metrics.jsonl in verl's
format, read by `Store.ingest_metrics` as the sweep's watcher reads it, and has --checkpoints checkpoints
evaluated on aime24 (30 problems), aime25 (30) and amc23 (40) with 32 samples each: scored-samples files
written one problem a line as `rpg eval`'s job writes them (`sample_line`), ingested with their
accuracy@k as `rpg eval` ingests them (`ScoredFeed`, `finish_eval`). The defaults give 1,024,000 samples
and 160,000 metric rows per sweep: 1M samples in the small store, 10M in the large.

Then each command runs through the real CLI, in a fresh process, on both stores: its CPU time (the
process and its children) and wall time, the median of --repeat runs, and the growth ratio large / small
of the CPU time. A command that shows the whole store may grow with it (about 10x: it shows 10x more); one
that shows a single sweep (--sweep s00) should not (about 1x: it shows the same). Ratios are printed, not
asserted (the machine's load moves them); exit status 1 only when a command fails.

    python benchmarks/bench_scale.py [--runs 32] [--sweeps 10] [--steps 200] [--checkpoints 10] [--repeat 3]
                                     [--work DIR]

--work DIR keeps the stores there and reuses them when built with the same sizes (building the large one
takes minutes). BENCH_QUICK=1: tiny stores (seconds), one run per command.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

QUICK = os.environ.get("BENCH_QUICK") == "1"
BENCHMARKS = {"aime24": 30, "aime25": 30, "amc23": 40}  # problems each, as the real files
SAMPLES = 32
PROTOCOL = {"k": SAMPLES, "temperature": 1.0, "top_p": 0.7, "max_tokens": 4096, "seed": 0}
# (algorithm, kl, skill): 8 methods; a sweep of 32 runs holds 4 seeds of each
METHODS = [
    ("grpo", "none", 0.40),
    ("dapo", "none", 0.45),
    ("reinforce_pp", "none", 0.38),
    ("rpg", "fkl", 0.42),
    ("rpg", "rkl", 0.43),
    ("rpg", "ufkl", 0.44),
    ("rpg", "urkl", 0.46),
    ("rpg_reinforce", "urkl", 0.41),
]
EXTRA_KEYS = 7  # beyond the keys every step carries (metrics.EMITTED_BY_BOTH: 18): 25 a step
SWEEP = "s00"  # the sweep the single-sweep commands show


@dataclass(frozen=True)
class Sizes:
    runs: int  # per sweep
    steps: int
    checkpoints: int
    problems: dict[str, int]

    def label(self, sweeps: int) -> str:
        samples = sweeps * self.runs * self.checkpoints * sum(self.problems.values()) * SAMPLES
        return f"{sweeps} sweep(s) x {self.runs} runs, {samples:,} samples"


def commands(plots: Path, tensorboard: Path) -> dict[str, list[str]]:
    """What a team runs, by label: the whole store, or one sweep of it."""
    return {
        "report --table": ["report", "--table"],
        "report --table --sweep s00": ["report", "--table", "--sweep", SWEEP],
        "report --table --select-on amc23 --sweep s00": ["report", "--table", "--select-on", "amc23", "--sweep", SWEEP],
        "compare GRPO DAPO --sweep s00": ["compare", "GRPO", "DAPO", "--sweep", SWEEP],
        "runs": ["runs"],
        "runs --sweep s00": ["runs", "--sweep", SWEEP],
        "export --to tensorboard --sweep s00": [
            "export",
            "--to",
            "tensorboard",
            "--sweep",
            SWEEP,
            "--dir",
            str(tensorboard),
        ],
        "report --plot": ["report", "--plot", "-o", str(plots)],
        "report --plot --sweep s00": ["report", "--plot", "--sweep", SWEEP, "-o", str(plots)],
    }


# ------------------------------------------------------------------------------------------ building


def run_spec(method: int, seed: int, sweep: int) -> dict:
    algorithm, kl, _ = METHODS[method]
    return {
        "algorithm": algorithm,
        "kl": kl,
        "optimizer": "adamw",
        "context": "2k",
        "model": "Qwen/Qwen3-4B",
        "seed": seed,
        "lr": 1e-6 * (1 + sweep),  # each sweep its own cells
        "clip": {"eps_low": 0.2, "eps_high": 0.28},
        "beta": 0.0 if kl == "none" else 1e-4,
    }


def metric_keys() -> list[str]:
    from rpg_cli.metrics import EMITTED_BY_BOTH

    return sorted(EMITTED_BY_BOTH) + [f"actor/extra_{i}" for i in range(EXTRA_KEYS)]


def metric_value(key: str, step: int, rng: random.Random) -> float:
    """A plausible value (inside the key's accepted range): counters count, the rest wander in [0, 1)."""
    fixed = {
        "training/global_step": step,
        "training/epoch": step // 50,
        "actor/lr": 1e-6,
        "perf/total_num_tokens": 2_000_000,
        "perf/throughput": 1500.0,
        "timing_s/step": 60.0 + rng.random(),
        "prompt_length/mean": 120.0,
        "response_length/mean": 800.0 + 400 * rng.random(),
    }
    return fixed.get(key, rng.random())


def write_metrics(path: Path, steps: int, keys: list[str], rng: random.Random) -> None:
    with open(path, "w") as f:  # verl's file logger: one {"step", "data"} line a step
        for step in range(1, steps + 1):
            f.write(json.dumps({"step": step, "data": {k: metric_value(k, step, rng) for k in keys}}) + "\n")


def write_scored(path: Path, bench: str, problems, skill: float, step_gain: float, rng: random.Random) -> None:
    """One (run, step, benchmark)'s scored-samples file, one problem a line as the evaluation job appends it."""
    from rpg_cli.store.ingest import sample_line

    protocol = {"n": SAMPLES, **{k: v for k, v in PROTOCOL.items() if k != "k"}}
    lines = []
    for position, problem in enumerate(problems):
        rate = min(max(skill + step_gain + 0.1 * (int(problem.key[:8], 16) % 7 - 3), 0.0), 1.0)  # some hard, some easy
        samples = [
            (str(position) if ok else "0", ok, 500 + j) for j, ok in ((j, rng.random() < rate) for j in range(SAMPLES))
        ]
        lines.append(sample_line(problem.key, position, "dapo", "1", protocol, samples))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def make_benchmark(root: Path, name: str, count: int):
    """`count` made-up problems of benchmark `name`, as `rpg eval` plans them (their keys name their samples)."""
    from rpg_cli.evaluation.plan import Benchmark, Problem

    problems = tuple(Problem(({"role": "user", "content": f"{name} problem {i}"},), str(i), name) for i in range(count))
    return Benchmark(name, root / "data" / f"{name}.parquet", problems, len(problems))


def build_store(root: Path, sweeps: int, sizes: Sizes) -> dict[str, float]:
    """A store of `sweeps` sweeps, every run's metrics and scored samples ingested as the product ingests
    them; returns how long it took (CPU and wall seconds) and what it holds."""
    from rpg_cli import rundir
    from rpg_cli.evaluation.options import EvalOptions
    from rpg_cli.evaluation.plan import Checkpoint, EvalPlan, Sampling, Target
    from rpg_cli.evaluation.recording import ScoredFeed, finish_eval
    from rpg_cli.orchestration.plan import RunPlan
    from rpg_cli.store import open_store

    db = f"sqlite:///{root / 'results.db'}"
    store = open_store(db)
    keys = metric_keys()
    benchmarks = tuple(make_benchmark(root, name, count) for name, count in sizes.problems.items())
    sampling = Sampling(**PROTOCOL)
    options = EvalOptions(ref="bench", scorer="dapo", db=db)
    ckpt_steps = [sizes.steps * (i + 1) // sizes.checkpoints for i in range(sizes.checkpoints)]
    rng = random.Random(0)
    start, cpu = time.perf_counter(), time.process_time()
    metric_rows = samples = 0
    for s in range(sweeps):
        sweep = f"s{s:02d}"
        plans = []
        for i in range(sizes.runs):
            method, seed = i % len(METHODS), i // len(METHODS)
            run_id = hashlib.sha256(f"{sweep}/{i}".encode()).hexdigest()[:16]
            run_dir = root / "runs" / sweep / run_id
            plans.append(
                RunPlan(run_id, f"{sweep}-run{i}", sweep, "verl", run_spec(method, seed, s), run_dir, ["true"])
            )
        store.record_plans(plans)
        for i, plan in enumerate(plans):
            rundir.make_run_dir(plan.run_dir)
            write_metrics(rundir.metrics_path(plan.run_dir), sizes.steps, keys, rng)
            metric_rows += store.ingest_metrics(plan.id, rundir.metrics_path(plan.run_dir))
            skill = METHODS[i % len(METHODS)][2]
            for step in ckpt_steps:
                for bench in benchmarks:
                    gain = 0.2 * step / sizes.steps
                    write_scored(
                        rundir.eval_scored_path(plan.run_dir, step, bench.name),
                        bench.name,
                        bench.problems,
                        skill,
                        gain,
                        rng,
                    )
            target = Target(
                plan.id,
                plan.name,
                sweep,
                plan.run_dir,
                plan.spec,
                tuple(Checkpoint(step, plan.run_dir / "checkpoints" / f"global_step_{step}") for step in ckpt_steps),
                sampling,
                known=True,
            )
            incomplete = finish_eval(store, EvalPlan(options, (target,), benchmarks), ScoredFeed())
            if incomplete:
                raise RuntimeError(f"{plan.name}: {len(incomplete)} evaluations not stored whole")
            samples += len(ckpt_steps) * sum(len(b.problems) for b in benchmarks) * SAMPLES
            store.set_status(plan.id, "succeeded")
            shutil.rmtree(plan.run_dir / rundir.EVAL_DIR)  # the store holds them now: the disk stays small
    store.close()
    return {
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - start,
        "metric_rows": metric_rows,
        "samples": samples,
        "db_bytes": (root / "results.db").stat().st_size,
    }


def store_at(work: Path, name: str, sweeps: int, sizes: Sizes) -> tuple[Path, dict[str, float] | None]:
    """`work/name`, built unless it holds a store of these sizes already (then None: nothing was built)."""
    root = work / name
    stamp = root / "sizes.json"
    wanted = {"sweeps": sweeps, **asdict(sizes)}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return root, None
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    built = build_store(root, sweeps, sizes)
    stamp.write_text(json.dumps(wanted))
    return root, built


# ------------------------------------------------------------------------------------------- timing


class CommandFailed(Exception):
    """A command exited non-zero; the message is its last line of output."""


def rpg_command() -> list[str]:
    script = Path(sys.executable).parent / "rpg"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rpg_cli"]


def timed(argv: list[str], cwd: Path, repeat: int, fresh: Path) -> tuple[float, float]:
    """(CPU, wall) seconds of `argv`, each the median of `repeat` runs in a fresh process, each run with
    `fresh` removed first (an export again would add nothing)."""
    cpus, walls = [], []
    for _ in range(repeat):
        shutil.rmtree(fresh, ignore_errors=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if out.returncode != 0:
            lines = (out.stderr or out.stdout).strip().splitlines()
            raise CommandFailed(f"exit {out.returncode}: {lines[-1] if lines else 'no output'}")
    return statistics.median(cpus), statistics.median(walls)


def time_commands(root: Path, repeat: int) -> dict[str, tuple[float, float] | str]:
    """Every command on the store under `root`: (CPU, wall) seconds, or why it failed."""
    db = f"sqlite:///{root / 'results.db'}"
    results: dict[str, tuple[float, float] | str] = {}
    for label, args in commands(root / "plots", root / "tensorboard").items():
        argv = rpg_command() + args + ["--db", db]
        if args[0] in ("runs", "export"):
            argv += ["--runs-dir", str(root / "runs")]
        try:
            results[label] = timed(argv, root, repeat, fresh=root / "tensorboard")
        except CommandFailed as exc:
            results[label] = str(exc)
        print(f"  {label}: {_cell(results[label])}", file=sys.stderr, flush=True)
    return results


def _cell(result: tuple[float, float] | str) -> str:
    return "FAILED" if isinstance(result, str) else f"{result[0]:7.2f} {result[1]:7.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8 if QUICK else 32, help="runs per sweep")
    parser.add_argument("--sweeps", type=int, default=10, help="sweeps in the large store (the small: one)")
    parser.add_argument("--steps", type=int, default=20 if QUICK else 200, help="training steps per run")
    parser.add_argument("--checkpoints", type=int, default=2 if QUICK else 10, help="evaluated per run")
    parser.add_argument("--repeat", type=int, default=1 if QUICK else 3, help="runs per command (median)")
    parser.add_argument("--work", type=Path, help="keep the stores here and reuse them (default: a temporary dir)")
    args = parser.parse_args()
    problems = {name: 3 for name in BENCHMARKS} if QUICK else dict(BENCHMARKS)
    sizes = Sizes(args.runs, args.steps, args.checkpoints, problems)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    failed = False
    try:
        timings, labels = {}, {}
        for name, sweeps in (("small", 1), ("large", args.sweeps)):
            labels[name] = sizes.label(sweeps)
            print(f"{name} store: {labels[name]}", flush=True)
            root, built = store_at(work.absolute(), name, sweeps, sizes)
            if built is None:
                print(f"  reused {root}", flush=True)
            else:
                print(
                    f"  built in {built['wall_s']:.0f} s wall, {built['cpu_s']:.0f} s CPU: {built['samples']:,} samples "
                    f"({built['samples'] / built['cpu_s']:,.0f}/s CPU with their metrics), "
                    f"{built['metric_rows']:,} metric rows; {built['db_bytes'] / 2**20:,.0f} MiB",
                    flush=True,
                )
            timings[name] = time_commands(root, args.repeat)
        print(f"\nCPU and wall seconds, median of {args.repeat}; ratio: large / small CPU")
        print(f"{'command':<46}{'small cpu':>10}{'wall':>8}{'large cpu':>11}{'wall':>8}{'ratio':>8}")
        for label in timings["small"]:
            small, large = timings["small"][label], timings["large"][label]
            failed |= isinstance(small, str) or isinstance(large, str)
            ratio = (
                f"{large[0] / small[0]:7.2f}x"
                if not isinstance(small, str) and not isinstance(large, str)
                else "    n/a"
            )
            print(f"{label:<46}{_cell(small):>18}{_cell(large):>19}{ratio:>8}")
            for name, result in (("small", small), ("large", large)):
                if isinstance(result, str):
                    print(f"  {name}: {result}")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
