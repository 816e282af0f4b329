"""A results database that is not what `--db` promises: the real CLI answers in one line naming the
problem and the fix, exits non-zero, prints no traceback, and creates or changes nothing. A database
that can only be read is read."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import eval_row
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import StoreError, open_store

READERS = (["runs"], ["report"], ["report", "--table", "--sweep", "sw"])


def one_line_failure(args: list[str], *must: str) -> str:
    result = CliRunner().invoke(app, args)
    output = result.output.strip()
    assert result.exit_code == 2, (args, output)
    assert "Traceback" not in output and isinstance(result.exception, SystemExit), (args, output, result.exception)
    assert len(output.splitlines()) == 1, output
    for text in must:
        assert text in output, (text, output)
    return output


def files_in(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("args", READERS)
def test_an_empty_file_is_named_with_the_fix_and_left_as_it_is(tmp_path, args):
    db = tmp_path / "results.db"
    db.write_bytes(b"")
    one_line_failure([*args, "--db", str(db)], "results.db is empty", "rpg sweep SPEC")
    assert files_in(tmp_path) == {"results.db": b""}


@pytest.mark.parametrize("args", READERS)
def test_a_new_empty_postgresql_database_is_named_with_the_fix(postgres_db, args):
    import sqlalchemy as sa

    one_line_failure([*args, "--db", postgres_db], "is empty (no rpg tables yet)", "rpg sweep SPEC")
    engine = sa.create_engine(postgres_db)
    try:
        assert sa.inspect(engine).get_table_names() == []  # nothing created
    finally:
        engine.dispose()


@pytest.mark.parametrize("args", [*READERS, ["eval", "some-run"], ["cancel", "some-run"], ["logs", "some-run"]])
def test_a_corrupted_database_file_is_named_and_left_as_it_is(tmp_path, args):
    db = tmp_path / "results.db"
    db.write_bytes(os.urandom(8192))
    before = files_in(tmp_path)
    one_line_failure([*args, "--db", str(db)], "is not a usable SQLite database", "move the file away")
    assert files_in(tmp_path) == before


@pytest.mark.parametrize("args", [*READERS, ["eval", "some-run"], ["cancel", "some-run"]])
def test_an_unknown_url_scheme_is_named(args):
    one_line_failure(
        [*args, "--db", "postgrez://me:secret@127.0.0.1/db"],
        "unknown database URL scheme 'postgrez'",
        "postgresql://",
        "me:***@",
    )


@pytest.mark.parametrize("url", ["postgresql+pg8000://me@127.0.0.1/db", "mysql://me@127.0.0.1/db"])
def test_a_driver_that_is_not_installed_is_named_with_the_fix(url):
    one_line_failure(["runs", "--db", url], "is not installed")


# A fresh interpreter in which neither PostgreSQL driver can be imported, as on a machine without them.
NO_DRIVER = textwrap.dedent(
    """
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("psycopg", "psycopg2"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Block())
    from rpg_cli.cli import app

    app(sys.argv[1:])
    """
)


def test_plain_postgresql_url_without_any_driver_says_what_to_install():
    result = subprocess.run(
        [sys.executable, "-c", NO_DRIVER, "runs", "--db", "postgresql://me@127.0.0.1/db"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (message,) = result.stderr.strip().splitlines()
    assert message.startswith("rpg runs: the database driver for postgresql (psycopg")  # SQLAlchemy's default
    assert message.endswith(
        "is not installed; pip install 'psycopg[binary]', or name the driver in the URL (postgresql+DRIVER://...)"
    )


# -------------------------------------------------------------------------------------------- read-only


@contextlib.contextmanager
def read_only(*paths: Path):
    """Make files and directories read-only to this process: their mode bits, or (as root, whom modes do
    not stop) the immutable attribute; skipped where neither holds."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in paths}
        for p in paths:
            p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(stat.S_IMODE(mode))
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root without chattr: nothing can make a file read-only to this process")
    done = []
    try:
        for p in paths:
            if subprocess.run(["chattr", "+i", str(p)], capture_output=True).returncode != 0:
                pytest.skip("running as root and this filesystem has no immutable attribute")
            done.append(p)
        yield
    finally:
        for p in done:
            subprocess.run(["chattr", "-i", str(p)], check=True)


