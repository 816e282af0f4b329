"""`rpg cancel` records only what it stopped (issue 35, class 3). A run whose job rpg cannot reach is not a
stopped run: from another directory (no local head there), against an unreachable --address, or a run
another user launched (another head, or a directory of theirs), the command names the cluster in one
line, exits 2, stops nothing and records nothing (not even the run's metrics). What it can reach it
stops, and records as Ray confirms. `--lost` and a cancelled Slurm job are the two ways a run whose
head is gone is recorded stopped.

The cluster is a stand-in for a Ray head (`FakeRay`: the Jobs API over HTTP on 127.0.0.1, behind a
token) that Ray's own JobSubmissionClient talks to, installed as the local head of a runs directory as
rpg records one; the store is real (SQLite, and the suite's PostgreSQL where the store is shared). One
slow test does the same against a real local Ray head."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("ray.job_submission", reason="rpg cancel talks to Ray's Jobs API")

from rpg_cli.cli import app  # noqa: E402
from rpg_cli.orchestration.plan import RunPlan  # noqa: E402
from rpg_cli.store import open_store, run_states  # noqa: E402

OTHER_UID = 54321  # a second local user, simulated by chown (root only)
METRICS = "".join(f'{{"step": {s}, "data": {{"critic/score/mean": 0.5}}}}\n' for s in range(1, 4))


# ------------------------------------------------------------------------------ a stand-in Ray head


class FakeRay:
    """Ray's Jobs API as JobSubmissionClient uses it (version, list, info, stop, logs) on 127.0.0.1, every
    request checked for the token. `jobs`: submission id -> Ray status; `stubborn`: ids whose stop Ray
    refuses; `stops`: the ids it was asked to stop, in order. Stopped by `close`."""

    def __init__(self, jobs: dict[str, str] | None = None, token: str | None = None):
        import ray

        self.jobs = dict(jobs or {})
        self.stubborn: set[str] = set()
        self.stops: list[str] = []
        self.token = token or secrets.token_hex(16)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def answer(self, code: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {fake.token}":
                    return True
                self.answer(401, {"error": "no token"})
                return False

            def do_GET(self) -> None:
                if not self.authorized():
                    return
                path = self.path.rstrip("/")
                if path == "/api/version":
                    self.answer(200, {"version": "5", "ray_version": ray.__version__, "ray_commit": "fake"})
                elif path == "/api/jobs":
                    self.answer(200, [fake.details(j) for j in fake.jobs])
                elif path.startswith("/api/jobs/") and path.endswith("/logs"):
                    self.answer(200, {"logs": "the job's output\n"})
                elif path.startswith("/api/jobs/") and path.removeprefix("/api/jobs/") in fake.jobs:
                    self.answer(200, fake.details(path.removeprefix("/api/jobs/")))
                else:
                    self.answer(404, {"error": "not found"})

            def do_POST(self) -> None:
                if not self.authorized():
                    return
                job = self.path.removeprefix("/api/jobs/").removesuffix("/stop")
                if not self.path.endswith("/stop") or job not in fake.jobs:
                    self.answer(404, {"error": f"Job {job} does not exist"})
                    return
                fake.stops.append(job)
                live = fake.jobs[job] in ("PENDING", "RUNNING")
                if live and job not in fake.stubborn:
                    fake.jobs[job] = "STOPPED"
                self.answer(200, {"stopped": live and job not in fake.stubborn})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def details(self, job: str) -> dict:
        status = self.jobs[job]
        now = int(time.time() * 1000)
        return {
            "type": "SUBMISSION",
            "submission_id": job,
            "status": status,
            "entrypoint": "python -m trainer",
            "message": f"Job {status.lower()}",
            "start_time": now - 60_000,
            "end_time": now if status not in ("PENDING", "RUNNING") else None,
            "metadata": {},
            "runtime_env": {},
        }

    def install_as_local_head(self, runs_dir: Path) -> None:
        """Record this server as the local head of `runs_dir`, as rpg records the one it starts."""
        head_dir = runs_dir.resolve() / "ray"
        head_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
        (head_dir / "auth_token").write_text(self.token)
        (head_dir / "auth_token").chmod(0o600)
        head = {
            "dashboard_url": self.url,
            "gcs_address": "127.0.0.1:1",
            "temp_dir": str(head_dir / "no-such-ray-temp-dir"),  # no process has it: nothing is ever killed
            "pgid": 2**22 + 1,
            "host": socket.gethostname(),
            "token_file": str(head_dir / "auth_token"),
        }
        (head_dir / "head.json").write_text(json.dumps(head))
        (head_dir / "head.json").chmod(0o600)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_ray():
    servers: list[FakeRay] = []

    def start(jobs: dict[str, str] | None = None) -> FakeRay:
        servers.append(FakeRay(jobs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


# ------------------------------------------------------------------------------------------- store


def record_runs(db: str, runs_root: Path, runs: dict[str, str | None], sweep: str = "sw") -> dict[str, RunPlan]:
    """Runs {name: status} of one sweep, each submitted once as its own id (None: recorded, never
    submitted), each with a run directory holding three lines of metrics.jsonl."""
    store = open_store(db)
    plans = {}
    try:
        for name, status in runs.items():
            plan = RunPlan(f"id-{name}", name, sweep, "local", {"seed": 0}, runs_root / sweep / name, ["true"])
            store.record_plans([plan], sweep)
            plan.run_dir.mkdir(parents=True, exist_ok=True)
            (plan.run_dir / "metrics.jsonl").write_text(METRICS)
            if status is not None:
                store.begin_attempt(plan.id)
                store.set_status(plan.id, status, submission_id=plan.id)
            plans[name] = plan
    finally:
        store.close()
    return plans


def recorded(db: str, plans: dict[str, RunPlan]) -> dict[str, tuple[str, str | None, int]]:
    """{name: (status, error, steps of metrics)} as the store has them."""
    store = open_store(db, create=False)
    try:
        out = {}
        for name, plan in plans.items():
            run = store.run(plan.id)
            out[name] = (run.status, run.error, len(store.run_history(plan.id)[0]))
        return out
    finally:
        store.close()


def cancel(*args: str, cwd: Path | None = None):
    runner = CliRunner()
    if cwd is None:
        return runner.invoke(app, ["cancel", *args])
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return runner.invoke(app, ["cancel", *args])
    finally:
        os.chdir(old)


def one_line(result) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


# ------------------------------------------------------------------- a cluster rpg cannot reach


def test_cancel_from_another_directory_records_nothing_and_names_the_missing_head(db_url, tmp_path, fake_ray):
    """The issue's case: the sweep was launched from one directory (its local head runs there), `rpg cancel`
    is run from another, against the same (shared) store: no head there, so nothing can be stopped."""
    launched = tmp_path / "project"
    ray = fake_ray({"id-a": "RUNNING", "id-b": "PENDING"})
    ray.install_as_local_head(launched / "runs")
    plans = record_runs(db_url, launched / "runs", {"a": "running", "b": "submitted"})
    before = recorded(db_url, plans)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    result = cancel("sw", "--db", db_url, cwd=elsewhere)
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith("rpg cancel: 2 of 2 unfinished run(s) of 'sw' (a, b) were submitted to a Ray cluster")
    assert f"the local Ray head in {elsewhere.resolve()}/runs/ray is not running" in line
    assert "nothing was stopped or recorded" in line and "--lost" in line
    assert recorded(db_url, plans) == before == {"a": ("running", None, 0), "b": ("submitted", None, 0)}
    assert ray.stops == [] and ray.jobs == {"id-a": "RUNNING", "id-b": "PENDING"}

    # from where they were launched, the same command stops both, and records them with their metrics
    result = cancel("sw", "--db", db_url, cwd=launched)
    assert result.exit_code == 0, result.output
    assert "stopped 2 run(s): a, b" in result.output
    assert sorted(ray.stops) == ["id-a", "id-b"]
    assert recorded(db_url, plans) == {n: ("stopped", "cancelled with `rpg cancel`", 3) for n in ("a", "b")}


def test_an_unreachable_address_records_nothing_and_names_it(db_url, tmp_path):
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens
    plans = record_runs(db_url, tmp_path / "runs", {"a": "running", "never": None})
    result = cancel("sw", "--db", db_url, "--address", dead, "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 2
    assert f"cannot reach the Ray cluster at {dead}" in one_line(result)
    # the run never submitted is not recorded either: the command did nothing
    assert recorded(db_url, plans) == {"a": ("running", None, 0), "never": ("pending", None, 0)}


def test_a_head_that_answers_but_does_not_know_the_jobs_is_not_where_they_run(db_url, tmp_path, fake_ray):
    """Another user's run, or one from another cluster, in a shared store: the head this user reaches
    (their own, by --runs-dir, or --address with its token) does not know its job. Refused as a whole:
    the job that is this user's is not stopped either, until asked for by itself."""
    runs = tmp_path / "runs"
    ray = fake_ray({"id-mine": "RUNNING", "id-done": "SUCCEEDED"})
    ray.install_as_local_head(runs)
    plans = record_runs(db_url, runs, {"mine": "running", "theirs": "running", "done": "running"})
    common = ["--db", db_url, "--runs-dir", str(runs)]

    result = cancel("sw", *common)
    assert result.exit_code == 2
    line = one_line(result)
    assert "1 of 3 unfinished run(s) of 'sw' (theirs) are not on the local Ray head in" in line
    assert f"{runs.resolve()}/ray" in line and "another user's runs are theirs to stop" in line
    assert ray.stops == [] and recorded(db_url, plans) == {n: ("running", None, 0) for n in plans}

    result = cancel("theirs", *common)
    assert result.exit_code == 2 and "(theirs) are not on the local Ray head" in one_line(result)

    result = cancel("mine", *common)
    assert result.exit_code == 0 and "stopped 1 run(s): mine" in result.output, result.output
    result = cancel("done", *common)
    assert result.exit_code == 0 and "1 run(s) had already ended: done" in result.output, result.output
    assert ray.stops == ["id-mine"]
    assert recorded(db_url, plans) == {
        "mine": ("stopped", "cancelled with `rpg cancel`", 3),
        "theirs": ("running", None, 0),
        "done": ("succeeded", None, 3),
    }


