"""`rpg cancel`: stop a sweep's runs now (Ray stops their jobs), or gracefully (`--graceful`, and `rpg slurm`'s
trap at a time limit: each run is asked to end after the step it is in, with a checkpoint; rundir.request_stop).

The store records only what rpg stopped; Ray is asked first what each job became. A terminal state is never
rewritten.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli import rundir
from rpg_cli.orchestration.head import DEFAULT_RUNS_DIR, ClusterError, connect, one_line
from rpg_cli.orchestration.reconcile import save_log, sync_run
from rpg_cli.orchestration.submit import ray_jobs, run_state
from rpg_cli.states import TERMINAL
from rpg_cli.store import DEFAULT_DB_URL, StoreError, open_store

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

    from rpg_cli.store import RunRecord, Store


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
        unfinished = _unfinished(store, ref)
        submitted = [r for r in unfinished if r.submission_id]
        client, where, jobs, unknown = _jobs_of(submitted, address, runs_dir)
        if unknown and not lost:
            raise NotOnClusterError(_not_on_cluster(ref, unknown, len(unfinished), where, client is None))
        return _cancel_runs(client, store, unfinished, jobs, where, wait_s)
    finally:
        store.close()


def _cancel_runs(
    client: JobSubmissionClient | None,
    store: Store,
    runs: list[RunRecord],
    jobs: dict[str, JobDetails],
    where: str,
    wait_s: float,
) -> Cancelled:
    """Stop `runs` (unfinished, checked to be on the cluster or lost) as `cancel` says."""
    stopped: list[RunRecord] = []
    finished: list[RunRecord] = []
    stopping: dict[str, RunRecord] = {}
    for run in runs:
        job = jobs.get(run.submission_id) if run.submission_id else None
        if job is None:  # never submitted, or (with `lost`) no job runs for it: nothing to stop
            if _record_stopped(store, run):
                stopped.append(run)
        elif run_state(job.status) in TERMINAL:
            sync_run(client, store, run, job)
            finished.append(run)
        else:
            stopping[run.id] = run
    return _stop_jobs(client, store, stopping, where, wait_s, Cancelled(stopped, finished))


def _unfinished(store: Store, ref: str) -> list[RunRecord]:
    """The runs `ref` names that have not ended (StoreError when it names none), none of another user's."""
    runs = store.resolve(ref)
    if not runs:
        raise StoreError(f"no run or sweep {ref!r} in the store; `rpg runs` lists them")
    unfinished = [r for r in runs if r.status not in TERMINAL]
    _refuse_others_runs(unfinished)
    return unfinished


def _jobs_of(
    submitted: list[RunRecord], address: str | None, runs_dir: Path
) -> tuple[JobSubmissionClient | None, str, dict[str, JobDetails], list[RunRecord]]:
    """The cluster's client and its name, its jobs, and the runs among `submitted` whose jobs it does not know."""
    client, where = _cancel_client(address, runs_dir) if submitted else (None, "")
    jobs = _cluster_jobs(client, where) if client is not None else {}
    return client, where, jobs, [r for r in submitted if r.submission_id not in jobs]


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
                state = sync_run(client, store, run, job, stopped_why=CANCELLED)
                (done.stopped if state == "stopped" else done.finished).append(run)
        if stopping and time.monotonic() > deadline:
            for run in stopping.values():
                if run.id not in accepted:
                    done.unconfirmed.append(run)
                    continue
                save_log(client, run)
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
    """Record a run stopped by `rpg cancel` (its last metrics first), unless it reached a terminal state; one
    that had stopped on request first (`rpg cancel --graceful` under Slurm) as its request says."""
    from rpg_cli.orchestration.stops import graceful_stop

    store.ingest_metrics(run.id, run.metrics_path)
    # "succeeded": what its job's exit means if its stopped line is there; without one, the request stands for nothing
    status, error = graceful_stop(run.run_dir, "succeeded") or ("stopped", CANCELLED)
    return store.set_status(run.id, status, error=error, unless_terminal=True)


# ------------------------------------------------------------------------------- graceful stops

SETTLE_S = 10.0  # without Ray to ask: how long a stopped run waits for its watcher to record it


@dataclass(frozen=True)
class StopAsked:
    """What `ask_to_stop` did: the runs asked to stop after their step, each with the last step it had logged;
    and what was done to the others, the runs that had not started training (None: left as they were)."""

    asked: list[tuple[RunRecord, int]]
    others: Cancelled | None


@dataclass(frozen=True)
class StopEnded:
    """An asked run that ended: as the store holds it now, and the step of the checkpoint it stopped at (its
    `stopped` line; None when it ended otherwise: it finished its last step, or failed)."""

    run: RunRecord
    step: int | None


