"""Device-hours per run (issue 32 item 2): the job marks when its attempt began holding its devices, the watcher
records it once per attempt (refusing a mark an earlier attempt left), the store folds each ended attempt, and
`rpg runs` and the sweep's progress line read the cost: devices x the time held, not the time queued."""

from __future__ import annotations

import json
import signal
import sys
import types
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from rpg_cli import cost, rundir
from rpg_cli.orchestration import progress as progress_module
from rpg_cli.orchestration import reconcile
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.report.summary import runs_summary
from rpg_cli.store import migrations, open_store

T0 = datetime(2026, 3, 1, 9, 0, 0)  # naive UTC, as the store keeps times


def plan(tmp_path, name: str, steps: int = 10, gpus: int = 0, nodes: int = 1) -> RunPlan:
    spec = {"algorithm": "grpo", "kl": "none", "seed": 0, "steps": steps}
    if gpus:
        spec["resources"] = {"nodes": nodes, "gpus_per_node": gpus}
    return RunPlan(name, name, "sw", "local", spec, tmp_path / "runs" / "sw" / name, ["true"])


def log_steps(store, run: RunPlan, lines: dict[int, dict[str, float]]) -> None:
    """Write the run's metrics.jsonl with these steps and ingest it."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    path = rundir.metrics_path(run.run_dir)
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in lines.items()))
    store.ingest_metrics(run.id, path)


def ms(at: datetime) -> int:
    """A naive UTC time as Ray's job times (milliseconds since the epoch)."""
    return int(at.replace(tzinfo=timezone.utc).timestamp() * 1000)


@pytest.fixture
def store(tmp_path):
    opened = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    yield opened
    opened.close()


# ------------------------------------------------------------------------------------------- the store


def test_device_hours_count_the_time_held_not_queued_summed_over_attempts(store, tmp_path):
    """2 nodes x 4 GPUs. Attempt 1: Ray takes the job at T0, it waits 10 min for GPUs, holds them 60 min, is
    preempted. Attempt 2: taken 2 h later, holds them from 5 min after, 30 min. By hand: 8 x 1.5 h = 12."""
    run = plan(tmp_path, "big", steps=10, gpus=4, nodes=2)
    store.record_plans([run])
    store.begin_attempt(run.id)
    store.set_status(run.id, "running", at=T0)
    assert store.set_held_at(run.id, T0 + timedelta(minutes=10))
    assert not store.set_held_at(run.id, T0 + timedelta(minutes=20))  # once per attempt
    store.set_status(run.id, "preempted", at=T0 + timedelta(minutes=70))
    assert cost.run_device_hours(store.run(run.id), T0 + timedelta(days=9)) == pytest.approx(8.0)  # finished: not now's

    store.begin_attempt(run.id)  # the ended attempt folded: 3600 s held
    record = store.run(run.id)
    assert (record.held_s, record.held_at, record.attempts) == (3600.0, None, 2)
    t1 = T0 + timedelta(hours=2)
    store.set_status(run.id, "running", at=t1)
    store.set_held_at(run.id, t1 + timedelta(minutes=5))
    log_steps(
        store,
        run,
        {
            1: {"timing_s/step": 30, "perf/throughput": 901},
            2: {"timing_s/step": 40, "perf/throughput": 902},
            3: {"timing_s/step": 50},
            4: {"critic/score/mean": 0.5},
        },
    )
    live = {r["id"]: r for r in runs_summary(store, now=t1 + timedelta(minutes=20))}[run.id]
    # live: 3600 s + 15 min; pace: the median of 30, 40, 50; 6 steps left; the last throughput logged
    assert live["device_hours"] == pytest.approx(8 * (3600 + 900) / 3600)
    assert (live["s_per_step"], live["eta_s"], live["tokens_s_per_device"]) == (40.0, 240.0, 902.0)

    store.set_status(run.id, "succeeded", at=t1 + timedelta(minutes=35))
    record = store.run(run.id)
    assert not store.set_held_at(run.id, t1)  # a finished run's times are its record
    held = cost.held_seconds(record.held_s, record.held_at, record.finished_at)
    assert held == 3600 + 1800 and cost.device_hours(cost.devices(record.spec), held) == pytest.approx(12.0)
    row = {r["id"]: r for r in runs_summary(store, now=t1 + timedelta(days=3))}[run.id]
    assert row["device_hours"] == pytest.approx(12.0) and row["eta_s"] is None  # finished: no ETA


