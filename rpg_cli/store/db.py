"""The results store: sweeps, runs and their states, training metrics, eval scores and samples.

One SQLAlchemy database (SQLite at `runs/results.db` by default, any SQLAlchemy URL via `--db`), opened by
opening.py (`open_store`). Every write transaction starts with `BEGIN IMMEDIATE` on SQLite, so several
processes (sweep watchers, evaluators, `rpg runs`) can share one file without losing rows or failing on lock
upgrades; rows go in by bulk.py, reads are queries.py's, a run's metrics.jsonl is ingested by ingestion.py's
(both mixed into `Store`).
"""

from __future__ import annotations

import contextlib
import json
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from rpg_cli import cost, rundir
from rpg_cli.metrics import DIVERGED_KEYS, STEP_TIME
from rpg_cli.states import STATUSES, TERMINAL
from rpg_cli.store import bulk, counts
from rpg_cli.store.ingestion import Ingestion, utc_now
from rpg_cli.store.queries import Queries
from rpg_cli.store.schema import PROTOCOL, Schema, schema
from rpg_cli.store.url import (
    RUN_AGAIN,
    StoreError,
    display_url,
)

ERROR_TAIL_CHARS = 2000
OUTAGE_PATIENCE_S = 120.0  # how long a watcher waits for a database server that stopped answering (a restart)
_DISK_FULL = ("database or disk is full", "No space left on device", "disk quota exceeded")


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
    running_at: datetime | None = None  # when rpg first saw the job running (started_at: when Ray took it)
    held_s: float = 0.0  # seconds the run held its devices in attempts that ended (rpg_cli/cost.py)
    held_at: datetime | None = None  # when its current attempt began holding them (None: not yet, or unknown)

    @property
    def metrics_path(self) -> Path:
        return rundir.metrics_path(self.run_dir)


# ------------------------------------------------------------------------------------------- store


