"""What a local step costs, under verl's names (rpg_cli.metrics): tokens per second per device, the update's MFU
and the step's peak GPU memory (MATH.md section 12).

On a CPU only the time and the throughput are measured: no peak memory (torch keeps none for the CPU) and no MFU
(no dense bf16 peak to divide by), absent rather than 0. On CUDA the peak is torch's allocator peak during the
step's training (reset when the step begins, read before its validation), and the MFU divides the update's FLOPs,
counted from the model's config (`rpg_cli.cost.update_flops`), by its seconds times the device's peak.
"""

from __future__ import annotations

import torch

from rpg_cli import cost
from rpg_cli.metrics import MFU, PEAK_MEMORY, THROUGHPUT, TIME_PER_STEP
from rpg_cli.model_shape import ModelShape, shape_from_config

GIB = 1024**3


class CostMeter:
    """The cost metrics of one process's steps: `begin` when a step starts, `update` after its update, `step` when
    its training is done (before validation, which timing_s/step leaves out, as verl's does)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, spec) -> None:
        self.device, self.devices = device, cost.devices(spec.canonical())
        self.cuda = device.type == "cuda"
        self.peak = cost.device_peak(torch.cuda.get_device_name(device)) if self.cuda else None
        self.shape: ModelShape | None = shape_from_config(model.config.to_dict()) if self.peak else None

    def begin(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def update(self, seqlens: list[int], passes: int, seconds: float) -> dict[str, float]:
        """perf/mfu/actor of an update over sequences of `seqlens` valid tokens, `passes` (ppo_epochs) times; none
        where the device's peak or the model's shape is unknown."""
        if self.peak is None or self.shape is None or seconds <= 0:
            return {}
        flops = cost.update_flops(self.shape, seqlens, passes)
        return {MFU: cost.mfu(flops, seconds, self.devices, self.peak)}

    def step(self, tokens: float, seconds: float) -> dict[str, float]:
        """The step's throughput per device and time (perf/*), and on CUDA its peak memory in GiB."""
        out = {TIME_PER_STEP: seconds, THROUGHPUT: tokens / (seconds * self.devices)}
        if self.cuda:
            out[PEAK_MEMORY] = torch.cuda.max_memory_allocated(self.device) / GIB
        return out
