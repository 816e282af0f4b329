"""`rpg eval` as a Ray job, like training: on the cluster at --address, or on rpg's local head.

The job runs `python -m rpg_cli.evaluation <the same options>` from the directory rpg runs in (the
local head shares this filesystem; a remote cluster needs the same paths). Its submission id is a
hash of those options, so running the same `rpg eval` again while the job lives re-attaches to it
instead of starting a second one; once it has ended, a new attempt gets `-2`, `-3`, ... The results
go to the store, which is also where the caller reads progress from.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli.evaluation.plan import EvalOptions

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

_LIVE = ("PENDING", "RUNNING")


@dataclass(frozen=True)
class EvalJob:
    client: JobSubmissionClient
    submission_id: str
    attached: bool  # an identical evaluation was already running: followed, not resubmitted


def entrypoint(options: EvalOptions) -> str:
    # Ray runs the entrypoint through a shell: every argument is quoted, so no value is parsed by it.
    argv = ["python", "-m", "rpg_cli.evaluation", *options.to_argv()]
    return f"cd {shlex.quote(os.getcwd())} && exec {shlex.join(argv)}"


def submit_eval(options: EvalOptions, address: str | None = None, runs_dir: Path = Path("runs"),
                num_cpus: float = 1.0, num_gpus: float = 0.0) -> EvalJob:  # fmt: skip
    """Submit the evaluation (or find the identical one that is running); raises jobs.ClusterError."""
    from rpg_cli.jobs import connect

    client = connect(address, runs_dir)
    assert client is not None  # connect starts the local head when needed
    command = entrypoint(options)
    base = "rpg-eval-" + hashlib.sha256(command.encode()).hexdigest()[:12]
    jobs = {job.submission_id: job for job in client.list_jobs() if job.submission_id}
    attempt, submission_id = 1, base
    while submission_id in jobs:
        if str(jobs[submission_id].status) in _LIVE:
            return EvalJob(client, submission_id, attached=True)
        attempt += 1
        submission_id = f"{base}-{attempt}"
    client.submit_job(
        entrypoint=command,
        submission_id=submission_id,
        entrypoint_num_cpus=num_cpus,
        entrypoint_num_gpus=num_gpus or None,
        metadata={"rpg_eval": options.ref},
    )
    return EvalJob(client, submission_id, attached=False)


def follow_eval(job: EvalJob, on_poll: Callable[[], None] | None = None, poll_s: float = 1.0) -> tuple[str, str]:
    """Wait for the job to end, calling `on_poll` between checks; returns (Ray status, its log)."""
    while True:
        status = str(job.client.get_job_status(job.submission_id))
        if on_poll is not None:
            on_poll()
        if status not in _LIVE:
            return status, job.client.get_job_logs(job.submission_id)
        time.sleep(poll_s)


def default_gpus(plan) -> float:
    """GPUs the job reserves unless told: one when a run of the plan trained on GPUs, else none."""
    return 1.0 if any(((t.spec or {}).get("resources") or {}).get("gpus_per_node") for t in plan.targets) else 0.0


def last_lines(log: str, n: int = 3) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return " | ".join(lines[-n:])[-600:] if lines else "no output"
