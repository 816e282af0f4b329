"""A sweep's runs as Ray jobs: submit what needs it, follow, reconcile the store with Ray; logs, `rpg stop`
(`rpg cancel` and graceful stops: orchestration/cancel.py).

The store is the source of truth for what rpg intends; Ray is the source of truth for what happened.
Every state change is committed on its own, and the intent to submit (attempt, submission id) is
committed before the submission: so an rpg killed at any point (Ctrl-C, SIGKILL) leaves a store that
the next `rpg sweep` reconciles with Ray: it skips succeeded runs, re-attaches to live ones, resubmits
lost ones, and retries failed or stopped ones only when asked (rpg_cli/states.py has the table).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli import rundir
from rpg_cli.metrics import REWARD
from rpg_cli.orchestration.head import (
    DEFAULT_RUNS_DIR,
    ClusterError,
    connect,
    head_env_names,
    one_line,
    stop_local_head,
)
from rpg_cli.orchestration.plan import RunPlan, check_plans, failure_reason, launcher, refuse_bad_inputs, rehome
from rpg_cli.orchestration.stops import graceful_stop
from rpg_cli.orchestration.submit import from_ms, killed_by, lost_node, ray_jobs, run_state, submit, tail_logs
from rpg_cli.orchestration.watch import breach, stop_reason, verdict
from rpg_cli.states import ATTACH, DONE, LIVE, NEW, SKIP, STATUSES, SUBMIT, TERMINAL, run_action
from rpg_cli.store import DEFAULT_DB_URL, StoreError, open_store
from rpg_cli.store.light import run_states
from rpg_cli.store.url import RUN_AGAIN

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
    rewards = store.latest_values(ids, [REWARD])
    return SweepProgress(
        sweep,
        tuple(
            RunProgress(
                r.id,
                r.name,
                r.status,
                r.attempts,
                steps.get(r.id),
                rewards.get(r.id, {}).get(REWARD, (None, None))[1],
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
    stall_timeout: float | None = None,
) -> SweepProgress:
    """Submit the sweep's runs that need it, then (unless `detach`) follow them to the end.

    Succeeded runs are skipped, live ones re-attached, lost ones (unknown to the cluster) resubmitted,
    failed or stopped ones resubmitted only with `retry_failed`. `on_update` receives a snapshot
    after the submissions and after every poll; the last snapshot is returned. Metrics are ingested
    into the store as they arrive; a run that logs a non-finite loss or a step beyond its bounds, or (with
    `stall_timeout`, seconds) stays stalled that much past its limit, is stopped and failed (watch.py).
    Interrupting (KeyboardInterrupt) leaves the jobs running and the store consistent: run the same sweep
    again to re-attach.
    """
    plans = list({p.id: p for p in plans}.values())
    states = run_states(db_url, [p.id for p in plans])
    # Before anything is written or started: a run that would fail on its inputs has no run directory,
    # row or job; an unreachable cluster writes nothing.
    refuse_bad_inputs(check_plans(plans, states, retry_failed), len(plans))
    client = connect(address, runs_dir)
    if not (address or os.environ.get("RAY_ADDRESS")):  # rpg's local head: its jobs get its environment
        _check_head_credentials(plans, states, runs_dir)
    _check_install(plans, states)
    _check_cluster(client, plans, states, retry_failed)
    store = open_store(db_url)
    try:
        homes = store.record_plans(plans, sweep_name)  # a run another sweep created keeps its directory
        plans = [p if rundir.absolute_run_dir(p.run_dir) == homes[p.id] else rehome(p, homes[p.id]) for p in plans]
        for plan in plans:  # a shared runs/: no planted link or someone else's directory is written into
            rundir.make_run_dir(plan.run_dir)
        ids = [p.id for p in plans]
        specs = {p.id: p.spec for p in plans}  # the watch block as the sweep's file says it now
        try:
            # a database server that restarts is waited for (a while): each step below is safe to repeat
            jobs = ray_jobs(client)
            for plan in plans:
                store.riding_out(lambda plan=plan: _launch(client, store, plan, jobs, retry_failed))
            while True:
                snapshot = store.riding_out(lambda: progress(store, sweep_name, ids))
                if on_update is not None:
                    on_update(snapshot)
                if detach or snapshot.finished:
                    return snapshot
                time.sleep(poll_s)
                store.riding_out(lambda: _poll(client, store, ids, stall_timeout, specs))
        except StoreError as exc:
            again = "run the same `rpg sweep` command again to re-attach (the jobs keep running; every state is kept)"
            message = str(exc)  # said once: the store's own "run the same command again" becomes the sweep's
            raise StoreError(
                message.removesuffix(RUN_AGAIN) + again if message.endswith(RUN_AGAIN) else f"{message}; {again}"
            ) from None
        except OSError as exc:  # requests' connection errors: the cluster went away
            if isinstance(exc, rundir.UnsafePathError):
                raise
            raise ClusterError(
                f"lost the Ray cluster ({one_line(exc)}); every state is in the store: run the sweep again to re-attach"
            ) from None
    finally:
        store.close()


def _check_head_credentials(plans: list[RunPlan], states: dict[str, str], runs_dir: Path) -> None:
    """The trackers' preflight on the local head: a credential exported after it started (rpg stop fixes it)."""
    from rpg_cli.trackers.runs import credentials_missing_on_head

    specs = [p.spec for p in plans if states.get(p.id) != "succeeded"]
    if specs and (line := credentials_missing_on_head(specs, head_env_names(runs_dir))):
        raise ClusterError(line)


