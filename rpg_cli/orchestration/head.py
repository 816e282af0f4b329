"""Which Ray cluster rpg talks to: the one at --address (or $RAY_ADDRESS), or a local head of its own.

The local head is started with `ray start` in a process group of its own, bound to 127.0.0.1 and
protected by a token of its own (runs/ray/auth_token). It outlives rpg so jobs keep running;
`stop_local_head` ends it (and only it).

A machine's loopback is shared by its users, so nothing another user could write is trusted:
runs/ray is the owner's only (0700), Ray's own files go in a directory below it (Ray makes that one
world-writable; under a 0700 parent nobody else can reach it), and head.json and the token are read
only when they belong to the current user and nobody else can write them (the token: nor read it).
That token is only ever sent to a loopback dashboard. When runs/ray is too long a path for Ray's Unix
sockets, Ray's files go below a 0700 directory of the user's own under /tmp instead.

A cluster at --address gets the token Ray's own clients would send (`remote_token`: RAY_AUTH_TOKEN, the
file RAY_AUTH_TOKEN_PATH names, or with RAY_AUTH_MODE=token ~/.ray/auth_token), in a header only: never
printed, logged, stored or put in a job's environment. A head that answers the Jobs API without any
token gets one warning line on stderr (`warn_if_unauthenticated`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rpg_cli.rundir import HEAD_DIR, last_lines, write_atomic
from rpg_cli.store.url import DB_ENVVAR

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

DEFAULT_RUNS_DIR = Path("runs")
# Ray binds Unix sockets at <temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/<name>: about 69
# bytes past the temp dir, within the 107 (Linux) or 103 (macOS) bytes a socket path may have.
_MAX_TEMP_DIR_LEN = (103 if sys.platform == "darwin" else 107) - 69


class ClusterError(RuntimeError):
    """The Ray cluster cannot be reached or started. The message is one line naming the fix."""


# --------------------------------------------------------------------------------------- local head


@dataclass(frozen=True)
class Head:
    dashboard_url: str  # what the Jobs API talks to
    gcs_address: str
    temp_dir: str  # Ray's files (sessions, logs, sockets)
    pgid: int  # every Ray daemon of this head runs in this process group
    host: str
    token_file: str  # the head's own auth token: nobody else on this machine can submit to it

    @property
    def auth_headers(self) -> dict[str, str]:
        token = read_private(Path(self.token_file), secret=True)
        if not token:
            raise ClusterError(f"{self.token_file} is missing or empty; stop the head (rpg stop --force) and run again")
        return {"Authorization": f"Bearer {token.strip()}"}


ENV_NAMES_FILE = "env_names.json"


def head_env_names(runs_dir: Path = DEFAULT_RUNS_DIR) -> set[str] | None:
    """The names of the environment variables the local head of `runs_dir` started with (its jobs get
    that environment); None when unknown (no head, or one started by an older rpg)."""
    try:
        text = read_private(_head_dir(runs_dir) / ENV_NAMES_FILE)
        names = json.loads(text) if text else None
    except (ClusterError, ValueError):
        return None
    return {str(n) for n in names} if isinstance(names, list) else None


def _head_dir(runs_dir: Path) -> Path:
    return Path(runs_dir).resolve() / HEAD_DIR


def _temp_dir(head_dir: Path) -> Path:
    """Ray's temp dir: a child of a directory only the user can enter (Ray makes the child itself 0777)."""
    if len(str(head_dir / "t")) <= _MAX_TEMP_DIR_LEN:
        return head_dir / "t"
    tmp = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    return tmp / f"rpg-ray-{hashlib.sha1(str(head_dir).encode()).hexdigest()[:10]}" / "t"


