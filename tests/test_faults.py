"""Faults outside the database, through the real command line against a real results file: no cluster
to ask, files of the local Ray head that another user could have written, passwords in URLs, read-only
and full filesystems, and failure reasons a person can act on. None may end in a traceback, change a
state it cannot confirm, or leave a file half-written."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import eval_row
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import open_store, run_states

REPO = Path(__file__).resolve().parents[1]
OTHER_UID = 54321  # a second local user, simulated by chown (root only)


def rpg(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real command line, in a fresh interpreter: everything it prints, tracebacks included."""
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "rpg_cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def recorded_store(tmp_path: Path, runs: dict[str, tuple[str, str | None]]) -> str:
    """A results file with runs {name: (status, error)}, each submitted once as its own id."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    store = open_store(url)
    for name, (status, error) in runs.items():
        plan = RunPlan(
            id=f"id-{name}",
            name=name,
            sweep="s",
            backend="local",
            spec={"seed": 0},
            run_dir=tmp_path / "runs" / "s" / name,
            entrypoint=["true"],
        )
        store.record_plans([plan], "s")
        store.begin_attempt(plan.id)
        store.set_status(plan.id, status, error=error, submission_id=plan.id)
    store.close()
    return url


def one_line(result) -> str:
    """The single line a failing command printed (no traceback, nothing else)."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


# ------------------------------------------------------------------ item 3: no cluster to ask


