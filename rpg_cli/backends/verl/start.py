"""A verl job's entry point: wait, holding nothing but this process, until the cluster has the run's GPUs
free, then become verl's `main_ppo` (exec, same process).

verl 0.9.1 starts its driver, task runner and TransferQueue actors (about 11 CPUs and a few GB) before it
reserves its GPUs, so a run that waited there for GPUs other runs hold (admission.py) held all of that
meanwhile, and a sweep larger than its cluster tied up the cluster's CPUs in runs doing nothing. The job
waits here first, as its bare entrypoint (the one CPU it reserves), with the same rule (`admission.admit`),
and starts verl once the GPUs are free, leased to it until its trainer has reserved them, so that runs
submitted together do not all go through on the same free GPUs (admission.py).

Then, before verl starts, it checks the cluster's GPU nodes as `rpg doctor` checks a node (node.py: flash-attn
when the run loads its model with flash_attention_2, the GPUs torch sees, enough GPUs on enough nodes, the
plugin), each with the job's environment, so that a node that lacks one fails the run with one line
(`rpg runs` shows it: diagnose.failure_reason) instead of a traceback deep in a verl worker.

    python -m rpg_cli.backends.verl.start --gpus N --run rpg-<run id> -- <main_ppo's Hydra overrides>

Run outside a Ray job (no RAY_ADDRESS: verl starts a Ray of its own), it waits for nothing and checks nothing.
Once the wait is over it marks the run directory (`mark_held`): the run's device time counts from there.

A graceful stop (rundir.request_stop: the request file in the run directory) reaches verl's training loop, which
runs in a Ray actor (TaskRunner) possibly on another node, through the shared runs directory: rpg's trainer
(reference.py) reads it at each step boundary, saves that step's checkpoint, ends metrics.jsonl with a stopped
line and ends `fit`, and main_ppo exits 0. This process, the job's entrypoint, is what a preemption signals:
SIGTERM and SIGUSR1 (Slurm's warning before a time limit) only write the request (`stop_on_signals`) and it
keeps running, because the TaskRunner dies with it (Ray ends the actors of a driver that exits). So it does not
exec main_ppo straight away, which would drop Python's handlers: it execs itself with `--started`, which puts
the handlers back and runs main_ppo in the same process (`run_main_ppo`), the signals held in between
(`exec_held`). A request made while the job still waits for its GPUs ends it there (`end_unstarted`).

Ray's own `stop_job` (ray/dashboard/modules/job/job_supervisor.py, Ray 2.60) cannot stop a run gracefully: it
sends SIGTERM (RAY_JOB_STOP_SIGNAL) to the entrypoint and its child processes, waits RAY_JOB_STOP_WAIT_TIME_S
(3 s by default) and then SIGKILLs them, and a step takes minutes. That is why `rpg cancel --graceful` writes
the request file and leaves the job to end itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from rpg_cli import rundir
from rpg_cli.backends.verl.internals import FILE_LOGGER_ENV

MAIN_PPO = ("-m", "verl.trainer.main_ppo")
THIS = ("-m", "rpg_cli.backends.verl.start")  # what it execs once the wait is over: itself, --started
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequested(Exception):
    """A graceful stop asked while the job waited for its GPUs, before verl started: nothing to save."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def job_run_dir() -> Path | None:
    """The run directory of the job (launch.env gives every verl job VERL_FILE_LOGGER_PATH, its metrics.jsonl);
    None outside rpg's launch: no stop request can reach such a run."""
    path = os.environ.get(FILE_LOGGER_ENV)
    return Path(path).parent if path else None


def stop_on_signals(run_dir: Path) -> None:
    """SIGTERM and SIGUSR1 record a stop request (preempted) and nothing more: the process keeps running until
    verl's loop ends at the step boundary (module doc). A request already there is kept: `rpg cancel
    --graceful` came first, so the run is cancelled, not preempted. The handler prints nothing: a write to
    stdout while verl writes would break the stream."""

    def request(signum, frame) -> None:
        if rundir.stop_requested(run_dir) is None:
            rundir.request_stop(run_dir, rundir.PREEMPTED)

    for signum in STOP_SIGNALS:
        signal.signal(signum, request)


def waiting_sleep(run_dir: Path | None):
    """admission.admit's `sleep` for the wait before verl starts: StopRequested once a stop is asked."""

    def sleep(seconds: float) -> None:
        time.sleep(seconds)
        if run_dir is not None and (why := rundir.stop_requested(run_dir)):
            raise StopRequested(why)

    return sleep


def end_unstarted(run_dir: Path, why: str) -> None:
    """The job stops before verl starts: its run stands at its newest checkpoint (none: step 0), which the
    stopped line names, as the trainer's would (orchestration/stops.py reads it)."""
    step = max(rundir.find_checkpoints(run_dir), default=0)
    rundir.append_line(rundir.metrics_path(run_dir), rundir.stopped_line(step, why))
    print(say(f"rpg: stopped ({why}) while waiting for GPUs; the run stands at step {step}"), flush=True)


def mark_held(run_dir: Path | None) -> None:
    """Note in the run directory that the attempt holds its GPUs from now (rundir.mark_held): the watcher counts
    the run's device time from it, not from Ray's start, which includes the wait above. A mark that cannot be
    written costs the run its measured device time, not its training."""
    if run_dir is not None:
        with contextlib.suppress(OSError):
            rundir.mark_held(run_dir)


