"""Trackers: a run's metrics where researchers already look (W&B, TensorBoard, MLflow).

The spec's `trackers` block (rpg_cli.spec.Trackers) says where metrics are reported, never what a run
computes, so it is not part of the run id. Three ways in, one identity:

    its trainer      a backend that does not write them itself (WRITES_TRACKERS False, rpg_cli.backends.registry):
                     its trainer's loggers, set up by the env vars its library reads (`Tracker.library_env`; verl's
                     tracking.py through backends/verl/launch.py)
    rpg's writers    a backend whose job writes them (the local one): `writers.open_run(...).log(step, metrics)`
                     next to each metrics.jsonl line
    rpg export       what the store holds, for runs that were not tracked live (rpg_cli.trackers.export)

One run, one tracked run: W&B run id `rpg-<run id>`, resumed, never duplicated; the MLflow run with tag
`rpg.run_id`; the TensorBoard log dir `<dir>/<sweep>/<run name>`. Grouping: the *group* is the run's
cell (its spec less the seed), so W&B's and MLflow's grouping draw one band over a cell's seeds; the
sweep is the W&B job type and a tag `sweep=<name>` (W&B's "group by job type", MLflow's tag `rpg.sweep`),
and the tags are the values of the fields the sweep varies (`algorithm=rpg`, `clip.eps_high=0.28`).

One module per tracker (wandb.py, tensorboard.py, mlflow.py), each a `base.Tracker` with its settings
model (the spec's `trackers.<name>`): its library and credential variables (the preflight), its defaults
(`resolve`), its library's env vars (`library_env`), its live writer and its export. `TRACKERS`, here, registers
them; the spec's `Trackers` block has one field per entry. The rest is generic: `runs` (which trackers a run has,
plan-time checks, identity and grouping, resolved settings), `writers`
(the local backend's live reporting), `export` (`rpg export`). A new tracker: its module and its line
in `TRACKERS` (and its library's extra in pyproject.toml).

This module imports no spec (the spec imports it) and no tracker library, so `rpg sweep --dry-run`
stays fast. Credentials (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN/PASSWORD) are read by the libraries from
the environment of the process that reports; rpg never reads, passes or writes them. A job's
environment is its Ray head's: a credential exported after rpg started its local head is missing there,
which `runs.credentials_missing_on_head` says before anything is submitted.
"""

from __future__ import annotations

from rpg_cli.trackers import mlflow, tensorboard, wandb
from rpg_cli.trackers.base import Tracker, TrackerError

__all__ = ["TRACKERS", "Tracker", "TrackerError"]

# The registry: a tracker is its module (rpg_cli/trackers/<name>.py, a `Tracker` and its settings model)
# and its line here.
TRACKERS: dict[str, Tracker] = {t.name: t for t in (wandb.TRACKER, tensorboard.TRACKER, mlflow.TRACKER)}
