"""One writer per tracker, for one run: `log(step, metrics)`, `summary(values)`, `close()`.

Metric names are metrics.jsonl's (verl's), at the same steps; MLflow gets them in the form verl's MLflow
adapter uses (`mlflow_key`). Each writer attaches to the run's tracked run if it exists (W&B: the same
id, resumed; MLflow: the run tagged with the rpg run id), and reports a (metric, step) it already holds
at most once, so a resumed trainer or a second `rpg export` adds no duplicates. TensorBoard, which
cannot be asked, is given verl's and torch's answer: `purge_step` drops what a resumed run redoes.

The tracker libraries are imported here only, when a writer opens.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rpg_cli.spec import ExperimentSpec
from rpg_cli.trackers import (
    RunInfo,
    TrackerError,
    enabled,
    is_file_store,
    mlflow_key,
    require,
    run_info,
    wandb_run_id,
)

MLFLOW_METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
MLFLOW_PARAMS_PER_BATCH = 100
MLFLOW_PARAM_CHARS = 6000


def _numbers(data: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardWriter:
    name = "tensorboard"

    def __init__(self, log_dir: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step)

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        for key, value in _numbers(data).items():
            self.writer.add_scalar(key, value, global_step=step)

    def summary(self, values: Mapping[str, Any]) -> None:
        """Nothing: TensorBoard has no summary; every value is already a scalar at its step."""

    def close(self) -> None:
        self.writer.close()


class WandbWriter:
    name = "wandb"

    def __init__(self, info: RunInfo, root_dir: Path, quiet: bool = False):
        import wandb

        settings = info.trackers.wandb
        assert settings is not None
        Path(root_dir).mkdir(parents=True, exist_ok=True)
        # an export has no console to capture and no system to sample
        extra = wandb.Settings(silent=True, console="off", x_disable_stats=True) if quiet else None
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
                settings=extra,
            )
        except Exception as e:  # wandb raises many kinds (UsageError, CommError, ...): all mean "cannot start"
            raise TrackerError(
                f"trackers.wandb: cannot start the W&B run ({_first_line(e)}); "
                "check WANDB_API_KEY / `wandb login`, or use mode offline"
            ) from None
        self.first_step = self.run.step  # a resumed online run continues after its last logged step

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        if step >= self.first_step:  # W&B keeps steps increasing; what it has stays as it is
            self.run.log(_numbers(data), step=step)

    def summary(self, values: Mapping[str, Any]) -> None:
        self.run.summary.update(dict(values))

    def close(self) -> None:
        self.run.finish()

    @property
    def files_dir(self) -> Path:
        """The run's directory under <dir>/wandb/ (offline: offline-run-<time>-<id>)."""
        return Path(self.run.settings.sync_dir)


class MlflowWriter:
    name = "mlflow"

    def __init__(self, info: RunInfo):
        settings = info.trackers.mlflow
        assert settings is not None and settings.tracking_uri
        uri = settings.tracking_uri
        if is_file_store(uri):
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses file stores unless asked; the spec asked
        from mlflow.tracking import MlflowClient

        try:
            self.client = MlflowClient(tracking_uri=uri)
            experiment = self._experiment(info.trackers.project)
            found = self.client.search_runs(
                [experiment], filter_string=f"tags.`rpg.run_id` = '{info.run_id}'", max_results=1
            )
            if found:
                self.run_id = found[0].info.run_id
                self.logged = self._logged(found[0].data.metrics)
            else:
                self.run_id = self.client.create_run(
                    experiment, run_name=info.name, tags=info.mlflow_tags()
                ).info.run_id
                self.logged = set()
                self._params(info.config)
        except Exception as e:  # unreachable server, bad URI, store errors
            raise TrackerError(
                f"trackers.mlflow: cannot open the MLflow run at {_safe(uri)} ({_first_line(e)})"
            ) from None

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # another process created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _logged(self, keys: Mapping[str, Any]) -> set[tuple[str, int]]:
        return {(key, m.step) for key in keys for m in self.client.get_metric_history(self.run_id, key)}

    def _params(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, v[:MLFLOW_PARAM_CHARS]) for k, v in _flat_params(config).items()]
        for i in range(0, len(params), MLFLOW_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + MLFLOW_PARAMS_PER_BATCH])

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = []
        for key, value in _numbers(data).items():
            name = mlflow_key(key)
            if (name, step) not in self.logged:
                metrics.append(Metric(name, value, now, step))
                self.logged.add((name, step))
        for i in range(0, len(metrics), MLFLOW_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + MLFLOW_METRICS_PER_BATCH])

    def summary(self, values: Mapping[str, Any]) -> None:
        """Nothing: an MLflow metric's latest value is its summary, and every value is logged at its step."""

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat_params(value: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flat_params(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {mlflow_key(prefix): value if isinstance(value, str) else json.dumps(value)}


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__


def _safe(uri: str) -> str:
    """A URI fit to print: any user:password@ dropped (MLFLOW_TRACKING_URI may carry one)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if "://" in uri and "@" in parts.netloc:
        return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return uri


class Writers:
    """The run's writers together. A tracker that fails while training is reported once and dropped:
    metrics.jsonl stays the record, and `rpg export` can fill the tracker in later."""

    def __init__(self, writers: list[Any]):
        self.writers = writers

    def _each(self, method: str, *args: Any) -> None:
        for writer in list(self.writers):
            try:
                getattr(writer, method)(*args)
            except Exception as e:
                print(
                    f"[rpg trackers] {writer.name}: {method} failed ({_first_line(e)}); no longer reporting to it "
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


def open_writer(
    name: str, info: RunInfo, resumed_after: int | None = None, wandb_dir: Path | None = None, quiet: bool = False
):
    """One tracker's writer for `info`'s run (its settings resolved: see rpg_cli.trackers.resolve)."""
    if name == "tensorboard":
        return TensorBoardWriter(info.tensorboard_dir, None if resumed_after is None else resumed_after + 1)
    if name == "wandb":
        return WandbWriter(info, wandb_dir or info.run_dir, quiet=quiet)
    if name == "mlflow":
        return MlflowWriter(info)
    raise ValueError(f"unknown tracker {name!r}")


def open_writers(info: RunInfo, names: list[str], resumed_after: int | None = None) -> Writers:
    opened: list[Any] = []
    try:
        for name in names:
            opened.append(open_writer(name, info, resumed_after))
    except BaseException:
        for writer in opened:
            writer.close()
        raise
    return Writers(opened)


# ---------------------------------------------------------------------------------------------
# The local backend's hook


def open_run(spec: ExperimentSpec, run_dir: Path, resumed_after: int | None = None):
    """Trackers of a local-backend run (None when it has none). `resumed_after`: the checkpoint step a
    resumed run restarts after; its later steps are redone and reported again."""
    if not enabled(spec.trackers):
        return None
    run_dir = Path(run_dir).absolute()
    info = run_info(spec.canonical(), spec.run_id, spec.run_name, run_dir.parent.name, run_dir, spec.trackers)
    require(info.trackers)
    return open_writers(info, enabled(info.trackers), resumed_after=resumed_after)
