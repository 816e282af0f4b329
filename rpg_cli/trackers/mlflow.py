"""MLflow: the run tagged `rpg.run_id` in the project's experiment, found again rather than duplicated;
metric names in the form verl's MLflow adapter uses (`mlflow_key`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import field_validator

from rpg_cli.rundir import MLFLOW_DB
from rpg_cli.store.url import redact
from rpg_cli.trackers.base import (
    ExportOptions,
    RunInfo,
    SettingError,
    Tracker,
    TrackerError,
    TrackerSettings,
    check_server,
    first_line,
    numbers,
    write,
)


class MlflowSettings(TrackerSettings):
    # default: MLFLOW_TRACKING_URI where the run runs, else sqlite:///<runs dir>/mlflow.db
    tracking_uri: str | None = None

    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, uri: str | None) -> str | None:
        from urllib.parse import urlsplit

        if uri and "://" in uri and (urlsplit(uri).password or urlsplit(uri).username):
            raise ValueError(
                "credentials in the URI would be written to spec.json and the store; allowed: a URI "
                "without user:password@ (set MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN "
                "where the run runs)"
            )
        return uri


# MLflow's log_batch limits (mlflow.utils.validation): 1,000 metrics of keys up to 250 characters also stay
# under its 1 MB request limit
MLFLOW_METRICS_PER_BATCH = 1000
MLFLOW_PARAMS_PER_BATCH = 100
MLFLOW_PARAM_CHARS = 6000


def mlflow_key(key: str) -> str:
    """A metric name as MLflow accepts it, by verl 0.9.1's rule (its MLflow adapter), so both backends'
    runs carry the same names: `@` -> `_at_`, `//` -> `/`, anything but word chars, `/ . - :` and space -> `_`."""
    key = re.sub(r"/+", "/", key.replace("@", "_at_"))
    return re.sub(r"[^/\w.\- :]", "_", key)


def run_tags(info: RunInfo) -> dict[str, str]:
    """MLflow has key/value tags: `field=value` tags split, plain ones with an empty value."""
    tags = {"rpg.run_id": info.run_id, "rpg.sweep": info.sweep, "rpg.group": str(info.trackers.group)}
    for tag in info.trackers.tags:
        key, _, value = tag.partition("=")
        if key != "sweep":  # rpg.sweep already
            tags.setdefault(mlflow_key(key), value)
    return tags


def absolute_uri(uri: str) -> str:
    """sqlite:/// and file: URIs (and bare paths, which MLflow reads as a file store) with absolute paths."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = uri.removeprefix("sqlite:///")
        return f"sqlite:///{Path(path).expanduser().absolute()}" if path and path != ":memory:" else uri
    if uri.startswith("file:"):
        path = uri.removeprefix("file://") if uri.startswith("file://") else uri.removeprefix("file:")
        return Path(path).expanduser().absolute().as_uri()
    if "://" not in uri and ":" not in uri.split("/")[0]:
        return Path(uri).expanduser().absolute().as_uri()
    return uri


def is_database_uri(uri: str | None) -> bool:
    scheme = (uri or "").split(":", 1)[0].split("+", 1)[0]
    return scheme in ("sqlite", "postgresql", "mysql", "mssql")


def is_file_store(uri: str) -> bool:
    return uri.startswith("file:")


def is_http(uri: str | None) -> bool:
    return (uri or "").startswith(("http://", "https://"))


