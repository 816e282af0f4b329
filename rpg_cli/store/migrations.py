"""Schema versions: a database written by any earlier rpg opens, and is upgraded in place.

Version 1 is the schema rpg wrote before it kept a version (a file with a `runs` table and no
`schema_version` table is at version 1). To add version N: change schema.py to the new layout and add
`MIGRATIONS[N]`, a function that brings the tables of a version N-1 database there inside the opening
transaction (ALTER TABLE ... ADD COLUMN, backfills; tables new in version N are created before it
runs). A new database is created at the latest version directly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from rpg_cli.store import counts
from rpg_cli.store.schema import SAMPLES_KEY, STATUS_CHECK, Schema, schema, status_check
from rpg_cli.store.url import StoreError

# ------------------------------------------------------------------------------------------ version 2

# What `rpg eval` of version 1 sampled with when told nothing: the run's val.temperature and val.top_p
# (these defaults when its spec has none) and its response length. Frozen here: later defaults differ.
_V1_TEMPERATURE, _V1_TOP_P, _V1_SEED = 1.0, 0.7, 0
_V1_RESPONSE_LENGTH = {"2k": 2048, "4k": 4096, "8k": 8192}


def _v1_sampling(spec: Any) -> dict[str, Any]:
    spec = json.loads(spec) if isinstance(spec, str) else (spec or {})
    val = spec.get("val") or {}
    return {
        "t": float(val.get("temperature", _V1_TEMPERATURE)),
        "p": float(val.get("top_p", _V1_TOP_P)),
        "m": _V1_RESPONSE_LENGTH.get(str(spec.get("context", "4k")), _V1_RESPONSE_LENGTH["4k"]),
        "s": _V1_SEED,
    }


def _to_v2(conn: sa.Connection) -> None:
    """Version 2: sweep membership, the identity of an ingested metrics file, the sampling protocol in
    the identity of evals and samples, problems by fingerprint, one benchmark name.

    Filled in as well as a version 1 database allows: each run belongs to the sweep that created it;
    metric files are read once more from their start (their identity was not kept); a score's n is its
    own k for mean/maj/std@k of `rpg eval` and otherwise the k of its evaluation's mean@k (pass@k with
    k < n), a sample's n the number of samples of its evaluation; temperature, top_p and max_tokens
    what version 1 sampled with (the run's val settings, else its defaults), seed 0 (its default);
    samples keep their position, and `position-N` stands for the fingerprint of a problem whose text is
    not in the database (a new `rpg eval` scores it afresh, from its cached responses when they exist);
    training validation copies take the benchmark name `rpg eval` gives the same data source.
    """
    from rpg_cli.benchmarks import benchmark_name

    t = schema()
    for column, kind in (("file_id", "VARCHAR(100)"), ("fingerprint", "VARCHAR(64)"), ("lines", "BIGINT")):
        conn.exec_driver_sql(f"ALTER TABLE metric_files ADD COLUMN {column} {kind}")
    conn.exec_driver_sql("INSERT INTO sweep_runs (sweep, run_id, added_at) SELECT sweep, id, created_at FROM runs")

    specs = dict(conn.exec_driver_sql("SELECT id, spec FROM runs").all())
    for name in ("evals", "samples"):
        conn.exec_driver_sql(f"CREATE TABLE {name}_v1 AS SELECT * FROM {name}")
        conn.exec_driver_sql(f"DROP TABLE {name}")
        getattr(t, name).create(conn)
    evals = sa.text(
        "INSERT INTO evals (run_id, step, benchmark, metric, k, scorer, n, temperature, top_p, max_tokens, seed,"
        " value, scorer_version)"
        " SELECT e.run_id, e.step, e.benchmark, e.metric, e.k, e.scorer,"
        "  CASE WHEN e.scorer <> 'verl-val' AND e.metric IN ('mean@k', 'maj@k', 'std@k') THEN e.k"
        "   ELSE COALESCE((SELECT MAX(m.k) FROM evals_v1 m WHERE m.run_id = e.run_id AND m.step = e.step"
        "    AND m.benchmark = e.benchmark AND m.scorer = e.scorer AND m.metric = 'mean@k'), e.k) END,"
        "  :t, :p, :m, :s, e.value, e.scorer_version"
        " FROM evals_v1 e WHERE e.run_id = :run"
    )
    samples = sa.text(
        "INSERT INTO samples (run_id, step, benchmark, problem, sample_index, scorer, n, temperature, top_p,"
        " max_tokens, seed, position, extracted, correct, response_length)"
        " SELECT s.run_id, s.step, s.benchmark, 'position-' || CAST(s.problem AS VARCHAR(20)), s.sample_index,"
        "  s.scorer, g.n, :t, :p, :m, :s, s.problem, s.extracted, s.correct, s.response_length"
        " FROM samples_v1 s JOIN (SELECT step, benchmark, scorer, MAX(sample_index) + 1 AS n FROM samples_v1"
        "  WHERE run_id = :run GROUP BY step, benchmark, scorer) g"
        "  ON g.step = s.step AND g.benchmark = s.benchmark AND g.scorer = s.scorer"
        " WHERE s.run_id = :run"
    )
    for name, insert in (("evals", evals), ("samples", samples)):
        for run_id in conn.exec_driver_sql(f"SELECT DISTINCT run_id FROM {name}_v1").scalars().all():
            conn.execute(insert, {"run": run_id, **_v1_sampling(specs.get(run_id))})
        conn.exec_driver_sql(f"DROP TABLE {name}_v1")

    e = t.evals
    for old in conn.execute(sa.select(e.c.benchmark).where(e.c.scorer == "verl-val").distinct()).scalars().all():
        new = benchmark_name(old)
        if new == old:
            continue
        twin = e.alias("twin")
        same_key = [twin.c[c.name] == c for c in e.primary_key.columns if c.name != "benchmark"]
        clash = sa.exists().where(twin.c.benchmark == new, *same_key)
        conn.execute(e.delete().where(e.c.scorer == "verl-val", e.c.benchmark == old, clash))
        conn.execute(e.update().where(e.c.scorer == "verl-val", e.c.benchmark == old).values(benchmark=new))


def _to_v3(conn: sa.Connection) -> None:
    """Version 3: when a run's job left Ray's queue and began (runs.running_at), so that `rpg runs` shows
    the time queued and the time run apart. Unknown (NULL) for the runs recorded before."""
    kind = sa.DateTime().compile(dialect=conn.dialect)  # the type schema.py's column has on this dialect
    conn.exec_driver_sql(f"ALTER TABLE runs ADD COLUMN running_at {kind}")


def _to_v4(conn: sa.Connection) -> None:
    """Version 4: the store is the record (ingest.py). metric_files.restart_attempt, the attempt whose
    restart line the store applied (NULL for the files read before: the next restart read applies), and
    metric_files.changed, how and when the file stopped matching what was read (NULL: it never did)."""
    kinds = {c.name: c.type.compile(dialect=conn.dialect) for c in schema().metric_files.columns}
    for column in ("restart_attempt", "changed"):
        conn.exec_driver_sql(f"ALTER TABLE metric_files ADD COLUMN {column} {kinds[column]}")


def _to_v5(conn: sa.Connection) -> None:
    """Version 5: metric_files.advanced_at, when the run's last step last grew in its current attempt (NULL for
    the files read before: no stall is judged until a step arrives), and metric_files.resumed_after, the step
    that attempt resumed after (NULL: unknown, every step is judged); runs.status takes every state of
    states.STATUSES (`preempted` is new). A column already there is kept (a database laid out from this
    schema and marked older)."""
    columns = schema().metric_files.c
    have = {c["name"] for c in sa.inspect(conn).get_columns("metric_files")}
    for name in ("advanced_at", "resumed_after"):
        if name not in have:
            kind = columns[name].type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE metric_files ADD COLUMN {name} {kind}")
    renew_status_check(conn)


def renew_status_check(conn: sa.Connection) -> None:
    """Make runs.status take states.STATUSES as they are now. Every state so far only adds to the list, so no
    stored row can break it. SQLite cannot alter a constraint: the table's CREATE text is rewritten in place,
    as SQLite's documentation allows for a CHECK (ALTER TABLE, "other kinds of table schema changes": its
    writable_schema procedure, the schema cookie bumped), without copying the table its runs' rows hang on."""
    condition = status_check()
    dialect = conn.dialect.name
    if dialect == "sqlite":
        found = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'").scalar()
        renewed = re.sub(r"CHECK\s*\(\s*status IN \([^)]*\)\s*\)", f"CHECK ({condition})", found or "", flags=re.I)
        if not found or renewed == found:
            return  # already the states of now (or a layout without the check: nothing to renew)
        cookie = conn.exec_driver_sql("PRAGMA schema_version").scalar()
        conn.exec_driver_sql("PRAGMA writable_schema = ON")
        try:
            conn.exec_driver_sql("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'runs'", (renewed,))
            conn.exec_driver_sql(f"PRAGMA schema_version = {int(cookie) + 1}")
        finally:
            conn.exec_driver_sql("PRAGMA writable_schema = OFF")
        return
    drop = "DROP CHECK" if dialect == "mysql" else "DROP CONSTRAINT IF EXISTS"
    conn.exec_driver_sql(f"ALTER TABLE runs {drop} {STATUS_CHECK}")
    conn.exec_driver_sql(f"ALTER TABLE runs ADD CONSTRAINT {STATUS_CHECK} CHECK ({condition})")


