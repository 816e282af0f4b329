"""Opening the results store: a --db URL to a live `Store`, every problem on the way one line.

The SQLite file and its directory checked (created only for the commands that record runs; read-only where the
user cannot write), the driver chosen (psycopg for PostgreSQL), SQLite in WAL mode with a busy timeout and
`BEGIN IMMEDIATE` writes, so several processes share one file; an older schema upgraded in place, one process at
a time (migrations.py); an open that SQLite answers "locked" at once started over.
"""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from rpg_cli import rundir
from rpg_cli.store import migrations
from rpg_cli.store.db import Store, error_reason
from rpg_cli.store.url import (
    DEFAULT_DB_URL,
    SQLITE_BUSY_TIMEOUT_S,
    EmptyStoreError,
    NoStoreError,
    StoreError,
    display_url,
    normalize_url,
    sqlite_path,
)


def open_store(db_url: str = DEFAULT_DB_URL, create: bool = True) -> Store:
    """Open the database at `db_url`, upgrading an older schema in place (migrations.py). With
    `create` (the commands that record runs) create what is missing: parent directory, file, tables.

    Without `create` (the commands that read) nothing is created or changed but an upgrade: a missing
    SQLite file is a NoStoreError; a file the user cannot write is read as it is (read-only); an
    empty database (no rpg tables) is a StoreError. Every problem with the URL, its driver, the
    server or the file is a StoreError with one line naming it and the fix; no traceback.
    """
    url = normalize_url(db_url)
    shown = display_url(url)
    path = sqlite_path(url)
    read_only = False
    if path:
        file = Path(path)
        _check_sqlite_files(path, create)
        if file.is_dir():
            raise StoreError(f"{path} is a directory, not a results database; pass --db FILE (e.g. {path}/results.db)")
        if not create and not file.parent.is_dir() and normalize_url(db_url) != DEFAULT_DB_URL:
            raise StoreError(f"no directory {file.parent} for the results database {path}; check --db")
        if not create and not file.is_file():
            raise NoStoreError(f"no results database at {path}; run `rpg sweep SPEC` first, or pass --db URL")
        if create:
            try:
                file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create {file.parent} for the results database ({exc.strerror}); "
                    "pass --db PATH in a directory you can write"
                ) from None
        writable = os.access(file.parent, os.W_OK) and (not file.exists() or os.access(file, os.W_OK))
        if not writable and create:
            raise StoreError(
                f"the results database {path} is read-only (it or its directory); make it writable, or pass --db PATH"
            )
        read_only = not writable
    # SQLite answers "database is locked" at once, busy timeout or not, where waiting could deadlock (two processes
    # creating one file together, as two `rpg sweep` of one grid do): the open is idempotent, so it starts over
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            return _open(url, shown, path, read_only, create)
        except _Locked as locked:
            if time.monotonic() > deadline:
                raise StoreError(str(locked)) from None
            time.sleep(random.uniform(0.05, 0.2))


class _Locked(Exception):
    """SQLite's "database is locked" while opening (open_store tries again)."""


def _open(url: str, shown: str, path: str | None, read_only: bool, create: bool) -> Store:
    engine = _engine(url, shown, path, read_only)
    if path is not None:
        _configure_sqlite(engine, journal=create)
    store = Store(engine)
    try:
        with engine.connect() as conn:  # reading the version takes no write lock: `rpg runs` never waits here
            version = migrations.current_version(conn, store.t)
        if not version and not create:
            raise EmptyStoreError(
                f"the results database {path or shown} is empty (no rpg tables yet); "
                "run `rpg sweep SPEC` to create them, or pass --db URL"
            )
        if version != migrations.LATEST:
            if read_only:
                raise StoreError(
                    f"the results database {path} is at schema version {version} and read-only: open it once with "
                    "write access (e.g. `rpg runs`) to upgrade it"
                )
            with store._write() as conn:  # one transaction: concurrent openers serialize
                _serialize_migrations(conn)
                migrations.migrate(conn, store.t)
    except sa.exc.DBAPIError as exc:
        engine.dispose()
        if path is not None and "database is locked" in str(exc.orig):
            raise _Locked(_unusable(exc, path, shown)) from None
        raise StoreError(_unusable(exc, path, shown)) from None
    except BaseException:
        engine.dispose()
        raise
    return store


# any fixed number: the PostgreSQL advisory lock that rpg's openers take to create or upgrade the schema
_MIGRATION_LOCK = 0x7270675F736368  # "rpg_sch"


