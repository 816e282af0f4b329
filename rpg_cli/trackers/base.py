"""What a tracker module gives (`Tracker`, its settings model) and what they share: the run it reports
(`RunInfo`), the options of `rpg export`, its errors, and how a writer is fed. Pure Python: no tracker
library here, and no spec (the spec builds its `trackers` block from the registry, rpg_cli.trackers)."""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from rpg_cli.store.url import redact


class TrackerError(RuntimeError):
    """A tracker that cannot be used as asked (not installed, unreachable, no runs); one-line message."""


class SettingError(ValueError):
    """A setting a tracker took from the environment (`Tracker.resolve`) that cannot be used: `field` is
    the field of its settings it was for (reported as the spec's `trackers.<name>.<field>`)."""

    def __init__(self, reason: str, field: str):
        self.reason, self.field = reason, field
        super().__init__(reason)


class TrackerSettings(BaseModel):
    """A tracker's settings, the spec's `trackers.<name>` (None there: the tracker is off). The spec's
    rules (rpg_cli.spec.frozen._Frozen): frozen, no unknown field, no coercion, no inf or nan."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


@dataclass(frozen=True)
class RunInfo:
    """What a tracker needs of one run: identity, grouping, resolved settings and its config."""

    run_id: str
    name: str
    sweep: str
    config: dict[str, Any]  # the canonical spec less the trackers block, and rpg's run id, sweep and group
    trackers: Any  # the spec's `Trackers` block, resolved (rpg_cli.trackers.runs.resolve)
    run_dir: Path


@dataclass(frozen=True)
class ExportOptions:
    """`rpg export`'s settings; each tracker reads the ones it has."""

    project: str | None = None  # W&B project / MLflow experiment
    directory: Path | None = None  # TensorBoard log root; W&B's files dir (<dir>/wandb/)
    tracking_uri: str | None = None  # MLflow
    entity: str | None = None  # W&B
    offline: bool = False  # W&B offline (`wandb sync` uploads it later)
    # seconds rpg waits for the tracker's server, per request, after checking it answers (Tracker.check);
    # None: no check, the libraries' own waits and retries (MLflow's take minutes on a server that is down)
    timeout: float | None = None


class Writer(Protocol):
    """One tracker's writer for one run. It reports a (metric, step) it already holds at most once."""

    name: str

    def log(self, step: int, data: Mapping[str, Any]) -> None: ...
    def summary(self, values: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...


class Tracker:
    """One tracker: a module of rpg_cli/trackers/ defines a subclass and its settings model, and registers
    an instance (rpg_cli.trackers.TRACKERS). The tracker's library is imported only when a writer opens."""

    name: ClassVar[str]  # the spec's `trackers.<name>`, `rpg export --to <name>`, a trainer's logger entry
    settings: ClassVar[type[TrackerSettings]]  # the model of the spec's `trackers.<name>`
    library: ClassVar[str]  # the module it needs; the extra `rpg-cli[<name>]` installs it
    credential_vars: ClassVar[tuple[str, ...]] = ()  # the env vars its library reads credentials from

    def libraries(self, settings: Any) -> list[str]:
        """The modules these settings need where the run reports."""
        return [self.library]

    def resolve(self, settings: Any, runs_root: Path, environ: Mapping[str, str]) -> Any:
        """`settings` (its settings model) with every default filled in, paths absolute (idempotent); a default
        from `environ` that cannot be used raises SettingError."""
        return settings

    def library_env(self, info: RunInfo) -> dict[str, str]:
        """The env vars through which the tracker's library, driven by a trainer rpg does not run itself (a backend
        whose `WRITES_TRACKERS` is False: verl 0.9.1's tracking.py), gets this run's settings (no credentials)."""
        return {}

    def open_writer(
        self, info: RunInfo, resumed_after: int | None = None, files_dir: Path | None = None, quiet: bool = False
    ) -> Writer:
        """The run's writer. resumed_after: the step a resumed run restarts after; files_dir: where the
        library keeps its files, if it does; quiet: an export (no console, no system metrics)."""
        raise NotImplementedError

    def check(self, settings: Any, timeout: float) -> None:
        """Raise TrackerError (one line) if the server these (resolved) settings report to does not
        answer within `timeout` seconds; nothing to check (a local file, offline): return."""

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


def check_server(tracker: str, what: str, url: str, timeout: float, fix: str, path: str = "") -> None:
    """TrackerError naming `url` (its password hidden) and the fix, if the server gives no answer in
    time to a request for `url` + `path` (e.g. a health endpoint)."""
    if (why := unreachable(url.rstrip("/") + path if path else url, timeout)) is not None:
        longer = ", or give it longer with --timeout SECONDS" if why.startswith("no answer") else ""
        raise TrackerError(redact(f"trackers.{tracker}: cannot reach {what} at {url} ({why}); {fix}{longer}"))


def unreachable(url: str, timeout: float) -> str | None:
    """Why the HTTP(S) server at `url` does not answer within `timeout` seconds ("connection refused",
    "no answer within 2 s", ...), or None when it answers, whatever the status: one request, no retry.

    A reachability check only: it sends no credentials, so it neither verifies TLS nor follows
    redirects (the library does both with its own settings). Proxies are the environment's, as the
    libraries' are. Bounded as a whole, name resolution included: it runs in a thread left to end alone."""
    parts = urllib.parse.urlsplit(url)
    url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))  # no user:password@
    outcome: list[str | None] = []
    thread = threading.Thread(target=lambda: outcome.append(_ask(url, timeout)), daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


def _ask(url: str, timeout: float) -> str | None:
    # imported here: the spec imports this module (through the registry), and reads no URL
    import socket
    import ssl
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # a redirect is an answer: urllib raises it as an HTTPError

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), NoRedirect)
    try:
        opener.open(url, timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # it answered (401, 404, 503...): the library reports what the answer means
    except (urllib.error.URLError, OSError) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return f"no answer within {timeout:g} s"
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, socket.gaierror):
            return "unknown host"
        return first_line(reason) if isinstance(reason, BaseException) else str(reason)
    except Exception as e:  # http.client's protocol errors: something answered, not as HTTP
        return first_line(e)
    return None
