"""`rpg logs` and `rpg stop`: a run's job output (from the cluster, else its job.log), and the end of the local head
once its jobs are brought into the store (`rpg cancel` and graceful stops: orchestration/cancel.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli import rundir
from rpg_cli.orchestration.head import DEFAULT_RUNS_DIR, connect, stop_local_head
from rpg_cli.orchestration.reconcile import sync_known
from rpg_cli.orchestration.submit import ray_jobs, run_state, tail_logs
from rpg_cli.states import LIVE
from rpg_cli.store import DEFAULT_DB_URL, StoreError, open_store

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

    from rpg_cli.store import RunRecord


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
        sync_known(client, store, runs, jobs)
        return {r.submission_id: r.name for r in runs if r.submission_id}
    finally:
        store.close()