def say(line: str) -> str:
    """admission's line, marked as this wait's (the one inside verl is the same rule, later)."""
    return line.replace("rpg: ", "rpg (before verl starts): ", 1)


def wait_for_gpus(gpus: int, run: str) -> None:
    """Return once the job's Ray cluster has `gpus` GPUs free that no other run was let through for, leased to
    `run` until its trainer reserves them (admission.py); ValueError, verl's message, if the cluster has fewer;
    StopRequested when a graceful stop is asked meanwhile (no lease is held then: a claim that succeeds ends
    the wait). The job's Ray session stays open for `check_nodes` (closed here when the wait fails)."""
    import ray

    from rpg_cli.backends.verl.admission import admit, ledger

    ray.init(logging_level="ERROR", log_to_driver=False)  # the job's cluster (RAY_ADDRESS), its runtime env
    if (run_dir := job_run_dir()) is not None:
        stop_on_signals(run_dir)  # ray.init put its own in place (ours_after_ray_init)
    try:
        leases = ledger()
        admit(
            gpus,
            ray.cluster_resources,
            lambda: {"GPU": ray.get(leases.claim.remote(run, gpus))},
            say=lambda line: print(say(line), flush=True),
            sleep=waiting_sleep(job_run_dir()),
        )
    except BaseException:
        ray.shutdown()
        raise


def check_nodes(overrides: list[str], run: str) -> str | None:
    """In the Ray session `wait_for_gpus` left open (closed here): the cluster's GPU nodes checked for this run
    (node.py); the line that refuses it (its GPU lease released), or None. Without a session (nothing waited)
    there is no cluster to check."""
    import ray

    if not ray.is_initialized():
        return None
    from rpg_cli.backends.verl import node
    from rpg_cli.backends.verl.admission import release_lease
    from rpg_cli.backends.verl.launch import PLUGIN_MODULE

    try:
        reports = node.gpu_node_reports(node.uses_flash_attention(overrides), PLUGIN_MODULE, node.JOB_TIMEOUT_S)
        refused = node.refusal(reports, *node.gpus_per_node(overrides))
        if refused:
            release_lease(run)  # the next run need not wait LEASE_S for GPUs this one will not take
        return refused
    finally:
        ray.shutdown()


def exec_held(argv: list[str]) -> None:
    """os.execv `argv` with the stop signals held (blocked, kept pending across exec) until the new program
    handles them (`run_main_ppo`): a preemption in between is not lost, nor does it kill the driver. The
    mask comes back when exec fails (or a test stands in for it)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        os.execv(sys.executable, argv)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def ours_after_ray_init(run_dir: Path) -> None:
    """ray.init installs SIGTERM handlers of its own (Python's `sys.exit`, ray/_private/worker.py, and its core
    worker's C++ failure handler, which logs "*** SIGTERM received" and ends the process): verl's driver calls it
    inside main_ppo, so rpg's handlers go back in place each time it returns."""
    import ray

    init = ray.init

    def init_then_ours(*args, **kwargs):
        try:
            return init(*args, **kwargs)
        finally:
            stop_on_signals(run_dir)

    ray.init = init_then_ours


def run_main_ppo(run_dir: Path | None, overrides: list[str]) -> None:
    """verl's `python -m verl.trainer.main_ppo OVERRIDES`, in this process, with the stop handlers in place
    (module doc; none without a run directory); the signals held across exec are let through once they are."""
    import runpy

    if run_dir is not None:
        stop_on_signals(run_dir)
        ours_after_ray_init(run_dir)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    sys.argv = [sys.argv[0], *overrides]  # Hydra reads them there; runpy puts main_ppo's file in argv[0]
    runpy.run_module(MAIN_PPO[1], run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rpg_cli.backends.verl.start", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, required=True, help="the run's GPUs: nodes x gpus_per_node")
    parser.add_argument("--run", required=True, help="the run's lease name: its Ray namespace")
    parser.add_argument(
        "--started", action="store_true", help="(rpg's own) waited and checked: run main_ppo with the stop handlers"
    )
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="-- then main_ppo's Hydra overrides")
    args = parser.parse_args(argv)
    overrides = args.overrides[1:] if args.overrides[:1] == ["--"] else args.overrides
    run_dir = job_run_dir()
    if args.started:
        run_main_ppo(run_dir, overrides)
        return
    if run_dir is not None:
        rundir.clear_stop_request(run_dir)  # a new attempt: no request left over from the one before
        rundir.clear_held(run_dir)  # nor a mark of when the one before began holding its GPUs
        stop_on_signals(run_dir)
    if os.environ.get("RAY_ADDRESS"):
        try:
            wait_for_gpus(args.gpus, args.run)
        except StopRequested as stop:
            assert run_dir is not None, "only a run directory holds a request"
            end_unstarted(run_dir, stop.why)
            sys.exit(0)
        mark_held(run_dir)  # the wait is over: the GPUs are the run's (leased) from here
        if refused := check_nodes(overrides, args.run):
            from rpg_cli.backends.verl.diagnose import NODE_CHECK

            print(NODE_CHECK + refused, flush=True)  # the run's reason in `rpg runs` (diagnose.failure_reason)
            sys.exit(1)
    else:
        mark_held(run_dir)  # nothing to wait for
    if run_dir is None:  # outside rpg's launch: verl as it is
        os.execv(sys.executable, [sys.executable, *MAIN_PPO, *overrides])
    else:
        exec_held([sys.executable, *THIS, "--gpus", str(args.gpus), "--run", args.run, "--started", "--", *overrides])


if __name__ == "__main__":
    main()
