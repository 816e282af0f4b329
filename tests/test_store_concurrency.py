"""Two rpg processes on one store (two `rpg sweep` of one file, a sweep and an `rpg eval`): every write that
two of them can race on is atomic, on SQLite and on a real PostgreSQL (READ COMMITTED, where a check then
an insert is not). Each race is forced: one connection is held inside its transaction, right after its
first write, while the other does the same work; then both finish, and nothing is stored or counted twice.
And two real processes ingest one run's growing metrics file at once: every value lands once."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from test_store import plan

from rpg_cli import rundir
from rpg_cli.store import open_store
from rpg_cli.store.db import Store

KEYS = 5
# Where a batch of rows has been written, uncommitted: SQLite's (and a small batch's) INSERT, or the release of the
# savepoint around PostgreSQL's COPY (store/bulk.py; the COPY itself is the driver's, unseen by SQLAlchemy's events)
WRITES = r"^(INSERT INTO {table}\b|RELEASE SAVEPOINT)"


def lines(first: int, last: int) -> str:
    return "".join(
        json.dumps({"step": s, "data": {f"k{j}": s + j for j in range(KEYS)}}) + "\n" for s in range(first, last + 1)
    )


def rows(store: Store, table: str, **where: Any) -> int:
    t = getattr(store.t, table)
    with store.engine.connect() as conn:
        return conn.execute(
            sa.select(sa.func.count()).select_from(t).where(*(t.c[k] == v for k, v in where.items()))
        ).scalar()


class Race:
    """`first` runs in this thread until it has executed a statement matching `at` (inside its transaction,
    before it commits) and is held there while `second` runs in another thread, until `second` is done or
    waits on a lock `first` holds (PostgreSQL: seen in pg_stat_activity; SQLite, whose writers wait in a
    busy handler: after half a second). Then `first` goes on. What each returned or raised is kept."""

    def __init__(self, url: str, at: str):
        self.url, self.at = url, re.compile(at, re.I)
        self.inside, self.done = threading.Event(), threading.Event()
        self.results: dict[str, Any] = {}
        self.held = False
        self.thread = threading.get_ident()

    def run(self, first: Callable[[], Any], second: Callable[[], Any]) -> dict[str, Any]:
        sa.event.listen(sa.engine.Engine, "after_cursor_execute", self._hold)
        thread = threading.Thread(target=self._second, args=(second,))
        thread.start()
        try:
            self.results["first"] = first()
        except Exception as exc:  # noqa: BLE001 (kept for the assertion, with its type)
            self.results["first"] = exc
        finally:
            self.inside.set()  # a first that never reached `at` still lets the second run
            thread.join(timeout=120)
            sa.event.remove(sa.engine.Engine, "after_cursor_execute", self._hold)
        assert not thread.is_alive(), "the second process never finished"
        assert self.held, f"the first process never executed {self.at.pattern}"
        return self.results

    def _second(self, second: Callable[[], Any]) -> None:
        self.inside.wait(timeout=60)
        try:
            self.results["second"] = second()
        except Exception as exc:  # noqa: BLE001
            self.results["second"] = exc
        finally:
            self.done.set()

    def _hold(self, conn, cursor, statement, parameters, context, executemany) -> None:
        if self.held or threading.get_ident() != self.thread or not self.at.search(statement):
            return
        self.held = True
        self.inside.set()
        deadline = time.monotonic() + 30
        while not self.done.is_set() and time.monotonic() < deadline and not self._second_waits_on_a_lock():
            time.sleep(0.02)

    def _second_waits_on_a_lock(self) -> bool:
        if not self.url.startswith("postgresql"):
            self.done.wait(0.5)
            return True
        engine = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                return bool(
                    conn.exec_driver_sql(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock'"
                    ).scalar()
                )
        finally:
            engine.dispose()


def ok(result: Any) -> Any:
    if isinstance(result, BaseException):
        raise AssertionError(f"{type(result).__name__}: {result}")
    return result


@pytest.fixture
def stores(db_url):
    a, b = open_store(db_url), open_store(db_url)
    yield db_url, a, b
    a.close()
    b.close()


# --------------------------------------------------------------------------- metric_files: one reader per byte


@pytest.mark.parametrize("already", [False, True], ids=["first-ingest", "file-grew"])
def test_an_ingest_between_anothers_check_and_write_finishes_and_counts_nothing_twice(stores, tmp_path, already):
    url, a, b = stores
    p = plan(1, tmp_path)
    a.record_plans([p])
    path = tmp_path / "metrics.jsonl"
    path.write_text(lines(1, 20 if already else 50))
    before = a.ingest_metrics(p.id, path) if already else 0
    if already:
        with path.open("a") as f:
            f.write(lines(21, 50))
    race = Race(url, WRITES.format(table="metrics"))
    got = race.run(lambda: a.ingest_metrics(p.id, path), lambda: b.ingest_metrics(p.id, path))
    assert ok(got["first"]) + ok(got["second"]) + before == 50 * KEYS  # each value read by one process, once
    assert ok(got["second"]) == 0  # it read what the first had stored: nothing new
    assert rows(a, "metrics", run_id=p.id) == 50 * KEYS and rows(a, "metric_files") == 1
    assert a.last_steps([p.id]) == {p.id: 50}
    with a.engine.connect() as conn:
        offset = conn.execute(sa.select(a.t.metric_files.c.offset)).scalar()
    assert offset == path.stat().st_size
    assert b.ingest_metrics(p.id, path) == 0 and a.ingest_metrics(p.id, path) == 0


def test_a_restart_line_applied_by_one_process_is_not_applied_again_by_the_other(stores, tmp_path):
    url, a, b = stores
    p = plan(1, tmp_path)
    a.record_plans([p])
    path = tmp_path / "metrics.jsonl"
    a.begin_attempt(p.id)
    a.set_status(p.id, "running")
    path.write_text(lines(1, 30))
    a.ingest_metrics(p.id, path)
    a.begin_attempt(p.id)  # its second attempt, live: it resumed from step 20's checkpoint, then logged 21.. again
    a.set_status(p.id, "running")
    with path.open("a") as f:
        f.write(json.dumps({"restart": {"keep_through": 20}}) + "\n" + lines(21, 25))
    race = Race(url, r"^DELETE FROM metrics\b")
    got = race.run(lambda: a.ingest_metrics(p.id, path), lambda: b.ingest_metrics(p.id, path))
    assert ok(got["first"]) == 5 * KEYS and ok(got["second"]) == 0
    assert rows(a, "metrics", run_id=p.id) == 25 * KEYS and a.last_steps([p.id]) == {p.id: 25}


# ----------------------------------------------------------------------------- runs, sweeps, attempts, schema


def test_two_sweeps_recording_the_same_runs_at_once_both_finish(stores, tmp_path):
    url, a, b = stores
    plans = [plan(i, tmp_path) for i in range(3)]
    other = [plan(i, tmp_path / "elsewhere") for i in range(3)]  # the same runs, planned under another root
    race = Race(url, r"^INSERT INTO runs\b")
    got = race.run(lambda: a.record_plans(plans, "sw"), lambda: b.record_plans(other, "sw"))
    first, second = ok(got["first"]), ok(got["second"])
    assert (
        first == second == {p.id: rundir.absolute_run_dir(p.run_dir) for p in plans}
    )  # one home per run: the first recorder's
    assert rows(a, "sweeps") == 1 and rows(a, "runs") == 3 and rows(a, "sweep_runs") == 3
    assert [r.name for r in a.runs()] == ["run-0", "run-1", "run-2"]  # in plan order


def test_two_sweeps_recording_overlapping_runs_in_opposite_orders_both_finish(stores, tmp_path):
    url, a, b = stores
    plans = [plan(i, tmp_path) for i in range(4)]
    race = Race(url, r"^INSERT INTO runs\b")
    got = race.run(lambda: a.record_plans(plans, "one"), lambda: b.record_plans(plans[::-1], "two"))
    ok(got["first"]), ok(got["second"])
    assert rows(a, "runs") == 4 and rows(a, "sweep_runs") == 8 and rows(a, "sweeps") == 2


def test_two_processes_beginning_an_attempt_at_once_never_share_an_attempt_number(stores, tmp_path):
    url, a, b = stores
    p = plan(1, tmp_path)
    a.record_plans([p])
    race = Race(url, r"^UPDATE runs\b")
    got = race.run(lambda: a.begin_attempt(p.id), lambda: b.begin_attempt(p.id))
    assert sorted([ok(got["first"]), ok(got["second"])]) == [(1, p.id), (2, f"{p.id}-2")]
    assert a.run(p.id).attempts == 2


def test_a_watcher_that_saw_the_run_before_anothers_attempt_joins_that_attempt(stores, tmp_path):
    """Two `rpg sweep` of one file both see the run pending: one attempt is begun, one job submitted."""
    url, a, b = stores
    p = plan(1, tmp_path)
    a.record_plans([p])
    race = Race(url, r"^UPDATE runs\b")
    got = race.run(lambda: a.begin_attempt(p.id, after=0), lambda: b.begin_attempt(p.id, after=0))
    assert ok(got["first"]) == ok(got["second"]) == (1, p.id)
    assert a.run(p.id).attempts == 1
    assert a.begin_attempt(p.id, after=1) == (2, f"{p.id}-2")  # a retry seen by the one who asks


def test_two_processes_creating_a_new_store_at_once_both_open_it(db_url):
    from rpg_cli.store import migrations

    race = Race(db_url, r"^\s*CREATE TABLE\b")
    got = race.run(lambda: open_store(db_url).close(), lambda: open_store(db_url).close())
    ok(got["first"]), ok(got["second"])
    store = open_store(db_url, create=False)
    try:
        with store.engine.connect() as conn:
            assert migrations.current_version(conn, store.t) == migrations.LATEST
        assert rows(store, "schema_version") == 1
    finally:
        store.close()


# --------------------------------------------------------------------------------------- evals, samples


@pytest.mark.parametrize("problems", [5, 50])  # PostgreSQL: executemany; COPY, then INSERT ... SELECT
def test_two_evaluations_storing_the_same_samples_at_once_both_finish(stores, tmp_path, problems):
    url, a, b = stores
    p = plan(1, tmp_path)
    a.record_plans([p])
    protocol = {"n": 2, "temperature": 1.0, "top_p": 1.0, "max_tokens": 64, "seed": 0}
    samples = [
        {
            "run_id": p.id,
            "step": 10,
            "benchmark": "b",
            "problem": f"p{i}",
            "sample_index": j,
            "scorer": "s",
            **protocol,
            "position": i,
            "extracted": "1",
            "correct": True,
            "response_length": 3,
        }
        for i in range(problems)
        for j in range(2)
    ]
    race = Race(url, WRITES.format(table="samples"))
    got = race.run(lambda: a.record_samples(samples), lambda: b.record_samples(samples[::-1]))
    assert ok(got["first"]) == ok(got["second"]) == 2 * problems
    assert rows(a, "samples") == 2 * problems


# ------------------------------------------------------------------------- two real processes, one run

WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from rpg_cli.orchestration.plan import RunPlan
    from rpg_cli.store import open_store

    db, root, path, done, go = sys.argv[1:6]
    plans = [RunPlan(f"id{i:04d}", f"run-{i}", "sw", "local", {"seed": i, "algorithm": "rpg"},
                     Path(root) / "sw" / f"run-{i}", ["true"]) for i in range(3)]
    while not Path(go).exists():
        time.sleep(0.01)
    store = open_store(db)
    store.record_plans(plans, "sw")
    read = 0
    while not Path(done).exists():
        read += store.ingest_metrics("id0001", path)
    read += store.ingest_metrics("id0001", path)
    store.close()
    print(read)
    """
)


