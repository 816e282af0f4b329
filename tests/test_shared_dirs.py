"""A runs/ directory others can write (the README's shared filesystem), and the credentials a job finds.

Nothing rpg makes or opens under runs/ follows a link it did not make, or uses a directory or file
that another user owns or can write: each is refused with one line naming the path, and the place the
link pointed at is left as it was. The links are planted by this user (a link is a link whoever made
it); another user's files by a second real local user where the machine lets root add one. What rpg
writes there is writable by its owner only, readable as the umask says. Last, a tracker credential
exported after rpg started its local Ray head is named, with the fix, before anything is submitted.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rpg_cli import rundir
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import StoreError, open_store

OTHER_USER = "rpg-shared-test"


def rpg(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real command line in a fresh interpreter: everything it prints, tracebacks included."""
    env = {**os.environ, "COLUMNS": "250"}
    env.pop("RPG_DB", None)
    return subprocess.run(
        [sys.executable, "-m", "rpg_cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in lines[0], result.stdout + result.stderr
    return lines[0]


def fake_model(where: Path) -> Path:
    """What `rpg eval` plans with: a config and a weights file (never loaded: the refusals come first)."""
    where.mkdir(parents=True)
    (where / "config.json").write_text("{}")
    (where / "model.safetensors").write_bytes(b"")
    return where


def toy_benchmark(path: Path) -> Path:
    from rpg_cli.datasets.pipeline import rows_to_batch, write_verl_parquet
    from rpg_cli.datasets.toy import toy_row

    write_verl_parquet([rows_to_batch([toy_row("1+2=", "3", 0)])], path)
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------- planted links


def recording_cluster(monkeypatch) -> list[dict]:
    """`rpg sweep`'s cluster as a stand-in that records what would be submitted (inputs not checked); the list."""
    from rpg_cli.orchestration import dryrun, sweep

    submitted: list[dict] = []

    class Cluster:
        def list_jobs(self):
            return []

        def submit_job(self, **kwargs):
            submitted.append(kwargs)

    monkeypatch.setattr(sweep, "connect", lambda *a, **k: Cluster())
    monkeypatch.setattr(dryrun, "check_plans", lambda *a, **k: [])
    return submitted


def test_a_planted_results_database_link_is_refused_and_nothing_is_created_there(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "results.db").symlink_to(elsewhere / "x.db")
    model, bench = fake_model(tmp_path / "model"), toy_benchmark(tmp_path / "toy.parquet")

    line = one_line(rpg("eval", str(model), "-b", str(bench), "--local", "--k", "1", cwd=tmp_path))
    assert "runs/results.db" in line and "symbolic link" in line
    line = one_line(rpg("runs", cwd=tmp_path))  # reading follows no planted link either
    assert "runs/results.db" in line and "symbolic link" in line
    assert list(elsewhere.iterdir()) == []  # no database created at the planted path

    # SQLite's own files beside a real database: a planted -wal would receive the database's pages
    (tmp_path / "runs" / "results.db").unlink()
    open_store(f"sqlite:///{tmp_path / 'runs' / 'results.db'}").close()
    (tmp_path / "runs" / "results.db-wal").unlink(missing_ok=True)
    (tmp_path / "runs" / "results.db-wal").symlink_to(elsewhere / "wal")
    with pytest.raises(StoreError, match=r"results.db-wal: a symbolic link"):
        open_store(f"sqlite:///{tmp_path / 'runs' / 'results.db'}")
    assert list(elsewhere.iterdir()) == []


def test_a_planted_run_directory_link_is_refused_before_eval_writes_or_a_sweep_submits(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    fake_model(victim / "checkpoints" / "step_1")  # what the link shows: a run with a checkpoint
    before = snapshot(victim)
    runs = tmp_path / "runs"
    (runs / "s1").mkdir(parents=True)
    run_dir = runs / "s1" / "r1"
    run_dir.symlink_to(victim)
    db = f"sqlite:///{runs / 'results.db'}"
    store = open_store(db)
    store.record_plans([RunPlan("r1id", "r1", "s1", "local", {"seed": 0}, run_dir, [])])
    store.close()

    line = one_line(
        rpg("eval", "r1", "-b", str(toy_benchmark(tmp_path / "toy.parquet")), "--local", "--k", "1", cwd=tmp_path)
    )
    assert str(run_dir) in line and "symbolic link" in line
    assert snapshot(victim) == before  # no eval/ written into it

    # rpg sweep: refused after the run is recorded, before its spec.json is written or its job submitted
    from rpg_cli.orchestration import sweep

    submitted = recording_cluster(monkeypatch)
    plan = RunPlan("r2id", "r2", "s1", "local", {"seed": 1}, runs / "s1" / "r2", ["python", "-c", "pass"])
    (runs / "s1" / "r2").symlink_to(victim)
    with pytest.raises(rundir.UnsafePathError) as refused:
        sweep.run_sweep([plan], "s1", db, runs_dir=runs)
    assert rundir.os_error_line(refused.value).startswith(f"{runs / 's1' / 'r2'}: a symbolic link")
    assert submitted == [] and snapshot(victim) == before

    # a sweep directory that is a link: everything below it would land in the victim's
    (runs / "s2").symlink_to(victim)
    with pytest.raises(rundir.UnsafePathError, match="symbolic link"):
        rundir.write_spec(runs / "s2" / "r", {"seed": 2})
    assert snapshot(victim) == before


def test_a_planted_metrics_file_link_is_neither_appended_to_nor_ingested(tmp_path):
    pytest.importorskip("torch")
    from rpg_cli.rundir import MetricsLog

    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own file\n")
    run_dir = tmp_path / "runs" / "s1" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").symlink_to(victim)

    with pytest.raises(rundir.UnsafePathError, match="symbolic link"):
        MetricsLog(run_dir / "metrics.jsonl", keep_through=None)  # the local trainer's log
    with pytest.raises(rundir.UnsafePathError, match="metrics.jsonl: a symbolic link"):
        rundir.make_run_dir(run_dir)  # what rpg sweep checks before verl (which rpg cannot open for) runs
    store = open_store(f"sqlite:///{tmp_path / 'runs' / 'results.db'}")
    try:
        with pytest.raises(rundir.UnsafePathError, match="symbolic link"):
            store.ingest_metrics("r1", run_dir / "metrics.jsonl")
    finally:
        store.close()
    assert victim.read_text() == "the victim's own file\n"

    # a checkpoints/ link: the trainer's checkpoint would be written into the victim's directory
    (run_dir / "metrics.jsonl").unlink()
    (tmp_path / "victim-dir").mkdir()
    (run_dir / "checkpoints").symlink_to(tmp_path / "victim-dir")
    with pytest.raises(rundir.UnsafePathError, match="checkpoints: a symbolic link"):
        rundir.make_run_dir(run_dir)


# ------------------------------------------------------------------------------- another user


@pytest.fixture
def other_user():
    """(uid, run as that user) of a second local user, added for the test where root may add one."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("adding a second local user needs root and useradd")
    try:
        entry = pwd.getpwnam(OTHER_USER)
        added = False
    except KeyError:
        made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER])
        if made.returncode != 0:
            pytest.skip("this machine does not let root add a user")
        entry, added = pwd.getpwnam(OTHER_USER), True

    def run_as(*argv: str) -> None:
        subprocess.run(argv, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], check=True, timeout=60)

    yield entry.pw_uid, run_as
    if added:
        subprocess.run(["userdel", OTHER_USER], check=False)


def test_what_another_user_made_in_a_shared_runs_directory_is_refused(other_user):
    uid, run_as = other_user
    shared = Path(tempfile.mkdtemp(prefix="rpg-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)  # a shared directory, as /tmp is: anyone may add entries
        runs = shared / "runs"
        runs.mkdir()
        runs.chmod(0o1777)
        victim = shared / "victim"
        victim.mkdir()
        # the other user plants: a sweep directory of theirs, a link as a sweep, a database of theirs
        run_as("mkdir", "-m", "0755", str(runs / "theirs"))
        run_as("ln", "-s", str(victim), str(runs / "linked"))
        run_as("touch", str(runs / "results.db"))
        assert (runs / "theirs").stat().st_uid == uid and os.lstat(runs / "linked").st_uid == uid

        with pytest.raises(rundir.UnsafePathError) as refused:
            rundir.make_run_dir(runs / "theirs" / "run")
        assert rundir.os_error_line(refused.value).startswith(f"{runs / 'theirs'}: belongs to uid {uid}, not to you")
        with pytest.raises(rundir.UnsafePathError, match="symbolic link"):
            rundir.write_spec(runs / "linked" / "run", {"seed": 0})
        with pytest.raises(StoreError, match=f"results.db: belongs to uid {uid}"):
            open_store(f"sqlite:///{runs / 'results.db'}")
        assert list(victim.iterdir()) == [] and list((runs / "theirs").iterdir()) == []  # nothing written there
        assert (runs / "results.db").stat().st_size == 0  # root could have written it: rpg did not

        # reading is another matter: a team's store ingests a teammate's metrics (never through a link)
        run_as("mkdir", "-m", "0755", str(runs / "theirs" / "run"))
        line = json.dumps({"step": 1, "data": {"critic/score/mean": 0.5}})
        run_as("sh", "-c", f"printf '%s\\n' '{line}' > {runs / 'theirs' / 'run' / 'metrics.jsonl'}")
        store = open_store(f"sqlite:///{shared / 'team.db'}")
        try:
            assert store.ingest_metrics("theirs", runs / "theirs" / "run" / "metrics.jsonl") == 1
        finally:
            store.close()

        # a directory of one's own that others can write is refused too: anyone could plant in it
        mine = runs / "mine"
        mine.mkdir(mode=0o777)
        mine.chmod(0o777)
        with pytest.raises(rundir.UnsafePathError, match="others can write it \\(mode 777\\)"):
            rundir.make_run_dir(mine / "run")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# --------------------------------------------------------------------------------------- modes


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o027])
def test_what_rpg_writes_under_runs_is_its_owners_to_write_and_the_umasks_to_read(tmp_path, umask):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rpg_cli.backends.local.checkpoint import save_checkpoint
    from rpg_cli.datasets.toy import build_model, build_tokenizer
    from rpg_cli.rundir import MetricsLog

    run_dir = tmp_path / "runs" / "s1" / "r1"
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=0)
    previous = os.umask(umask)
    try:
        rundir.write_spec(run_dir, {"seed": 0})
        MetricsLog(rundir.metrics_path(run_dir), keep_through=None).write(1, {"x": 1.0})
        rundir.write_run_file(rundir.job_log_path(run_dir), "log\n")
        save_checkpoint(run_dir, 1, model, tokenizer, {"step": 1, "t": torch.zeros(1)})
        scored = rundir.eval_scored_path(run_dir, 1, "b")
        rundir.append_line(rundir.make_dirs(scored.parent, run_dir) / scored.name, "{}")  # as eval makes it
    finally:
        os.umask(previous)
    files = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    dirs = [p for p in (tmp_path / "runs").rglob("*") if p.is_dir()]
    assert {p.name for p in files} >= {"spec.json", "metrics.jsonl", "job.log", "model.safetensors", "trainer_state.pt"}
    # one mode for every file and one for every directory: writable by the owner only, read per umask
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: 0o644 & ~umask for p in files}
    assert {str(p): stat.S_IMODE(p.stat().st_mode) for p in dirs} == {str(p): 0o755 & ~umask for p in dirs}
    rundir.make_run_dir(run_dir)  # and what rpg wrote passes its own rule


# --------------------------------------------------------------- credentials and the local head


def test_a_credential_exported_after_the_local_head_started_is_named_before_any_submission(tmp_path, monkeypatch):
    from rpg_cli.orchestration import sweep
    from rpg_cli.orchestration.head import ENV_NAMES_FILE, ClusterError, private_dir

    runs = tmp_path / "runs"
    # the local head rpg started, without the key (head.py records the names of what it started with)
    rundir.write_atomic(private_dir(runs / "ray") / ENV_NAMES_FILE, json.dumps(["HOME", "PATH"]), mode=0o600)
    submitted = recording_cluster(monkeypatch)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    tracked = {"seed": 0, "trackers": {"project": "rpg", "wandb": {"entity": None, "mode": None}, "mlflow": None}}
    plan = RunPlan("t1", "t1", "s", "local", tracked, runs / "s" / "t1", ["python", "-c", "pass"])

    monkeypatch.setenv("WANDB_API_KEY", "key-exported-later-4242")
    with pytest.raises(ClusterError) as refused:
        sweep.run_sweep([plan], "s", db, runs_dir=runs, detach=True)
    message = str(refused.value)
    assert "WANDB_API_KEY" in message and "`rpg stop`" in message and "\n" not in message
    assert "4242" not in message and submitted == []  # the value is said nowhere, nothing submitted
    assert not (tmp_path / "results.db").exists()

    # the same key in the head's environment, or a run that reports nowhere: nothing to say
    plain = RunPlan("t2", "t2", "s", "local", {"seed": 1}, runs / "s" / "t2", ["python", "-c", "pass"])
    sweep.run_sweep([plain], "s", db, runs_dir=runs, detach=True)
    assert len(submitted) == 1
    assert "key-exported" not in json.dumps(submitted, default=str)  # never put into the job
    rundir.write_atomic(runs / "ray" / ENV_NAMES_FILE, json.dumps(["PATH", "WANDB_API_KEY"]), mode=0o600)
    sweep.run_sweep([plan], "s", db, runs_dir=runs, detach=True)
    assert len(submitted) == 2 and "key-exported" not in json.dumps(submitted, default=str)

    # a Hugging Face token concerns every run; a cluster at --address is not rpg's head: not checked
    rundir.write_atomic(runs / "ray" / ENV_NAMES_FILE, json.dumps(["PATH"]), mode=0o600)
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("HF_TOKEN", "hf-later")
    other = RunPlan("t3", "t3", "s", "local", {"seed": 3}, runs / "s" / "t3", ["python", "-c", "pass"])
    with pytest.raises(ClusterError, match="HF_TOKEN is set in this shell but not in the local Ray head"):
        sweep.run_sweep([other], "s", db, runs_dir=runs, detach=True)
    sweep.run_sweep([other], "s", db, address="http://127.0.0.1:1", runs_dir=runs, detach=True)
    assert len(submitted) == 3


def test_the_credential_check_names_only_what_the_runs_use():
    from rpg_cli.trackers.runs import credentials_missing_on_head

    wandb = {"trackers": {"wandb": {}, "mlflow": None, "tensorboard": None}}
    mlflow = {"trackers": {"wandb": None, "mlflow": {"tracking_uri": "http://m"}, "tensorboard": None}}
    env = {"WANDB_API_KEY": "k", "MLFLOW_TRACKING_TOKEN": "t"}
    assert "WANDB_API_KEY is set" in credentials_missing_on_head([wandb], {"PATH"}, env)
    assert "MLFLOW_TRACKING_TOKEN is set" in credentials_missing_on_head([mlflow], {"PATH"}, env)
    both = credentials_missing_on_head([wandb, mlflow], {"PATH"}, env)
    assert "WANDB_API_KEY, MLFLOW_TRACKING_TOKEN are set" in both
    assert credentials_missing_on_head([{}], {"PATH"}, env) is None  # no tracker: no tracker key needed
    assert credentials_missing_on_head([wandb], {"WANDB_API_KEY"}, env) is None
    assert credentials_missing_on_head([wandb], None, env) is None  # a head of an older rpg: unknown
    assert credentials_missing_on_head([wandb], {"PATH"}, {"WANDB_API_KEY": ""}) is None  # not set here
