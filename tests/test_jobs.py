"""Ray jobs against a real local Ray head (started once for this module, stopped at its end) and a
real SQLite store: sweeps run to completion, a killed driver loses and resubmits nothing, retries,
cancel and logs, the head's reuse and loopback binding, and unreachable clusters."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import make_spec
from helpers import eval_row
from typer.testing import CliRunner

pytest.importorskip("ray.job_submission", reason="the Ray tests need ray[default]")
psutil = pytest.importorskip("psutil")

from rpg_cli.cli import app  # noqa: E402
from rpg_cli.orchestration.head import ClusterError, _head_dir, _temp_dir, connect, local_head, stop_local_head  # noqa: E402
from rpg_cli.orchestration.plan import RunPlan  # noqa: E402
from rpg_cli.orchestration.sweep import run_sweep  # noqa: E402
from rpg_cli.store import open_store, run_states  # noqa: E402

pytestmark = pytest.mark.slow

# A stand-in trainer: writes STEPS lines of metrics.jsonl (verl's file-logger format), one every
# DELAY seconds, records the arguments and environment it got, then exits by MODE:
# ok | fail (always) | fail-once (fails on its first attempt only) | hang (sleeps until stopped) |
# sigkill (killed by signal 9).
TRAINER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    run_dir, steps, delay, mode = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "argv.json").write_text(json.dumps({"argv": sys.argv[5:], "env": os.environ.get("RPG_TEST_ENV")}))
    with open(run_dir / "metrics.jsonl", "a") as f:
        for step in range(1, steps + 1):
            while mode == "gated" and step == steps and not (run_dir.parent / "release").exists():
                time.sleep(0.1)  # held before its last step until the test lets it finish
            f.write(json.dumps({"step": step, "data": {"critic/score/mean": step / steps, "actor/pg_loss": -step, "note": "x"}}) + "\\n")
            f.flush()
            time.sleep(delay)
    print(f"trainer finished {steps} steps", flush=True)
    if mode == "fail" or (mode == "fail-once" and not (run_dir / "failed-once").exists()):
        (run_dir / "failed-once").touch()
        sys.exit("trainer failing on purpose")
    if mode == "hang":
        time.sleep(600)
    if mode == "sigkill":  # as the kernel's out-of-memory killer would
        os.kill(os.getpid(), 9)
    """
)

# The `rpg sweep` driver, as its own process so that it can be killed: plans from a JSON file.
DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from rpg_cli.orchestration.plan import RunPlan
    from rpg_cli.orchestration.sweep import run_sweep

    plans_file, sweep, db, runs_dir = sys.argv[1:5]
    plans = [RunPlan(**{**p, "run_dir": Path(p["run_dir"])}) for p in json.loads(Path(plans_file).read_text())]
    run_sweep(plans, sweep, db, runs_dir=Path(runs_dir), poll_s=0.3, on_update=lambda s: print(s.counts, flush=True))
    """
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One local head for the module, in its own runs dir; stopped (by its pids) at the end."""
    root = tmp_path_factory.mktemp("jobs")
    runs_dir = root / "runs"
    (root / "trainer.py").write_text(TRAINER)
    (root / "driver.py").write_text(DRIVER)
    temp_dir = str(_temp_dir(_head_dir(runs_dir)))
    try:
        head = local_head(runs_dir, num_cpus=4)
        yield {"root": root, "runs": runs_dir, "head": head}
        assert stop_local_head(runs_dir)
        leftovers = [p for p in psutil.process_iter() if _mentions(p, temp_dir)]
        assert not leftovers, f"processes of the test head survived: {leftovers}"
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _mentions(proc, text: str) -> bool:
    try:
        return text in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def make_plan(
    cluster, sweep: str, name: str, steps: int, mode: str = "ok", delay: float = 0.1, extra: list[str] = ()
) -> RunPlan:
    run_dir = cluster["runs"] / sweep / name
    return RunPlan(
        id=f"{sweep}-{name}",
        name=name,
        sweep=sweep,
        backend="local",
        spec={"name": name, "steps": steps, "mode": mode},
        run_dir=run_dir,
        entrypoint=[
            sys.executable,
            str(cluster["root"] / "trainer.py"),
            str(run_dir),
            str(steps),
            str(delay),
            mode,
            *extra,
        ],
        num_cpus=1.0,
        env={"RPG_TEST_ENV": f"env of {name}"},
    )


