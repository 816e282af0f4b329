"""What one exported metric value costs, per tracker: `rpg export`'s bulk writer against a live run's.

The same history (--steps steps x --keys metrics, as a verl run logs them) goes through each tracker's
writer twice, on this machine, with no server: TensorBoard's export (`tensorboard.EventFile`: one event a
step, straight into the file) against the live writer (torch's SummaryWriter, one event a value); MLflow's
export into a SQLite tracking store (`MlflowWriter(batched=True)`: MLFLOW_METRICS_PER_BATCH values a
`log_batch`) against the live writer (one `log_batch` a step); W&B offline, whose only history API is one
`log` a step, so its export and live writer are one and the same (printed without a ratio).

Target: an export at least 10x faster per value than the live writer (issue 34). TensorBoard's meets it;
MLflow's store spends ~180 us a value inside its ORM whatever the batch (mlflow.store.tracking
.sqlalchemy_store: one object per value, then the latest-value update), which bounds its ratio; printed,
not asserted (the machine's load moves it). Wall seconds per value, best of --repeat, with this process's
CPU beside (W&B's writing happens in its service process: its CPU is not this process's).

    python benchmarks/bench_export.py [--steps 400] [--keys 25] [--repeat 3]

BENCH_QUICK=1: 20 steps, one round.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from rpg_cli.trackers.base import RunInfo

QUICK = os.environ.get("BENCH_QUICK") == "1"
TARGET = 10.0


def history(steps: int, keys: int) -> dict[int, dict[str, float]]:
    return {s: {f"actor/metric_{k:02d}": (s * 31 + k) % 97 / 97 for k in range(keys)} for s in range(1, steps + 1)}


def info(root: Path, tracker: str) -> RunInfo:
    """A run of sweep `bench` tracked by `tracker` under `root` (its trackers block: the fields the writers read)."""
    trackers = SimpleNamespace(
        project="bench",
        group="bench",
        tags=("bench",),
        mlflow=SimpleNamespace(tracking_uri=f"sqlite:///{root / 'mlflow.db'}") if tracker == "mlflow" else None,
        wandb=SimpleNamespace(entity=None, mode="offline") if tracker == "wandb" else None,
    )
    return RunInfo(f"bench-{time.time_ns()}", "run", "bench", {"lr": 1e-6}, trackers, root)


def per_value(make_writer: Callable[[Path], object], steps: dict, repeat: int) -> tuple[float, float]:
    """(wall, CPU) seconds per value of writing `steps` and closing a fresh writer (opening it not counted),
    of the fastest of `repeat` rounds."""
    from rpg_cli.trackers.base import write

    values = sum(len(v) for v in steps.values())
    rounds = []
    for _ in range(repeat):
        root = Path(tempfile.mkdtemp(prefix="bench-export-"))
        try:
            writer = make_writer(root)
            wall, cpu = time.perf_counter(), time.process_time()
            write(writer, steps, {})
            rounds.append(((time.perf_counter() - wall) / values, (time.process_time() - cpu) / values))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return min(rounds)


def writers() -> dict[str, tuple[Callable[[Path], object], Callable[[Path], object] | None]]:
    """Per tracker whose library is installed: (export's writer, live writer or None when they are one)."""
    out: dict[str, tuple[Callable[[Path], object], Callable[[Path], object] | None]] = {}
    if importlib.util.find_spec("tensorboard") and importlib.util.find_spec("torch"):
        from rpg_cli.trackers.tensorboard import EventFile, TensorBoardWriter

        out["tensorboard"] = (lambda root: EventFile(root / "tb"), lambda root: TensorBoardWriter(root / "tb"))
    if importlib.util.find_spec("mlflow"):
        from rpg_cli.trackers.mlflow import MlflowWriter

        out["mlflow (SQLite)"] = (
            lambda root: MlflowWriter(info(root, "mlflow"), batched=True),
            lambda root: MlflowWriter(info(root, "mlflow"), batched=False),
        )
    if importlib.util.find_spec("wandb"):
        from rpg_cli.trackers.wandb import WandbWriter

        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
        out["wandb (offline)"] = (lambda root: WandbWriter(info(root, "wandb"), root, quiet=True), None)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20 if QUICK else 400)
    parser.add_argument("--keys", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=1 if QUICK else 3)
    args = parser.parse_args()
    steps = history(args.steps, args.keys)
    print(
        f"{args.steps} steps x {args.keys} metrics a run; us per value (wall, and this process's CPU), best of "
        f"{args.repeat}; target: export >= {TARGET:g}x the live writer's wall time"
    )
    print(f"{'tracker':18}{'export':>8}{'cpu':>7}{'live':>8}{'cpu':>7}{'ratio':>8}  verdict")
    found = writers()
    for name, (export, live) in found.items():
        with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):  # MLflow's and W&B's start-up lines
            bulk = per_value(export, steps, args.repeat)
            before = per_value(live, steps, args.repeat) if live is not None else None
        shown = f"{name:18}{bulk[0] * 1e6:8.1f}{bulk[1] * 1e6:7.1f}"
        if before is None:
            print(f"{shown}{'-':>8}{'-':>7}{'-':>8}  one API for both (a log a step)")
            continue
        ratio = before[0] / bulk[0]
        print(
            f"{shown}{before[0] * 1e6:8.1f}{before[1] * 1e6:7.1f}{ratio:7.1f}x  {'ok' if ratio >= TARGET else 'below'}"
        )
    if not found:
        print("no tracker library installed (pip install -e '.[trackers]'): nothing measured")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