def private_dir(path: Path) -> Path:
    """`path` as a directory that belongs to the current user and that only they can enter (0700),
    created if needed; ClusterError (one line) when it is a link or someone else's."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ClusterError(
            f"{path} is not a directory but a link or file; rpg keeps its Ray head's token there: "
            "remove it and run again"
        )
    if info.st_uid != os.geteuid():
        raise ClusterError(
            f"{path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); rpg keeps its Ray "
            "head's token there: remove it, or use another --runs-dir"
        )
    if info.st_mode & 0o077:  # opened up (by Ray, or an older rpg): only the owner may enter
        os.chmod(path, 0o700)
    return path


def read_private(path: Path, secret: bool = False) -> str | None:
    """The text of a file the local head keeps, None when there is none; ClusterError (one line) unless
    it belongs to the current user and nobody else can write it (a `secret`: nor read it). The checks
    are made on the opened file, so it cannot be swapped in between; links are not followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symbolic link
        raise ClusterError(f"{path} cannot be trusted ({exc.strerror}); remove it and run again") from None
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.geteuid():
            raise ClusterError(
                f"{path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); it is not "
                f"your rpg's: remove it (rm {path}) and run again"
            )
        if info.st_mode & (0o077 if secret else 0o022):
            who = "read or written" if secret else "written"
            fix = (
                f"stop the head (rpg stop --force), remove it (rm {path}); the next head gets a new token"
                if secret
                else f"if you trust its content chmod go-w {path}, else remove it"
            )
            raise ClusterError(f"{path} can be {who} by other users (mode {stat.S_IMODE(info.st_mode):o}); {fix}")
        return f.read()


def _read_head(head_dir: Path) -> Head | None:
    """The head recorded in head.json when it is this machine's; ClusterError when the file cannot be
    trusted or names a dashboard off loopback (the token is sent there)."""
    path = head_dir / "head.json"
    text = read_private(path)
    if text is None:
        return None
    try:
        head = Head(**json.loads(text))
    except (ValueError, TypeError):
        return None  # torn or from another version: treated as no head
    if head.host != socket.gethostname():
        return None
    url = urllib.parse.urlsplit(head.dashboard_url)
    if url.scheme != "http" or url.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ClusterError(
            f"{path} names the dashboard {head.dashboard_url}, which is not on loopback; rpg's local "
            f"head listens on 127.0.0.1 only: remove the file (rm {path}) and run again"
        )
    return Head(**{**head.__dict__, "token_file": str(head_dir / "auth_token")})  # never a path read from a file


def _dashboard_alive(head: Head) -> bool:
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via $http_proxy
    try:
        request = urllib.request.Request(f"{head.dashboard_url}/api/version", headers=head.auth_headers)
        with no_proxy.open(request, timeout=3) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock across processes: two rpg commands must not start two heads."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def local_head(
    runs_dir: Path = DEFAULT_RUNS_DIR,
    start: bool = True,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    timeout_s: float = 180.0,
) -> Head | None:
    """The live local head of `runs_dir`, started if needed (and `start`); None if none and not `start`."""
    head_dir = _head_dir(runs_dir)
    if not start and not (head_dir / "head.json").exists():
        return None
    private_dir(head_dir)
    with _locked(head_dir / "head.lock"):
        head = _read_head(head_dir)
        if head is not None and _dashboard_alive(head):
            return head
        if not start:
            return None
        if head is not None:  # ours, but no longer answering: clear what is left of it
            _kill_head_processes(head)
        deadline, attempt = time.monotonic() + timeout_s, 1
        while True:
            try:
                return _start_head(head_dir, num_cpus, num_gpus, max(deadline - time.monotonic(), 1.0))
            except ClusterError as exc:
                if RAY_STARTUP_TIMEOUT not in str(exc) or attempt == START_ATTEMPTS or time.monotonic() > deadline:
                    raise
                attempt += 1


# Ray waits a fixed 30 s for its raylet to register (ray/_private/node.py); a machine busy for longer (a laptop
# compiling, a loaded login node) fails `ray start` with this, and a second start usually gets through
RAY_STARTUP_TIMEOUT = "timed out during startup"
START_ATTEMPTS = 2


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def ray_start_command(temp_dir: Path) -> tuple[list[str], int, int]:
    """`ray start --head` bound to 127.0.0.1 with free ports of its own and Ray's files under `temp_dir`:
    (argv, GCS port, dashboard port)."""
    gcs, dashboard, client, agent_http, agent_grpc, metrics, runtime_env = _free_ports(7)
    cmd = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        "--include-dashboard=true",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent_http}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    return cmd, gcs, dashboard


