"""A run's directory: its layout and checkpoints, how files are written whole, how logs are read.

    runs/<sweep>/<run name>/
      spec.json       the canonical spec; written before the job starts, read by the local backend
      metrics.jsonl   one line per step, {"step": N, "data": {"actor/pg_loss": ...}}: verl's file
                      logger's format, written by both backends through `MetricsLog`, only ever
                      appended to; a resumed attempt appends {"restart": {"keep_through": N}} first
                      (the steps after N logged so far are void), and a run that stops on request
                      ends with {"stopped": {"step": N, "why": ...}}; store/ingest.py reads it
      stop_request    a graceful stop asked of the live run (request_stop): `preempted` or `cancelled`
      held_since      when the current attempt began holding its devices (mark_held: after verl's wait
                      for GPUs, the local trainer's start), UTC; the watcher records it (rpg_cli/cost.py)
      job.log         the job's output, saved when it ends or is cancelled
      checkpoints/    step_N/ (local backend: an HF model directory, plus its trainer state) or
                      global_step_N/actor/huggingface/ (verl, when it saves hf_model); the spec's
                      `checkpoints` setting thins or removes all but the newest (prune_checkpoints)
      eval/step_N/<benchmark>.jsonl   `rpg eval`'s generated responses, its resume cache
      eval/step_N/<benchmark>.scored.jsonl   its scored samples, one line per problem: what an
                      evaluation records, ingested by the `rpg` that holds the store (store/ingest.py)
    runs/<sweep>/slurm/   `rpg slurm`'s script, job id and output (slurm_dir)

`write_atomic` writes a file whole or not at all; `last_lines` and `last_error_line` read the end of
a log. Standard library only: the orchestrator, both backends and the evaluation import this.

The runs directory may be shared (a team's filesystem), so what rpg makes or opens below it follows one
rule, the one `runs/ray` follows too (orchestration/head.py): every directory and file is owned by the
user and writable by nobody else, and no symbolic link is followed: rpg never makes one, so a link
there was planted. A path that breaks the rule is refused (UnsafePathError, one line naming it). What
rpg creates is writable by its owner only, whatever the umask; the umask decides who may read it
(FILE_MODE, DIR_MODE): 022 lets everyone read, 027 with a group-owned runs/ lets the team read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from datetime import datetime, timezone
from pathlib import Path

SPEC_FILE = "spec.json"
METRICS_FILE = "metrics.jsonl"
JOB_LOG = "job.log"
CHECKPOINTS_DIR = "checkpoints"
EVAL_DIR = "eval"
RESTART_KEY = "restart"  # metrics.jsonl: a resumed attempt's first line (restart_line)
STOP_REQUEST = "stop_request"  # a graceful stop asked of a live run (request_stop); its trainer ends after the step
STOPPED_KEY = "stopped"  # metrics.jsonl: the last line of a run that stopped on request (stopped_line)
HELD_MARK = "held_since"  # when the job's current attempt began holding its devices (mark_held)
# why a run was asked to stop gracefully: preempted (a signal: SIGTERM, Slurm's USR1) resumes with the next
# `rpg sweep`; cancelled (`rpg cancel --graceful`) is stopped, resumed with --retry-failed
PREEMPTED, CANCELLED = "preempted", "cancelled"


# What rpg and its trackers keep directly under the runs directory, beside the sweeps' directories
# (runs/<sweep>/): each name is defined here, once, and its user imports it. No sweep may take one of them
# (spec/sweep.py refuses it at the dry run): its runs would be written into rpg's files (runs/ray holds the
# local head's token), or the store could not be made (a directory runs/results.db).
HEAD_DIR = "ray"  # the local Ray head's private directory: head.json, its token, Ray's files (orchestration/head.py)
STORE_FILE = "results.db"  # the default results database (store/url.py: DEFAULT_DB_URL)
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")  # what SQLite keeps beside a database file, by its suffix
PLAIN_SWEEP = "checkpoints"  # `rpg eval`'s sweep of models that belong to no run (evaluation/plan.py)
PLOTS_DIR = "plots"  # `rpg report --plot`'s figures by default (cli/report.py)
TENSORBOARD_DIR = "tensorboard"  # TensorBoard's default log root (trackers/tensorboard.py)
MLFLOW_DB = "mlflow.db"  # MLflow's default tracking database (trackers/mlflow.py)
WANDB_DIR = "wandb"  # W&B's files of `rpg export --to wandb` (W&B's own directory name under the runs root)

RESERVED_NAMES: dict[str, str] = {
    HEAD_DIR: "the local Ray head's private files and its token",
    **{f"{STORE_FILE}{s}": "the results database" for s in ("", *SQLITE_SIDE_FILES)},
    PLAIN_SWEEP: "the sweep under which `rpg eval` records models that belong to no run",
    PLOTS_DIR: "the figures of `rpg report --plot`",
    TENSORBOARD_DIR: "TensorBoard's logs",
    **{f"{MLFLOW_DB}{s}": "MLflow's tracking database" for s in ("", *SQLITE_SIDE_FILES)},
    WANDB_DIR: "W&B's files",
}


def reserved_name(name: str) -> str | None:
    """What rpg keeps under the runs directory as `name` (RESERVED_NAMES), or None when a sweep may take it.
    Compared without case: on a case-insensitive filesystem (macOS) `Ray` is `ray`."""
    return {k.casefold(): v for k, v in RESERVED_NAMES.items()}.get(name.casefold())


def diverged(step: int, what: str) -> str:
    """The failure reason of a run whose step `step` left `what` non-finite ("actor/pg_loss is nan")."""
    return f"training diverged at step {step}: {what}; lower lr or beta, then `rpg sweep SPEC --retry-failed`"


_DIVERGED = re.compile(r"training diverged at step (\d+): (.*?)(?:; lower lr or beta, then |$)")


def diverged_at(error: str | None) -> tuple[int, str] | None:
    """(step, what) of a failure reason `diverged` wrote (anywhere in it: a backend may name itself first)."""
    found = _DIVERGED.search(error or "")
    return (int(found.group(1)), found.group(2).strip()) if found else None


# What rpg creates under the runs directory: the owner writes, the umask says who reads.
FILE_MODE = 0o644
DIR_MODE = 0o755
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH

_STEP_DIR = re.compile(r"^(?:global_)?step_(\d+)$")
LOCAL_STATE_FILE = "trainer_state.pt"  # the local backend's resume state beside the HF model in step_N/
_WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")


def spec_path(run_dir: Path) -> Path:
    return Path(run_dir) / SPEC_FILE


def metrics_path(run_dir: Path) -> Path:
    return Path(run_dir) / METRICS_FILE


def job_log_path(run_dir: Path) -> Path:
    return Path(run_dir) / JOB_LOG


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def eval_cache_path(run_dir: Path, step: int, benchmark: str) -> Path:
    return Path(run_dir) / EVAL_DIR / f"step_{step}" / f"{benchmark}.jsonl"


def eval_scored_path(run_dir: Path, step: int, benchmark: str) -> Path:
    return Path(run_dir) / EVAL_DIR / f"step_{step}" / f"{benchmark}.scored.jsonl"


def slurm_dir(sweep_dir: Path) -> Path:
    """`rpg slurm`'s files for a sweep (runs/<sweep>/slurm/): its sbatch script, the id of its Slurm job
    (what `rpg cancel SWEEP` cancels), Slurm's output, the Ray token of a running allocation."""
    return Path(sweep_dir) / "slurm"