def test_an_address_that_does_not_know_the_job_is_refused_too(tmp_path, fake_ray, monkeypatch):
    ray = fake_ray({"id-mine": "RUNNING"})
    monkeypatch.setenv("RAY_AUTH_TOKEN", ray.token)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, tmp_path / "runs", {"elsewhere": "submitted"})
    result = cancel("elsewhere", "--db", db, "--address", ray.url, "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 2
    assert f"(elsewhere) are not on the Ray cluster at {ray.url}; nothing was stopped" in one_line(result)
    assert recorded(db, plans) == {"elsewhere": ("submitted", None, 0)} and ray.stops == []


def test_a_run_whose_directory_is_another_users_is_theirs_to_stop(tmp_path, fake_ray):
    """Even when this user's head knows the job (a shared cluster and token), and even with --lost."""
    runs = tmp_path / "runs"
    ray = fake_ray({"id-theirs": "RUNNING"})
    ray.install_as_local_head(runs)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, runs, {"theirs": "running", "never": None})
    try:
        os.chown(plans["theirs"].run_dir, OTHER_UID, -1)
    except PermissionError:
        pytest.skip("simulating a second user needs chown (root)")
    for extra in ([], ["--lost"]):
        result = cancel("sw", "--db", db, "--runs-dir", str(runs), *extra)
        assert result.exit_code == 2
        line = one_line(result)
        assert f"1 run(s) were launched by another user: theirs (uid {OTHER_UID})" in line
        assert "nothing was stopped or recorded" in line
    assert ray.stops == [] and recorded(db, plans) == {"theirs": ("running", None, 0), "never": ("pending", None, 0)}


