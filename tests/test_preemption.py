"""Graceful preemption (issue 30, item 1, the trainers' side): SIGTERM, Slurm's SIGUSR1 or `rpg cancel --graceful`
(a request file, rundir.request_stop) stops a run after the step it is in, with a checkpoint of that step and a
stopped line; the store reads it as a known line; the orchestrator records the run `preempted` (or `stopped`)
with the step; the next attempt continues at the step after, every metric row once.

The local backend runs as its job runs, a subprocess of `python -m rpg_cli.backends.local`, on an untrained toy
model (the trainer's code is what is tested, not learning). Each fault is forced at a known step: the step
announces itself (a file) and waits for the stop request before it goes on, so a signal from the test lands
mid-step, always the same one. verl's side: tests/test_verl_reference.py runs verl's own loop with the stop;
its job entrypoint (start.py) is tested here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import make_spec

from rpg_cli import rundir
from rpg_cli.orchestration.stops import graceful_stop
from rpg_cli.states import SKIP, SUBMIT, run_action
from rpg_cli.store.ingest import Stopped, metrics_view, parse_metric_line, stopped_at_end

REPO = Path(__file__).resolve().parents[1]
STEPS, AT = 5, 3  # the run's steps, and the step a stop is asked in (not a save_every step: 2)

# The job's command with one addition: step AT says it began (a file) and waits until a stop is requested.
MIDWAY = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from rpg_cli import rundir
    from rpg_cli.backends.local import __main__ as job
    from rpg_cli.backends.local.trainer import Trainer

    spec, at = sys.argv[1], int(sys.argv[2])
    run_dir, train_step = Path(spec).parent, Trainer.train_step

    def midway(self, step):
        if step == at:
            (run_dir / "in_step").write_text(str(step))
            deadline = time.monotonic() + 120
            while rundir.stop_requested(run_dir) is None:
                if time.monotonic() > deadline:
                    sys.exit("no stop request came")
                time.sleep(0.01)
        return train_step(self, step)

    Trainer.train_step = midway
    sys.exit(job.main(["--spec", spec]))
    """
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """The toy task's model (random weights: nothing here needs it to learn) and training prompts."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rpg_cli.datasets.pipeline import rows_to_batch, write_verl_parquet
    from rpg_cli.datasets.toy import build_model, build_tokenizer, split, toy_row

    root = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer()
    build_model(tokenizer).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows = [toy_row(q, a, i) for i, (q, a) in enumerate(split()[0])]
    write_verl_parquet([rows_to_batch(rows)], root / "train.parquet")
    return {"model": root / "model", "train": root / "train.parquet"}


def write_spec(run_dir: Path, tiny: dict[str, Path], **changes) -> Path:
    """A STEPS-step run saved every 2 steps, its reference reset every 2 (state a checkpoint must carry)."""
    settings = dict(
        model=str(tiny["model"]),
        data={"train_files": [str(tiny["train"])]},
        context={"prompt": 16, "response": 4},
        train_batch_size=2,
        rollout_n=2,
        ppo_mini_batch_size=2,
        lr=1e-3,
        steps=STEPS,
        save_every=2,
        reference={"every": 2},
        rollout={"engine": "hf"},
    )
    spec = make_spec(**{**settings, **changes})
    rundir.make_run_dir(run_dir)
    return rundir.write_spec(run_dir, spec.canonical())


def job(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop_midway(spec: Path, deliver: str) -> tuple[int, str]:
    """The run's job, asked to stop during step AT by `deliver`: a signal sent to it from here, or the request
    `rpg cancel --graceful` writes. Returns (exit status, output)."""
    run_dir = spec.parent
    proc = job([sys.executable, "-c", MIDWAY, str(spec), str(AT)])
    deadline = time.monotonic() + 180
    while not (run_dir / "in_step").exists():  # the job is inside step AT
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the job never reached its step"
        time.sleep(0.05)
    if deliver == "cancel":
        rundir.request_stop(run_dir, rundir.CANCELLED)
    else:
        os.kill(proc.pid, getattr(signal, deliver))
    out, _ = proc.communicate(timeout=180)
    return proc.returncode, out


# ------------------------------------------------------------------------------ the store and the orchestrator


def record(store, run_dir: Path) -> str:
    """The run in the store as `rpg sweep` leaves it once its job runs; its id."""
    from rpg_cli.orchestration.plan import RunPlan

    plan = RunPlan(
        id="run1", name="run", sweep="sw", backend="local", spec={"seed": 0}, run_dir=run_dir, entrypoint=["x"]
    )
    store.record_plans([plan], "sw")
    begin(store, plan.id)
    return plan.id


def begin(store, run_id: str) -> None:
    """One more attempt, submitted and running (orchestration/sweep.py's _launch and _poll)."""
    _, submission = store.begin_attempt(run_id)
    store.set_status(run_id, "running", submission_id=submission)


def job_ended(store, run_id: str, output: str, ray_status: str = "SUCCEEDED") -> str:
    """What `rpg sweep` records when Ray says the run's job ended (sweep.sync_run, Ray stood in); the state."""
    from rpg_cli.orchestration.reconcile import sync_run

    client = SimpleNamespace(get_job_logs=lambda submission_id: output)
    ray_job = SimpleNamespace(status=ray_status, start_time=1, end_time=2, message=None, driver_exit_code=0)
    return sync_run(client, store, store.run(run_id), ray_job)


def pg_loss_rows(store, run_id: str) -> dict[int, list[float]]:
    """Every stored row of actor/pg_loss, by step."""
    import sqlalchemy as sa

    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT step, value FROM metrics WHERE run_id = :r AND key = 'actor/pg_loss' ORDER BY step"),
            {"r": run_id},
        ).all()
    out: dict[int, list[float]] = {}
    for step, value in rows:
        out.setdefault(step, []).append(value)
    return out