def _start_head(head_dir: Path, num_cpus: int | None, num_gpus: int | None, timeout_s: float) -> Head:
    temp_dir = _temp_dir(head_dir)
    private_dir(temp_dir.parent)
    temp_dir.mkdir(exist_ok=True)
    cmd, gcs, dashboard = ray_start_command(temp_dir)
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus}")
    token_file = head_dir / "auth_token"
    if not read_private(token_file, secret=True):
        write_atomic(token_file, secrets.token_hex(32), mode=0o600)
    env = {
        **os.environ,
        # Ray resolves 127.0.0.1 to the machine's address and listens on every interface unless it
        # believes it is a single-machine (macOS/Windows-style) setup: this keeps it on loopback.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        # Jobs inherit the head's environment: put this Python's bin first so `python` means rpg's.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        # Token authentication with a token of this head's own (not ~/.ray/auth_token, whose mere
        # existence would otherwise decide the mode): loopback is shared by every local user. Jobs
        # inherit these, so a job's own ray.init() reaches its cluster.
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
    }
    # Nor the store's URL: a job never needs it (evaluation/job.py), and it may hold a password.
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN", DB_ENVVAR):
        env.pop(var, None)
    # Which variables its jobs will find (names, never values): a credential exported after the head
    # started never reaches a job, and rpg never passes one (trackers.credentials_missing_on_head).
    write_atomic(head_dir / ENV_NAMES_FILE, json.dumps(sorted(env)), mode=0o600)
    log = head_dir / "start.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    head = Head(
        f"http://127.0.0.1:{dashboard}",
        f"127.0.0.1:{gcs}",
        str(temp_dir),
        proc.pid,
        socket.gethostname(),
        str(token_file),
    )
    # Recorded before it is ready: if rpg is interrupted now, the next one finds it and clears it.
    write_atomic(head_dir / "head.json", json.dumps(head.__dict__, indent=2), mode=0o600)
    deadline = time.monotonic() + timeout_s
    try:
        code = proc.wait(timeout=timeout_s)
        if code != 0:
            raise ClusterError(f"`ray start --head` failed (exit {code}): {_last_line(log)} (full log: {log})")
        while not _dashboard_alive(head):
            if time.monotonic() > deadline:
                raise ClusterError(f"the local Ray head did not answer within {timeout_s:.0f} s (log: {log})")
            time.sleep(0.5)
    except (ClusterError, subprocess.TimeoutExpired) as exc:
        _kill_head_processes(head)
        (head_dir / "head.json").unlink(missing_ok=True)
        if isinstance(exc, ClusterError):
            raise
        raise ClusterError(f"`ray start --head` did not finish within {timeout_s:.0f} s (log: {log})") from None
    return head