def test_another_users_head_directory_is_one_line_and_nothing_recorded(tmp_path, fake_ray):
    runs = tmp_path / "runs"
    fake_ray({"id-a": "RUNNING"}).install_as_local_head(runs)
    try:
        os.chown(runs / "ray" / "head.json", OTHER_UID, -1)
    except PermissionError:
        pytest.skip("simulating a second user needs chown (root)")
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, runs, {"a": "running"})
    result = cancel("a", "--db", db, "--runs-dir", str(runs))
    assert result.exit_code == 2 and f"belongs to uid {OTHER_UID}, not to you" in one_line(result)
    assert recorded(db, plans) == {"a": ("running", None, 0)}


# ---------------------------------------------------------------- what rpg may record as stopped


def test_lost_records_runs_whose_head_is_gone(tmp_path, fake_ray):
    """After `rpg stop --force` (no head: no job runs), --lost says so; a new head that does not know
    them is the same. Never-submitted runs need no cluster at all."""
    runs = tmp_path / "runs"
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, runs, {"a": "running", "b": "submitted", "never": None})
    assert cancel("sw", "--db", db, "--runs-dir", str(runs)).exit_code == 2
    result = cancel("sw", "--db", db, "--runs-dir", str(runs), "--lost")
    assert result.exit_code == 0, result.output
    assert "stopped 3 run(s): a, b, never" in result.output
    assert recorded(db, plans) == {n: ("stopped", "cancelled with `rpg cancel`", 3) for n in plans}

    more = record_runs(db, runs, {"c": "running"}, sweep="s2")
    fake_ray({}).install_as_local_head(runs)  # a new head, which never saw c's job
    assert cancel("c", "--db", db, "--runs-dir", str(runs)).exit_code == 2
    assert cancel("c", "--db", db, "--runs-dir", str(runs), "--lost").exit_code == 0
    assert recorded(db, more)["c"][0] == "stopped"


