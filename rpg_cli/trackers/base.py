"""What a tracker module gives (`Tracker`) and what they share: the run it reports (`RunInfo`), the
options of `rpg export`, its error, and how a writer is fed. Pure Python: no tracker library here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rpg_cli.spec import NOT_IN_RUN_ID, Trackers


class TrackerError(RuntimeError):
    """A tracker that cannot be used as asked (not installed, unreachable, no runs); one-line message."""


@dataclass(frozen=True)
class RunInfo:
    """What a tracker needs of one run: identity, grouping, resolved settings and its config."""

    run_id: str
    name: str
    sweep: str
    spec: dict[str, Any]  # the canonical spec; trackers get it as config, less the trackers block
    trackers: Trackers  # resolved (rpg_cli.trackers.resolve)
    run_dir: Path

    @property
    def config(self) -> dict[str, Any]:
        config = {k: v for k, v in self.spec.items() if k not in NOT_IN_RUN_ID}
        return {**config, "rpg": {"run_id": self.run_id, "sweep": self.sweep, "group": self.trackers.group}}


@dataclass(frozen=True)
class ExportOptions:
    """`rpg export`'s settings; each tracker reads the ones it has."""

    project: str | None = None  # W&B project / MLflow experiment
    directory: Path | None = None  # TensorBoard log root; W&B's files dir (<dir>/wandb/)
    tracking_uri: str | None = None  # MLflow
    entity: str | None = None  # W&B
    offline: bool = False  # W&B offline (`wandb sync` uploads it later)


class Writer(Protocol):
    """One tracker's writer for one run. It reports a (metric, step) it already holds at most once."""

    name: str

    def log(self, step: int, data: Mapping[str, Any]) -> None: ...
    def summary(self, values: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...


class Tracker:
    """One tracker: a module of rpg_cli/trackers/ defines a subclass and registers an instance
    (rpg_cli.trackers.TRACKERS). The tracker's library is imported only when a writer opens."""

    name: ClassVar[str]  # the spec's `trackers.<name>`, `rpg export --to <name>`, verl's trainer.logger entry
    library: ClassVar[str]  # the module it needs; the extra `rpg-cli[<name>]` installs it
    credential_vars: ClassVar[tuple[str, ...]] = ()  # the env vars its library reads credentials from

    def libraries(self, settings: Any) -> list[str]:
        """The modules these settings need where the run reports."""
        return [self.library]

    def resolve(self, settings: Any, runs_root: Path, environ: Mapping[str, str]) -> Any:
        """`settings` (the spec's model) with every default filled in, paths absolute (idempotent)."""
        return settings

    def verl_env(self, info: RunInfo) -> dict[str, str]:
        """The env vars verl 0.9.1's tracking.py and the library read for this run (no credentials)."""
        return {}

    def open_writer(
        self, info: RunInfo, resumed_after: int | None = None, files_dir: Path | None = None, quiet: bool = False
    ) -> Writer:
        """The run's writer. resumed_after: the step a resumed run restarts after; files_dir: where the
        library keeps its files, if it does; quiet: an export (no console, no system metrics)."""
        raise NotImplementedError

    def export_settings(self, own: Any, options: ExportOptions) -> Any:
        """The settings `rpg export` uses: the run's own (None: it was not tracked live), options applied."""
        raise NotImplementedError

    def export_run(
        self, info: RunInfo, steps: dict[int, dict[str, float]], summary: dict[str, float], options: ExportOptions
    ) -> str:
        """Write one run's history and summary; returns where it went."""
        writer = self.open_writer(info, files_dir=options.directory, quiet=True)
        write(writer, steps, summary)
        return self.where(info, writer)

    def where(self, info: RunInfo, writer: Writer) -> str:
        raise NotImplementedError


def write(writer: Writer, steps: dict[int, dict[str, float]], summary: dict[str, float]) -> None:
    """A run's history, then its summary, then close."""
    try:
        for step, values in steps.items():
            writer.log(step, values)
        if summary:
            writer.summary(summary)
    finally:
        writer.close()


def numbers(data: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of a metrics line (what every tracker takes)."""
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__
