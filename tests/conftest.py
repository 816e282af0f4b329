"""Fixtures shared by the tests: none of them sees the caller's cluster or team database; the store's
tests get a real PostgreSQL server of the test session's own, and a database URL for each dialect the
store supports (SQLite file, PostgreSQL database). And the one way tests build a run's spec:
`make_spec(**changes)` (`from conftest import make_spec`), `spec_dict(**changes)` for its dict form."""

from __future__ import annotations

import contextlib
import copy
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rpg_cli.file_facts import CACHE_ENV
from rpg_cli.store.url import DB_ENVVAR

if TYPE_CHECKING:
    from rpg_cli.spec import ExperimentSpec

# what the dry run remembers of data files goes to the session's own directory (its subprocesses too), not ~/.cache
_FILE_FACTS = tempfile.mkdtemp(prefix="rpg-file-facts-")
os.environ[CACHE_ENV] = _FILE_FACTS


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_FILE_FACTS, ignore_errors=True)


# verl's whole loop runs in its own environment (`make e2e`, which sets RPG_E2E=1), not in the suite
collect_ignore = [] if os.environ.get("RPG_E2E") else ["e2e"]


# The smallest valid run: the base every test's spec changes what it is about in (a local run, no GPU).
BASE_SPEC: dict[str, Any] = {
    "algorithm": "rpg",
    "kl": "urkl",
    "beta": 1e-3,
    "clip": {"eps_low": 0.2, "eps_high": 0.28},
    "optimizer": "adamw",
    "context": "2k",
    "model": "m",
    "data": {"train_files": ["t.parquet"]},
    "train_batch_size": 4,
    "rollout_n": 2,
    "ppo_mini_batch_size": 2,
    "lr": 1e-6,
    "steps": 10,
    "seed": 0,
    "save_every": 5,
    "backend": "local",
    "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
}


def spec_dict(**changes: Any) -> dict[str, Any]:
    """BASE_SPEC with `changes` (whole fields: `val={...}` replaces the block), not validated."""
    return copy.deepcopy({**BASE_SPEC, **changes})


def make_spec(**changes: Any) -> ExperimentSpec:
    """The validated spec of `spec_dict(**changes)`."""
    from rpg_cli.spec import ExperimentSpec

    return ExperimentSpec.model_validate(spec_dict(**changes))


@pytest.fixture
def offline_env(monkeypatch):
    """W&B offline, MLflow's file store allowed, credentials in the environment: the trackers' tests
    (trackers_support.go_offline)."""
    from trackers_support import go_offline

    go_offline(monkeypatch)


@pytest.fixture(autouse=True)
def _no_ambient_cluster_or_database(monkeypatch):
    """A researcher's exported RAY_ADDRESS or RPG_DB must not send a test's runs or rows elsewhere."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(DB_ENVVAR, raising=False)


def _postgres_bin() -> Path | None:
    """The directory of initdb and pg_ctl: on PATH, else Debian's layout (postgresql-NN)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """A PostgreSQL server on 127.0.0.1 at a free port, its data in a temporary directory (`postgres()`)."""

    def __init__(self, bindir: Path, root: Path, port: int, user: pwd.struct_passwd | None):
        self.bindir, self.root, self.data, self.port = bindir, root, root / "data", port
        self.run_as = {"user": user.pw_uid} if user is not None else {}
        self.url = f"postgresql+psycopg://rpg@127.0.0.1:{port}/postgres"  # user rpg, trust authentication

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, timeout=120, **self.run_as)

    def start(self) -> subprocess.CompletedProcess:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        pg_ctl = str(self.bindir / "pg_ctl")
        return self.ctl(pg_ctl, "-D", str(self.data), "-l", str(self.root / "log"), "-o", options, "-w", "start")

    def stop(self, mode: str = "immediate") -> subprocess.CompletedProcess:
        return self.ctl(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")


@contextlib.contextmanager
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server started for the caller, stopped and removed after; skips the test where
    PostgreSQL or the psycopg driver is absent."""
    bindir = _postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (initdb, pg_ctl)")
    pytest.importorskip("psycopg", reason="the psycopg driver is not installed")
    user = None
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run PostgreSQL as")
    root = Path(tempfile.mkdtemp(prefix="rpg-pg-"))
    if user is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
    server = PostgresServer(bindir, root, _free_port(), user)
    init = server.ctl(
        str(bindir / "initdb"), "-D", str(server.data), "-U", "rpg", "--auth=trust", "-E", "UTF8", "--no-sync"
    )
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"initdb failed: {init.stderr.strip()[-300:]}")
    start = server.start()
    if start.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"PostgreSQL did not start: {start.stderr.strip()[-300:]}")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """The session's PostgreSQL server (`postgres()`); yields the URL of its `postgres` database."""
    with postgres() as server:
        yield server.url


@pytest.fixture
def own_postgres_server():
    """A PostgreSQL server of the test's own, which it may stop and start again (a restart)."""
    with postgres() as server:
        yield server


def new_postgres_database(server_url: str) -> str:
    """A new, empty database on the test server; its URL."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with contextlib.closing(psycopg.connect(server_url.replace("+psycopg", ""), autocommit=True)) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def postgres_db(postgres_server) -> str:
    return new_postgres_database(postgres_server)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """A database URL where nothing exists yet, for each dialect (PostgreSQL: an empty database)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs' / 'results.db'}"
    return new_postgres_database(request.getfixturevalue("postgres_server"))


@pytest.fixture
def no_slurm_here(tmp_path, monkeypatch):
    """A working directory, and a PATH without Slurm's commands: the dry run is the same on every machine."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.chdir(tmp_path)
    return tmp_path