def test_runs_without_a_cluster_shows_live_runs_as_stored_and_says_they_may_be_stale(tmp_path):
    db = recorded_store(tmp_path, {"alive": ("running", None), "done": ("succeeded", None)})
    result = CliRunner().invoke(app, ["runs", "--db", db, "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    warning = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warning) == 1 and "1 live run(s) shown as last recorded, possibly stale" in warning[0]
    assert "no local head runs in" in warning[0]
    rows = {line.split("│")[2].strip(): line for line in result.stdout.splitlines() if line.startswith("│")}
    assert "running?" in rows["alive"] and "succeeded?" not in rows["done"]
    assert run_states(db, ["id-alive"]) == {"id-alive": "running"}  # nothing it could not confirm is changed
    assert not (tmp_path / "runs" / "ray").exists()  # looking starts no head


# --------------------------------------------------------------------------- item 12: reasons


def test_runs_wide_shows_a_failure_reason_whole(tmp_path):
    reason = (
        "disk full writing /data/runs/s/a/checkpoints/step_300/trainer_state.pt: free space (df -h shows where), "
        "then `rpg sweep SPEC --retry-failed` resumes from the last checkpoint"
    )
    db = recorded_store(tmp_path, {"a": ("failed", reason)})
    short = CliRunner().invoke(app, ["runs", "--db", db], env={"COLUMNS": "250"})
    assert short.exit_code == 0 and reason not in short.stdout and "disk full writing /data/runs" in short.stdout
    assert "cut short: --wide shows them whole" in short.stdout
    wide = CliRunner().invoke(app, ["runs", "--db", db, "--wide"], env={"COLUMNS": "250"})
    assert wide.exit_code == 0, wide.output
    pieces = [line.split("│")[-2].strip() for line in wide.stdout.splitlines() if line.startswith("│")]
    assert " ".join(pieces).split() == reason.split()  # the whole reason, wrapped in its column


def test_a_job_killed_by_a_signal_says_so():
    from rpg_cli.orchestration.submit import killed_by

    killed = SimpleNamespace(driver_exit_code=-9, message="Job entrypoint command failed with exit code -9")
    assert killed_by(killed).startswith("killed by signal 9 (SIGKILL): ")
    assert "out of memory" in killed_by(killed)
    by_shell = SimpleNamespace(driver_exit_code=None, message="Job entrypoint command failed with exit code 143, last")
    assert killed_by(by_shell) == "killed by signal 15 (SIGTERM)"
    assert killed_by(SimpleNamespace(driver_exit_code=1, message="failed with exit code 1")) is None


class _Refusing:
    """A jobs client whose head answers Ray's "no agent yet" refusal `times` times, then `then` (None: accepts)."""

    NO_AGENT = "Request failed with status code 500: No available agent to submit job, please try again later.."

    def __init__(self, times, then=None):
        self.times, self.then, self.calls = times, then, 0

    def submit_job(self, **_):
        self.calls += 1
        if self.calls <= self.times:
            raise RuntimeError(self.NO_AGENT)
        if self.then:
            raise RuntimeError(self.then)


def test_a_head_whose_job_agent_is_not_up_yet_is_asked_again_and_other_refusals_are_not(monkeypatch):
    from rpg_cli.orchestration import submit as module

    monkeypatch.setattr(module.time, "sleep", lambda _: None)
    late = _Refusing(times=3)
    module.submit(late, ["true"], "job-1")
    assert late.calls == 4  # accepted on the fourth answer
    refused = _Refusing(times=1, then="Request failed with status code 400: bad runtime_env")
    with pytest.raises(RuntimeError, match="bad runtime_env"):
        module.submit(refused, ["true"], "job-2")
    assert refused.calls == 2  # a real refusal is not asked again
    never = _Refusing(times=10**6)
    with pytest.raises(RuntimeError, match="No available agent"):
        module.submit(never, ["true"], "job-3", agent_wait_s=0.0)
    assert never.calls == 1  # no time left to wait: the refusal reaches the caller


@pytest.mark.parametrize(
    "log, reason",
    [
        (
            "Traceback (most recent call last):\n  ...\nOSError: [Errno 28] No space left on device: "
            "'/r/checkpoints/step_3/trainer_state.pt'\n",
            "disk full writing /r/checkpoints/step_3/trainer_state.pt: ",
        ),
        ("RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 9216 vs 9110\n", "disk full: "),
        (
            "safetensors_rust.SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)",
            "disk full: ",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", "GPU out of memory: "),
        (
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n",
            "the machine ran out of memory",
        ),
        ("step 3\nValueError: bad value in the spec\n", "ValueError: bad value in the spec"),
    ],
)
def test_failure_reasons_name_full_disks_and_memory(log, reason):
    from rpg_cli.orchestration.plan import failure_reason

    for backend in ("local", "verl"):
        assert failure_reason(backend, log).startswith(reason), backend
    if reason.startswith("disk full"):
        assert "--retry-failed" in failure_reason("local", log)


# -------------------------------------------------------------- item 6: the local head's files


class Listener:
    """A TCP listener on loopback that records whether anything connected (and what it sent)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(5)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    self.received.append(conn.recv(65536))
                except OSError:
                    self.received.append(b"")

    def close(self):
        self.done.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def _chown(path: Path, uid: int) -> None:
    try:
        os.chown(path, uid, -1)
    except PermissionError:
        pytest.skip("simulating a second user needs chown (root)")


def write_head(runs_dir: Path, dashboard: str, head_mode=0o600, token_mode=0o600) -> Path:
    """A head.json and a token as rpg writes them, in a head directory of the current user."""
    head_dir = runs_dir / "ray"
    head_dir.mkdir(parents=True, mode=0o700)
    head = {
        "dashboard_url": dashboard,
        "gcs_address": "127.0.0.1:1",
        "temp_dir": str(head_dir / "t"),
        "pgid": 2**22 + 12345,
        "host": socket.gethostname(),
        "token_file": str(head_dir / "auth_token"),
    }
    (head_dir / "head.json").write_text(json.dumps(head))
    (head_dir / "head.json").chmod(head_mode)
    (head_dir / "auth_token").write_text("the-secret-token")
    (head_dir / "auth_token").chmod(token_mode)
    return head_dir


@pytest.mark.parametrize(
    "case",
    [
        "head-of-another-user",
        "head-writable-by-others",
        "off-loopback",
        "token-readable-by-others",
        "token-of-another-user",
    ],
)
def test_head_files_another_user_could_have_written_are_refused_and_the_token_is_never_sent(case, tmp_path, listener):
    runs_dir = tmp_path / "runs"
    dashboard = "http://10.255.255.1:8265" if case == "off-loopback" else f"http://127.0.0.1:{listener.port}"
    head_dir = write_head(
        runs_dir,
        dashboard,
        head_mode=0o666 if case == "head-writable-by-others" else 0o600,
        token_mode=0o644 if case == "token-readable-by-others" else 0o600,
    )
    if case == "head-of-another-user":
        _chown(head_dir / "head.json", OTHER_UID)
    if case == "token-of-another-user":
        _chown(head_dir / "auth_token", OTHER_UID)
    bad = head_dir / ("auth_token" if case.startswith("token") else "head.json")
    db = recorded_store(tmp_path, {"a": ("running", None)})
    common = ["--db", db, "--runs-dir", str(runs_dir)]

    for command in (["logs", "a"], ["cancel", "a"], ["stop"]):
        result = CliRunner().invoke(app, [*command, *common])
        assert result.exit_code == 2, (command, result.output)
        line = one_line(result)
        assert str(bad) in line and ("remove" in line or "chmod" in line), line
    looked = CliRunner().invoke(app, ["runs", *common])  # `rpg runs` never fails for it: the state may be stale
    assert looked.exit_code == 0 and str(bad) in looked.stderr and "possibly stale" in looked.stderr

    assert listener.received == []  # nothing, let alone the token, went to that address
    assert run_states(db, ["id-a"]) == {"id-a": "running"}


def test_the_head_directory_is_the_owners_only(tmp_path):
    from rpg_cli.orchestration.head import ClusterError, _temp_dir, private_dir

    opened = tmp_path / "runs" / "ray"
    opened.mkdir(parents=True)
    opened.chmod(0o777)  # as Ray leaves its temp dir, or an older rpg left runs/ray
    assert private_dir(opened) == opened and opened.stat().st_mode & 0o777 == 0o700
    assert _temp_dir(Path("/r/ray")) == Path("/r/ray/t")  # Ray's own (world-writable) dir sits below it
    deep = tmp_path / ("x" * 60) / "ray"
    assert _temp_dir(deep).parent.name.startswith("rpg-ray-")  # too long for sockets: a dir of its own
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ClusterError, match="link"):
        private_dir(tmp_path / "link")
    _chown(opened, OTHER_UID)
    with pytest.raises(ClusterError, match=f"belongs to uid {OTHER_UID}"):
        private_dir(opened)


# ----------------------------------------------------------------------- item 7: passwords


SECRET_URL = "postgresql://alice:S3cr3t-pw@127.0.0.1:1/rpg"


def test_an_eval_job_carries_nothing_of_the_database(monkeypatch):
    from rpg_cli.evaluation import job
    from rpg_cli.evaluation.options import EvalOptions

    sent = {}

    class Cluster:
        def list_jobs(self):
            return []

        def submit_job(self, **kwargs):
            sent.update(kwargs)

    monkeypatch.setattr(job, "connect", lambda *a, **k: Cluster())
    submitted = job.submit_eval(EvalOptions(ref="some-run", db=SECRET_URL))
    assert "S3cr3t" not in json.dumps(sent, default=str) and "127.0.0.1:1" not in json.dumps(sent, default=str)
    assert not (sent.get("runtime_env") or {}).get("env_vars")  # the job writes files; rpg ingests them
    assert "S3cr3t" not in submitted.submission_id


def test_passwords_in_urls_are_masked_in_what_rpg_prints(tmp_path):
    from rpg_cli.store.url import redact

    assert redact(f"cannot open {SECRET_URL} (x)") == "cannot open postgresql://alice:***@127.0.0.1:1/rpg (x)"
    assert (
        redact("postgresql://u:p@ss@h/db and sqlite:///runs/results.db")
        == "postgresql://u:***@h/db and sqlite:///runs/results.db"
    )
    assert redact("http://127.0.0.1:8265 and https://user@host/x") == "http://127.0.0.1:8265 and https://user@host/x"
    result = rpg("sweep", str(REPO / "experiments" / "smoke.yaml"), "--dry-run", "--db", SECRET_URL, cwd=tmp_path)
    assert "alice:***@127.0.0.1" in result.stderr  # it said which store it could not read ...
    assert "S3cr3t" not in result.stdout + result.stderr  # ... without its password


# ---------------------------------------------------- item 9: read-only and full filesystems


@pytest.fixture
def read_only_dir(tmp_path):
    """An empty directory nobody may write to: a read-only tmpfs for root, else mode 0555."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], capture_output=True
    ).returncode:
        pytest.skip("root, and mounting a read-only tmpfs is not permitted here")
    yield path
    subprocess.run(["umount", "--lazy", str(path)], check=True)  # lazy: a writer may still hold a file


@pytest.fixture
def full_dir(tmp_path):
    """A directory on a tiny tmpfs that is full (needs mount: root)."""
    path = tmp_path / "full"
    path.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True
        ).returncode
    ):
        pytest.skip("a full filesystem is simulated with a tiny tmpfs (root and mount needed)")
    try:
        with open(path / "filler", "wb") as f:
            while True:
                f.write(b"x" * 4096)
                f.flush()
    except OSError:
        pass
    yield path
    subprocess.run(["umount", "--lazy", str(path)], check=True)  # lazy: a writer may still hold a file


