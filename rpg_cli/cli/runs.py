"""`rpg runs`, `logs`, `cancel`, `stop`: the runs in the store, reconciled with Ray first."""

from __future__ import annotations

import typer

from rpg_cli.cli.common import (
    address_option,
    check_format,
    comma_list,
    db_option,
    error_line,
    existing_store,
    fail,
    format_option,
    make_console,
    one_blas_thread,
    reconcile_shown,
    rpg_command,
    runs_dir_option,
    status_text,
    sweep_option,
    warn,
    where_option,
)

RUNS_FORMATS = ("table", "csv", "json")


@rpg_command("runs")
def runs_command(
    sweep_name: str = sweep_option(),
    status: str = typer.Option(
        None,
        "--status",
        metavar="STATE[,STATE]",
        help="Only runs in these states: pending, submitted, running, succeeded, failed, stopped.",
    ),
    where: list[str] = where_option(),
    output_format: str = format_option("table", "A terminal table, or every column as CSV or JSON.", RUNS_FORMATS),
    wide: bool = typer.Option(
        False, "--wide", metavar="", help="Show each failure reason whole instead of its first 60 characters."
    ),
    show_all: bool = typer.Option(
        False,
        "--all",
        metavar="",
        help="A row per run however many match (above 200, the table has a row per sweep: its runs by state).",
    ),
    db: str = db_option(),
    address: str = address_option(),
    runs_dir: str = runs_dir_option(),
) -> None:
    """List runs: seed, state, attempts, last step, reward and validation accuracy, time queued and run, cost.

    The reward is the last critic/score/mean logged; the validation accuracy the mean over benchmarks
    of each one's last val-core mean@k. s/step is the median step time of its last 100 steps, tok/s/dev its
    last tokens per second per device, dev-h its device-hours so far (its GPUs, or 1 for a CPU run, times the
    time its attempts held them: not the time queued or waiting for GPUs), ETA a live run's time to its last
    step at that pace. Runs recorded as live are first checked with the Ray cluster
    (a run that finished unwatched shows as finished); when no cluster answers, they are shown as
    last recorded, marked ?. A run whose metrics.jsonl was truncated or rewritten after the store read
    it is marked ! (the store kept what it had read instead of believing the file). Above 200 runs the
    table has one row per sweep, its runs counted by state (--all: one row per run; CSV and JSON always).

    Examples:

      rpg runs --all
      rpg runs --where algorithm=rpg --where kl=ufkl,urkl
      rpg runs --sweep smoke --format csv
      rpg runs --status failed --wide
    """
    one_blas_thread()
    from rpg_cli.report import ReportError, runs_summary, summary_csv
    from rpg_cli.report.summary import SUMMARIZE_ABOVE
    from rpg_cli.states import STATUSES
    from rpg_cli.store import EmptyStoreError, NoStoreError, StoreError, open_store
    from rpg_cli.watch import STALL_FACTOR, STALL_FLOOR_S

    check_format("runs", output_format, RUNS_FORMATS)
    wanted = comma_list(status)
    if wanted and (bad := [s for s in wanted if s not in STATUSES]):
        fail("runs", ValueError(f"unknown --status {', '.join(bad)}; allowed: {', '.join(STATUSES)}"))
    try:
        store = open_store(db, create=False)
    except NoStoreError as e:
        if isinstance(e, EmptyStoreError):
            fail("runs", e)
        warn("runs", f"no runs recorded yet ({e})")
        return
    except StoreError as e:
        fail("runs", e)
    try:
        stale = reconcile_shown("runs", store, store.runs(sweep=sweep_name), address, runs_dir)
        # a table of sweeps shows no run's reward, accuracy or pace: not read when the table will be one
        detail_limit = SUMMARIZE_ABOVE if output_format == "table" and not show_all else None
        rows = runs_summary(store, sweep_name, wanted, where or [], detail_limit=detail_limit)
        changed = store.changed_files(r["id"] for r in rows)  # the marker !
    except ReportError as e:
        fail("runs", e)
    finally:
        store.close()
    if output_format == "json":
        import json

        typer.echo(json.dumps(rows, indent=2))
        return
    if output_format == "csv":
        typer.echo(summary_csv(rows), nl=False)
        return
    if not rows:
        filters = [name for name, given in (("--sweep", sweep_name), ("--status", status), ("--where", where)) if given]
        typer.echo("0 runs" + (f": none matches {', '.join(filters)}" if filters else ""))
        return

    summarize = len(rows) > SUMMARIZE_ABOVE and not show_all
    table, cut = (
        (_sweeps_table(rows, sweep_name), 0) if summarize else _runs_table(rows, sweep_name, stale, changed, wide)
    )
    console = make_console()
    if not console.is_terminal:  # a pipe or a file: every row whole on one line, however long its names
        unbounded = console.options.update_width(1_000_000)
        console.width = max(console.width, console.measure(table, options=unbounded).maximum)
    console.print(table)
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    stalls = sum(r["stalled_s"] is not None for r in rows)
    console.print(
        f"{len(rows)} run{'' if len(rows) == 1 else 's'}: "
        + ", ".join(
            f"{n} {s}" + (f" ({stalls} stalled)" if s == "running" and stalls else "") for s, n in counts.items() if n
        )
        + (f" ({cut} failure reason(s) cut short: --wide shows them whole)" if cut else ""),
        highlight=False,
    )
    if summarize:
        console.print(
            f"one row per sweep (more than {SUMMARIZE_ABOVE} runs): `rpg runs --sweep NAME --status STATE` lists "
            "some, --all lists every run (--format csv or json: every run, every column)",
            highlight=False,
            markup=False,
        )
        if stale:
            console.print(
                f"? {len(stale)} live run(s) shown as last recorded: no cluster answered", highlight=False, markup=False
            )
    if stalls:
        console.print(
            f"stalled: running, but no new metrics for longer than the spec's watch.stall allows (by default "
            f"{STALL_FACTOR:g} x its median step, at least {STALL_FLOOR_S:g} s); `rpg logs RUN` shows its output, "
            "`rpg sweep SPEC --stall-timeout SECONDS` stops and fails such runs (--retry-failed resumes them)",
            highlight=False,
        )
    if changed:
        console.print(
            f"! {len(changed)} run(s) whose metrics.jsonl no longer matches what the store read (truncated or "
            "rewritten): the store kept its rows and did not believe the file: "
            + "; ".join(f"{r['name']} ({changed[r['id']]})" for r in rows if r["id"] in changed),
            highlight=False,
            markup=False,
        )


