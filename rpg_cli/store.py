"""The results store: sweeps, runs and their states, training metrics, eval scores and samples.

One SQLAlchemy database (SQLite at `runs/results.db` by default, any SQLAlchemy URL via `--db`).
SQLite runs in WAL mode with a busy timeout, and every write transaction starts with
`BEGIN IMMEDIATE`, so several processes (sweep watchers, evaluators, `rpg runs`) can share one file
without losing rows or failing on lock upgrades.

SQLAlchemy costs ~0.3 s to import, and `rpg sweep --dry-run` must answer in well under that: so this
module imports it lazily (the schema is built on first use) and `run_states` reads SQLite with the
standard library only.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import sqlalchemy as sa

    from rpg_cli.plan import RunPlan

DEFAULT_DB_URL = "sqlite:///runs/results.db"
STATUSES = ("pending", "submitted", "running", "succeeded", "failed", "stopped")
TERMINAL = frozenset({"succeeded", "failed", "stopped"})
SQLITE_BUSY_TIMEOUT_S = 60.0
ERROR_TAIL_CHARS = 2000


class StoreError(RuntimeError):
    """A store problem the user can fix (missing database, unsupported URL); one-line message."""


def normalize_url(db: str) -> str:
    """Accept a SQLAlchemy URL, or a bare file path meaning a SQLite database there."""
    return db if "://" in db else f"sqlite:///{db}"


def sqlite_path(db_url: str) -> str | None:
    """The file of a SQLite URL ('' for an in-memory one); None when the URL is not SQLite."""
    scheme, sep, rest = normalize_url(db_url).partition("://")
    if not sep or scheme.split("+")[0] != "sqlite":
        return None
    path = rest[1:] if rest.startswith("/") else rest  # sqlite:///rel -> 'rel', sqlite:////abs -> '/abs'
    path = path.split("?", 1)[0]
    return "" if path in ("", ":memory:") else path


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # naive UTC: identical on every dialect


# ---------------------------------------------------------------------------------------- schema


class Schema(NamedTuple):
    metadata: sa.MetaData
    sweeps: sa.Table
    runs: sa.Table
    metrics: sa.Table
    metric_files: sa.Table
    evals: sa.Table
    samples: sa.Table


@functools.cache
def schema() -> Schema:
    """The tables (built on first use so that importing this module does not import SQLAlchemy)."""
    import sqlalchemy as sa

    md = sa.MetaData()
    run_fk = functools.partial(sa.ForeignKey, "runs.id", ondelete="CASCADE")
    sweeps = sa.Table(
        "sweeps",
        md,
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    statuses = ", ".join(f"'{s}'" for s in STATUSES)
    runs = sa.Table(
        "runs",
        md,
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("sweep", sa.String(200), sa.ForeignKey("sweeps.name"), nullable=False, index=True),
        sa.Column("name", sa.String(300), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("backend", sa.String(16), nullable=False),
        sa.Column("run_dir", sa.String(1000), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("submission_id", sa.String(100)),
        sa.Column("attempts", sa.Integer, nullable=False, default=0),
        sa.Column("created_at", sa.DateTime, nullable=False),  # all timestamps: naive UTC
        sa.Column("started_at", sa.DateTime),
        sa.Column("finished_at", sa.DateTime),
        sa.Column("error", sa.Text),  # the last ERROR_TAIL_CHARS of the failure message / log
        sa.CheckConstraint(f"status IN ({statuses})", name="runs_status"),
    )
    # Primary key (run, key, step): unique on the three, and ordered so that "latest value of key k
    # for run r" is one index seek. WITHOUT ROWID on SQLite: the key is the row, no second b-tree.
    metrics = sa.Table(
        "metrics",
        md,
        sa.Column("run_id", sa.String(64), run_fk(), primary_key=True),
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("value", sa.Float),  # NULL stands for NaN (SQLite cannot store NaN)
        sqlite_with_rowid=False,
    )
    # How far each run's metrics.jsonl has been ingested, so re-ingesting reads only new bytes.
    metric_files = sa.Table(
        "metric_files",
        md,
        sa.Column("run_id", sa.String(64), run_fk(), primary_key=True),
        sa.Column("path", sa.String(1000), nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("last_step", sa.Integer),
    )
    evals = sa.Table(
        "evals",
        md,
        sa.Column("run_id", sa.String(64), run_fk(), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("benchmark", sa.String(100), primary_key=True),
        sa.Column("metric", sa.String(16), primary_key=True),  # mean@k | pass@k | maj@k
        sa.Column("k", sa.Integer, primary_key=True),
        sa.Column("scorer", sa.String(100), primary_key=True),
        sa.Column("value", sa.Float),
        sa.Column("scorer_version", sa.String(100)),
    )
    samples = sa.Table(
        "samples",
        md,
        sa.Column("run_id", sa.String(64), run_fk(), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("benchmark", sa.String(100), primary_key=True),
        sa.Column("problem", sa.Integer, primary_key=True),  # the problem's index in its benchmark
        sa.Column("sample_index", sa.Integer, primary_key=True),
        sa.Column("scorer", sa.String(100), primary_key=True),
        sa.Column("extracted", sa.Text),  # the extracted answer, NULL when none was found
        sa.Column("correct", sa.Boolean, nullable=False),
        sa.Column("response_length", sa.Integer),
    )
    return Schema(md, sweeps, runs, metrics, metric_files, evals, samples)


@dataclass(frozen=True)
class RunRecord:
    id: str
    sweep: str
    name: str
    backend: str
    spec: dict[str, Any]
    run_dir: Path
    status: str
    submission_id: str | None
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"


# ------------------------------------------------------------------------------ metrics.jsonl parsing


def _parse_record(line: bytes) -> tuple[int, dict[str, Any]] | None:
    """One verl file-logger line `{"step": N, "data": {...}}`; None when it is not one."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    step, data = obj.get("step"), obj.get("data")
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(data, dict):
        return None
    return step, data