# ------------------------------------------------------------------------------ the local backend, as its job


@pytest.fixture
def own_handlers():
    """The stop signals' handlers as they were, put back after a test installs rpg's in this process."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


EXPECTED = {
    "SIGTERM": (
        "preempted",
        "preempted (SIGTERM/USR1) at step 3: checkpoint saved; `rpg sweep SPEC` resumes it at step 4",
    ),
    "SIGUSR1": (
        "preempted",
        "preempted (SIGTERM/USR1) at step 3: checkpoint saved; `rpg sweep SPEC` resumes it at step 4",
    ),
    "cancel": (
        "stopped",
        "stopped (`rpg cancel --graceful`) at step 3: checkpoint saved; `rpg sweep SPEC --retry-failed` resumes it "
        "at step 4",
    ),
}


@pytest.mark.parametrize("deliver", list(EXPECTED))
def test_a_stop_mid_step_checkpoints_that_step_and_the_next_attempt_continues_after_it(
    deliver, tiny, tmp_path, caplog, capsys, own_handlers
):
    from rpg_cli.backends.local.__main__ import main as entry_point
    from rpg_cli.backends.local.checkpoint import latest_checkpoint, load_state
    from rpg_cli.store import open_store

    run_dir = tmp_path / "runs" / "sw" / "run"
    spec = write_spec(run_dir, tiny)
    rundir.request_stop(run_dir, rundir.PREEMPTED)  # left by an earlier attempt: the new one clears it first
    store = open_store(f"sqlite:///{tmp_path / 'runs' / 'results.db'}")
    try:
        run_id = record(store, run_dir)
        code, out = stop_midway(spec, deliver)
        why = rundir.CANCELLED if deliver == "cancel" else rundir.PREEMPTED
        assert code == 0, out[-3000:]
        assert f"stopped after step {AT} ({why})" in out and f"step {AT + 1}/{STEPS}" not in out
        # the step it was in, saved whole (not a save_every step), with the reset reference and the schedule
        step, checkpoint = latest_checkpoint(run_dir)
        state = load_state(checkpoint)
        assert step == state["step"] == AT and state["ref"] is not None and state["reference"]["resets"] == 1
        lines = rundir.metrics_path(run_dir).read_text().splitlines()
        assert [json.loads(line)["step"] for line in lines[:-1]] == [1, 2, 3]
        assert json.loads(lines[-1]) == {"stopped": {"step": AT, "why": why}}
        # the orchestrator: Ray says succeeded (exit 0); the run is preempted, or stopped, at step AT
        caplog.set_level(logging.WARNING)
        state_name, reason = EXPECTED[deliver]
        assert job_ended(store, run_id, out) == state_name
        assert store.run(run_id).error == reason
        assert run_action(state_name) == (SKIP if deliver == "cancel" else SUBMIT)
        assert run_action(state_name, retry_failed=True) == SUBMIT
        first = pg_loss_rows(store, run_id)

        begin(store, run_id)  # `rpg sweep` (--retry-failed for the cancelled one) submits it again
        capsys.readouterr()
        assert entry_point(["--spec", str(spec)]) == 0  # the job's entry point, in this process this time
        out = capsys.readouterr().out
        assert f"resuming from step_{AT}: continuing at step {AT + 1}" in out and f"step {AT}/{STEPS}" not in out
        assert rundir.stop_requested(run_dir) is None  # cleared when the attempt began (that request was done)
        after = rundir.metrics_path(run_dir).read_text().splitlines()
        assert after[: len(lines)] == lines and after[len(lines)] == '{"restart": {"keep_through": 3}}'
        assert [json.loads(line)["step"] for line in after[len(lines) + 1 :]] == [4, 5]
        assert job_ended(store, run_id, out) == "succeeded"
        rows = pg_loss_rows(store, run_id)
        assert {step: len(values) for step, values in rows.items()} == {1: 1, 2: 1, 3: 1, 4: 1, 5: 1}
        assert {step: rows[step] for step in first} == first  # the first attempt's steps, kept as logged
        assert store.last_steps([run_id]) == {run_id: STEPS}
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []  # no line was bad
    finally:
        store.close()


def test_a_stop_asked_before_the_first_step_trains_nothing_and_says_so(tiny, tmp_path):
    from rpg_cli.backends.local.trainer import main as train

    run_dir = tmp_path / "runs" / "sw" / "run"
    spec = write_spec(run_dir, tiny)
    rundir.request_stop(run_dir, rundir.PREEMPTED)  # a signal while the model loaded
    assert train(str(spec)) == 0
    assert rundir.metrics_path(run_dir).read_text() == '{"stopped": {"step": 0, "why": "preempted"}}\n'
    assert rundir.find_checkpoints(run_dir) == {}
    assert graceful_stop(run_dir, "succeeded") == (
        "preempted",
        "preempted (SIGTERM/USR1) after step 0; `rpg sweep SPEC` starts it over (no checkpoint)",
    )


def test_a_stop_asked_in_the_last_step_lets_the_run_finish(tiny, tmp_path, monkeypatch):
    from rpg_cli.backends.local import trainer

    run_dir = tmp_path / "runs" / "sw" / "run"
    spec = write_spec(run_dir, tiny, steps=2)
    train_step = trainer.Trainer.train_step

    def asked_in_step_2(self, step):
        if step == 2:
            rundir.request_stop(run_dir, rundir.PREEMPTED)
        return train_step(self, step)

    monkeypatch.setattr(trainer.Trainer, "train_step", asked_in_step_2)
    assert trainer.main(str(spec)) == 0
    assert sorted(rundir.find_checkpoints(run_dir)) == [2]
    assert stopped_at_end(rundir.metrics_path(run_dir)) is None
    assert graceful_stop(run_dir, "succeeded") is None  # Ray's word stands: it succeeded


def test_the_local_jobs_signals_only_record_a_request_and_keep_a_cancel(tmp_path, own_handlers):
    from rpg_cli.backends.local.__main__ import stop_on_signals

    run_dir = rundir.make_run_dir(tmp_path / "runs" / "sw" / "run")
    rundir.request_stop(run_dir, rundir.CANCELLED)  # an earlier attempt's
    stop_on_signals(run_dir)
    assert rundir.stop_requested(run_dir) is None  # cleared: a new attempt
    signal.raise_signal(signal.SIGUSR1)  # the process lives on (the default would end it)
    assert rundir.stop_requested(run_dir) == "preempted"
    rundir.request_stop(run_dir, rundir.CANCELLED)
    signal.raise_signal(signal.SIGTERM)
    assert rundir.stop_requested(run_dir) == "cancelled"  # a cancel came first: it stays a cancel


# ------------------------------------------------------------------------------ the verl job's entrypoint


def test_the_verl_entrypoint_clears_a_leftover_and_execs_itself_with_the_signals_held(tmp_path, monkeypatch):
    from rpg_cli.backends.verl import start

    run_dir = rundir.make_run_dir(tmp_path / "runs" / "sw" / "run")
    rundir.request_stop(run_dir, rundir.PREEMPTED)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(rundir.metrics_path(run_dir)))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setattr(start, "wait_for_gpus", lambda gpus, run: None)
    monkeypatch.setattr(start, "check_nodes", lambda overrides, run: None)
    installed, execs = [], []
    monkeypatch.setattr(start, "stop_on_signals", installed.append)

    def execv(path, argv):
        execs.append((argv, set(signal.pthread_sigmask(signal.SIG_BLOCK, []))))

    monkeypatch.setattr(start.os, "execv", execv)
    start.main(["--gpus", "2", "--run", "rpg-1a2b3c4d", "--", "a=1"])
    assert rundir.stop_requested(run_dir) is None and installed == [run_dir]
    ((argv, held),) = execs
    this = ["-m", "rpg_cli.backends.verl.start", "--gpus", "2", "--run", "rpg-1a2b3c4d", "--started", "--", "a=1"]
    assert argv == [sys.executable, *this]
    assert {signal.SIGTERM, signal.SIGUSR1} <= held  # across exec, until the handlers are back
    assert not {signal.SIGTERM, signal.SIGUSR1} & set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_a_stop_asked_while_the_verl_job_waits_for_gpus_ends_it_there(tmp_path, monkeypatch, capsys):
    from rpg_cli.backends.verl import start

    run_dir = rundir.make_run_dir(tmp_path / "runs" / "sw" / "run")
    (rundir.checkpoints_dir(run_dir) / "global_step_4" / "actor").mkdir(parents=True)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(rundir.metrics_path(run_dir)))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setattr(start, "stop_on_signals", lambda run_dir: None)
    monkeypatch.setattr(start.time, "sleep", lambda seconds: None)

    def wait_for_gpus(gpus, run):  # the wait's sleep, once a signal has written the request
        rundir.request_stop(run_dir, rundir.PREEMPTED)
        start.waiting_sleep(start.job_run_dir())(10.0)

    monkeypatch.setattr(start, "wait_for_gpus", wait_for_gpus)
    monkeypatch.setattr(start.os, "execv", lambda path, argv: pytest.fail("verl must not start"))
    with pytest.raises(SystemExit) as ended:
        start.main(["--gpus", "2", "--run", "rpg-1a2b3c4d", "--", "a=1"])
    assert ended.value.code == 0
    assert stopped_at_end(rundir.metrics_path(run_dir)) == Stopped(4, "preempted")  # it stands at step 4
    assert "stopped (preempted) while waiting for GPUs" in capsys.readouterr().out
    assert graceful_stop(run_dir, "succeeded") == (
        "preempted",
        "preempted (SIGTERM/USR1) at step 4: checkpoint saved; `rpg sweep SPEC` resumes it at step 5",
    )


def test_the_verl_jobs_signals_only_record_a_request(tmp_path, own_handlers):
    from rpg_cli.backends.verl.start import stop_on_signals

    run_dir = rundir.make_run_dir(tmp_path / "runs" / "sw" / "run")
    stop_on_signals(run_dir)
    signal.raise_signal(signal.SIGTERM)
    assert rundir.stop_requested(run_dir) == "preempted"


SIGTERM_AFTER_RAY_INIT = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    import ray
    from rpg_cli.backends.verl import start

    run_dir = Path(sys.argv[1])
    start.stop_on_signals(run_dir)
    start.ours_after_ray_init(run_dir)
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)  # as main_ppo does
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
    print("alive", flush=True)
    ray.shutdown()
    """
)


