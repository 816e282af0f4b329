"""The one read `rpg sweep --dry-run` needs, without SQLAlchemy (~0.3 s to import, more than the dry
run may take): the states of some runs, read from SQLite with the standard library."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rpg_cli.store.url import SQLITE_BUSY_TIMEOUT_S, sqlite_path


def run_states(db_url: str, ids: Iterable[str]) -> dict[str, str]:
    """{run id: status} for the ids the store knows; {} when there is no database yet.

    Read-only: SQLite is read in read-only mode, so nothing is created; other URLs go through the
    store (SQLAlchemy).
    """
    return _runs_column(db_url, ids, "status")


def run_sweeps(db_url: str, ids: Iterable[str]) -> dict[str, str]:
    """{run id: the sweep that created it} for the ids the store knows (read as `run_states`)."""
    return _runs_column(db_url, ids, "sweep")


def _runs_column(db_url: str, ids: Iterable[str], column: str) -> dict[str, str]:
    ids = list(ids)
    path = sqlite_path(db_url)
    if path is None:
        return _run_states_sqlalchemy(db_url, ids, column)
    if not path or not Path(path).is_file() or not ids:
        return {}
    import sqlite3

    # With no -wal file no writer is live and the main file is the whole database: read it as
    # immutable, which creates no -wal/-shm files (plain read-only WAL access would create them).
    # With a live writer those files exist already and a read-only connection shares them.
    flags = "mode=ro" + ("" if Path(f"{path}-wal").exists() else "&immutable=1")
    con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?{flags}", uri=True, timeout=SQLITE_BUSY_TIMEOUT_S)
    try:
        states: dict[str, str] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            states.update(con.execute(f"SELECT id, {column} FROM runs WHERE id IN ({marks})", chunk).fetchall())
        return states
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return {}
        raise
    finally:
        con.close()


def _run_states_sqlalchemy(db_url: str, ids: list[str], column: str) -> dict[str, str]:
    import sqlalchemy as sa

    from rpg_cli.store.db import Store

    engine = sa.create_engine(db_url)
    try:
        if not ids or not sa.inspect(engine).has_table("runs"):
            return {}
        return {r.id: getattr(r, column) for r in Store(engine).runs(ids=ids)}
    finally:
        engine.dispose()
