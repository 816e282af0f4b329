"""A sweep's runs as Ray jobs: submit what needs it, follow, reconcile the store with Ray; cancel, logs.

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
from dataclasses import dataclass, field
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
from rpg_cli.orchestration.submit import from_ms, killed_by, ray_jobs, run_state, submit, tail_logs
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
) -> SweepProgress:
    """Submit the sweep's runs that need it, then (unless `detach`) follow them to the end.

    Succeeded runs are skipped, live ones re-attached, lost ones (unknown to the cluster) resubmitted,
    failed or stopped ones resubmitted only with `retry_failed`. `on_update` receives a snapshot
    after the submissions and after every poll; the last snapshot is returned. Metrics are ingested
    into the store as they arrive. Interrupting (KeyboardInterrupt) leaves the jobs running and the
    store consistent: run the same sweep again to re-attach.
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
                store.riding_out(lambda: _poll(client, store, ids))
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
        _sync(client, store, run, jobs[run.submission_id])
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
            if why := store.divergence(run.id):  # a NaN loss trains nothing more: stop paying for it
                with contextlib.suppress(RuntimeError):
                    client.stop_job(run.submission_id)
                _save_log(client, run)
                store.set_status(run.id, "failed", error=why, unless_terminal=True)


def _sync(
    client: JobSubmissionClient, store: Store, run: RunRecord, job: JobDetails, stopped_why: str | None = None
) -> str:
    """Bring the run's stored state up to Ray's; at the end, ingest the last metrics and save job.log."""
    status = run_state(job.status)
    if status == run.status:
        return status
    started = from_ms(job.start_time)
    if status in TERMINAL:
        store.ingest_metrics(run.id, run.metrics_path)  # before the state: a terminal run is complete
        log = _save_log(client, run)
        error = None
        if status == "stopped" and stopped_why:
            error = stopped_why
        elif status != "succeeded":  # a signal, or the log's reading, says more than Ray's "exit code 1"
            error = killed_by(job) or (
                failure_reason(run.backend, log[-20_000:]) if log.strip() else (job.message or f"job {status}")
            )
        if status == "succeeded" and (why := store.divergence(run.id)):  # verl exits 0 through a NaN loss
            status, error = "failed", why
        store.set_status(run.id, status, error=error, at=from_ms(job.end_time), started_at=started)
    else:
        store.set_status(run.id, status, at=started if status == "running" else None)
    return status


def _save_log(client: JobSubmissionClient, run: RunRecord) -> str:
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
            _sync(client, store, run, jobs[run.submission_id])
        elif run.status in LIVE:
            unknown.add(run.id)
    return unknown


# ------------------------------------------------------------------------------- cancel, logs, stop


@dataclass(frozen=True)
class Cancelled:
    stopped: list[RunRecord]  # stopped now (or, never submitted, kept from being submitted)
    finished: list[RunRecord]  # had ended before they could be stopped: recorded as Ray says
    unconfirmed: list[RunRecord] = field(default_factory=list)  # Ray would not stop them: left as they were


CANCELLED = "cancelled with `rpg cancel`"


class NotOnClusterError(ClusterError):
    """Runs `rpg cancel` was asked to stop whose jobs the cluster it can reach does not know; one line."""


def cancel(
    ref: str,
    db_url: str = DEFAULT_DB_URL,
    address: str | None = None,
    runs_dir: Path = DEFAULT_RUNS_DIR,
    wait_s: float = 20.0,
    lost: bool = False,
) -> Cancelled:
    """Stop the unfinished runs that `ref` names (run id, id prefix, run name or sweep).

    The store records only what rpg stopped. Ray is asked first (one list_jobs on the cluster at
    `address`, else on the local head of `runs_dir`): a run whose job has ended keeps what it became (a
    run that succeeded stays succeeded); the others' jobs are stopped and followed for up to `wait_s`
    until Ray confirms. A run never submitted has no job: recording it stopped is what keeps a sweep
    from submitting it. A run whose job the cluster does not know was launched elsewhere (another
    --runs-dir, cluster or user) or lost with its head: ClusterError naming the cluster, and nothing is
    stopped or recorded, unless `lost` (the caller knows their head is gone: `rpg cancel --lost`, or
    `rpg cancel` just cancelled the sweep's Slurm job, whose Ray ran them). A run whose directory
    belongs to another user is theirs to stop. A terminal state is never rewritten, even by a watcher that records one in between.
    """
    store = open_store(db_url, create=False)
    try:
        runs = store.resolve(ref)
        if not runs:
            raise StoreError(f"no run or sweep {ref!r} in the store; `rpg runs` lists them")
        unfinished = [r for r in runs if r.status not in TERMINAL]
        _refuse_others_runs(unfinished)
        submitted = [r for r in unfinished if r.submission_id]
        client, where = _cancel_client(address, runs_dir) if submitted else (None, "")
        jobs = _cluster_jobs(client, where) if client is not None else {}
        unknown = [r for r in submitted if r.submission_id not in jobs]
        if unknown and not lost:
            raise NotOnClusterError(_not_on_cluster(ref, unknown, len(unfinished), where, client is None))
        stopped: list[RunRecord] = []
        finished: list[RunRecord] = []
        stopping: dict[str, RunRecord] = {}
        for run in unfinished:
            job = jobs.get(run.submission_id) if run.submission_id else None
            if job is None:  # never submitted, or (with `lost`) no job runs for it: nothing to stop
                if _record_stopped(store, run):
                    stopped.append(run)
            elif run_state(job.status) in TERMINAL:
                _sync(client, store, run, job)
                finished.append(run)
            else:
                stopping[run.id] = run
        return _stop_jobs(client, store, stopping, where, wait_s, Cancelled(stopped, finished))
    finally:
        store.close()


