"""What a node needs to run verl, as pure checks: a node's `Facts` in, one `NodeCheck` per need out (`checks`),
in the order a node is set up; and what a run's overrides ask of a node (flash-attention, GPUs per node).

Each check is ok, or missing (a run cannot start without it: `needed`), or a warning (a version other than the
one verl 0.9.1 is paired with, rpg_cli/gpu_stack.py), with one line saying what was found and one the fix. The
NVIDIA checks (driver, CUDA, NCCL, flash-attn) apply to verl's NVIDIA platform only. Pure, so that tests can hand
it any node; node.py gathers a node's facts and runs these on it, and on every GPU node of a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rpg_cli import gpu_stack
from rpg_cli.spec import override_key

# verl 0.9.1 loads the actor's model with this attention unless the run's overrides set it (workers/config/
# model.py, HFModelConfig: override_config.get("attn_implementation", "flash_attention_2"))
ATTN_IMPLEMENTATION = "actor_rollout_ref.model.override_config.attn_implementation"
ATTN_DEFAULT = "flash_attention_2"
NVIDIA = "nvidia"  # verl's vendor_name of its CUDA platform, and its fallback when it detects none
INSTALL = "(README, Install)"
GPU_SET = "pip install -r requirements/gpu.txt"  # a GPU node's pinned set, from rpg's clone (README, Install)


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
