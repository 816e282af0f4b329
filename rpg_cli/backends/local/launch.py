"""How a job starts the local backend: the command line only (pure python, no torch).

The command is an argument list with no shell in between, and the spec travels as a file, so no spec
value is ever parsed by a shell. "python" (not this interpreter's path) because the job runs on
whichever machine Ray picks, in its own environment. A custom loss's module (MATH.md section 11) is imported
by the job from its PYTHONPATH, which `env` leads with the module's directory: on a multi-node cluster that
directory must be on a filesystem every node mounts at the same path.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli import custom_loss, rundir
from rpg_cli.inputs import Finding, check_run

if TYPE_CHECKING:
    from rpg_cli.spec import ExperimentSpec

# What the registry asks (rpg_cli.backends.registry.Backend): a run needs its spec's CPUs (NODE_CPUS None) and
# about 4 GB of a node's memory on the toy or a small model (`rpg slurm --mem` for larger ones); the trainer
# reports to the spec's trackers itself (rpg_cli.trackers.writers), so their libraries are checked at plan time.
NODE_CPUS = None
RUN_MEM_MB = 4096
WRITES_TRACKERS = True


def entrypoint(spec: ExperimentSpec, run_dir: Path) -> list[str]:
    return ["python", "-m", "rpg_cli.backends.local", "--spec", str(rundir.spec_path(run_dir))]


def resources(spec: ExperimentSpec) -> tuple[float, float]:
    """(CPUs, GPUs) the job reserves: the local trainer runs inside the entrypoint itself."""
    return float(spec.resources.cpus), float(spec.resources.nodes * spec.resources.gpus_per_node)


def env(spec: ExperimentSpec, run_dir: Path) -> dict[str, str]:
    """runtime_env env vars: none, the spec file carries everything; a custom loss's module directory leads
    PYTHONPATH (`custom_loss.job_pythonpath`)."""
    pythonpath = custom_loss.job_pythonpath(spec.loss)
    return {"PYTHONPATH": pythonpath} if pythonpath else {}


def preflight(spec: ExperimentSpec) -> list[Finding]:
    """What can be checked of a run before it is submitted: its data files, model and prompt lengths
    (the job checks them again, with its machine's files, before it loads anything), and a custom loss's module."""
    findings = check_run(spec)
    if why := custom_loss.not_found(spec.loss):
        findings.append(Finding("loss", why, error=True))
    return findings