class Store(Ingestion, Queries):
    """A handle on the results database. Methods open short transactions; safe across processes."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        self.t = schema()
        # SQLite: writes begin IMMEDIATE (take the write lock up front, honouring the busy timeout)
        # instead of upgrading a read lock mid-transaction, which fails at once under contention.
        self._writer = engine.execution_options(rpg_write=True)

    def close(self) -> None:
        self.engine.dispose()

    def riding_out(self, work: Callable[[], Any], patience_s: float = OUTAGE_PATIENCE_S) -> Any:
        """`work()`, called again while the database server does not answer (a restart), for up to
        `patience_s`; then a StoreError. Only for work that is safe to repeat: each of its writes is a
        transaction of its own that leaves the store consistent (a watcher's poll)."""
        deadline = None
        while True:
            try:
                return work()
            except sa.exc.DBAPIError as exc:
                if self.engine.dialect.name == "sqlite" or not (
                    exc.connection_invalidated or isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))
                ):
                    raise
                deadline = deadline or time.monotonic() + patience_s
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"the results database {display_url(str(self.engine.url))} did not answer for "
                        f"{patience_s:g} s ({error_reason(exc)})"
                    ) from None
                self.engine.dispose()  # the pooled connections were to the server that went away
                time.sleep(1.0)

    # -- runs ---------------------------------------------------------------------------------

    def record_plan(self, plan: PlannedRun, sweep: str | None = None) -> None:
        self.record_plans([plan], sweep)

    def record_plans(self, plans: Iterable[PlannedRun], sweep: str | None = None) -> dict[str, Path]:
        """Record that the sweep lists these runs; returns each run's directory.

        A run is its spec (its id): new ones are inserted (status pending, their directory the plan's);
        a known one keeps its state and its directory (the first sweep that listed it made it, and its
        checkpoints and metrics are there) and joins this sweep too.

        Safe against another process recording the same runs at once (two `rpg sweep` of one file): each
        row is inserted unless it exists, in one statement, and always in the same order (sweeps, then runs
        by id), so two writers wait for each other instead of failing or deadlocking.
        """
        t = self.t
        plans = list(plans)
        stamp = utc_now()
        created: dict[str, datetime] = {}  # `runs` lists a sweep's runs in plan order
        for i, plan in enumerate(plans):
            created.setdefault(plan.id, stamp + timedelta(microseconds=i))
        homes: dict[str, Path] = {}
        with self._write() as conn:
            for name in sorted({sweep or p.sweep for p in plans}):
                conn.execute(self._insert_new(t.sweeps).values(name=name, created_at=stamp))
            for plan in sorted(plans, key=lambda p: p.id):  # one lock order for every writer
                conn.execute(
                    self._insert_new(t.runs).values(
                        id=plan.id,
                        sweep=sweep or plan.sweep,
                        name=plan.name,
                        spec=plan.spec,
                        backend=plan.backend,
                        run_dir=str(rundir.absolute_run_dir(plan.run_dir)),
                        status="pending",
                        attempts=0,
                        created_at=created[plan.id],
                    )
                )
                home = conn.execute(sa.select(t.runs.c.run_dir).where(t.runs.c.id == plan.id)).scalar_one()
                homes[plan.id] = Path(home)
                member = dict(sweep=sweep or plan.sweep, run_id=plan.id, added_at=stamp)
                conn.execute(self._insert_new(t.sweep_runs).values(**member))
        return homes

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
        """Runs matching every filter given (`sweep`: the runs it lists), ordered by the sweep that
        created them, then creation."""
        c = self.t.runs.c
        query = sa.select(self.t.runs).order_by(c.sweep, c.created_at, c.name)
        if sweep is not None:
            m = self.t.sweep_runs.c
            query = query.where(c.id.in_(sa.select(m.run_id).where(m.sweep == sweep)))
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
        running_at (once: now, when rpg sees the job out of Ray's queue) on running, and finished_at on
        a terminal state.
        """
        if status not in STATUSES:
            raise ValueError(f"unknown run status {status!r}; expected one of {', '.join(STATUSES)}")
        c = self.t.runs.c
        values: dict[str, Any] = {"status": status}
        if submission_id is not None:
            values["submission_id"] = submission_id
        if error is not None:
            values["error"] = error[-ERROR_TAIL_CHARS:]
        when = at or utc_now()
        if status in ("running", *TERMINAL):
            values["started_at"] = sa.func.coalesce(c.started_at, started_at or when)
        if status == "running":
            values["running_at"] = sa.func.coalesce(c.running_at, utc_now())
        if status in TERMINAL:
            values["finished_at"] = when
        which = c.id == run_id
        if unless_terminal:
            which = sa.and_(which, c.status.notin_(sorted(TERMINAL)))
        with self._write() as conn:
            if conn.execute(self.t.runs.update().where(which).values(**values)).rowcount:
                return True
        if unless_terminal and self.run(run_id) is not None:
            return False
        raise StoreError(f"no run {run_id!r} in the store")

    def begin_attempt(self, run_id: str, after: int | None = None) -> tuple[int, str]:
        """Record the intent to submit the run once more: returns (attempt, submission id).

        Ray never reuses a submission id, so attempt 1 is submitted as the run id and attempt n as
        `<run id>-<n>`. The device time of the attempt that ended (from `held_at` to its end, or now when it
        was lost unfinished) is added to `held_s` (rpg_cli/cost.py). The run's metrics stay: the new attempt's
        metrics.jsonl says which of them it redoes (ingest.py), and verl's, started over, no longer holds the steps before its checkpoint.

        The run's row is locked while its count is read and raised, so two processes never take the
        same attempt number. `after`: the attempts the caller saw when it decided to submit; when
        another process has begun one since (two `rpg sweep` of one file), that attempt is returned
        instead of a new one, so that the run gets one job (the second submission of it is refused by
        Ray as existing, and attaches).
        """
        t = self.t
        with self._write() as conn:
            c = t.runs.c
            row = conn.execute(
                sa.select(c.attempts, c.submission_id, c.held_s, c.held_at, c.finished_at)
                .where(c.id == run_id)
                .with_for_update(key_share=True)  # PostgreSQL: FOR NO KEY UPDATE (SQLite: BEGIN IMMEDIATE)
            ).first()
            if row is None:
                raise StoreError(f"no run {run_id!r} in the store")
            if after is not None and row.attempts > after and row.submission_id:
                return row.attempts, row.submission_id
            attempt = row.attempts + 1
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
                    running_at=None,
                    finished_at=None,
                    # the attempt that ended is folded into the run's device time; the new one holds nothing yet
                    held_s=cost.held_seconds(row.held_s or 0.0, row.held_at, row.finished_at or utc_now()),
                    held_at=None,
                )
            )
            # the new attempt has advanced nothing yet (no stall while it waits for GPUs and loads); its restart
            # line says where it resumed
            mf = t.metric_files
            conn.execute(mf.update().where(mf.c.run_id == run_id).values(advanced_at=None, resumed_after=None))
        return attempt, submission_id

    def set_held_at(self, run_id: str, at: datetime) -> bool:
        """Record when the run's current attempt began holding its devices (its job's mark, rundir.held_since),
        once per attempt: only while none is recorded (begin_attempt clears it) and the run is not finished (a
        finished run's times are its record). Returns whether it was recorded."""
        c = self.t.runs.c
        which = sa.and_(c.id == run_id, c.held_at.is_(None), c.status.notin_(sorted(TERMINAL)))
        with self._write() as conn:
            return bool(conn.execute(self.t.runs.update().where(which).values(held_at=at)).rowcount)

    # -- metrics ------------------------------------------------------------------------------

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

    def divergence(self, run_id: str) -> str | None:
        """Why the run failed if it logged its loss or gradient norm non-finite (the first such step), else
        None. verl trains on through a NaN loss and exits 0: this is how such a run is marked failed."""
        m = self.t.metrics.c
        big = 1.7976931348623157e308  # the largest finite double: +-inf lie beyond it, NaN is kept as NULL
        query = (
            sa.select(m.step, m.key, m.value)
            .where(
                m.run_id == run_id,
                m.key.in_(DIVERGED_KEYS),
                sa.or_(m.value.is_(None), m.value > big, m.value < -big),
            )
            .order_by(m.step, m.key)
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        step, key, value = row
        return rundir.diverged(step, f"{key} is {'nan' if value is None else value}")

    def first_breach(
        self, run_id: str, bounds: Iterable[tuple[str, float | None, float | None, int]]
    ) -> tuple[int, str, float] | None:
        """The first (step, key, value) the run's current attempt logged beyond one of `bounds`, each (key, max,
        min, after_step): a step after `after_step` above max or below min (None: no bound that side); None when
        there is none. The steps up to the one the attempt resumed after are an earlier attempt's (a run failed
        for a bound and resumed from a checkpoint at that step is not failed again for it). One query, like
        `divergence`; NaN, stored as NULL, is beyond no bound."""
        m, mf = self.t.metrics.c, self.t.metric_files.c
        beyond = []
        for key, high, low, after in bounds:
            sides = [m.value > high] if high is not None else []
            sides += [m.value < low] if low is not None else []
            if sides:
                beyond.append(sa.and_(m.key == key, m.step > after, sa.or_(*sides)))
        if not beyond:
            return None
        resumed = sa.select(mf.resumed_after).where(mf.run_id == run_id).scalar_subquery()
        query = sa.select(m.step, m.key, m.value).where(
            m.run_id == run_id, sa.or_(*beyond), m.step > sa.func.coalesce(resumed, -1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query.order_by(m.step, m.key).limit(1)).first()
        return None if row is None else (row.step, row.key, row.value)

    def stall_facts(self, run_ids: Iterable[str]) -> dict[str, tuple[datetime | None, list[float]]]:
        """For each run, what its stall is judged on (rpg_cli/watch.py): when its metrics last advanced in its
        current attempt (None: not yet) and its step times (timing_s/step, in step order)."""
        run_ids = list(run_ids)
        if not run_ids:
            return {}
        mf, m = self.t.metric_files.c, self.t.metrics.c
        out: dict[str, tuple[datetime | None, list[float]]] = {run_id: (None, []) for run_id in run_ids}
        times = (
            sa.select(m.run_id, m.value)
            .where(m.run_id.in_(run_ids), m.key == STEP_TIME, m.value.is_not(None))
            .order_by(m.run_id, m.step)
        )
        with self.engine.connect() as conn:
            for run_id, advanced_at in conn.execute(sa.select(mf.run_id, mf.advanced_at).where(mf.run_id.in_(run_ids))):
                out[run_id] = (advanced_at, [])
            for run_id, value in conn.execute(times):
                out[run_id][1].append(value)
        return out

    def step_times(self, run_ids: Iterable[str], last: int | None = None) -> dict[str, list[float]]:
        """Each run's step times (timing_s/step, in step order; a run without any is absent); with `last`, only
        those of its last `last` steps (below the ingestion bookkeeping's last step: one key range per run, however
        long the run). What `rpg runs` and the sweep's ETA read a run's pace from (report/summary.py)."""
        run_ids = list(run_ids)
        if not run_ids:
            return {}
        m, mf = self.t.metrics.c, self.t.metric_files.c
        query = sa.select(m.run_id, m.value).where(m.run_id.in_(run_ids), m.key == STEP_TIME, m.value.is_not(None))
        if last is not None:
            recent = sa.select(mf.last_step).where(mf.run_id == m.run_id).scalar_subquery()
            query = query.where(m.step > recent - last)
        out: dict[str, list[float]] = {}
        with self.engine.connect() as conn:
            for run_id, value in conn.execute(query.order_by(m.run_id, m.step)):
                out.setdefault(run_id, []).append(value)
        return out

    def logged_steps(self, run_id: str, through: int) -> list[int]:
        """The steps from 1 to `through` the run has metrics of, in order."""
        m = self.t.metrics.c
        query = sa.select(m.step).where(m.run_id == run_id, m.step >= 1, m.step <= through).distinct()
        with self.engine.connect() as conn:
            return sorted(conn.execute(query).scalars())

    def last_steps(self, run_ids: Iterable[str]) -> dict[str, int]:
        """The last step ingested for each run (from the ingestion bookkeeping: no metrics scan)."""
        mf = self.t.metric_files.c
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(mf.run_id, mf.last_step).where(mf.run_id.in_(list(run_ids))))
            return {run_id: step for run_id, step in rows if step is not None}

    # -- evaluation -----------------------------------------------------------------------------

    def record_evals(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Upsert eval scores: dicts with run_id, step, benchmark, metric, k, scorer, the protocol (n,
        temperature, top_p, max_tokens, seed), value, scorer_version."""
        return self._upsert_rows(self.t.evals, _with_protocol(rows))

    def record_samples(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Upsert scored samples: dicts with run_id, step, benchmark, problem (its fingerprint),
        sample_index, scorer, the protocol (n, temperature, top_p, max_tokens, seed), position,
        extracted, correct, response_length."""
        return self._upsert_rows(self.t.samples, _with_protocol(rows), then=counts.refresh)

    @contextlib.contextmanager
    def _write(self) -> Iterator[sa.Connection]:
        """A write transaction (IMMEDIATE on SQLite); a database that cannot be written is a StoreError."""
        try:
            with self._writer.begin() as conn:
                yield conn
        except sa.exc.OperationalError as exc:
            if "readonly" in str(exc) or "read-only" in str(exc):
                raise StoreError(
                    f"the results database {display_url(str(self.engine.url))} is read-only; "
                    "make it (and its directory) writable, or pass --db URL"
                ) from None
            if any(full.lower() in str(exc).lower() for full in _DISK_FULL):
                raise StoreError(
                    f"the results database {display_url(str(self.engine.url))} cannot grow: its disk is full "
                    f"({error_reason(exc)}); free space, then {RUN_AGAIN}"
                ) from None
            raise

    def _upsert_rows(
        self,
        table: sa.Table,
        rows: Iterable[Mapping[str, Any]],
        then: Callable[[sa.Connection, Schema, list[tuple[Any, ...]]], None] | None = None,
    ) -> int:
        """Upsert dict rows (a column a row lacks: NULL) as tuples through bulk.py, in primary-key order: two
        processes writing overlapping rows (two `rpg eval` of one checkpoint) then lock them in the same order,
        and wait for each other instead of deadlocking. `then(conn, tables, tuples)`: what the same transaction
        writes after them (the samples' per-problem counts)."""
        rows = list(rows)
        names = table.columns.keys()
        try:
            tuples = list(map(operator.itemgetter(*names), rows))  # one C call per row (a sample has 15 columns)
        except KeyError:
            tuples = [tuple(r.get(name) for name in names) for r in rows]
        tuples = bulk.key_order(table, tuples)
        if tuples:
            with self._write() as conn:
                bulk.bulk_upsert(conn, table, tuples)
                if then is not None:
                    then(conn, self.t, tuples)
        return len(tuples)

    def _insert_new(self, table: sa.Table) -> Any:
        """INSERT ... ON CONFLICT DO NOTHING in this database's words (bulk.insert_new)."""
        return bulk.insert_new(self.engine.dialect.name, table)

    def run_history(self, run_id: str) -> tuple[dict[int, dict[str, float | None]], list[dict[str, Any]]]:
        """Everything recorded for one run, for exporting it: {step: {key: value}} of its metrics (None
        for NaN), and its eval rows as dicts (step, benchmark, metric, k, scorer, value, scorer_version,
        and the protocol: schema.PROTOCOL)."""
        import sqlalchemy as sa

        m, e = self.t.metrics.c, self.t.evals.c
        metrics: dict[int, dict[str, float | None]] = {}
        with self.engine.connect() as conn:
            for step, key, value in conn.execute(
                sa.select(m.step, m.key, m.value).where(m.run_id == run_id).order_by(m.step, m.key)
            ):
                metrics.setdefault(step, {})[key] = value
            evals = [
                dict(row)
                for row in conn.execute(
                    sa.select(
                        e.step,
                        e.benchmark,
                        e.metric,
                        e.k,
                        e.scorer,
                        e.value,
                        e.scorer_version,
                        *(e[name] for name in PROTOCOL),
                    )
                    .where(e.run_id == run_id)
                    .order_by(e.step, e.benchmark, e.scorer, e.metric, e.k)
                ).mappings()
            ]
        return metrics, evals


def _with_protocol(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows, each with its whole protocol: a score without one would match every protocol's cell."""
    rows = list(rows)
    protocol = operator.itemgetter(*PROTOCOL)  # one C call per row: ingestion checks millions of samples
    for row in rows:
        try:
            whole = None not in protocol(row)
        except KeyError:
            whole = False
        if not whole:
            missing = [name for name in PROTOCOL if row.get(name) is None]
            raise ValueError(f"a score without its sampling protocol ({', '.join(missing)}): {dict(row)}")
    return rows


def _run_record(row: Mapping[str, Any]) -> RunRecord:
    fields = dict(row)
    spec = fields["spec"]
    fields["spec"] = json.loads(spec) if isinstance(spec, str) else spec
    fields["run_dir"] = Path(fields["run_dir"])
    return RunRecord(**fields)


def error_reason(exc: sa.exc.DBAPIError) -> str:
    """The driver's first line about `exc` (SQLAlchemy's own message adds the statement and a link)."""
    lines = str(exc.orig).strip().splitlines() if exc.orig is not None else []
    return lines[0] if lines else type(exc.orig or exc).__name__