def parse_metric_lines(chunk: bytes) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """Parse the records in `chunk`; return them and how many bytes were consumed.

    A last line without its newline is consumed only if it is a complete record: a writer caught
    mid-line leaves invalid JSON there, which is left for the next ingestion. Complete lines that are
    not records (blank, garbage) are consumed and skipped.
    """
    lines = chunk.split(b"\n")
    tail = lines.pop()
    records, consumed = [], 0
    for line in lines:
        consumed += len(line) + 1
        if line.strip() and (rec := _parse_record(line)) is not None:
            records.append(rec)
    if tail.strip() and (rec := _parse_record(tail)) is not None:
        records.append(rec)
        consumed += len(tail)
    return records, consumed


def _metric_rows(run_id: str, records: list[tuple[int, dict[str, Any]]]) -> list[tuple[str, str, int, float | None]]:
    """(run_id, key, step, value) rows of the numeric values (strings, lists, dicts, None are skipped),
    grouped by key, so that they reach the (run, key, step) b-tree nearly in order: appends instead of
    scattered page writes. Within a key the file's order is kept, so a step logged twice keeps its last value."""
    by_key: dict[str, list[tuple[str, str, int, float | None]]] = defaultdict(list)
    for step, data in records:
        for key, value in data.items():
            if isinstance(value, (int, float)):
                by_key[key].append((run_id, key, step, None if value != value else float(value)))  # NaN -> NULL
    return [row for key in sorted(by_key) for row in by_key[key]]


# ------------------------------------------------------------------------------------------- store