@contextlib.contextmanager
def http_limits(timeout: float | None) -> Iterator[None]:
    """MLflow's REST client, for the block, waits `timeout` seconds per request (its
    MLFLOW_HTTP_REQUEST_TIMEOUT, whole seconds, default 120) and retries nothing unless
    MLFLOW_HTTP_REQUEST_MAX_RETRIES is set (its default, 7 with backoff, waits minutes on a server that
    is down: an export that stops is run again and adds only what is missing). Both are read per request."""
    if timeout is None:
        yield
        return
    limits = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(timeout)))}
    limits["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    before = {key: os.environ.get(key) for key in limits}
    os.environ.update(limits)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _check_env_uri(uri: str) -> None:
    """MLFLOW_TRACKING_URI as a default is refused if it carries credentials (the spec's own rule: a
    resolved URI is recorded in spec.json and the store)."""
    from pydantic import ValidationError

    try:
        MlflowSettings(tracking_uri=uri)
    except ValidationError as e:
        raise SettingError(f"MLFLOW_TRACKING_URI: {e.errors()[0]['ctx']['error']}", "tracking_uri") from None


class MlflowWriter:
    name = "mlflow"

    def __init__(self, info: RunInfo, batched: bool = False):
        """batched (an export): metrics are sent MLFLOW_METRICS_PER_BATCH at a time across steps, the rest
        at close; else (a live run) each step's as it is logged."""
        self.batched = batched
        self.pending: list[Any] = []  # mlflow.entities.Metric, not sent yet
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
                self.run_id = self.client.create_run(experiment, run_name=info.name, tags=run_tags(info)).info.run_id
                self.logged = set()
                self._params(info.config)
        except Exception as e:  # unreachable server, bad URI, store errors
            raise TrackerError(
                redact(f"trackers.mlflow: cannot open the MLflow run at {uri} ({first_line(e)})")
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
        for key, value in numbers(data).items():
            name = mlflow_key(key)
            if (name, step) not in self.logged:
                self.pending.append(Metric(name, value, now, step))
                self.logged.add((name, step))
        self._send(everything=not self.batched)

    def _send(self, everything: bool) -> None:
        """log_batch calls of MLFLOW_METRICS_PER_BATCH metrics; a last partial one only if `everything`.
        Each call costs MLflow a transaction and a latest-value update per key (its SQL store: ~40 ms for
        100 metrics), so an export fills every call rather than sending one step per call."""
        size = MLFLOW_METRICS_PER_BATCH
        while len(self.pending) >= size or (everything and self.pending):
            self.client.log_batch(self.run_id, metrics=self.pending[:size])
            del self.pending[:size]  # sent: never sent again, should a later call fail

    def summary(self, values: Mapping[str, Any]) -> None:
        """Nothing: an MLflow metric's latest value is its summary, and every value is logged at its step."""

    def close(self) -> None:
        self._send(everything=True)
        self.client.set_terminated(self.run_id)


def _flat_params(value: Any, prefix: str = "") -> dict[str, str]:
    # spec.fields.flatten's walk, with MLflow's keys and text values: a tracker module imports no spec (the spec
    # builds its trackers block from this registry: ARCHITECTURE.md's one arrow up)
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flat_params(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {mlflow_key(prefix): value if isinstance(value, str) else json.dumps(value)}


class Mlflow(Tracker):
    name = "mlflow"
    settings = MlflowSettings
    library = "mlflow"
    credential_vars = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")

    def libraries(self, settings: MlflowSettings | None) -> list[str]:
        # MLflow's SQL stores (sqlite:, postgresql:, ...) migrate with alembic
        uri = settings.tracking_uri if settings is not None else None
        return [self.library, "alembic"] if is_database_uri(uri) else [self.library]

    def resolve(self, settings: MlflowSettings, runs_root: Path, environ: Mapping[str, str]) -> MlflowSettings:
        """The URI: the spec's, else MLFLOW_TRACKING_URI, else `sqlite:///<runs root>/mlflow.db`; paths absolute."""
        uri = settings.tracking_uri or environ.get("MLFLOW_TRACKING_URI") or ""
        if uri and not settings.tracking_uri:
            _check_env_uri(uri)
        uri = absolute_uri(uri or f"sqlite:///{Path(runs_root).absolute() / MLFLOW_DB}")
        return settings.model_copy(update={"tracking_uri": uri})

    def library_env(self, info: RunInfo) -> dict[str, str]:
        # a trainer (verl) passes MLflow only the experiment and run name: URI and tags travel as env vars
        assert info.trackers.mlflow is not None
        uri = str(info.trackers.mlflow.tracking_uri)
        env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_CONTEXT": json.dumps(run_tags(info), sort_keys=True)}
        if is_file_store(uri):
            env["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses file stores unless asked; the spec asked
        return env

    def open_writer(
        self, info: RunInfo, resumed_after: int | None = None, files_dir: Path | None = None, quiet: bool = False
    ) -> MlflowWriter:
        return MlflowWriter(info)

    def check(self, settings: MlflowSettings, timeout: float) -> None:
        """A tracking server (http/https) answers its health endpoint; a local store needs no check."""
        uri = str(settings.tracking_uri or "")
        if is_http(uri):
            fix = "check --tracking-uri (or MLFLOW_TRACKING_URI) and that the server is up"
            check_server(self.name, "the MLflow server", uri, timeout, fix, path="/health")

    def export_run(
        self, info: RunInfo, steps: dict[int, dict[str, float]], summary: dict[str, float], options: ExportOptions
    ) -> str:
        with http_limits(options.timeout):
            writer = MlflowWriter(info, batched=True)
            write(writer, steps, summary)
            return self.where(info, writer)

    def export_settings(self, own: MlflowSettings | None, options: ExportOptions) -> MlflowSettings:
        try:
            return MlflowSettings(tracking_uri=options.tracking_uri or (own.tracking_uri if own else None))
        except ValueError as e:  # pydantic's ValidationError: credentials in the URI
            raise TrackerError(f"--tracking-uri: {e.errors()[0]['ctx']['error']}") from None

    def where(self, info: RunInfo, writer: MlflowWriter) -> str:
        uri = info.trackers.mlflow.tracking_uri if info.trackers.mlflow else ""
        return redact(f"{uri} run {writer.run_id}")


TRACKER = Mlflow()
