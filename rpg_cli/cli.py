"""The `rpg` command line: parse, call a module, render. No logic lives here.

Heavy packages (torch, ray, verl, transformers) are imported inside the commands that need them,
so that `rpg --help` and `rpg sweep --dry-run` answer at once.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="rpg",
    help=(
        "Run, evaluate and compare KL-regularized policy-gradient algorithms for LLM reasoning "
        "(RPG, arXiv 2505.17508).\n\n"
        "prepare-data -> sweep -> eval -> report: raw sources become verl parquet, a grid of typed "
        "specs becomes one Ray job per run, checkpoints are scored with accuracy@k, and the results "
        "store prints the paper's Last/Best tables."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _not_built(command: str) -> None:
    typer.echo(f"rpg {command}: not built yet in this version of rpg (nothing was done).", err=True)
    raise typer.Exit(2)


@app.command("prepare-data")
def prepare_data(
    sources: list[str] = typer.Argument(None, metavar="SOURCE", show_default=False, help="Presets dapo-math-17k, aime24, aime25, amc23 (default: all four); PRESET=FILE or PRESET=hf:OWNER/NAME:CONFIG@SPLIT reads another copy."),
    out: str = typer.Option("data", "--out", "-o", metavar="DIR", help="Directory for the parquet files."),
    from_origin: str = typer.Option(None, "--from", metavar="FILE|hf:ID", help="Read the one preset named from this local file or hub dataset (same as PRESET=FILE)."),
    input_file: str = typer.Option(None, "--input", "-i", metavar="FILE", help="Any local .jsonl/.json/.csv/.tsv/.parquet file of problems, written as NAME.parquet."),
    name: str = typer.Option(None, "--name", help="Name of the --input set: output NAME.parquet, data_source NAME (default: the file's stem)."),
    data_source: str = typer.Option(None, "--data-source", help="data_source of the --input rows (default: NAME); it picks verl's reward function and names the metrics."),
    question_field: str = typer.Option(None, "--question-field", metavar="FIELD", help="Field holding the problem; dotted paths reach into structs (extra_info.raw_problem). Default: auto-detect."),
    answer_field: str = typer.Option(None, "--answer-field", metavar="FIELD", help="Field holding the final answer (reward_model.ground_truth, ...). Default: auto-detect."),
    repeat: int = typer.Option(None, "--repeat", "-k", min=1, metavar="K", help="Copies of each evaluation problem, for accuracy@K (default: 32 for the AIME/AMC presets, 1 for --input). The training set is never repeated."),
    english_only: bool = typer.Option(None, "--english-only/--any-language", show_default=False, help="Drop problems written mostly in non-Latin scripts (default: on for dapo-math-17k only)."),
    dedup: bool = typer.Option(True, "--dedup/--no-dedup", help="Drop repeated problems (equal up to case, whitespace and Unicode form)."),
    strict: bool = typer.Option(False, "--strict", help="Stop on any malformed row (empty question, missing answer) and write nothing, instead of skipping it."),
) -> None:
    """Write verl-format parquet for training (DAPO-Math-17k) and evaluation (AIME24/25, AMC23).

    Each problem becomes one row with the paper's prompt (DAPO's "Answer:" template), its ground
    truth and data_source; evaluation problems are repeated K times for accuracy@K (extra_info.index
    = copy number). A table shows, per source, the rows read, dropped (and why) and written.
    Everything is read before anything is written; files are replaced atomically.

    Examples:

      rpg prepare-data                                  # all four presets from the Hub into data/
      rpg prepare-data aime24 aime25 amc23 --repeat 16  # evaluation sets only, Mean@16
      rpg prepare-data aime24=aime24.jsonl              # a local copy (offline machines)
      rpg prepare-data dapo-math-17k --from dapo-math-17k.parquet
      rpg prepare-data dapo-math-17k=hf:open-r1/DAPO-Math-17k-Processed:en
      rpg prepare-data --input mine.csv --question-field q --answer-field a --name mine -k 8

    Sources: dapo-math-17k (BytedTsinghua-SIA/DAPO-Math-17k, English only, deduplicated, data_source
    math_dapo), aime24 (HuggingFaceH4/aime_2024, math_dapo), aime25 (math-ai/aime25, aime2025),
    amc23 (math-ai/amc23, amc_23). Fields of local files are auto-detected (problem, question,
    prompt, ... / answer, reward_model.ground_truth, ...); verl files are unwrapped to raw problems.
    """
    # `--toy` (the local backend's toy task) is reserved here for the local-backend work.
    from pathlib import Path

    from rpg_cli.datasets import PrepareError, SourceError, SourceOptions, prepare, resolve_sources

    options = SourceOptions(question_field=question_field, answer_field=answer_field, repeat=repeat,
                            english_only=english_only, dedup=dedup)
    try:
        specs = resolve_sources(sources or [], out_dir=Path(out), options=options, from_origin=from_origin,
                                input_file=Path(input_file) if input_file else None, name=name,
                                data_source=data_source)
        reports = prepare(specs, strict=strict)
    except PrepareError as e:
        _print_malformed_rows(e.reports)
        typer.echo(f"rpg prepare-data: {e}", err=True)
        raise typer.Exit(2) from None
    except SourceError as e:
        typer.echo(f"rpg prepare-data: {e}", err=True)
        raise typer.Exit(2) from None
    _print_malformed_rows(reports)
    _print_prepare_summary(reports)


def _print_malformed_rows(reports: list, limit: int = 20) -> None:
    for r in reports:
        for where, why in r.malformed[:limit]:
            typer.echo(f"rpg prepare-data: {r.name} ({r.origin}) {where}: {why}", err=True)
        if len(r.malformed) > limit:
            typer.echo(f"rpg prepare-data: {r.name}: ... and {len(r.malformed) - limit} more malformed rows", err=True)


def _print_prepare_summary(reports: list) -> None:
    import sys

    from rich.console import Console
    from rich.table import Table

    table = Table(title="prepare-data")
    for column in ("source", "from", "read", "dropped", "problems", "copies", "rows written", "file"):
        table.add_column(column, justify="right" if column in ("read", "problems", "copies", "rows written") else "left")
    for r in reports:
        dropped = "\n".join(f"{n:,} {reason}" for reason, n in r.dropped.items()) or "-"
        origin = f"{r.origin}\nfields: {r.question_field}, {r.answer_field}"
        table.add_row(r.name, origin, f"{r.read:,}", dropped, f"{r.problems:,}", f"x{r.repeat}",
                      f"{r.written:,}", str(r.output))
    Console(width=None if sys.stdout.isatty() else 200).print(table, highlight=False)


@app.command()
def sweep(
    spec: str = typer.Argument(..., help="Sweep YAML: name, base, grid, include/exclude, seeds."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (runs, their state in the store) and write nothing."),
    output_format: str = typer.Option("table", "--format", metavar="table|json", help="Plan output: a table, or JSON (id, name, spec, state, entrypoint)."),
    db: str = typer.Option("sqlite:///runs/results.db", "--db", metavar="URL", help="Results store (any SQLAlchemy URL)."),
    runs_dir: str = typer.Option("runs", "--runs-dir", metavar="PATH", help="Root of the run directories: PATH/<sweep>/<run>/."),
    backend: str = typer.Option(None, "--backend", metavar="verl|local", help="Run every cell on this backend instead of the spec's."),
    detach: bool = typer.Option(False, "--detach", help="Submit and return at once instead of following progress."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Resubmit runs that failed or were stopped."),
) -> None:
    """Expand a sweep spec into runs and submit one Ray job per run (or --dry-run to see the plan).

    Re-running a sweep skips succeeded runs, re-attaches to live ones, resubmits failed ones with --retry-failed.
    """
    if output_format not in ("table", "json"):
        raise typer.BadParameter(f"{output_format!r}; allowed: table, json", param_hint="--format")
    if backend not in (None, "verl", "local"):
        raise typer.BadParameter(f"{backend!r}; allowed: verl, local", param_hint="--backend")
    if not dry_run:
        _not_built("sweep")
    from pathlib import Path

    from rpg_cli.plan import known_states, plan_sweep
    from rpg_cli.spec import SpecError, load_sweep

    try:
        plans = plan_sweep(load_sweep(spec), Path(runs_dir), backend=backend)
    except SpecError as e:
        typer.echo(f"rpg sweep: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        states = known_states(db, [p.id for p in plans])
    except Exception as e:  # a store we cannot read must not hide the plan
        typer.echo(f"rpg sweep: cannot read run states from {db} ({type(e).__name__}: {e}); showing them as unknown", err=True)
        states = {p.id: "unknown" for p in plans}
    if output_format == "json":
        import json

        rows = [{"id": p.id, "name": p.name, "spec": p.spec, "state": states[p.id], "entrypoint": p.entrypoint} for p in plans]
        typer.echo(json.dumps(rows, indent=2))
        return
    _print_sweep_plan(plans, states, retry_failed)


def _print_sweep_plan(plans: list, states: dict[str, str], retry_failed: bool) -> None:
    import sys
    from collections import Counter

    from rich.console import Console
    from rich.table import Table

    from rpg_cli.plan import run_action

    table = Table(title=f"sweep {plans[0].sweep}" if plans else "sweep", show_lines=False)
    for column in ("name", "id", "algorithm", "kl", "clip", "optimizer", "context", "seed", "state"):
        table.add_column(column, no_wrap=column != "name")
    for p in plans:
        clip = p.spec["clip"]
        clip_text = f"{clip['eps_low']:g}/{clip['eps_high']:g} c={clip['c']:g}" if clip else "off"
        table.add_row(p.name, p.id, p.spec["algorithm"], p.spec["kl"], clip_text, p.spec["optimizer"],
                      p.spec["context"], str(p.spec["seed"]), states[p.id])
    console = Console(width=None if sys.stdout.isatty() else 200)  # pipes get whole rows
    console.print(table)
    actions = Counter(run_action(states[p.id], retry_failed) for p in plans)
    gpus = sum(p.num_gpus for p in plans if run_action(states[p.id], retry_failed) == "submit")
    console.print(
        f"{len(plans)} runs: {actions['submit']} to submit ({gpus:g} GPUs), {actions['attach']} live to re-attach, "
        f"{actions['done']} succeeded, {actions['skip']} failed/stopped skipped"
        + ("" if retry_failed or not actions["skip"] else " (--retry-failed resubmits them)")
        + ". Dry run: nothing was written.",
        highlight=False,
    )


@app.command("eval")
def evaluate() -> None:
    """Score a run's checkpoints on AIME24/AIME25/AMC23 with mean@k, pass@k and maj@k."""
    _not_built("eval")