def _kill_head_processes(head: Head, grace_s: float = 3.0) -> None:
    """Terminate the head's process group and everything its daemons started (workers, job drivers
    run in groups of their own); by pid, and only if the group is still the one running this head.
    gcs_server and raylet may take well over 10 s to honour SIGTERM; Ray's daemons survive SIGKILL
    cleanly (it is what `ray stop --force` sends), so the grace period is short."""
    import psutil

    def pgid(p: psutil.Process) -> int | None:
        with contextlib.suppress(OSError):
            return os.getpgid(p.pid)
        return None

    def cmdline(p: psutil.Process) -> str:
        with contextlib.suppress(psutil.Error):
            return " ".join(p.cmdline())
        return ""

    def mine(p: psutil.Process) -> bool:
        with contextlib.suppress(psutil.Error):
            return p.uids().effective == os.geteuid()
        return False

    group = [p for p in psutil.process_iter() if pgid(p) == head.pgid and mine(p)]
    if not any(head.temp_dir in cmdline(p) for p in group):
        return  # gone, or the group id now belongs to someone else
    family = set(group)
    for p in group:
        with contextlib.suppress(psutil.Error):
            family.update(p.children(recursive=True))
    family.discard(psutil.Process())
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(list(family), timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def stop_local_head(runs_dir: Path = DEFAULT_RUNS_DIR) -> bool:
    """Stop the local head of `runs_dir` (its jobs die with it). False when there was none."""
    head_dir = _head_dir(runs_dir)
    if not (head_dir / "head.json").exists():
        return False
    private_dir(head_dir)
    with _locked(head_dir / "head.lock"):
        head = _read_head(head_dir)
        if head is None:
            return False
        _kill_head_processes(head)
        (head_dir / "head.json").unlink(missing_ok=True)
        return True


# ------------------------------------------------------------------------------------------ client


@contextlib.contextmanager
def _without_env(*names: str) -> Iterator[None]:
    saved = {n: os.environ.pop(n) for n in names if n in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def cluster_address(address: str | None = None) -> str | None:
    """The Ray cluster a command talks to: `address`, else $RAY_ADDRESS; None: rpg's own local head. The one place
    that decides (a sweep decides once, in its plan: orchestration/dryrun.py)."""
    return address or os.environ.get("RAY_ADDRESS") or None


def connect(
    address: str | None = None, runs_dir: Path = DEFAULT_RUNS_DIR, start: bool = True, local: bool = False
) -> JobSubmissionClient | None:
    """A Jobs API client: for `address` (or $RAY_ADDRESS) if given and not `local`, with the user's Ray
    token if there is one (`remote_token`), else for the local head of `runs_dir` (started if needed and
    `start`; None when there is none and not `start`)."""
    address = None if local else cluster_address(address)
    if not address:
        head = local_head(runs_dir, start=start)
        if head is None:
            return None
        return _client(head.dashboard_url, head.auth_headers)
    token = remote_token()
    client = _client(address, {"Authorization": f"Bearer {token.value}"} if token else None, remote=True, token=token)
    warn_if_unauthenticated(client.get_address())
    return client


def _client(
    address: str, headers: dict[str, str] | None, remote: bool = False, token: Token | None = None
) -> JobSubmissionClient:
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    # Ray lets $RAY_ADDRESS override an explicit address; here the explicit one wins.
    with _without_env("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        try:
            return JobSubmissionClient(address, headers=headers)
        except AuthenticationError as exc:
            if not remote:
                raise ClusterError(
                    f"the local Ray head at {address} refused its own token; stop it (rpg stop --force) and run again"
                ) from None
            # Ray's wording: 401 "Authentication required" (no token), 403 "Authentication failed" (wrong one)
            raise ClusterError(_auth_failure(address, token, refused="Authentication failed" in str(exc))) from None
        except Exception as exc:  # ConnectionError, ValueError, version mismatch: all mean "not usable"
            raise ClusterError(
                f"cannot reach the Ray cluster at {address} ({one_line(exc)}); check --address, or omit it "
                "to let rpg start a local head (or start one yourself: ray start --head)"
            ) from None


# ------------------------------------------------------------------------------ a cluster's token

AUTH_MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
_SETUP = "README, 4. Start Ray"


@dataclass(frozen=True, repr=False)
class Token:
    value: str
    source: str  # where it came from, for messages: never the value

    def __repr__(self) -> str:  # a traceback or a debugger shows the source, never the secret
        return f"Token(source={self.source!r})"


def default_token_path() -> Path:
    """Ray's default token file (ray/_private/authentication/authentication_token_setup.py)."""
    return Path.home() / ".ray" / "auth_token"


def remote_token() -> Token | None:
    """The token for a cluster at --address, found where Ray 2.60's clients look, in their order:
    $RAY_AUTH_TOKEN, else the file $RAY_AUTH_TOKEN_PATH names, else, with RAY_AUTH_MODE=token, Ray's
    default file ~/.ray/auth_token (Ray sends that file only to clusters it finds itself, or with
    the mode set). None when there is none, or RAY_AUTH_MODE=disabled. Unlike Ray's own client, the
    token is sent with the mode unset too: setting a token says to use it. ClusterError (one line)
    when RAY_AUTH_TOKEN_PATH names a file that is missing, unreadable or empty (Ray calls that fatal
    too), or when RAY_AUTH_MODE=token finds no token at all."""
    mode = os.environ.get(AUTH_MODE_ENV, "").strip().lower()
    if mode == "disabled":
        return None
    if os.environ.get(TOKEN_ENV, "").strip():
        return Token(os.environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}")
    named = os.environ.get(TOKEN_PATH_ENV, "")
    if named:
        return Token(_read_token(Path(named).expanduser()), f"{TOKEN_PATH_ENV}={named}")
    if mode != "token":
        return None
    path = default_token_path()
    if not path.is_file():
        raise ClusterError(
            f"{AUTH_MODE_ENV}=token but no Ray token is set: export {TOKEN_PATH_ENV}=FILE (a copy of the head's "
            f"token, chmod 600) or {TOKEN_ENV}, or put it in {path} ({_SETUP})"
        )
    return Token(_read_token(path, variable=None), str(path))


def _read_token(path: Path, variable: str | None = TOKEN_PATH_ENV) -> str:
    """The token in `path`, whitespace stripped as Ray strips it; ClusterError naming `variable` when the
    file cannot be read or holds nothing."""
    names = f"{variable} names {path}, which" if variable else f"{path}"
    fix = (
        f"point it at a file holding the Ray head's token (chmod 600), or unset it ({_SETUP})"
        if variable
        else f"write the Ray head's token there (chmod 600), or set {TOKEN_PATH_ENV} ({_SETUP})"
    )
    try:
        token = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        raise ClusterError(f"{names} does not exist; {fix}") from None
    except OSError as exc:
        raise ClusterError(f"{names} cannot be read ({exc.strerror}); {fix}") from None
    if not token:
        raise ClusterError(f"{names} is empty; {fix}")
    return token


def _auth_failure(address: str, token: Token | None, refused: bool) -> str:
    """One line for a head that wants a token (`refused`: it did not take the one sent)."""
    if refused and token is not None:
        return (
            f"the Ray head at {address} refused the token from {token.source}: it is not that head's token; "
            f"use a copy of the token the head was started with ({_SETUP})"
        )
    return (
        f"the Ray head at {address} requires a token (Ray token authentication); export {AUTH_MODE_ENV}=token "
        f"and {TOKEN_PATH_ENV}=FILE, a copy of the head's token (chmod 600), or {TOKEN_ENV} ({_SETUP})"
    )


_warned: set[str] = set()  # dashboards warned about in this process


def warn_if_unauthenticated(url: str, timeout_s: float = 2.0) -> None:
    """One warning line on stderr, once per process and head, when the dashboard at `url` answers its
    Jobs API without credentials: anyone who reaches it can submit jobs, that is run code as the
    user. One GET of /api/version without a token (a token-protected head answers 401: every path
    but a few health checks and the login page needs the token); no answer, no warning."""
    if url in _warned:
        return
    _warned.add(url)
    if accepts_anonymous_jobs(url, timeout_s):
        print(
            f"warning: the Ray head at {url} accepts job submissions without authentication: anyone who "
            f"reaches it can run code as you; start Ray with token auth ({_SETUP})",
            file=sys.stderr,
            flush=True,
        )


def accepts_anonymous_jobs(url: str, timeout_s: float = 2.0) -> bool:
    """Whether the Ray dashboard at `url` answers a Jobs API request that carries no credentials."""
    request = urllib.request.Request(f"{url.rstrip('/')}/api/version")  # no Authorization, no cookie
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, ValueError):  # 401/403 (HTTPError), unreachable, timeout, not an http(s) URL
        return False


def one_line(exc: BaseException) -> str:
    """An exception as one line of a message: its last non-blank line, else its type."""
    return (last_lines(str(exc)) or type(exc).__name__)[:300]


def _last_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        return last_lines(path.read_text(errors="replace"))[:300] or "no output"
    return "no output"
