"""A sweep as one Slurm job: the allocation a grid needs, the sbatch script (slurm.sbatch, its one home),
submission, and the job's record (runs/<sweep>/slurm/) that `rpg cancel SWEEP` reads.

The job brings up a Ray cluster of its own on the nodes it is given and runs `rpg sweep --address`
there; the helpers it calls on each node (`python -m rpg_cli.orchestration.slurm ports|wait-nodes|
stop-node`) live here too. Pure Python at import: no ray, no torch (the dry run is instant).

What a run needs of a node, per the README's "What the paper grids need": a verl run 3 CPUs per GPU
plus 11 (its placement group's {CPU: 3, GPU: 1} bundles, the transfer queue's 9 actors, the job's
entrypoint and verl's task runner), and the whole node's memory; a local-backend run its spec's CPUs
and about LOCAL_RUN_MEM_MB.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rpg_cli import rundir
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.spec.verl_block import credential_in, credential_name
from rpg_cli.store.url import DB_ENVVAR, DEFAULT_DB_URL

TEMPLATE = Path(__file__).with_name("slurm.sbatch")
SCRIPT_FILE = "sweep.sbatch"
JOB_ID_FILE = "job_id"
TOKEN_DIR = "ray"  # per job: ray/<job id>/auth_token, removed when the job's Ray stops
# USR1 this long before the time limit (Slurm may send it up to 60 s earlier still, sbatch(1) --signal): the
# runs finish the step they are in and save it; a step of the paper's grids and its checkpoint take minutes
SIGNAL_GRACE_S = 600
STOP_RESERVE_S = 30  # of the time a signal leaves: stopping the sweep's watcher and Ray once the runs stopped
NODE_WAIT_S = 300  # how long the head waits for every node to join before giving up
VERL_CPUS_PER_GPU, VERL_CPUS_EXTRA = 3, 11
LOCAL_RUN_MEM_MB = 4096  # a local-backend run on the toy or a small model; --mem for larger ones
HEAD_MEM_MB = 2048  # Ray's head daemons and the `rpg sweep` watcher
# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds
_TIME = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")
_MEM = re.compile(r"^\d+[KMGT]?$")
_REFUSALS = ("allocation failure", "submission failed", "Invalid", "not available", "exceeds")  # sbatch's words
_LIVE_JOB_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")


class SlurmError(RuntimeError):
    """A request Slurm could never satisfy, or Slurm unusable here; one line naming the fix."""


@dataclass(frozen=True)
class Allocation:
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    mem: str  # sbatch --mem: "0" is every node's whole memory
    runs_at_once: int  # in the whole allocation, as far as CPUs and GPUs go (Ray queues the rest)
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    sbatch_args: tuple[str, ...] = ()
    grace_s: int = SIGNAL_GRACE_S  # USR1 this long before the time limit: the runs checkpoint and stop
    requeue: bool = False  # after USR1, the job requeues itself (`rpg slurm --requeue`)


def run_cpus(plan: RunPlan) -> int:
    """The CPUs one run needs on each of its nodes."""
    gpus = plan.spec["resources"]["gpus_per_node"]
    return VERL_CPUS_PER_GPU * gpus + VERL_CPUS_EXTRA if plan.backend == "verl" else math.ceil(plan.num_cpus)


def allocation(
    plans: list[RunPlan],
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    cpus_per_node: int | None = None,
    mem: str | None = None,
    time: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    sbatch_args: tuple[str, ...] = (),
    grace_s: int = SIGNAL_GRACE_S,
    requeue: bool = False,
) -> Allocation:
    """What the grid asks of Slurm: by default the nodes and GPUs of its largest run, the CPUs for as
    many runs at once as the GPUs allow (CPU-only runs: all of them), and the memory to match;
    SlurmError (one line) for a request none of the runs could start in."""
    if not STOP_RESERVE_S < grace_s <= 65535:  # sbatch(1): a sig_time is 0 to 65535
        raise SlurmError(
            f"--grace {grace_s} s: give {STOP_RESERVE_S + 1} to 65535 (Ray takes {STOP_RESERVE_S} s to stop once "
            "the runs have; a step and its checkpoint need the rest)"
        )
    resources = [p.spec["resources"] for p in plans]
    need_nodes = max(r["nodes"] for r in resources)
    need_gpus = max(r["gpus_per_node"] for r in resources)
    nodes = need_nodes if nodes is None else nodes
    gpus = need_gpus if gpus_per_node is None else gpus_per_node
    if nodes < need_nodes:
        raise SlurmError(f"a run of the grid spans {need_nodes} nodes; ask for --nodes {need_nodes} or more")
    if gpus < need_gpus:
        raise SlurmError(f"a run of the grid needs {need_gpus} GPUs per node; ask for --gpus-per-node {need_gpus}")
    cpu_only = [p for p in plans if not p.spec["resources"]["gpus_per_node"]]

    def at_once(plan: RunPlan) -> int:
        r = plan.spec["resources"]
        if r["nodes"] > 1:
            return 1
        return gpus // r["gpus_per_node"] if r["gpus_per_node"] else math.ceil(len(cpu_only) / nodes)

    need_cpus = max(run_cpus(p) for p in plans)
    default_cpus = max(at_once(p) * run_cpus(p) for p in plans)
    cpus = default_cpus if cpus_per_node is None else cpus_per_node
    if cpus < need_cpus:
        raise SlurmError(
            f"a run of the grid needs {need_cpus} CPUs per node (verl: {VERL_CPUS_PER_GPU} per GPU + "
            f"{VERL_CPUS_EXTRA}; fewer and Ray waits forever); ask for --cpus-per-node {need_cpus} or more"
        )
    per_node = max(1, min(max(at_once(p) for p in plans), cpus // need_cpus))
    runs_at_once = nodes // need_nodes if need_nodes > 1 else per_node * nodes
    if mem is None:
        verl = any(p.backend == "verl" for p in plans)
        mem = "0" if verl else f"{per_node * LOCAL_RUN_MEM_MB + HEAD_MEM_MB}M"
    elif not _MEM.match(mem):
        raise SlurmError(f"--mem {mem!r} is not a Slurm size; give e.g. 64G, 512000M, or 0 (each node's whole memory)")
    if time is not None:
        seconds = time_seconds(time)
        if seconds is None:
            raise SlurmError(
                f"--time {time!r} is not a Slurm time; give minutes, H:MM:SS or D-HH:MM:SS (e.g. 2-00:00:00)"
            )
        if 0 < seconds <= grace_s + 60:
            raise SlurmError(
                f"--time {time} leaves no time to run: the runs are stopped {grace_s} s before the limit (--grace); "
                "ask for more"
            )
    for name, value in (
        ("--partition", partition),
        ("--account", account),
        *(("--sbatch-arg", a) for a in sbatch_args),
    ):  # credentials first: the errors after this one print the value
        if value is not None and (why := credential_in_option(value)):
            option = value.split("=", 1)[0][:40] if name == "--sbatch-arg" else ""
            shown = f"{name} {option}=..." if re.fullmatch(r"--?[\w-]+", option) else name  # never the value
            raise SlurmError(
                f"{shown} holds {why}: the script is a file under runs/ that "
                "Slurm keeps and others may read; give credentials to the nodes' environment (the store's URL: "
                "--db or $RPG_DB, which rpg hands the job outside the script)"
            )
    for name, value in (
        ("--partition", partition),
        ("--account", account),
        *(("--sbatch-arg", a) for a in sbatch_args),
    ):
        if value is not None and (not value.strip() or any(c.isspace() and c != " " for c in value)):
            raise SlurmError(f"{name} {value!r}: a blank value or a line break cannot go into an #SBATCH line")
    for arg in sbatch_args:
        if not arg.startswith("-"):
            raise SlurmError(
                f"--sbatch-arg {arg!r} is not an sbatch option; give it whole, e.g. --sbatch-arg=--qos=high"
            )
    return Allocation(
        nodes, gpus, cpus, mem, runs_at_once, time, partition, account, tuple(sbatch_args), grace_s, requeue
    )


def credential_in_option(value: str) -> str | None:
    """What credential an sbatch option's value holds, in words that do not repeat it (None: none): one in its
    text (a URL's password, a password= parameter, a token; spec.verl_block.credential_in), or a variable named as
    one given a value in --export (DB_PASS=..., GITHUB_PAT=...; --export=DB_PASS alone passes the submitting
    shell's value and writes none)."""
    if why := credential_in(value):
        return why
    option, _, listed = value.partition("=")
    if option == "--export":
        for item in listed.split(","):
            name, given, _ = item.partition("=")
            if given and credential_name(name):
                return f"{name}'s value (a credential by its name)"
    return None


def time_seconds(time: str) -> int | None:
    """A Slurm time limit in seconds (0: no limit); None when it is not one."""
    found = _TIME.match(time.strip())
    if found is None:
        return None
    d, dh, dm, ds, m, ms, hs = (int(g) if g else None for g in found.groups())
    if d is not None:
        return d * 86400 + (dh or 0) * 3600 + (dm or 0) * 60 + (ds or 0)
    if hs is not None:  # hours:minutes:seconds
        return m * 3600 + (ms or 0) * 60 + hs
    return m * 60 + (ms or 0)


# ------------------------------------------------------------------------------------------ script


def sweep_dir(runs_dir: Path, sweep: str) -> Path:
    return Path(runs_dir).absolute() / sweep


def render(
    plans: list[RunPlan],
    alloc: Allocation,
    spec_file: str,
    runs_dir: Path,
    sweep_args: tuple[str, ...] = (),
) -> str:
    """The sbatch script of the sweep: slurm.sbatch with this grid's allocation and paths filled in.
    `sweep_args`: what the job's `rpg sweep` gets besides SPEC and --runs-dir (--db, --backend, ...)."""
    sweep = plans[0].sweep
    runs_dir = Path(runs_dir).absolute()
    slurm = rundir.slurm_dir(sweep_dir(runs_dir, sweep))
    for path in (slurm, Path.cwd()):
        if bad := _unsafe_chars(str(path)):
            raise SlurmError(
                f"{path} holds {_listed(bad)}, which an #SBATCH line cannot carry as written; run from, and "
                "write to, paths without them"
            )
    for option, value in (
        ("--partition", alloc.partition),
        ("--account", alloc.account),
        *(("--sbatch-arg", a) for a in alloc.sbatch_args),
    ):
        if value is not None and (bad := _unsafe_chars(value)):
            raise SlurmError(
                f"{option} {value!r} holds {_listed(bad)}: sbatch would read it as more than one #SBATCH value "
                "(a blank or line break starts another option, a quote or backslash is taken away, # starts a "
                "comment); give the value without"
            )
    directives = [
        f"--job-name=rpg-{sweep}",
        f"--nodes={alloc.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={alloc.cpus_per_node}",
        *([f"--gpus-per-node={alloc.gpus_per_node}"] if alloc.gpus_per_node else []),
        f"--mem={alloc.mem}",
        *([f"--time={alloc.time}"] if alloc.time else []),
        *([f"--partition={alloc.partition}"] if alloc.partition else []),
        *([f"--account={alloc.account}"] if alloc.account else []),
        f"--output={filename_pattern(slurm)}/slurm-%j.out",
        f"--signal=B:USR1@{alloc.grace_s}",
        # a requeued job starts the script again under the same id: its output goes on in the same file
        *(["--requeue", "--open-mode=append"] if alloc.requeue else []),
        *alloc.sbatch_args,
    ]
    python = sys.executable
    command = [python, "-m", "rpg_cli", "sweep", str(Path(spec_file).absolute()), "--runs-dir", str(runs_dir)]
    db = list(sweep_args[sweep_args.index("--db") : sweep_args.index("--db") + 2]) if "--db" in sweep_args else []
    preempt = [python, "-m", "rpg_cli.orchestration.slurm", "preempt", sweep, "--runs-dir", str(runs_dir), *db]
    values = {
        "directives": "\n".join(f"#SBATCH {d}" for d in directives),
        "sweep": sweep,
        "grace_s": str(alloc.grace_s),
        "requeue": "1" if alloc.requeue else "0",
        "preempt_command": shlex.join([*preempt, "--grace", str(alloc.grace_s)]),
        "python": shlex.quote(python),
        "python_bin": shlex.quote(str(Path(python).parent)),
        "script": shlex.quote(str(slurm / SCRIPT_FILE)),
        "workdir": shlex.quote(str(Path.cwd())),
        "token_dir": shlex.quote(str(slurm / TOKEN_DIR)),
        "cpus_per_node": str(alloc.cpus_per_node),
        "gpus_per_node": str(alloc.gpus_per_node),
        "srun_gpus": f" --gpus-per-node={alloc.gpus_per_node}" if alloc.gpus_per_node else "",
        "wait_s": str(NODE_WAIT_S),
        "sweep_command": shlex.join([*command, *sweep_args]),
    }
    text = TEMPLATE.read_text(encoding="utf-8")
    missing = set(re.findall(r"{{(\w+)}}", text)) - set(values)
    assert not missing, f"slurm.sbatch names {missing}, which render() does not fill"
    return re.sub(r"{{(\w+)}}", lambda m: values[m.group(1)], text)


# What sbatch's parser of #SBATCH lines reads as more than a character of the value: whitespace ends it,
# quotes group and are removed, a backslash escapes and is removed, an unescaped # starts a comment.
_SBATCH_SYNTAX = frozenset("'\"\\#")


def _unsafe_chars(value: str) -> set[str]:
    """The characters of `value` that would not reach sbatch as written in an #SBATCH line."""
    return {c for c in value if c.isspace() or c in _SBATCH_SYNTAX}


def _listed(chars: set[str]) -> str:
    return ", ".join(sorted(repr(c) for c in chars))


def filename_pattern(path: Path) -> str:
    """`path` as a Slurm filename pattern (--output, --error) that names exactly that path: Slurm
    replaces %j, %u, %x, ... (and %% by %), so every % is doubled; a directory named like `run%j`
    would otherwise send the job's output to a directory that does not exist. A backslash (it turns
    the patterns off and is dropped) is refused by `render` before this, with what sbatch's parser of
    #SBATCH lines would change."""
    return str(path).replace("%", "%%")


def describe(plans: list[RunPlan], alloc: Allocation) -> list[str]:
    """What the allocation asks for and why, in a few lines (the dry run prints them)."""
    shapes = sorted(
        {(p.backend, p.spec["resources"]["nodes"], p.spec["resources"]["gpus_per_node"], run_cpus(p)) for p in plans}
    )
    per_run = "; ".join(f"{backend} {n} node(s) x {g} GPU(s), {c} CPUs per node" for backend, n, g, c in shapes)
    mem = "each node's whole memory" if alloc.mem == "0" else f"{alloc.mem} per node"
    return [
        f"{len(plans)} runs; a run needs: {per_run}",
        f"allocation: {alloc.nodes} node(s) x {alloc.gpus_per_node} GPU(s), {alloc.cpus_per_node} CPUs and "
        f"{mem}, time {alloc.time or 'the partition default'}; {alloc.runs_at_once} run(s) at once (Ray queues "
        "the rest)",
    ]


def _slurm_command(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise SlurmError(f"{name} is not on PATH: run `rpg slurm` on a Slurm login node (or add Slurm's bin to PATH)")
    return found


def slurm_verdict(script: str) -> str | None:
    """Slurm's own verdict on the request (`sbatch --test-only`, nothing submitted): None when it could
    run, else Slurm's reason in one line; SlurmError when sbatch is missing or does not answer."""
    try:
        done = subprocess.run(
            [_slurm_command("sbatch"), "--test-only"], input=script, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        raise SlurmError("sbatch --test-only did not answer within 60 s; is slurmctld reachable (sinfo)?") from None
    if done.returncode == 0:
        return None
    why = rundir.last_lines(done.stderr or done.stdout) or f"exit {done.returncode}"
    if not any(refusal in why for refusal in _REFUSALS):  # no controller, no configuration: no verdict
        raise SlurmError(f"Slurm did not check the request: {why}")
    return why


# ------------------------------------------------------------------------------------- the job record


def recorded_job(runs_dir: Path, sweep: str) -> str | None:
    """The id of the sweep's last Slurm job, None when it has none."""
    from rpg_cli.orchestration.head import ClusterError, read_private

    try:
        text = read_private(rundir.slurm_dir(sweep_dir(runs_dir, sweep)) / JOB_ID_FILE)
    except ClusterError as exc:
        raise SlurmError(str(exc)) from None
    return text.strip() if text and text.strip().isdigit() else None


def job_state(job_id: str) -> str | None:
    """The Slurm state of a job (PENDING, RUNNING, ...); None when Slurm no longer lists it."""
    done = subprocess.run(
        [_slurm_command("squeue"), "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60
    )
    state = done.stdout.strip().splitlines()
    return state[0].strip() if done.returncode == 0 and state else None


def live_job(runs_dir: Path, sweep: str) -> tuple[str, str] | None:
    """(job id, state) when the sweep's last Slurm job is still queued or running."""
    job_id = recorded_job(runs_dir, sweep)
    if job_id is None or shutil.which("squeue") is None:
        return None
    state = job_state(job_id)
    return (job_id, state) if state in _LIVE_JOB_STATES else None


def submit(
    script: str, runs_dir: Path, sweep: str, env: dict[str, str] | None = None, wait: bool = False
) -> tuple[str, int]:
    """Write the script to runs/<sweep>/slurm/, submit it and record the job id; returns (job id, exit
    code: 0, or with `wait` the job's own, as `sbatch --wait` reports it)."""
    from rpg_cli.orchestration.head import private_dir

    sbatch = _slurm_command("sbatch")
    slurm = private_dir(rundir.slurm_dir(sweep_dir(runs_dir, sweep)))  # it holds the job's Ray token
    path = rundir.write_atomic(slurm / SCRIPT_FILE, script, mode=0o700)
    proc = subprocess.Popen(
        [sbatch, "--parsable", *(["--wait"] if wait else []), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline().strip()  # "<id>" or "<id>;<cluster>", printed on submission
    job_id = first.split(";")[0]
    if not job_id.isdigit():
        proc.wait()
        why = rundir.last_lines(proc.stderr.read()) or f"exit {proc.returncode}"
        raise SlurmError(f"sbatch refused the job: {why}")
    rundir.write_atomic(slurm / JOB_ID_FILE, job_id + "\n", mode=0o600)
    code = proc.wait()
    return job_id, code


def ended_job(runs_dir: Path, sweep: str) -> str | None:
    """The id of the sweep's last Slurm job when Slurm says it has ended (and its Ray with it: no job of
    that Ray runs any more); None when it has none, is still live, or Slurm cannot say (no squeue, no
    controller). `rpg cancel SWEEP` names it as a hint; it records nothing on its strength (a live run of
    the sweep may have been submitted elsewhere since)."""
    if Path(sweep).name != sweep or sweep in (".", "..") or shutil.which("squeue") is None:
        return None
    job_id = recorded_job(runs_dir, sweep)
    if job_id is None:
        return None
    done = subprocess.run(
        [_slurm_command("squeue"), "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:  # an id Slurm no longer knows, or no answer at all: only the first is an end
        return job_id if "Invalid job id" in done.stderr else None
    state = done.stdout.strip().splitlines()
    return None if state and state[0].strip() in _LIVE_JOB_STATES else job_id


def cancel_job(runs_dir: Path, ref: str) -> str | None:
    """Cancel the Slurm job of the sweep `ref` names (when it has one still queued or running); a line
    saying what was done, None when there was nothing to cancel."""
    if Path(ref).name != ref or ref in (".", ".."):  # not a sweep name: no directory of its own
        return None
    live = live_job(runs_dir, ref)
    if live is None:
        return None
    job_id, state = live
    done = subprocess.run([_slurm_command("scancel"), job_id], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SlurmError(f"scancel {job_id} failed: {rundir.last_lines(done.stderr) or done.returncode}")
    return f"cancelled Slurm job {job_id} ({state.lower()}); its Ray stops with it"


# ------------------------------------------------------------------------ helpers run on the nodes

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

    parser = argparse.ArgumentParser(prog="python -m rpg_cli.orchestration.slurm", description=__doc__.splitlines()[0])
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
