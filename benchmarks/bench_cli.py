"""How fast the command line answers, and that it stays light.

Wall time (best of 5, fresh process each) of `rpg --help` and of `rpg sweep --dry-run` on the paper
grids against a 0.5 s target, with the CPU time of the best run beside it (wall time moves with the
machine's load; CPU time much less), and a check (`python -X importtime`) that none imports torch, ray,
verl or transformers. The dry runs run where the grids' data files exist (one row each, written to a
temporary directory), so they read every file's footer, as they do for a user who prepared the data.
Exit status 1 only when a heavy package is imported (timings vary with the machine's load).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 0.5
REPEATS = 5
HEAVY = ("torch", "ray", "verl", "transformers")
COMMANDS = {
    "rpg --help": ["--help"],
    "rpg sweep <7B grid> --dry-run": ["sweep", "experiments/paper-qwen25-7b-instruct.yaml", "--dry-run"],
    "rpg sweep <Qwen3-4B grid> --dry-run": ["sweep", "experiments/paper-qwen3-4b.yaml", "--dry-run"],
}


def rpg_command() -> list[str]:
    script = Path(sys.executable).parent / "rpg"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rpg_cli"]


def workdir() -> Path:
    """A directory with the shipped grids and the data files they name (one verl row each)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rpg_cli.datasets import VERL_SCHEMA, verl_row
    from rpg_cli.spec import load_sweep

    root = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    shutil.copytree(REPO / "experiments", root / "experiments")
    for sweep_file in (root / "experiments").glob("paper-*.yaml"):
        for spec in load_sweep(sweep_file).expand():
            for name in (*spec.data.train_files, *spec.data.val_files):
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(
                    pa.Table.from_pylist([verl_row("1+1?", "2", "bench", 0)], schema=VERL_SCHEMA), root / name
                )
    return root


def best_time(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of the fastest of REPEATS runs."""
    subprocess.run(argv, cwd=cwd, capture_output=True, check=True)  # warm the file cache
    runs = []
    for _ in range(REPEATS):
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, capture_output=True, check=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append((wall, after.ru_utime - cpu.ru_utime + after.ru_stime - cpu.ru_stime))
    return min(runs)


def heavy_imports(args: list[str], cwd: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rpg_cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    modules = {
        line.rsplit("|", 1)[-1].strip().split(".")[0]
        for line in out.stderr.splitlines()
        if line.startswith("import time:")
    }
    return sorted(m for m in HEAVY if m in modules)


def main() -> int:
    rpg = rpg_command()
    cwd = workdir()
    print(f"{'command':38} {'best of 5':>10} {'cpu':>7} {'target':>8} {'ratio':>7}  result   heavy imports")
    failed_imports = False
    try:
        for label, args in COMMANDS.items():
            seconds, cpu = best_time(rpg + args, cwd)
            heavy = heavy_imports(args, cwd)
            failed_imports |= bool(heavy)
            verdict = "PASS" if seconds < TARGET_S else "FAIL"
            print(
                f"{label:38} {seconds:9.3f}s {cpu:6.3f}s {TARGET_S:7.1f}s {seconds / TARGET_S:7.2f}  {verdict:7}  "
                f"{', '.join(heavy) if heavy else 'none (PASS)'}"
            )
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    return 1 if failed_imports else 0


if __name__ == "__main__":
    sys.exit(main())
