"""What a node needs to run verl, checked in one place: by `rpg doctor` on the machine it runs on, on every GPU
node of the cluster before `rpg sweep` submits verl runs (a Ray job: `python -m rpg_cli.backends.verl.node`),
and in each verl job before verl starts (start.py).

A new user meets these before any rpg code runs: no flash-attn (verl 0.9.1 loads models with
attn_implementation=flash_attention_2 unless the run says otherwise, and transformers refuses that without the
flash_attn package), a driver too old for CUDA 13 (torch installs and sees no GPU), the wrong Python, no vLLM, a
plugin that does not load. Each check is a `NodeCheck`: ok, or missing (a run cannot start without it: `needed`),
or a warning (a version other than the one verl 0.9.1 is paired with, rpg_cli/gpu_stack.py), with one line
saying what was found and one the fix.

Which checks apply depends on verl's platform (`verl.plugin.platform`), which the job's environment decides:
its VERL_USE_EXTERNAL_MODULES may register one (tests/e2e's CPU stand-in does), else verl detects NVIDIA (and
falls back to it). The platform is read in the interpreter that checks the plugin (diagnose.py's probe), with
the run's environment; the NVIDIA checks (driver, CUDA, NCCL, flash-attn) apply to the NVIDIA platform only.

`facts()` gathers what the checks read (the only part that imports torch or runs programs); the checks, pure, are
needs.py's (`checks(facts)`, re-exported here with what a run needs of a node). This module runs them: on this
node (`node_checks`: `rpg doctor`, each job's start.py) and on every GPU node of a Ray cluster (`check_cluster`,
`gpu_node_reports`: a task per node; `refusal`: the one line that refuses a run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rpg_cli.backends.verl import diagnose
from rpg_cli.backends.verl.admission import gpus as ray_gpus_of

# Re-exported: callers (launch.py, start.py, rpg doctor's tests) ask this module for what a run needs of a node.
from rpg_cli.backends.verl.needs import (  # noqa: F401
    ATTN_DEFAULT,
    ATTN_IMPLEMENTATION,
    GPU_SET,
    INSTALL,
    NVIDIA,
    Facts,
    NodeCheck,
    checks,
    gpus_per_node,
    missing,
    override_value,
    uses_flash_attention,
)
from rpg_cli.rundir import last_error_line, last_lines

# what verl's platform is decided by: the modules it imports first (one may register a platform), verl's own
# override, and where those modules are found (verl/__init__.py, verl/plugin/platform/platform_manager.py)
PLATFORM_ENV = ("VERL_USE_EXTERNAL_MODULES", "VERL_PLATFORM", "PYTHONPATH")
LINE_PREFIX = "rpg-node-report "  # marks the node job's JSON lines in its log
DONE_LINE = "rpg-node-check done"  # its last line: every GPU node was asked (none: the cluster has none)
TIMEOUT_S = 120.0  # the sweep's check of its cluster's GPU nodes, before anything is submitted
JOB_TIMEOUT_S = 600.0  # a job's, before verl starts: beside other runs' training, a node answers slower
JOB_START_S = 30.0  # what the sweep's node job may take to start, beyond its TIMEOUT_S
PROBE_TIMEOUT_S = 300.0  # verl's import with the job's modules and rpg's plugin (diagnose.check_plugin_loads)


def platform_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a job's environment that decides verl's platform (PLATFORM_ENV)."""
    return {k: env[k] for k in PLATFORM_ENV if env.get(k)}


# ------------------------------------------------------------------------------------ this node's facts


DISTRIBUTIONS = ("torch", "vllm", "verl", "transformers", "ray", "flash-attn")


