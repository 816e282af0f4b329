"""Ray's token authentication as rpg uses it, against two real Ray heads on 127.0.0.1: one started
without authentication (as the README's old `ray start --head` did), and rpg's own local head (a token
of its own). A head that takes anonymous job submissions is warned about once; the user's token
(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token with RAY_AUTH_MODE=token) reaches a protected
head; a missing token file is one line; the token never appears in anything rpg prints."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("ray.job_submission", reason="the Ray tests need ray[default]")
pytest.importorskip("psutil")

from rpg_cli.orchestration import head as head_module  # noqa: E402
from rpg_cli.orchestration.head import (  # noqa: E402
    ClusterError,
    Head,
    Token,
    accepts_anonymous_jobs,
    connect,
    local_head,
    remote_token,
    stop_local_head,
)
from rpg_cli.orchestration.plan import RunPlan  # noqa: E402
from rpg_cli.store import open_store  # noqa: E402

pytestmark = pytest.mark.slow

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
WARNING = "accepts job submissions without authentication"


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch, tmp_path):
    """Neither the caller's Ray token nor ~/.ray/auth_token: each test sets what it is about; and a fresh
    'warned once' memory."""
    for var in AUTH_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(head_module, "_warned", set())


def _wait_for(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
        try:
            with no_proxy.open(urllib.request.Request(f"{url}/api/version", headers=headers or {}), timeout=3):
                return True
        except OSError:
            time.sleep(0.5)
    return False


@pytest.fixture(scope="module")
def open_head():
    """A Ray head with token authentication off (RAY_AUTH_MODE=disabled), bound to 127.0.0.1, in temp
    dirs of its own; stopped by its process group at the end. Skips where no head can start."""
    root = Path(tempfile.mkdtemp(prefix="rpg-auth-"))  # short: Ray's socket paths have a length limit
    temp_dir = root / "t"
    cmd, gcs, dashboard = head_module.ray_start_command(temp_dir)
    cmd.append("--num-cpus=1")
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    env.update(RAY_AUTH_MODE="disabled", HOME=str(root), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    log = root / "start.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    head = Head(f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}", str(temp_dir), proc.pid, "", "")
    try:
        code = proc.wait(timeout=180)
        if code != 0 or not _wait_for(head.dashboard_url, 120):
            pytest.skip(f"no Ray head could start here: {head_module._last_line(log)}")
        yield head
    finally:
        head_module._kill_head_processes(head)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def token_head(tmp_path_factory):
    """rpg's own local head (token authentication with a token of its own)."""
    runs_dir = tmp_path_factory.mktemp("auth") / "runs"
    temp_dir = head_module._temp_dir(head_module._head_dir(runs_dir))  # Ray's files: may lie outside runs_dir
    try:
        head = local_head(runs_dir, num_cpus=1)
    except ClusterError as exc:
        shutil.rmtree(temp_dir.parent, ignore_errors=True)
        pytest.skip(f"no Ray head could start here: {exc}")
    try:
        yield {"head": head, "runs": runs_dir, "token": Path(head.token_file).read_text().strip()}
    finally:
        stop_local_head(runs_dir)
        shutil.rmtree(temp_dir.parent if temp_dir.parent.name.startswith("rpg-ray-") else temp_dir, ignore_errors=True)