def _refuse_others_runs(runs: list[RunRecord]) -> None:
    """ClusterError (one line) when a run's directory belongs to another user: they launched it, on their
    head with their token; a shared store does not make it this user's to stop."""
    me = os.geteuid()
    theirs = []
    for run in runs:
        with contextlib.suppress(OSError):  # no directory here (another machine, an old rpg): nothing to say
            if (uid := os.stat(run.run_dir).st_uid) != me:
                theirs.append((run, uid))
    if theirs:
        names = ", ".join(f"{run.name} (uid {uid})" for run, uid in theirs[:3]) + (", ..." if len(theirs) > 3 else "")
        raise ClusterError(
            f"{len(theirs)} run(s) were launched by another user: {names}; nothing was stopped or recorded: "
            f"they are theirs to stop (their head, their token), or cancel only your own runs by name"
        )


def _cancel_client(address: str | None, runs_dir: Path) -> tuple[JobSubmissionClient | None, str]:
    """The client of the cluster the runs were submitted to, as far as rpg can tell, and that cluster in
    words (None: no local head runs in `runs_dir`); ClusterError when it cannot be reached."""
    address = address or os.environ.get("RAY_ADDRESS")
    where = f"the Ray cluster at {address}" if address else f"the local Ray head in {Path(runs_dir).resolve()}/ray"
    try:
        return connect(address, runs_dir, start=False), where
    except OSError as exc:  # another user's runs/ray: not even its files can be read
        raise ClusterError(f"cannot reach {where} ({one_line(exc)}); nothing was stopped or recorded") from None


def _cluster_jobs(client: JobSubmissionClient, where: str) -> dict[str, JobDetails]:
    try:
        return ray_jobs(client)
    except (RuntimeError, OSError) as exc:  # the head went away, or refused the listing
        raise ClusterError(
            f"{where} did not list its jobs ({one_line(exc)}); nothing was stopped or recorded"
        ) from None


def _not_on_cluster(ref: str, unknown: list[RunRecord], unfinished: int, where: str, no_head: bool) -> str:
    """The one line for runs rpg cannot find on the cluster it can reach: which, where, and the fixes."""
    names = ", ".join(r.name for r in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
    why = f"were submitted to a Ray cluster, and {where} is not running" if no_head else f"are not on {where}"
    return (
        f"{len(unknown)} of {unfinished} unfinished run(s) of {ref!r} ({names}) {why}; nothing was stopped or "
        "recorded: cancel them where they were launched (with their cluster's --runs-dir, or --address and its "
        "token; another user's runs are theirs to stop), or pass --lost if their head is gone and no job runs for them"
    )


def _stop_jobs(
    client: JobSubmissionClient | None,
    store: Store,
    stopping: dict[str, RunRecord],
    where: str,
    wait_s: float,
    done: Cancelled,
) -> Cancelled:
    """Ask Ray to stop the jobs of `stopping` and record each as Ray confirms it (stopped, or what it
    ended as in between). A job Ray accepted to stop but has not ended after `wait_s` is recorded
    stopped (Ray ends it: SIGTERM, then SIGKILL); one Ray would not stop is left as it was."""
    if not stopping:
        return done
    assert client is not None
    accepted = {run.id for run in stopping.values() if _ask_to_stop(client, run, where)}
    deadline = time.monotonic() + wait_s
    while stopping:
        for run in list(stopping.values()):
            job = _job_info(client, run, where)
            if run_state(job.status) in TERMINAL:
                del stopping[run.id]
                state = _sync(client, store, run, job, stopped_why=CANCELLED)
                (done.stopped if state == "stopped" else done.finished).append(run)
        if stopping and time.monotonic() > deadline:
            for run in stopping.values():
                if run.id not in accepted:
                    done.unconfirmed.append(run)
                    continue
                _save_log(client, run)
                if _record_stopped(store, run):
                    done.stopped.append(run)
            break
        time.sleep(0.2)
    return done


def _ask_to_stop(client: JobSubmissionClient, run: RunRecord, where: str) -> bool:
    """Whether Ray took the request to stop the run's job (False: it had ended, or Ray refused)."""
    try:
        return bool(client.stop_job(run.submission_id))
    except RuntimeError:  # ended and gone in between, or refused: the follow-up sees which
        return False
    except OSError as exc:
        raise ClusterError(
            f"lost {where} while stopping {run.name} ({one_line(exc)}); run the same command again"
        ) from None


def _job_info(client: JobSubmissionClient, run: RunRecord, where: str) -> JobDetails:
    try:
        return client.get_job_info(run.submission_id)
    except (RuntimeError, OSError) as exc:  # the head went away while its jobs were being stopped
        raise ClusterError(
            f"lost {where} while stopping {run.name} ({one_line(exc)}); what was not confirmed stopped is "
            "recorded as it was: run the same command again"
        ) from None


def _record_stopped(store: Store, run: RunRecord) -> bool:
    """Record a run stopped by `rpg cancel` (its last metrics first), unless it reached a terminal state."""
    store.ingest_metrics(run.id, run.metrics_path)
    return store.set_status(run.id, "stopped", error=CANCELLED, unless_terminal=True)


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
