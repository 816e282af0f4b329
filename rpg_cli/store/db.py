"""The results store: sweeps, runs and their states, training metrics, eval scores and samples.

One SQLAlchemy database (SQLite at `runs/results.db` by default, any SQLAlchemy URL via `--db`).
SQLite runs in WAL mode with a busy timeout, and every write transaction starts with
`BEGIN IMMEDIATE`, so several processes (sweep watchers, evaluators, `rpg runs`) can share one file
without losing rows or failing on lock upgrades. Opening migrates an older database (migrations.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from rpg_cli import rundir
from rpg_cli.states import STATUSES, TERMINAL
from rpg_cli.store import migrations
from rpg_cli.store.ingest import ingest_rows, parse_metric_lines
from rpg_cli.store.queries import Queries
from rpg_cli.store.schema import schema
from rpg_cli.store.url import DEFAULT_DB_URL, SQLITE_BUSY_TIMEOUT_S, StoreError, normalize_url, sqlite_path

ERROR_TAIL_CHARS = 2000


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # naive UTC: identical on every dialect


class PlannedRun(Protocol):
    """What the store records of a run plan (orchestration.plan.PlannedRun is one)."""

    id: str
    name: str
    sweep: str
    backend: str
    spec: dict[str, Any]
    run_dir: Path


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
        return rundir.metrics_path(self.run_dir)


# ------------------------------------------------------------------------------------------- store


class Store(Queries):
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

    def record_plan(self, plan: PlannedRun, sweep: str | None = None) -> None:
        self.record_plans([plan], sweep)

    def record_plans(self, plans: Iterable[PlannedRun], sweep: str | None = None) -> None:
        """Insert runs that are new (status pending); refresh name/spec/dir of known ones, keep their state."""
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
        unless_terminal: bool = False,
    ) -> bool:
        """Move a run to `status` at time `at` (default now); with `unless_terminal`, only a run not in a
        terminal state (in one statement: a concurrent writer's terminal state is never overwritten).
        Returns whether the run moved.

        Stamps started_at (once; `started_at` if given, else `at`) on running or a terminal state,
        and finished_at on a terminal state.
        """
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
        which = c.id == run_id
        if unless_terminal:
            which = sa.and_(which, c.status.notin_(sorted(TERMINAL)))
        with self._writer.begin() as conn:
            if conn.execute(self.t.runs.update().where(which).values(**values)).rowcount:
                return True
        if unless_terminal and self.run(run_id) is not None:
            return False
        raise StoreError(f"no run {run_id!r} in the store")

    def begin_attempt(self, run_id: str) -> tuple[int, str]:
        """Record the intent to submit the run once more: returns (attempt, submission id).

        Ray never reuses a submission id, so attempt 1 is submitted as the run id and attempt n as
        `<run id>-<n>`. The run's metrics are cleared: the new attempt's metrics.jsonl is read afresh.
        """
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

        One pass: the metrics go to `metrics`, and the validation accuracy among them (verl's names,
        see ingest.py) to `evals` under the scorer "verl-val", in the same transaction.
        Incremental: only bytes past the remembered offset are read. Idempotent: re-ingesting adds
        nothing, and rows are upserted on their keys, so two processes ingesting the same file at
        once agree, and a step logged twice (a resumed trainer) keeps its last value. A file that
        shrank was rewritten: the run's metrics are read again from its start.
        """
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
        rows, val_rows = ingest_rows(run_id, records)
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
            if val_rows:
                self._bulk_upsert(conn, self.t.evals, val_rows)
            if now is None:
                conn.execute(
                    mf.insert().values(run_id=run_id, path=str(path), offset=start + consumed, last_step=last_step)
                )
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
            return stmt.on_duplicate_key_update(
                {c.name: stmt.inserted[c.name] for c in table.columns if c.name not in keys}
            )
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
    """Open (and with `create`, create: parent directory, file, tables) the database at `db_url`,
    upgrading an older schema in place (migrations.py).

    With create=False a missing SQLite file raises StoreError instead of appearing.
    """
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
    with engine.connect() as conn:  # reading the version takes no write lock: `rpg runs` never waits here
        version = migrations.current_version(conn, store.t)
    if version != migrations.LATEST and (version or create):
        with store._writer.begin() as conn:  # one IMMEDIATE transaction: concurrent openers serialize
            migrations.migrate(conn, store.t)
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
