"""TensorBoard: one log dir per run, `<dir>/<sweep>/<run name>`. It cannot be asked what it holds, so a
resumed run purges the steps it redoes (verl's and torch's answer) and an export swaps a whole new dir in."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rpg_cli.rundir import TENSORBOARD_DIR
from rpg_cli.trackers.base import ExportOptions, RunInfo, Tracker, TrackerSettings, numbers, write


class TensorBoardSettings(TrackerSettings):
    dir: str | None = None  # log root, a run at <dir>/<sweep>/<run name>; default: <runs dir>/tensorboard


def log_dir(info: RunInfo) -> Path:
    """The run's log dir (its settings resolved)."""
    assert info.trackers.tensorboard is not None and info.trackers.tensorboard.dir is not None
    return Path(info.trackers.tensorboard.dir) / info.sweep / info.name


class TensorBoardWriter:
    name = "tensorboard"

    def __init__(self, log_dir: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step)

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        for key, value in numbers(data).items():
            self.writer.add_scalar(key, value, global_step=step)

    def summary(self, values: Mapping[str, Any]) -> None:
        """Nothing: TensorBoard has no summary; every value is already a scalar at its step."""

    def close(self) -> None:
        self.writer.close()


class TensorBoard(Tracker):
    name = "tensorboard"
    settings = TensorBoardSettings
    library = "tensorboard"

    def resolve(
        self, settings: TensorBoardSettings, runs_root: Path, environ: Mapping[str, str]
    ) -> TensorBoardSettings:
        """The log root, absolute; default `<runs root>/tensorboard`."""
        root = Path(settings.dir or Path(runs_root) / TENSORBOARD_DIR).expanduser().absolute()
        return settings.model_copy(update={"dir": str(root)})

    def verl_env(self, info: RunInfo) -> dict[str, str]:
        return {"TENSORBOARD_DIR": str(log_dir(info))}

    def open_writer(
        self, info: RunInfo, resumed_after: int | None = None, files_dir: Path | None = None, quiet: bool = False
    ) -> TensorBoardWriter:
        return TensorBoardWriter(log_dir(info), None if resumed_after is None else resumed_after + 1)

    def export_settings(self, own: TensorBoardSettings | None, options: ExportOptions) -> TensorBoardSettings:
        return TensorBoardSettings(dir=str(options.directory) if options.directory else (own.dir if own else None))

    def export_run(
        self, info: RunInfo, steps: dict[int, dict[str, float]], summary: dict[str, float], options: ExportOptions
    ) -> str:
        """Written aside, then swapped in whole: a second export rewrites the run's one log dir."""
        final = log_dir(info)
        staging = final.with_name(f".{final.name}.export-{uuid.uuid4().hex[:8]}")
        try:
            write(TensorBoardWriter(staging), steps, summary)
            swap_in(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return str(final)


def swap_in(staging: Path, final: Path) -> None:
    """Replace `final` by `staging` with renames only: a reader sees the old run or the new, whole."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if not final.exists():
        os.replace(staging, final)
        return
    old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)


TRACKER = TensorBoard()
