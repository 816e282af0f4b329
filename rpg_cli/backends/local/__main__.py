"""Entry point of a local-backend job: `python -m rpg_cli.backends.local --spec RUN_DIR/spec.json`.

The run directory is the spec's directory. Rerunning the same command resumes from the newest
checkpoint there. SIGTERM or SIGUSR1 (a preemption, Slurm's warning before a time limit) stops it after
the step in progress, with a checkpoint of that step (`stop_on_signals`). It marks when it began holding its
device (`mark_held`: the run's device time). Exit status: 0 done or stopped
so, 2 the spec or machine cannot be honoured (one line on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from rpg_cli import rundir

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rpg_cli.backends.local", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the run's spec.json; its directory is the run directory")
    parser.add_argument(
        "--stop-after",
        type=int,
        default=None,
        metavar="STEP",
        help="stop after this step, as if interrupted (to test or debug resuming)",
    )
    return parser.parse_args(argv)


def stop_on_signals(run_dir: Path) -> None:
    """A new attempt starts with no stop request left by the one before; from then on SIGTERM and SIGUSR1 only
    record one (rundir.request_stop, preempted), which the trainer acts on after the step in progress
    (trainer.Trainer.fit). The request is a file because the orchestrator reads it too (orchestration/stops.py).
    A request already there is kept: `rpg cancel --graceful` came first, so the run is cancelled, not preempted.
    Installed before torch is imported: a signal while it loads is a request too, not the end of the process.
    The handler prints nothing: a write to stdout while the loop prints would break the stream."""

    def request(signum, frame) -> None:
        if rundir.stop_requested(run_dir) is None:
            rundir.request_stop(run_dir, rundir.PREEMPTED)

    with contextlib.suppress(OSError):  # no run directory there: the spec check names the problem
        rundir.clear_stop_request(run_dir)
        rundir.clear_held(run_dir)  # and no mark of when the one before began holding its device
    for signum in STOP_SIGNALS:
        signal.signal(signum, request)


def mark_held(run_dir: Path) -> None:
    """The attempt holds its device from the trainer's start (no wait comes first on this backend): the mark the
    watcher records its device time from (rundir.mark_held). A mark that cannot be written costs the run its
    measured device time, not its training."""
    with contextlib.suppress(OSError):
        rundir.mark_held(run_dir)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = Path(args.spec).absolute().parent
    stop_on_signals(run_dir)
    mark_held(run_dir)
    from rpg_cli.backends.local.trainer import main as train

    return train(args.spec, stop_after=args.stop_after)


if __name__ == "__main__":
    sys.exit(main())
