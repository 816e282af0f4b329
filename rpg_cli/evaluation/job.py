"""How `rpg eval` runs: in this process, or as a Ray job like training (on the cluster at --address,
or on rpg's local head), followed to its end. `evaluate` is the one call the CLI makes.

The job runs `python -m rpg_cli.evaluation '<the options as JSON>'` from the directory rpg runs in (the
local head shares this filesystem; a remote cluster needs the same paths). The database URL, which
may hold a password, travels in the job's environment ($RPG_EVAL_DB), not in that command. The
submission id is a hash of the command and the URL, so running the same `rpg eval` again while the
job lives re-attaches to it instead of starting a second one; once it has ended, a new attempt gets
`-2`, `-3`, ... The results go to the store, which is also where the caller reads progress from.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli.evaluation.options import DB_ENV, EvalOptions
from rpg_cli.evaluation.pipeline import EvalResult, eval_results, run_eval, scored_count
from rpg_cli.evaluation.plan import EvalPlan, plan_eval
from rpg_cli.orchestration.head import connect
from rpg_cli.orchestration.submit import ray_jobs, run_state, shell_command, submit
from rpg_cli.rundir import last_lines
from rpg_cli.states import LIVE
from rpg_cli.store import open_store

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient


class JobFailed(RuntimeError):
    """The evaluation job ended without succeeding; the message is one line with its last output."""


@dataclass(frozen=True)
class EvalJob:
    client: JobSubmissionClient
    submission_id: str
    attached: bool  # an identical evaluation was already running: followed, not resubmitted


def evaluate(
    options: EvalOptions,
    *,
    local: bool = False,
    address: str | None = None,
    gpus: float | None = None,
    on_plan: Callable[[EvalPlan], None] | None = None,
    on_progress: Callable[[int, str], None] | None = None,
) -> list[EvalResult]:
    """Plan `options`, evaluate (here with `local`, else as a Ray job reserving `gpus`, default: see
    `default_gpus`) and return what the store holds. `on_plan(plan)` once it is planned,
    `on_progress(samples scored, what)` as it goes. Raises EvalError, StoreError or ClusterError
    (one line) on bad input, JobFailed when the job ended without succeeding."""
    plan = plan_eval(options)
    store = open_store(options.db)
    progress = on_progress or (lambda done, label: None)
    try:
        if on_plan is not None:
            on_plan(plan)
        if local:
            return run_eval(plan, store, on_progress=lambda p: progress(p.done, p.label))
        job = submit_eval(
            options, address, Path(options.runs_dir), num_gpus=default_gpus(plan) if gpus is None else gpus
        )
        label = f"Ray job {job.submission_id}" + (" (attached)" if job.attached else "")
        progress(0, label)
        status, log = follow_eval(job, on_poll=lambda: progress(scored_count(store, plan), label))
        if status != "SUCCEEDED":
            raise JobFailed(
                f"the evaluation job {job.submission_id} ended {status}: "
                f"{last_lines(log, 3)[-600:] or 'no output'} (`ray job logs {job.submission_id}` has all of it)"
            )
        return eval_results(store, plan)
    finally:
        store.close()


def job_argv(options: EvalOptions) -> list[str]:
    """The evaluation job's command: the options travel as one JSON argument, all but the database
    URL (see `job_env`)."""
    return ["python", "-m", "rpg_cli.evaluation", options.model_dump_json(exclude={"db"})]


def job_env(options: EvalOptions) -> dict[str, str]:
    """The evaluation job's environment variables: the database URL."""
    return {DB_ENV: options.db}


def submit_eval(
    options: EvalOptions,
    address: str | None = None,
    runs_dir: Path = Path("runs"),
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
) -> EvalJob:
    """Submit the evaluation (or find the identical one that is running); raises ClusterError."""
    client = connect(address, runs_dir)
    assert client is not None  # connect starts the local head when needed
    argv = job_argv(options)
    base = "rpg-eval-" + hashlib.sha256(f"{shell_command(argv)}\n{options.db}".encode()).hexdigest()[:12]
    jobs = ray_jobs(client)
    attempt, submission_id = 1, base
    while submission_id in jobs:
        if run_state(jobs[submission_id].status) in LIVE:
            return EvalJob(client, submission_id, attached=True)
        attempt += 1
        submission_id = f"{base}-{attempt}"
    submit(
        client,
        argv,
        submission_id,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        env=job_env(options),
        metadata={"rpg_eval": options.ref},
    )
    return EvalJob(client, submission_id, attached=False)


def follow_eval(job: EvalJob, on_poll: Callable[[], None] | None = None, poll_s: float = 1.0) -> tuple[str, str]:
    """Wait for the job to end, calling `on_poll` between checks; returns (Ray status, its log)."""
    while True:
        status = str(job.client.get_job_status(job.submission_id))
        if on_poll is not None:
            on_poll()
        if run_state(status) not in LIVE:
            return status, job.client.get_job_logs(job.submission_id)
        time.sleep(poll_s)


def default_gpus(plan: EvalPlan) -> float:
    """GPUs the job reserves unless told: one when a run of the plan trained on GPUs, else none."""
    return 1.0 if any(((t.spec or {}).get("resources") or {}).get("gpus_per_node") for t in plan.targets) else 0.0