_RIGHT = ("seed", "attempts", "step", "reward", "val", "queued_s", "run_s", "s_per_step", "tokens_s_per_device")
_RIGHT += ("device_hours", "eta_s")


def figure(value: float | None) -> str:
    """A positive figure in a few characters, to the precision it is read at: 790, 12.3, 0.52; '-' when unknown."""
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _runs_table(rows: list[dict], sweep_name: str | None, stale, changed: dict, wide: bool):
    """The terminal table of `rpg runs`: one row per run; with how many failure reasons it cut short."""
    from rich.table import Table

    from rpg_cli.report import wall_text
    from rpg_cli.report.summary import TABLE_FIELDS, TABLE_TITLES
    from rpg_cli.watch import duration

    table = Table(title=f"runs of {sweep_name}" if sweep_name else "runs")
    longest_name = max(len(r["name"]) for r in rows)
    for field in TABLE_FIELDS:
        table.add_column(
            TABLE_TITLES.get(field, field),
            justify="right" if field in _RIGHT else "left",
            no_wrap=field not in ("name", "error"),
            # a name is how a run is referred to: folded over lines on a narrow terminal, never cut or squeezed out
            overflow="fold" if field == "name" else "ellipsis",
            min_width=min(longest_name, 24) if field == "name" else None,
        )
    cut = 0
    for r in rows:
        stalled = r["stalled_s"] is not None  # running, its metrics silent past its limit: its last output instead
        reason = f"stalled {duration(r['stalled_s'])}: {r['last_line'] or 'no output'}" if stalled else r["error"]
        error = error_line(reason, width=None if wide else 60)
        cut += error.endswith("…")
        table.add_row(
            r["sweep"],
            r["name"],
            r["id"],
            "-" if r["seed"] is None else str(r["seed"]),
            ("[yellow]stalled[/]" if stalled else status_text(r["status"]))
            + ("?" if r["id"] in stale else "")
            + ("!" if r["id"] in changed else ""),
            str(r["attempts"]),
            "-" if r["step"] is None else str(r["step"]),
            "-" if r["reward"] is None else f"{r['reward']:.4f}",
            "-" if r["val"] is None else f"{r['val']:.4f}",
            wall_text(r["queued_s"]),
            wall_text(r["run_s"]),
            figure(r["s_per_step"]),
            "-" if r["tokens_s_per_device"] is None else f"{r['tokens_s_per_device']:,.0f}",
            figure(r["device_hours"]),
            "-" if r["eta_s"] is None else wall_text(r["eta_s"]),
            (r["started"] or "-")[:16],
            error.replace("[", r"\["),
        )
    return table, cut


