"""Per-GPU memory and per-run disk of a verl run as rpg configures it, known before a GPU is paid for.

    budgets = token_budgets(spec)               # the token budgets rpg gives verl (launch.py's one source)
    memory = gpu_memory(spec, shape, launch.overrides(spec, run_dir), gpu_gib=80.0)
    memory.peak_gib, memory.phase, memory.fits, memory.fix
    space = disk(spec, shape)                   # GB per checkpoint and per run, under spec.checkpoints

`shape` is `rpg_cli.model_shape.model_shape(spec.model)`. Pure Python, so that the dry run can print it.

Every term is a small function whose docstring names where verl 0.9.1 (and torch, transformers, vLLM as verl
pairs them: rpg_cli.gpu_stack) decides it. The run, step by step, on each of the N = nodes x gpus_per_node GPUs
(verl's hybrid engine: the FSDP trainer and a vLLM server share every GPU, trainer/ppo/v1/trainer_base.py):
rollout (vLLM awake; the trainer keeps its fp32 weights and optimizer states), the actor's log-probs of the
rollouts (no gradient, with entropy), the reference's log-probs (when a reference model is loaded), the update
(forward and backward of one micro-batch at a time), the optimizer step, and the weight sync to vLLM. The peak
is the largest of those phases.

It is an estimate. It leaves out (LEAVES_OUT): allocator fragmentation beyond a 5% slack, the real size of
CUDA contexts, NCCL buffers and vLLM's CUDA graphs (assumed: TRAINER_RUNTIME_GIB, VLLM_ASLEEP_GIB), the
reference's root unit that FSDP1 may leave gathered after a no-gradient forward, Ulysses sequence parallelism,
LoRA, FSDP2 and offload policies other than param/optimizer offload, and host memory (the reference's
fp32 shard lives in CPU memory). Activation terms are per-token approximations of transformers' Llama/Qwen
decoder layer under flash-attention 2.

This module makes the estimate: the peak over the phases and the one setting that makes a run fit (`gpu_memory`).
Its parts: budgets.py (the token budgets and the run's settings), memory.py (each term and phase),
checkpoint_disk.py (`disk`); their names are re-exported here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

# Re-exported: launch.py, the dry run and the tests ask this module for every figure of a run's footprint.
from rpg_cli.backends.verl.budgets import (  # noqa: F401
    ACTOR,
    ENTROPY_CHUNK,
    MODEL,
    REF,
    ROLLOUT,
    VLLM_UTILIZATION,
    Settings,
    TokenBudgets,
    settings,
    token_budgets,
)
from rpg_cli.backends.verl.checkpoint_disk import GB, DiskEstimate, checkpoint_steps, disk  # noqa: F401
from rpg_cli.backends.verl.memory import GIB, Phase, phases, vllm_weights  # noqa: F401

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rpg_cli.model_shape import ModelShape
    from rpg_cli.spec import ExperimentSpec

LEAVES_OUT = (
    "allocator fragmentation beyond 5%, the true size of CUDA contexts, NCCL buffers and vLLM's CUDA graphs, "
    "the reference's root unit FSDP1 may keep gathered after a no-grad forward, Ulysses sequence parallelism, "
    "LoRA, FSDP2, host memory; activations are per-token approximations of a Llama/Qwen layer"
)


# ---------------------------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class MemoryEstimate:
    """One GPU's peak: the phase it is in, its parts (GiB), whether it fits, and the setting that makes it fit."""

    gpu_gib: float
    phase: str
    parts: dict[str, float]
    phases: tuple[Phase, ...] = field(repr=False)
    fix: str | None = None  # one line, when it does not fit
    leaves_out: str = LEAVES_OUT

    @property
    def peak_gib(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.gpu_gib

    def __str__(self) -> str:
        verdict = "fits" if self.fits else f"does not fit: {self.fix}"
        return f"~{self.peak_gib:.1f} of {self.gpu_gib:g} GiB per GPU at its peak ({self.phase}): {verdict}"


def gpu_memory(
    spec: ExperimentSpec, shape: ModelShape, generated: Sequence[str], gpu_gib: float = 80.0
) -> MemoryEstimate:
    """The per-GPU peak of `spec` as a verl run (FSDP trainer and vLLM on each of its GPUs) with `shape`'s model,
    on GPUs of `gpu_gib` (an 80 GB card shows torch about 79 GiB; pass that for a tight check)."""
    s = settings(spec, generated)
    return _estimate(shape, s, gpu_gib, fix=_fix(shape, s, gpu_gib))


def _estimate(shape: ModelShape, s: Settings, gpu_gib: float, fix: str | None = None) -> MemoryEstimate:
    every = phases(shape, s, gpu_gib)
    peak = max(every, key=lambda p: p.total)
    estimate = MemoryEstimate(gpu_gib, peak.name, peak.parts, tuple(every))
    return dataclasses.replace(estimate, fix=fix) if not estimate.fits else estimate


def _fits(shape: ModelShape, s: Settings, gpu_gib: float) -> bool:
    return _estimate(shape, s, gpu_gib).fits


def _fix(shape: ModelShape, s: Settings, gpu_gib: float) -> str | None:
    """The one setting that makes the run fit, tried in the order of what it costs (None if it fits): for the
    phase at the peak, a smaller vLLM share or token budget first, then chunked entropy, fused kernels or
    offload. Each candidate is checked with the same estimate."""
    if _fits(shape, s, gpu_gib):
        return None
    peak = _estimate(shape, s, gpu_gib).phase
    seq = s.budgets.sequence
    tries: list[tuple[str, Settings]] = []
    if peak in ("rollout", "weight sync"):
        without_vllm = next(p for p in phases(shape, _with(s, utilization=0.0), gpu_gib) if p.name == "rollout")
        share = math.floor(100 * (gpu_gib - without_vllm.total) / gpu_gib) / 100
        if share * gpu_gib * GIB > 1.2 * vllm_weights(shape, s):  # room for vLLM's weights and some KV cache
            tries.append(
                (f"lower {ROLLOUT}.gpu_memory_utilization to {share:.2f} (verl.site)", _with(s, utilization=share))
            )
        offload = f"set {ACTOR}.fsdp_config.param_offload=true and {ACTOR}.fsdp_config.optimizer_offload=true"
        tries.append((f"{offload} (verl.site)", _with(s, param_offload=True, optimizer_offload=True)))
    if peak in ("log-prob", "reference log-prob"):
        chunking = f"set {ACTOR}.entropy_from_logits_with_chunking=true (verl.site)"
        tries.append((chunking, _with(s, entropy_chunking=True)))
        name, key = ("log_prob", ROLLOUT) if peak == "log-prob" else ("ref_log_prob", REF)
        tokens = _largest_budget(shape, s, gpu_gib, name)
        if tokens is not None:
            message = f"lower {key}.log_prob_max_token_len_per_gpu to {tokens} (verl.site; at least {seq})"
            tries.append((message, _budget(s, name, tokens)))
    if peak == "update":
        tokens = _largest_budget(shape, s, gpu_gib, "ppo")
        if tokens is not None:
            message = f"lower {ACTOR}.ppo_max_token_len_per_gpu to {tokens} (verl.site; at least {seq})"
            tries.append((message, _budget(s, "ppo", tokens)))
        tries.append((f"set {MODEL}.use_fused_kernels=true (verl.site)", _with(s, fused_kernels=True)))
    for message, candidate in tries:
        if _fits(shape, candidate, gpu_gib):
            return message
    return (
        f"no one setting fits {shape.params / 1e9:.2f}B parameters on {s.gpus} GPU(s) of {gpu_gib:g} GiB; "
        "allowed: more GPUs (resources.nodes x gpus_per_node) or a smaller model"
    )


def _with(s: Settings, **changes: object) -> Settings:
    return dataclasses.replace(s, **changes)


def _budget(s: Settings, name: str, tokens: int) -> Settings:
    """`s` with one token budget changed; lowering the actor's lowers the log-prob budgets that follow it
    (equal to it: verl's default interpolation)."""
    changes = {name: tokens}
    if name == "ppo":
        changes.update({k: tokens for k in ("log_prob", "ref_log_prob") if getattr(s.budgets, k) == s.budgets.ppo})
    return dataclasses.replace(s, budgets=dataclasses.replace(s.budgets, **changes))


def _largest_budget(shape: ModelShape, s: Settings, gpu_gib: float, name: str) -> int | None:
    """The largest budget `name` below the current one (at least prompt + response, rounded down to 1024
    where that stays above it) with which the run fits; None if even the smallest does not."""
    low, high = s.budgets.sequence, getattr(s.budgets, name)
    if low >= high or not _fits(shape, _budget(s, name, low), gpu_gib):
        return None
    while high - low > 1:  # fits at low, not at high
        mid = (low + high) // 2
        low, high = (mid, high) if _fits(shape, _budget(s, name, mid), gpu_gib) else (low, mid)
    rounded = low // 1024 * 1024
    return rounded if rounded >= s.budgets.sequence else low