def test_a_sweep_into_a_read_only_runs_directory_is_one_line_and_writes_nothing(read_only_dir, tmp_path):
    from run_inputs import write_inputs

    write_inputs(tmp_path, REPO / "experiments" / "smoke.yaml")
    db = tmp_path / "results.db"
    result = rpg(
        "sweep",
        str(REPO / "experiments" / "smoke.yaml"),
        "--runs-dir",
        str(read_only_dir / "runs"),
        "--db",
        str(db),
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr and str(read_only_dir / "runs") in last
    assert "read-only" in last or "Permission denied" in last
    assert not db.exists() and not any(read_only_dir.iterdir())


def test_prepare_data_onto_a_full_disk_is_one_line_naming_the_file(full_dir, tmp_path):
    (tmp_path / "mine.csv").write_text("question,answer\n1+1?,2\n")
    result = rpg("prepare-data", "--input", "mine.csv", "--out", str(full_dir / "data"), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"rpg prepare-data: {full_dir / 'data' / 'mine.parquet'}: No space left on device; the disk is full: "
        "free space there (df -h shows where), or write elsewhere"
    ]
    assert not [p for p in full_dir.rglob("*") if p.is_file() and p.name != "filler"]  # nothing half-written


def test_a_full_disk_met_by_torch_save_is_one_line(full_dir, monkeypatch):
    """torch.save reports a full disk as "RuntimeError: [enforce fail at inline_container.cc:672]"."""
    torch = pytest.importorskip("torch")
    from rpg_cli.datasets import toy

    def write_toy(out_dir):  # the toy's writer, as far as torch.save
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        torch.save({"weights": torch.zeros(4096)}, Path(out_dir) / "state.pt")

    monkeypatch.setattr(toy, "write_toy", write_toy)
    result = CliRunner().invoke(app, ["prepare-data", "--toy", "--out", str(full_dir / "data")])
    assert result.exit_code == 2
    assert one_line(result) == "rpg prepare-data: disk full: free space (df -h shows where), then run the command again"


def scored_store(tmp_path: Path) -> str:
    """A results file with one run that has training metrics and an evaluation score: enough for a
    table and a plot."""
    url = f"sqlite:///{tmp_path / 'scored.db'}"
    spec = {
        "algorithm": "grpo",
        "kl": "none",
        "seed": 0,
        "optimizer": "adamw",
        "context": "4k",
        "model": "m",
        "beta": 1e-3,
        "lr": 1e-6,
        "clip": {"eps_low": 0.2, "eps_high": 0.2, "c": 3.0},
    }
    store = open_store(url)
    store.record_plans(
        [
            RunPlan(
                id="r1",
                name="grpo-r1",
                sweep="s",
                backend="local",
                spec=spec,
                run_dir=tmp_path / "runs" / "s" / "grpo-r1",
                entrypoint=["true"],
            )
        ],
        "s",
    )
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(json.dumps({"step": s, "data": {"critic/score/mean": s / 10}}) + "\n" for s in (1, 2, 3))
    )
    store.ingest_metrics("r1", metrics)
    store.set_status("r1", "succeeded")  # a table scores finished runs only
    store.record_evals([eval_row(step=3, metric="mean@32", value=0.25, n=32, max_tokens=2048)])
    store.close()
    return url


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_tables_plots_and_job_logs_are_written_with_the_users_umask(umask, tmp_path):
    from rpg_cli.orchestration.reconcile import save_log

    db = scored_store(tmp_path)
    previous = os.umask(umask)
    try:
        table = CliRunner().invoke(app, ["report", "--table", "--db", db, "-o", str(tmp_path / "out" / "table.md")])
        plots = CliRunner().invoke(
            app, ["report", "--plot", "--metrics", "reward", "--db", db, "-o", str(tmp_path / "plots")]
        )
        run = SimpleNamespace(submission_id="j", run_dir=tmp_path / "run")
        save_log(SimpleNamespace(get_job_logs=lambda submission_id: "the job's output\n"), run)
    finally:
        os.umask(previous)
    assert table.exit_code == 0 and plots.exit_code == 0, table.output + plots.output
    written = [tmp_path / "out" / "table.md", *(tmp_path / "plots").iterdir(), tmp_path / "run" / "job.log"]
    assert len(written) == 4
    # a run directory's files are writable by their owner only (rundir.py: a shared runs/), read per the umask
    want = {p.name: (0o644 if p.name == "job.log" else 0o666) & ~umask for p in written}
    assert {p.name: p.stat().st_mode & 0o777 for p in written} == want