def _check_install(plans: list[RunPlan], states: dict[str, str]) -> None:
    """Each backend's check of its installation and of the runs' commands before anything is submitted
    (verl: its plugin loads in a fresh interpreter and its config takes each run's overrides), for the
    runs that are not done yet."""
    todo = [p for p in plans if states.get(p.id) != "succeeded"]
    for backend in dict.fromkeys(p.backend for p in todo):
        check = getattr(launcher(backend), "check_install", None)
        if check is not None:
            try:
                check({p.name: p.entrypoint for p in todo if p.backend == backend})
            except RuntimeError as exc:
                raise ClusterError(str(exc)) from None


def _check_cluster(
    client: JobSubmissionClient, plans: list[RunPlan], states: dict[str, str], retry_failed: bool
) -> None:
    """Each backend's check of the cluster's nodes for the runs to submit (verl: a Ray job checks every GPU
    node as `rpg doctor` checks one), once per sweep, before anything is recorded; re-attached, succeeded and
    skipped runs are not checked for."""
    todo = [p for p in plans if run_action(states.get(p.id, NEW), retry_failed) == SUBMIT]
    for backend in dict.fromkeys(p.backend for p in todo):
        check = getattr(launcher(backend), "check_cluster", None)
        if check is not None:
            try:
                check(client, [(p.entrypoint, p.env) for p in todo if p.backend == backend])
            except RuntimeError as exc:
                raise ClusterError(str(exc)) from None


def _launch(
    client: JobSubmissionClient, store: Store, plan: RunPlan, jobs: dict[str, JobDetails], retry_failed: bool
) -> None:
    """Act on one run as the state table says, with what Ray knows of its job brought in first."""
    run = store.run(plan.id)
    assert run is not None, "record_plans runs first"
    if run.submission_id in jobs:  # Ray knows what became of it while no rpg was watching
        sync_run(client, store, run, jobs[run.submission_id])
        run = store.run(plan.id)
        assert run is not None
    action = run_action(run.status, retry_failed)
    if action in (DONE, SKIP) or (action == ATTACH and run.submission_id in jobs):
        return
    if run.status == "pending" and run.submission_id and run.submission_id not in jobs:
        submission_id = run.submission_id  # the intent was recorded, the submission never reached Ray
    else:  # never submitted, lost with a restarted cluster, or a retry
        _, submission_id = store.begin_attempt(plan.id, after=run.attempts)
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