@app.command()
def report() -> None:
    """Print the paper's Last/Best tables (and training-dynamics plots) from the results store."""
    _not_built("report")


# --- runs, logs, cancel, and the live sweep view (the results store and Ray jobs) ----------------

_DB_HELP = "Results store: a SQLAlchemy URL or a SQLite file path (default sqlite:///runs/results.db)."
_ADDRESS_HELP = "Ray cluster (dashboard URL or head address); default: $RAY_ADDRESS, else the local head under --runs-dir."
_RUNS_DIR_HELP = "Root of the run directories; the local Ray head keeps its files in PATH/ray."
_STATUS_STYLE = {"pending": "dim", "submitted": "cyan", "running": "blue", "succeeded": "green", "failed": "red", "stopped": "yellow"}


def _fail(command: str, error: Exception, code: int = 2) -> None:
    typer.echo(f"rpg {command}: {error}", err=True)
    raise typer.Exit(code)


def _console():
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)  # pipes get whole rows


def _status_text(status: str) -> str:
    return f"[{_STATUS_STYLE.get(status, '')}]{status}[/]"


def _error_line(error: str | None, width: int = 60) -> str:
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    return (lines[-1][: width - 1] + "…" if len(lines[-1]) > width else lines[-1]) if lines else ""


@app.command("runs")
def runs_command(
    sweep_name: str = typer.Option(None, "--sweep", metavar="NAME", help="Only this sweep's runs."),
    status: str = typer.Option(None, "--status", metavar="STATE[,STATE]", help="Only runs in these states: pending, submitted, running, succeeded, failed, stopped."),
    db: str = typer.Option(None, "--db", metavar="URL", help=_DB_HELP),
) -> None:
    """List runs with their state, attempts, last step and last reward (critic/score/mean)."""
    from rpg_cli.jobs import REWARD_KEY
    from rpg_cli.store import DEFAULT_DB_URL, STATUSES, StoreError, open_store

    wanted = [s.strip() for s in status.split(",")] if status else None
    if wanted and (bad := [s for s in wanted if s not in STATUSES]):
        _fail("runs", ValueError(f"unknown --status {', '.join(bad)}; allowed: {', '.join(STATUSES)}"))
    try:
        store = open_store(db or DEFAULT_DB_URL, create=False)
    except StoreError as e:
        typer.echo(f"rpg runs: no runs recorded yet ({e})", err=True)
        return
    try:
        runs = store.runs(sweep=sweep_name, status=wanted)
        ids = [r.id for r in runs]
        steps, rewards = store.last_steps(ids), store.latest_values(ids, [REWARD_KEY])
    finally:
        store.close()
    from rich.table import Table

    table = Table(title=f"runs of {sweep_name}" if sweep_name else "runs")
    for column in ("sweep", "name", "id", "status", "attempts", "step", "reward", "started (UTC)", "finished (UTC)", "error"):
        table.add_column(column, justify="right" if column in ("attempts", "step", "reward") else "left", no_wrap=column not in ("name", "error"))
    for r in runs:
        reward = rewards.get(r.id, {}).get(REWARD_KEY, (None, None))[1]
        table.add_row(
            r.sweep, r.name, r.id, _status_text(r.status), str(r.attempts), str(steps.get(r.id, "-")),
            "-" if reward is None else f"{reward:.4f}",
            f"{r.started_at:%Y-%m-%d %H:%M}" if r.started_at else "-",
            f"{r.finished_at:%Y-%m-%d %H:%M}" if r.finished_at else "-",
            _error_line(r.error),
        )  # fmt: skip
    console = _console()
    console.print(table)
    counts = {s: sum(r.status == s for r in runs) for s in STATUSES}
    console.print(f"{len(runs)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n), highlight=False)


def _one_run(command: str, ref: str, db: str | None):
    from rpg_cli.store import DEFAULT_DB_URL, StoreError, open_store

    try:
        store = open_store(db or DEFAULT_DB_URL, create=False)
    except StoreError as e:
        _fail(command, e)
    try:
        found = store.resolve(ref)
    finally:
        store.close()
    if len(found) != 1:
        why = "is not a run id, id prefix, name or sweep in the store" if not found else f"names {len(found)} runs (a sweep?)"
        _fail(command, LookupError(f"{ref!r} {why}; give one run's id or name (`rpg runs` lists them)"))
    return found[0]


@app.command("logs")
def logs_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id, id prefix or name."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing output until the job ends."),
    db: str = typer.Option(None, "--db", metavar="URL", help=_DB_HELP),
    address: str = typer.Option(None, "--address", metavar="ADDRESS", help=_ADDRESS_HELP),
    runs_dir: str = typer.Option("runs", "--runs-dir", metavar="PATH", help=_RUNS_DIR_HELP),
) -> None:
    """Print a run's job output (from the cluster while it knows the job, else the run's job.log)."""
    from pathlib import Path

    from rpg_cli.jobs import ClusterError, job_logs
    from rpg_cli.store import StoreError

    record = _one_run("logs", run, db)
    try:
        for chunk in job_logs(record, address=address, runs_dir=Path(runs_dir), follow=follow):
            typer.echo(chunk, nl=False)
    except (ClusterError, StoreError) as e:
        _fail("logs", e)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@app.command("cancel")
