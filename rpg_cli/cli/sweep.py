"""`rpg sweep`: the plan (dry run) or the submission of a grid, and the live view of its runs."""

from __future__ import annotations

import typer

from rpg_cli.backends.registry import allowed, backend_names
from rpg_cli.cli.common import db_option, error_line, fail, make_console, rpg_command, status_text, warn
from rpg_cli.watch import STALL_FACTOR, STALL_FLOOR_S


@rpg_command()
def sweep(
    spec: str = typer.Argument(..., metavar="SPEC", help="Sweep YAML: name, base, grid, include/exclude, seeds."),
    dry_run: bool = typer.Option(
        False, "--dry-run", metavar="", help="Print the plan (runs, their state in the store) and write nothing."
    ),
    check: bool = typer.Option(
        False,
        "--check",
        metavar="",
        help="With --dry-run: also run the backend's pre-submission check (verl: its plugin loads and its config "
        "takes the runs' overrides, once per distinct configuration) and print its verdicts; exit 2 if it refuses.",
    ),
    output_format: str = typer.Option(
        "table",
        "--format",
        metavar="table|json",
        help="Plan output: a table, or JSON (id, name, spec, state, entrypoint).",
    ),
    db: str = db_option(),
    runs_dir: str = typer.Option(
        "runs", "--runs-dir", metavar="PATH", help="Root of the run directories: PATH/<sweep>/<run>/."
    ),
    backend: str = typer.Option(
        None,
        "--backend",
        metavar="|".join(backend_names()),
        help="Run every cell on this backend instead of the spec's.",
    ),
    detach: bool = typer.Option(
        False, "--detach", metavar="", help="Submit and return at once instead of following progress."
    ),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", metavar="", help="Resubmit runs that failed or were stopped."
    ),
    stall_timeout: float = typer.Option(
        None,
        "--stall-timeout",
        metavar="SECONDS",
        help="Stop and fail a run that stays stalled this long: its metrics silent for longer than the spec's "
        f"watch.stall ({STALL_FACTOR:g} x its median step, at least {STALL_FLOOR_S:g} s by default), then SECONDS "
        "more. --retry-failed resumes it from its checkpoint.",
    ),
    address: str = typer.Option(
        None,
        "--address",
        envvar="RAY_ADDRESS",
        metavar="ADDR",
        help="Ray cluster (e.g. http://head:8265). Default: a local head bound to 127.0.0.1, started on first use, its files under --runs-dir.",
    ),
) -> None:
    """Expand a sweep spec into runs and submit one Ray job per run (or --dry-run to see the plan).

    Each run gets runs/<sweep>/<run>/ (spec.json, metrics.jsonl, checkpoints/, job.log) and a row in
    the results store; progress is followed live until every run has finished (Ctrl-C leaves the jobs
    running: the same command re-attaches). Re-running a sweep skips succeeded runs, re-attaches to
    live ones, and resubmits failed ones only with --retry-failed. While following, a run that logs a
    step beyond its bounds (the spec's watch block: by default the gap between vLLM's and the trainer's
    probabilities) is stopped and failed; with --stall-timeout, so is one whose metrics stopped coming.

    Examples:

      # the CPU grid, on a local Ray head
      rpg sweep experiments/smoke.yaml

      # the 20 runs of a paper grid and their state; nothing is written
      rpg sweep experiments/paper-qwen3-4b.yaml --dry-run

      # ... and whether verl takes their configuration, as a submission checks it
      rpg sweep experiments/paper-qwen3-4b.yaml --dry-run --check

      # on a GPU cluster, without waiting for the runs to finish
      rpg sweep experiments/paper-qwen3-4b.yaml --address http://head:8265 \\
          --detach

      # follow it, failing a run that hangs for an hour past its stall limit
      rpg sweep experiments/paper-qwen3-4b.yaml --address http://head:8265 \\
          --stall-timeout 3600
    """
    if output_format not in ("table", "json"):
        raise typer.BadParameter(f"{output_format!r}; allowed: table, json", param_hint="--format")
    if backend is not None and backend not in backend_names():
        raise typer.BadParameter(f"{backend!r}; allowed: {allowed()}", param_hint="--backend")
    if stall_timeout is not None and not (stall_timeout >= 0 and stall_timeout < float("inf")):
        raise typer.BadParameter(f"{stall_timeout!r}; allowed: seconds >= 0", param_hint="--stall-timeout")
    if check and not dry_run:
        raise typer.BadParameter("goes with --dry-run (a submission always runs the check)", param_hint="--check")
    if stall_timeout is not None and detach:
        raise typer.BadParameter(
            "stops stalled runs while `rpg sweep` follows them; drop --detach, or --stall-timeout",
            param_hint="--stall-timeout",
        )
    from pathlib import Path

    from rpg_cli.orchestration.dryrun import plan_submission
    from rpg_cli.spec import SpecError
    from rpg_cli.store import StoreError

    try:
        plan = plan_submission(
            spec,
            Path(runs_dir),
            db,
            backend=backend,
            address=address,
            retry_failed=retry_failed,
            dry_run=dry_run,
            check=check,
        )
    except (SpecError, StoreError) as e:  # StoreError: a submission's store (the dry run shows states as unknown)
        fail("sweep", e)
    if not dry_run:
        _watch_sweep(plan, db, detach=detach, runs_dir=runs_dir, stall_timeout=stall_timeout)
        return
    if plan.unread:
        warn("sweep", plan.unread)
    if output_format == "json":
        import json

        if check:  # its verdicts are in the rows
            _run_check(plan)
        typer.echo(json.dumps(plan.json_rows(), indent=2))
    else:
        _print_sweep_plan(plan)
    for line in plan.elsewhere_lines() + plan.check_lines():
        warn("sweep", line)
    if check:  # the plan is on screen first: the check takes a while
        _run_check(plan)
        if output_format == "table":  # json: each row has its verdict
            for line in plan.config_check_lines():
                typer.echo(line)
        for line in plan.check_time_lines():
            warn("sweep", line)
    if plan.refused:
        raise typer.Exit(2)


