"""Ray Jobs: one job per run, on a local Ray head that lives under runs/ (or on the cluster at --address).

The store is the source of truth for what rpg intends; Ray is the source of truth for what happened.
Every state change is committed on its own, and the intent to submit (attempt, submission id) is
committed before the submission: so an rpg killed at any point (Ctrl-C, SIGKILL) leaves a store that
the next `rpg sweep` reconciles with Ray: it skips succeeded runs, re-attaches to live ones, resubmits
lost ones, and retries failed or stopped ones only when asked.

The local head is started with `ray start` in a process group of its own, bound to 127.0.0.1 and
protected by a token of its own (runs/ray/auth_token), with its files in runs/ray (or a short
directory under /tmp when that path is too long for Ray's Unix sockets). It outlives rpg so jobs keep
running; `stop_local_head` ends it (and only it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli.plan import RunPlan, write_spec
from rpg_cli.store import DEFAULT_DB_URL, STATUSES, TERMINAL, RunRecord, Store, StoreError, open_store

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

DEFAULT_RUNS_DIR = Path("runs")
REWARD_KEY = "critic/score/mean"
LIVE = frozenset({"submitted", "running"})
_STATUS_FROM_RAY = {
    "PENDING": "submitted",
    "RUNNING": "running",
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "STOPPED": "stopped",
}
# Ray binds Unix sockets at <temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/<name>: about 69
# bytes past the temp dir, within the 107 (Linux) or 103 (macOS) bytes a socket path may have.
_MAX_TEMP_DIR_LEN = (103 if sys.platform == "darwin" else 107) - 69


class ClusterError(RuntimeError):
    """The Ray cluster cannot be reached or started. The message is one line naming the fix."""


# --------------------------------------------------------------------------------------- local head


@dataclass(frozen=True)
class Head:
    dashboard_url: str  # what the Jobs API talks to
    gcs_address: str
    temp_dir: str  # Ray's files (sessions, logs, sockets)
    pgid: int  # every Ray daemon of this head runs in this process group
    host: str
    token_file: str  # the head's own auth token: nobody else on this machine can submit to it

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {Path(self.token_file).read_text().strip()}"}


def _head_dir(runs_dir: Path) -> Path:
    return Path(runs_dir).resolve() / "ray"


def _temp_dir(head_dir: Path) -> Path:
    if len(str(head_dir)) <= _MAX_TEMP_DIR_LEN:
        return head_dir
    tmp = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    return tmp / f"rpg-ray-{hashlib.sha1(str(head_dir).encode()).hexdigest()[:10]}"


def _read_head(head_dir: Path) -> Head | None:
    try:
        head = Head(**json.loads((head_dir / "head.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return head if head.host == socket.gethostname() else None


def _dashboard_alive(head: Head) -> bool:
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via $http_proxy
    try:
        request = urllib.request.Request(f"{head.dashboard_url}/api/version", headers=head.auth_headers)
        with no_proxy.open(request, timeout=3) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock across processes: two rpg commands must not start two heads."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def local_head(
    runs_dir: Path = DEFAULT_RUNS_DIR,
    start: bool = True,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    timeout_s: float = 180.0,
) -> Head | None:
    """The live local head of `runs_dir`, started if needed (and `start`); None if none and not `start`."""
    head_dir = _head_dir(runs_dir)
    if not start and not (head_dir / "head.json").exists():
        return None
    head_dir.mkdir(parents=True, exist_ok=True)
    with _locked(head_dir / "head.lock"):
        head = _read_head(head_dir)
        if head is not None and _dashboard_alive(head):
            return head
        if not start:
            return None
        if head is not None:  # ours, but no longer answering: clear what is left of it
            _kill_head_processes(head)
        return _start_head(head_dir, num_cpus, num_gpus, timeout_s)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _start_head(head_dir: Path, num_cpus: int | None, num_gpus: int | None, timeout_s: float) -> Head:
    gcs, dashboard, client, agent_http, agent_grpc, metrics, runtime_env = _free_ports(7)
    temp_dir = _temp_dir(head_dir)
    temp_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
        "--node-ip-address=127.0.0.1", f"--port={gcs}",
        "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", "--include-dashboard=true",
        f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent_http}",
        f"--dashboard-agent-grpc-port={agent_grpc}", f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={runtime_env}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
    ]  # fmt: skip
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus}")
    token_file = head_dir / "auth_token"
    if not token_file.exists():
        _atomic_write(token_file, secrets.token_hex(32), mode=0o600)
    env = {
        **os.environ,
        # Ray resolves 127.0.0.1 to the machine's address and listens on every interface unless it
        # believes it is a single-machine (macOS/Windows-style) setup: this keeps it on loopback.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        # Jobs inherit the head's environment: put this Python's bin first so `python` means rpg's.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        # Token authentication with a token of this head's own (not ~/.ray/auth_token, whose mere
        # existence would otherwise decide the mode): loopback is shared by every local user. Jobs
        # inherit these, so a job's own ray.init() reaches its cluster.
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
    }
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN"):
        env.pop(var, None)
    log = head_dir / "start.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    head = Head(f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}", str(temp_dir), proc.pid, socket.gethostname(), str(token_file))
    # Recorded before it is ready: if rpg is interrupted now, the next one finds it and clears it.
    _atomic_write(head_dir / "head.json", json.dumps(head.__dict__, indent=2))
    deadline = time.monotonic() + timeout_s
    try:
        code = proc.wait(timeout=timeout_s)
        if code != 0:
            raise ClusterError(f"`ray start --head` failed (exit {code}): {_last_line(log)} (full log: {log})")
        while not _dashboard_alive(head):
            if time.monotonic() > deadline:
                raise ClusterError(f"the local Ray head did not answer within {timeout_s:.0f} s (log: {log})")
            time.sleep(0.5)
    except (ClusterError, subprocess.TimeoutExpired) as exc:
        _kill_head_processes(head)
        (head_dir / "head.json").unlink(missing_ok=True)
        if isinstance(exc, ClusterError):
            raise
        raise ClusterError(f"`ray start --head` did not finish within {timeout_s:.0f} s (log: {log})") from None
    return head


def _kill_head_processes(head: Head, grace_s: float = 3.0) -> None:
    """Terminate the head's process group and everything its daemons started (workers, job drivers
    run in groups of their own); by pid, and only if the group is still the one running this head.
    gcs_server and raylet may take well over 10 s to honour SIGTERM; Ray's daemons survive SIGKILL
    cleanly (it is what `ray stop --force` sends), so the grace period is short."""
    import psutil

    def pgid(p: psutil.Process) -> int | None:
        with contextlib.suppress(OSError):
            return os.getpgid(p.pid)
        return None

    def cmdline(p: psutil.Process) -> str:
        with contextlib.suppress(psutil.Error):
            return " ".join(p.cmdline())
        return ""

    group = [p for p in psutil.process_iter() if pgid(p) == head.pgid]
    if not any(head.temp_dir in cmdline(p) for p in group):
        return  # gone, or the group id now belongs to someone else
    family = set(group)
    for p in group:
        with contextlib.suppress(psutil.Error):
            family.update(p.children(recursive=True))
    family.discard(psutil.Process())
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(list(family), timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def stop_local_head(runs_dir: Path = DEFAULT_RUNS_DIR) -> bool:
    """Stop the local head of `runs_dir` (its jobs die with it). False when there was none."""
    head_dir = _head_dir(runs_dir)
    if not (head_dir / "head.json").exists():
        return False
    with _locked(head_dir / "head.lock"):
        head = _read_head(head_dir)
        if head is None:
            return False
        _kill_head_processes(head)
        (head_dir / "head.json").unlink(missing_ok=True)
        return True


# ------------------------------------------------------------------------------------------ client


@contextlib.contextmanager
def _without_env(*names: str) -> Iterator[None]:
    saved = {n: os.environ.pop(n) for n in names if n in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def connect(address: str | None = None, runs_dir: Path = DEFAULT_RUNS_DIR, start: bool = True) -> JobSubmissionClient | None:
    """A Jobs API client: for `address` (or $RAY_ADDRESS) if given, else for the local head of
    `runs_dir` (started if needed and `start`; None when there is none and not `start`)."""
    address = address or os.environ.get("RAY_ADDRESS")
    headers = None
    if not address:
        head = local_head(runs_dir, start=start)
        if head is None:
            return None
        address, headers = head.dashboard_url, head.auth_headers
    from ray.job_submission import JobSubmissionClient

    # Ray lets $RAY_ADDRESS override an explicit address; here the explicit one wins.
    with _without_env("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        try:
            return JobSubmissionClient(address, headers=headers)
        except Exception as exc:  # ConnectionError, ValueError, version mismatch: all mean "not usable"
            raise ClusterError(
                f"cannot reach the Ray cluster at {address} ({_one_line(exc)}); check --address, or omit it "
                "to let rpg start a local head (or start one yourself: ray start --head)"
            ) from None


# --------------------------------------------------------------------------------------- progress


@dataclass(frozen=True)
class RunProgress:
    id: str
    name: str
    status: str
    attempts: int
    step: int | None  # last step ingested from metrics.jsonl
    reward: float | None  # last critic/score/mean
    error: str | None


@dataclass(frozen=True)
class SweepProgress:
    sweep: str
    runs: tuple[RunProgress, ...]

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.runs) for s in STATUSES}

    @property
    def finished(self) -> bool:
        return all(r.status in TERMINAL for r in self.runs)


def progress(store: Store, sweep: str, run_ids: Iterable[str]) -> SweepProgress:
    records = store.runs(ids=list(run_ids))
    ids = [r.id for r in records]
    steps = store.last_steps(ids)
    rewards = store.latest_values(ids, [REWARD_KEY])
    return SweepProgress(
        sweep,
        tuple(
            RunProgress(
                r.id,
                r.name,
                r.status,
                r.attempts,
                steps.get(r.id),
                rewards.get(r.id, {}).get(REWARD_KEY, (None, None))[1],
                r.error,
            )
            for r in records
        ),
    )


# -------------------------------------------------------------------------------------------- sweep


def run_sweep(
    plans: Iterable[RunPlan],
    sweep_name: str,
    db_url: str = DEFAULT_DB_URL,
    address: str | None = None,
    detach: bool = False,
    retry_failed: bool = False,
    on_update: Callable[[SweepProgress], None] | None = None,
    runs_dir: Path = DEFAULT_RUNS_DIR,
    poll_s: float = 2.0,
) -> SweepProgress:
    """Submit the sweep's runs that need it, then (unless `detach`) follow them to the end.

    Succeeded runs are skipped, live ones re-attached, lost ones (unknown to the cluster) resubmitted,
    failed or stopped ones resubmitted only with `retry_failed`. `on_update` receives a snapshot
    after the submissions and after every poll; the last snapshot is returned. Metrics are ingested
    into the store as they arrive. Interrupting (KeyboardInterrupt) leaves the jobs running and the
    store consistent: run the same sweep again to re-attach.
    """
    plans = list({p.id: p for p in plans}.values())
    client = connect(address, runs_dir)  # before touching the store: an unreachable cluster writes nothing
    _check_backends(plans, db_url)
    store = open_store(db_url)
    try:
        store.record_plans(plans, sweep_name)
        ids = [p.id for p in plans]
        try:
            jobs = _ray_jobs(client)
            for plan in plans:
                _launch(client, store, plan, jobs, retry_failed)
            while True:
                snapshot = progress(store, sweep_name, ids)
                if on_update is not None:
                    on_update(snapshot)
                if detach or snapshot.finished:
                    return snapshot
                time.sleep(poll_s)
                _poll(client, store, ids)
        except OSError as exc:  # requests' connection errors: the cluster went away
            raise ClusterError(
                f"lost the Ray cluster ({_one_line(exc)}); every state is in the store: run the sweep again to re-attach"
            ) from None
    finally:
        store.close()


def _check_backends(plans: list[RunPlan], db_url: str) -> None:
    """verl logs a plugin that fails to import only at debug level, and the job would then die on an
    unknown loss name: check in a fresh interpreter, before anything is submitted, that it loads."""
    from rpg_cli.store import run_states

    states = run_states(db_url, [p.id for p in plans if p.backend == "verl"])
    if any(p.backend == "verl" and states.get(p.id) != "succeeded" for p in plans):
        from rpg_cli.backends.verl.diagnose import check_plugin_loads

        try:
            check_plugin_loads()
        except RuntimeError as exc:
            raise ClusterError(str(exc)) from None


def _ray_jobs(client: JobSubmissionClient) -> dict[str, JobDetails]:
    return {job.submission_id: job for job in client.list_jobs() if job.submission_id}


def _launch(client: JobSubmissionClient, store: Store, plan: RunPlan, jobs: dict[str, JobDetails], retry_failed: bool) -> None:
    run = store.run(plan.id)
    assert run is not None, "record_plans runs first"
    if run.submission_id in jobs:  # Ray knows what became of it while no rpg was watching
        _sync(client, store, run, jobs[run.submission_id])
        run = store.run(plan.id)
        assert run is not None
    if run.status == "succeeded" or (run.status in LIVE and run.submission_id in jobs):
        return
    if run.status in ("failed", "stopped") and not retry_failed:
        return
    if run.status == "pending" and run.submission_id and run.submission_id not in jobs:
        submission_id = run.submission_id  # the intent was recorded, the submission never reached Ray
    else:  # never submitted, lost with a restarted cluster, or a retry
        _, submission_id = store.begin_attempt(plan.id)
    _submit(client, store, plan, submission_id)


def _entrypoint(plan: RunPlan) -> str:
    # Ray runs the entrypoint through a shell in the directory the head was started from: go to
    # where rpg runs, so that relative paths in the plan mean what they mean here. The local head
    # shares this filesystem, so nothing is uploaded (no runtime_env working_dir); a remote cluster
    # must see the same path (a shared filesystem). Every argument is quoted: no value reaches the
    # shell unquoted.
    return f"cd {shlex.quote(os.getcwd())} && exec {shlex.join(plan.entrypoint)}"


def _submit(client: JobSubmissionClient, store: Store, plan: RunPlan, submission_id: str) -> None:
    write_spec(plan)
    try:
        client.submit_job(
            entrypoint=_entrypoint(plan),
            submission_id=submission_id,
            runtime_env={"env_vars": dict(plan.env)} if plan.env else None,
            entrypoint_num_cpus=plan.num_cpus,
            entrypoint_num_gpus=plan.num_gpus or None,
            metadata={"rpg_sweep": plan.sweep, "rpg_run": plan.name},
        )
    except RuntimeError as exc:  # the cluster answered, and refused
        if "already exists" not in str(exc):
            store.set_status(plan.id, "failed", error=f"Ray refused the job: {exc}")
            return
        # else: an earlier rpg submitted it and was stopped before recording that; attach
    store.set_status(plan.id, "submitted", submission_id=submission_id)


def _poll(client: JobSubmissionClient, store: Store, run_ids: list[str]) -> None:
    jobs = _ray_jobs(client)
    for run in store.runs(ids=run_ids):
        if run.status in TERMINAL or not run.submission_id:
            continue
        job = jobs.get(run.submission_id)
        if job is None:
            store.set_status(run.id, "failed", error="the job is unknown to the Ray cluster (was the head restarted?)")
        elif _sync(client, store, run, job) in LIVE:
            store.ingest_metrics(run.id, run.metrics_path)


def _sync(client: JobSubmissionClient, store: Store, run: RunRecord, job: JobDetails) -> str:
    """Bring the run's stored state up to Ray's; at the end, ingest the last metrics and save job.log."""
    status = _STATUS_FROM_RAY[str(job.status)]
    if status == run.status:
        return status
    started = _from_ms(job.start_time)
    if status in TERMINAL:
        from rpg_cli.evaluation.verl_val import ingest_verl_val_metrics

        from rpg_cli.backends.verl.diagnose import failure_reason

        store.ingest_metrics(run.id, run.metrics_path)  # before the state: a terminal run is complete
        ingest_verl_val_metrics(store, run.id, run.metrics_path)  # its own validation scores, under verl's names
        log = ""
        with contextlib.suppress(RuntimeError, OSError):
            log = client.get_job_logs(run.submission_id)
            _atomic_write(run.run_dir / "job.log", log)
        error = None
        if status != "succeeded":  # the job's last error line says more than Ray's "exit code 1"
            error = failure_reason(log[-20_000:]) if log.strip() else (job.message or f"job {status}")
        store.set_status(run.id, status, error=error, at=_from_ms(job.end_time), started_at=started)
    else:
        store.set_status(run.id, status, at=started if status == "running" else None)
    return status


# ------------------------------------------------------------------------------------ cancel, logs


def cancel(ref: str, db_url: str = DEFAULT_DB_URL, address: str | None = None, runs_dir: Path = DEFAULT_RUNS_DIR) -> list[RunRecord]:
    """Stop the unfinished runs that `ref` names (run id, id prefix, run name or sweep); returns them."""
    store = open_store(db_url, create=False)
    try:
        runs = store.resolve(ref)
        if not runs:
            raise StoreError(f"no run or sweep {ref!r} in the store; `rpg runs` lists them")
        unfinished = [r for r in runs if r.status not in TERMINAL]
        client = connect(address, runs_dir, start=False) if unfinished else None
        for run in unfinished:
            if client is not None and run.submission_id:
                with contextlib.suppress(RuntimeError):  # unknown to this cluster: nothing to stop
                    client.stop_job(run.submission_id)
                with contextlib.suppress(RuntimeError, OSError):
                    _atomic_write(run.run_dir / "job.log", client.get_job_logs(run.submission_id))
            store.ingest_metrics(run.id, run.metrics_path)
            store.set_status(run.id, "stopped", error="cancelled with `rpg cancel`")
        return unfinished
    finally:
        store.close()


def job_logs(run: RunRecord, address: str | None = None, runs_dir: Path = DEFAULT_RUNS_DIR, follow: bool = False) -> Iterator[str]:
    """The run's job output, from the cluster while it knows the job, else from the run's job.log."""
    client = connect(address, runs_dir, start=False) if run.submission_id else None
    if client is not None:
        try:
            if follow:
                yield from _tail_logs(client, run.submission_id)
            else:
                yield client.get_job_logs(run.submission_id)
            return
        except RuntimeError:  # unknown to this cluster (e.g. a restarted head): use the saved copy
            pass
    saved = run.run_dir / "job.log"
    if not saved.is_file():
        raise StoreError(f"no logs for run {run.name}: the cluster does not know it and {saved} does not exist")
    yield saved.read_text(errors="replace")


def _tail_logs(client: JobSubmissionClient, submission_id: str) -> Iterator[str]:
    import asyncio
    import logging

    logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)  # no "WebSocket closed" chatter
    loop = asyncio.new_event_loop()
    chunks = client.tail_job_logs(submission_id)
    try:
        while True:
            try:
                yield loop.run_until_complete(chunks.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(chunks.aclose())
        loop.close()


# ------------------------------------------------------------------------------------------ helpers


def _atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _from_ms(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, timezone.utc).replace(tzinfo=None)


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def _last_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return lines[-1].strip()[:300]
    return "no output"