def cancel_command(
    ref: str = typer.Argument(..., metavar="RUN|SWEEP", help="A run id, id prefix or name, or a sweep name (all its runs)."),
    db: str = typer.Option(None, "--db", metavar="URL", help=_DB_HELP),
    address: str = typer.Option(None, "--address", metavar="ADDRESS", help=_ADDRESS_HELP),
    runs_dir: str = typer.Option("runs", "--runs-dir", metavar="PATH", help=_RUNS_DIR_HELP),
) -> None:
    """Stop a run's job, or every unfinished run of a sweep; they are recorded as stopped."""
    from pathlib import Path

    from rpg_cli.jobs import ClusterError, cancel
    from rpg_cli.store import DEFAULT_DB_URL, StoreError

    try:
        stopped = cancel(ref, db or DEFAULT_DB_URL, address=address, runs_dir=Path(runs_dir))
    except (ClusterError, StoreError) as e:
        _fail("cancel", e)
    if not stopped:
        typer.echo(f"rpg cancel: nothing to stop: every run of {ref!r} has finished")
        return
    typer.echo(f"stopped {len(stopped)} run(s): " + ", ".join(r.name for r in stopped))


def _progress_table(snapshot):
    from rich.table import Table

    counts = snapshot.counts
    pending = counts["pending"] + counts["submitted"]
    caption = (f"pending {pending} · running {counts['running']} · succeeded {counts['succeeded']} · "
               f"failed {counts['failed']} · stopped {counts['stopped']}")  # fmt: skip
    table = Table(title=f"sweep {snapshot.sweep}", caption=caption)
    for column in ("name", "id", "status", "attempt", "step", "reward", "error"):
        table.add_column(column, justify="right" if column in ("attempt", "step", "reward") else "left", no_wrap=column != "error")
    for r in snapshot.runs:
        table.add_row(r.name, r.id, _status_text(r.status), str(r.attempts), "-" if r.step is None else str(r.step),
                      "-" if r.reward is None else f"{r.reward:.4f}", _error_line(r.error, 50))  # fmt: skip
    return table


