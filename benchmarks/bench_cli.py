"""How fast the command line answers, and that it stays light.

Wall time (best of 5, fresh process each) of `rpg --help` and of `rpg sweep --dry-run` on the paper
grids against a 0.5 s target, with the CPU time of the best run beside it (wall time moves with the
machine's load; CPU time much less), and a check (`python -X importtime`) that none imports torch, ray,
verl, transformers or SQLAlchemy (tests/test_layout.py's rule) -- nor pandas, which costs the dry run
about 0.3 s (pq.read_table goes through pyarrow.dataset, which imports it): printed, not a failure. The
dry runs run where the grids' data files exist (written to a temporary directory as `rpg prepare-data`
writes them: the training file holds as many rows as the largest batch, each evaluation file 30
problems, under the presets' data_source names), so they read every file's footer and pass every check,
as they do for a user who prepared the data. The first run reads the files with pyarrow (column "first");
the timed ones find what it read in rpg's cache of file facts (`rpg_cli/file_facts.py`, kept in the work
directory here), as a researcher re-planning a grid against the same files does.

Exit status 1 when a command fails or a heavy package is imported (timings vary with the machine's
load: printed against their target, not asserted). BENCH_QUICK=1: one timed run each.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rpg_cli.file_facts import CACHE_ENV

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 0.5
QUICK = os.environ.get("BENCH_QUICK") == "1"
REPEATS = 1 if QUICK else 5
HEAVY = ("torch", "ray", "verl", "transformers", "sqlalchemy")  # tests/test_layout.py's: never at --help or --dry-run
SLOW = ("pandas",)  # allowed, but ~0.3 s of the 0.5 s target
VAL_PROBLEMS = 30  # an AIME file's size
COMMANDS = {
    "rpg --help": ["--help"],
    "rpg sweep <7B grid> --dry-run": ["sweep", "experiments/paper-qwen25-7b-instruct.yaml", "--dry-run"],
    "rpg sweep <Qwen3-4B grid> --dry-run": ["sweep", "experiments/paper-qwen3-4b.yaml", "--dry-run"],
}


def rpg_command() -> list[str]:
    script = Path(sys.executable).parent / "rpg"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rpg_cli"]


def workdir() -> Path:
    """A directory with the shipped grids and the data files they name, shaped as prepare-data writes them:
    the training files hold the largest batch's rows (the dry run refuses fewer), the rest VAL_PROBLEMS."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rpg_cli.datasets import VERL_SCHEMA, verl_row
    from rpg_cli.datasets.sources import PRESETS
    from rpg_cli.spec import load_sweep

    root = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    shutil.copytree(REPO / "experiments", root / "experiments")
    source = {preset.filename: preset.data_source for preset in PRESETS.values()}
    rows: dict[str, int] = {}
    for sweep_file in (root / "experiments").glob("paper-*.yaml"):
        for spec in load_sweep(sweep_file).expand():
            for name in spec.data.val_files:
                rows[name] = max(rows.get(name, 0), VAL_PROBLEMS)
            for name in spec.data.train_files:  # max: a file both trains and validates somewhere
                rows[name] = max(rows.get(name, 0), spec.train_batch_size)
    for name, n in rows.items():
        data_source = source.get(Path(name).name, Path(name).stem)
        table = pa.Table.from_pylist(
            [verl_row(f"What is {i} + 1?", str(i + 1), data_source, i) for i in range(n)], schema=VERL_SCHEMA
        )
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / name)
    return root


class CommandFailed(Exception):
    """A command of the benchmark exited non-zero; the message is its last line of output."""


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # what the dry run read from the data files is remembered in the work directory, not the user's cache
    env = {**os.environ, CACHE_ENV: str(cwd / "cache")}
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        raise CommandFailed(f"exit {out.returncode}: {lines[-1] if lines else 'no output'}")
    return out


def best_time(argv: list[str], cwd: Path) -> tuple[float, float, float]:
    """Wall seconds of the first run (it reads the data files), and (wall, CPU) of the fastest of REPEATS after."""
    start = time.perf_counter()
    run(argv, cwd)  # the first: the OS's file cache, and rpg's (file_facts), filled
    first = time.perf_counter() - start
    runs = []
    for _ in range(REPEATS):
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        run(argv, cwd)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append((wall, after.ru_utime - cpu.ru_utime + after.ru_stime - cpu.ru_stime))
    return (first, *min(runs))


def imported(args: list[str], cwd: Path) -> list[str]:
    """The HEAVY and SLOW packages `rpg ARGS` imports (python -X importtime)."""
    out = run([sys.executable, "-X", "importtime", "-m", "rpg_cli", *args], cwd)
    modules = {
        line.rsplit("|", 1)[-1].strip().split(".")[0]
        for line in out.stderr.splitlines()
        if line.startswith("import time:")
    }
    return sorted(m for m in (*HEAVY, *SLOW) if m in modules)


def main() -> int:
    rpg = rpg_command()
    if QUICK:
        print("BENCH_QUICK=1: one timed run each; timings are printed, not judged (imports are)")
    cwd = workdir()
    print(
        f"{'command':38} {'first':>7} {f'best of {REPEATS}':>10} {'cpu':>7} {'target':>8} {'ratio':>7}  result   "
        "imports (heavy: fail)"
    )
    failed = False
    try:
        for label, args in COMMANDS.items():
            try:
                first, seconds, cpu = best_time(rpg + args, cwd)
                found = imported(args, cwd)
            except CommandFailed as exc:
                print(f"{label:38} FAILED {exc}")
                failed = True
                continue
            heavy = [m for m in found if m in HEAVY]
            failed |= bool(heavy)
            verdict = "PASS" if seconds < TARGET_S else "FAIL"
            shown = ", ".join(f"{m} (heavy)" if m in HEAVY else m for m in found) if found else "none"
            print(
                f"{label:38} {first:6.3f}s {seconds:9.3f}s {cpu:6.3f}s {TARGET_S:7.1f}s {seconds / TARGET_S:7.2f}  {verdict:7}  "
                f"{shown}"
            )
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