def test_never_submitted_runs_are_recorded_stopped_without_a_cluster(tmp_path):
    """No job exists for them anywhere: recording them stopped is what keeps `rpg sweep` from submitting."""
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, tmp_path / "runs", {"p": None})
    result = cancel("p", "--db", db, "--address", "http://127.0.0.1:9", "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 0 and "stopped 1 run(s): p" in result.output, result.output
    assert recorded(db, plans) == {"p": ("stopped", "cancelled with `rpg cancel`", 3)}


def test_a_job_ray_will_not_stop_is_left_as_it_was(tmp_path, fake_ray):
    from rpg_cli.orchestration.cancel import cancel as cancel_runs

    runs = tmp_path / "runs"
    ray = fake_ray({"id-a": "RUNNING", "id-b": "RUNNING"})
    ray.stubborn.add("id-b")
    ray.install_as_local_head(runs)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, runs, {"a": "running", "b": "running"})
    done = cancel_runs("sw", db, runs_dir=runs, wait_s=0.5)
    assert [r.name for r in done.stopped] == ["a"] and [r.name for r in done.unconfirmed] == ["b"]
    assert recorded(db, plans) == {"a": ("stopped", "cancelled with `rpg cancel`", 3), "b": ("running", None, 0)}


# ------------------------------------------------------------------------------------------- Slurm


