"""A sweep's runs as Ray jobs: submit what needs it, then follow them (poll Ray, ingest metrics, stop what the
watcher finds) until they end.

The store is the source of truth for what rpg intends; Ray is the source of truth for what happened.
Every state change is committed on its own, and the intent to submit (attempt, submission id) is
committed before the submission: so an rpg killed at any point (Ctrl-C, SIGKILL) leaves a store that
the next `rpg sweep` reconciles with Ray: it skips succeeded runs, re-attaches to live ones, resubmits
lost ones, and retries failed or stopped ones only when asked (rpg_cli/states.py has the table).

Beside it: the plan it acts on (dryrun.py), its progress (progress.py), a run brought up to Ray's word
(reconcile.py), `rpg logs` and `rpg stop` (controls.py), `rpg cancel` and graceful stops (cancel.py, stops.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli import rundir
from rpg_cli.orchestration.dryrun import SweepPlan, plan_runs
from rpg_cli.orchestration.head import DEFAULT_RUNS_DIR, ClusterError, connect, head_env_names, one_line
from rpg_cli.orchestration.plan import RunPlan, launcher, rehome
from rpg_cli.orchestration.progress import SweepProgress, progress
from rpg_cli.orchestration.reconcile import save_log, sync_run
from rpg_cli.orchestration.submit import ray_jobs, submit
from rpg_cli.orchestration.watch import stop_reason
from rpg_cli.states import ATTACH, DONE, LIVE, NEW, SKIP, SUBMIT, TERMINAL, run_action
from rpg_cli.store import DEFAULT_DB_URL, StoreError, open_store
from rpg_cli.store.url import RUN_AGAIN

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

    from rpg_cli.store import Store


def run_sweep(
    plans: Iterable[RunPlan] | SweepPlan,
    sweep_name: str,
    db_url: str = DEFAULT_DB_URL,
    address: str | None = None,
    detach: bool = False,
    retry_failed: bool = False,
    on_update: Callable[[SweepProgress], None] | None = None,
    runs_dir: Path = DEFAULT_RUNS_DIR,
    poll_s: float = 2.0,
    stall_timeout: float | None = None,
    eta: bool = False,
) -> SweepProgress:
    """Submit the sweep's runs that need it, then (unless `detach`) follow them to the end.

    `plans`: the runs, or the plan `rpg sweep` made of them (dryrun.SweepPlan: their states, their inputs'
    checks, the cluster and `retry_failed` as it found them, not read or decided again; `address` and
    `retry_failed` are then its own). Succeeded runs are skipped, live ones re-attached, lost ones (unknown to
    the cluster) resubmitted, failed or stopped ones resubmitted only with `retry_failed`. `on_update` receives a
    snapshot after the submissions and after every poll (with `eta`, its `sweep_eta`); the last snapshot is
    returned. Metrics are ingested into the store as they arrive; a run that logs a non-finite loss or a step
    beyond its bounds, or (with `stall_timeout`, seconds) stays stalled that much past its limit, is stopped and
    failed (watch.py). Interrupting (KeyboardInterrupt) leaves the jobs running and the store consistent: run the
    same sweep again to re-attach.
    """
    if not isinstance(plans, SweepPlan):
        plans = plan_runs(list({p.id: p for p in plans}.values()), db_url, address, retry_failed)
    planned, retry_failed = plans, plans.retry_failed
    plans = list({p.id: p for p in planned.runs}.values())  # a grid may name a run twice
    states = planned.states
    # Before anything is written or started: a run that would fail on its inputs has no run directory,
    # row or job; an unreachable cluster writes nothing.
    planned.refuse_bad_inputs()
    client = connect(planned.address, runs_dir, local=planned.local_head)
    if planned.local_head:  # rpg's local head: its jobs get its environment
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
                snapshot = store.riding_out(lambda: progress(store, sweep_name, ids, eta=eta and not detach))
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