def test_a_read_only_database_is_read_and_left_as_it_is(tmp_path):
    home = tmp_path / "ro"
    home.mkdir()
    db = f"sqlite:///{home / 'results.db'}"
    store = open_store(db)  # as rpg writes it: WAL mode
    store.record_plan(
        RunPlan(
            "ro-run-1",
            "ro-run",
            "sw",
            "local",
            {"algorithm": "grpo", "seed": 0},
            tmp_path / "runs" / "ro-run",
            ["true"],
        )
    )
    store.set_status("ro-run-1", "succeeded")  # a table scores finished runs only
    store.record_evals([eval_row(run_id="ro-run-1", step=5, n=4, value=0.375)])
    store.close()
    before = files_in(home)
    assert list(before) == ["results.db"]  # closed cleanly: no -wal, no -shm
    runner = CliRunner()
    with read_only(home / "results.db", home):
        listed = runner.invoke(app, ["runs", "--db", db, "--format", "csv"])
        assert listed.exit_code == 0 and "ro-run-1" in listed.output, listed.output
        table = runner.invoke(app, ["report", "--db", db, "--format", "csv"])
        assert table.exit_code == 0 and "0.375" in table.output, table.output
        with pytest.raises(StoreError, match="is read-only"):  # a command that records runs says so at once
            open_store(db)
        reader = open_store(db, create=False)
        try:
            with pytest.raises(StoreError, match="read-only; make it"):  # and one that writes on the way
                reader.set_status("ro-run-1", "stopped")
        finally:
            reader.close()
    assert files_in(home) == before


def test_rpg_db_names_the_store_where_db_is_not_given_and_db_wins_over_it(tmp_path, monkeypatch):
    empty, other = tmp_path / "empty.db", tmp_path / "missing.db"
    empty.write_bytes(b"")
    monkeypatch.setenv("RPG_DB", f"sqlite:///{empty}")
    for args in READERS:
        one_line_failure(list(args), "empty.db is empty")
    flag = CliRunner().invoke(app, ["runs", "--db", str(other)])  # the flag, not the environment
    assert flag.exit_code == 0 and "no runs recorded" in flag.output and "missing.db" in flag.output, flag.output
    assert files_in(tmp_path) == {"empty.db": b""}


# ------------------------------------------------------------------------------------------ a full disk


@contextlib.contextmanager
def full_sqlite():
    """Every SQLite connection opened meanwhile finds its database full: `max_page_count` (a setting of
    the connection) caps the file at its size, so the first write that needs a page fails as on a full
    disk ("database or disk is full")."""
    import sqlalchemy as sa

    def cap(dbapi_connection, connection_record):
        dbapi_connection.execute("PRAGMA max_page_count = 1")  # never below the size: the size now

    sa.event.listen(sa.pool.Pool, "connect", cap)
    try:
        yield
    finally:
        sa.event.remove(sa.pool.Pool, "connect", cap)


def test_a_full_disk_is_one_line_with_the_fix_and_the_same_command_then_works(tmp_path):
    from rpg_cli import rundir
    from rpg_cli.store import run_states

    runs = tmp_path / "runs"
    db = f"sqlite:///{runs / 'results.db'}"
    plan = RunPlan("full-1", "full", "sw", "local", {"algorithm": "grpo", "seed": 0}, runs / "sw" / "full", ["true"])
    store = open_store(db)
    store.record_plan(plan)
    store.close()
    rundir.make_run_dir(plan.run_dir)
    steps = 300  # 600 metric rows to ingest: pages the capped file cannot add
    rundir.metrics_path(plan.run_dir).write_text(
        "".join(
            f'{{"step": {s}, "data": {{"critic/score/mean": {s / steps}, "actor/pg_loss": {-s}}}}}\n'
            for s in range(1, steps + 1)
        )
    )
    cancel = ["cancel", "full", "--db", db, "--runs-dir", str(runs)]  # ingests the run's metrics, then records it
    with full_sqlite():
        one_line_failure(
            cancel,
            f"rpg cancel: the results database {db} cannot grow: its disk is full (database or disk is full)",
            "free space, then run the same command again",
        )
    assert run_states(db, [plan.id]) == {plan.id: "pending"}  # the failed write left nothing half-done
    done = CliRunner().invoke(app, cancel)  # space again: the same command
    assert done.exit_code == 0 and "stopped 1 run(s): full" in done.output, done.output
    store = open_store(db, create=False)
    try:
        assert store.latest(plan.id) == (steps, {"critic/score/mean": 1.0, "actor/pg_loss": -float(steps)})
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT COUNT(*) FROM metrics").scalar() == 2 * steps
    finally:
        store.close()