def ask_to_stop(
    ref: str,
    why: str,
    db_url: str = DEFAULT_DB_URL,
    address: str | None = None,
    runs_dir: Path = DEFAULT_RUNS_DIR,
    lost: bool = False,
    others: bool = True,
    ray: bool = True,
    wait_s: float = 20.0,
) -> StopAsked:
    """Ask the unfinished runs of `ref` that are training to end gracefully after the step they are in
    (`rundir.request_stop(run_dir, why)`: a checkpoint, a `stopped` line, exit), instead of stopping their jobs.

    Training: its job runs on the cluster (as Ray says; without `ray`, as the store last recorded: the runs of
    a sweep's Slurm job, whose Ray cannot be reached from here) and this attempt has logged a step (step 0,
    the validation before training, saves nothing). With `others`, the rest are cancelled as `cancel`
    cancels them (nothing to save), and runs the cluster does not know refuse the whole command as there;
    without, they are left as they were (Slurm's signal: they end with the allocation's Ray)."""
    store = open_store(db_url, create=False)
    try:
        unfinished = _unfinished(store, ref)
        if not ray:
            training = [r for r in unfinished if r.status == "running"]
            return StopAsked(_request_stops(training, why), None)
        submitted = [r for r in unfinished if r.submission_id]
        client, where, jobs, unknown = _jobs_of(submitted, address, runs_dir)
        if unknown and others and not lost:
            raise NotOnClusterError(_not_on_cluster(ref, unknown, len(unfinished), where, client is None))
        running = [
            r for r in submitted if r.submission_id in jobs and run_state(jobs[r.submission_id].status) == "running"
        ]
        asked = _request_stops(running, why)
        if not others:
            return StopAsked(asked, None)
        rest = [r for r in unfinished if r.id not in {run.id for run, _ in asked}]
        return StopAsked(asked, _cancel_runs(client, store, rest, jobs, where, wait_s))
    finally:
        store.close()


def _request_stops(runs: list[RunRecord], why: str) -> list[tuple[RunRecord, int]]:
    """Write the stop request of each run that has logged a training step in this attempt."""
    asked = []
    for run in runs:
        last = attempt_step(run.metrics_path)
        if last is not None and last >= 1:
            rundir.request_stop(run.run_dir, why)
            asked.append((run, last))
    return asked


def attempt_step(metrics_path: Path) -> int | None:
    """The last step the current attempt logged in metrics.jsonl (None: none yet): a step line after the last
    restart line, which a resumed attempt writes first."""
    import json

    try:
        data = rundir.read_owned(metrics_path) or b""
    except OSError:  # another user's file, a link: no step rpg can trust
        return None
    for line in reversed(data.splitlines()):
        try:
            obj = json.loads(line)
        except ValueError:  # a line torn by a crash, or being written
            continue
        if not isinstance(obj, dict):
            continue
        if rundir.RESTART_KEY in obj:  # what comes before is an earlier attempt's
            return None
        step = obj.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None


def _stopped_step(run: RunRecord) -> int | None:
    """The step of the checkpoint the run stopped at on request (its metrics.jsonl ends with a stopped line)."""
    from rpg_cli.store.ingest import stopped_at_end

    try:
        stopped = stopped_at_end(run.metrics_path)
    except OSError:
        return None
    return stopped.step if stopped is not None else None


def wait_for_stops(
    asked: list[RunRecord],
    timeout_s: float,
    db_url: str = DEFAULT_DB_URL,
    address: str | None = None,
    runs_dir: Path = DEFAULT_RUNS_DIR,
    ray: bool = True,
    poll_s: float = 0.5,
) -> tuple[list[StopEnded], list[RunRecord]]:
    """Wait up to `timeout_s` for the asked runs to end; returns those that ended and those that did not.

    A run has ended when Ray says its job has (recorded here as `sweep.sync_run` records it, unless its watcher did),
    when the store says so, or, where no Ray can be asked (`ray` False, or the cluster went away: Slurm stops
    it), when its `stopped` line is written (the checkpoint is saved) and its watcher had SETTLE_S to record
    it. The requests stay: `sweep.sync_run` reads them (orchestration/stops.py), and the next attempt clears its own."""
    store = open_store(db_url, create=False)
    try:
        client = None
        if ray:
            with contextlib.suppress(ClusterError, OSError):
                client = connect(address, runs_dir, start=False)
        waiting = {r.id: r for r in asked}
        seen: dict[str, float] = {}  # run id -> when its stopped line was first seen
        ended: list[StopEnded] = []
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = None
            if client is not None:
                with contextlib.suppress(RuntimeError, OSError):  # the cluster went away: the files say the rest
                    jobs = ray_jobs(client)
            for run in list(waiting.values()):
                step = _stopped_step(run)
                if step is not None:
                    seen.setdefault(run.id, time.monotonic())
                settle_s = 0.0 if ray else SETTLE_S  # its watcher, not Ray, records it: a moment for that
                if _has_ended(client, store, run, jobs, seen.get(run.id), settle_s):
                    del waiting[run.id]
                    ended.append(StopEnded(store.run(run.id) or run, step))
            if not waiting or time.monotonic() >= deadline:
                return ended, list(waiting.values())
            time.sleep(poll_s)
    finally:
        store.close()


def _has_ended(
    client: JobSubmissionClient | None,
    store: Store,
    run: RunRecord,
    jobs: dict[str, JobDetails] | None,
    stopped_seen: float | None,
    settle_s: float,
) -> bool:
    """Whether an asked run has ended (see `wait_for_stops`); a job Ray saw end is recorded here."""
    current = store.run(run.id) or run
    job = jobs.get(run.submission_id) if jobs is not None and run.submission_id else None
    if job is not None and run_state(job.status) in TERMINAL:
        if current.status not in TERMINAL:
            sync_run(client, store, current, job)
        return True
    if current.status in TERMINAL:  # its watcher recorded it
        return True
    if job is not None or stopped_seen is None:  # Ray says it runs, or nothing says it stopped
        return False
    return time.monotonic() - stopped_seen >= settle_s
