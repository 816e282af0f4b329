"""The backends' registry: each backend's one entry, the interface its launch module declares, lookup by name.

A backend is a package whose `launch` module gives what `Backend` declares, and one line in `BACKENDS` (name ->
that module, imported on first use). Everything above asks a backend through here: the spec's `backend` field
takes the registered names (`registered`), the CLI's `--backend` likewise, orchestration plans, checks and submits
through `get`, `rpg slurm` sizes an allocation with `node_cpus` and `run_mem_mb`, the trackers ask `writes_trackers`.

Imports nothing of the project and no backend until asked (`rpg --help` and `rpg sweep --dry-run` stay light): the
spec (the floor below) and trackers/runs.py read it, an arrow up by design (ARCHITECTURE.md), as the trackers'
registry is read by the spec.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any, Protocol

# The registry: a backend is its launch module and its line here.
BACKENDS: dict[str, str] = {
    "verl": "rpg_cli.backends.verl.launch",
    "local": "rpg_cli.backends.local.launch",
}

NODE_BACKEND = "verl"  # the backend a GPU node is for: `rpg doctor` checks a node for it without a sweep


class UnknownBackend(LookupError):
    """A name `BACKENDS` does not hold; one line naming the allowed ones."""


class Backend(Protocol):
    """What a backend's launch module gives. Required: `entrypoint`, `resources`, `env`. Optional, asked with
    `getattr` and a default (orchestration/plan.py, sweep.py, preflight.py, doctor.py):

        preflight(spec) -> [Finding]          what can be checked of a run before a GPU is paid for (the dry run
                                              shows it, a real submission refuses a sweep with an error)
        footprint(spec) -> {name: number}     the dry run's figures: gpu_memory_gib, disk_gb, disk_peak_gb (None:
                                              unknown)
        check_install({run name: entrypoint}) RuntimeError (one line) before any submission
        check_configs({run name: entrypoint}) what check_install checks, as verdicts (`--dry-run --check`)
        check_node([(entrypoint, env)])       this machine as a node of these runs (`rpg doctor`): dicts of
                                              status, name, ok, needed, detail, fix
        check_cluster(client, [(entrypoint, env)])
                                              the cluster's nodes checked through the Jobs API client, once per
                                              sweep; RuntimeError (one line) if one lacks what a run needs
        failure_reason(log_tail) -> str       one line for a failed job (default: its last error)

    and the facts below, read through this module's functions with their defaults (`node_cpus`, `run_mem_mb`,
    `writes_trackers`), so a backend states only what differs."""

    # (CPUs per GPU, CPUs beside them) one run needs on each node (`rpg slurm`); None: the entrypoint's CPUs
    NODE_CPUS: tuple[int, int] | None
    # MB of a node's memory one run needs (`rpg slurm --mem`'s default); None: the whole node
    RUN_MEM_MB: int | None
    # True: the job reports to the spec's trackers itself, with rpg's writers (rpg_cli.trackers.writers) and the
    # packages of the environment rpg runs in (checked at plan time); False: its trainer does, from what `env` gives
    WRITES_TRACKERS: bool

    def entrypoint(self, spec: Any, run_dir: Path) -> list[str]:
        """The job's command, an argument list (never a shell string)."""

    def resources(self, spec: Any) -> tuple[float, float]:
        """(CPUs, GPUs) the job's entrypoint reserves."""

    def env(self, spec: Any, run_dir: Path) -> dict[str, str]:
        """The job's runtime_env env vars (never a credential)."""


def backend_names() -> list[str]:
    """The registered backends, in the registry's order: the spec's and the CLI's choices."""
    return list(BACKENDS)


def allowed() -> str:
    """The registered names for a one-line error: `verl, local`."""
    return ", ".join(BACKENDS)


def registered(name: Any) -> str:
    """`name` if a backend is registered under it, read when it is asked (the spec's `backend` field: one registered
    after the spec was imported is taken); else ValueError with the words a Literal of the names would give."""
    names = backend_names()
    if isinstance(name, str) and name in names:
        return name
    expected = " or ".join(filter(None, [", ".join(map(repr, names[:-1])), repr(names[-1])]))
    raise ValueError(f"got {name!r}; allowed: {expected}")


def get(name: str) -> Backend:
    """The backend's launch module, imported on first use; UnknownBackend (one line) for a name not registered."""
    if name not in BACKENDS:
        raise UnknownBackend(f"unknown backend {name!r}; allowed: {allowed()}")
    return importlib.import_module(BACKENDS[name])


def node_cpus_rule(name: str) -> tuple[int, int] | None:
    """(CPUs per GPU, CPUs beside them) a run of backend `name` needs on each node; None: its entrypoint's CPUs."""
    return getattr(get(name), "NODE_CPUS", None)


def node_cpus(name: str, gpus_per_node: int, num_cpus: float) -> int:
    """The CPUs one run of backend `name` needs on each of its nodes: NODE_CPUS's rule, else its entrypoint's."""
    rule = node_cpus_rule(name)
    return rule[0] * gpus_per_node + rule[1] if rule else math.ceil(num_cpus)


def run_mem_mb(name: str) -> int | None:
    """MB of a node's memory one run of backend `name` needs; None: the whole node (the default)."""
    return getattr(get(name), "RUN_MEM_MB", None)


def writes_trackers(name: str) -> bool:
    """Whether a run of backend `name` reports to its trackers itself, with rpg's writers (default: no)."""
    return bool(getattr(get(name), "WRITES_TRACKERS", False))
