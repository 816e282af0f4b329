"""The results database fails under a watching `rpg sweep`: a PostgreSQL restart is ridden out; a server
down for longer than the watcher's patience, or a full disk, stops it with one line naming the fault
and the command that resumes, and that command re-attaches with nothing lost. A real local Ray head
and the stand-in trainer of test_jobs.py; the faults come at a chosen poll, and the watcher's waits run
on a clock of the test's own, so no test sleeps through the patience."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import pytest

pytest.importorskip("ray.job_submission", reason="the Ray tests need ray[default]")
pytest.importorskip("psutil")

import sqlalchemy as sa  # noqa: E402
import test_jobs  # noqa: E402
import typer  # noqa: E402
from test_jobs import make_plan, ray_submissions  # noqa: E402

from rpg_cli.cli.sweep import _watch_sweep  # noqa: E402
from rpg_cli.orchestration import sweep as sweep_module  # noqa: E402
from rpg_cli.orchestration.dryrun import plan_runs  # noqa: E402
from rpg_cli.store import db as db_module  # noqa: E402
from rpg_cli.store import open_store  # noqa: E402

pytestmark = pytest.mark.slow
cluster = test_jobs.cluster  # a local Ray head of this module's own


class Clock:
    """The `time` of rpg_cli.store.db: each wait of the watcher's retry loop counts `step_s` seconds
    (spending at most 0.3 s of real time, so that the trainers write on meanwhile), then calls
    `on_wait(n)`, n the waits so far."""

    def __init__(self, step_s: float, on_wait: Callable[[int], None] = lambda n: None):
        self.step_s, self.on_wait, self.offset, self.waits = step_s, on_wait, 0.0, 0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, 0.3))
        self.offset += self.step_s
        self.waits += 1
        self.on_wait(self.waits)


def mid_run(snapshot, steps: int) -> bool:
    """Every run of the snapshot is running and has logged some of its steps, at most half (the rest
    comes after the fault)."""
    return all(r.status == "running" and r.step is not None and 0 < r.step <= steps // 2 for r in snapshot.runs)


def fault_at_mid_run(monkeypatch, steps: int, fault: Callable[[], None]) -> list:
    """Make `fault()` happen once, right after the watcher's first snapshot in which every run is
    mid-way (between two polls, as a restart or a full disk can); returns the snapshots seen."""
    real, seen = sweep_module.progress, []

    def progress(*args, **kwargs):
        snapshot = real(*args, **kwargs)
        seen.append(snapshot)
        if snapshot.finished and not any(mid_run(s, steps) for s in seen):
            pytest.fail(f"the runs finished before the watcher saw them mid-way: {[s.counts for s in seen]}")
        if mid_run(snapshot, steps) and sum(mid_run(s, steps) for s in seen) == 1:
            fault()
        return snapshot

    monkeypatch.setattr(sweep_module, "progress", progress)
    return seen


def fast_polls(monkeypatch) -> None:
    """`rpg sweep` polls every 2 s; these tests every 0.3 s."""
    monkeypatch.setattr(sweep_module, "run_sweep", functools.partial(sweep_module.run_sweep, poll_s=0.3))


def one_line_exit_2(capsys, call: Callable[[], None]) -> str:
    with pytest.raises(typer.Exit) as exit_info:
        call()
    err = capsys.readouterr().err
    assert exit_info.value.exit_code == 2, err
    assert "Traceback" not in err, err
    preamble, line = err.strip().splitlines()  # the first: what the sweep connects to
    assert "runs; connecting to" in preamble, err
    return line


def assert_all_there(db: str, plans, steps: int, cluster) -> None:
    """Every run succeeded, was submitted once, and every step of its metrics is in the store, once."""
    sweep = f"{plans[0].sweep}-"
    assert [s for s in ray_submissions(cluster) if s.startswith(sweep)] == sorted(p.id for p in plans)
    store = open_store(db)
    try:
        for p in plans:
            run = store.run(p.id)
            assert (run.status, run.attempts) == ("succeeded", 1), (run.status, run.error)
            assert store.latest(p.id) == (steps, {"critic/score/mean": 1.0, "actor/pg_loss": -float(steps)})
            m = store.t.metrics.c
            with store.engine.connect() as conn:
                rows = conn.execute(sa.select(sa.func.count()).where(m.run_id == p.id)).scalar()
            assert rows == 2 * steps  # every step, once
    finally:
        store.close()


# -------------------------------------------------------------------------------------- PostgreSQL


def test_a_postgresql_restart_mid_sweep_is_ridden_out(cluster, own_postgres_server, monkeypatch):
    server, steps = own_postgres_server, 30
    plans = [make_plan(cluster, "pg1", name, steps=steps, delay=0.2) for name in ("a", "b")]
    # the server stops between two polls and is started again at the watcher's third wait for it
    seen = fault_at_mid_run(monkeypatch, steps, lambda: server.stop("fast"))
    clock = Clock(1.0, lambda n: n == 3 and server.start())
    monkeypatch.setattr(db_module, "time", clock)

    final = sweep_module.run_sweep(plans, "pg1", server.url, runs_dir=cluster["runs"], poll_s=0.3)

    assert clock.waits == 3  # the watcher met the outage, waited it out, and met no other
    assert sum(mid_run(s, steps) for s in seen) >= 1 and final.finished
    assert_all_there(server.url, plans, steps, cluster)


def test_a_postgresql_server_down_past_the_patience_stops_the_sweep_in_one_line(
    cluster, own_postgres_server, monkeypatch, capsys
):
    server, steps = own_postgres_server, 30
    plans = [make_plan(cluster, "pg2", "a", steps=steps, delay=0.2)]
    fault_at_mid_run(monkeypatch, steps, lambda: server.stop("immediate"))
    clock = Clock(50.0)  # each wait counts 50 s: the patience (120 s) runs out at the third
    monkeypatch.setattr(db_module, "time", clock)
    fast_polls(monkeypatch)

    line = one_line_exit_2(
        capsys, lambda: _watch_sweep(plan_runs(plans, server.url), server.url, runs_dir=str(cluster["runs"]))
    )

    assert clock.waits == 3
    assert line.startswith("rpg sweep: the results database postgresql+psycopg://rpg@127.0.0.1:"), line
    assert f"did not answer for {db_module.OUTAGE_PATIENCE_S:g} s (" in line, line
    assert line.endswith(
        "run the same `rpg sweep` command again to re-attach (the jobs keep running; every state is kept)"
    )
    # the job ran on meanwhile; once the server is back, the same command re-attaches and records it all
    assert server.start().returncode == 0
    _watch_sweep(plan_runs(plans, server.url), server.url, runs_dir=str(cluster["runs"]))
    assert "re-attach" not in capsys.readouterr().err
    assert_all_there(server.url, plans, steps, cluster)


# -------------------------------------------------------------------------------------- a full disk


def test_a_full_disk_stops_the_sweep_in_one_line_and_the_same_command_resumes(cluster, tmp_path, monkeypatch, capsys):
    """SQLite's `max_page_count` caps the database at its size from a chosen poll on: the next write
    that needs a page fails as on a full disk ("database or disk is full")."""
    db, steps = f"sqlite:///{tmp_path / 'results.db'}", 200  # 400 metric rows: pages to add after the cap
    plans = [make_plan(cluster, "full1", "a", steps=steps, delay=0.03)]
    full = []

    def cap(dbapi_connection, connection_record, connection_proxy):
        if full:  # the cap is the connection's: set it on each one handed out
            dbapi_connection.execute("PRAGMA max_page_count = 1")  # never below the size: the size now

    sa.event.listen(sa.pool.Pool, "checkout", cap)
    try:
        fault_at_mid_run(monkeypatch, steps, lambda: full.append(True))
        fast_polls(monkeypatch)
        line = one_line_exit_2(capsys, lambda: _watch_sweep(plan_runs(plans, db), db, runs_dir=str(cluster["runs"])))
    finally:
        sa.event.remove(sa.pool.Pool, "checkout", cap)

    assert line.startswith(f"rpg sweep: the results database {db} cannot grow: its disk is full ("), line
    assert "database or disk is full" in line and "free space, then run the same `rpg sweep`" in line, line
    assert line.count("again") == 1, line  # the fix said once
    assert line.endswith(
        "run the same `rpg sweep` command again to re-attach (the jobs keep running; every state is kept)"
    )
    _watch_sweep(plan_runs(plans, db), db, runs_dir=str(cluster["runs"]))  # space again: the same command
    assert_all_there(db, plans, steps, cluster)
