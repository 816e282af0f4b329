"""A sweep as one Slurm job: the allocation a grid needs, the sbatch script (slurm.sbatch, its one home),
submission, and the job's record (runs/<sweep>/slurm/) that `rpg cancel SWEEP` reads.

The job brings up a Ray cluster of its own on the nodes it is given and runs `rpg sweep --address`
there; the helpers it calls on each node are slurm_nodes.py's. Pure Python at import: no ray, no torch (the dry
run is instant).

What a run needs of a node is its backend's to say (rpg_cli.backends.registry: `node_cpus`, `run_mem_mb`; the
figures and their reasons are in each backend's launch module).
"""

from __future__ import annotations

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
from rpg_cli.backends import registry
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.spec.verl_block import credential_in, credential_name

TEMPLATE = Path(__file__).with_name("slurm.sbatch")
SCRIPT_FILE = "sweep.sbatch"
JOB_ID_FILE = "job_id"
TOKEN_DIR = "ray"  # per job: ray/<job id>/auth_token, removed when the job's Ray stops
# USR1 this long before the time limit (Slurm may send it up to 60 s earlier still, sbatch(1) --signal): the
# runs finish the step they are in and save it; a step of the paper's grids and its checkpoint take minutes
SIGNAL_GRACE_S = 600
STOP_RESERVE_S = 30  # of the time a signal leaves: stopping the sweep's watcher and Ray once the runs stopped
NODE_WAIT_S = 300  # how long the head waits for every node to join before giving up
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
    return registry.node_cpus(plan.backend, plan.spec["resources"]["gpus_per_node"], plan.num_cpus)


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

    neediest = max(plans, key=run_cpus)
    need_cpus = run_cpus(neediest)
    default_cpus = max(at_once(p) * run_cpus(p) for p in plans)
    cpus = default_cpus if cpus_per_node is None else cpus_per_node
    if cpus < need_cpus:
        rule = registry.node_cpus_rule(neediest.backend)
        why = f"{neediest.backend}: {rule[0]} per GPU + {rule[1]}; " if rule else ""
        raise SlurmError(
            f"a run of the grid needs {need_cpus} CPUs per node ({why}fewer and Ray waits forever); "
            f"ask for --cpus-per-node {need_cpus} or more"
        )
    per_node = max(1, min(max(at_once(p) for p in plans), cpus // need_cpus))
    runs_at_once = nodes // need_nodes if need_nodes > 1 else per_node * nodes
    if mem is None:
        per_run = [registry.run_mem_mb(backend) for backend in dict.fromkeys(p.backend for p in plans)]
        whole = None in per_run  # a backend that takes the whole node's memory
        mem = "0" if whole else f"{per_node * max(per_run) + HEAD_MEM_MB}M"
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
    preempt = [python, "-m", "rpg_cli.orchestration.slurm_nodes", "preempt", sweep, "--runs-dir", str(runs_dir), *db]
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
