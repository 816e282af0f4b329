"""Many rows into one table, in each dialect's fastest words: what ingestion writes (metrics, evals, samples).

SQLite: one prepared INSERT ... ON CONFLICT run by the driver's executemany (in process: no round trips).
PostgreSQL: one INSERT per row is one round trip and one executor start per row (10-16x SQLite's time), so a
batch is COPYed straight into its table when every key is new (ingestion's usual case); else, back at a
savepoint, into a temporary table and moved by ONE `INSERT ... SELECT ... ON CONFLICT`; small batches (a live
run's few new lines) keep executemany, which costs less than a savepoint and a COPY, and so does psycopg2
(COPY through psycopg 3's API). MySQL: executemany.

Same semantics on every path: `replace` upserts (a key already stored takes the new row; within one batch the
last row of a key wins, as it would row by row), else only rows whose key is new are inserted (within one
batch the first row of a key). Rows are written in primary-key order (Python's, the same for every writer): two
writers of overlapping rows lock them in the same order and wait for each other instead of deadlocking.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from rpg_cli.store.url import StoreError

COPY_MIN_ROWS = 64  # PostgreSQL: from this many rows the temporary table pays for itself
UNIQUE_VIOLATION = "23505"  # PostgreSQL's SQLSTATE for a key stored already


def insert_new(dialect: str, table: sa.Table) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING, in the dialect's own words: a row inserted unless one with its
    primary key exists, in one statement (a check, then an insert, races another process)."""
    if dialect in ("sqlite", "postgresql"):
        insert = _dialect_insert(dialect)
        return insert(table).on_conflict_do_nothing(index_elements=[c.name for c in table.primary_key.columns])
    if dialect in ("mysql", "mariadb"):
        return table.insert().prefix_with("IGNORE")
    raise StoreError(f"rpg's store supports SQLite, PostgreSQL and MySQL URLs, not {dialect!r}; change --db")


def upsert(dialect: str, table: sa.Table, select: sa.Select | None = None) -> Any:
    """INSERT ... ON CONFLICT (primary key) DO UPDATE, in the dialect's own words; with `select`, of the rows it
    makes (INSERT ... SELECT: its columns in the table's column order)."""
    keys = [c.name for c in table.primary_key.columns]
    names = [c.name for c in table.columns]
    if dialect in ("sqlite", "postgresql", "mysql", "mariadb"):
        if dialect in ("mysql", "mariadb"):
            from sqlalchemy.dialects.mysql import insert
        else:
            insert = _dialect_insert(dialect)
        stmt = insert(table) if select is None else insert(table).from_select(names, select)
        if dialect in ("mysql", "mariadb"):
            return stmt.on_duplicate_key_update({n: stmt.inserted[n] for n in names if n not in keys})
        return stmt.on_conflict_do_update(
            index_elements=keys, set_={n: stmt.excluded[n] for n in names if n not in keys}
        )
    raise StoreError(f"rpg's store supports SQLite, PostgreSQL and MySQL URLs, not {dialect!r}; change --db")


def _dialect_insert(dialect: str) -> Any:
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    return insert