def facts(
    flash_attention: bool = True, env: Mapping[str, str] | None = None, plugin: str = "", ray_gpus: float | None = None
) -> Facts:
    """This node's facts. `env`: the job's environment (default: this process's), whose external modules verl
    loads before it picks a platform; `plugin`: rpg's plugin module, loaded as a job loads it."""
    import importlib.metadata

    def installed(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    found = Facts(tuple(sys.version_info[:3]), _glibc(), {name: installed(name) for name in DISTRIBUTIONS})
    found.ray_gpus = ray_gpus
    if found.versions["verl"] and plugin:
        try:
            seen = diagnose.check_plugin_loads(
                plugin, env=_with_plugin(env, plugin), node=True, timeout_s=PROBE_TIMEOUT_S
            )
        except RuntimeError as exc:
            found.plugin_error = str(exc)
        else:
            found.platform = f"{seen['vendor']}/{seen['device']}"
            found.versions["vllm"] = seen["vllm"]  # as verl reads it, once the job's modules are loaded
    if found.versions["torch"]:
        _torch_facts(found)
    if found.nvidia:
        found.driver, found.driver_how = _driver()
        if flash_attention and found.versions["flash-attn"]:
            found.flash_attn_error = _flash_attn_error()
    return found


def _with_plugin(env: Mapping[str, str] | None, plugin: str) -> dict[str, str]:
    """This process's environment with the job's over it, rpg's plugin among verl's external modules (a job's
    always has it)."""
    env = {**os.environ, **(env or {})}
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m.strip()]
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join([*modules, plugin] if plugin not in modules else modules)
    return env


def _glibc() -> str | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):
        import platform

        text = " ".join(platform.libc_ver())
    name, _, version = text.partition(" ")
    return version.strip() if name == "glibc" and version.strip() else None


def _torch_facts(found: Facts) -> None:
    import torch

    found.torch_cuda = torch.version.cuda
    if torch.cuda.is_available():
        found.gpus = [
            (torch.cuda.get_device_properties(i).name, torch.cuda.get_device_properties(i).total_memory)
            for i in range(torch.cuda.device_count())
        ]
        try:
            found.nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (RuntimeError, AttributeError):
            found.nccl = None


def _driver() -> tuple[str | None, str]:
    """The NVIDIA driver's version (nvidia-smi, else pynvml), and where it was looked for."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
        except subprocess.TimeoutExpired:
            return None, "nvidia-smi did not answer in 30 s"
        lines = done.stdout.split()
        if done.returncode == 0 and lines:
            return lines[0], "nvidia-smi"
        return None, f"nvidia-smi failed: {last_lines(done.stdout + done.stderr) or done.returncode}"
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-smi is not on PATH and pynvml is not installed"
    try:
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
    except Exception as exc:  # NVMLError_LibraryNotFound, ...: no driver
        return None, f"pynvml found no driver ({type(exc).__name__})"
    return (version.decode() if isinstance(version, bytes) else version), "pynvml"


def _flash_attn_error() -> str | None:
    """Why `import flash_attn` fails (in a fresh interpreter: a broken build can crash it), None if it imports."""
    try:
        done = subprocess.run([sys.executable, "-c", "import flash_attn"], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "importing it did not finish in 300 s"
    if done.returncode == 0:
        return None
    return last_error_line(done.stderr) or last_lines(done.stderr) or f"exit {done.returncode}"


def node_checks(
    flash_attention: bool = True, env: Mapping[str, str] | None = None, plugin: str = "", ray_gpus: float | None = None
) -> list[NodeCheck]:
    """This node checked (`facts` then `checks`)."""
    return checks(facts(flash_attention, env, plugin, ray_gpus), flash_attention)


# ----------------------------------------------------------------------------------------- a cluster's nodes


@dataclass(frozen=True)
class NodeReport:
    """One GPU node of a Ray cluster, checked: its address, the GPUs it declares to Ray, its checks."""

    node: str
    gpus: float
    checks: list[NodeCheck]

    def usable_gpus(self) -> float:
        """The GPUs a run can use there: those it declares to Ray, unless torch sees fewer."""
        cuda = next((c for c in self.checks if c.name == "CUDA"), None)
        return 0.0 if cuda is not None and not cuda.ok and cuda.needed else self.gpus

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "gpus": self.gpus, "checks": [c.as_dict() for c in self.checks]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeReport:
        fields = ("name", "ok", "needed", "detail", "fix")
        return cls(
            str(data["node"]), float(data["gpus"]), [NodeCheck(**{k: c[k] for k in fields}) for c in data["checks"]]
        )


def _check_this_node(flash_attention: bool, plugin: str, gpus: float) -> dict[str, Any]:
    """A Ray task on one node: its checks, with the job's environment (which Ray gives every task of the job)."""
    import ray

    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":  # a task that reserves no GPU may be handed none to see
        del os.environ["CUDA_VISIBLE_DEVICES"]
    found = node_checks(flash_attention, plugin=plugin, ray_gpus=gpus)
    return NodeReport(ray.util.get_node_ip_address(), gpus, found).as_dict()


