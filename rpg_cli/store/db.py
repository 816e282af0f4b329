"""The results store: sweeps, runs and their states, training metrics, eval scores and samples.

One SQLAlchemy database (SQLite at `runs/results.db` by default, any SQLAlchemy URL via `--db`), opened by
opening.py (`open_store`). Every write transaction starts with `BEGIN IMMEDIATE` on SQLite, so several
processes (sweep watchers, evaluators, `rpg runs`) can share one file without losing rows or failing on lock
upgrades; rows go in by bulk.py, reads are queries.py's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from rpg_cli import rundir
from rpg_cli.metrics import DIVERGED_KEYS, STEP_TIME
from rpg_cli.states import LIVE, STATUSES, TERMINAL
from rpg_cli.store import bulk
from rpg_cli.store.ingest import (
    INGEST_BYTES,
    METRICS_CHUNK,
    VERL_VAL_SCORER,
    VERL_VAL_SCORER_VERSION,
    Cursor,
    Parsed,
    ValRow,
    end_cursor,
    ingest_rows,
    parse_metric_line,
    read_new,
    segments,
)
from rpg_cli.store.queries import Queries
from rpg_cli.store.schema import CHANGED_CHARS, PROTOCOL, schema
from rpg_cli.store.url import (
    RUN_AGAIN,
    StoreError,
    display_url,
)

ERROR_TAIL_CHARS = 2000
OUTAGE_PATIENCE_S = 120.0  # how long a watcher waits for a database server that stopped answering (a restart)
_DISK_FULL = ("database or disk is full", "No space left on device", "disk quota exceeded")
_log = logging.getLogger("rpg_cli.store")


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
    running_at: datetime | None = None  # when rpg first saw the job running (started_at: when Ray took it)

    @property
    def metrics_path(self) -> Path:
        return rundir.metrics_path(self.run_dir)


def _unread(state: Mapping[str, Any] | None) -> bool:
    """Whether a run's metric_files row (None: none) says the store has read nothing of its file yet (a
    placeholder `_claim_file` inserted is such a row)."""
    return state is None or (not state["fingerprint"] and not state["offset"])


@dataclass
class _Restarts:
    """Which restarts of a run's metrics.jsonl the store applies (ingest.py): on the first read of the file
    all (the store holds nothing of it: the file is folded as written); else one per attempt of a live run,
    the first read after `runs.attempts` grew. `applied`: the attempt whose restart was applied."""

    fresh: bool
    status: str | None  # the run's state; None: not in the store
    attempts: int
    applied: int | None

    @property
    def live(self) -> bool:
        return self.status in LIVE

    def claim(self) -> str | None:
        """Take the current attempt's restart: None when it applies, else why it does not."""
        if self.fresh:
            return None
        if not self.live:
            return f"the run has finished ({self.status})" if self.status else "the run is not in the store"
        if self.applied is not None and self.applied >= self.attempts:
            return f"its attempt ({self.attempts}) has restarted once already"
        self.applied = self.attempts
        return None


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
        stamp = _now()
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
        when = at or _now()
        if status in ("running", *TERMINAL):
            values["started_at"] = sa.func.coalesce(c.started_at, started_at or when)
        if status == "running":
            values["running_at"] = sa.func.coalesce(c.running_at, _now())
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
        `<run id>-<n>`. The run's metrics stay: the new attempt's metrics.jsonl says which of them it
        redoes (ingest.py), and verl's, started over, no longer holds the steps before its checkpoint.

        The run's row is locked while its count is read and raised, so two processes never take the
        same attempt number. `after`: the attempts the caller saw when it decided to submit; when
        another process has begun one since (two `rpg sweep` of one file), that attempt is returned
        instead of a new one, so that the run gets one job (the second submission of it is refused by
        Ray as existing, and attaches).
        """
        t = self.t
        with self._write() as conn:
            row = conn.execute(
                sa.select(t.runs.c.attempts, t.runs.c.submission_id)
                .where(t.runs.c.id == run_id)
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
                )
            )
            # the new attempt has advanced nothing yet (no stall while it waits for GPUs and loads); its restart
            # line says where it resumed
            mf = t.metric_files
            conn.execute(mf.update().where(mf.c.run_id == run_id).values(advanced_at=None, resumed_after=None))
        return attempt, submission_id

    # -- metrics ------------------------------------------------------------------------------

    def ingest_metrics(self, run_id: str, path: str | Path, max_bytes: int = INGEST_BYTES) -> int:
        """Add what is new in a run's metrics.jsonl; returns the number of metric values read.

        One pass: the metrics go to `metrics`, and the validation accuracy among them (ingest.py) to
        `evals` under the scorer "verl-val", in the same transaction. Rows are keyed by (run, step,
        key). The file is untrusted input and the store the record (ingest.py's module docstring):
        every line is checked; a live run's later line wins, and its new attempt's restart line voids
        the steps above its checkpoint; a finished run only gains the (step, key) it lacks; a file that
        no longer matches what was read is believed only as a live run's new attempt starting it over,
        else reported in one line, marked (`changed_files`) and read on from its end.
        Incremental: only bytes past the remembered offset are read, and only while the bytes read
        before are still there (a fingerprint of where reading began and stopped); at most `max_bytes`
        per call, METRICS_CHUNK per transaction, the rest at the next call. Concurrent ingestions of one
        run serialize: each claims the run's bookkeeping row, in one statement, only while it is still
        the state its read started from (`_claim_file`), else reads again; so every byte is ingested by
        one process, once. Bad lines and ignored restarts: a warning with the file's line number, once.
        """
        path = Path(path).parent.resolve() / Path(path).name  # the file itself: never a link followed
        count, read, races = 0, 0, 0
        while races < 20:
            done = self._ingest_once(run_id, path)
            if done is None:
                races += 1
                continue
            values, consumed, more = done
            count, read = count + values, read + consumed
            if not more or read >= max_bytes:
                return count
        raise StoreError(f"could not ingest {path}: other processes kept ingesting it; try again")

    def _ingest_once(self, run_id: str, path: Path) -> tuple[int, int, bool] | None:
        """One chunk of ingest_metrics: (values read, bytes consumed, whether more bytes wait); None when
        another process ingested the run in between."""
        mf, runs = self.t.metric_files, self.t.runs
        with self.engine.connect() as conn:
            state = conn.execute(sa.select(mf).where(mf.c.run_id == run_id)).mappings().first()
        cursor = None
        if state is not None and state["file_id"] and state["fingerprint"]:
            cursor = Cursor(state["file_id"], state["offset"], state["fingerprint"], state["lines"] or 0)
        try:  # the file read where the store stopped, if it still holds what was read then (ingest.read_new)
            parsed, after = read_new(path, cursor, parse_metric_line, limit=METRICS_CHUNK)
            end = end_cursor(path) if parsed.changed else None  # where to read on if it is not believed
        except OSError as exc:  # no file, or a path that cannot hold one (a name too long: nothing was written)
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
                return 0, 0, False
            raise
        if parsed.consumed == 0 and not parsed.changed:
            return 0, 0, False
        lines_before = after.lines - parsed.lines
        warnings = [(lines_before + index + 1, f"{why}; skipped") for index, why in parsed.bad]
        count = 0
        with self._write() as conn:
            if not self._claim_file(conn, run_id, None if state is None else dict(state)):
                return None  # another process ingested meanwhile: start again from what it left
            run = conn.execute(sa.select(runs.c.status, runs.c.attempts).where(runs.c.id == run_id)).first()
            restarts = _Restarts(
                fresh=_unread(state),
                status=None if run is None else run.status,
                attempts=run.attempts if run is not None else 0,
                applied=None if state is None else state["restart_attempt"],
            )
            # a file that changed is believed only as this attempt starting it over (its one restart)
            disowned = restarts.claim() if parsed.changed else None
            if disowned:
                assert end is not None and parsed.changed is not None
                self._disown_file(conn, run_id, path, end, parsed.changed)
            elif parsed.consumed:
                count = self._apply_lines(conn, run_id, path, parsed, after, state, restarts, warnings)
        if disowned:
            _log.warning(
                "%s: no longer the file the store read (%s); not believed (%s): the store keeps its rows and reads "
                "only lines added from now on (`rpg runs` marks the run !)",
                path,
                parsed.changed,
                disowned,
            )
            return 0, 0, False
        for line, why in sorted(warnings):  # after the commit: a line is warned about when it is read, once
            _log.warning("%s line %d: %s", path, line, why)
        return count, parsed.consumed, parsed.more

    def _apply_lines(
        self,
        conn: sa.Connection,
        run_id: str,
        path: Path,
        parsed: Parsed,
        after: Cursor,
        state: Mapping[str, Any] | None,
        restarts: _Restarts,
        warnings: list[tuple[int, str]],
    ) -> int:
        """Write what `parsed` says (ingest_metrics' rules) and the cursor `after`; returns the values read.
        An ignored restart is added to `warnings` as (line number, why)."""
        lines_before = after.lines - parsed.lines
        replace = restarts.live or restarts.fresh  # a finished run's rows are never replaced
        last_step = None if _unread(state) or parsed.changed else state["last_step"]
        count, dropped, advanced, resumed = 0, False, False, False
        resumed_after: int | None = None
        for segment in segments(parsed, from_start=bool(parsed.changed)):
            if segment.restart:
                why_not = None if segment.line is None else restarts.claim()  # line None: claimed already
                if why_not:
                    why = f"a restart record, ignored ({why_not}): the store keeps the steps it has"
                    warnings.append((lines_before + (segment.line or 0) + 1, why))
                else:
                    dropped = resumed = True
                    resumed_after = segment.keep
                    self._drop_steps_after(conn, run_id, segment.keep)
                    last_step = None if segment.keep is None or last_step is None else min(last_step, segment.keep)
            rows, val_rows = ingest_rows(run_id, segment.records)
            if rows:
                bulk.bulk_upsert(conn, self.t.metrics, rows, replace)
            if val_rows:
                bulk.bulk_upsert(conn, self.t.evals, self._val_evals(conn, run_id, val_rows), replace)
            count += len(rows)
            steps = [step for step, _ in segment.records]
            advanced = advanced or bool(steps) and (last_step is None or max(steps) > last_step)
            last_step = max((s for s in (last_step, *steps) if s is not None), default=None)
        if dropped or parsed.changed:  # steps of an earlier attempt may remain below the restart
            m = self.t.metrics.c
            kept = conn.execute(sa.select(sa.func.max(m.step)).where(m.run_id == run_id)).scalar()
            last_step = max((s for s in (last_step, kept) if s is not None), default=None)
        values: dict[str, Any] = {
            "path": str(path),
            "offset": after.offset,
            "last_step": last_step,
            "file_id": after.file_id,
            "fingerprint": after.fingerprint,
            "lines": after.lines,
            "restart_attempt": restarts.applied,
        }
        if advanced:  # a step beyond the last: the run moved on (a stall's clock starts over)
            values["advanced_at"] = _now()
        if resumed:  # the steps up to it are an earlier attempt's (the watchdog judges this one's)
            values["resumed_after"] = resumed_after
        conn.execute(self.t.metric_files.update().where(self.t.metric_files.c.run_id == run_id).values(**values))
        return count

    def _disown_file(self, conn: sa.Connection, run_id: str, path: Path, end: Cursor, how: str) -> None:
        """A file that no longer matches what the store read, not believed: the store keeps its rows,
        notes how and when (`changed_files`: `rpg runs` marks the run), and reads on from the file's end."""
        note = f"{_now():%Y-%m-%d %H:%M} UTC: {how}"[:CHANGED_CHARS]
        mf = self.t.metric_files
        values = dict(path=str(path), offset=end.offset, file_id=end.file_id, fingerprint=end.fingerprint)
        conn.execute(mf.update().where(mf.c.run_id == run_id).values(**values, lines=end.lines, changed=note))

    def _claim_file(self, conn: sa.Connection, run_id: str, state: dict[str, Any] | None) -> bool:
        """Whether the run's metric_files row is still `state` (None: there is none yet), taken for this
        transaction in the same statement (the row is locked, or inserted as a placeholder the caller
        fills in), so no other process can ingest the run until it commits. A check, then a write,
        would let another process ingest in between (PostgreSQL's READ COMMITTED; there the statement
        waits for a concurrent holder, then sees what it committed)."""
        mf = self.t.metric_files
        if state is None:
            placeholder = self._insert_new(mf).values(run_id=run_id, path="", offset=0)
            # an INSERT's row count is the driver's only when asked for (SQLAlchemy: preserve_rowcount)
            return conn.execute(placeholder, execution_options={"preserve_rowcount": True}).rowcount == 1
        same = [mf.c[name] == value if value is not None else mf.c[name].is_(None) for name, value in state.items()]
        return conn.execute(mf.update().where(*same).values(offset=mf.c.offset)).rowcount == 1

    def _drop_steps_after(self, conn: sa.Connection, run_id: str, keep: int | None) -> None:
        """A restart: the run's metrics (and validation copies) of steps above `keep` are void."""
        m, e = self.t.metrics.c, self.t.evals.c
        conn.execute(self.t.metrics.delete().where(m.run_id == run_id, *([m.step > keep] if keep is not None else [])))
        conn.execute(
            self.t.evals.delete().where(
                e.run_id == run_id, e.scorer == VERL_VAL_SCORER, *([e.step > keep] if keep is not None else [])
            )
        )

    def _val_evals(self, conn: sa.Connection, run_id: str, val_rows: list[ValRow]) -> list[tuple[Any, ...]]:
        """`evals` rows (in column order) of the validation the run logged: its spec's validation
        protocol (n samples per problem, temperature, top_p, response length; seed 0: not recorded)."""
        from rpg_cli.spec import val_sampling

        spec = conn.execute(sa.select(self.t.runs.c.spec).where(self.t.runs.c.id == run_id)).scalar()
        p = val_sampling(json.loads(spec) if isinstance(spec, str) else spec)
        protocol = (p["n"], p["temperature"], p["top_p"], p["max_tokens"], 0)
        return [
            (run_id, step, bench, metric, k, VERL_VAL_SCORER, *protocol, value, VERL_VAL_SCORER_VERSION)
            for step, bench, metric, k, value in val_rows
        ]

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
        return self._upsert_rows(self.t.samples, _with_protocol(rows))

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

    def _upsert_rows(self, table: sa.Table, rows: Iterable[Mapping[str, Any]]) -> int:
        """Upsert dict rows (a column a row lacks: NULL) as tuples through bulk.py, in primary-key order: two
        processes writing overlapping rows (two `rpg eval` of one checkpoint) then lock them in the same order,
        and wait for each other instead of deadlocking."""
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