def _run_check(plan) -> None:
    """The backends' pre-submission check of the plan (orchestration/preflight.py), run once: one line and exit 2
    when it cannot run (the plugin does not load, a stage runs out of time)."""
    try:
        plan.config_check  # noqa: B018 (computed on first use, then kept)
    except RuntimeError as e:
        fail("sweep", e)


def _print_sweep_plan(plan) -> None:
    """The dry run's table and the lines under it, as the plan has them."""
    from rich.table import Table

    table = Table(title=plan.title, show_lines=False)
    for column in plan.columns:
        table.add_column(column, no_wrap=column != "name", justify="right" if column.endswith("B") else "left")
    for row in plan.table_rows():
        table.add_row(*row)
    console = make_console()
    console.print(table)
    for line in plan.notes():
        console.print(line.text, highlight=False, soft_wrap=True if line.whole else None)


def _progress_caption(snapshot) -> str:
    counts = snapshot.counts
    return (
        f"pending {counts['pending'] + counts['submitted']} · running {counts['running']} · "
        f"succeeded {counts['succeeded']} · failed {counts['failed']} · stopped {counts['stopped']}"
        + (f" · preempted {counts['preempted']}" if counts.get("preempted") else "")
    )


def _progress_table(snapshot):
    from rich.table import Table

    table = Table(title=f"sweep {snapshot.sweep}", caption=_progress_caption(snapshot))
    for column in ("name", "id", "status", "attempt", "step", "reward", "error"):
        table.add_column(
            column, justify="right" if column in ("attempt", "step", "reward") else "left", no_wrap=column != "error"
        )
    for r in snapshot.runs:
        table.add_row(
            r.name,
            r.id,
            status_text(r.status),
            str(r.attempts),
            "-" if r.step is None else str(r.step),
            "-" if r.reward is None else f"{r.reward:.4f}",
            error_line(r.error, 50),
        )
    return table


def _live_view(snapshot):
    """What a terminal shows while the sweep is watched: its table, and under it the progress line when the
    snapshot has its numbers (orchestration/progress.py, sweep_eta)."""
    from rich.console import Group

    table = _progress_table(snapshot)
    return table if snapshot.eta is None else Group(table, _progress_line(snapshot.eta))


