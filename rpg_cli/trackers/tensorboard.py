"""TensorBoard: one log dir per run, `<dir>/<sweep>/<run name>`. It cannot be asked what it holds, so a
resumed run purges the steps it redoes (verl's and torch's answer) and an export swaps a whole new dir in.

A live run writes through torch's SummaryWriter, one event per value (~3 ms a step of 100 values: nothing
beside a training step). An export writes whole histories, so it writes the event file itself (`EventFile`):
one event per step holding all the step's values, checksummed by google-crc32c, without torch. torch's
writer costs ~30 us a value there: a 10-deep queue and its lock per value, and a pure-Python CRC-32C per
record (tensorboard's, where TensorFlow is not installed).
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import struct
import time
import uuid
from collections.abc import Mapping, Sequence
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

    def library_env(self, info: RunInfo) -> dict[str, str]:
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
            write(EventFile(staging), steps, summary)
            swap_in(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return str(final)


class EventFile:
    """A Writer (trackers.base) that writes one event file in bulk: what `rpg export` writes.

    The same scalars torch's SummaryWriter writes (tag, step, value as float32 `simple_value`, the wall time
    of the moment it is written), one `Event` per step whose `Summary` holds all the step's values, as
    TensorFlow's merged summaries do (EventAccumulator and TensorBoard read each value of a summary). Events
    are framed as TFRecords (tensorboard.summary.writer.record_writer's format) and written every
    `FLUSH_BYTES`."""

    name = "tensorboard"
    FLUSH_BYTES = 1 << 20
    _files = itertools.count()  # tensorboard's EventFileWriter names files with a per-process counter too

    def __init__(self, log_dir: Path):
        from tensorboard.compat.proto import event_pb2

        self.event_pb2 = event_pb2
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        # EventFileWriter's name: TensorBoard reads files whose name holds "tfevents", in name order
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(self._files)}"
        self.path = Path(log_dir) / name
        self.file = self.path.open("wb")
        self.pending: list[bytes] = []
        self.size = 0
        first = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
        first.source_metadata.writer = "rpg_cli.trackers.tensorboard"
        self._add(first.SerializeToString())

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        values = numbers(data)
        if not values:
            return
        event = self.event_pb2.Event(wall_time=time.time(), step=int(step))
        add = event.summary.value.add
        for key, value in values.items():
            add(tag=key, simple_value=value)
        self._add(event.SerializeToString())

    def summary(self, values: Mapping[str, Any]) -> None:
        """Nothing: TensorBoard has no summary; every value is already a scalar at its step."""

    def _add(self, record: bytes) -> None:
        self.pending.append(record)
        self.size += len(record)
        if self.size >= self.FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.file.write(tf_records(self.pending))
            self.file.flush()
        self.pending, self.size = [], 0

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.file.close()


def tf_records(records: Sequence[bytes]) -> bytes:
    """`records` in TFRecord framing (tensorboard.summary.writer.record_writer.RecordWriter's): each as
    uint64 length, masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the data (little-endian)."""
    out = []
    for record in records:
        header = struct.pack("<Q", len(record))
        out += [header, struct.pack("<I", masked_crc32c(header)), record, struct.pack("<I", masked_crc32c(record))]
    return b"".join(out)


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum (tensorboard's `masked_crc32c`, a pure-Python loop at ~0.2 us a byte where TensorFlow
    is not installed): CRC-32C by google-crc32c's C code, rotated right by 15 bits plus a constant."""
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


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
