"""The Ray Jobs API as rpg uses it, for training runs and evaluations alike: one way to submit a job,
what Ray's job states mean for a run, and a job's logs."""

from __future__ import annotations

import os
import re
import shlex
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

# Ray's job status -> the run state it means (see rpg_cli/states.py)
_STATE_OF_RAY_STATUS = {
    "PENDING": "submitted",
    "RUNNING": "running",
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "STOPPED": "stopped",
}


def run_state(ray_status: object) -> str:
    """The run state a Ray job status means."""
    return _STATE_OF_RAY_STATUS[str(ray_status)]


def killed_by(job: JobDetails) -> str | None:
    """'killed by signal 9 (SIGKILL)' when the job's entrypoint died of a signal: Ray records the exit
    status as -N (or a shell's 128+N), in `driver_exit_code` and in its message."""
    code = getattr(job, "driver_exit_code", None)
    if code is None:
        found = re.search(r"failed with exit code (-?\d+)", job.message or "")
        code = int(found.group(1)) if found else None
    number = -code if code is not None and code < 0 else code - 128 if code is not None and 128 < code < 160 else None
    try:
        name = signal.Signals(number).name if number else None
    except ValueError:
        return None
    if name is None:
        return None
    why = (
        ": by someone, or by the kernel when the machine ran out of memory (its log, `dmesg`, says which)"
        if number == signal.SIGKILL
        else ""
    )
    return f"killed by signal {number} ({name}){why}"


# Ray 2.60's words (gcs_server) when a job's supervisor actor dies with its node: "The actor died because
# its node has died. Node Id: <id>" then "the actor's node was terminated [un]expectedly: <why>"; the
# actor's own description above it holds "ip: <node's address>". When the supervisor's process is seen dead
# before its node is (which Ray notices first is its own race), "The actor is dead because its worker process
# has died. Worker exit type: SYSTEM_ERROR ...".
_NODE_DIED = "its node has died"
_PROCESS_DIED = "its worker process has died"
_NODE_WHY = re.compile(r"the actor's node was (terminated[^\n]*)")
_NODE_IP = re.compile(r"^\s*ip: (\S+)\s*$", re.MULTILINE)
_EXIT_TYPE = re.compile(r"Worker exit type: (\w+)")
_RESUME = (
    "once the cluster has a live node for it, `rpg sweep SPEC --retry-failed` resumes the run from its last checkpoint"
)


def lost_node(job: JobDetails) -> str | None:
    """One line for a job that failed because the node running it died, or its supervisor's process with it
    (Ray's message for that is a dozen lines of actor ids), naming the node and what Ray saw; None for any
    other failure. The run's checkpoints are on the shared runs/, so a retry resumes it on a node that is alive."""
    message = getattr(job, "message", None) or ""
    ip = _NODE_IP.search(message)
    node = f"node {ip.group(1)}" if ip else "the node"
    if _NODE_DIED in message:
        why = _NODE_WHY.search(message)
        seen = f" (Ray: {why.group(1).strip().rstrip('.')})" if why else ""
        return f"{node} running the job died{seen}; {_RESUME}"
    if _PROCESS_DIED in message and ip:
        exit_type = _EXIT_TYPE.search(message)
        seen = f"worker exit {exit_type.group(1)}" if exit_type else "its worker process died"
        return f"the job's supervisor on {node} died (Ray: {seen}; the node itself may be gone); {_RESUME}"
    return None


def shell_command(argv: Sequence[str]) -> str:
    """The entrypoint Ray runs through a shell, in the directory the head was started from: go to where
    rpg runs, so that relative paths mean what they mean here. The local head shares this filesystem,
    so nothing is uploaded (no runtime_env working_dir); a remote cluster must see the same path (a
    shared filesystem). Every argument is quoted: no value reaches the shell unquoted."""
    return f"cd {shlex.quote(os.getcwd())} && exec {shlex.join(argv)}"


# Ray's dashboard answers this (HTTP 500) when the head's job agent is not known within its 10 s
# (dashboard/consts.py WAIT_AVAILABLE_AGENT_TIMEOUT): the job was not submitted, so asking again is safe.
_NO_AGENT_YET = "No available agent to submit job"
AGENT_WAIT_S = 120.0


def submit(
    client: JobSubmissionClient,
    argv: Sequence[str],
    submission_id: str,
    *,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    env: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
    agent_wait_s: float = AGENT_WAIT_S,
) -> None:
    """Submit `argv` as the job `submission_id`, reserving `num_cpus`/`num_gpus` for its entrypoint. A head
    whose job agent has not registered yet (a cluster just started, a loaded machine) is asked again until
    `agent_wait_s` has passed; any other refusal is raised at once."""
    deadline = time.monotonic() + agent_wait_s
    while True:
        try:
            client.submit_job(
                entrypoint=shell_command(argv),
                submission_id=submission_id,
                runtime_env={"env_vars": dict(env)} if env else None,
                entrypoint_num_cpus=num_cpus,
                entrypoint_num_gpus=num_gpus or None,
                metadata=dict(metadata) if metadata else None,
            )
            return
        except RuntimeError as exc:
            if _NO_AGENT_YET not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(1.0)


def ray_jobs(client: JobSubmissionClient) -> dict[str, JobDetails]:
    """Every job the cluster knows, by submission id."""
    return {job.submission_id: job for job in client.list_jobs() if job.submission_id}


def tail_logs(client: JobSubmissionClient, submission_id: str) -> Iterator[str]:
    """The job's output as it comes, until the job ends."""
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


def from_ms(ms: int | None) -> datetime | None:
    """A Ray timestamp (milliseconds since the epoch) as naive UTC, the store's convention."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, timezone.utc).replace(tzinfo=None)
