"""`rpg doctor`: what runs need of the machine it runs on and of the paths every node shares, checked before a
GPU is paid for; run it on every GPU node (and in a Slurm job's first step, on each node).

    this node     each backend's `check_node` (verl: backends/verl/node.py, through its launch module): Python,
                  glibc, driver, torch and CUDA, NCCL, verl and rpg's plugin, vLLM, flash-attn, transformers, Ray
    directories   the data directory, the runs directory and the Hugging Face cache: there, writable, and said
                  as absolute paths (the same path on every node)
    a sweep       with SPEC: its runs' inputs (each backend's `preflight`: data files, models, prompt lengths),
                  and the node checks only for the backends its runs use
    the cluster   with an address: the Ray cluster answers with its token; for verl runs, every GPU node is
                  checked by a Ray job as `rpg sweep` checks them before it submits (`check_cluster`)

Each check is a `Check`: `ok`, `missing` (a run cannot start without it) or `warn`. Without SPEC the node is
checked for the backend a GPU node is for (rpg_cli.backends.registry.NODE_BACKEND: verl).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpg_cli.backends import registry
from rpg_cli.inputs import hub_cache
from rpg_cli.orchestration.head import DEFAULT_RUNS_DIR, ClusterError, connect, one_line
from rpg_cli.orchestration.plan import check_plans, plan_sweep

if TYPE_CHECKING:
    from rpg_cli.orchestration.plan import RunPlan

DATA_DIR = Path("data")  # where `rpg prepare-data` writes (its --out)


@dataclass(frozen=True)
class Check:
    """One line of `rpg doctor`; the fields of a backend's node check (backends/verl/node.py's NodeCheck),
    which arrive as dicts through its launch module."""

    name: str
    ok: bool
    needed: bool  # a run cannot start without it
    detail: str
    fix: str = ""

    @property
    def status(self) -> str:
        return "ok" if self.ok else "missing" if self.needed else "warn"

    def line(self) -> str:
        """`status  name: detail`, and `; fix` when it is not ok."""
        fix = f"; {self.fix}" if self.fix and not self.ok else ""
        return f"{self.status:<8} {self.name}: {self.detail}{fix}"

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, **asdict(self)}

    @classmethod
    def of(cls, record: dict[str, Any]) -> Check:
        return cls(record["name"], record["ok"], record["needed"], record["detail"], record.get("fix", ""))


def doctor(
    spec: str | None = None, runs_dir: Path = DEFAULT_RUNS_DIR, address: str | None = None, backend: str | None = None
) -> list[Check]:
    """Every check, in the order a node is set up: the node, the shared directories, the sweep's inputs, the
    cluster. `spec`: a sweep YAML (SpecError, one line, when it is not one); `address`: a Ray cluster to reach
    (default $RAY_ADDRESS; none: no cluster is checked); `backend`: the sweep's runs on this backend."""
    from rpg_cli.spec import load_sweep

    plans = plan_sweep(load_sweep(spec), runs_dir, backend=backend) if spec else []
    backends = list(dict.fromkeys(p.backend for p in plans)) if spec else [registry.NODE_BACKEND]
    found: list[Check] = []
    for name in backends:
        check_node = getattr(registry.get(name), "check_node", None)
        if check_node is not None:
            found += [Check.of(r) for r in check_node(_runs(plans, name))]
    found += directories(plans, runs_dir)
    found += inputs(plans)
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        found += cluster(address, runs_dir, {name: _runs(plans, name) for name in backends})
    return found


def failed(checks: list[Check]) -> bool:
    """Whether a run would lack something it needs (`rpg doctor` exits 1)."""
    return any(c.status == "missing" for c in checks)


def _runs(plans: list[RunPlan], backend: str) -> list[tuple[list[str], dict[str, str]]]:
    return [(p.entrypoint, p.env) for p in plans if p.backend == backend]


# ------------------------------------------------------------------------------------------ directories


