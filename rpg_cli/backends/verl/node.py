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

`facts()` gathers what the checks read (the only part that imports torch or runs programs); `checks(facts)` is
pure, so that tests can hand it any node.
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
from dataclasses import asdict, dataclass, field
from typing import Any

from rpg_cli import gpu_stack
from rpg_cli.backends.verl import diagnose
from rpg_cli.backends.verl.admission import gpus as ray_gpus_of
from rpg_cli.rundir import last_error_line, last_lines
from rpg_cli.spec import override_key

# verl 0.9.1 loads the actor's model with this attention unless the run's overrides set it (workers/config/
# model.py, HFModelConfig: override_config.get("attn_implementation", "flash_attention_2"))
ATTN_IMPLEMENTATION = "actor_rollout_ref.model.override_config.attn_implementation"
ATTN_DEFAULT = "flash_attention_2"
# what verl's platform is decided by: the modules it imports first (one may register a platform), verl's own
# override, and where those modules are found (verl/__init__.py, verl/plugin/platform/platform_manager.py)
PLATFORM_ENV = ("VERL_USE_EXTERNAL_MODULES", "VERL_PLATFORM", "PYTHONPATH")
NVIDIA = "nvidia"  # verl's vendor_name of its CUDA platform, and its fallback when it detects none
INSTALL = "(README, Install)"
GPU_SET = "pip install -r requirements/gpu.txt"  # a GPU node's pinned set, from rpg's clone (README, Install)
LINE_PREFIX = "rpg-node-report "  # marks the node job's JSON lines in its log
DONE_LINE = "rpg-node-check done"  # its last line: every GPU node was asked (none: the cluster has none)
TIMEOUT_S = 120.0  # the sweep's check of its cluster's GPU nodes, before anything is submitted
JOB_TIMEOUT_S = 600.0  # a job's, before verl starts: beside other runs' training, a node answers slower
JOB_START_S = 30.0  # what the sweep's node job may take to start, beyond its TIMEOUT_S
PROBE_TIMEOUT_S = 300.0  # verl's import with the job's modules and rpg's plugin (diagnose.check_plugin_loads)


@dataclass(frozen=True)
class NodeCheck:
    """One check of a node: `needed` says a run cannot start without it (else a failure is a warning)."""

    name: str
    ok: bool
    needed: bool
    detail: str  # one line: what was found
    fix: str = ""  # one line: what to do when it is not ok

    @property
    def status(self) -> str:
        return "ok" if self.ok else "missing" if self.needed else "warn"

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, **asdict(self)}


def ok(name: str, detail: str) -> NodeCheck:
    return NodeCheck(name, True, True, detail)


def missing(name: str, detail: str, fix: str) -> NodeCheck:
    return NodeCheck(name, False, True, detail, fix)


def warn(name: str, detail: str, fix: str = "") -> NodeCheck:
    return NodeCheck(name, False, False, detail, fix)


# ------------------------------------------------------------------------------------------ what a run needs


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The value the last override of `key` sets (`key=v`, `+key=v`, `++key=v`), None when none does."""
    found = None
    for item in overrides:
        if "=" in item and override_key(item) == key and not item.startswith("~"):
            found = item.split("=", 1)[1].strip().strip("'\"")
    return found


def uses_flash_attention(overrides: Sequence[str]) -> bool:
    """Whether verl loads the run's model with flash_attention_2 (its default, unless the overrides say)."""
    return (override_value(overrides, ATTN_IMPLEMENTATION) or ATTN_DEFAULT) == ATTN_DEFAULT


def gpus_per_node(overrides: Sequence[str]) -> tuple[int, int]:
    """(nodes, GPUs on each) a run's verl asks for (trainer.nnodes, trainer.n_gpus_per_node; verl's default 1, 8)."""
    nodes, per_node = override_value(overrides, "trainer.nnodes"), override_value(overrides, "trainer.n_gpus_per_node")
    return int(nodes or 1), int(per_node or 8)