def test_two_processes_ingesting_one_growing_metrics_file_store_every_value_once(db_url, tmp_path):
    """Two `rpg sweep` of one file on one store, each recording the sweep and following one run while
    its job appends 400 steps: no error, every value once, each read by exactly one of them."""
    path, done, go = tmp_path / "metrics.jsonl", tmp_path / "done", tmp_path / "go"
    path.touch()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, db_url, str(tmp_path), str(path), str(done), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    go.touch()
    for step in range(1, 401, 8):
        with path.open("a") as f:
            f.write(lines(step, step + 7))
        time.sleep(0.005)
    done.touch()
    read = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
        read.append(int(out.split()[-1]))
    assert sum(read) == 400 * KEYS  # nothing read twice, nothing lost
    store = open_store(db_url, create=False)
    try:
        assert rows(store, "metrics", run_id="id0001") == 400 * KEYS
        assert rows(store, "runs") == 3 and rows(store, "sweeps") == 1 and rows(store, "sweep_runs") == 3
        assert store.latest("id0001") == (400, {f"k{j}": 400.0 + j for j in range(KEYS)})
    finally:
        store.close()


def test_an_open_that_sqlite_answers_locked_at_once_starts_over(tmp_path, monkeypatch):
    """SQLite answers "database is locked" without waiting where waiting could deadlock (two processes creating
    one file at once): opening is idempotent, so open_store starts over until its busy timeout, and a lock
    that outlasts it is one line."""
    from rpg_cli.store import migrations
    from rpg_cli.store.url import StoreError

    real, calls = migrations.current_version, []

    def locked_twice(conn, tables):
        calls.append(1)
        if len(calls) <= 2:
            raise sa.exc.OperationalError("SELECT version", {}, sqlite3.OperationalError("database is locked"))
        return real(conn, tables)

    monkeypatch.setattr(migrations, "current_version", locked_twice)
    url = f"sqlite:///{tmp_path / 'runs' / 'results.db'}"
    store = open_store(url)  # the third try opens it, tables and all
    assert len(calls) > 2 and store.runs() == []
    store.close()
    calls.clear()
    monkeypatch.setattr("rpg_cli.store.opening.SQLITE_BUSY_TIMEOUT_S", 0.0)
    monkeypatch.setattr(migrations, "current_version", lambda conn, tables: locked_twice(conn, tables) and 0)
    with pytest.raises(StoreError, match=r"^cannot open the results database .*\(database is locked\); check the"):
        open_store(url)
    assert len(calls) == 1