def _sweeps_table(rows: list[dict], sweep_name: str | None):
    """The terminal table of `rpg runs` over many runs: one row per sweep, its runs counted by state (the
    states no run is in left out), the steps reached, its device-hours so far and the latest start."""
    from rich.table import Table

    from rpg_cli.report.summary import sweeps_summary
    from rpg_cli.states import STATUSES

    sweeps = sweeps_summary(rows)
    states = [s for s in STATUSES if any(sweep[s] for sweep in sweeps)]
    stalls = any(sweep["stalled"] for sweep in sweeps)
    table = Table(title=f"runs of {sweep_name}, per sweep" if sweep_name else "runs per sweep")
    table.add_column("sweep", no_wrap=True)
    for title in ("runs", *states, *(("stalled",) if stalls else ()), "steps", "dev-h"):
        table.add_column(title, justify="right", no_wrap=True)
    table.add_column("last started (UTC)", no_wrap=True)
    for sweep in sweeps:
        low, high = sweep["step_min"], sweep["step_max"]
        table.add_row(
            sweep["sweep"],
            str(sweep["runs"]),
            *(str(sweep[s]) if sweep[s] else "-" for s in states),
            *((str(sweep["stalled"]) if sweep["stalled"] else "-",) if stalls else ()),
            "-" if low is None else str(low) if low == high else f"{low}-{high}",
            figure(sweep["device_hours"]),
            (sweep["started"] or "-")[:16],
        )
    return table


@rpg_command("logs")
def logs_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id, id prefix or name."),
    follow: bool = typer.Option(False, "--follow", "-f", metavar="", help="Keep printing output until the job ends."),
    db: str = db_option(),
    address: str = address_option(),
    runs_dir: str = runs_dir_option(),
) -> None:
    """Print a run's job output (from the cluster while it knows the job, else the run's job.log)."""
    from pathlib import Path

    from rpg_cli.orchestration.controls import job_logs
    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.store import StoreError
    from rpg_cli.store.url import redact

    with existing_store("logs", db) as store:
        found = store.resolve(run)
        if len(found) != 1:
            why = (
                "is not a run id, id prefix, name or sweep in the store"
                if not found
                else f"names {len(found)} runs (a sweep?)"
            )
            fail("logs", LookupError(f"{run!r} {why}; give one run's id or name (`rpg runs` lists them)"))
        reconcile_shown("logs", store, found, address, runs_dir, quiet=True)  # a finished job's log is saved as job.log
        record = store.run(found[0].id)
    try:
        for chunk in job_logs(record, address=address, runs_dir=Path(runs_dir), follow=follow):
            typer.echo(redact(chunk), nl=False)
    except (ClusterError, StoreError) as e:
        fail("logs", e)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@rpg_command("cancel")