def _progress_line(eta):
    """One line: a bar of the steps done, the runs and steps done of their totals, the sweep's ETA."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    from rpg_cli.report import wall_text

    line = Table.grid(padding=(0, 1))
    line.add_column(no_wrap=True)
    line.add_column(no_wrap=True)
    left = "ETA -" if eta.eta_s is None else "done" if eta.runs_done == eta.runs else f"ETA {wall_text(eta.eta_s)}"
    line.add_row(
        ProgressBar(total=max(eta.steps, 1), completed=eta.steps_done, width=30),
        f"runs {eta.runs_done}/{eta.runs} · steps {eta.steps_done}/{eta.steps} · {left}",
    )
    return line


def _detached(before: dict[str, str], final, retry_failed: bool) -> str:
    """What `rpg sweep --detach` did, from the runs' states before it and after its submissions: how many
    it submitted, and what the others are (never "submitted" when nothing was)."""
    from rpg_cli.states import LIVE, SUBMIT, run_action

    status = {r.id: r.status for r in final.runs}  # one per run (a grid may name a run twice)
    to_submit = {i for i in status if run_action(before.get(i, "new"), retry_failed) == SUBMIT}
    submitted = sum(status[i] in LIVE for i in to_submit)
    refused = len(to_submit) - submitted  # Ray refused the job: recorded failed, with its answer
    others = [s for i, s in status.items() if i not in to_submit]
    live = sum(s in LIVE for s in others)  # re-attached (a job the cluster had lost is submitted again)
    parts = [
        f"{n} {what}"
        for n, what in (
            (sum(s == "succeeded" for s in others), "succeeded"),
            (live, "live"),
            (sum(s in ("failed", "stopped") for s in others), "failed or stopped (--retry-failed reruns them)"),
            (refused, "refused by Ray (`rpg runs --wide` shows why)"),
        )
        if n
    ]
    sweep = final.sweep
    line = f"submitted {submitted} run(s) of {sweep}" if submitted else f"nothing to submit in {sweep}"
    if parts:
        line += ("; " if submitted else ": ") + ", ".join(parts)
    if submitted or live:
        line += f"; follow with `rpg runs --sweep {sweep}` or `rpg logs RUN --follow`"
    return line


def _watch_sweep(
    plan, db: str, detach: bool = False, runs_dir: str = "runs", stall_timeout: float | None = None
) -> None:
    """Submit a sweep's plan (orchestration/dryrun.py) as Ray jobs and, unless `detach`, follow them until all have
    finished: a live table on a terminal, a line per change of the counts otherwise (logs, CI). Exits 0 when
    every run succeeded, 1 when some failed, stopped or were preempted, 2 on a cluster or store error, 130 on Ctrl-C
    (the jobs keep running; the same command re-attaches)."""
    from pathlib import Path

    from rich.live import Live

    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.orchestration.plan import PreflightError
    from rpg_cli.orchestration.sweep import run_sweep
    from rpg_cli.store import StoreError

    sweep_name = plan.sweep
    console = make_console()
    live = Live(console=console, auto_refresh=False) if console.is_terminal and not detach else None
    last_caption = None

    def show(snapshot) -> None:
        nonlocal last_caption
        if live is not None:
            live.update(_live_view(snapshot), refresh=True)
        elif not detach and _progress_caption(snapshot) != last_caption:
            last_caption = _progress_caption(snapshot)
            console.print(f"sweep {sweep_name}: {last_caption}", highlight=False)

    try:  # a run that would fail on its inputs: one line, before any head, run directory or row
        for line in plan.check_lines(errors=False):
            warn("sweep", line)
        plan.refuse_bad_inputs()
    except PreflightError as e:
        fail("sweep", e)
    where = plan.address or f"the local Ray head in {runs_dir}/ray (started on first use, ~15 s)"
    warn("sweep", f"{sweep_name}: {len(plan.runs)} runs; connecting to {where}")
    try:
        if live is not None:
            live.start()
        final = run_sweep(
            plan,
            sweep_name,
            db,
            detach=detach,
            on_update=show,
            runs_dir=Path(runs_dir),
            stall_timeout=stall_timeout,
            eta=live is not None,  # the progress line is a terminal's only: logs and CI get the same lines as before
        )
    except KeyboardInterrupt:
        typer.echo(
            f"rpg sweep: stopped following {sweep_name}; its jobs keep running. Run the same command to "
            f"re-attach, `rpg runs --sweep {sweep_name}` to look, `rpg cancel {sweep_name}` to stop them.",
            err=True,
        )
        raise typer.Exit(130) from None
    except (ClusterError, StoreError, PreflightError) as e:
        fail("sweep", e)
    finally:
        if live is not None:
            live.stop()
    if live is None:
        console.print(_progress_table(final))
    if detach:
        typer.echo(_detached(plan.states, final, plan.retry_failed))
        return
    if plan.local_head:  # a head rpg started: say it is still there
        warn("sweep", f"the local Ray head in {runs_dir}/ray stays up for the next command; `rpg stop` ends it")
    if any(r.status in ("failed", "stopped", "preempted") for r in final.runs):
        raise typer.Exit(1)
