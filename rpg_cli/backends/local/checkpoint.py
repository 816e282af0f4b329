"""Checkpoints and the metrics log of a run directory, both safe to interrupt at any point.

    <run_dir>/checkpoints/step_N/   HF model + tokenizer (loadable by any HF tool) and trainer_state.pt
                                    (optimizer, reference weights when they are not the initial model and
                                    the reset schedule's state, the data position); written to a temporary
                                    directory and renamed, so a step_N directory is always complete.
    <run_dir>/metrics.jsonl         one line per step, {"step": N, "data": {...}}, flushed per line;
                                    on resume, lines after the checkpoint are dropped (that work is redone).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, directory) of the newest complete checkpoint, or None."""
    root = checkpoints_root(run_dir)
    found = []
    if root.is_dir():
        for entry in root.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and (entry / STATE_FILE).is_file():
                found.append((int(match.group(1)), entry))
    return max(found) if found else None


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any]) -> Path:
    root = checkpoints_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    staging = root / f".step_{step}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        torch.save(state, staging / STATE_FILE)
        if final.exists():  # a checkpoint of the same step from an earlier attempt: same content by determinism
            shutil.rmtree(final)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def load_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", weights_only=False)


class MetricsLog:
    """Append-only `metrics.jsonl` in verl's file-logger format."""

    def __init__(self, path: Path, keep_through: int | None):
        """Keep the lines of steps <= keep_through (none when None) and drop the rest, atomically."""
        self.path = Path(path)
        kept: list[str] = []
        if keep_through is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    step = json.loads(line)["step"]
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a crash
                if isinstance(step, int) and step <= keep_through:
                    kept.append(line)
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        os.replace(tmp, self.path)
        self.steps = [json.loads(line)["step"] for line in kept]

    def write(self, step: int, data: dict[str, float]) -> None:
        line = json.dumps({"step": step, "data": data}, sort_keys=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
        self.steps.append(step)