def _fake_slurm(work: Path, squeue: str) -> Path:
    """squeue printing `squeue`, scancel logging its arguments; the sweep's recorded Slurm job 4242."""
    calls = work / "scancel.calls"
    (work / "bin").mkdir(exist_ok=True)
    for name, body in (("squeue", squeue), ("scancel", f'echo "$@" >> {calls}')):
        (work / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (work / "bin" / name).chmod(0o755)
    slurm = work / "runs" / "sw" / "slurm"
    slurm.mkdir(parents=True, mode=0o700)
    (slurm / "job_id").write_text("4242\n")
    (slurm / "job_id").chmod(0o600)
    return calls


def test_cancelling_the_sweeps_slurm_job_records_its_runs_stopped(tmp_path, monkeypatch):
    """Their Ray is the Slurm job's (on its nodes, unreachable from here) and ends with it."""
    calls = _fake_slurm(tmp_path, "echo RUNNING")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, tmp_path / "runs", {"a": "running", "b": "submitted"})
    result = cancel("sw", "--db", db, "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 0, result.output
    assert "cancelled Slurm job 4242 (running)" in result.output and "stopped 2 run(s): a, b" in result.output
    assert calls.read_text().split() == ["4242"]
    assert recorded(db, plans) == {n: ("stopped", "cancelled with `rpg cancel`", 3) for n in plans}


@pytest.mark.parametrize(
    "squeue",
    ['echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1', "exit 0"],  # both Slurm's ways
)
def test_an_ended_slurm_job_is_a_hint_not_a_stop(tmp_path, monkeypatch, squeue):
    calls = _fake_slurm(tmp_path, squeue)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, tmp_path / "runs", {"a": "running"})
    result = cancel("sw", "--db", db, "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 2
    line = one_line(result)
    assert "pass --lost if their head is gone" in line and "the sweep's Slurm job 4242 has ended" in line
    assert not calls.exists() and recorded(db, plans) == {"a": ("running", None, 0)}


def test_slurm_that_does_not_answer_gives_no_hint(tmp_path, monkeypatch):
    _fake_slurm(tmp_path, 'echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    db = f"sqlite:///{tmp_path / 'results.db'}"
    record_runs(db, tmp_path / "runs", {"a": "running"})
    result = cancel("sw", "--db", db, "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 2 and "Slurm job" not in one_line(result)


# ---------------------------------------------------------------------------- a real local Ray head


@pytest.mark.slow
@pytest.mark.cluster  # a real Ray head and a whole run: make test-cluster
def test_a_run_the_real_head_does_not_know_is_refused_and_its_own_job_keeps_running(tmp_path):
    """A real local head with one job of this user's; a run recorded by another user (another head): the
    sweep's cancel is refused and stops nothing; the run of this user's is then stopped by name."""
    pytest.importorskip("psutil")
    from rpg_cli.orchestration.head import connect, stop_local_head
    from rpg_cli.orchestration.submit import submit

    runs = tmp_path / "runs"
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, runs, {"mine": "running", "theirs": "running"})
    try:
        client = connect(runs_dir=runs)
        submit(client, [sys.executable, "-c", "import time; time.sleep(600)"], "id-mine", num_cpus=0.1)
        deadline = time.monotonic() + 120
        while str(client.get_job_status("id-mine")) != "RUNNING":
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.5)
        result = cancel("sw", "--db", db, "--runs-dir", str(runs))
        assert result.exit_code == 2 and "(theirs) are not on the local Ray head" in one_line(result)
        assert str(client.get_job_status("id-mine")) == "RUNNING"
        assert run_states(db, ["id-mine", "id-theirs"]) == {"id-mine": "running", "id-theirs": "running"}

        result = cancel("mine", "--db", db, "--runs-dir", str(runs))
        assert result.exit_code == 0 and "stopped 1 run(s): mine" in result.output, result.output
        assert str(client.get_job_status("id-mine")) == "STOPPED"
        assert recorded(db, plans) == {
            "mine": ("stopped", "cancelled with `rpg cancel`", 3),
            "theirs": ("running", None, 0),
        }
    finally:
        stop_local_head(runs)


# ------------------------------------------------------------------------------------ --graceful


def fake_trainer(run_dir: Path, ray: FakeRay | None = None, job: str = "", step: int = 4) -> threading.Thread:
    """A training run's trainer as `rpg cancel --graceful` meets it: once its stop request is there, it logs the
    step it was in, saves it, appends the stopped line and exits 0 (Ray: SUCCEEDED)."""
    from rpg_cli import rundir

    def trainer() -> None:
        deadline = time.monotonic() + 60
        while rundir.stop_requested(run_dir) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        why = rundir.stop_requested(run_dir)
        if why is None:
            return
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "data": {"critic/score/mean": 0.5}}) + "\n")
        (run_dir / "checkpoints" / f"global_step_{step}").mkdir(parents=True)
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(rundir.stopped_line(step, why))
        if ray is not None:
            ray.jobs[job] = "SUCCEEDED"

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    return thread