class Store:
    """A handle on the results database. Methods open short transactions; safe across processes."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        self.t = schema()
        # SQLite: writes begin IMMEDIATE (take the write lock up front, honouring the busy timeout)
        # instead of upgrading a read lock mid-transaction, which fails at once under contention.
        self._writer = engine.execution_options(rpg_write=True)

    def close(self) -> None:
        self.engine.dispose()

    # -- runs ---------------------------------------------------------------------------------

    def record_plan(self, plan: RunPlan, sweep: str | None = None) -> None:
        self.record_plans([plan], sweep)

    def record_plans(self, plans: Iterable[RunPlan], sweep: str | None = None) -> None:
        """Insert runs that are new (status pending); refresh name/spec/dir of known ones, keep their state."""
        import sqlalchemy as sa

        t = self.t
        with self._writer.begin() as conn:
            for plan in plans:
                sweep_name = sweep or plan.sweep
                if conn.execute(sa.select(t.sweeps.c.name).where(t.sweeps.c.name == sweep_name)).first() is None:
                    conn.execute(t.sweeps.insert().values(name=sweep_name, created_at=_now()))
                fields = {
                    "sweep": sweep_name,
                    "name": plan.name,
                    "spec": plan.spec,
                    "backend": plan.backend,
                    "run_dir": str(Path(plan.run_dir).resolve()),
                }
                known = conn.execute(t.runs.update().where(t.runs.c.id == plan.id).values(**fields)).rowcount
                if not known:
                    conn.execute(
                        t.runs.insert().values(id=plan.id, status="pending", attempts=0, created_at=_now(), **fields)
                    )

    def run(self, run_id: str) -> RunRecord | None:
        found = self.runs(ids=[run_id])
        return found[0] if found else None

    def runs(
        self,
        sweep: str | None = None,
        status: str | Iterable[str] | None = None,
        ids: Iterable[str] | None = None,
        name: str | None = None,
    ) -> list[RunRecord]:
        """Runs matching every filter given, ordered by sweep, then creation."""
        import sqlalchemy as sa

        c = self.t.runs.c
        query = sa.select(self.t.runs).order_by(c.sweep, c.created_at, c.name)
        if sweep is not None:
            query = query.where(c.sweep == sweep)
        if status is not None:
            query = query.where(c.status.in_([status] if isinstance(status, str) else list(status)))
        if ids is not None:
            query = query.where(c.id.in_(list(ids)))
        if name is not None:
            query = query.where(c.name == name)
        with self.engine.connect() as conn:
            return [_run_record(row) for row in conn.execute(query).mappings()]

    def sweeps(self) -> list[str]:
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(self.t.sweeps.c.name).order_by(self.t.sweeps.c.created_at)).scalars())

    def resolve(self, ref: str) -> list[RunRecord]:
        """Runs a user refers to: a run id, a unique id prefix, a run name, or a sweep name."""
        for found in (self.runs(ids=[ref]), self.runs(name=ref), self.runs(sweep=ref)):
            if found:
                return found
        by_prefix = [r for r in self.runs() if r.id.startswith(ref)] if len(ref) >= 4 else []
        return by_prefix if len(by_prefix) == 1 else []

    def set_status(
        self,
        run_id: str,
        status: str,
        error: str | None = None,
        submission_id: str | None = None,
        at: datetime | None = None,
        started_at: datetime | None = None,
    ) -> None:
        """Move a run to `status` at time `at` (default now).

        Stamps started_at (once; `started_at` if given, else `at`) on running or a terminal state,
        and finished_at on a terminal state.
        """
        import sqlalchemy as sa

        if status not in STATUSES:
            raise ValueError(f"unknown run status {status!r}; expected one of {', '.join(STATUSES)}")
        c = self.t.runs.c
        values: dict[str, Any] = {"status": status}
        if submission_id is not None:
            values["submission_id"] = submission_id
        if error is not None:
            values["error"] = error[-ERROR_TAIL_CHARS:]
        when = at or _now()
        if status in ("running", *TERMINAL):
            values["started_at"] = sa.func.coalesce(c.started_at, started_at or when)
        if status in TERMINAL:
            values["finished_at"] = when
        with self._writer.begin() as conn:
            if not conn.execute(self.t.runs.update().where(c.id == run_id).values(**values)).rowcount:
                raise StoreError(f"no run {run_id!r} in the store")

    def begin_attempt(self, run_id: str) -> tuple[int, str]:
        """Record the intent to submit the run once more: returns (attempt, submission id).

        Ray never reuses a submission id, so attempt 1 is submitted as the run id and attempt n as
        `<run id>-<n>`. The run's metrics are cleared: the new attempt's metrics.jsonl is read afresh.
        """
        import sqlalchemy as sa

        t = self.t
        with self._writer.begin() as conn:
            attempts = conn.execute(sa.select(t.runs.c.attempts).where(t.runs.c.id == run_id)).scalar_one_or_none()
            if attempts is None:
                raise StoreError(f"no run {run_id!r} in the store")
            attempt = attempts + 1
            submission_id = run_id if attempt == 1 else f"{run_id}-{attempt}"
            conn.execute(
                t.runs.update()
                .where(t.runs.c.id == run_id)
                .values(
                    attempts=attempt,
                    submission_id=submission_id,
                    status="pending",
                    error=None,
                    started_at=None,
                    finished_at=None,
                )
            )
            conn.execute(t.metrics.delete().where(t.metrics.c.run_id == run_id))
            conn.execute(t.metric_files.delete().where(t.metric_files.c.run_id == run_id))
        return attempt, submission_id

    # -- metrics ------------------------------------------------------------------------------

    def ingest_metrics(self, run_id: str, path: str | Path) -> int:
        """Add the new lines of a run's metrics.jsonl; returns the number of metric values read.

        Incremental: only bytes past the remembered offset are read. Idempotent: re-ingesting adds
        nothing, and rows are upserted on (run, key, step), so two processes ingesting the same file
        at once agree, and a step logged twice (a resumed trainer) keeps its last value. A file that
        shrank was rewritten: the run's metrics are read again from its start.
        """
        import sqlalchemy as sa

        path = Path(path).resolve()
        mf = self.t.metric_files
        with self.engine.connect() as conn:
            state = conn.execute(sa.select(mf.c.path, mf.c.offset).where(mf.c.run_id == run_id)).first()
        start = state.offset if state is not None and state.path == str(path) else 0
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return 0
        if size < start:  # the file shrank: it was rewritten
            start = 0
        if size == start:
            return 0
        with open(path, "rb") as f:
            f.seek(start)
            records, consumed = parse_metric_lines(f.read(size - start))
        if consumed == 0:
            return 0
        rows = _metric_rows(run_id, records)
        last_step = max((step for step, _ in records), default=None)
        seen = (state.path, state.offset) if state is not None else None
        with self._writer.begin() as conn:
            now = conn.execute(sa.select(mf.c.path, mf.c.offset, mf.c.last_step).where(mf.c.run_id == run_id)).first()
            # Start over (file rewritten or moved) only if no other process ingested in between.
            reset = start == 0 and seen is not None and now is not None and (now.path, now.offset) == seen
            if reset:
                conn.execute(self.t.metrics.delete().where(self.t.metrics.c.run_id == run_id))
            if rows:
                self._bulk_upsert(conn, self.t.metrics, rows)
            if now is None:
                conn.execute(mf.insert().values(run_id=run_id, path=str(path), offset=start + consumed, last_step=last_step))
            else:  # unless starting over, never move backwards: another process may have gone further
                offset = start + consumed if reset else max(now.offset, start + consumed)
                steps = [s for s in (None if reset else now.last_step, last_step) if s is not None]
                conn.execute(
                    mf.update()
                    .where(mf.c.run_id == run_id)
                    .values(path=str(path), offset=offset, last_step=max(steps, default=None))
                )
        return len(rows)

    def latest(self, run_id: str) -> tuple[int | None, dict[str, float | None]]:
        """The run's last logged step and every value logged at it; (None, {}) before any metric."""
        import sqlalchemy as sa

        m = self.t.metrics.c
        with self.engine.connect() as conn:
            step = conn.execute(sa.select(sa.func.max(m.step)).where(m.run_id == run_id)).scalar()
            if step is None:
                return None, {}
            rows = conn.execute(sa.select(m.key, m.value).where(m.run_id == run_id, m.step == step))
            return step, {key: value for key, value in rows}

    def latest_values(
        self, run_ids: Iterable[str], keys: Iterable[str]
    ) -> dict[str, dict[str, tuple[int, float | None]]]:
        """For each run, each key's last logged (step, value); keys never logged are absent."""
        import sqlalchemy as sa

        run_ids, keys = list(run_ids), list(keys)
        if not run_ids or not keys:
            return {}
        m = self.t.metrics
        last = (
            sa.select(m.c.run_id, m.c.key, sa.func.max(m.c.step).label("step"))
            .where(m.c.run_id.in_(run_ids), m.c.key.in_(keys))
            .group_by(m.c.run_id, m.c.key)
            .subquery()
        )
        query = sa.select(m.c.run_id, m.c.key, m.c.step, m.c.value).join(
            last, sa.and_(m.c.run_id == last.c.run_id, m.c.key == last.c.key, m.c.step == last.c.step)
        )
        out: dict[str, dict[str, tuple[int, float | None]]] = {}
        with self.engine.connect() as conn:
            for run_id, key, step, value in conn.execute(query):
                out.setdefault(run_id, {})[key] = (step, value)
        return out

    def last_steps(self, run_ids: Iterable[str]) -> dict[str, int]:
        """The last step ingested for each run (from the ingestion bookkeeping: no metrics scan)."""
        import sqlalchemy as sa

        mf = self.t.metric_files.c
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(mf.run_id, mf.last_step).where(mf.run_id.in_(list(run_ids))))
            return {run_id: step for run_id, step in rows if step is not None}

    # -- evaluation -----------------------------------------------------------------------------

    def record_evals(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Upsert eval scores: dicts with run_id, step, benchmark, metric, k, scorer, value, scorer_version."""
        return self._upsert_rows(self.t.evals, rows)

    def record_samples(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Upsert scored samples: dicts with run_id, step, benchmark, problem, sample_index, scorer,
        extracted, correct, response_length."""
        return self._upsert_rows(self.t.samples, rows)

    def _upsert_rows(self, table: sa.Table, rows: Iterable[Mapping[str, Any]]) -> int:
        rows = [dict(r) for r in rows]
        if rows:
            with self._writer.begin() as conn:
                conn.execute(self._upsert(table), rows)
        return len(rows)

    def _bulk_upsert(self, conn: sa.Connection, table: sa.Table, rows: list[tuple[Any, ...]]) -> None:
        """Upsert rows given as tuples in the table's column order, straight through the driver's
        executemany: SQLAlchemy's per-row parameter processing would triple the cost of ingestion."""
        compiled = self._upsert(table).compile(dialect=conn.dialect, column_keys=[c.name for c in table.columns])
        if compiled.positional:
            order = [table.columns.keys().index(name) for name in compiled.positiontup]
            params: list[Any] = rows if order == list(range(len(order))) else [tuple(r[i] for i in order) for r in rows]
        else:
            params = [dict(zip(table.columns.keys(), r)) for r in rows]
        conn.exec_driver_sql(compiled.string, params)

    def _upsert(self, table: sa.Table) -> Any:
        """INSERT ... ON CONFLICT (primary key) DO UPDATE, in the dialect's own words."""
        name = self.engine.dialect.name
        keys = [c.name for c in table.primary_key.columns]
        if name in ("sqlite", "postgresql"):
            if name == "sqlite":
                from sqlalchemy.dialects.sqlite import insert
            else:
                from sqlalchemy.dialects.postgresql import insert
            stmt = insert(table)
            return stmt.on_conflict_do_update(
                index_elements=keys, set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys}
            )
        if name in ("mysql", "mariadb"):
            from sqlalchemy.dialects.mysql import insert

            stmt = insert(table)
            return stmt.on_duplicate_key_update({c.name: stmt.inserted[c.name] for c in table.columns if c.name not in keys})
        raise StoreError(f"rpg's store supports SQLite, PostgreSQL and MySQL URLs, not {name!r}; change --db")

    def run_history(self, run_id: str) -> tuple[dict[int, dict[str, float | None]], list[dict[str, Any]]]:
        """Everything recorded for one run, for exporting it: {step: {key: value}} of its metrics (None
        for NaN), and its eval rows as dicts (step, benchmark, metric, k, scorer, value, scorer_version)."""
        import sqlalchemy as sa

        m, e = self.t.metrics.c, self.t.evals.c
        metrics: dict[int, dict[str, float | None]] = {}
        with self.engine.connect() as conn:
            for step, key, value in conn.execute(
                sa.select(m.step, m.key, m.value).where(m.run_id == run_id).order_by(m.step, m.key)
            ):
                metrics.setdefault(step, {})[key] = value
            evals = [dict(row) for row in conn.execute(
                sa.select(e.step, e.benchmark, e.metric, e.k, e.scorer, e.value, e.scorer_version)
                .where(e.run_id == run_id).order_by(e.step, e.benchmark, e.scorer, e.metric, e.k)
            ).mappings()]
        return metrics, evals