def _to_v6(conn: sa.Connection) -> None:
    """Version 6: the samples keyed by evaluation first (schema.SAMPLES_KEY), so that the scores of the
    evaluations a report shows are read as key ranges, in key order; on SQLite a WITHOUT ROWID table (the
    11-column key was stored twice: in the rows and in its index). Every row is kept: SQLite copies the table
    in the new key's order (it cannot change a key in place), PostgreSQL and MySQL rebuild the key's index.
    A table already laid out so (a database created by a version 2 upgrade of this rpg) is left as it is.
    And metrics, evals and samples lose their foreign key to runs (schema.py says why)."""
    _drop_run_foreign_keys(conn)
    key = list(SAMPLES_KEY)
    found = sa.inspect(conn).get_pk_constraint("samples")
    dialect = conn.dialect.name
    if dialect == "sqlite":
        ddl = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'samples'").scalar()
        if found["constrained_columns"] == key and "WITHOUT ROWID" in (ddl or "").upper():
            return
        columns = ", ".join(c.name for c in schema().samples.columns)
        conn.exec_driver_sql("ALTER TABLE samples RENAME TO samples_v5")
        schema().samples.create(conn)
        conn.exec_driver_sql(
            f"INSERT INTO samples ({columns}) SELECT {columns} FROM samples_v5 ORDER BY {', '.join(key)}"
        )
        conn.exec_driver_sql("DROP TABLE samples_v5")
        return
    if found["constrained_columns"] == key:
        return
    if dialect in ("mysql", "mariadb"):
        conn.exec_driver_sql(f"ALTER TABLE samples DROP PRIMARY KEY, ADD PRIMARY KEY ({', '.join(key)})")
        return
    name = found.get("name") or "samples_pkey"
    conn.exec_driver_sql(f'ALTER TABLE samples DROP CONSTRAINT "{name}"')
    conn.exec_driver_sql(f"ALTER TABLE samples ADD CONSTRAINT samples_pkey PRIMARY KEY ({', '.join(key)})")