def _refusing_writes(monkeypatch, under: Path, errno_: int) -> None:
    """Make every file opened for writing below `under` fail with `errno_`, as a filesystem would."""
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if str(path).startswith(str(under)) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno_, os.strerror(errno_), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)


@pytest.mark.parametrize(
    "fault", ["read-only", "full", "read-only (simulated)", "full (simulated)", "no permission (simulated)"]
)
def test_report_output_that_cannot_be_written_is_one_line_and_leaves_nothing(fault, tmp_path, request, monkeypatch):
    import errno

    db = scored_store(tmp_path)
    if "simulated" in fault:
        target = tmp_path / "out"
        target.mkdir()
        code = {"read-only": errno.EROFS, "full": errno.ENOSPC, "no permission": errno.EACCES}[fault.split(" (")[0]]
        _refusing_writes(monkeypatch, target, code)
    else:
        target = request.getfixturevalue("read_only_dir" if fault == "read-only" else "full_dir")
    before = sorted(target.iterdir())
    result = CliRunner().invoke(app, ["report", "--table", "--db", db, "-o", str(target / "table.md")])
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"rpg report: {target / 'table.md'}: ")
    fix = {"read-only": "read-only", "full": "disk is full", "no permission": "permissions"}[fault.split(" (")[0]]
    assert fix in line, line
    assert sorted(target.iterdir()) == before  # no table, no temporary file


