"""What a sweep's Slurm job runs on its nodes (`python -m rpg_cli.orchestration.slurm_nodes ports|wait-nodes|
stop-node|preempt`, called by slurm.sbatch): free ports for Ray, the wait for every node to join, this job's Ray
ended on a node, and the trap that lets the runs save the step they are in before the job's time ends. Pure Python
at import: psutil and Ray are imported by the helper that needs them.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

from rpg_cli import rundir
from rpg_cli.orchestration.slurm import SIGNAL_GRACE_S, STOP_RESERVE_S, time_seconds
from rpg_cli.store.url import DB_ENVVAR, DEFAULT_DB_URL

_HEAD_PORTS = ("GCS", "DASHBOARD", "CLIENT")
_NODE_PORTS = ("NODE_MANAGER", "OBJECT_MANAGER", "AGENT_HTTP", "AGENT_GRPC", "METRICS", "RUNTIME_ENV")


def port_assignments(head: bool) -> str:
    """RPG_PORT_<NAME>=<port> lines for the shell: ports free on this node now, all distinct."""
    from rpg_cli.orchestration.head import _free_ports

    names = (*(_HEAD_PORTS if head else ()), *_NODE_PORTS)
    return "".join(f"RPG_PORT_{n}={p}\n" for n, p in zip(names, _free_ports(len(names))))


def wait_nodes(dashboard: str, count: int, timeout_s: float, workers_pid: int | None = None) -> str | None:
    """Wait until the cluster behind `dashboard` lists `count` live nodes; None then, else why not. Stops
    at once when `workers_pid` (the srun that starts the workers) has ended: no worker is coming. Live
    nodes are counted here, not by a state filter: Ray 2.60's list_nodes(filters=[("state", "=", "ALIVE")])
    raises "data truncation" while a dead node is on record."""
    import time

    from ray.util.state import list_nodes

    deadline = time.monotonic() + timeout_s
    alive, why = 0, "the head's dashboard did not answer"
    while time.monotonic() < deadline:
        try:
            alive = sum(n.state == "ALIVE" for n in list_nodes(address=dashboard, timeout=10))
            why = f"{alive} of {count} nodes joined"
            if alive >= count:
                return None
        except Exception as exc:  # not up yet: connection refused, 5xx
            why = f"the head's dashboard did not answer ({type(exc).__name__})"
        if workers_pid is not None and not _running(workers_pid):
            return f"the workers' srun ended before they joined ({why}); its error is above"
        time.sleep(1)
    return f"Ray did not come up within {timeout_s:.0f} s: {why}"


def _running(pid: int) -> bool:
    """Whether process `pid` runs (a child that ended and is not yet reaped is a zombie: ended)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_node(job_id: str, grace_s: float = 2.0) -> int:
    """End this job's Ray processes on this node: those of the user whose environment carries
    RPG_SLURM_RAY=<job id> (`ray stop` would end every Ray of the user, another job's too); returns how many.
    SIGKILL follows SIGTERM after `grace_s`: a Ray node drains for up to 30 s on SIGTERM, and the job's own
    cleanup after it (its Ray temp dir) must fit in Slurm's KillWait (the state of every run is in the store)."""
    import contextlib

    import psutil

    marker = f"RPG_SLURM_RAY={job_id}".encode()
    me = os.getpid()
    ours = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if p.uids().effective != os.geteuid():
                continue
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    ours.append(p)
    for p in ours:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(ours, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return len(ours)


def stop_budget(signal_name: str, grace_s: float, job_id: str) -> float:
    """The seconds the runs get to finish their step and save it after `signal_name` reached the batch script,
    with STOP_RESERVE_S kept to stop the watcher and Ray. USR1: the job's time left (its end time: the time
    limit, or at a preemption now + the partition's GraceTime, slurm.conf(5)), at most `grace_s`. TERM: Slurm
    sends SIGKILL KillWait seconds later (slurm.conf(5): 30 by default)."""
    if signal_name == "USR1":
        left = _slurm_answer(["squeue", "-h", "-j", job_id, "-o", "%L"])  # UNLIMITED without a time limit
        seconds = time_seconds(left) if left else None
        total = grace_s if seconds is None else min(seconds, grace_s)
    else:
        found = re.search(r"^KillWait\s*=\s*(\d+)", _slurm_answer(["scontrol", "show", "config"]) or "", re.M)
        total = int(found.group(1)) if found else 30
    return max(0.0, total - STOP_RESERVE_S)


def _slurm_answer(argv: list[str]) -> str | None:
    """A Slurm command's output, None when it fails or does not answer within 10 s."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        if done.returncode == 0:
            return done.stdout.strip()
    return None


def preempt(sweep: str, signal_name: str, grace_s: float, db_url: str, address: str, runs_dir: Path) -> int:
    """The batch script's trap: ask the sweep's training runs to stop after their step (`rundir.PREEMPTED`:
    the next `rpg sweep` resumes them from that step) and wait, within what the signal leaves, for their
    checkpoints; the runs that do not make it end with Ray and resume from their last checkpoint. Lines on
    stderr; never raises: the trap stops Ray whatever happens here."""
    import signal

    def say(line: str) -> None:
        print(f"rpg slurm: {line}", file=sys.stderr, flush=True)

    budget = stop_budget(signal_name, grace_s, os.environ.get("SLURM_JOB_ID", ""))
    if budget <= 0:
        say(f"no time after SIG{signal_name} for the runs to save their step: they resume from their last checkpoint")
        return 0

    def out_of_time(*_) -> None:
        raise TimeoutError(f"the runs had {budget:.0f} s")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(int(budget) + STOP_RESERVE_S // 2)  # the store or Ray hanging must not eat the time to stop Ray
    try:
        from rpg_cli.orchestration.cancel import ask_to_stop, wait_for_stops

        asked = ask_to_stop(sweep, rundir.PREEMPTED, db_url, address, runs_dir, lost=True, others=False)
        for run, last in asked.asked:
            say(f"asked {run.name} to stop after the step it is in, with a checkpoint (last logged: step {last})")
        if not asked.asked:
            say("no run was training: nothing to save")
            return 0
        say(f"waiting up to {budget:.0f} s for {len(asked.asked)} run(s) to save a checkpoint")
        ended, left = wait_for_stops([r for r, _ in asked.asked], budget, db_url, address, runs_dir)
        for end in ended:
            at = f"at step {end.step}, its checkpoint saved " if end.step is not None else ""
            say(f"{end.run.name} stopped {at}({end.run.status})")
        for run in left:  # its request goes with it: the next attempt starts by clearing it
            say(f"{run.name} did not stop within {budget:.0f} s: it resumes from its last checkpoint")
        return 0
    except Exception as exc:  # whatever it is, Ray is stopped next: say it in one line
        say(f"could not let the runs save their step ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})")
        return 1
    finally:
        signal.alarm(0)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m rpg_cli.orchestration.slurm_nodes", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    ports = commands.add_parser("ports", help="RPG_PORT_* assignments: free ports on this node")
    ports.add_argument("--head", action="store_true")
    wait = commands.add_parser("wait-nodes", help="wait until the cluster lists COUNT live nodes")
    wait.add_argument("dashboard")
    wait.add_argument("count", type=int)
    wait.add_argument("timeout_s", type=float)
    wait.add_argument("workers_pid", type=int, nargs="?", help="the srun starting the workers: stop if it ends")
    commands.add_parser("stop-node", help="end this job's Ray processes on this node")
    stop = commands.add_parser("preempt", help="the trap: the sweep's runs save the step they are in, then end")
    stop.add_argument("sweep")
    stop.add_argument("signal", choices=("USR1", "TERM"))
    stop.add_argument("--address", required=True, help="the job's Ray dashboard")
    stop.add_argument("--runs-dir", required=True)
    stop.add_argument("--db", default=os.environ.get(DB_ENVVAR) or DEFAULT_DB_URL)
    stop.add_argument("--grace", type=float, default=SIGNAL_GRACE_S)
    args = parser.parse_args(argv)
    if args.command == "preempt":
        return preempt(args.sweep, args.signal, args.grace, args.db, args.address, Path(args.runs_dir))
    if args.command == "ports":
        sys.stdout.write(port_assignments(args.head))
    elif args.command == "wait-nodes":
        why = wait_nodes(args.dashboard, args.count, args.timeout_s, args.workers_pid)
        if why:
            print(f"rpg slurm: {why}", file=sys.stderr)
            return 1
        print(f"rpg slurm: Ray is up on {args.count} node(s)", file=sys.stderr)
    else:
        job_id = os.environ.get("SLURM_JOB_ID")
        if not job_id:
            print("rpg slurm: stop-node runs inside a Slurm job (SLURM_JOB_ID is not set)", file=sys.stderr)
            return 2
        stop_node(job_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