@pytest.mark.slow
def test_a_sigterm_after_verls_ray_init_is_still_a_request(tmp_path):
    """ray.init puts SIGTERM handlers of its own in place (a Python one that exits and its core worker's C++
    failure handler): the driver's handlers must be rpg's again once it returns, as in verl's main_ppo."""
    pytest.importorskip("ray")
    run_dir = rundir.make_run_dir(tmp_path / "runs" / "sw" / "run")
    ray_tmp = tempfile.mkdtemp(prefix="rpgsig")  # short: Ray's socket paths have a length limit
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run(
            [sys.executable, "-c", SIGTERM_AFTER_RAY_INIT, str(run_dir)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0 and "alive" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert rundir.stop_requested(run_dir) == "preempted"


HELD_ACROSS_EXEC = textwrap.dedent(
    """
    import os, signal, sys
    from rpg_cli.backends.verl import start

    signal.pthread_sigmask(signal.SIG_BLOCK, start.STOP_SIGNALS)
    os.kill(os.getpid(), signal.SIGTERM)  # a preemption between the wait and main_ppo: pending
    start.exec_held([sys.executable, *start.THIS, "--gpus", "1", "--run", "r", "--started", "--", *sys.argv[1:]])
    """
)


def test_a_signal_during_the_exec_is_recorded_and_main_ppo_runs_with_its_overrides(tmp_path):
    """The entrypoint execs itself (--started): a SIGTERM in between stays pending, reaches the handler once it
    is back, and main_ppo (its `--cfg job`: print the composed config and exit) runs in that process."""
    pytest.importorskip("verl")
    run_dir = rundir.make_run_dir(tmp_path / "runs" / "sw" / "run")
    env = {**os.environ, "PYTHONPATH": str(REPO), "VERL_FILE_LOGGER_PATH": str(rundir.metrics_path(run_dir))}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    done = subprocess.run(
        [sys.executable, "-c", HELD_ACROSS_EXEC, "--cfg", "job", "trainer.total_training_steps=3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "total_training_steps: 3" in done.stdout  # Hydra composed verl's config with the override
    assert rundir.stop_requested(run_dir) == "preempted"


# ------------------------------------------------------------------------------ the stopped line, the states


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ('{"stopped": {"step": 7, "why": "preempted"}}', Stopped(7, "preempted")),
        ('{"stopped": {"step": 0, "why": "cancelled"}}', Stopped(0, "cancelled")),
        ('{"stopped": {"step": 7, "why": "bored"}}', "stopped why \"bored\" is neither 'preempted' nor 'cancelled'"),
        ('{"stopped": {"step": -1, "why": "preempted"}}', "stopped step -1 is not a whole number from 0 to 2147483647"),
        ('{"stopped": {"step": true, "why": "preempted"}}', "stopped step true is not a whole number"),
        ('{"stopped": {"step": 7}}', 'not a {"stopped": {"step": N, "why": "preempted" or "cancelled"}} record'),
        ('{"stopped": {"step": 7, "why": "preempted"}, "step": 8}', "not a {"),
        ('{"stopped": [7]}', "not a {"),
    ],
)
def test_the_stopped_line_is_checked_as_untrusted_input(line, parsed):
    got = parse_metric_line(line.encode())
    assert got == parsed if isinstance(parsed, Stopped) else got.startswith(parsed)


def test_the_store_reads_a_stopped_line_as_known_and_stores_nothing_of_it(tmp_path, caplog):
    from rpg_cli.store import open_store

    run_dir = rundir.make_run_dir(tmp_path / "runs" / "sw" / "run")
    text = (
        '{"step": 1, "data": {"a": 1.0}}\n{"stopped": {"step": 1, "why": "preempted"}}\n'
        '{"restart": {"keep_through": 1}}\n{"step": 2, "data": {"a": 2.0}}\n'
    )
    rundir.metrics_path(run_dir).write_text(text)
    assert metrics_view(text) == {1: {"a": 1.0}, 2: {"a": 2.0}}
    store = open_store(f"sqlite:///{tmp_path / 'runs' / 'results.db'}")
    try:
        run_id = record(store, run_dir)
        caplog.set_level(logging.WARNING)
        assert store.ingest_metrics(run_id, rundir.metrics_path(run_dir)) == 2
        assert [r.getMessage() for r in caplog.records] == []
        assert store.last_steps([run_id]) == {run_id: 2}
    finally:
        store.close()


def test_stopped_at_end_reads_only_a_whole_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert stopped_at_end(path) is None  # no file
    path.write_text('{"step": 1, "data": {"a": 1.0}}\n{"stopped": {"step": 1, "why": "cancelled"}}\n')
    assert stopped_at_end(path) == Stopped(1, "cancelled")
    path.write_text(path.read_text() + '{"restart": {"keep_through": 1}}\n')
    assert stopped_at_end(path) is None  # a later attempt began
    path.write_text('{"stopped": {"step": 1, "why": "cancelled"}}')
    assert stopped_at_end(path) is None  # not ended yet: being written
    path.write_text('{"step": 1, "data": {"a": "' + "x" * 9000 + '"}}\n')
    assert stopped_at_end(path) is None  # a last line longer than what is read


def _stopped_run(tmp_path: Path, why: str | None, line: bool, checkpoints: tuple[int, ...] = (2, 3)) -> Path:
    run_dir = rundir.make_run_dir(tmp_path / "runs" / "sw" / "run")
    for step in checkpoints:
        (rundir.checkpoints_dir(run_dir) / f"step_{step}").mkdir(parents=True)
    rundir.metrics_path(run_dir).write_text(
        '{"step": 3, "data": {"a": 1.0}}\n' + (rundir.stopped_line(3, why or "preempted") if line else "")
    )
    if why:
        rundir.request_stop(run_dir, why)
    return run_dir


def test_the_state_of_a_run_that_was_asked_to_stop(tmp_path):
    diverged = rundir.diverged(3, "actor/pg_loss is nan")
    # no request: Ray's word stands, whatever the file says
    assert graceful_stop(_stopped_run(tmp_path / "a", None, line=True), "succeeded") is None
    # stopped as asked: whether the job then exited 0 or not
    done = _stopped_run(tmp_path / "b", "preempted", line=True)
    assert graceful_stop(done, "succeeded")[0] == graceful_stop(done, "failed")[0] == "preempted"
    # a job stopped through Ray (rpg cancel's stop_job, a watchdog): as Ray says, whatever its handler then asked
    assert graceful_stop(done, "stopped") is None
    # asked, but the run reached its last step first (no stopped line): as Ray says
    asked = _stopped_run(tmp_path / "c", "preempted", line=False)
    assert graceful_stop(asked, "succeeded") is None and graceful_stop(asked, "stopped") is None
    # asked, and the job died before the step ended (the node went away): preempted, from its newest checkpoint
    assert graceful_stop(asked, "failed", "killed by signal 9 (SIGKILL)") == (
        "preempted",
        "preempted (SIGTERM/USR1): the job ended before the step in progress did (killed by signal 9 (SIGKILL)); "
        "`rpg sweep SPEC` resumes it at step 4",
    )
    assert graceful_stop(asked, "failed", diverged) is None  # a divergence resumed would diverge again
    cancelled = _stopped_run(tmp_path / "d", "cancelled", line=False, checkpoints=())
    assert graceful_stop(cancelled, "failed") == (
        "stopped",
        "stopped (`rpg cancel --graceful`): the job ended before the step in progress did (failed); "
        "`rpg sweep SPEC --retry-failed` starts it over (no checkpoint)",
    )


def test_preempted_is_a_stored_state_the_next_sweep_resumes(tmp_path):
    from rpg_cli.states import LIVE, STATUSES, TERMINAL
    from rpg_cli.store import open_store
    from rpg_cli.store.schema import schema

    assert "preempted" in STATUSES and "preempted" in TERMINAL and "preempted" not in LIVE
    assert max(map(len, STATUSES)) <= schema().runs.c.status.type.length
    store = open_store(f"sqlite:///{tmp_path / 'runs' / 'results.db'}")
    try:
        run_id = record(store, rundir.make_run_dir(tmp_path / "runs" / "sw" / "run"))
        assert store.set_status(run_id, "preempted", error="preempted at step 3")
        assert store.run(run_id).status == "preempted" and store.run(run_id).finished_at is not None
    finally:
        store.close()