def lines(result) -> list[str]:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.output.splitlines()


def test_graceful_asks_the_training_runs_and_stops_the_others_at_once(tmp_path, fake_ray):
    """A run that logged a training step gets a request (its job keeps running); one that did not (only step 0,
    the validation before training), one Ray still queues and one never submitted have nothing to save:
    cancelled as without --graceful. One that ended keeps what it became."""
    runs = tmp_path / "runs"
    ray = fake_ray({"id-train": "RUNNING", "id-fresh": "RUNNING", "id-queued": "PENDING", "id-done": "SUCCEEDED"})
    ray.install_as_local_head(runs)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(
        db, runs, {"train": "running", "fresh": "running", "queued": "submitted", "never": None, "done": "running"}
    )
    (plans["fresh"].run_dir / "metrics.jsonl").write_text('{"step": 0, "data": {"val-core/toy/acc/mean@2": 0.5}}\n')

    result = cancel("sw", "--graceful", "--no-wait", "--db", db, "--runs-dir", str(runs))
    assert result.exit_code == 0, result.output
    assert lines(result) == [
        "asked train to stop after the step it is in, with a checkpoint (last logged: step 3)",
        "1 run(s) had already ended: done (`rpg runs` shows how)",
        "stopped 3 run(s): never, fresh, queued (they had not started training: nothing to save)",
        "not waiting (--no-wait): `rpg runs` shows each run stopped, with the step of its checkpoint",
    ]
    assert (plans["train"].run_dir / "stop_request").read_text() == "cancelled\n"
    assert sorted(ray.stops) == ["id-fresh", "id-queued"] and ray.jobs["id-train"] == "RUNNING"
    assert recorded(db, plans) == {
        "train": ("running", None, 0),
        "fresh": ("stopped", "cancelled with `rpg cancel`", 1),
        "queued": ("stopped", "cancelled with `rpg cancel`", 3),
        "never": ("stopped", "cancelled with `rpg cancel`", 3),
        "done": ("succeeded", None, 3),
    }


def test_graceful_waits_for_the_checkpoint_and_says_the_step(tmp_path, fake_ray):
    runs = tmp_path / "runs"
    ray = fake_ray({"id-train": "RUNNING"})
    ray.install_as_local_head(runs)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, runs, {"train": "running"})
    trainer = fake_trainer(plans["train"].run_dir, ray, "id-train")

    result = cancel("train", "--graceful", "--timeout", "30", "--db", db, "--runs-dir", str(runs))
    trainer.join()
    assert result.exit_code == 0, result.output
    assert lines(result) == [
        "asked train to stop after the step it is in, with a checkpoint (last logged: step 3)",
        "waiting up to 30 s for 1 run(s) to stop (--timeout; Ctrl-C stops waiting, the requests stand)",
        "train stopped at step 4, its checkpoint saved",
    ]
    status, error, steps = recorded(db, plans)["train"]
    assert (status, steps) == ("stopped", 4) and "at step 4" in error and "--retry-failed" in error
    assert ray.stops == []  # Ray was never asked: the job ended by itself


