"""What a run costs: the devices it holds, the time it held them, device-hours. Standard library only.

A run's device time is the time its job held its devices, summed over its attempts: from when an attempt began
holding them (after verl's wait for free GPUs: `backends/verl/admission.py`; the local trainer's start) to when
it ended. Time in Ray's queue or in that wait is not counted; work an attempt did and a later one redid (after a
preemption, from the last checkpoint) is, because it was paid for. A step's own device time (`step_seconds`)
counts training and validation, not the job's start (loading the model, starting vLLM).

MFU (MATH.md section 12): the FLOPs of a step's update, counted from the model's shape (`rpg_cli.model_shape`), over
the seconds it took times the devices times the device's dense bf16 peak (`PEAK_FLOPS`, each with its source). A
device this does not know (a CPU, a GPU missing from the table) has no peak, hence no MFU rather than a made-up one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from rpg_cli.metrics import STEP_TIME, TESTING_TIME
from rpg_cli.states import LIVE

if TYPE_CHECKING:
    from rpg_cli.model_shape import ModelShape


def devices(spec: Mapping[str, Any]) -> int:
    """The devices a run holds: its nodes times their GPUs, or 1 for a run on no GPU (one CPU process)."""
    resources = spec.get("resources") or {}
    return int(resources.get("nodes", 1) or 1) * int(resources.get("gpus_per_node", 0) or 0) or 1


def step_seconds(values: Mapping[str, float | None]) -> float:
    """A step line's device time in seconds: the step (timing_s/step, which verl times without validation) and
    its validation (timing_s/testing) where it had one."""
    return sum(values.get(key) or 0.0 for key in (STEP_TIME, TESTING_TIME))


def device_hours(devices: int, seconds: float) -> float:
    """Devices times seconds, in hours: what a run cost."""
    return devices * seconds / 3600.0


def held_seconds(held_s: float, held_at: datetime | None, end: datetime | None) -> float:
    """Seconds a run held its devices: its ended attempts' (`held_s`) and the current attempt's, from `held_at`
    (when it began holding them) to `end` (when it ended, or now for a live run); none before it held them."""
    current = (end - held_at).total_seconds() if held_at is not None and end is not None else 0.0
    return held_s + max(current, 0.0)


class HeldRun(Protocol):
    """What `run_device_hours` reads of a run (the store's RunRecord is one)."""

    spec: Mapping[str, Any]
    status: str
    held_s: float
    held_at: datetime | None
    finished_at: datetime | None


def run_device_hours(run: HeldRun, now: datetime) -> float | None:
    """A run's device-hours so far: its devices x the time its attempts held them (a live run's up to `now`); None
    when it has not held them (pending, or recorded before rpg measured it: a store older than schema version 7)."""
    if run.held_at is None and not run.held_s:
        return None
    end = run.finished_at or (now if run.status in LIVE else None)
    return device_hours(devices(run.spec), held_seconds(run.held_s, run.held_at, end))


# ---------------------------------------------------------------- MFU (MATH.md section 12)

# Dense (no 2:4 sparsity) bf16 Tensor Core peak per device, FLOP/s. NVIDIA's datasheets print the sparse figure
# with a footnote "with sparsity"; the dense one is half. verl 0.9.1's table (utils/flops_counter.py) agrees on
# the SXM parts (989, 312, 2250 TFLOP/s) but gives every H100 989, a PCIe card's too: here a PCIe H100 has its own.
PEAK_FLOPS: dict[str, tuple[float, str]] = {
    "H100 SXM": (989.4e12, "NVIDIA H100 Tensor Core GPU datasheet: BF16 1,979 TFLOPS with sparsity (SXM)"),
    "H100 PCIe": (756.0e12, "NVIDIA H100 Tensor Core GPU datasheet: BF16 1,513 TFLOPS with sparsity (PCIe)"),
    "H200": (989.4e12, "NVIDIA H200 Tensor Core GPU datasheet: BF16 1,979 TFLOPS with sparsity (SXM)"),
    "A100": (312.0e12, "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense (624 with sparsity)"),
    "B200": (2250.0e12, "NVIDIA HGX B200 datasheet: BF16 4.5 PFLOPS with sparsity per GPU"),
}
# torch.cuda.get_device_name() -> a PEAK_FLOPS key; first match wins. Names seen: "NVIDIA H100 80GB HBM3" (SXM),
# "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA B200". The NVL
# cards (H100 NVL, H200 NVL) have lower, different peaks: not in the table, so they get none.
_DEVICE_PATTERNS: tuple[tuple[str, str | None], ...] = (
    (r"\b(?:H100|H200)\b.*\bNVL\b", None),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
    (r"\bH100\b", "H100 SXM"),
    (r"\bH200\b", "H200"),
    (r"\bA100\b", "A100"),
    (r"\bB200\b", "B200"),  # not GB200 (a word character before B)
)


def device_peak(device_name: str) -> float | None:
    """The dense bf16 peak (FLOP/s) of a device named as torch.cuda.get_device_name() names it; None for one this
    does not know (no MFU rather than a made-up one)."""
    for pattern, key in _DEVICE_PATTERNS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return None if key is None else PEAK_FLOPS[key][0]
    return None


def matmul_params(shape: ModelShape) -> int:
    """The weights a token multiplies through (MATH.md section 12): each layer's q, k, v, o projections and
    SwiGLU MLP, and the LM head; not the input embedding (a lookup), norms or biases. verl 0.9.1's
    `_estimate_qwen2_flops` also counts the embedding (vocab x hidden twice)."""
    h, q, kv = shape.hidden_size, shape.q_dim, shape.kv_dim
    layer = h * q + 2 * h * kv + q * h + 3 * h * shape.intermediate_size
    return shape.num_layers * layer + shape.vocab_size * h


def dense_flops_per_token(shape: ModelShape) -> int:
    """Forward and backward FLOPs of one trained token through the weights (MATH.md section 12): 6 N, N =
    `matmul_params` (2 N forward, 4 N backward)."""
    return 6 * matmul_params(shape)


def attention_flops(shape: ModelShape, seqlens: Iterable[int]) -> int:
    """Forward and backward FLOPs of causal attention's scores and weighted sum (MATH.md section 12):
    6 x heads x head_dim x layers per sequence's length squared, summed, as verl 0.9.1 counts them."""
    return 6 * sum(s * s for s in seqlens) * shape.head_dim * shape.num_heads * shape.num_layers


def update_flops(shape: ModelShape, seqlens: Iterable[int], passes: int = 1) -> int:
    """The FLOPs of training on sequences of `seqlens` valid tokens (prompt and response), `passes` times
    (ppo_epochs): dense plus attention (MATH.md section 12)."""
    lengths = list(seqlens)
    return passes * (dense_flops_per_token(shape) * sum(lengths) + attention_flops(shape, lengths))


def mfu(flops: float, seconds: float, devices: int, peak: float) -> float:
    """Model FLOPs utilisation (MATH.md section 12): the FLOPs done over what `devices` at `peak` FLOP/s could do
    in `seconds`."""
    return flops / (seconds * devices * peak)
