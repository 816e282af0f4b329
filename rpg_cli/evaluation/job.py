"""How `rpg eval` runs: in this process, or as a Ray job like training (on the cluster at --address,
or on rpg's local head), followed to its end. `evaluate` is the one call the CLI makes.

The job never sees the store, nor its URL or password: it runs `python -m rpg_cli.evaluation '<the
options as JSON, less --db>' '<the targets as JSON>'` from the directory rpg runs in (the local head
shares this filesystem; a remote cluster needs the same paths), and writes what it scores to the run
directories (evaluation/pipeline.py, in files.py's formats); this process, which holds --db, ingests
those files as they grow and records the metrics once every problem is scored (evaluation/recording.py). The targets are what this process resolved
(run ids, names and sweeps are looked up in the store here). The submission id is a hash of the
command, so running the same `rpg eval` again while the job lives re-attaches to it instead of
starting a second one; once it has ended, a new attempt gets `-2`, `-3`, ...
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli import rundir
from rpg_cli.evaluation.generation import check_tp, visible_gpus
from rpg_cli.evaluation.options import EvalOptions
from rpg_cli.evaluation.pipeline import run_eval
from rpg_cli.evaluation.plan import Checkpoint, EvalPlan, Sampling, Target, plan_eval
from rpg_cli.evaluation.recording import ScoredFeed, eval_results, finish_eval, prepare_target, scored_count
from rpg_cli.evaluation.results import EvalResult
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
    `default_gpus`, or --tp's N) and return what the store holds. `on_plan(plan)` once it is planned,
    `on_progress(samples scored, what)` as it goes. Raises EvalError, StoreError or ClusterError
    (one line) on bad input, JobFailed when the job ended without succeeding."""
    plan = plan_eval(options)
    num_gpus = gpus if gpus is not None else max(default_gpus(plan), float(options.tp or 0))  # --tp N: N GPUs
    if options.tp is not None:  # refused before anything is written, loaded or submitted
        where = "visible" if local else "reserved for the job" + (f" (--gpus {gpus:g})" if gpus is not None else "")
        check_tp(plan.targets, options.tp, visible_gpus() if local else int(num_gpus), where)
    store = open_store(options.db)
    progress = on_progress or (lambda done, label: None)
    try:
        for target in plan.targets:  # eval/ goes there: a planted link or someone else's is refused first
            rundir.make_run_dir(target.run_dir)
        if on_plan is not None:
            on_plan(plan)
        if local:
            return run_eval(plan, store, on_progress=lambda p: progress(p.done, p.label))
        for target in plan.targets:
            prepare_target(store, target)
        job = submit_eval(
            options,
            address,
            Path(options.runs_dir),
            num_gpus=num_gpus,
            targets=plan.targets,
        )
        label = f"Ray job {job.submission_id}" + (" (attached)" if job.attached else "")
        progress(0, label)
        feed = ScoredFeed()

        def poll() -> None:
            for target in plan.targets:
                for checkpoint in target.checkpoints:
                    for bench in plan.benchmarks:
                        feed.ingest(store, target, checkpoint.step, bench)
            progress(scored_count(store, plan), label)

        status, log = follow_eval(job, on_poll=poll)
        incomplete = finish_eval(store, plan, feed)  # whatever the job's end: what it scored is kept
        if status != "SUCCEEDED":
            raise JobFailed(
                f"the evaluation job {job.submission_id} ended {status}: "
                f"{last_lines(log, 3)[-600:] or 'no output'} (`ray job logs {job.submission_id}` has all of it; "
                "the same command resumes)"
            )
        if incomplete:
            target, step, bench = incomplete[0]
            raise JobFailed(
                f"the evaluation job {job.submission_id} succeeded, but "
                f"{rundir.eval_scored_path(target.run_dir, step, bench.name)} lacks problems it scored: the "
                "cluster must see the runs directory at the same path as this machine (a shared filesystem)"
            )
        return eval_results(store, plan)
    finally:
        store.close()


def job_argv(options: EvalOptions, targets: tuple[Target, ...] | None = None) -> list[str]:
    """The evaluation job's command: the options as one JSON argument, all but the database URL, and
    the targets this process resolved as another (without them the job resolves paths only)."""
    argv = ["python", "-m", "rpg_cli.evaluation", options.model_dump_json(exclude={"db"})]
    return argv if targets is None else [*argv, encode_targets(targets)]


def encode_targets(targets: tuple[Target, ...]) -> str:
    return json.dumps([_target_fields(t) for t in targets], sort_keys=True, separators=(",", ":"))


def _target_fields(target: Target) -> dict:
    fields = {f.name: getattr(target, f.name) for f in dataclasses.fields(target)}
    fields["run_dir"] = str(target.run_dir)
    fields["checkpoints"] = [[c.step, str(c.path)] for c in target.checkpoints]
    fields["sampling"] = dataclasses.asdict(target.sampling)
    return fields


def decode_targets(text: str) -> list[Target]:
    """The targets of `encode_targets`; ValueError, KeyError or TypeError when the text is not that."""
    out = []
    for fields in json.loads(text):
        fields = dict(fields)
        fields["run_dir"] = Path(fields["run_dir"])
        fields["checkpoints"] = tuple(Checkpoint(int(step), Path(path)) for step, path in fields["checkpoints"])
        fields["sampling"] = Sampling(**fields["sampling"])
        out.append(Target(**fields))
    return out


def submit_eval(
    options: EvalOptions,
    address: str | None = None,
    runs_dir: Path = Path("runs"),
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    targets: tuple[Target, ...] | None = None,
) -> EvalJob:
    """Submit the evaluation (or find the identical one that is running); raises ClusterError. The
    job's environment and metadata carry nothing of the store: it writes files only."""
    client = connect(address, runs_dir)
    assert client is not None  # connect starts the local head when needed
    argv = job_argv(options, targets)
    base = "rpg-eval-" + hashlib.sha256(shell_command(argv).encode()).hexdigest()[:12]
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