def test_graceful_names_the_runs_that_did_not_stop_in_time_and_how_to_force_them(tmp_path, fake_ray):
    runs = tmp_path / "runs"
    ray = fake_ray({"id-train": "RUNNING"})
    ray.install_as_local_head(runs)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, runs, {"train": "running"})
    common = ["--db", db, "--runs-dir", str(runs)]

    result = cancel("sw", "--graceful", "--timeout", "0.5", *common)
    assert result.exit_code == 1
    assert lines(result) == [
        "asked train to stop after the step it is in, with a checkpoint (last logged: step 3)",
        "waiting up to 0.5 s for 1 run(s) to stop (--timeout; Ctrl-C stops waiting, the requests stand)",
        "rpg cancel: 1 run(s) did not stop within 0.5 s: train; their requests stand (each stops after its step): "
        "`rpg cancel sw` without --graceful stops them now",
    ]
    assert recorded(db, plans) == {"train": ("running", None, 0)} and ray.stops == []

    result = cancel("sw", *common)  # the way out it names
    assert result.exit_code == 0 and lines(result) == ["stopped 1 run(s): train"]
    assert ray.stops == ["id-train"] and recorded(db, plans)["train"][0] == "stopped"


def test_graceful_refuses_what_cancel_refuses_and_asks_nothing(tmp_path, fake_ray):
    """A run the cluster does not know (another head, user or cluster) refuses the sweep as a whole."""
    runs = tmp_path / "runs"
    fake_ray({"id-mine": "RUNNING"}).install_as_local_head(runs)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, runs, {"mine": "running", "theirs": "running"})
    result = cancel("sw", "--graceful", "--db", db, "--runs-dir", str(runs))
    assert result.exit_code == 2 and "(theirs) are not on the local Ray head" in one_line(result)
    assert not any((p.run_dir / "stop_request").exists() for p in plans.values())


def test_graceful_cancel_of_a_slurm_sweep_asks_first_then_cancels_the_job(tmp_path, monkeypatch):
    """The sweep's Ray is the Slurm job's (unreachable from here): the store says which runs train; once the
    asked ones stopped (their stopped line: the watcher in the job records them), the job is cancelled and the
    rest recorded stopped with it."""
    from rpg_cli.orchestration import cancel as cancelling

    monkeypatch.setattr(cancelling, "SETTLE_S", 0.2)  # no watcher runs here to record the stop
    calls = _fake_slurm(tmp_path, "echo RUNNING")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, tmp_path / "runs", {"train": "running", "queued": "submitted"})
    trainer = fake_trainer(plans["train"].run_dir)

    result = cancel("sw", "--graceful", "--timeout", "30", "--db", db, "--runs-dir", str(tmp_path / "runs"))
    trainer.join()
    assert result.exit_code == 0, result.output
    assert lines(result) == [
        "asked train to stop after the step it is in, with a checkpoint (last logged: step 3)",
        "waiting up to 30 s for 1 run(s) to stop (--timeout; Ctrl-C stops waiting, the requests stand)",
        "train stopped at step 4, its checkpoint saved",
        "cancelled Slurm job 4242 (running); its Ray stops with it",
        "stopped 2 run(s): train, queued",
    ]
    assert calls.read_text().split() == ["4242"]
    found = recorded(db, plans)
    assert found["queued"] == ("stopped", "cancelled with `rpg cancel`", 3)
    assert found["train"][0] == "stopped" and "at step 4" in found["train"][1] and found["train"][2] == 4


