"""`rpg slurm`: a sweep as one Slurm job that brings up Ray on the nodes it is given (or --dry-run: the
script and what it asks for)."""

from __future__ import annotations

import typer

from rpg_cli.backends.registry import allowed, backend_names
from rpg_cli.cli.common import db_option, fail, rpg_command, runs_dir_option, warn


@rpg_command("slurm")
def slurm_command(
    spec: str = typer.Argument(..., metavar="SPEC", help="Sweep YAML, as for `rpg sweep`."),
    nodes: int = typer.Option(None, "--nodes", metavar="N", min=1, help="Nodes (default: a run's)."),
    gpus_per_node: int = typer.Option(
        None, "--gpus-per-node", metavar="G", min=0, help="GPUs per node (default: a run's)."
    ),
    cpus_per_node: int = typer.Option(
        None,
        "--cpus-per-node",
        metavar="C",
        min=1,
        help="CPUs per node (default: what the runs that fit on a node at once need; verl: 3 per GPU + 11).",
    ),
    mem: str = typer.Option(
        None,
        "--mem",
        metavar="SIZE",
        help="Memory per node, as sbatch --mem takes it (default: verl, the whole node (0); local, 4G a run + 2G).",
    ),
    partition: str = typer.Option(None, "--partition", "-p", metavar="P", help="Slurm partition."),
    time: str = typer.Option(
        None, "--time", "-t", metavar="T", help="Time limit (D-HH:MM:SS, H:MM:SS or minutes; default: the partition's)."
    ),
    account: str = typer.Option(None, "--account", "-A", metavar="A", help="Slurm account to charge."),
    sbatch_args: list[str] = typer.Option(
        None, "--sbatch-arg", metavar="OPT", help="Another sbatch option, whole (--sbatch-arg=--qos=high); repeatable."
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        metavar="",
        help="Print the script and what it asks for (Slurm checks it where it can); submit nothing.",
    ),
    wait: bool = typer.Option(False, "--wait", metavar="", help="Return when the job has ended, with its exit code."),
    grace: int = typer.Option(
        600,
        "--grace",
        metavar="SECONDS",
        help="How long before the time limit the training runs are asked to finish their step and save it "
        "(Slurm's USR1; 30 s of it stop Ray): a step and its checkpoint must fit.",
    ),
    requeue: bool = typer.Option(
        False,
        "--requeue",
        metavar="",
        help="At the time limit (or a preemption that sends USR1), once the runs have saved their step, the job "
        "requeues itself and its next allocation continues the sweep.",
    ),
    backend: str = typer.Option(
        None,
        "--backend",
        metavar="|".join(backend_names()),
        help="Run every cell on this backend instead of the spec's.",
    ),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", metavar="", help="Rerun runs that failed or were stopped."
    ),
    db: str = db_option(),
    runs_dir: str = runs_dir_option(),
) -> None:
    """Run a sweep on a Slurm cluster: one job that starts Ray on the nodes it is given and runs the sweep there.

    The sbatch script (written to runs/<sweep>/slurm/) starts a Ray head on the first node and a worker on
    each other one, waits for them, runs `rpg sweep SPEC --address ...` on the head and stops Ray on every
    node when the sweep ends, when the job is cancelled, and --grace seconds before the time limit, once
    the training runs have finished the step they are in and saved it (they are `preempted`; --requeue
    puts the job back in the queue then). The same command continues an interrupted sweep (succeeded runs
    are skipped, preempted ones resume from the step they saved, interrupted ones from their last
    checkpoint). Run it from the shared directory that holds data/ and runs/: `rpg runs`, `rpg report` read
    the store from the login node meanwhile, and `rpg cancel SWEEP` cancels the job.

    Examples:

      # the Qwen3-4B grid on 2 nodes x 8 GPUs: the script, what it asks for
      rpg slurm experiments/paper-qwen3-4b.yaml --nodes 2 --dry-run

      # submit it, for two days on the gpu partition
      rpg slurm experiments/paper-qwen3-4b.yaml --nodes 2 \\
          --time 2-00:00:00 -p gpu

      # 4-hour allocations, each going on where the last one stopped
      rpg slurm experiments/paper-qwen3-4b.yaml --time 4:00:00 --requeue
    """
    if backend is not None and backend not in backend_names():
        raise typer.BadParameter(f"{backend!r}; allowed: {allowed()}", param_hint="--backend")
    import shutil
    from pathlib import Path

    from rpg_cli.orchestration.plan import (
        PreflightError,
        check_plans,
        known_states,
        plan_sweep,
        refuse_bad_inputs,
        summarize,
    )
    from rpg_cli.orchestration.slurm import SlurmError, allocation, describe, live_job, render, slurm_verdict, submit
    from rpg_cli.spec import SpecError, load_sweep
    from rpg_cli.store import StoreError
    from rpg_cli.store.url import redact

    try:
        plans = plan_sweep(load_sweep(spec), Path(runs_dir), backend=backend)
    except SpecError as e:
        fail("slurm", e)
    sweep = plans[0].sweep
    secret_db = redact(db) != db  # a password never goes into the script: the job gets it as $RPG_DB
    sweep_args = (
        *(() if secret_db else ("--db", db)),
        *(("--backend", backend) if backend else ()),
        *(("--retry-failed",) if retry_failed else ()),
    )
    try:
        alloc = allocation(
            plans,
            nodes,
            gpus_per_node,
            cpus_per_node,
            mem,
            time,
            partition,
            account,
            tuple(sbatch_args or ()),
            grace_s=grace,
            requeue=requeue,
        )
        script = render(plans, alloc, spec, Path(runs_dir), sweep_args)
        if dry_run:
            typer.echo(script, nl=False)
            for line in describe(plans, alloc):
                warn("slurm", line)
            try:
                why = slurm_verdict(script) if shutil.which("sbatch") else "sbatch is not on PATH here"
            except SlurmError as e:
                why = str(e).removeprefix("Slurm did not check the request: ")
            else:
                if why and shutil.which("sbatch"):
                    fail("slurm", SlurmError(f"Slurm cannot run this request: {why}"))
            checked = f"Slurm did not check it ({why})" if why else "Slurm accepts it (sbatch --test-only)"
            warn("slurm", f"{checked}. Dry run: nothing was submitted.")
            return
        states = known_states(db, plans)
        counts = summarize(plans, states, retry_failed)
        if not counts.submit and not counts.attach:
            skipped = f", {counts.skip} failed or stopped (--retry-failed reruns them)" if counts.skip else ""
            typer.echo(f"rpg slurm: nothing to run: {counts.done} of {counts.runs} runs of {sweep} succeeded{skipped}")
            return
        if live := live_job(Path(runs_dir), sweep):
            raise SlurmError(
                f"{sweep} already has Slurm job {live[0]} ({live[1].lower()}); wait for it, or `rpg cancel {sweep}`"
            )
        refuse_bad_inputs(check_plans(plans, states, retry_failed), len(plans))
        if why := slurm_verdict(script):
            raise SlurmError(f"Slurm cannot run this request: {why}")
        job_id, code = submit(script, Path(runs_dir), sweep, env={"RPG_DB": db} if secret_db else None, wait=wait)
    except (SlurmError, PreflightError, StoreError) as e:
        fail("slurm", e)
    slurm = f"{runs_dir}/{sweep}/slurm"
    typer.echo(
        f"submitted Slurm job {job_id} for {sweep} ({counts.submit + counts.attach} of {counts.runs} runs to run); "
        f"its output: {slurm}/slurm-{job_id}.out; follow with `rpg runs --sweep {sweep}`"
    )
    if wait:
        typer.echo(f"Slurm job {job_id} ended (exit {code})")
        if code:
            raise typer.Exit(1)