def cancel_command(
    ref: str = typer.Argument(
        ..., metavar="RUN|SWEEP", help="A run id, id prefix or name, or a sweep name (all its runs)."
    ),
    graceful: bool = typer.Option(
        False,
        "--graceful",
        metavar="",
        help="Let each training run finish the step it is in, save a checkpoint and stop (resumed from it by "
        "`rpg sweep --retry-failed`); runs that have not logged a step yet are stopped at once.",
    ),
    wait: bool = typer.Option(
        True,
        "--wait/--no-wait",
        help="With --graceful: wait until each run has stopped and say at which step, or return at once.",
    ),
    timeout: float = typer.Option(
        1800,
        "--timeout",
        metavar="SECONDS",
        min=0,
        help="With --graceful: how long to wait for the runs to stop (a step and its checkpoint must fit); the "
        "runs still going are named, and `rpg cancel` without --graceful stops them.",
    ),
    lost: bool = typer.Option(
        False,
        "--lost",
        metavar="",
        help="Also record as stopped the runs whose jobs the cluster does not know because their head was "
        "stopped or restarted (no job runs for them). Never for runs launched from another --runs-dir, "
        "cluster or user: those are stopped where they run.",
    ),
    db: str = db_option(),
    address: str = address_option(),
    runs_dir: str = runs_dir_option(),
) -> None:
    """Stop a run's job, or every unfinished run of a sweep; only what was stopped is recorded as stopped.

    The cluster (--address, else the local head of --runs-dir) is asked first: a run whose job has
    already ended is recorded as it ended (a run that succeeded stays succeeded). A run whose job that
    cluster cannot be reached for or does not know (launched from another directory, cluster or user)
    is not recorded: the command names the cluster and exits 2. A sweep's live Slurm job (`rpg slurm`) is
    cancelled first; its runs ran on its Ray and are recorded stopped with it.

    --graceful asks each training run to stop after the step it is in, with a checkpoint of that step (a
    file in its run directory, which its trainer reads after every step), and waits for them (--timeout); a
    sweep's Slurm job is cancelled once they have stopped, for the runs that had not started.

    Examples:

      rpg cancel my-sweep
      rpg cancel my-sweep --graceful    # each run saves the step it is in first
      rpg cancel rpg-urkl-1234abcd --address http://head:8265
      rpg cancel my-sweep --lost    # after `rpg stop --force`: no job runs
    """
    from pathlib import Path

    if graceful and not _cancel_gracefully(ref, db, address, Path(runs_dir), lost, wait, timeout):
        return
    _cancel_now(ref, db, address, Path(runs_dir), lost)


def _cancel_now(ref: str, db: str, address: str | None, runs_dir, lost: bool) -> None:
    """`rpg cancel` without --graceful: the sweep's Slurm job, then every unfinished run's job."""
    from rpg_cli.orchestration.cancel import NotOnClusterError, cancel
    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.orchestration.slurm import SlurmError, cancel_job
    from rpg_cli.store import StoreError

    try:  # a sweep's Slurm job (`rpg slurm`) first: then nothing restarts its runs
        slurm = cancel_job(runs_dir, ref)
    except SlurmError as e:
        fail("cancel", e)
    if slurm:
        typer.echo(slurm)
    try:  # the Slurm job's Ray, and every job on it, ends with it: its runs are recorded stopped
        done = cancel(ref, db, address=address, runs_dir=runs_dir, lost=lost or slurm is not None)
    except NotOnClusterError as e:
        _not_on_cluster(runs_dir, ref, e)
    except (ClusterError, StoreError) as e:
        if slurm and isinstance(e, StoreError):  # a job cancelled while queued: no run recorded yet
            return
        fail("cancel", e)
    _echo_cancelled(ref, done)


def _not_on_cluster(runs_dir, ref: str, e: Exception) -> None:
    """Fail with the one line of runs the cluster does not know, and the sweep's ended Slurm job as a hint."""
    from rpg_cli.orchestration.head import ClusterError

    ended = _ended_slurm_job(runs_dir, ref)
    fail("cancel", ClusterError(f"{e}; the sweep's Slurm job {ended} has ended, and its Ray with it") if ended else e)


def _echo_cancelled(ref: str, done, graceful: bool = False) -> None:
    """What `cancel` did, in a line for each kind (exit 2 for runs Ray would not stop)."""
    from rpg_cli.orchestration.head import ClusterError

    if done.finished:
        typer.echo(
            f"{len(done.finished)} run(s) had already ended: "
            + ", ".join(r.name for r in done.finished)
            + " (`rpg runs` shows how)"
        )
    if done.stopped:
        why = " (they had not started training: nothing to save)" if graceful else ""
        typer.echo(f"stopped {len(done.stopped)} run(s): " + ", ".join(r.name for r in done.stopped) + why)
    elif not done.finished and not done.unconfirmed and not graceful:
        typer.echo(f"rpg cancel: nothing to stop: every run of {ref!r} has finished")
    if done.unconfirmed:
        names = ", ".join(r.name for r in done.unconfirmed)
        fail(
            "cancel",
            ClusterError(
                f"Ray did not stop {len(done.unconfirmed)} run(s): {names}; they are recorded as they were: run "
                "the same command again (`rpg logs RUN` shows their jobs)"
            ),
        )


