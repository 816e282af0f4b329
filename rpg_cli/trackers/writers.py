"""A run's live writers together (`Writers`), and the local backend's hook (`open_run`).

Metric names are metrics.jsonl's (verl's), at the same steps. Each tracker's writer (its module's
`Tracker.open_writer`) attaches to the run's tracked run if it exists and reports a (metric, step) it
already holds at most once, so a resumed trainer or a second `rpg export` adds no duplicates. The
tracker libraries are imported only when a writer opens.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rpg_cli.spec import ExperimentSpec
from rpg_cli.trackers import TRACKERS
from rpg_cli.trackers.base import RunInfo, Writer, first_line
from rpg_cli.trackers.runs import enabled, require, run_info


class Writers:
    """The run's writers together. A tracker that fails while training is reported once and dropped:
    metrics.jsonl stays the record, and `rpg export` can fill the tracker in later."""

    def __init__(self, writers: list[Writer]):
        self.writers = writers

    def _each(self, method: str, *args: Any) -> None:
        for writer in list(self.writers):
            try:
                getattr(writer, method)(*args)
            except Exception as e:
                print(
                    f"[rpg trackers] {writer.name}: {method} failed ({first_line(e)}); no longer reporting to it "
                    "(metrics.jsonl keeps every value; `rpg export` can fill it in later)",
                    file=sys.stderr,
                    flush=True,
                )
                self.writers.remove(writer)

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        self._each("log", step, data)

    def summary(self, values: Mapping[str, Any]) -> None:
        self._each("summary", values)

    def close(self) -> None:
        self._each("close")


def open_writers(info: RunInfo, names: list[str], resumed_after: int | None = None) -> Writers:
    opened: list[Writer] = []
    try:
        for name in names:
            opened.append(TRACKERS[name].open_writer(info, resumed_after))
    except BaseException:
        for writer in opened:
            writer.close()
        raise
    return Writers(opened)


def open_run(spec: ExperimentSpec, run_dir: Path, resumed_after: int | None = None):
    """Trackers of a local-backend run (None when it has none). `resumed_after`: the checkpoint step a
    resumed run restarts after; its later steps are redone and reported again."""
    if not enabled(spec.trackers):
        return None
    run_dir = Path(run_dir).absolute()
    info = run_info(spec.canonical(), spec.run_id, spec.run_name, run_dir.parent.name, run_dir, spec.trackers)
    require(info.trackers)
    return open_writers(info, enabled(info.trackers), resumed_after=resumed_after)