def ray_submissions(cluster) -> list[str]:
    return sorted(j.submission_id for j in connect(runs_dir=cluster["runs"]).list_jobs() if j.submission_id)


def deadline_guard(seconds: float):
    end = time.monotonic() + seconds
    snapshots = []

    def on_update(snapshot):
        snapshots.append(snapshot)
        if time.monotonic() > end:
            pytest.fail(f"sweep still unfinished after {seconds} s: {snapshot.counts}")

    return on_update, snapshots


# --------------------------------------------------------------------------------------- the head


def test_head_is_reused_bound_to_loopback_token_protected_with_short_socket_paths(cluster):
    head = cluster["head"]
    assert local_head(cluster["runs"]) == head  # found and reused, not a second head
    assert head.dashboard_url.startswith("http://127.0.0.1:") and head.gcs_address.startswith("127.0.0.1:")
    assert len(head.temp_dir) <= 38  # the pytest tmp path is too long for Ray's sockets: a short dir
    assert json.loads((cluster["runs"] / "ray" / "head.json").read_text())["temp_dir"] == head.temp_dir
    with pytest.raises(urllib.error.HTTPError, match="401"):  # token auth: nobody else may submit jobs
        urllib.request.urlopen(f"{head.dashboard_url}/api/version", timeout=5)
    group = [p for p in psutil.process_iter() if _safe_pgid(p) == head.pgid]
    listening = {c.laddr.ip for p in group for c in _inet_listeners(p)}
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening
    # Everything the head keeps is its owner's only: Ray makes its own temp dir 0777, so that dir sits
    # inside a 0700 one; head.json and the token are the owner's, and nobody else may write (or read) them.
    head_dir = cluster["runs"] / "ray"
    for private in (head_dir, Path(head.temp_dir).parent):
        info = private.stat()
        assert info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700, (private, oct(info.st_mode))
    for name in ("head.json", "auth_token"):
        info = (head_dir / name).stat()
        assert info.st_uid == os.geteuid() and info.st_mode & 0o077 == 0, name


def _safe_pgid(p):
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


