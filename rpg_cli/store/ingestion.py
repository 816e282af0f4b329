"""The Store's side of ingesting a run's metrics.jsonl (`Store.ingest_metrics`): the transactions that apply
what ingest.py parsed (restarts, a finished run's rows kept, a changed file disowned), each run's bookkeeping
row claimed so that every byte is ingested once. Mixed into `Store` (db.py), as queries.py is; ingest.py
holds the file's rules and the parsing, pure Python."""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from rpg_cli.states import LIVE
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
from rpg_cli.store.schema import CHANGED_CHARS
from rpg_cli.store.url import StoreError

if TYPE_CHECKING:
    from rpg_cli.store.schema import Schema

_log = logging.getLogger("rpg_cli.store")  # the store's logger: one name for all its warnings


def utc_now() -> datetime:
    """The store's clock: naive UTC, identical on every dialect (db.py stamps runs with it too)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


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


class Ingestion:
    """`Store.ingest_metrics` and its steps; the Store gives the engine, the tables and its write transactions."""

    engine: sa.Engine
    t: Schema

    if TYPE_CHECKING:

        def _write(self) -> AbstractContextManager[sa.Connection]: ...

        def _insert_new(self, table: sa.Table) -> Any: ...

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
            values["advanced_at"] = utc_now()
        if resumed:  # the steps up to it are an earlier attempt's (the watchdog judges this one's)
            values["resumed_after"] = resumed_after
        conn.execute(self.t.metric_files.update().where(self.t.metric_files.c.run_id == run_id).values(**values))
        return count

    def _disown_file(self, conn: sa.Connection, run_id: str, path: Path, end: Cursor, how: str) -> None:
        """A file that no longer matches what the store read, not believed: the store keeps its rows,
        notes how and when (`changed_files`: `rpg runs` marks the run), and reads on from the file's end."""
        note = f"{utc_now():%Y-%m-%d %H:%M} UTC: {how}"[:CHANGED_CHARS]
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