def key_order(table: sa.Table, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """`rows` (tuples in the table's column order) sorted by primary key; stable, so a key's rows keep their order."""
    names = table.columns.keys()
    return sorted(rows, key=operator.itemgetter(*(names.index(c.name) for c in table.primary_key.columns)))


def bulk_upsert(conn: sa.Connection, table: sa.Table, rows: Sequence[tuple[Any, ...]], replace: bool = True) -> None:
    """Write `rows`, tuples in the table's column order, inside the caller's transaction (module docstring:
    `replace` False inserts only new keys). Never SQLAlchemy's per-row parameter processing: it would triple the
    cost of ingestion."""
    if not rows:
        return
    if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg" and len(rows) >= COPY_MIN_ROWS:
        _copy_upsert(conn, table, rows, replace)
        return
    sql, order = _statement(conn.dialect, table, replace)
    if order is None:
        params: Any = [dict(zip(table.columns.keys(), r)) for r in rows]
    else:
        params = rows if order == list(range(len(order))) else [tuple(r[i] for i in order) for r in rows]
    conn.exec_driver_sql(sql, params)


_COMPILED: dict[tuple[Any, ...], tuple[str, list[int] | None]] = {}


def _statement(dialect: sa.Dialect, table: sa.Table, replace: bool) -> tuple[str, list[int] | None]:
    """The driver's SQL of the upsert (or insert-new) of `table`, and where each parameter is in a row (None:
    named parameters); compiled once per dialect and table, not at every one of a watcher's many small writes."""
    cache_key = (dialect.name, dialect.driver, dialect.paramstyle, table.name, replace)
    if cache_key not in _COMPILED:
        statement = upsert(dialect.name, table) if replace else insert_new(dialect.name, table)
        compiled = statement.compile(dialect=dialect, column_keys=[c.name for c in table.columns])
        names = table.columns.keys()
        order = [names.index(name) for name in compiled.positiontup] if compiled.positional else None
        _COMPILED[cache_key] = (compiled.string, order)
    return _COMPILED[cache_key]


def _one_per_key(table: sa.Table, rows: Sequence[tuple[Any, ...]], replace: bool) -> list[tuple[Any, ...]]:
    """One row per primary key, as row-by-row writing would leave it: the last (`replace`) or the first. One
    INSERT ... SELECT may not update a row twice (PostgreSQL: "cannot affect row a second time")."""
    names = table.columns.keys()
    index = [names.index(c.name) for c in table.primary_key.columns]
    key = operator.itemgetter(*index)
    kept: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for row in rows:
        if replace or key(row) not in kept:
            kept[key(row)] = row
    return list(kept.values())


def _copy_upsert(conn: sa.Connection, table: sa.Table, rows: Sequence[tuple[Any, ...]], replace: bool) -> None:
    """PostgreSQL: COPY the rows, in key order, straight into `table` when every key is new (ingestion's usual
    case: no ON CONFLICT, no second pass; 15-20% faster than through the twin below); else, back at a savepoint,
    COPY them into a temporary twin of `table` and move them by one `INSERT ... SELECT ... ON CONFLICT`. The twin
    lives as long as the connection (created once: a table made and dropped per transaction costs more than the
    COPY), emptied at each commit (ON COMMIT DELETE ROWS: a truncation) and before each use (one transaction may
    write a table several times)."""
    quote = conn.dialect.identifier_preparer.quote
    names = table.columns.keys()
    keys = [quote(c.name) for c in table.primary_key.columns]
    columns = ", ".join(quote(name) for name in names)
    # key order (Python's: every writer's the same) is what keeps two writers of overlapping rows from deadlocking
    ordered = key_order(table, _one_per_key(table, rows, replace))
    try:
        with conn.begin_nested():
            _copy(conn, quote(table.name), columns, ordered)
        return
    except sa.exc.IntegrityError as exc:
        if getattr(exc.orig, "sqlstate", None) != UNIQUE_VIOLATION:
            raise
    # some key is stored already (or another writer stored it meanwhile): upsert through the twin
    twin = quote(f"rpg_bulk_{table.name}")
    conn.exec_driver_sql(
        f"CREATE TEMPORARY TABLE IF NOT EXISTS {twin} (LIKE {quote(table.name)}) ON COMMIT DELETE ROWS"
    )
    conn.exec_driver_sql(f"DELETE FROM {twin}")
    _copy(conn, twin, columns, ordered)
    if replace:
        updates = ", ".join(f"{quote(n)} = EXCLUDED.{quote(n)}" for n in names if quote(n) not in keys)
        action = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
    else:
        action = "DO NOTHING"
    # no ORDER BY: PostgreSQL's sort of an 11-column key costs as much as the insert, and a scan of a table this
    # transaction filled returns its rows in the order they went in
    conn.exec_driver_sql(
        f"INSERT INTO {quote(table.name)} ({columns}) SELECT {columns} FROM {twin} ON CONFLICT ({', '.join(keys)}) "
        f"{action}"
    )


def _copy(conn: sa.Connection, target: str, columns: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """COPY `rows` into `target` (quoted) through psycopg 3's COPY protocol (pyproject's `postgres` extra)."""
    raw = conn.connection.driver_connection
    sql = f"COPY {target} ({columns}) FROM STDIN"
    base = conn.dialect.loaded_dbapi.Error
    try:
        with raw.cursor() as cursor, cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)
    except base as exc:  # the driver's own error (COPY bypasses SQLAlchemy): as SQLAlchemy would raise it
        raise sa.exc.DBAPIError.instance(sql, None, exc, base) from None
