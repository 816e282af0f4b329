"""A run's stored state brought up to what Ray knows of its job: one run (`sync_run`, with its devices' mark and its
job.log), or the live runs a command shows (`reconcile`, which never starts a head)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli import rundir
from rpg_cli.orchestration.head import DEFAULT_RUNS_DIR, ClusterError, connect, one_line
from rpg_cli.orchestration.plan import failure_reason
from rpg_cli.orchestration.stops import graceful_stop
from rpg_cli.orchestration.submit import from_ms, killed_by, lost_node, ray_jobs, run_state
from rpg_cli.orchestration.watch import breach, verdict
from rpg_cli.states import LIVE, TERMINAL

# how far a node's clock may lag the Ray head's before a job's mark (rundir.mark_held) is taken for an earlier
# attempt's; an attempt's own mark comes after its wait for GPUs and its start, seconds to hours after submission
CLOCK_SKEW_S = 30.0

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

    from rpg_cli.store import RunRecord, Store


def sync_run(
    client: JobSubmissionClient, store: Store, run: RunRecord, job: JobDetails, stopped_why: str | None = None
) -> str:
    """Bring the run's stored state up to Ray's; at the end, ingest the last metrics and save job.log."""
    status = run_state(job.status)
    if run.status in TERMINAL:  # a terminal record (the watcher's failure) is kept
        return run.status
    started = from_ms(job.start_time)
    if status != "submitted":  # its entrypoint runs or ran: it may have begun holding its devices
        note_held(store, run, started)
    if status == run.status:
        return run.status
    if status in TERMINAL:
        store.ingest_metrics(run.id, run.metrics_path)  # before the state: a terminal run is complete
        log = save_log(client, run)
        error = None
        if status == "stopped" and stopped_why:
            error = stopped_why
        elif status != "succeeded":  # a signal, or the log's reading, says more than Ray's "exit code 1"
            error = (
                killed_by(job)
                or lost_node(job)
                or (failure_reason(run.backend, log[-20_000:]) if log.strip() else (job.message or f"job {status}"))
            )
        if not stopped_why:  # a graceful stop (a preemption, `rpg cancel --graceful`) ends as its request says
            status, error = graceful_stop(run.run_dir, status, error) or (status, error)
        # exit 0 is no proof (a NaN, a bound, steps short); a graceful stop after a NaN would fail again resumed
        why = verdict(store, run) if status == "succeeded" else None
        if why or (status in ("preempted", "stopped") and (why := breach(store, run))):
            status, error = "failed", why
        store.set_status(run.id, status, error=error, at=from_ms(job.end_time), started_at=started)
    else:
        store.set_status(run.id, status, at=started if status == "running" else None)
    return status


def note_held(store: Store, run: RunRecord, started: datetime | None) -> None:
    """Record when the run's current attempt began holding its devices (its job's mark, rundir.held_since), once
    per attempt: what its device time counts from (rpg_cli/cost.py). The job clears an earlier attempt's mark as
    it starts, but one may still be there before it does: a mark from before this attempt's job was submitted
    (`started`, Ray's time; less CLOCK_SKEW_S between the node's clock and the head's) is not this attempt's."""
    if run.held_at is not None:
        return
    try:
        at = rundir.held_since(run.run_dir)
    except OSError:  # unreadable, or not rpg's (a planted link): no mark, not a reason to stop watching
        return
    if at is None or (started is not None and at < started - timedelta(seconds=CLOCK_SKEW_S)):
        return
    store.set_held_at(run.id, at)


def save_log(client: JobSubmissionClient, run: RunRecord) -> str:
    """The job's output, also saved as the run's job.log ('' when the cluster has none)."""
    log = ""
    with contextlib.suppress(RuntimeError, OSError):
        log = client.get_job_logs(run.submission_id)
        rundir.write_run_file(rundir.job_log_path(run.run_dir), log)
    return log


@dataclass(frozen=True)
class Reconciled:
    """What `reconcile` could not confirm with Ray: live runs shown as stored (possibly stale), and why."""

    unconfirmed: frozenset[str] = frozenset()
    why: str | None = None


def reconcile(
    store: Store, runs: Iterable[RunRecord], address: str | None = None, runs_dir: Path = DEFAULT_RUNS_DIR
) -> Reconciled:
    """Bring the stored state of the live ones among `runs` up to what Ray knows (one list_jobs), so
    that a run that finished while no rpg watched (--detach, a killed watcher) reads as finished, its
    last metrics and job.log saved. Never starts a head and never fails for an unreachable cluster:
    the runs it could not check are returned, with the reason."""
    live = [r for r in runs if r.status in LIVE and r.submission_id]  # without one, Ray cannot know it
    if not live:
        return Reconciled()
    everyone = frozenset(r.id for r in live)
    try:
        client = connect(address, runs_dir, start=False)
        if client is None:
            return Reconciled(
                everyone,
                f"no Ray cluster to ask: no local head runs in {runs_dir}/ray (pass --address for a remote cluster)",
            )
        jobs = ray_jobs(client)
    except (ClusterError, OSError) as exc:
        return Reconciled(everyone, f"the Ray cluster did not answer ({one_line(exc)})")
    unknown = sync_known(client, store, live, jobs)
    why = "the Ray cluster does not know their jobs (another cluster, or a restarted head: `rpg sweep` resubmits them)"
    return Reconciled(frozenset(unknown), why if unknown else None)


def sync_known(
    client: JobSubmissionClient, store: Store, runs: Iterable[RunRecord], jobs: dict[str, JobDetails]
) -> set[str]:
    """Sync the live ones among `runs` whose jobs are in `jobs`; returns the ids of the others."""
    unknown = set()
    for run in runs:
        if run.status in LIVE and run.submission_id in jobs:
            sync_run(client, store, run, jobs[run.submission_id])
        elif run.status in LIVE:
            unknown.add(run.id)
    return unknown