def directories(plans: list[RunPlan], runs_dir: Path) -> list[Check]:
    """The data directories (the sweep's, else `data/`), the runs directory and the Hugging Face cache."""
    files = [f for p in plans for f in [*p.spec["data"]["train_files"], *p.spec["data"]["val_files"]] if "://" not in f]
    data_dirs = list(dict.fromkeys(Path(f).expanduser().absolute().parent for f in files)) or [DATA_DIR]
    found = [
        _directory("data dir", d, needed=bool(plans), what="`rpg prepare-data` writes it; jobs read it", writes=False)
        for d in data_dirs
    ]
    found.append(_directory("runs dir", Path(runs_dir), needed=True, what="`rpg sweep` creates it", writes=True))
    found.append(_directory("HF cache", hub_cache(), needed=False, what="created on the first download", writes=True))
    return found


def _directory(name: str, path: Path, needed: bool, what: str, writes: bool) -> Check:
    """A directory every node must see at the same absolute path: there and writable (or creatable)."""
    where = Path(path).expanduser().absolute()
    same = "the same path on every node"
    if where.is_dir():
        if os.access(where, os.W_OK | os.X_OK):
            return Check(name, True, needed, f"{where} is writable ({same})")
        return Check(
            name,
            False,
            needed and writes,
            f"{where} is not writable by you",
            f"chmod u+w {where}, or use another path ({same})",
        )
    if where.exists():
        return Check(name, False, needed, f"{where} is not a directory", f"remove it or use another path ({same})")
    parent = next((a for a in where.parents if a.exists()), None)
    if parent is not None and writes and os.access(parent, os.W_OK | os.X_OK):
        return Check(name, True, needed, f"{where} does not exist yet ({what}; {same})")
    return Check(
        name,
        False,
        needed,
        f"{where} does not exist ({what})",
        f"create it on the shared filesystem ({same})",
    )


# ------------------------------------------------------------------------------------------------ inputs


def inputs(plans: list[RunPlan]) -> list[Check]:
    """The sweep's inputs as each backend's preflight finds them (data files, models, prompt lengths): an error
    is missing, a note a warning."""
    found = []
    for check in check_plans(plans):
        finding = check.finding
        runs = (
            "" if len(check.runs) == len(plans) else f" ({', '.join(check.runs[:2])}{', ...' * (len(check.runs) > 2)})"
        )
        found.append(Check(finding.field, False, finding.error, f"{finding.message}{runs}"))
    said = [c.detail for c in found if c.name == "model"]
    present = [m for m in dict.fromkeys(p.spec["model"] for p in plans) if not any(m in text for text in said)]
    if present:
        found.append(Check("model", True, True, f"{', '.join(present)} present here"))
    return found


# ----------------------------------------------------------------------------------------------- cluster


def cluster(address: str, runs_dir: Path, runs: dict[str, list[tuple[list[str], dict[str, str]]]]) -> list[Check]:
    """The Ray cluster at `address` answers with its token (its jobs are listed), and each backend's
    `check_cluster` of its nodes for `runs` (backend -> (entrypoint, env) of each run)."""
    try:
        client = connect(address, runs_dir, start=False)
        jobs = client.list_jobs()
    except (ClusterError, OSError, RuntimeError, ValueError) as exc:
        return [
            Check(
                "Ray cluster",
                False,
                True,
                f"{address} does not answer ({one_line(exc)})",
                "check --address and the cluster's token (RAY_AUTH_TOKEN_PATH), README: Start Ray",
            )
        ]
    found = [Check("Ray cluster", True, True, f"{address} answers ({len(jobs)} jobs)")]
    for backend, backend_runs in runs.items():
        check_cluster = getattr(registry.get(backend), "check_cluster", None)
        if check_cluster is None:
            continue
        try:
            check_cluster(client, backend_runs)
        except RuntimeError as exc:
            found.append(Check("GPU nodes", False, True, str(exc)))
        else:
            found.append(Check("GPU nodes", True, True, "every GPU node of the cluster has what the runs need"))
    return found