def live_run_store(tmp_path: Path) -> str:
    """A results file holding one run recorded as running: `rpg runs` asks the cluster about it."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    plan = RunPlan("id-r", "r", "s", "local", {"seed": 0}, tmp_path / "runs" / "s" / "r", ["true"])
    store = open_store(url)
    store.record_plans([plan], "s")
    store.begin_attempt(plan.id)
    store.set_status(plan.id, "running", submission_id=plan.id)
    store.close()
    return url


def rpg(*args: str, env: dict[str, str] | None = None, cwd: Path) -> subprocess.CompletedProcess:
    """The real command line in a fresh interpreter (and a fresh Ray client: no state carried over)."""
    base = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    return subprocess.run(
        [sys.executable, "-m", "rpg_cli", *args],
        cwd=cwd,
        env={**base, "COLUMNS": "250", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def private_copy(token: str, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------------- a head without authentication


def test_an_open_head_is_warned_about_once_per_process(open_head, capsys):
    url = open_head.dashboard_url
    assert accepts_anonymous_jobs(url)
    for _ in range(3):  # every command connects more than once: one warning
        assert connect(url) is not None
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if WARNING in line]
    assert len(warnings) == 1, err
    assert warnings[0] == (
        f"warning: the Ray head at {url} accepts job submissions without authentication: anyone who reaches it "
        "can run code as you; start Ray with token auth (README, 4. Start Ray)"
    )


def test_rpg_runs_by_address_to_an_open_head_prints_the_warning_once(open_head, tmp_path):
    db = live_run_store(tmp_path)
    done = rpg("runs", "--db", db, "--address", open_head.dashboard_url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(WARNING) == 1 and WARNING not in done.stdout, done.stderr


def test_an_unreachable_dashboard_is_not_warned_about():
    assert not accepts_anonymous_jobs("http://127.0.0.1:9", timeout_s=1)  # discard port: nothing listens


# -------------------------------------------------------------------------- a head with a token


def test_a_protected_head_gets_the_token_from_the_path_variable_and_is_not_warned_about(
    token_head, tmp_path, monkeypatch, capsys
):
    url, token = token_head["head"].dashboard_url, token_head["token"]
    assert not accepts_anonymous_jobs(url)  # 401 without the token
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(private_copy(token, tmp_path / "tok")))
    client = connect(url)
    assert client.list_jobs() == []
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    assert connect(url).list_jobs() == []
    captured = capsys.readouterr()
    assert WARNING not in captured.err and token not in captured.out + captured.err


def test_rpg_runs_by_address_with_the_token_prints_neither_warning_nor_token(token_head, tmp_path):
    url, token = token_head["head"].dashboard_url, token_head["token"]
    db = live_run_store(tmp_path)
    for env in ({"RAY_AUTH_TOKEN_PATH": str(private_copy(token, tmp_path / "tok"))}, {"RAY_AUTH_TOKEN": token}):
        done = rpg("runs", "--db", db, "--address", url, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert WARNING not in done.stderr and token not in done.stdout + done.stderr
        assert "did not answer" not in done.stdout + done.stderr  # it connected: the job is just unknown there


def test_rpg_own_local_head_is_never_warned_about(token_head, tmp_path):
    db = live_run_store(tmp_path)
    done = rpg("runs", "--db", db, "--runs-dir", str(token_head["runs"]), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert WARNING not in done.stderr and token_head["token"] not in done.stdout + done.stderr


def test_a_protected_head_without_or_with_a_wrong_token_is_one_line(token_head, tmp_path, monkeypatch):
    url = token_head["head"].dashboard_url
    with pytest.raises(ClusterError) as missing:
        connect(url)
    assert "requires a token" in str(missing.value) and "RAY_AUTH_TOKEN_PATH" in str(missing.value)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "not-the-token-0123")
    with pytest.raises(ClusterError) as wrong:
        connect(url)
    message = str(wrong.value)
    assert "refused the token from $RAY_AUTH_TOKEN" in message and "not-the-token-0123" not in message
    assert "\n" not in str(missing.value) + message

    db = live_run_store(tmp_path)
    done = rpg("cancel", "r", "--db", db, "--address", url, env={"RAY_AUTH_TOKEN": "not-the-token-0123"}, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "refused the token" in lines[0], done.stderr
    assert "not-the-token-0123" not in done.stdout + done.stderr


def test_ray_default_token_file_is_sent_with_the_token_mode(token_head, tmp_path):
    """RAY_AUTH_MODE=token and ~/.ray/auth_token, as Ray's own clients find it (a fresh interpreter: Ray
    reads the mode once per process)."""
    home = tmp_path / "h"
    private_copy(token_head["token"], home / ".ray" / "auth_token")
    script = textwrap.dedent(
        f"""
        from rpg_cli.orchestration.head import ClusterError, connect
        print(connect({token_head["head"].dashboard_url!r}).list_jobs())
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    run = dict(capture_output=True, text=True, timeout=120, cwd=tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", script], env={**env, "HOME": str(home), "RAY_AUTH_MODE": "token"}, **run
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
    assert WARNING not in done.stderr and token_head["token"] not in done.stdout + done.stderr
    # without the mode, the default file is not sent (as Ray's own clients do): the head wants a token
    done = subprocess.run([sys.executable, "-c", script], env={**env, "HOME": str(home)}, **run)
    assert done.returncode != 0 and "requires a token" in done.stderr


# ------------------------------------------------------------------------ where the token comes from


def test_token_sources_in_ray_order_and_bad_token_files_are_one_line(tmp_path, monkeypatch):
    assert remote_token() is None  # nothing set: nothing sent
    default = private_copy("from-default", tmp_path / "home" / ".ray" / "auth_token")
    assert remote_token() is None  # Ray's default file: only with RAY_AUTH_MODE=token
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert remote_token().value == "from-default" and remote_token().source == str(default)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(private_copy("  from-path \n", tmp_path / "tok")))
    assert remote_token().value == "from-path"  # stripped, as Ray strips it
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    token = remote_token()
    assert token.value == "from-env" and "from-env" not in repr(token) and token == Token("from-env", "$RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert remote_token() is None

    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    for name, make in (("gone", lambda p: None), ("empty", lambda p: p.write_text(" \n"))):
        path = tmp_path / name
        make(path)
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
        with pytest.raises(ClusterError, match=f"RAY_AUTH_TOKEN_PATH names {path}, which"):
            remote_token()
    default.unlink()
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(ClusterError, match="RAY_AUTH_MODE=token but no Ray token is set"):
        remote_token()


def test_a_missing_token_file_is_one_line_from_the_cli(tmp_path):
    db = live_run_store(tmp_path)
    gone = tmp_path / "no-such-token"
    done = rpg(
        "cancel",
        "r",
        "--db",
        db,
        "--address",
        "http://127.0.0.1:9",
        env={"RAY_AUTH_TOKEN_PATH": str(gone)},
        cwd=tmp_path,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("rpg cancel: RAY_AUTH_TOKEN_PATH names") and "does not exist" in lines[0]
