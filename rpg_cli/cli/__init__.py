"""The `rpg` command line: parse, call one function, render. No logic lives here.

Heavy packages (torch, ray, verl, transformers, SQLAlchemy) are imported inside the commands that need
them, so that `rpg --help` and `rpg sweep --dry-run` answer at once.

    common    the app, the command decorator, one-line messages, the store opener, reconciliation
    data      prepare-data          sweep     sweep (plan, submit, live view)
    slurm     slurm (a sweep as one Slurm job)
    evaluate  eval                  report    report, compare
    runs      runs, logs, cancel, stop        export    export
    doctor    doctor (this node, the shared paths, a sweep's inputs, the cluster)
"""

# isort: skip_file
from __future__ import annotations

from rpg_cli.cli.common import app

# each module registers its commands on `app`: imported in the order `rpg --help` lists them
from rpg_cli.cli import doctor, data, check_loss, sweep, slurm, evaluate, report, runs, export  # noqa: F401

__all__ = ["app", "main"]


def main() -> None:
    """The `rpg` executable: the app, then every object the process holds frozen out of the garbage collector.
    The interpreter's exit otherwise walks them all in its collections (what numpy, SQLAlchemy and SciPy left
    behind: 0.2-0.3 s of `rpg report`); files, stores and Ray are closed before, by their owners and atexit."""
    import gc

    try:
        app(prog_name="rpg")
    finally:
        gc.freeze()
