"""Weights & Biases: the run `rpg-<run id>`, resumed, never duplicated; group, job type (the sweep), tags."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from rpg_cli.trackers.base import (
    ExportOptions,
    RunInfo,
    Tracker,
    TrackerError,
    TrackerSettings,
    check_server,
    first_line,
    numbers,
    write,
)


class WandbSettings(TrackerSettings):
    entity: str | None = None  # default: WANDB_ENTITY where the run runs, else the account's default
    mode: Literal["online", "offline"] | None = None  # default: WANDB_MODE where the run runs, else online


EXPORT_SETTINGS: dict[str, Any] = {
    "silent": True,
    "console": "off",
    "x_disable_stats": True,
    "x_disable_meta": True,
    "x_disable_machine_info": True,
    "x_save_requirements": False,
    "disable_git": True,
    "save_code": False,
}


def wandb_run_id(run_id: str) -> str:
    """The W&B run id of an rpg run: the same for the live run, its resumed attempts and `rpg export`."""
    return f"rpg-{run_id}"


class WandbWriter:
    name = "wandb"

    def __init__(self, info: RunInfo, root_dir: Path, quiet: bool = False, init_timeout: float | None = None):
        import wandb

        settings = info.trackers.wandb
        assert settings is not None
        Path(root_dir).mkdir(parents=True, exist_ok=True)
        # an export has no console to capture and no system to sample, and the machine, packages and git of
        # the machine that exports are not the run's: not recorded (W&B's requirements scan alone is ~0.25 s a run)
        extra: dict[str, Any] = EXPORT_SETTINGS if quiet else {}
        if init_timeout is not None:  # W&B's own: 90 s
            extra = {**extra, "init_timeout": init_timeout}
        try:
            self.run = wandb.init(
                id=wandb_run_id(info.run_id),
                resume="allow",
                project=info.trackers.project,
                entity=settings.entity,
                group=info.trackers.group,
                job_type=info.sweep,
                tags=list(info.trackers.tags),
                name=info.name,
                config=info.config,
                dir=str(root_dir),
                mode=settings.mode,
                settings=wandb.Settings(**extra) if extra else None,
            )
        except Exception as e:  # wandb raises many kinds (UsageError, CommError, ...): all mean "cannot start"
            raise TrackerError(
                f"trackers.wandb: cannot start the W&B run ({first_line(e)}); "
                "check WANDB_API_KEY / `wandb login`, or use mode offline"
            ) from None
        self.first_step = self.run.step  # a resumed online run continues after its last logged step

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        if step >= self.first_step:  # W&B keeps steps increasing; what it has stays as it is
            self.run.log(numbers(data), step=step)

    def summary(self, values: Mapping[str, Any]) -> None:
        self.run.summary.update(dict(values))

    def close(self) -> None:
        self.run.finish()

    @property
    def files_dir(self) -> Path:
        """The run's directory under <dir>/wandb/ (offline: offline-run-<time>-<id>)."""
        return Path(self.run.settings.sync_dir)


class Wandb(Tracker):
    name = "wandb"
    settings = WandbSettings
    library = "wandb"
    credential_vars = ("WANDB_API_KEY",)

    def resolve(self, settings: WandbSettings, runs_root: Path, environ: Mapping[str, str]) -> WandbSettings:
        """Entity and mode from WANDB_ENTITY / WANDB_MODE where not set (else the account's entity, online)."""
        mode = settings.mode or environ.get("WANDB_MODE")
        return settings.model_copy(
            update={
                "entity": settings.entity or environ.get("WANDB_ENTITY") or None,
                "mode": mode if mode in ("online", "offline") else "online",
            }
        )

    def library_env(self, info: RunInfo) -> dict[str, str]:
        # a trainer (verl) passes W&B only project, name, entity and config: the rest travels as wandb's own env vars
        t = info.trackers
        assert t.wandb is not None
        env = {
            "WANDB_RUN_ID": wandb_run_id(info.run_id),
            "WANDB_RESUME": "allow",
            "WANDB_RUN_GROUP": str(t.group),
            "WANDB_JOB_TYPE": info.sweep,
            "WANDB_TAGS": ",".join(t.tags),
            "WANDB_DIR": str(info.run_dir),
            "WANDB_MODE": str(t.wandb.mode),
        }
        if t.wandb.entity:
            env["WANDB_ENTITY"] = t.wandb.entity
        return env

    def open_writer(
        self, info: RunInfo, resumed_after: int | None = None, files_dir: Path | None = None, quiet: bool = False
    ) -> WandbWriter:
        return WandbWriter(info, files_dir or info.run_dir, quiet=quiet)

    def check(self, settings: WandbSettings, timeout: float) -> None:
        """Online: W&B's server (WANDB_BASE_URL, `wandb login --host`, else api.wandb.ai) answers."""
        if settings.mode == "online":
            from wandb.sdk import wandb_setup

            url = wandb_setup.singleton().settings.base_url  # the one wandb.init will use; starts nothing
            fix = "check WANDB_BASE_URL (or `wandb login --host`) and the network, or use --offline"
            check_server(self.name, "the W&B server", url, timeout, fix)

    def export_settings(self, own: WandbSettings | None, options: ExportOptions) -> WandbSettings:
        return WandbSettings(
            entity=options.entity or (own.entity if own else None),
            mode="offline" if options.offline else (own.mode if own else None),
        )

    def export_run(
        self, info: RunInfo, steps: dict[int, dict[str, float]], summary: dict[str, float], options: ExportOptions
    ) -> str:
        root = options.directory or info.run_dir.parent.parent  # W&B files: <dir>/wandb/, apart from live runs' own
        writer = WandbWriter(info, Path(root), quiet=True, init_timeout=options.timeout)
        write(writer, steps, summary)
        if info.trackers.wandb is not None and info.trackers.wandb.mode == "offline":
            drop_earlier_offline_runs(writer.files_dir, wandb_run_id(info.run_id))
            return str(writer.files_dir)
        return str(writer.run.url or writer.run.id)


def drop_earlier_offline_runs(current: Path, wandb_id: str) -> None:
    """Offline, W&B writes a new offline-run-<time>-<id> directory per init (with a suffix, -1, ..., when one
    of that second exists): keep only the newest export."""
    earlier = [*current.parent.glob(f"offline-run-*-{wandb_id}"), *current.parent.glob(f"offline-run-*-{wandb_id}-*")]
    for entry in earlier:
        if entry.is_dir() and entry.resolve() != current.resolve():
            shutil.rmtree(entry)


TRACKER = Wandb()