def _poll(
    client: JobSubmissionClient,
    store: Store,
    run_ids: list[str],
    stall_timeout: float | None = None,
    specs: dict[str, dict] | None = None,
) -> None:
    """Sync each live run with Ray, ingest its metrics, and stop and fail it for what watch.py finds; `specs`:
    the plans' specs, whose watch block (not in the run id: the store keeps the first) is the one obeyed."""
    jobs = ray_jobs(client)
    for run in store.runs(ids=run_ids):
        if run.status in TERMINAL or not run.submission_id:
            continue
        run = replace(run, spec=(specs or {}).get(run.id, run.spec))
        job = jobs.get(run.submission_id)
        if job is None:
            store.set_status(run.id, "failed", error="the job is unknown to the Ray cluster (was the head restarted?)")
        elif sync_run(client, store, run, job) in LIVE:
            store.ingest_metrics(run.id, run.metrics_path)
            if why := stop_reason(store, run, stall_timeout):  # a NaN loss, a bound crossed, a stall: stop paying
                with contextlib.suppress(RuntimeError):
                    client.stop_job(run.submission_id)
                save_log(client, run)
                store.set_status(run.id, "failed", error=why, unless_terminal=True)


def sync_run(
    client: JobSubmissionClient, store: Store, run: RunRecord, job: JobDetails, stopped_why: str | None = None
) -> str:
    """Bring the run's stored state up to Ray's; at the end, ingest the last metrics and save job.log."""
    status = run_state(job.status)
    if status == run.status or run.status in TERMINAL:  # a terminal record (the watcher's failure) is kept
        return run.status
    started = from_ms(job.start_time)
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


def save_log(client: JobSubmissionClient, run: RunRecord) -> str:
    """The job's output, also saved as the run's job.log ('' when the cluster has none)."""
    log = ""
    with contextlib.suppress(RuntimeError, OSError):
        log = client.get_job_logs(run.submission_id)
        rundir.write_run_file(rundir.job_log_path(run.run_dir), log)
    return log


# ------------------------------------------------------------------------------- reconciliation


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
    unknown = _sync_known(client, store, live, jobs)
    why = "the Ray cluster does not know their jobs (another cluster, or a restarted head: `rpg sweep` resubmits them)"
    return Reconciled(frozenset(unknown), why if unknown else None)


def _sync_known(
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


# ------------------------------------------------------------------------------- logs, stop


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
    """`rpg stop` without --force while jobs on the head are live; one-line message."""


def stop(runs_dir: Path = DEFAULT_RUNS_DIR, db_url: str = DEFAULT_DB_URL, force: bool = False) -> bool:
    """Stop the local head of `runs_dir` (its jobs die with it), unless jobs on it are live and not
    `force`: LiveRunsError naming them. What the head knows is brought into the store first, so a run
    that finished unwatched neither blocks this nor stays live in `rpg runs`. False when there was no head."""
    if not force:
        client = connect(runs_dir=runs_dir, start=False, local=True)
        if client is not None:
            jobs = ray_jobs(client)
            names = _reconcile_store(db_url, client, jobs)
            live = [names.get(j) or _job_label(job) for j, job in jobs.items() if run_state(job.status) in LIVE]
            if live:
                listed = ", ".join(live[:3]) + (", ..." if len(live) > 3 else "")
                raise LiveRunsError(
                    f"{len(live)} job(s) are live on the local head ({listed}); `rpg cancel` them first, or pass --force"
                )
    return stop_local_head(runs_dir)


def _job_label(job: JobDetails) -> str:
    meta = job.metadata or {}
    return meta.get("rpg_run") or (f"rpg eval {meta['rpg_eval']}" if "rpg_eval" in meta else job.submission_id)


def _reconcile_store(db_url: str, client: JobSubmissionClient, jobs: dict[str, JobDetails]) -> dict[str, str]:
    """Sync the store's live runs whose jobs are in `jobs`; returns {submission id: run name} for the
    store's runs ({} without a results database)."""
    try:
        store = open_store(db_url, create=False)
    except StoreError:  # no results database: nothing to bring up to date
        return {}
    try:
        runs = store.runs()
        _sync_known(client, store, runs, jobs)
        return {r.submission_id: r.name for r in runs if r.submission_id}
    finally:
        store.close()