def _drop_run_foreign_keys(conn: sa.Connection) -> None:
    """PostgreSQL and MySQL: drop the foreign keys of metrics, evals and samples (SQLite never enforced them;
    its samples table is rebuilt without one, the others keep the unenforced words)."""
    if conn.dialect.name == "sqlite":
        return
    inspector = sa.inspect(conn)
    quote = conn.dialect.identifier_preparer.quote
    for table in ("metrics", "evals", "samples"):
        for fk in inspector.get_foreign_keys(table):
            if fk.get("name"):
                drop = "DROP FOREIGN KEY" if conn.dialect.name in ("mysql", "mariadb") else "DROP CONSTRAINT"
                conn.exec_driver_sql(f"ALTER TABLE {table} {drop} {quote(fk['name'])}")


def _to_v7(conn: sa.Connection) -> None:
    """Version 7: a run's device time (rpg_cli/cost.py). runs.held_s, the seconds it held its devices in the
    attempts that ended (0 for the runs recorded before: their device time was never measured), and runs.held_at,
    when its current attempt began holding them (NULL: not yet, or unknown). A column already there is kept (a
    database laid out from this schema and marked older)."""
    columns = schema().runs.c
    have = {c["name"] for c in sa.inspect(conn).get_columns("runs")}
    if "held_s" not in have:
        kind = columns.held_s.type.compile(dialect=conn.dialect)
        conn.exec_driver_sql(f"ALTER TABLE runs ADD COLUMN held_s {kind} DEFAULT 0 NOT NULL")
    if "held_at" not in have:
        conn.exec_driver_sql(
            f"ALTER TABLE runs ADD COLUMN held_at {columns.held_at.type.compile(dialect=conn.dialect)}"
        )


def _to_v8(conn: sa.Connection) -> None:
    """Version 8: each evaluation's problems with their samples counted (problem_counts, kept with the samples
    from now on: counts.py), filled from the samples stored, so that a report reads a row per problem."""
    counts.backfill(conn, schema())


# version -> the upgrade from version - 1
MIGRATIONS: dict[int, Callable[[sa.Connection], None]] = {
    2: _to_v2,
    3: _to_v3,
    4: _to_v4,
    5: _to_v5,
    6: _to_v6,
    7: _to_v7,
    8: _to_v8,
}
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