def write_spec(run_dir: Path, spec: dict) -> Path:
    """Write `<run_dir>/spec.json` atomically (the run directory made or checked first); returns its path."""
    import json

    return write_run_file(spec_path(run_dir), json.dumps(spec, indent=2, sort_keys=True) + "\n")


def write_run_file(path: str | Path, data: str | bytes) -> Path:
    """`write_atomic` of a file in a run directory (spec.json, job.log): the directory made or checked
    first, the file FILE_MODE (the module's rule)."""
    path = Path(path)
    make_run_dir(path.parent)
    return write_atomic(path, data, mode=FILE_MODE)


# ------------------------------------------------------------------------------- shared runs directory


class UnsafePathError(OSError):
    """A path under the runs directory that breaks the module's rule; one line: the path, what is
    wrong, the fix (an OSError: every command says it as one line, as `os_error_line` does)."""

    def __init__(self, path: str | Path, why: str):
        super().__init__(None, why, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def check_owned(path: str | Path, info: os.stat_result, directory: bool = False) -> None:
    """Refuse (UnsafePathError) what `info` (an lstat or fstat of `path`) says rpg must not use: a link,
    another kind of file, someone else's, or writable by others."""
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(path, "a symbolic link, which rpg never makes (someone planted it); remove it")
    if not (stat.S_ISDIR if directory else stat.S_ISREG)(info.st_mode):
        raise UnsafePathError(path, f"not a {'directory' if directory else 'regular file'}; remove it")
    if info.st_uid != os.geteuid():
        raise UnsafePathError(
            path, f"belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); remove it, or use another --runs-dir"
        )
    if info.st_mode & _OTHERS_WRITE:
        raise UnsafePathError(
            path,
            f"others can write it (mode {stat.S_IMODE(info.st_mode):o}); if you trust it chmod go-w it, else remove it",
        )


def make_dirs(path: str | Path, below: str | Path) -> Path:
    """`path` as a directory of the user's (the module's rule), made if missing, and so every directory
    between `below` (the user's choice: made if missing, not checked) and it; returns `path`."""
    path, below = Path(path), Path(below)
    try:
        parts = path.relative_to(below).parts
    except ValueError:
        raise ValueError(f"{path} is not below {below}") from None
    below.mkdir(parents=True, exist_ok=True)
    current = below
    for part in parts:
        current = current / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(current, DIR_MODE)
        check_owned(current, os.lstat(current), directory=True)
    return path


def absolute_run_dir(run_dir: str | Path) -> Path:
    """`runs/<sweep>/<run>` as an absolute path with the runs directory's links resolved but not the
    sweep's and the run's: those rpg makes itself, and a link there must be seen, not followed."""
    run_dir = Path(run_dir).absolute()
    return run_dir.parent.parent.resolve() / run_dir.parent.name / run_dir.name


def make_run_dir(run_dir: str | Path) -> Path:
    """`runs/<sweep>/<run>`: the sweep's and the run's directories made or checked, and what the run
    directory holds already (spec.json, metrics.jsonl, job.log, checkpoints/, eval/) checked (the
    module's rule): also what verl will write to, which rpg cannot open for it."""
    run_dir = Path(run_dir).absolute()
    make_dirs(run_dir, run_dir.parent.parent)
    for name in (SPEC_FILE, METRICS_FILE, JOB_LOG, CHECKPOINTS_DIR, EVAL_DIR):
        entry = run_dir / name
        with contextlib.suppress(FileNotFoundError):
            check_owned(entry, os.lstat(entry), directory=name in (CHECKPOINTS_DIR, EVAL_DIR))
    return run_dir


def open_owned(path: str | Path, flags: int = os.O_RDONLY, anyone: bool = False) -> int:
    """A file descriptor on `path` (os.open `flags`; O_CREAT makes it FILE_MODE) under the module's rule,
    checked on the opened file: no link followed, the user's own, writable by nobody else. With
    `anyone` (reading only: a team's store ingests a teammate's metrics) any user's regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(
                path, "a symbolic link, which rpg never makes (someone planted it); remove it"
            ) from None
        raise
    try:
        info = os.fstat(fd)
        if not (anyone and stat.S_ISREG(info.st_mode) and not flags & (os.O_WRONLY | os.O_RDWR)):
            check_owned(path, info)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_line(path: str | Path, line: str | bytes) -> None:
    """Append one line to a file rpg keeps (metrics.jsonl, eval's JSONL files), made if missing (the
    module's rule). A line cut short by a crash is ended first, so `line` stays a line of its own: a
    reader skips the torn one. One write: a concurrent reader sees the line whole or not at all."""
    data = (line.encode("utf-8") if isinstance(line, str) else line).rstrip(b"\n") + b"\n"
    fd = open_owned(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        os.write(fd, data)
    finally:
        os.close(fd)


def read_owned(path: str | Path) -> bytes | None:
    """The bytes of a file rpg keeps (the module's rule); None when there is none."""
    try:
        fd = open_owned(path)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def settle_modes(root: str | Path) -> None:
    """Give what a library wrote below `root` (a checkpoint: HF and torch choose their own modes) rpg's
    modes, FILE_MODE and DIR_MODE less the umask; links are left alone."""
    umask = os.umask(0)
    os.umask(umask)
    for folder, dirs, files in os.walk(root):
        for name, mode in [(d, DIR_MODE) for d in dirs] + [(f, FILE_MODE) for f in files] + [("", DIR_MODE)]:
            target = os.path.join(folder, name) if name else folder
            if not os.path.islink(target):
                os.chmod(target, mode & ~umask)


def restart_line(keep_through: int | None) -> str:
    """The metrics.jsonl line a resumed attempt appends before its first record: the steps after
    `keep_through` (all when None) that earlier attempts logged are void."""
    import json

    return json.dumps({RESTART_KEY: {"keep_through": keep_through}}) + "\n"


def stop_request_path(run_dir: Path) -> Path:
    return Path(run_dir) / STOP_REQUEST


def request_stop(run_dir: Path, why: str) -> Path:
    """Ask the run's trainer to end gracefully after the step it is in (a checkpoint, a `stopped_line`, exit).
    A file in the run directory, so that it reaches a trainer on any node of the cluster through the shared
    `runs/`, and outlives Ray's few seconds between SIGTERM and SIGKILL."""
    if why not in (PREEMPTED, CANCELLED):
        raise ValueError(f"a stop request is {PREEMPTED!r} or {CANCELLED!r}, not {why!r}")
    return write_atomic(stop_request_path(run_dir), why + "\n")


def stop_requested(run_dir: Path) -> str | None:
    """Why the run was asked to stop (PREEMPTED or CANCELLED), or None."""
    data = read_owned(stop_request_path(run_dir))
    why = data.decode("utf-8", "replace").strip() if data is not None else None
    return why if why in (PREEMPTED, CANCELLED) else None


def clear_stop_request(run_dir: Path) -> None:
    """A new attempt starts with no request left over from the one before."""
    stop_request_path(run_dir).unlink(missing_ok=True)


def held_mark_path(run_dir: Path) -> Path:
    return Path(run_dir) / HELD_MARK


def mark_held(run_dir: Path, at: datetime | None = None) -> Path:
    """Note that the job's attempt holds its devices from now (or `at`): verl's job once its wait for free GPUs
    lets it through, the local trainer as it starts. A file, because the job may run on any node and the watcher
    reads it through the shared `runs/` (its device time: rpg_cli/cost.py); ISO 8601 in UTC, written whole. The
    run directory must exist (FileNotFoundError): a mark never makes one."""
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(errno.ENOENT, "no run directory to mark", str(run_dir))
    at = at or datetime.now(timezone.utc)
    at = at.astimezone(timezone.utc) if at.tzinfo else at.replace(tzinfo=timezone.utc)
    return write_atomic(held_mark_path(run_dir), at.isoformat(timespec="microseconds") + "\n")


def held_since(run_dir: Path) -> datetime | None:
    """When the attempt that wrote the mark began holding its devices, as naive UTC (the store's times); None
    when there is no mark or it does not read as a time (a job's file: untrusted)."""
    data = read_owned(held_mark_path(run_dir))
    if data is None:
        return None
    try:
        at = datetime.fromisoformat(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return at.astimezone(timezone.utc).replace(tzinfo=None) if at.tzinfo else at


def clear_held(run_dir: Path) -> None:
    """A new attempt starts with no mark left by the one before (it has not held its devices yet)."""
    held_mark_path(run_dir).unlink(missing_ok=True)


def stopped_line(step: int, why: str) -> str:
    """The metrics.jsonl line a trainer appends after the checkpoint of step `step`, when it stops on request."""
    import json

    return json.dumps({STOPPED_KEY: {"step": step, "why": why}}) + "\n"


class MetricsLog:
    """Append-only `metrics.jsonl` in verl's file-logger format, the one writer of both backends: a
    reader that remembers an offset never loses a line, and a resumed attempt never erases an earlier one."""

    def __init__(self, path: Path, keep_through: int | None):
        """Continue the file of an earlier attempt, if any, with a restart line: the steps after
        `keep_through` (all of them when None) it logged are void. A line cut short by a crash is
        ended first, so the restart line stays a line of its own."""
        self.path = Path(path)
        make_run_dir(self.path.parent)
        fd = open_owned(self.path, os.O_RDONLY | os.O_CREAT)
        try:
            earlier = os.fstat(fd).st_size > 0
        finally:
            os.close(fd)
        if earlier:
            append_line(self.path, restart_line(keep_through))

    def write(self, step: int, data: dict) -> None:
        import json

        append_line(self.path, json.dumps({"step": step, "data": data}, sort_keys=True, default=_plain))


def _plain(value):
    # numpy and torch scalars (verl's metrics) as JSON numbers
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not a metric value")


# ------------------------------------------------------------------------------------------ checkpoints


def local_checkpoint(run_dir: Path, step: int) -> Path:
    """Where the local backend saves step N: checkpoints/step_N."""
    return checkpoints_dir(run_dir) / f"step_{step}"


def step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """Every checkpoints/step_N and checkpoints/global_step_N directory of a run, by step."""
    root = checkpoints_dir(run_dir)
    found = []
    if root.is_dir():
        for entry in root.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and entry.is_dir():
                found.append((int(match.group(1)), entry))
    return sorted(found)


def model_dir(step_dir: Path) -> Path | None:
    """The HF model inside a checkpoint: the directory itself (local backend) or verl's actor/huggingface."""
    for candidate in (step_dir, step_dir / "actor" / "huggingface"):
        if (candidate / "config.json").is_file() and has_weights(candidate):
            return candidate
    return None


def has_weights(directory: Path) -> bool:
    return any(any(Path(directory).glob(pattern)) for pattern in _WEIGHT_FILES)


def find_checkpoints(run_dir: Path) -> dict[int, Path | None]:
    """Every checkpoint step of a run and its HF model directory (None: saved without HF weights)."""
    found: dict[int, Path | None] = {}
    for step, entry in step_dirs(run_dir):
        found[step] = found.get(step) or model_dir(entry)
    return found


def prune_checkpoints(run_dir: Path, keep: int | None, weights: str) -> list[int]:
    """Apply a run's `checkpoints` setting after a checkpoint is saved (and marked the latest): the newest
    `keep` stay whole (a resume reads the newest); each older one is thinned to its HF weights, what `rpg
    eval` reads (weights "all"), or removed (weights "kept", or one without HF weights). Returns the steps
    touched. A checkpoint that cannot be removed is left as it is: disk is not worth a failed run."""
    if keep is None:
        return []
    touched = []
    for step, entry in step_dirs(run_dir)[:-keep]:
        if entry.is_symlink():
            continue  # never followed (module doc)
        weights_dir = model_dir(entry)
        if weights == "all" and weights_dir is not None:
            if not _thin(entry, weights_dir):
                continue
        else:
            shutil.rmtree(entry, ignore_errors=True)
        touched.append(step)
    return touched


def _thin(step_dir: Path, weights_dir: Path) -> bool:
    """Remove from a checkpoint everything but its HF model directory; False when nothing was left to remove.
    The local backend's model is the step directory itself, less its trainer state."""
    removable = [step_dir / LOCAL_STATE_FILE] if weights_dir == step_dir else []
    for parent in [weights_dir, *weights_dir.parents]:
        if parent == step_dir:
            break
        removable += [sibling for sibling in parent.parent.iterdir() if sibling != parent]
    removable = [p for p in removable if p.exists() or p.is_symlink()]
    for path in removable:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return bool(removable)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """The checkpoint directory of `step` (verl's name first), or where the local backend would put it."""
    for name in (f"global_step_{step}", f"step_{step}"):
        if (checkpoints_dir(run_dir) / name).is_dir():
            return checkpoints_dir(run_dir) / name
    return local_checkpoint(run_dir, step)


def as_checkpoint(path: Path) -> tuple[int, Path, Path | None] | None:
    """(step, checkpoint directory, run directory or None) when `path` is one checkpoint of a run:
    step_N, global_step_N, or global_step_N/actor[/huggingface]."""
    path = Path(path)
    if _STEP_DIR.match(path.name):
        step_dir = path
    elif path.name == "actor" and _STEP_DIR.match(path.parent.name):
        step_dir = path.parent
    elif path.name == "huggingface" and path.parent.name == "actor" and _STEP_DIR.match(path.parent.parent.name):
        step_dir = path.parent.parent
    else:
        return None
    match = _STEP_DIR.match(step_dir.name)
    assert match is not None
    run_dir = step_dir.parent.parent if step_dir.parent.name == CHECKPOINTS_DIR else None
    return int(match.group(1)), step_dir, run_dir


# ---------------------------------------------------------------------------------- writing, reading


def write_atomic(path: str | Path, data: str | bytes, mode: int = 0o666) -> Path:
    """Write a file whole or not at all (a temporary file beside it, renamed over it: a link at `path`
    is replaced, never followed); returns its path.

    `mode` is filtered by the umask, as for any new file (0o600: the owner only). An OSError names
    `path` (or the directory that could not be made), not the temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    return path


_FIX_OF_ERRNO = {
    errno.ENOSPC: "the disk is full: free space there (df -h shows where), or write elsewhere",
    errno.EDQUOT: "your disk quota is used up: free space, or write elsewhere",
    errno.EROFS: "that filesystem is mounted read-only: write elsewhere (another --runs-dir, --output or --db)",
    errno.EACCES: "you may not write there: fix its permissions, or write elsewhere (another --runs-dir or --output)",
    errno.EPERM: "you may not write there: fix its permissions, or write elsewhere (another --runs-dir or --output)",
}


def os_error_line(exc: OSError) -> str:
    """A failed file operation as one line: the path, what went wrong, and what to do about it."""
    what = exc.strerror or str(exc) or type(exc).__name__
    where = f"{exc.filename}: " if exc.filename else ""
    fix = _FIX_OF_ERRNO.get(exc.errno or 0)
    return f"{where}{what}" + (f"; {fix}" if fix else "")


def last_lines(text: str, n: int = 1) -> str:
    """The last `n` non-blank lines of `text`, stripped and joined by " | "; '' when there are none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-n:])


_ERROR_LINE = re.compile(r"^\s*(?:\S*\.)?([A-Z]\w*(?:Error|Exception)|AssertionError|KeyboardInterrupt)\b:?\s*(.*)$")


def last_error_line(log: str) -> str:
    """The last `SomeError: message` line of a traceback-bearing log ('' when there is none)."""
    for line in reversed(log.splitlines()):
        match = _ERROR_LINE.match(line)
        if match and "Traceback" not in line:
            name, message = match.groups()
            return f"{name}: {message}".strip().rstrip(":")
    return ""


# Failures any job may meet, recognised in its log, and what to do; the first that matches names it.
_DISK_FULL = re.compile(
    r"No space left on device(?::? '([^']+)')?|Disk quota exceeded(?::? '([^']+)')?"
    r"|inline_container\.cc.*(?:file write failed|unexpected pos)|PytorchStreamWriter failed writing"
)
_GPU_OOM = re.compile(r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError|CUDA error: out of memory")
_HOST_OOM = re.compile(
    r"ray\.exceptions\.OutOfMemoryError|node running low on memory|\bMemoryError\b|std::bad_alloc|Out of memory: Killed"
)


def known_failure(log: str, then: str = "run the command again") -> str | None:
    """A disk that filled up, a GPU or the machine out of memory, said with what to do; None otherwise.
    `then`: what to do once there is space again."""
    if found := _DISK_FULL.search(log):
        path = found.group(1) or found.group(2)
        where = f" writing {path}" if path else ""
        return f"disk full{where}: free space (df -h shows where), then {then}"
    if _GPU_OOM.search(log):
        return "GPU out of memory: lower the context, train_batch_size or rollout_n, or use more GPUs"
    if _HOST_OOM.search(log):
        return "the machine ran out of memory (host RAM): lower the batch sizes or rollout_n, or use a bigger machine"
    return None


def failure_line(log: str, limit: int = 300) -> str:
    """One line for a failed job, from the tail of its log: a known failure (disk full, out of memory),
    else its last error, else its last line."""
    known = known_failure(log, then="`rpg sweep SPEC --retry-failed` resumes from the last checkpoint")
    return (known or last_error_line(log) or last_lines(log) or "the job failed without output")[:limit]
