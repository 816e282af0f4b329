"""A sweep's runs as Ray jobs: submit what needs it, follow, reconcile the store with Ray; cancel, logs.

The store is the source of truth for what rpg intends; Ray is the source of truth for what happened.
Every state change is committed on its own, and the intent to submit (attempt, submission id) is
committed before the submission: so an rpg killed at any point (Ctrl-C, SIGKILL) leaves a store that
the next `rpg sweep` reconciles with Ray: it skips succeeded runs, re-attaches to live ones, resubmits
lost ones, and retries failed or stopped ones only when asked (rpg_cli/states.py has the table).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli import rundir
from rpg_cli.orchestration.head import DEFAULT_RUNS_DIR, ClusterError, connect, one_line, stop_local_head
from rpg_cli.orchestration.plan import RunPlan, failure_reason, launcher, rehome
from rpg_cli.orchestration.submit import from_ms, ray_jobs, run_state, submit, tail_logs
from rpg_cli.states import ATTACH, DONE, LIVE, SKIP, STATUSES, TERMINAL, run_action
from rpg_cli.store import DEFAULT_DB_URL, StoreError, open_store
from rpg_cli.store.light import run_states

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

    from rpg_cli.store import RunRecord, Store


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
    rewards = store.latest_values(ids, [rundir.REWARD_KEY])
    return SweepProgress(
        sweep,
        tuple(
            RunProgress(
                r.id,
                r.name,
                r.status,
                r.attempts,
                steps.get(r.id),
                rewards.get(r.id, {}).get(rundir.REWARD_KEY, (None, None))[1],
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
    _preflight(plans, db_url)
    store = open_store(db_url)
    try:
        homes = store.record_plans(plans, sweep_name)  # a run another sweep created keeps its directory
        plans = [p if Path(p.run_dir).resolve() == homes[p.id] else rehome(p, homes[p.id]) for p in plans]
        ids = [p.id for p in plans]
        try:
            jobs = ray_jobs(client)
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
                f"lost the Ray cluster ({one_line(exc)}); every state is in the store: run the sweep again to re-attach"
            ) from None
    finally:
        store.close()


def _preflight(plans: list[RunPlan], db_url: str) -> None:
    """Each backend's check before anything is submitted (verl: its plugin loads in a fresh
    interpreter), for the backends of runs that are not done yet."""
    states = run_states(db_url, [p.id for p in plans])
    for backend in dict.fromkeys(p.backend for p in plans if states.get(p.id) != "succeeded"):
        check = getattr(launcher(backend), "preflight", None)
        if check is not None:
            try:
                check()
            except RuntimeError as exc:
                raise ClusterError(str(exc)) from None


def _launch(
    client: JobSubmissionClient, store: Store, plan: RunPlan, jobs: dict[str, JobDetails], retry_failed: bool
) -> None:
    """Act on one run as the state table says, with what Ray knows of its job brought in first."""
    run = store.run(plan.id)
    assert run is not None, "record_plans runs first"
    if run.submission_id in jobs:  # Ray knows what became of it while no rpg was watching
        _sync(client, store, run, jobs[run.submission_id])
        run = store.run(plan.id)
        assert run is not None
    action = run_action(run.status, retry_failed)
    if action in (DONE, SKIP) or (action == ATTACH and run.submission_id in jobs):
        return
    if run.status == "pending" and run.submission_id and run.submission_id not in jobs:
        submission_id = run.submission_id  # the intent was recorded, the submission never reached Ray
    else:  # never submitted, lost with a restarted cluster, or a retry
        _, submission_id = store.begin_attempt(plan.id)
    _submit(client, store, plan, submission_id)


def _submit(client: JobSubmissionClient, store: Store, plan: RunPlan, submission_id: str) -> None:
    rundir.write_spec(plan.run_dir, plan.spec)
    try:
        submit(
            client,
            plan.entrypoint,
            submission_id,
            num_cpus=plan.num_cpus,
            num_gpus=plan.num_gpus,
            env=plan.env,
            metadata={"rpg_sweep": plan.sweep, "rpg_run": plan.name},
        )
    except RuntimeError as exc:  # the cluster answered, and refused
        if "already exists" not in str(exc):
            store.set_status(plan.id, "failed", error=f"Ray refused the job: {exc}")
            return
        # else: an earlier rpg submitted it and was stopped before recording that; attach
    store.set_status(plan.id, "submitted", submission_id=submission_id)


def _poll(client: JobSubmissionClient, store: Store, run_ids: list[str]) -> None:
    jobs = ray_jobs(client)
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
    status = run_state(job.status)
    if status == run.status:
        return status
    started = from_ms(job.start_time)
    if status in TERMINAL:
        store.ingest_metrics(run.id, run.metrics_path)  # before the state: a terminal run is complete
        log = _save_log(client, run)
        error = None
        if status != "succeeded":  # the job's last error line says more than Ray's "exit code 1"
            error = failure_reason(run.backend, log[-20_000:]) if log.strip() else (job.message or f"job {status}")
        store.set_status(run.id, status, error=error, at=from_ms(job.end_time), started_at=started)
    else:
        store.set_status(run.id, status, at=started if status == "running" else None)
    return status


def _save_log(client: JobSubmissionClient, run: RunRecord) -> str:
    """The job's output, also saved as the run's job.log ('' when the cluster has none)."""
    log = ""
    with contextlib.suppress(RuntimeError, OSError):
        log = client.get_job_logs(run.submission_id)
        rundir.write_atomic(rundir.job_log_path(run.run_dir), log, mode=0o644)
    return log


# ------------------------------------------------------------------------------- cancel, logs, stop


def cancel(
    ref: str, db_url: str = DEFAULT_DB_URL, address: str | None = None, runs_dir: Path = DEFAULT_RUNS_DIR
) -> list[RunRecord]:
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
                _save_log(client, run)
            store.ingest_metrics(run.id, run.metrics_path)
            store.set_status(run.id, "stopped", error="cancelled with `rpg cancel`")
        return unfinished
    finally:
        store.close()


def job_logs(
    run: RunRecord, address: str | None = None, runs_dir: Path = DEFAULT_RUNS_DIR, follow: bool = False
) -> Iterator[str]:
    """The run's job output, from the cluster while it knows the job, else from the run's job.log."""
    client = connect(address, runs_dir, start=False) if run.submission_id else None
    if client is not None:
        try:
            if follow:
                yield from tail_logs(client, run.submission_id)
            else:
                yield client.get_job_logs(run.submission_id)
            return
        except RuntimeError:  # unknown to this cluster (e.g. a restarted head): use the saved copy
            pass
    saved = rundir.job_log_path(run.run_dir)
    if not saved.is_file():
        raise StoreError(f"no logs for run {run.name}: the cluster does not know it and {saved} does not exist")
    yield saved.read_text(errors="replace")


class LiveRunsError(RuntimeError):
    """`rpg stop` without --force while runs are live; one-line message."""


def stop(runs_dir: Path = DEFAULT_RUNS_DIR, db_url: str = DEFAULT_DB_URL, force: bool = False) -> bool:
    """Stop the local head of `runs_dir` (its jobs die with it), unless runs in the store are live and
    not `force`: LiveRunsError naming them. False when there was no head."""
    if not force:
        try:
            store = open_store(db_url, create=False)
        except StoreError:  # no results database: no run can be live
            store = None
        live = []
        if store is not None:
            live = [r for r in store.runs() if r.status in LIVE]
            store.close()
        if live:
            names = ", ".join(r.name for r in live[:3]) + (", ..." if len(live) > 3 else "")
            raise LiveRunsError(f"{len(live)} run(s) are live ({names}); `rpg cancel` them first, or pass --force")
    return stop_local_head(runs_dir)