def gpu_node_reports(flash_attention: bool, plugin: str, timeout_s: float = TIMEOUT_S) -> list[NodeReport]:
    """Every alive GPU node of the connected Ray cluster, checked by a task pinned to it (no CPU, no GPU
    reserved: it runs beside the runs there). A node that does not answer in `timeout_s` is reported so."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive") and ray_gpus_of(n.get("Resources", {})) > 0]
    if not nodes:
        return []
    check = ray.remote(_check_this_node)
    refs = {
        check.options(
            num_cpus=0, num_gpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(flash_attention, plugin, ray_gpus_of(n["Resources"])): n
        for n in nodes
    }
    done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    reports = []
    for ref, n in refs.items():
        address, gpus = n.get("NodeManagerAddress", n["NodeID"]), ray_gpus_of(n["Resources"])
        if ref not in done:
            ray.cancel(ref, force=True)
            late = missing("check", f"the node check did not finish in {timeout_s:.0f} s", "run `rpg doctor` there")
            reports.append(NodeReport(address, gpus, [late]))
            continue
        try:
            reports.append(NodeReport.from_dict(ray.get(ref)))
        except Exception as exc:  # the task itself failed: the node's Python cannot even run rpg's check
            line = last_error_line(str(exc)) or last_lines(str(exc))
            failed = missing("check", f"the node check failed: {line}", f"install rpg-cli on the node {INSTALL}")
            reports.append(NodeReport(address, gpus, [failed]))
    return reports


def refusal(reports: Sequence[NodeReport], nodes: int = 1, per_node: int = 0) -> str | None:
    """The one line that refuses a verl run on these nodes (None: they can run it): no GPU node, a node that
    lacks what a run needs (the first; `rpg doctor` there lists the rest), or too few nodes with enough GPUs."""
    if not reports:
        return (
            "the Ray cluster has no GPU node; verl trains on GPUs: start Ray on the GPU nodes (ray start, README: "
            "Running on a GPU cluster), or run on the CPU with --backend local"
        )
    failed = [(r, c) for r in reports for c in r.checks if not c.ok and c.needed]
    if failed:
        report, check = failed[0]
        more, where = len(failed) - 1, {r.node for r, _ in failed}
        on = "the node lists them" if len(where) == 1 else f"each of the {len(where)} nodes lists theirs"
        tail = f" (and {more} more: `rpg doctor` on {on})" if more else ""
        return f"node {report.node}: {check.detail}; {check.fix}{tail}"
    fit = [r for r in reports if r.usable_gpus() >= per_node]
    if len(fit) < nodes:
        have = ", ".join(f"{r.node}: {r.usable_gpus():g}" for r in reports)
        return (
            f"the run needs {nodes} node(s) with {per_node} GPUs each; the Ray cluster's GPU nodes have {have}; "
            "use resources.gpus_per_node and resources.nodes the cluster has"
        )
    return None


# ------------------------------------------------------------------------------------- the sweep's node job


def job_argv(flash_attention: bool, plugin: str, timeout_s: float) -> list[str]:
    """The node check's Ray job: `python -m rpg_cli.backends.verl.node`, as the runs' entrypoints name python."""
    argv = ["python", "-m", "rpg_cli.backends.verl.node", "--plugin", plugin, "--timeout", f"{timeout_s:g}"]
    return [*argv, "--flash-attention"] if flash_attention else argv


def check_cluster(
    client: Any,
    runs: Sequence[tuple[Sequence[str], Mapping[str, str]]],
    plugin: str,
    timeout_s: float = TIMEOUT_S,
    poll_s: float = 0.5,
) -> None:
    """RuntimeError (one line) unless every GPU node of `client`'s cluster has what `runs` (their verl overrides
    and job environments) need: one Ray job per distinct platform environment (PLATFORM_ENV; a sweep has one),
    whose tasks check each GPU node with that environment. Waits `timeout_s` at most for each."""
    groups: dict[tuple, list[tuple[Sequence[str], Mapping[str, str]]]] = {}
    for overrides, env in runs or [((), {})]:
        groups.setdefault(tuple(sorted(platform_env(env).items())), []).append((overrides, env))
    for members in groups.values():
        flash = any(uses_flash_attention(overrides) for overrides, _ in members)
        reports = _run_node_job(client, flash, plugin, dict(members[0][1]), timeout_s, poll_s)
        needs = dict.fromkeys(gpus_per_node(o) for o, _ in members if o) or {(1, 0): None}
        for line in (refusal(reports, *need) for need in needs):
            if line:
                raise RuntimeError(line)


def _run_node_job(
    client: Any, flash_attention: bool, plugin: str, env: dict[str, str], timeout_s: float, poll_s: float
) -> list[NodeReport]:
    import uuid

    submission_id = f"rpg-node-check-{uuid.uuid4().hex[:8]}"
    argv = job_argv(flash_attention, plugin, timeout_s)
    client.submit_job(
        # from where rpg runs, as the runs' jobs are (orchestration/submit.py): their paths mean the same
        entrypoint=f"cd {shlex.quote(os.getcwd())} && exec {shlex.join(argv)}",
        submission_id=submission_id,
        runtime_env={"env_vars": env} if env else None,
        entrypoint_num_cpus=0,
        metadata={"rpg_check": "gpu nodes"},
    )
    bound = timeout_s + JOB_START_S  # the job's own bound on its nodes, and its start
    deadline = time.monotonic() + bound
    while str(client.get_job_status(submission_id)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.monotonic() > deadline:
            client.stop_job(submission_id)
            raise RuntimeError(
                f"the check of the cluster's GPU nodes did not finish in {bound:.0f} s (Ray job "
                f"{submission_id}: `ray job logs {submission_id}`); run `rpg doctor` on each GPU node"
            )
        time.sleep(poll_s)
    log = client.get_job_logs(submission_id)
    with contextlib.suppress(Exception):  # else it stays in Ray's list of jobs: harmless
        client.delete_job(submission_id)
    return parse_job_log(log)


def parse_job_log(log: str) -> list[NodeReport]:
    """The node job's reports from its log; RuntimeError (one line) when it could not check the nodes."""
    reports = []
    for line in log.splitlines():
        if line.startswith(LINE_PREFIX):
            reports.append(NodeReport.from_dict(json.loads(line[len(LINE_PREFIX) :])))
    if not reports and DONE_LINE not in log:
        why = last_error_line(log) or last_lines(log) or "no output"
        raise RuntimeError(f"the check of the cluster's GPU nodes failed: {why[:300]}; is rpg-cli installed there?")
    return reports


def main(argv: list[str] | None = None) -> None:
    """The node check's Ray job: one JSON line per GPU node of the job's cluster."""
    import argparse

    import ray

    parser = argparse.ArgumentParser(prog="python -m rpg_cli.backends.verl.node", description=main.__doc__)
    parser.add_argument("--plugin", required=True, help="rpg's verl plugin module")
    parser.add_argument("--flash-attention", action="store_true", help="a run loads its model with flash_attention_2")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds to wait for the nodes")
    args = parser.parse_args(argv)
    ray.init(logging_level="ERROR", log_to_driver=False)  # the job's cluster
    try:
        for report in gpu_node_reports(args.flash_attention, args.plugin, args.timeout):
            print(LINE_PREFIX + json.dumps(report.as_dict()), flush=True)
    finally:
        ray.shutdown()
    print(DONE_LINE, flush=True)


if __name__ == "__main__":
    from rpg_cli.backends.verl.node import main as run  # by its name: Ray pickles its task by reference

    run()