def _run_record(row: Mapping[str, Any]) -> RunRecord:
    fields = dict(row)
    spec = fields["spec"]
    fields["spec"] = json.loads(spec) if isinstance(spec, str) else spec
    fields["run_dir"] = Path(fields["run_dir"])
    return RunRecord(**fields)


# ------------------------------------------------------------------------------------------ opening


def open_store(db_url: str = DEFAULT_DB_URL, create: bool = True) -> Store:
    """Open (and with `create`, create: parent directory, file, tables) the database at `db_url`.

    With create=False a missing SQLite file raises StoreError instead of appearing.
    """
    import sqlalchemy as sa

    url = normalize_url(db_url)
    path = sqlite_path(url)
    if path is not None and path:
        if create:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        elif not Path(path).is_file():
            raise StoreError(f"no results database at {path}; run `rpg sweep SPEC` first, or pass --db URL")
    engine = sa.create_engine(
        url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S} if path is not None else {}, future=True
    )
    if path is not None:
        _configure_sqlite(engine)
    store = Store(engine)
    if create:
        with store._writer.begin() as conn:  # inside one IMMEDIATE transaction: concurrent creators serialize
            store.t.metadata.create_all(conn)
    return store


def _configure_sqlite(engine: sa.Engine) -> None:
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA journal_mode = WAL")  # readers never block the writer, nor it them
        cursor.execute("PRAGMA synchronous = NORMAL")  # durable at every checkpoint; safe with WAL
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("rpg_write") else "BEGIN")


def run_states(db_url: str, ids: Iterable[str]) -> dict[str, str]:
    """{run id: status} for the ids the store knows; {} when there is no database yet.

    Read-only and light (the dry-run path): SQLite is read with the standard library in read-only
    mode, so nothing is created; other URLs go through SQLAlchemy.
    """
    ids = list(ids)
    path = sqlite_path(db_url)
    if path is None:
        import sqlalchemy as sa

        engine = sa.create_engine(normalize_url(db_url))
        try:
            if not ids or not sa.inspect(engine).has_table("runs"):
                return {}
            return {r.id: r.status for r in Store(engine).runs(ids=ids)}
        finally:
            engine.dispose()
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
            states.update(con.execute(f"SELECT id, status FROM runs WHERE id IN ({marks})", chunk).fetchall())
        return states
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return {}
        raise
    finally:
        con.close()