def test_a_run_that_never_held_its_devices_has_no_device_hours(store, tmp_path):
    cpu = plan(tmp_path, "cpu")
    store.record_plans([cpu])
    store.begin_attempt(cpu.id)
    store.set_status(cpu.id, "running", at=T0)  # running, but still before its mark (verl: waiting for GPUs)
    assert cost.run_device_hours(store.run(cpu.id), T0 + timedelta(hours=5)) is None
    store.set_held_at(cpu.id, T0 + timedelta(hours=1))  # a CPU run holds one device
    assert cost.run_device_hours(store.run(cpu.id), T0 + timedelta(hours=5)) == pytest.approx(4.0)


def test_a_version_6_store_gains_the_device_time_columns(db_url, tmp_path):
    """Version 7: runs.held_s (0 for the runs recorded before) and runs.held_at (NULL); every row kept."""
    store = open_store(db_url)
    try:
        runs = [plan(tmp_path, f"r{i}") for i in range(2)]
        store.record_plans(runs)
        store.set_status("r0", "succeeded", at=T0)
        with store.engine.begin() as conn:  # what version 6 wrote
            for column in ("held_s", "held_at"):
                conn.exec_driver_sql(f"ALTER TABLE runs DROP COLUMN {column}")
            conn.exec_driver_sql("UPDATE schema_version SET version = 6")
    finally:
        store.close()
    store = open_store(db_url, create=False)  # upgraded as `rpg runs` opens it
    try:
        with store.engine.connect() as conn:
            assert migrations.current_version(conn, store.t) == migrations.LATEST
            assert {"held_s", "held_at"} <= {c["name"] for c in sa.inspect(conn).get_columns("runs")}
        found = {r.id: r for r in store.runs()}
        assert {i: (r.status, r.held_s, r.held_at) for i, r in found.items()} == {
            "r0": ("succeeded", 0.0, None),
            "r1": ("pending", 0.0, None),
        }
        assert store.set_held_at("r1", T0) and store.run("r1").held_at == T0
        store.record_plans([plan(tmp_path, "r2")])  # a run recorded after the upgrade starts at 0 too
        assert store.run("r2").held_s == 0.0
    finally:
        store.close()
    open_store(db_url, create=False).close()  # a second open: nothing to do


# ------------------------------------------------------------------------------------------- the watcher


def test_the_watcher_records_the_jobs_mark_once_and_refuses_an_earlier_attempts(store, tmp_path):
    run = plan(tmp_path, "w")
    store.record_plans([run])
    run.run_dir.mkdir(parents=True)
    store.begin_attempt(run.id)
    taken = T0 + timedelta(hours=1)  # when Ray took this attempt's job
    job = SimpleNamespace(status="RUNNING", start_time=ms(taken), end_time=None)

    rundir.mark_held(run.run_dir, T0)  # left by an earlier attempt: before this job was submitted
    assert reconcile.sync_run(None, store, store.run(run.id), job) == "running"
    assert store.run(run.id).held_at is None
    reconcile.note_held(store, store.run(run.id), taken)  # the poll after: still refused
    assert store.run(run.id).held_at is None

    within_skew = taken - timedelta(seconds=reconcile.CLOCK_SKEW_S / 2)  # a node's clock a little behind
    rundir.mark_held(run.run_dir, within_skew.replace(tzinfo=timezone.utc))
    assert reconcile.sync_run(None, store, store.run(run.id), job) == "running"  # a poll of a running run
    assert store.run(run.id).held_at == within_skew

    rundir.mark_held(run.run_dir, taken + timedelta(minutes=5))  # once per attempt: the first mark stands
    reconcile.note_held(store, store.run(run.id), taken)
    assert store.run(run.id).held_at == within_skew


def test_a_mark_that_is_not_a_time_is_no_mark(tmp_path):
    rundir.make_run_dir(tmp_path / "r")
    assert rundir.held_since(tmp_path / "r") is None
    rundir.write_atomic(rundir.held_mark_path(tmp_path / "r"), "yesterday\n")
    assert rundir.held_since(tmp_path / "r") is None
    rundir.mark_held(tmp_path / "r", datetime(2026, 3, 1, 10, 0, tzinfo=timezone(timedelta(hours=1))))
    assert rundir.held_since(tmp_path / "r") == T0  # kept as UTC
    rundir.clear_held(tmp_path / "r")
    assert rundir.held_since(tmp_path / "r") is None
    with pytest.raises(FileNotFoundError):  # a job given a wrong path makes no directory
        rundir.mark_held(tmp_path / "no" / "such")
    assert not (tmp_path / "no").exists()


