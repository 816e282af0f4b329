"""What became of a run that was asked to stop gracefully (rundir.request_stop), once its job has ended.

A preemption (SIGTERM, or Slurm's USR1, which each job's entry point turns into the request) or `rpg cancel
--graceful` (which writes the request itself) asks the run's trainer to finish the step it is in, save its
checkpoint and end metrics.jsonl with a stopped line (rundir.stopped_line); the job then exits 0. Ray calls
that job succeeded. `graceful_stop` says what it is instead, in the run's states (states.py):

    preempted   the request was a preemption: the next `rpg sweep` resumes the run from that checkpoint
    stopped     the request was `rpg cancel --graceful`: resumed with --retry-failed, as any stopped run

with a one-line reason naming the step of the newest checkpoint, where the resume begins. A job that died
before the step in progress ended (the node went away, the grace period ran out) is preempted too, and
resumes from its newest checkpoint. What the trainer did not stop for keeps Ray's word: a run that reached
its last step (succeeded), a divergence (failed: resuming would diverge again). So does a job stopped through
Ray (`rpg cancel`, a watchdog, `ray job stop`): someone chose to end it there, whatever its signal handler
then asked for (Ray's stop sends SIGTERM, which the job records as a preemption; start.py has the details).
"""

from __future__ import annotations

from pathlib import Path

from rpg_cli import rundir
from rpg_cli.store.ingest import stopped_at_end

STATE_OF = {rundir.PREEMPTED: "preempted", rundir.CANCELLED: "stopped"}
_ASKED_BY = {rundir.PREEMPTED: "preempted (SIGTERM/USR1)", rundir.CANCELLED: "stopped (`rpg cancel --graceful`)"}
_AGAIN = {rundir.PREEMPTED: "`rpg sweep SPEC`", rundir.CANCELLED: "`rpg sweep SPEC --retry-failed`"}
_DIVERGED = rundir.diverged(0, "").split(" at step")[0]  # "training diverged": a failure no resume cures


def graceful_stop(run_dir: Path, ray_state: str, error: str | None = None) -> tuple[str, str] | None:
    """(state, reason) of a run whose job ended in `ray_state` (the run state Ray's status means: succeeded,
    failed, stopped) while a stop request was recorded in `run_dir`, else None (Ray's state stands). `error`:
    the failure reason read from the job's log, if any. A run directory this user cannot read (a teammate's
    run in a shared store, a planted link: rundir.py's rule) has no request as far as rpg can tell."""
    try:
        why = rundir.stop_requested(run_dir)
        if why is None:
            return None
        newest = max(rundir.find_checkpoints(run_dir), default=None)
        stopped = stopped_at_end(rundir.metrics_path(run_dir))
    except OSError:
        return None
    if ray_state == "stopped":  # stopped through Ray: someone ended it there (module doc)
        return None
    if stopped is not None:  # the trainer stopped as asked: its checkpoint is saved
        return STATE_OF[stopped.why], _after_step(stopped.why, stopped.step, newest)
    if ray_state != "failed" or (error or "").startswith(_DIVERGED):
        return None
    died = f"the job ended before the step in progress did ({error or 'failed'})"
    return STATE_OF[why], f"{_ASKED_BY[why]}: {died}; {_resume(why, newest)}"


def _after_step(why: str, step: int, newest: int | None) -> str:
    """The reason of a run whose trainer stopped after step `step` as asked; `newest`: its newest checkpoint."""
    if newest == step:
        return f"{_ASKED_BY[why]} at step {step}: checkpoint saved; {_resume(why, newest)}"
    return f"{_ASKED_BY[why]} after step {step}; {_resume(why, newest)}"  # before its first step, or pruned by hand


def _resume(why: str, newest: int | None) -> str:
    if newest is None:
        return f"{_AGAIN[why]} starts it over (no checkpoint)"
    return f"{_AGAIN[why]} resumes it at step {newest + 1}"
