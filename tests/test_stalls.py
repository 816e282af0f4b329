"""Stalls (issue 30 item 3): a running run whose metrics stopped advancing shows `stalled` in `rpg runs` with its
last line of output, and `rpg sweep --stall-timeout` stops it as failed, resumable with --retry-failed. The rule
(rpg_cli/watch.py) on its own; when the store's clock of a run (metric_files.advanced_at) starts and stops; the
listing; and a job that hangs: a stand-in trainer on a real local Ray head that sleeps after its step 2."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from rpg_cli import watch
from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import open_store

STEP = "timing_s/step"


def now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def line(step: int, seconds: float = 1.0) -> str:
    return json.dumps({"step": step, "data": {STEP: seconds, "critic/score/mean": 0.5}}) + "\n"


def age(path: Path, seconds: float) -> None:
    """Make the file look last written `seconds` ago."""
    stamp = time.time() - seconds
    os.utime(path, (stamp, stamp))


# ------------------------------------------------------------------------------------------ the rule


def test_a_stall_is_judged_after_a_step_on_its_median_without_the_first(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(line(1) + line(2))
    age(tmp_path / "metrics.jsonl", 3600)
    spec = {"watch": {"stall": {"factor": 10, "floor_s": 60}}}
    long_ago = now() - timedelta(hours=1)
    times = [500.0, 20.0, 30.0, 40.0]  # the first step warms up: left out of the median (30 s)
    found = watch.stalled(spec, tmp_path, 4, long_ago, times, now())
    assert found is not None and found.median_s == 30 and found.limit_s == 300 and found.step == 4
    assert 3599 < found.idle_s < 3610
    assert watch.stalled(spec, tmp_path, 4, now() - timedelta(seconds=250), times, now()) is None  # within 10 x 30 s
    assert watch.stalled(spec, tmp_path, 4, None, times, now()) is None  # this attempt has logged no step yet
    assert watch.stalled(spec, tmp_path, 0, long_ago, [], now()) is None  # no step time: still loading, validating
    only = watch.stalled(spec, tmp_path, 1, now() - timedelta(seconds=90), [5.0], now())
    assert only is not None and only.limit_s == 60  # one step known: its own time; the floor binds
    assert watch.stalled({}, tmp_path, 4, long_ago, times, now()).limit_s == 600  # the default floor: 600 s
    age(tmp_path / "metrics.jsonl", 5)  # the file is still written to (nobody ingests it: a detached sweep)
    assert watch.stalled(spec, tmp_path, 4, long_ago, times, now()) is None


def test_the_last_line_is_the_newest_file_s(tmp_path):
    assert watch.last_line(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text(line(1) + line(2, 7.5) + "\n\n")
    assert watch.last_line(tmp_path) == "metrics.jsonl: " + line(2, 7.5).strip()
    (tmp_path / "job.log").write_text("loading\nNCCL WARN waiting for rank 3\n")
    age(tmp_path / "metrics.jsonl", 60)
    assert watch.last_line(tmp_path) == "job.log: NCCL WARN waiting for rank 3"
    age(tmp_path / "job.log", 600)  # an earlier attempt's job.log: the metrics are newer
    assert watch.last_line(tmp_path).startswith("metrics.jsonl: ")
    (tmp_path / "metrics.jsonl").write_text("x" * 5000 + "\n")
    assert len(watch.last_line(tmp_path)) == 200 and watch.last_line(tmp_path).endswith("…")


# ------------------------------------------------------------------------------- the store's clock


def record(store, tmp_path: Path, text: str, spec: dict | None = None, name: str = "r") -> RunPlan:
    plan = RunPlan(name, name, "s", "local", spec or {"steps": 9}, tmp_path / name, ["true"])
    store.record_plans([plan], "s")
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    (plan.run_dir / "metrics.jsonl").write_text(text)
    store.begin_attempt(name)
    store.set_status(name, "running", submission_id=name)
    store.ingest_metrics(name, plan.run_dir / "metrics.jsonl")
    return plan


def advanced_at(store, run_id: str) -> datetime | None:
    return store.stall_facts([run_id])[run_id][0]


def test_the_store_knows_when_a_run_last_advanced_in_its_attempt(db_url, tmp_path):
    store = open_store(db_url)
    try:
        plan = record(store, tmp_path, line(1, 50.0) + line(2, 10.0))
        first = advanced_at(store, plan.id)
        assert first is not None and abs((now() - first).total_seconds()) < 60
        assert store.stall_facts([plan.id])[plan.id][1] == [50.0, 10.0]
        path = plan.run_dir / "metrics.jsonl"
        with open(path, "a") as f:
            f.write(line(2, 11.0))  # a step logged again (a value corrected): no progress
        store.ingest_metrics(plan.id, path)
        assert advanced_at(store, plan.id) == first
        with open(path, "a") as f:
            f.write(line(3, 12.0))
        store.ingest_metrics(plan.id, path)
        assert advanced_at(store, plan.id) > first
        store.begin_attempt(plan.id)  # a new attempt: nothing advanced yet, whatever the last one did
        assert advanced_at(store, plan.id) is None
        with open(path, "a") as f:  # it resumes from step 2's checkpoint: its restart, the resumed step again
            f.write(json.dumps({"restart": {"keep_through": 2}}) + "\n" + line(2, 9.0))
        store.ingest_metrics(plan.id, path)
        assert advanced_at(store, plan.id) is None  # step 2 again is no new step
        with open(path, "a") as f:
            f.write(line(3, 13.0))
        store.ingest_metrics(plan.id, path)
        assert advanced_at(store, plan.id) is not None  # step 3 of this attempt is
        assert store.stall_facts([plan.id, "none"])["none"] == (None, [])
    finally:
        store.close()


# ------------------------------------------------------------------------------------------ rpg runs


def stall_store(tmp_path: Path) -> tuple[str, RunPlan, RunPlan]:
    """A store with two running runs: `hung` logged step 3 an hour ago, `busy` a minute ago."""
    db = f"sqlite:///{tmp_path / 'results.db'}"
    store = open_store(db)
    try:
        hung = record(store, tmp_path, line(1, 200.0) + line(2, 30.0) + line(3, 30.0), name="hung")
        busy = record(store, tmp_path, line(1, 200.0) + line(2, 30.0), name="busy")
        (hung.run_dir / "job.log").write_text("the earlier attempt's output\n")
        age(hung.run_dir / "job.log", 7200)
        age(hung.run_dir / "metrics.jsonl", 3600)
        mf = store.t.metric_files
        with store.engine.begin() as conn:
            conn.execute(mf.update().where(mf.c.run_id == "hung").values(advanced_at=now() - timedelta(hours=1)))
            conn.execute(mf.update().where(mf.c.run_id == "busy").values(advanced_at=now() - timedelta(minutes=1)))
    finally:
        store.close()
    return db, hung, busy


def test_runs_shows_a_stalled_run_with_its_last_line(tmp_path, monkeypatch):
    from rpg_cli.orchestration import reconcile

    monkeypatch.setattr(reconcile, "reconcile", lambda *a, **k: reconcile.Reconciled())  # Ray confirms: still running
    db, hung, _ = stall_store(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["runs", "--db", db, "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["hung"]["status"] == "running" and 3590 < rows["hung"]["stalled_s"] < 3700  # a view, not a state
    assert rows["hung"]["last_line"] == "metrics.jsonl: " + line(3, 30.0).strip()
    assert rows["busy"]["stalled_s"] is None and rows["busy"]["last_line"] is None
    result = runner.invoke(app, ["runs", "--db", db, "--wide"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    table = {row.split("│")[2].strip(): row for row in result.output.splitlines() if row.startswith("│")}
    assert "stalled" in table["hung"] and "stalled 60 min: metrics.jsonl: {" in table["hung"]
    assert "running" in table["busy"] and "stalled" not in table["busy"]
    assert "2 runs: 2 running (1 stalled)" in result.output and "--stall-timeout SECONDS" in result.output
    csv = runner.invoke(app, ["runs", "--db", db, "--format", "csv"]).output.splitlines()
    assert csv[0].endswith(",error,stalled_s,last_line")


@pytest.mark.parametrize(
    ("args", "error"),
    [(["--stall-timeout", "-1"], "allowed: seconds >= 0"), (["--stall-timeout", "5", "--detach"], "drop --detach")],
)
def test_stall_timeout_takes_seconds_and_a_followed_sweep(args, error):
    result = CliRunner().invoke(app, ["sweep", "no-such.yaml", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and error in result.output, result.output


# ---------------------------------------------------------------------------- a job that hangs, on Ray

# The stand-in trainer: writes steps (timing_s/step 0.05 s each) and a "checkpoint" after each; resumes after its
# checkpoint with a restart line, as both backends do. Mode hang: on its first attempt it sleeps after step 2
# (until stopped); its next attempt finishes. Mode short: exits 0 after step 2 of its steps. Mode drift: logs
# rollout_corr/k3_kl 0.3 at step 2, beyond its default bound, then goes on slowly.
TRAINER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    run_dir, steps, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = run_dir / "ckpt"
    start = int(ckpt.read_text()) + 1 if ckpt.exists() else 1
    with open(run_dir / "metrics.jsonl", "a") as f:
        if start > 1:
            f.write(json.dumps({"restart": {"keep_through": start - 1}}) + "\\n")
        for step in range(start, steps + 1):
            time.sleep(0.05)
            data = {"timing_s/step": 0.05, "critic/score/mean": 0.5}
            if mode == "drift":  # vLLM's weights part from the trainer's: then it trains on, slowly
                data["rollout_corr/k3_kl"] = 1e-3 if step == 1 else 0.3
            f.write(json.dumps({"step": step, "data": data}) + "\\n")
            f.flush()
            ckpt.write_text(str(step))
            print(f"step {step} done", flush=True)
            if step == 2 and mode == "hang" and not (run_dir / "hung-once").exists():
                (run_dir / "hung-once").touch()
                print("waiting for a collective that never comes", flush=True)
                time.sleep(600)
            if step == 2 and mode == "short":
                sys.exit(0)
            if step == 2 and mode == "drift":
                time.sleep(600)
    """
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray.job_submission", reason="the hanging job runs on a local Ray head (ray[default])")
    from rpg_cli.orchestration.head import _head_dir, _temp_dir, local_head, stop_local_head

    root = tmp_path_factory.mktemp("stalls")
    runs_dir = root / "runs"
    (root / "trainer.py").write_text(TRAINER)
    temp_dir = str(_temp_dir(_head_dir(runs_dir)))
    try:
        local_head(runs_dir, num_cpus=2)
        yield {"root": root, "runs": runs_dir}
        assert stop_local_head(runs_dir)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def plan_of(cluster, name: str, mode: str, steps: int = 4) -> RunPlan:
    run_dir = cluster["runs"] / "stalls" / name
    spec = {"steps": steps, "watch": {"stall": {"factor": 2, "floor_s": 1}}}  # stalled after 1 s of silence
    entrypoint = [sys.executable, str(cluster["root"] / "trainer.py"), str(run_dir), str(steps), mode]
    return RunPlan(f"stalls-{name}", name, "stalls", "local", spec, run_dir, entrypoint, num_cpus=0.5)