def _serialize_migrations(conn: sa.Connection) -> None:
    """Make concurrent openers create or upgrade the schema one after the other (migrate reads the version
    again inside): SQLite's BEGIN IMMEDIATE does it; on PostgreSQL, a lock held to the end of the
    transaction (two creators' CREATE TABLE would otherwise collide on the catalog: pg_type's key)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_MIGRATION_LOCK)))


def _check_sqlite_files(path: str, create: bool) -> None:
    """The database file and SQLite's own beside it under rundir.py's rule for a shared runs/: never a
    link (a database created or written at a planted path); to write, the user's own and nobody else's
    to write. Reading someone else's file is fine."""
    for part in (path, *(f"{path}{suffix}" for suffix in rundir.SQLITE_SIDE_FILES)):
        try:
            info = os.lstat(part)
        except OSError:
            continue
        try:
            if create or stat.S_ISLNK(info.st_mode):
                rundir.check_owned(part, info)
        except rundir.UnsafePathError as exc:
            raise StoreError(f"the results database: {rundir.os_error_line(exc)}") from None


def _engine(url: str, shown: str, path: str | None, read_only: bool) -> sa.Engine:
    """The engine for `url`: a driver that is installed, SQLite read-only when the file cannot be written."""
    if path is not None:
        if read_only:
            # No -wal file: no writer is live and the file is the whole database; read it as immutable
            # (read-only WAL access would need to create -shm beside it). Else share the writer's files.
            flags = "mode=ro" + ("" if Path(f"{path}-wal").exists() else "&immutable=1")
            uri = f"{Path(path).resolve().as_uri()}?{flags}"
            return sa.create_engine(
                "sqlite://",
                creator=lambda: sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_S, check_same_thread=False),
            )
        return sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
    scheme = url.split("://", 1)[0]
    if scheme in ("postgresql", "postgres"):  # no driver named: one that is installed (SQLAlchemy's
        # default is psycopg2 up to 2.0, psycopg from 2.1: either works)
        scheme = next((f"postgresql+{d}" for d in ("psycopg", "psycopg2") if _importable(d)), "postgresql")
        url = f"{scheme if scheme != 'postgres' else 'postgresql'}://{url.split('://', 1)[1]}"
    try:
        return sa.create_engine(url, pool_pre_ping=True)  # a pooled connection to a restarted server is replaced
    except sa.exc.NoSuchModuleError:
        raise StoreError(
            f"unknown database URL scheme {scheme!r} in --db {shown}; use sqlite:///FILE (or a file path) "
            "or postgresql://USER@HOST/DATABASE"
        ) from None
    except sa.exc.ArgumentError as exc:
        raise StoreError(
            f"--db {shown} is not a database URL ({exc}); use sqlite:///FILE or postgresql://..."
        ) from None
    except ValueError:  # e.g. a port that is not a number: the text would quote part of the password
        raise StoreError(
            f"--db {shown} is not a valid database URL; percent-encode the special characters of the "
            "password (@ is %40, : is %3A, / is %2F)"
        ) from None
    except ImportError as exc:
        driver = exc.name or str(exc)
        hint = (
            "pip install 'psycopg[binary]'" if scheme == "postgresql" else f"install the package that provides {driver}"
        )
        raise StoreError(
            f"the database driver for {scheme} ({driver}) is not installed; {hint}, or name the driver in "
            f"the URL ({scheme.split('+')[0]}+DRIVER://...)"
        ) from None


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or blocked module is as good as none
        return False


def _unusable(exc: sa.exc.DBAPIError, path: str | None, shown: str) -> str:
    """One line for a database that would not open."""
    reason = error_reason(exc)
    if path is not None:
        if "not a database" in reason or "malformed" in reason:
            return (
                f"{path} is not a usable SQLite database ({reason}); point --db at rpg's results database, "
                "or move the file away to start a new one"
            )
        return f"cannot open the results database {path} ({reason}); check the file and its directory, or pass --db"
    return f"cannot use the results database {shown} ({reason}); check the URL, the server and your access"


def _configure_sqlite(engine: sa.Engine, journal: bool) -> None:
    """Busy timeout and BEGIN IMMEDIATE for writes; with `journal` (a writer's open), WAL mode, which
    the file keeps: a reader never changes the file, so a read-only or empty file stays as it is."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        if journal:
            cursor.execute("PRAGMA journal_mode = WAL")  # readers never block the writer, nor it them
        cursor.execute("PRAGMA synchronous = NORMAL")  # durable at every checkpoint; safe with WAL
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("rpg_write") else "BEGIN")
