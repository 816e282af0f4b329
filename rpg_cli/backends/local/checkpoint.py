"""Checkpoints of a run directory, and its metrics log, both safe to interrupt at any point.

<run_dir>/checkpoints/step_N/   HF model + tokenizer (loadable by any HF tool) and trainer_state.pt
                                (optimizer, reference weights when they are not the initial model and
                                the reset schedule's state, the data position); written to a temporary
                                directory and renamed, so a step_N directory is always complete.
<run_dir>/metrics.jsonl         rundir.MetricsLog: a resumed attempt appends a restart line first,
                                which voids the steps after its checkpoint (that work is redone).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from rpg_cli import rundir

STATE_FILE = rundir.LOCAL_STATE_FILE


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, directory) of the newest complete checkpoint, or None."""
    found = [
        (step, entry)
        for step, entry in rundir.step_dirs(run_dir)
        if entry == rundir.local_checkpoint(run_dir, step) and (entry / STATE_FILE).is_file()
    ]
    return max(found) if found else None


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any]) -> Path:
    final = rundir.local_checkpoint(run_dir, step)
    checked = rundir.make_run_dir(run_dir)
    rundir.make_dirs(rundir.checkpoints_dir(checked), checked)
    staging = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        torch.save(state, staging / STATE_FILE)
        rundir.settle_modes(staging)  # the libraries' own modes differ (safetensors 0600, torch 0644)
        if final.exists():  # a checkpoint of the same step from an earlier attempt: same content by determinism
            shutil.rmtree(final)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def load_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", weights_only=False)