def platform_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a job's environment that decides verl's platform (PLATFORM_ENV)."""
    return {k: env[k] for k in PLATFORM_ENV if env.get(k)}


# ------------------------------------------------------------------------------------------------ the facts


@dataclass
class Facts:
    """What the checks read of a node (`facts()` gathers them; tests write them)."""

    python: tuple[int, int, int]
    glibc: str | None  # "2.36"; None: not a glibc system
    versions: dict[str, str | None]  # distribution -> installed version (None: not installed)
    platform: str | None = None  # verl's platform here, "vendor/device"; None: unknown (verl could not load)
    plugin_error: str | None = None  # why rpg's plugin does not load in verl
    torch_cuda: str | None = None  # the CUDA torch is built for (torch.version.cuda); None: a CPU build
    gpus: list[tuple[str, int]] = field(default_factory=list)  # CUDA devices torch sees: (name, bytes)
    nccl: str | None = None  # NCCL's version; None: none
    driver: str | None = None  # NVIDIA driver version; None: none found
    driver_how: str = "nvidia-smi is not on PATH"  # where the driver was looked for
    flash_attn_error: str | None = None  # why flash_attn does not import (when installed)
    ray_gpus: float | None = None  # the GPUs the node declares to Ray (a node of a cluster)

    @property
    def nvidia(self) -> bool:
        return self.platform is None or self.platform.split("/")[0] == NVIDIA


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


# ----------------------------------------------------------------------------------------------- the checks


def checks(found: Facts, flash_attention: bool = True) -> list[NodeCheck]:
    """Every check of a node from its facts, in the order a node is set up."""
    return [
        check_python(found.python),
        check_glibc(found.glibc),
        check_driver(found),
        check_torch(found),
        check_cuda(found),
        check_nccl(found),
        check_verl(found.versions["verl"]),
        check_plugin(found),
        check_vllm(found.versions["vllm"]),
        check_flash_attention(found, flash_attention),
        check_pinned("transformers", found.versions["transformers"], gpu_stack.TRANSFORMERS),
        check_pinned("ray", found.versions["ray"], gpu_stack.RAY),
    ]


def node_checks(
    flash_attention: bool = True, env: Mapping[str, str] | None = None, plugin: str = "", ray_gpus: float | None = None
) -> list[NodeCheck]:
    """This node checked (`facts` then `checks`)."""
    return checks(facts(flash_attention, env, plugin, ray_gpus), flash_attention)


def _bounds(low: tuple[int, ...], high: tuple[int, ...] | None = None) -> str:
    text = ".".join(map(str, low))
    return f"{text} to {'.'.join(map(str, high))}" if high else f">= {text}"


def _base(version: str) -> str:
    return version.split("+", 1)[0]


def check_python(version: tuple[int, ...]) -> NodeCheck:
    text = ".".join(map(str, version))
    allowed = _bounds(gpu_stack.PYTHON_MIN, gpu_stack.PYTHON_MAX)
    if gpu_stack.PYTHON_MIN <= tuple(version[:2]) <= gpu_stack.PYTHON_MAX:
        return ok("Python", f"{text} (verl {gpu_stack.VERL} runs on {allowed})")
    return missing(
        "Python",
        f"Python {text} is outside {allowed}, which verl {gpu_stack.VERL} and its GPU stack install on",
        f"create the environment with Python {allowed} on every node {INSTALL}",
    )


def check_glibc(version: str | None) -> NodeCheck:
    need = _bounds(gpu_stack.GLIBC_MIN)
    if version is None:
        return missing(
            "glibc", "not a glibc Linux (macOS, musl)", f"verl's GPU stack installs on Linux with glibc {need}"
        )
    try:
        numbers = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return warn("glibc", f"glibc {version}: cannot read the version", f"vLLM's wheels need glibc {need}")
    if numbers >= gpu_stack.GLIBC_MIN:
        return ok("glibc", f"{version} ({need})")
    return missing(
        "glibc", f"glibc {version} is older than {need}, which vLLM's wheels need", f"use a newer Linux {INSTALL}"
    )


def _not_nvidia(name: str, found: Facts) -> NodeCheck:
    return ok(name, f"not needed: verl's platform here is {found.platform}, not NVIDIA's (the job's environment)")


def check_driver(found: Facts) -> NodeCheck:
    if not found.nvidia:
        return _not_nvidia("NVIDIA driver", found)
    cuda = f"CUDA {gpu_stack.TORCH_CUDA}"
    if found.driver is None:
        return missing(
            "NVIDIA driver",
            f"no NVIDIA driver found ({found.driver_how})",
            f"verl runs need NVIDIA GPUs with driver >= {gpu_stack.DRIVER_MIN} (the local backend runs here)",
        )
    try:
        major = int(found.driver.split(".")[0])
    except ValueError:
        return warn("NVIDIA driver", f"driver {found.driver}: cannot read the version", f"{cuda} needs >= 580")
    if major >= gpu_stack.DRIVER_MIN:
        return ok("NVIDIA driver", f"{found.driver} (>= {gpu_stack.DRIVER_MIN}, {cuda}'s minimum)")
    return missing(
        "NVIDIA driver",
        f"NVIDIA driver {found.driver} is older than {gpu_stack.DRIVER_MIN}, {cuda}'s minimum: "
        f"torch {gpu_stack.TORCH} installs and sees no GPU",
        f"upgrade the driver to >= {gpu_stack.DRIVER_MIN} on every node {INSTALL}",
    )


def check_torch(found: Facts) -> NodeCheck:
    version = found.versions["torch"]
    want = f"{gpu_stack.TORCH} for CUDA {gpu_stack.TORCH_CUDA}" if found.nvidia else gpu_stack.TORCH
    fix = f"{GPU_SET} (torch {gpu_stack.TORCH}, its CUDA {gpu_stack.TORCH_CUDA} build) on every node {INSTALL}"
    if version is None:
        return missing("torch", "torch is not installed", fix)
    if found.nvidia and found.torch_cuda is None:
        return warn("torch", f"torch {version} is a CPU build, not {want}", fix)
    build = f" for CUDA {found.torch_cuda}" if found.torch_cuda else " (a CPU build)"
    if _base(version) != gpu_stack.TORCH or (found.nvidia and found.torch_cuda != gpu_stack.TORCH_CUDA):
        return warn(
            "torch", f"torch {version}{build}, not {want} (the build verl {gpu_stack.VERL} is paired with)", fix
        )
    return ok("torch", f"{version}{build}")


def check_cuda(found: Facts) -> NodeCheck:
    if not found.nvidia:
        return _not_nvidia("CUDA", found)
    version = found.versions["torch"]
    if version is None:
        return warn("CUDA", "not checked: torch is not installed")
    if not found.gpus:
        return missing(
            "CUDA", f"torch {version} sees no GPU", "verl runs need NVIDIA GPUs (the local backend runs here)"
        )
    names: dict[str, int] = {}
    for name, memory in found.gpus:
        label = f"{name} ({memory / 2**30:.1f} GiB)"
        names[label] = names.get(label, 0) + 1
    seen = ", ".join(f"{n} x {label}" for label, n in names.items())
    if found.ray_gpus is not None and len(found.gpus) < found.ray_gpus:
        return missing(
            "CUDA",
            f"torch sees {len(found.gpus)} GPU(s) but the node declares {found.ray_gpus:g} to Ray",
            "check CUDA_VISIBLE_DEVICES and `nvidia-smi` there, or start its Ray with --num-gpus it has",
        )
    return ok("CUDA", f"{len(found.gpus)} GPU(s): {seen}")


def check_nccl(found: Facts) -> NodeCheck:
    if not found.nvidia:
        return _not_nvidia("NCCL", found)
    if not found.gpus:
        return warn("NCCL", "not checked: torch sees no GPU")
    if found.nccl is None:
        return missing("NCCL", "torch has no NCCL", f"install torch {gpu_stack.TORCH} from PyPI (CUDA build) {INSTALL}")
    return ok("NCCL", found.nccl)


def check_verl(version: str | None) -> NodeCheck:
    fix = f"{GPU_SET} (verl {gpu_stack.VERL}) on every node {INSTALL}"
    if version is None:
        return missing("verl", "verl is not installed", fix)
    if _base(version) != gpu_stack.VERL:
        return missing("verl", f"verl {version} is installed; rpg's backend targets verl {gpu_stack.VERL}", fix)
    return ok("verl", version)


def check_plugin(found: Facts) -> NodeCheck:
    if found.versions["verl"] is None:
        return warn("rpg plugin", "not checked: verl is not installed")
    if found.plugin_error:  # diagnose's line: what failed; what to do
        detail, _, fix = found.plugin_error.partition("; ")
        return missing("rpg plugin", detail, fix or f"reinstall rpg-cli on every node {INSTALL}")
    if found.platform is None:
        return warn("rpg plugin", "not checked (rpg doctor checks it)")
    return ok("rpg plugin", f"verl loads every rpg loss; verl's platform: {found.platform}")


def check_vllm(version: str | None) -> NodeCheck:
    fix = f"{GPU_SET} (vLLM {gpu_stack.VLLM}) on every node {INSTALL}"
    if version is None:
        return missing("vLLM", "vLLM is not installed (verl rolls out with it)", fix)
    if _base(version) != gpu_stack.VLLM:
        return warn("vLLM", f"vLLM {version}, not {gpu_stack.VLLM} (the one verl {gpu_stack.VERL} is tested with)", fix)
    return ok("vLLM", version)


def check_flash_attention(found: Facts, needed: bool) -> NodeCheck:
    if not needed:
        return ok("flash-attn", f"not needed: the runs set {ATTN_IMPLEMENTATION} to another attention")
    if not found.nvidia:
        return _not_nvidia("flash-attn", found)
    fix = (
        f"build flash-attn {gpu_stack.FLASH_ATTN} against this torch on every node {INSTALL}, "
        f"or set +{ATTN_IMPLEMENTATION}=sdpa in the spec's verl.site"
    )
    version = found.versions["flash-attn"]
    if version is None:
        return missing("flash-attn", f"flash-attn is not installed (verl loads models with {ATTN_DEFAULT})", fix)
    if found.flash_attn_error:
        return missing("flash-attn", f"flash-attn {version} does not import: {found.flash_attn_error}", fix)
    return ok("flash-attn", version)


def check_pinned(name: str, version: str | None, pinned: str) -> NodeCheck:
    fix = f"pip install {name}=={pinned} {INSTALL}"
    if version is None:
        return missing(name, f"{name} is not installed", fix)
    if _base(version) != pinned:
        return warn(name, f"{name} {version}, not {pinned} (the one verl {gpu_stack.VERL} is paired with)", fix)
    return ok(name, version)


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