def _watch_sweep(
    plans: list,
    sweep_name: str,
    db: str,
    address: str | None = None,
    detach: bool = False,
    retry_failed: bool = False,
    runs_dir: str = "runs",
) -> None:
    """Submit a sweep's plans as Ray jobs and, unless `detach`, follow them in a live table until all
    have finished. Exits 0 when every run succeeded, 1 when some failed or stopped, 2 on a cluster or
    store error, 130 on Ctrl-C (the jobs keep running; the same command re-attaches)."""
    from pathlib import Path

    from rich.live import Live

    from rpg_cli.jobs import ClusterError, run_sweep
    from rpg_cli.store import StoreError

    console = _console()
    live = Live(console=console, auto_refresh=False) if not detach else None
    try:
        if live is not None:
            live.start()
        final = run_sweep(
            plans, sweep_name, db, address=address, detach=detach, retry_failed=retry_failed,
            on_update=(lambda s: live.update(_progress_table(s), refresh=True)) if live is not None else None,
            runs_dir=Path(runs_dir),
        )  # fmt: skip
    except KeyboardInterrupt:
        if live is not None:
            live.stop()
        typer.echo(f"rpg sweep: stopped following {sweep_name}; its jobs keep running. Run the same command to "
                   f"re-attach, `rpg runs --sweep {sweep_name}` to look, `rpg cancel {sweep_name}` to stop them.", err=True)  # fmt: skip
        raise typer.Exit(130) from None
    except (ClusterError, StoreError) as e:
        if live is not None:
            live.stop()
        _fail("sweep", e)
    if live is not None:
        live.stop()
    else:
        console.print(_progress_table(final))
        typer.echo(f"submitted; follow with `rpg runs --sweep {sweep_name}` or `rpg logs RUN --follow`")
        return
    if any(r.status in ("failed", "stopped") for r in final.runs):
        raise typer.Exit(1)


if __name__ == "__main__":  # pragma: no cover
    app()
