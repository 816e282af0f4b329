"""A run as the orchestrator sees it: what to start, where, with which resources.

`RunPlan` is the hand-off between the spec side (spec.py expands a sweep into plans) and the
execution side (jobs.py submits them, store.py records them). Pure Python: no torch, ray or verl.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpg_cli.spec import ExperimentSpec, SweepSpec


@dataclass(frozen=True)
class RunPlan:
    id: str  # stable short hash of the canonical spec; also the Ray submission id
    name: str  # readable: rpg_reinforce-urkl-clip0.2_0.28-adamw-4k-s0-1a2b3c
    sweep: str  # the sweep's name
    backend: str  # "verl" | "local"
    spec: dict[str, Any]  # the canonical spec (JSON-serialisable), as written to spec.json
    run_dir: Path  # runs/<sweep>/<name>/
    entrypoint: list[str]  # the exact command the job runs, as an argument list (never a shell string)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    env: dict[str, str] = field(default_factory=dict)  # runtime_env env_vars


# What a sweep run does with a run, by the state the store has for it ("new": never recorded).
SUBMIT, ATTACH, DONE, SKIP = "submit", "attach", "done", "skip"


def run_action(state: str, retry_failed: bool = False) -> str:
    """Succeeded runs are never resubmitted; live ones are re-attached; failed ones need --retry-failed."""
    if state in ("succeeded",):
        return DONE
    if state in ("pending", "submitted", "running"):
        return ATTACH
    if state in ("failed", "stopped"):
        return SUBMIT if retry_failed else SKIP
    return SUBMIT


def plan_run(spec: ExperimentSpec, run_dir: Path, sweep: str) -> RunPlan:
    """The plan of one run; its backend's `launch` module supplies the command, the resources the
    entrypoint reserves (a verl driver reserves no GPU: its Ray workers take them) and the env vars."""
    launch = importlib.import_module(f"rpg_cli.backends.{spec.backend}.launch")
    run_dir = Path(run_dir).absolute()
    num_cpus, num_gpus = launch.resources(spec)
    return RunPlan(
        id=spec.run_id,
        name=spec.run_name,
        sweep=sweep,
        backend=spec.backend,
        spec=spec.canonical(),
        run_dir=run_dir,
        entrypoint=list(launch.entrypoint(spec, run_dir)),
        num_cpus=float(num_cpus),
        num_gpus=float(num_gpus),
        env=dict(launch.env(spec, run_dir)),
    )


def plan_sweep(sweep: SweepSpec, runs_root: Path, backend: str | None = None) -> list[RunPlan]:
    """One plan per distinct cell, run directories at `<runs_root>/<sweep>/<run name>/` (absolute).

    Pure: computes paths and commands, touches nothing on disk. `backend` overrides the spec's.
    """
    from rpg_cli.trackers import plan_trackers

    root = Path(runs_root).absolute()
    specs = plan_trackers(sweep.expand(backend), sweep.name, root)  # group, tags and defaults, for spec.json
    return [plan_run(spec, root / sweep.name / spec.run_name, sweep.name) for spec in specs]


def write_spec(plan: RunPlan) -> Path:
    """Write `<run_dir>/spec.json` atomically (temp file + rename); returns its path."""
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    path = plan.run_dir / "spec.json"
    tmp = path.with_name(f".spec.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(plan.spec, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def known_states(db_url: str, ids: list[str]) -> dict[str, str]:
    """State of each run id in the results store, "new" where it has none.

    Reads only: a SQLite database that does not exist yet is not created (every run is new), and
    the store module (SQLAlchemy) is imported only when there is something to read.
    """
    states = dict.fromkeys(ids, "new")
    db_file = sqlite_file(db_url)
    if db_file is not None and not db_file.exists():
        return states
    if db_url.startswith("sqlite") and db_file is None:
        return states  # in-memory database: nothing recorded
    try:
        from rpg_cli.store import run_states
    except ImportError:
        return states
    states.update(run_states(db_url, ids))
    return states


def sqlite_file(db_url: str) -> Path | None:
    """The file behind a `sqlite:///path` URL (None for other databases and in-memory SQLite)."""
    if not db_url.startswith("sqlite"):
        return None
    _, _, rest = db_url.partition(":///")
    rest = rest.split("?", 1)[0]
    if not rest or rest == ":memory:":
        return None
    return Path(rest)