def test_graceful_with_a_slurm_job_that_does_not_stop_in_time_leaves_the_job(tmp_path, monkeypatch):
    calls = _fake_slurm(tmp_path, "echo RUNNING")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    db = f"sqlite:///{tmp_path / 'results.db'}"
    plans = record_runs(db, tmp_path / "runs", {"train": "running"})
    result = cancel("sw", "--graceful", "--timeout", "0.3", "--db", db, "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 1
    assert lines(result)[-1] == (
        "rpg cancel: 1 run(s) did not stop within 0.3 s: train; their requests stand (each stops after its step); "
        "the sweep's Slurm job 4242 runs on: `rpg cancel sw` without --graceful stops them now"
    )
    assert not calls.exists() and recorded(db, plans) == {"train": ("running", None, 0)}


TOY_SWEEP = """\
name: toy
base:
  algorithm: grpo
  model: data/toy/model
  context: 2k
  data: {train_files: [data/toy/train.parquet]}
  train_batch_size: 4
  rollout_n: 4
  ppo_mini_batch_size: 4
  steps: 5000
  seed: 0
  optimizer: adamw
  lr: 5.0e-4
  beta: 1.0e-3
  reference: iterative
  clip: {eps_low: 0.2, eps_high: 0.28, c: 10.0}
  rollout: {temperature: 1.0, top_p: 1.0, engine: hf}
  save_every: 1000
  backend: local
  resources: {nodes: 1, gpus_per_node: 0, cpus: 1}
grid:
  algorithm: [grpo]
"""


@pytest.mark.slow
@pytest.mark.cluster  # a real Ray head and a whole run: make test-cluster
def test_graceful_cancel_of_a_toy_run_on_a_real_head_saves_the_step_it_was_in(tmp_path, monkeypatch):
    """The local backend's toy run under `rpg sweep` on a real local head: asked through the CLI, it ends after
    the step it is in with that step's checkpoint (save_every is 1000: only the stop can have saved it), its job
    exits by itself, and the run is recorded stopped at that step."""
    pytest.importorskip("torch")
    from rpg_cli import rundir
    from rpg_cli.datasets import toy
    from rpg_cli.orchestration.cancel import attempt_step
    from rpg_cli.orchestration.head import stop_local_head

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(toy, "warm_up_format", lambda *args, **kwargs: 0.0)  # untrained: only its steps matter
    toy.write_toy(tmp_path / "data" / "toy")
    Path("toy.yaml").write_text(TOY_SWEEP)
    runner = CliRunner()
    runs, db = tmp_path / "runs", f"sqlite:///{tmp_path / 'results.db'}"
    common = ["--db", db, "--runs-dir", str(runs)]
    try:
        result = runner.invoke(app, ["sweep", "toy.yaml", "--detach", *common])
        assert result.exit_code == 0, result.output
        (run_dir,) = [p for p in (runs / "toy").iterdir() if p.is_dir() and p.name != "slurm"]
        deadline = time.monotonic() + 240
        while (attempt_step(run_dir / "metrics.jsonl") or 0) < 3:
            assert time.monotonic() < deadline, "the toy run did not reach step 3"
            time.sleep(0.2)

        result = cancel("toy", "--graceful", "--timeout", "120", *common)
        assert result.exit_code == 0, result.output
        asked, waiting, stopped = lines(result)
        last = int(asked.rsplit("step ", 1)[1].rstrip(")"))
        assert (
            asked
            == f"asked {run_dir.name} to stop after the step it is in, with a checkpoint (last logged: step {last})"
        )
        assert (
            waiting == "waiting up to 120 s for 1 run(s) to stop (--timeout; Ctrl-C stops waiting, the requests stand)"
        )
        step = int(stopped.split("at step ")[1].split(",")[0])
        assert stopped == f"{run_dir.name} stopped at step {step}, its checkpoint saved"
        assert 3 <= last <= step < 1000 and step in rundir.find_checkpoints(run_dir)
        store = open_store(db, create=False)
        try:
            (run,) = store.runs(sweep="toy")
            assert run.status == "stopped" and f"at step {step}" in run.error
            assert max(store.run_history(run.id)[0]) == step
        finally:
            store.close()
    finally:
        stop_local_head(runs)