# --------------------------------------------- items 10, 11: inputs checked before a GPU is paid for


def write_checked_inputs(root: Path) -> None:
    """Data files of verl's columns (a prompt template around 3, or 40, words: 45 or 82 words), one
    without them, and a model of 64 positions whose tokenizer reads one token per word (no chat
    template: the prompt's text alone)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, models, pre_tokenizers

    from rpg_cli.datasets import VERL_SCHEMA, verl_row

    (root / "data").mkdir()
    for name, words in (("short", 3), ("long", 40)):
        rows = [verl_row("x " * 3, "2", "toy", 0), verl_row("x " * words, "2", "toy", 1)]
        assert max(len(row["prompt"][0]["content"].split()) for row in rows) == {"short": 45, "long": 82}[name]
        pq.write_table(pa.Table.from_pylist(rows, schema=VERL_SCHEMA), root / "data" / f"{name}.parquet")
    pq.write_table(pa.table({"question": ["1+1?"], "answer": ["2"]}), root / "data" / "columns.parquet")
    model = root / "model"
    model.mkdir()
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "x": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(model / "tokenizer.json"))
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"data": {"train_files": ["data/nowhere.parquet"]}}, "data.train_files: data/nowhere.parquet does not exist"),
        (
            {"data": {"val_files": ["data/columns.parquet"]}},
            "data.val_files: data/columns.parquet lacks the column(s) verl needs: prompt, reward_model.ground_truth, "
            "data_source; write it with `rpg prepare-data`",
        ),
        ({"model": "data/toy/model"}, "model: data/toy/model does not exist"),
        (
            {"data": {"train_files": ["data/long.parquet"]}},
            "data.train_files: data/long.parquet: the longest prompt is 82 tokens but model has 64 positions",
        ),
    ],
    ids=["missing-file", "missing-columns", "missing-model", "prompt-too-long"],
)
def test_inputs_a_run_would_fail_on_are_refused_by_the_dry_run_and_before_any_submission(
    change, expected, tmp_path, monkeypatch
):
    """Such runs once passed the dry run and failed 9-38 s into each job, after their run directory and
    database row existed (a 258-token prompt on a 32-position model even "succeeded")."""
    write_checked_inputs(tmp_path)
    from rpg_cli.spec import load_sweep

    base = {
        **load_sweep(REPO / "experiments" / "smoke.yaml").base,
        "algorithm": "grpo",
        "kl": "none",
        "reference": "frozen",
        "model": "model",
        "data": {"train_files": ["data/short.parquet"], "val_files": ["data/short.parquet"]},
        "train_batch_size": 2,  # the files' two rows
        "ppo_mini_batch_size": 2,
    }
    spec = {**base, **change, "data": {**base["data"], **change.get("data", {})}}
    (tmp_path / "s.yaml").write_text(json.dumps({"name": "s", "base": spec}))
    monkeypatch.chdir(tmp_path)
    common = ["--db", str(tmp_path / "results.db"), "--runs-dir", str(tmp_path / "runs")]
    dry = CliRunner().invoke(app, ["sweep", "s.yaml", "--dry-run", *common])
    assert dry.exit_code == 2 and "Traceback" not in dry.output
    assert any(line.startswith("rpg sweep: error: ") and expected in line for line in dry.stderr.splitlines()), (
        dry.stderr
    )
    real = CliRunner().invoke(app, ["sweep", "s.yaml", *common])
    assert real.exit_code == 2 and expected in one_line(real)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results.db").exists()  # no head, directory or row
    # the same run on inputs that fit: the dry run passes, and says what it could not check
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "s.yaml").write_text(json.dumps({"name": "s", "base": {**base, "model": "Owner/Uncached"}}))
    fine = CliRunner().invoke(app, ["sweep", "s.yaml", "--dry-run", *common])
    assert fine.exit_code == 0, fine.output
    assert "model: could not check Owner/Uncached: it is not in the local Hugging Face cache" in fine.stderr


def test_runs_says_when_no_run_matches_the_filters(tmp_path):
    db = recorded_store(tmp_path, {"done": ("succeeded", None)})
    common = ["runs", "--db", db, "--runs-dir", str(tmp_path / "runs")]
    none = CliRunner().invoke(app, [*common, "--where", "seed=7", "--status", "failed"])
    assert none.exit_code == 0 and none.stdout == "0 runs: none matches --status, --where\n", none.output
    some = CliRunner().invoke(app, [*common, "--where", "seed=0"])
    assert some.exit_code == 0 and "1 run: 1 succeeded" in some.stdout, some.output