# ------------------------------------------------------------------------------------------- the jobs


@pytest.fixture
def no_handlers(monkeypatch):
    """The jobs install SIGTERM/SIGUSR1 handlers: not in the test process."""
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)


def test_the_local_job_marks_when_its_trainer_starts_not_before(tmp_path, monkeypatch, no_handlers):
    from rpg_cli.backends.local import __main__ as local_main

    run_dir = rundir.make_run_dir(tmp_path / "runs" / "sw" / "r")
    spec = rundir.write_spec(run_dir, {"steps": 1})
    rundir.mark_held(run_dir, T0)  # an earlier attempt's
    seen = []
    trainer = types.ModuleType("rpg_cli.backends.local.trainer")  # the trainer (torch) stood in for
    trainer.main = lambda spec_path, stop_after=None: seen.append(rundir.held_since(run_dir)) or 0
    monkeypatch.setitem(sys.modules, "rpg_cli.backends.local.trainer", trainer)
    before = datetime.now(timezone.utc).replace(tzinfo=None)
    assert local_main.main(["--spec", str(spec)]) == 0
    assert len(seen) == 1 and seen[0] >= before  # this attempt's mark, there when the trainer starts


def test_the_verl_job_marks_once_its_wait_for_gpus_is_over(tmp_path, monkeypatch, no_handlers):
    from rpg_cli.backends.verl import start

    run_dir = rundir.make_run_dir(tmp_path / "runs" / "sw" / "r")
    rundir.mark_held(run_dir, T0)  # an earlier attempt's
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(rundir.metrics_path(run_dir)))
    seen = []
    monkeypatch.setattr(start, "wait_for_gpus", lambda gpus, run: seen.append(("wait", rundir.held_since(run_dir))))
    monkeypatch.setattr(start, "check_nodes", lambda overrides, run: seen.append(("check", rundir.held_since(run_dir))))
    monkeypatch.setattr(start, "exec_held", lambda argv: seen.append(("exec", rundir.held_since(run_dir))))
    before = datetime.now(timezone.utc).replace(tzinfo=None)
    start.main(["--gpus", "1", "--run", "rpg-r", "--", "trainer.n_gpus_per_node=1"])
    assert [what for what, _ in seen] == ["wait", "check", "exec"]
    assert seen[0][1] is None  # cleared as the attempt began: waiting for GPUs holds none
    assert seen[1][1] is not None and seen[1][1] >= before and seen[2][1] == seen[1][1]


# ------------------------------------------------------------------------------------------- the sweep


def test_the_sweeps_eta_spreads_the_work_left_over_the_runs_at_once(store, tmp_path):
    """Paces 15 (done), 10 (step 4 of 10: 60 s left), 20 (step 8 of 10: 40 s); the pending run's 10 steps at the
    median pace, 15: 150 s. 250 s of work over the 2 runs running: 125 s, more than the longest live ETA."""
    done, fast, slow, waiting = runs = [plan(tmp_path, n) for n in ("done", "fast", "slow", "waiting")]
    store.record_plans(runs)
    for run, pace, last in ((done, 15.0, 10), (fast, 10.0, 4), (slow, 20.0, 8)):
        log_steps(store, run, {s: {"timing_s/step": pace} for s in range(1, last + 1)})
        store.set_status(run.id, "succeeded" if run is done else "running", at=T0)
    snapshot = progress_module.progress(store, "sw", [r.id for r in runs], eta=True)
    assert snapshot.eta == progress_module.SweepEta(1, 4, 22, 40, 125.0)
    assert progress_module.progress(store, "sw", [r.id for r in runs]).eta is None  # only when asked: a terminal's

    store.set_status(waiting.id, "failed", at=T0)  # not retried while the sweep watches: no work left
    eta = progress_module.progress(store, "sw", [r.id for r in runs], eta=True).eta
    assert eta == progress_module.SweepEta(2, 4, 22, 40, 60.0)  # 100 s over 2, less than the fast run's 60 s


def test_the_progress_line_says_runs_steps_and_eta():
    from rich.console import Console

    from rpg_cli.cli.sweep import _progress_line

    console = Console(width=120, record=True, force_terminal=False, color_system=None)
    console.print(_progress_line(progress_module.SweepEta(1, 4, 22, 40, 125.0)))
    console.print(_progress_line(progress_module.SweepEta(0, 4, 0, 40, None)))
    text = console.export_text()
    assert "runs 1/4 · steps 22/40 · ETA 2m05s" in text and "runs 0/4 · steps 0/40 · ETA -" in text