@pytest.mark.slow
def test_a_hung_run_is_stopped_failed_and_resumed_a_drifting_one_stopped_a_short_one_failed(cluster, tmp_path):
    from rpg_cli.orchestration.sweep import run_sweep

    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = [plan_of(cluster, "hangs", "hang"), plan_of(cluster, "short", "short"), plan_of(cluster, "drifts", "drift")]
    started = time.monotonic()
    final = run_sweep(plans, "stalls", db, runs_dir=cluster["runs"], poll_s=0.3, stall_timeout=0.5)
    assert time.monotonic() - started < 120, "the hung run was not stopped"
    runs = {r.name: r for r in final.runs}
    assert (runs["hangs"].status, runs["hangs"].step) == ("failed", 2)
    assert runs["hangs"].error.startswith("stalled at step 2 for ")
    assert "--stall-timeout 0.5 s more; stopped" in runs["hangs"].error
    assert runs["hangs"].error.endswith("`rpg sweep SPEC --retry-failed` resumes it from its checkpoint")
    assert "waiting for a collective" in (plans[0].run_dir / "job.log").read_text()  # the output kept
    assert runs["short"].status == "failed"
    assert runs["short"].error.startswith("the job exited 0 at step 2 of 4: the run is short of its steps")
    assert runs["drifts"].status == "failed"  # stopped by the watcher, long before its sleep ends
    assert runs["drifts"].error.startswith(
        "weights in vLLM differ from the trainer's: rollout_corr/k3_kl 0.3 at step 2, bound 0.1;"
    )

    again = run_sweep(plans[:1], "stalls", db, runs_dir=cluster["runs"], poll_s=0.3, retry_failed=True)
    (resumed,) = again.runs
    assert (resumed.status, resumed.attempts, resumed.step, resumed.error) == ("succeeded", 2, 4, None)
    store = open_store(db, create=False)
    try:
        with store.engine.connect() as conn:
            m = store.t.metrics.c
            rows = conn.execute(sa.select(m.step).where(m.run_id == resumed.id, m.key == STEP)).scalars().all()
        assert sorted(rows) == [1, 2, 3, 4]  # resumed after its step-2 checkpoint: every step once
    finally:
        store.close()
