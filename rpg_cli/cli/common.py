"""What every command shares: the typer app, the command decorator (help that wraps, one-line errors
for files that cannot be written), one-line messages with passwords masked, the console, the store
opener, and the reconciliation with Ray before state is shown."""

from __future__ import annotations

import functools
import inspect
import os
import sys

import typer

from rpg_cli.store.url import DB_ENVVAR, DEFAULT_DB_URL

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


def rpg_command(name: str | None = None):
    """`app.command`, with the docstring as help that wraps to the terminal: each paragraph becomes
    one line (rich wraps it), indented blocks (the examples) stay line by line. A file the command
    cannot write or read (read-only, full disk, no permission) ends it with one line naming the path
    and the fix, exit 2."""

    def register(function):
        paragraphs = inspect.cleandoc(function.__doc__ or "").split("\n\n")
        text = "\n\n".join(p if p.startswith(" ") else " ".join(p.split()) for p in paragraphs)

        @functools.wraps(function)
        def command(*args, **kwargs):
            from rpg_cli.rundir import known_failure, os_error_line

            try:
                return function(*args, **kwargs)
            except OSError as e:
                fail(name or function.__name__, OSError(os_error_line(e)))
            except Exception as e:  # a full disk met by a library that does not raise OSError (torch.save, safetensors)
                if isinstance(e, typer.Exit) or not (line := known_failure(f"{type(e).__name__}: {e}")):
                    raise
                fail(name or function.__name__, RuntimeError(line))

        return app.command(name, help=text)(command)

    return register


def one_blas_thread() -> None:
    """For the commands that read the store (report, compare, runs, export: arithmetic on arrays of tens of numbers):
    numpy's OpenBLAS would start a worker per core that spins while idle, 0.1-0.3 s of CPU a command for nothing.
    Only before numpy is first imported (after, the setting does nothing) and where the user set none; a command
    that starts runs never calls it (its jobs would inherit the setting)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


DB_HELP = "Results store: a SQLAlchemy URL or a SQLite file path; default: $RPG_DB, else sqlite:///runs/results.db."
ADDRESS_HELP = (
    "Ray cluster (dashboard URL or head address); default: $RAY_ADDRESS, else the local head under --runs-dir."
)
RUNS_DIR_HELP = "Root of the run directories; the local Ray head keeps its files in PATH/ray."


def db_option():
    """`--db URL`: the results store, from $RPG_DB where not given (the default store when neither is)."""
    return typer.Option(
        DEFAULT_DB_URL, "--db", metavar="URL", envvar=DB_ENVVAR, show_envvar=False, show_default=False, help=DB_HELP
    )


def address_option():
    return typer.Option(None, "--address", metavar="ADDRESS", help=ADDRESS_HELP)


def runs_dir_option():
    return typer.Option("runs", "--runs-dir", metavar="PATH", help=RUNS_DIR_HELP)


def sweep_option():
    """`--sweep NAME`: only this sweep's runs."""
    return typer.Option(
        None, "--sweep", metavar="NAME", help="Only this sweep's runs (default: every run in the store)."
    )


WHERE_HELP = (
    "Only runs whose spec matches: FIELD=V[,V...] or FIELD!=V, each V as the spec's YAML writes it "
    "(clip=off, reference={every: 10}); dotted paths reach nested fields (clip.eps_low=0.1). Repeatable; all must hold."
)


def where_option(scope: str = ""):
    """`--where FIELD=VALUE`, repeatable: runs whose spec matches (rpg_cli.report.summary.parse_where).
    `scope` says more of what it filters (`rpg compare`: on both sides). Checked as it is parsed, before
    any store is opened: a value no run can have is an error whether or not there are runs yet."""
    return typer.Option(None, "--where", metavar="FIELD=VALUE", help=f"{WHERE_HELP}{scope}", callback=_check_where)


def _check_where(ctx: typer.Context, clauses: list[str] | None) -> list[str] | None:
    """`rpg COMMAND: --where '...': ...` (exit 2) for a filter that cannot match (the spec's types say)."""
    if clauses:
        from rpg_cli.report.scores import ReportError
        from rpg_cli.report.summary import parse_where

        try:
            parse_where(clauses)
        except ReportError as e:
            fail(ctx.info_name or "rpg", e)
    return clauses


def format_option(default: str | None, help: str, choices: tuple[str, ...] = ()):
    """`--format`, one of `choices` (shown as its metavar; else FORMAT), checked by `check_format`."""
    return typer.Option(default, "--format", metavar="|".join(choices) or "FORMAT", help=help)


def check_format(command: str, value: str | None, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        fail(command, ValueError(f"unknown --format {value!r}; allowed: {', '.join(choices)}"))


def comma_list(text: str | None) -> tuple[str, ...] | None:
    """`a, b,c` -> ('a', 'b', 'c'); None or nothing but commas -> None."""
    return tuple(item.strip() for item in (text or "").split(",") if item.strip()) or None


_STATUS_STYLE = {
    "pending": "dim",
    "submitted": "cyan",
    "running": "blue",
    "succeeded": "green",
    "failed": "red",
    "stopped": "yellow",
    "preempted": "magenta",
}


def fail(command: str, error: Exception, code: int = 2) -> None:
    warn(command, str(error))
    raise typer.Exit(code)


def warn(command: str, message: str) -> None:
    """One line on stderr, passwords in URLs masked (every message rpg prints goes through here)."""
    from rpg_cli.store.url import redact

    typer.echo(redact(f"rpg {command}: {message}"), err=True)


def make_console():
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)  # pipes get whole rows


def existing_store(command: str, db: str):
    """The existing results store, closed on exit; `rpg COMMAND: ...` (exit 2) when there is none."""
    import contextlib

    from rpg_cli.store import StoreError, open_store

    try:
        store = open_store(db, create=False)
    except StoreError as e:
        fail(command, e)
    return contextlib.closing(store)


def status_text(status: str) -> str:
    return f"[{_STATUS_STYLE.get(status, '')}]{status}[/]"


def error_line(error: str | None, width: int | None = 60) -> str:
    """The failure reason on one line: its last line, cut to `width` characters (None: whole)."""
    from rpg_cli.rundir import last_lines

    line = last_lines(error or "")
    return line[: width - 1] + "…" if width is not None and len(line) > width else line


def live_runs(store, sweep: str | None) -> list:
    """The runs of `sweep` (None: every run) that may still be live: all that `reconcile_shown` looks at, read
    without the others (thousands, for a report of the whole store)."""
    from rpg_cli.orchestration.reconcile import LIVE

    return store.runs(sweep=sweep, status=LIVE)


def reconcile_shown(
    command: str, store, runs: list, address: str | None, runs_dir: str, quiet: bool = False, marked: bool = True
) -> frozenset:
    """Bring the live ones among `runs` up to what Ray knows before showing them; the ids of those it
    could not check (taken as stored, possibly stale; `marked` with ? where the command shows them),
    with one line saying why unless `quiet`."""
    from pathlib import Path

    from rpg_cli.orchestration.reconcile import reconcile

    result = reconcile(store, runs, address=address, runs_dir=Path(runs_dir))
    if result.unconfirmed and not quiet:
        warn(
            command,
            f"{len(result.unconfirmed)} live run(s) {'shown' if marked else 'taken'} as last recorded, possibly stale"
            + (" (marked ?)" if marked else "")
            + f": {result.why}",
        )
    return result.unconfirmed