def _cancel_gracefully(
    ref: str, db: str, address: str | None, runs_dir, lost: bool, wait: bool, timeout: float
) -> bool:
    """`rpg cancel --graceful`: ask the training runs to stop after their step, cancel the others, and wait
    (unless not `wait`) for the asked ones; returns whether the sweep's Slurm job is to be cancelled now (its
    runs that were asked have all stopped: the rest are cancelled with it)."""
    from pathlib import Path

    from rpg_cli import rundir
    from rpg_cli.orchestration.cancel import NotOnClusterError, ask_to_stop, wait_for_stops
    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.orchestration.slurm import SlurmError, live_job
    from rpg_cli.store import StoreError

    try:  # a sweep's live Slurm job: its Ray cannot be reached from here, the store says what runs
        slurm = live_job(runs_dir, ref) if Path(ref).name == ref and ref not in (".", "..") else None
    except SlurmError as e:
        fail("cancel", e)
    on_ray = slurm is None
    try:
        asked = ask_to_stop(ref, rundir.CANCELLED, db, address, runs_dir, lost=lost, others=on_ray, ray=on_ray)
    except NotOnClusterError as e:
        _not_on_cluster(runs_dir, ref, e)
    except (ClusterError, StoreError) as e:
        fail("cancel", e)
    for run, last in asked.asked:
        typer.echo(f"asked {run.name} to stop after the step it is in, with a checkpoint (last logged: step {last})")
    if asked.others is not None:
        _echo_cancelled(ref, asked.others, graceful=True)
    if not asked.asked:
        if on_ray and not asked.others.stopped and not asked.others.finished:
            typer.echo(f"rpg cancel: nothing to stop: every run of {ref!r} has finished")
        return not on_ray
    if not wait:
        typer.echo("not waiting (--no-wait): `rpg runs` shows each run stopped, with the step of its checkpoint")
        if slurm:
            typer.echo(f"the sweep's Slurm job {slurm[0]} runs on: `rpg cancel {ref}` cancels it once they stopped")
        return False
    typer.echo(
        f"waiting up to {timeout:g} s for {len(asked.asked)} run(s) to stop (--timeout; Ctrl-C stops waiting, "
        "the requests stand)"
    )
    try:
        ended, left = wait_for_stops([r for r, _ in asked.asked], timeout, db, address, runs_dir, ray=on_ray)
    except KeyboardInterrupt:
        warn("cancel", "stopped waiting; the requests stand: `rpg runs` shows each run stopped, with its step")
        raise typer.Exit(130) from None
    except StoreError as e:
        fail("cancel", e)
    for end in ended:
        if end.step is not None:
            typer.echo(f"{end.run.name} stopped at step {end.step}, its checkpoint saved")
        else:
            error = f": {end.run.error}" if end.run.error else ""
            typer.echo(f"{end.run.name} ended before it could stop ({end.run.status}{error})")
    if left:
        names = ", ".join(r.name for r in left)
        held = f"; the sweep's Slurm job {slurm[0]} runs on" if slurm else ""
        fail(
            "cancel",
            ClusterError(
                f"{len(left)} run(s) did not stop within {timeout:g} s: {names}; their requests stand (each stops "
                f"after its step){held}: `rpg cancel {ref}` without --graceful stops them now"
            ),
            code=1,
        )
    return not on_ray


def _ended_slurm_job(runs_dir, ref: str) -> str | None:
    """The sweep's last Slurm job when it has ended (None when unknown): a hint, never a reason to record."""
    from rpg_cli.orchestration.slurm import SlurmError, ended_job

    try:
        return ended_job(runs_dir, ref)
    except (SlurmError, OSError, ValueError):
        return None


@rpg_command("stop")
def stop_command(
    runs_dir: str = runs_dir_option(),
    db: str = db_option(),
    force: bool = typer.Option(
        False, "--force", metavar="", help="Stop it even while jobs run on it (they die with it)."
    ),
) -> None:
    """Stop the local Ray head that `rpg sweep` and `rpg eval` started under --runs-dir.

    The head stays up between commands so that the next one starts at once. It is not stopped while
    jobs run on it, unless --force. Results and run directories are kept.
    """
    from pathlib import Path

    from rpg_cli.orchestration.controls import LiveRunsError, stop
    from rpg_cli.orchestration.head import ClusterError

    try:
        stopped = stop(Path(runs_dir), db, force=force)
    except (LiveRunsError, ClusterError) as e:
        fail("stop", e)
    if stopped:
        typer.echo(f"stopped the local Ray head in {runs_dir}/ray")
    else:
        typer.echo(f"no local Ray head is running in {runs_dir}/ray")