def _inet_listeners(p):
    try:
        return [c for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        return []


# ---------------------------------------------------------------------------------------- sweeps


def test_sweep_runs_to_completion_then_skips_then_retries(cluster, tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    tricky = "a b; echo $HOME `id` 'q' \"dq\" > /dev/null"  # must reach the trainer as one argument
    plans = [
        make_plan(cluster, "s1", "ok-a", steps=3, extra=[tricky]),
        make_plan(cluster, "s1", "ok-b", steps=4),
        make_plan(cluster, "s1", "ok-c", steps=2),
        make_plan(cluster, "s1", "flaky", steps=3, mode="fail-once"),
    ]
    on_update, snapshots = deadline_guard(90)
    final = run_sweep(plans, "s1", db, runs_dir=cluster["runs"], on_update=on_update, poll_s=0.5)

    assert final.finished and snapshots[-1] == final and len(snapshots) >= 2
    assert sum(snapshots[0].counts.values()) == 4 and snapshots[0].counts["succeeded"] == 0
    assert final.counts == {
        "pending": 0,
        "submitted": 0,
        "running": 0,
        "succeeded": 3,
        "failed": 1,
        "stopped": 0,
        "preempted": 0,
    }
    by_name = {r.name: r for r in final.runs}
    assert "trainer failing on purpose" in by_name["flaky"].error
    store = open_store(db)
    try:
        for p, steps in zip(plans, (3, 4, 2, 3)):
            assert store.latest(p.id) == (steps, {"critic/score/mean": 1.0, "actor/pg_loss": -float(steps)})
            assert by_name[p.name].step == steps and by_name[p.name].reward == 1.0
            run = store.run(p.id)
            assert run.attempts == 1 and run.submission_id == p.id
            assert run.started_at is not None and run.finished_at >= run.started_at
            assert json.loads((p.run_dir / "spec.json").read_text()) == p.spec
            assert f"trainer finished {steps} steps" in (p.run_dir / "job.log").read_text()
            assert json.loads((p.run_dir / "argv.json").read_text())["env"] == f"env of {p.name}"
        assert json.loads((plans[0].run_dir / "argv.json").read_text())["argv"] == [tricky]
    finally:
        store.close()
    submitted = ray_submissions(cluster)
    assert [s for s in submitted if s.startswith("s1-")] == sorted(p.id for p in plans)

    # again: nothing to do, nothing submitted; the failed run is left alone without retry_failed
    again = run_sweep(plans, "s1", db, runs_dir=cluster["runs"], poll_s=0.5)
    assert again.counts["succeeded"] == 3 and again.counts["failed"] == 1
    assert ray_submissions(cluster) == submitted

    # with retry_failed: only the failed run goes again, under a fresh submission id
    on_update, _ = deadline_guard(60)
    retried = run_sweep(plans, "s1", db, runs_dir=cluster["runs"], retry_failed=True, on_update=on_update, poll_s=0.5)
    assert retried.counts["succeeded"] == 4
    assert sorted(set(ray_submissions(cluster)) - set(submitted)) == ["s1-flaky-2"]
    store = open_store(db)
    try:
        flaky = store.run("s1-flaky")
        assert (flaky.attempts, flaky.submission_id, flaky.error) == (2, "s1-flaky-2", None)
        assert store.latest("s1-flaky")[0] == 3
    finally:
        store.close()


def test_killed_driver_loses_nothing_and_resubmits_nothing(cluster, tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = [
        make_plan(cluster, "s2", "quick-a", steps=1, delay=0),
        make_plan(cluster, "s2", "quick-b", steps=1, delay=0),
        make_plan(cluster, "s2", "slow-a", steps=10, delay=0.1, mode="gated"),
        make_plan(cluster, "s2", "slow-b", steps=10, delay=0.1, mode="gated"),
        make_plan(cluster, "s2", "broken", steps=1, delay=0, mode="fail"),
    ]
    plans_file = tmp_path / "plans.json"
    plans_file.write_text(json.dumps([{**p.__dict__, "run_dir": str(p.run_dir)} for p in plans]))
    driver = [sys.executable, str(cluster["root"] / "driver.py"), str(plans_file), "s2", db, str(cluster["runs"])]
    ids = [p.id for p in plans]

    def wait_for(condition, timeout=90):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            states = run_states(db, ids)
            if condition(states):
                return states
            time.sleep(0.2)
        pytest.fail(f"timed out; states: {run_states(db, ids)}")

    # 1. SIGKILL the driver once some runs have succeeded while others are still live
    proc = subprocess.Popen(driver, stderr=subprocess.PIPE, text=True)
    wait_for(lambda s: "succeeded" in s.values() and {"submitted", "running"} & set(s.values()))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    # 2. a second driver re-attaches; interrupt it (Ctrl-C) while it follows the live runs
    proc = subprocess.Popen(driver, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("{'pending'")  # a snapshot: it has submitted and follows
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err

    # 3. a third one follows everything to the end (the slow runs, held until now, may finish)
    (cluster["runs"] / "s2" / "release").touch()
    on_update, _ = deadline_guard(90)
    final = run_sweep(plans, "s2", db, runs_dir=cluster["runs"], on_update=on_update, poll_s=0.3)
    assert {r.name: r.status for r in final.runs} == {
        "quick-a": "succeeded",
        "quick-b": "succeeded",
        "slow-a": "succeeded",
        "slow-b": "succeeded",
        "broken": "failed",
    }
    assert [s for s in ray_submissions(cluster) if s.startswith("s2-")] == sorted(ids)  # each submitted once
    store = open_store(db)
    try:
        for p, steps in zip(plans, (1, 1, 10, 10, 1)):
            assert store.run(p.id).attempts == 1
            assert store.latest(p.id) == (steps, {"critic/score/mean": 1.0, "actor/pg_loss": -float(steps)})
            with store.engine.connect() as conn:
                rows = conn.exec_driver_sql("SELECT COUNT(*) FROM metrics WHERE run_id = ?", (p.id,)).scalar()
            assert rows == 2 * steps  # every step, once
    finally:
        store.close()


def test_watch_sweep_renders_progress_and_exits_by_outcome(cluster, tmp_path, capsys):
    import typer

    from rpg_cli.cli.sweep import _watch_sweep
    from rpg_cli.orchestration.dryrun import plan_runs

    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = [make_plan(cluster, "s4", "fine", steps=2), make_plan(cluster, "s4", "doomed", steps=1, mode="fail")]
    with pytest.raises(typer.Exit) as exit_info:
        _watch_sweep(plan_runs(plans, db), db, runs_dir=str(cluster["runs"]))
    assert exit_info.value.exit_code == 1  # a run failed
    captured = capsys.readouterr()
    out = captured.out
    assert "sweep s4" in out and "fine" in out and "doomed" in out and "succeeded 1" in out and "failed 1" in out
    assert captured.err.strip().endswith("stays up for the next command; `rpg stop` ends it")
    assert "trainer failing on purpose" in out

    _watch_sweep(plan_runs(plans[:1], db), db, runs_dir=str(cluster["runs"]), detach=True)  # done already: returns
    assert "nothing to submit in s4: 1 succeeded" in capsys.readouterr().out


# --------------------------------------------------------------------------------- cancel, logs


def test_cancel_and_logs_through_the_cli(cluster, tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plan = make_plan(cluster, "s3", "hanging", steps=1, delay=0, mode="hang")
    submitted = run_sweep([plan], "s3", db, runs_dir=cluster["runs"], detach=True)
    assert submitted.counts["submitted"] == 1
    runner = CliRunner()
    common = ["--db", db, "--runs-dir", str(cluster["runs"])]

    end = time.monotonic() + 60
    while "trainer finished" not in (result := runner.invoke(app, ["logs", plan.name, *common])).output:
        assert result.exit_code == 0, result.output
        assert time.monotonic() < end, result.output
        time.sleep(0.5)

    result = runner.invoke(app, ["cancel", "s3", *common])
    assert result.exit_code == 0, result.output
    assert "stopped 1 run(s): hanging" in result.output
    assert run_states(db, [plan.id]) == {plan.id: "stopped"}
    client = connect(runs_dir=cluster["runs"])
    end = time.monotonic() + 30
    while str(client.get_job_status(plan.id)) != "STOPPED":
        assert time.monotonic() < end
        time.sleep(0.5)

    result = runner.invoke(app, ["runs", "--db", db])
    assert "stopped" in result.output and "hanging" in result.output
    result = runner.invoke(app, ["cancel", plan.id, *common])
    assert result.exit_code == 0 and "nothing to stop" in result.output
    result = runner.invoke(app, ["logs", "no-such-run", *common])
    assert result.exit_code == 2 and "no-such-run" in result.output


# --------------------------------------------------------------------------- unreachable cluster


def test_unreachable_cluster_is_a_one_line_error_and_writes_nothing(tmp_path):
    dead = "http://127.0.0.1:9"  # discard port: nothing listens there
    db = tmp_path / "runs" / "results.db"
    plan = RunPlan("x1", "x", "sx", "local", {}, tmp_path / "runs" / "sx" / "x", [sys.executable, "-c", "pass"])
    with pytest.raises(ClusterError, match="--address"):
        run_sweep([plan], "sx", f"sqlite:///{db}", address=dead, runs_dir=tmp_path / "runs")
    assert not db.exists() and not plan.run_dir.exists()

    store = open_store(f"sqlite:///{db}")
    store.record_plan(plan)
    store.set_status(plan.id, "running", submission_id=plan.id)
    store.close()
    result = CliRunner().invoke(app, ["cancel", plan.id, "--db", f"sqlite:///{db}", "--address", dead])
    assert result.exit_code == 2
    assert (
        len(result.output.strip().splitlines()) == 1
        and "--address" in result.output
        and "ray start --head" in result.output
    )
    assert run_states(f"sqlite:///{db}", [plan.id]) == {plan.id: "running"}  # nothing changed


# ------------------------------------------------------------------------------ sweeps sharing runs


def test_two_sweeps_sharing_a_run_agree_on_its_state_and_its_directory(cluster, tmp_path, monkeypatch):
    """A run is its spec: the second sweep that lists it joins it, and it stays in the first one's
    directory; runs, report, eval, cancel and resume all see it in both sweeps."""
    import dataclasses

    from rpg_cli.orchestration import sweep as sweep_module

    def rehome(plan, run_dir):  # the stand-in trainer's plan, in the directory the store kept
        argv = [str(run_dir) if a == str(plan.run_dir) else a for a in plan.entrypoint]
        return dataclasses.replace(plan, run_dir=run_dir, entrypoint=argv)

    monkeypatch.setattr(sweep_module, "rehome", rehome)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    common = ["--db", db, "--runs-dir", str(cluster["runs"])]
    runner = CliRunner()

    def shared(sweep: str, mode: str = "ok") -> RunPlan:
        return dataclasses.replace(make_plan(cluster, sweep, "shared", steps=2, mode=mode), id="shared-cell")

    first = run_sweep(
        [shared("m1"), make_plan(cluster, "m1", "own-1", steps=2)], "m1", db, runs_dir=cluster["runs"], poll_s=0.3
    )
    assert first.counts["succeeded"] == 2
    submitted = ray_submissions(cluster)
    second = run_sweep(
        [shared("m2"), make_plan(cluster, "m2", "own-2", steps=2)], "m2", db, runs_dir=cluster["runs"], poll_s=0.3
    )
    assert second.counts["succeeded"] == 2
    assert set(ray_submissions(cluster)) - set(submitted) == {"m2-own-2"}  # the shared run was done already
    home = cluster["runs"] / "m1" / "shared"
    assert not (cluster["runs"] / "m2" / "shared").exists()
    store = open_store(db)
    try:
        run = store.run("shared-cell")
        assert (run.sweep, run.run_dir, run.attempts) == ("m1", home.resolve(), 1)  # did not move
        assert [r.id for r in store.runs(sweep="m1")] == ["shared-cell", "m1-own-1"]
        assert sorted(r.id for r in store.runs(sweep="m2")) == ["m2-own-2", "shared-cell"]
        store.record_evals([eval_row(run_id="shared-cell", n=4)])
    finally:
        store.close()
    for sweep in ("m1", "m2"):
        listed = runner.invoke(app, ["runs", "--sweep", sweep, "--format", "json", "--db", db])
        assert listed.exit_code == 0 and "shared-cell" in {r["id"] for r in json.loads(listed.output)}
        table = runner.invoke(app, ["report", "--sweep", sweep, "--format", "csv", "--db", db])
        assert table.exit_code == 0 and "0.5" in table.output, table.output
        # rpg eval SWEEP finds the shared run's checkpoints where they are
        (home / "checkpoints" / "step_2").mkdir(parents=True, exist_ok=True)
        (home / "checkpoints" / "step_2" / "config.json").write_text("{}")
        (home / "checkpoints" / "step_2" / "model.safetensors").write_bytes(b"")
        targets = {t.run_id: t for t in _plan_targets(sweep, db)}
        assert targets["shared-cell"].run_dir == home.resolve()

    # a live shared run: the second sweep attaches to it, cancel through it stops it (the first sweep
    # sees that), and a retry through the second resumes it in the first one's directory
    def held(sweep: str, mode: str) -> RunPlan:
        return dataclasses.replace(make_plan(cluster, sweep, "held", steps=2, mode=mode), id="held-cell")

    held_home = cluster["runs"] / "m1" / "held"
    run_sweep([held("m1", "hang")], "m1", db, runs_dir=cluster["runs"], detach=True)
    end = time.monotonic() + 120
    while not (held_home / "argv.json").exists():
        assert time.monotonic() < end, "the held run never started"
        time.sleep(0.2)
    submitted = ray_submissions(cluster)
    attached = run_sweep([held("m2", "hang")], "m2", db, runs_dir=cluster["runs"], detach=True)
    assert attached.counts["running"] + attached.counts["submitted"] == 1 and ray_submissions(cluster) == submitted
    stopped = runner.invoke(app, ["cancel", "m2", *common])
    assert stopped.exit_code == 0 and "held" in stopped.output, stopped.output
    listed = runner.invoke(app, ["runs", "--sweep", "m1", "--format", "json", "--db", db])
    assert {r["id"]: r["status"] for r in json.loads(listed.output)}["held-cell"] == "stopped"
    client, end = connect(runs_dir=cluster["runs"]), time.monotonic() + 60
    while not client.get_job_status("held-cell").is_terminal():  # Ray stops a job in its own time
        assert time.monotonic() < end, "Ray never stopped the held run's job"
        time.sleep(0.2)
    (held_home / "argv.json").unlink()
    again = run_sweep([held("m2", "ok")], "m2", db, runs_dir=cluster["runs"], retry_failed=True, poll_s=0.3)
    assert again.counts["succeeded"] == 1 and (held_home / "argv.json").exists(), again
    assert not (cluster["runs"] / "m2" / "held").exists() and not (cluster["runs"] / "m2" / "shared").exists()
    store = open_store(db)
    try:
        assert (store.run("held-cell").sweep, store.run("held-cell").attempts) == ("m1", 2)
    finally:
        store.close()


def _plan_targets(ref: str, db: str) -> list:
    """The runs and checkpoints `rpg eval REF` would evaluate (a benchmark file is not needed for that)."""
    from rpg_cli.evaluation.options import EvalOptions
    from rpg_cli.evaluation.plan import _resolve_targets

    targets, _ = _resolve_targets(EvalOptions(ref=ref, db=db))
    return targets


# --------------------------------------------------------- detached runs, reconciled by every command


def test_runs_that_end_unwatched_are_brought_up_to_date_by_every_command(cluster, tmp_path, monkeypatch):
    """--detach leaves no watcher: `rpg runs`, `report`, `logs`, `cancel` and `stop` each ask Ray first.
    A succeeded run stays succeeded under `rpg cancel`; a job killed by a signal says which."""
    from rpg_cli.orchestration import controls

    db = f"sqlite:///{tmp_path / 'results.db'}"
    common = ["--db", db, "--runs-dir", str(cluster["runs"])]
    runner = CliRunner()
    plans = {
        name: make_plan(cluster, "s5", name, steps=2, delay=0, mode="sigkill" if name == "killed" else "ok")
        for name in ("seen-by-runs", "killed", "seen-by-report", "seen-by-logs", "cancelled-too-late")
    }
    run_sweep(list(plans.values()), "s5", db, runs_dir=cluster["runs"], detach=True)
    client = connect(runs_dir=cluster["runs"])
    end = time.monotonic() + 90
    while any(str(client.get_job_status(p.id)) not in ("SUCCEEDED", "FAILED") for p in plans.values()):
        assert time.monotonic() < end, "the detached jobs did not end"
        time.sleep(0.5)
    ids = {name: p.id for name, p in plans.items()}
    assert set(run_states(db, ids.values()).values()) <= {"pending", "submitted", "running"}  # nobody watched

    result = runner.invoke(app, ["runs", "--sweep", "s5", "--wide", *common], env={"COLUMNS": "300"})
    assert result.exit_code == 0 and "possibly stale" not in result.output, result.output
    assert "killed by signal 9 (SIGKILL)" in result.output
    states = run_states(db, ids.values())
    assert all(states[ids[n]] == "succeeded" for n in plans if n != "killed") and states[ids["killed"]] == "failed"
    # every command reconciles all it shows; reset the store's view to check the others one by one
    for name, command in (
        ("seen-by-report", ["report", "--sweep", "s5"]),
        ("seen-by-logs", ["logs", plans["seen-by-logs"].name]),
        ("cancelled-too-late", ["cancel", plans["cancelled-too-late"].name]),
    ):
        store = open_store(db)
        store.set_status(ids[name], "running")  # what a watcher killed before the end leaves
        store.close()
        result = runner.invoke(app, [*command, *common])
        assert run_states(db, [ids[name]]) == {ids[name]: "succeeded"}, (command, result.output)
    assert "1 run(s) had already ended: cancelled-too-late" in result.output and "stopped" not in result.output
    store = open_store(db)
    try:
        run = store.run(ids["cancelled-too-late"])
        assert run.finished_at >= run.started_at and run.error is None  # a wall time, never negative
    finally:
        store.close()

    # `rpg stop` refuses for a job that in truth runs, and only for that (the shared head is kept)
    monkeypatch.setattr(controls, "stop_local_head", lambda runs_dir: True)
    hanging = make_plan(cluster, "s5", "hanging", steps=1, delay=0, mode="hang")
    run_sweep([hanging], "s5", db, runs_dir=cluster["runs"], detach=True)
    result = runner.invoke(app, ["stop", *common])
    assert (
        result.exit_code == 2 and "job(s) are live on the local head (" in result.output and "hanging" in result.output
    )
    assert runner.invoke(app, ["cancel", hanging.name, *common]).exit_code == 0
    result = runner.invoke(app, ["stop", *common])
    assert result.exit_code == 0 and "stopped the local Ray head" in result.output, result.output


# A verl job's driver as far as its ray.init: verl's own config composed with the overrides rpg generates, then
# verl's own `run_ppo`, whose TaskRunner here only reports the environment it was started with.
VERL_RAY_INIT = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    import ray
    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    out, overrides = Path(sys.argv[1]), sys.argv[2:]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)

    @ray.remote(num_cpus=0)
    class Probe:
        def run(self, config):
            keys = ("VERL_USE_EXTERNAL_MODULES", "VERL_FILE_LOGGER_PATH", "TOKENIZERS_PARALLELISM")
            out.write_text(json.dumps({key: os.environ.get(key) for key in keys}))

    main_ppo.run_ppo(config, Probe)
    """
)


def test_a_verl_job_passes_ray_init_and_its_workers_get_the_jobs_environment(cluster, tmp_path):
    """Ray 2.60 fails a job whose driver calls ray.init with a runtime_env repeating a key of the job's own
    ("Failed to merge the Job's runtime env ... because of a conflict"): rpg's env vars live in the job's
    runtime_env alone, and verl's actors get them from there."""
    pytest.importorskip("verl", reason="the verl extra is not installed")
    from rpg_cli.backends.verl import launch
    from rpg_cli.orchestration.submit import submit

    spec = make_spec(
        algorithm="rpg_reinforce",
        beta=1e-4,
        reference="frozen",
        model="toy/model",
        train_batch_size=2,
        ppo_mini_batch_size=1,
        lr=1e-5,
        steps=2,
        save_every=1,
        backend="verl",
        resources={"nodes": 1, "gpus_per_node": 1, "cpus": 1},
    )
    run_dir = tmp_path / "run"
    (tmp_path / "probe.py").write_text(VERL_RAY_INIT)
    out = tmp_path / "env.json"
    job_id = f"verl-env-{os.getpid()}"
    client = connect(runs_dir=cluster["runs"])
    argv = [sys.executable, str(tmp_path / "probe.py"), str(out), *launch.overrides(spec, run_dir)]
    submit(client, argv, job_id, env=launch.env(spec, run_dir))
    deadline = time.monotonic() + 120
    while (status := str(client.get_job_status(job_id))) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.monotonic() < deadline, "the probe job did not end in 120 s"
        time.sleep(0.5)
    assert status == "SUCCEEDED", client.get_job_logs(job_id)[-3000:]
    got = json.loads(out.read_text())
    assert got["VERL_USE_EXTERNAL_MODULES"] == launch.PLUGIN_MODULE
    assert got["VERL_FILE_LOGGER_PATH"] == str(run_dir / "metrics.jsonl")
    assert got["TOKENIZERS_PARALLELISM"] == "true"  # verl's own runtime_env, merged with the job's
