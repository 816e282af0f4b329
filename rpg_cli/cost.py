"""What a run costs: the devices it holds, the time it held them, device-hours. Standard library only.

A run's device time is the time its job held its devices, summed over its attempts: from when an attempt began
holding them (after verl's wait for free GPUs: `backends/verl/admission.py`; the local trainer's start) to when
it ended. Time in Ray's queue or in that wait is not counted; work an attempt did and a later one redid (after a
preemption, from the last checkpoint) is, because it was paid for. A step's own device time (`step_seconds`)
counts training and validation, not the job's start (loading the model, starting vLLM).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from rpg_cli.metrics import STEP_TIME, TESTING_TIME


def devices(spec: Mapping[str, Any]) -> int:
    """The devices a run holds: its nodes times their GPUs, or 1 for a run on no GPU (one CPU process)."""
    resources = spec.get("resources") or {}
    return int(resources.get("nodes", 1) or 1) * int(resources.get("gpus_per_node", 0) or 0) or 1


def step_seconds(values: Mapping[str, float | None]) -> float:
    """A step line's device time in seconds: the step (timing_s/step, which verl times without validation) and
    its validation (timing_s/testing) where it had one."""
    return sum(values.get(key) or 0.0 for key in (STEP_TIME, TESTING_TIME))


def device_hours(devices: int, seconds: float) -> float:
    return devices * seconds / 3600.0


def held_seconds(held_s: float, held_at: datetime | None, end: datetime | None) -> float:
    """Seconds a run held its devices: its ended attempts' (`held_s`) and the current attempt's, from `held_at`
    (when it began holding them) to `end` (when it ended, or now for a live run); none before it held them."""
    current = (end - held_at).total_seconds() if held_at is not None and end is not None else 0.0
    return held_s + max(current, 0.0)
