"""Schema versions: a database written by any earlier rpg opens, and is upgraded in place.

Version 1 is the schema rpg wrote before it kept a version (a file with a `runs` table and no
`schema_version` table is at version 1). To add version N: change schema.py to the new layout and add
`MIGRATIONS[N]`, a function that brings the tables of a version N-1 database there inside the opening
transaction (ALTER TABLE ... ADD COLUMN, backfills; tables new in version N are created before it
runs). A new database is created at the latest version directly.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from rpg_cli.store.schema import Schema
from rpg_cli.store.url import StoreError

# version -> the upgrade from version - 1
MIGRATIONS: dict[int, Callable[[sa.Connection], None]] = {}
LATEST = max(MIGRATIONS, default=1)


def current_version(conn: sa.Connection, t: Schema) -> int:
    """The schema version of the database on `conn`; 0 when it has no rpg tables yet."""
    tables = set(sa.inspect(conn).get_table_names())
    if t.schema_version.name in tables:
        return conn.execute(sa.select(sa.func.max(t.schema_version.c.version))).scalar() or 1
    return 1 if "runs" in tables else 0


def migrate(conn: sa.Connection, t: Schema) -> int:
    """Bring the database on `conn` to the latest version, creating it when it has no rpg tables;
    returns the version it was at. Runs inside the caller's write transaction."""
    version = current_version(conn, t)
    if version > LATEST:
        raise StoreError(
            f"the results database is at schema version {version}, newer than this rpg knows ({LATEST}); "
            "upgrade rpg-cli"
        )
    if version == LATEST:
        return version
    t.metadata.create_all(conn)  # a new database: the latest layout; an older one: the tables it lacked
    if version:
        for step in range(version + 1, LATEST + 1):
            MIGRATIONS[step](conn)
    conn.execute(t.schema_version.delete())
    conn.execute(t.schema_version.insert().values(version=LATEST))
    return version
