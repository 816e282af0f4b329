"""`rpg slurm`: the allocation a grid needs and the sbatch script (always), and the real thing: a
one-node Slurm cluster on 127.0.0.1 (Debian's slurmctld, slurmd, munge) running the toy sweep, once to
the end and once cancelled half way and resubmitted."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rpg_cli.cli import app

REPO = Path(__file__).resolve().parents[1]
SLURM_PACKAGES = ("slurmctld", "slurmd", "munge", "slurm-client")
SLURM_PROGRAMS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scancel", "sinfo", "scontrol")

TINY = """\
name: {name}
base:
  algorithm: grpo
  model: data/toy/model
  context: 2k
  data:
    train_files: [data/toy/train.parquet]
    val_files: [data/toy/val.parquet]
  train_batch_size: 4
  rollout_n: 4
  ppo_mini_batch_size: 4
  steps: 3
  seed: 0
  optimizer: adamw
  lr: 5.0e-4
  beta: 1.0e-3
  reference: iterative
  clip: {{eps_low: 0.2, eps_high: 0.28, c: 10.0}}
  val: {{n: 2, every: 50, temperature: 1.0, top_p: 1.0}}
  rollout: {{temperature: 1.0, top_p: 1.0, engine: hf}}
  save_every: 2
  backend: local
  resources: {{nodes: 1, gpus_per_node: 0, cpus: 1}}
grid:
{grid}
"""


def write_sweep(root: Path, name: str, grid: str, save_every: int = 2) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(TINY.format(name=name, grid=grid).replace("save_every: 2", f"save_every: {save_every}"))
    return path


def snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def dry_run(*args: str):
    return CliRunner().invoke(app, ["slurm", *args, "--dry-run"])


# --------------------------------------------------------------------------------- always runs


def test_dry_run_of_a_tiny_cpu_grid_is_exact_and_writes_nothing(no_slurm_here):
    work = no_slurm_here
    spec = write_sweep(work, "tiny", "  algorithm: [grpo]\nseeds: [0, 1]")
    before = snapshot(work)
    result = dry_run(str(spec))
    assert result.exit_code == 0, result.output
    assert snapshot(work) == before
    slurm = work / "runs" / "tiny" / "slurm"
    directives = [line for line in result.stdout.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=rpg-tiny",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=2",  # two 1-CPU runs at once
        "#SBATCH --mem=10240M",  # 2 x 4096M + 2048M for Ray's head and the watcher
        f"#SBATCH --output={slurm}/slurm-%j.out",
        "#SBATCH --signal=B:USR1@600",
    ]
    assert "{{" not in result.stdout and "--num-cpus=2 --num-gpus=0" in result.stdout
    sweep_line = next(line for line in result.stdout.splitlines() if "-m rpg_cli sweep" in line)
    assert (
        f"exec {sys.executable} -m rpg_cli sweep {spec} --runs-dir {work / 'runs'} --db sqlite:///runs/results.db "
        '--address "$DASHBOARD")' in sweep_line
    )
    assert result.stderr.splitlines() == [
        "rpg slurm: 2 runs; a run needs: local 1 node(s) x 0 GPU(s), 1 CPUs per node",
        "rpg slurm: allocation: 1 node(s) x 0 GPU(s), 2 CPUs and 10240M per node, time the partition default; "
        "2 run(s) at once (Ray queues the rest)",
        "rpg slurm: Slurm did not check it (sbatch is not on PATH here). Dry run: nothing was submitted.",
    ]
    check = subprocess.run(["/bin/bash", "-n"], input=result.stdout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_dry_run_of_the_qwen3_grid_on_two_8_gpu_nodes(no_slurm_here):
    shutil.copytree(REPO / "experiments", no_slurm_here / "experiments")
    result = dry_run("experiments/paper-qwen3-4b.yaml", "--nodes", "2", "--time", "2-00:00:00", "-p", "gpu")
    assert result.exit_code == 0, result.output
    directives = [line for line in result.stdout.splitlines() if line.startswith("#SBATCH")]
    for expected in (
        "--nodes=2",
        "--cpus-per-task=35",  # 3 per GPU + 11
        "--gpus-per-node=8",
        "--mem=0",  # a verl run takes the whole node
        "--time=2-00:00:00",
        "--partition=gpu",
    ):
        assert f"#SBATCH {expected}" in directives
    assert "--cpus-per-task=35 --gpus-per-node=8 bash" in result.stdout  # the workers' srun
    assert "2 run(s) at once" in result.stderr and "20 runs; a run needs: verl 1 node(s) x 8 GPU(s)" in result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpus-per-node", "4"], "needs 8 GPUs per node; ask for --gpus-per-node 8"),
        (["--cpus-per-node", "32"], "needs 35 CPUs per node"),
        (["--time", "90 minutes"], "is not a Slurm time"),
        (["--time", "2"], "leaves no time to run"),
        (["--mem", "lots"], "is not a Slurm size"),
        (["--sbatch-arg", "--qos=high\n#SBATCH --x"], "a line break cannot go into an #SBATCH line"),
        (["--sbatch-arg", "qos=high"], "is not an sbatch option"),
    ],
)
def test_a_request_no_run_could_start_in_is_refused_with_one_line(no_slurm_here, args, says):
    shutil.copytree(REPO / "experiments", no_slurm_here / "experiments")
    result = dry_run("experiments/paper-qwen3-4b.yaml", *args)
    assert result.exit_code == 2
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""


def test_requeue_and_grace_go_into_the_script(no_slurm_here):
    work = no_slurm_here
    spec = write_sweep(work, "tiny", "  algorithm: [grpo]")
    result = dry_run(str(spec), "--requeue", "--grace", "300", "--time", "1:00:00")
    assert result.exit_code == 0, result.output
    directives = [line for line in result.stdout.splitlines() if line.startswith("#SBATCH")]
    assert directives[-4:] == [
        f"#SBATCH --output={work / 'runs' / 'tiny' / 'slurm'}/slurm-%j.out",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",  # the requeued job's output goes on in the same file
    ]
    trap = result.stdout.split("on_signal() {")[1].split("\n}\n")[0]
    assert (
        f"{sys.executable} -m rpg_cli.orchestration.slurm_nodes preempt tiny --runs-dir {work / 'runs'} --db "
        'sqlite:///runs/results.db --grace 300 "$1" --address "$DASHBOARD"' in trap
    )
    assert 'if [ "$1" = USR1 ] && [ 1 = 1 ]; then' in trap and 'scontrol requeue "$SLURM_JOB_ID"' in trap
    plain = dry_run(str(spec))
    assert "#SBATCH --requeue" not in plain.stdout and 'if [ "$1" = USR1 ] && [ 0 = 1 ]; then' in plain.stdout
    for args, says in (
        (["--grace", "30"], "--grace 30 s: give 31 to 65535"),
        (["--grace", "300", "--time", "5"], "--time 5 leaves no time to run: the runs are stopped 300 s before"),
    ):
        refused = dry_run(str(spec), *args)
        assert refused.exit_code == 2 and says in refused.stderr, refused.stderr


def test_the_time_a_signal_leaves_the_runs(tmp_path, monkeypatch):
    """USR1: the job's time left as squeue says (at most --grace); TERM: KillWait; 30 s of either stop Ray."""
    from rpg_cli.orchestration.slurm_nodes import stop_budget

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    def slurm_says(squeue: str, kill_wait: str) -> None:
        (bin_dir / "squeue").write_text(f"#!/bin/sh\necho '{squeue}'\n")
        (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho 'KillWait                = {kill_wait} sec'\n")
        for name in ("squeue", "scontrol"):
            (bin_dir / name).chmod(0o755)

    slurm_says("4:10", "45")
    assert stop_budget("USR1", 600, "7") == 250 - 30  # 4 min 10 s left
    assert stop_budget("TERM", 600, "7") == 45 - 30
    slurm_says("1:00:00", "10")
    assert stop_budget("USR1", 600, "7") == 600 - 30  # the signal came early (scancel --signal): --grace bounds it
    assert stop_budget("TERM", 600, "7") == 0  # KillWait 10 s: Ray's stop takes all of it
    slurm_says("UNLIMITED", "30")
    assert stop_budget("USR1", 120, "7") == 90


def test_time_limits_in_every_form_sbatch_takes():
    from rpg_cli.orchestration.slurm import time_seconds

    assert [time_seconds(t) for t in ("30", "30:15", "2:00:00", "1-0", "1-02:30", "1-02:30:05", "0")] == [
        1800,
        1815,
        7200,
        86400,
        86400 + 2 * 3600 + 1800,
        86400 + 2 * 3600 + 1800 + 5,
        0,
    ]
    assert time_seconds("2h") is None and time_seconds("1:2:3:4") is None


def test_cancel_also_cancels_the_sweeps_slurm_job(no_slurm_here):
    work = no_slurm_here
    calls = work / "scancel.calls"
    for name, body in (("squeue", "echo RUNNING"), ("scancel", f'echo "$@" >> {calls}')):
        (work / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (work / "bin" / name).chmod(0o755)
    slurm = work / "runs" / "tiny" / "slurm"
    slurm.mkdir(parents=True, mode=0o700)
    (slurm / "job_id").write_text("4242\n")
    (slurm / "job_id").chmod(0o600)
    result = CliRunner().invoke(app, ["cancel", "tiny", "--db", str(work / "results.db")])
    assert result.exit_code == 0, result.output
    assert "cancelled Slurm job 4242 (running)" in result.stdout
    assert calls.read_text().split() == ["4242"]
    # a run's name, or a path, is no sweep's: no job is looked for
    result = CliRunner().invoke(app, ["cancel", "../tiny", "--db", str(work / "results.db")])
    assert result.exit_code == 2 and calls.read_text().split() == ["4242"]


# ------------------------------------------------------------------------------ a real Slurm cluster


def _free_ports(n: int) -> list[int]:
    from rpg_cli.orchestration.head import _free_ports

    return _free_ports(n)


def _install_slurm() -> str | None:
    """None when Slurm's daemons and commands are here (installed now if root can), else why not."""
    if all(shutil.which(p, path="/usr/sbin:/usr/bin:/sbin:/bin") for p in SLURM_PROGRAMS):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "Slurm is not installed, and only root with apt-get can install it (apt-get install slurmctld slurmd munge slurm-client)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", *SLURM_PACKAGES],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if done.returncode != 0:
        return f"apt-get install {' '.join(SLURM_PACKAGES)} failed: {done.stderr.strip().splitlines()[-1:]}"
    return None


def _wait_for(condition, timeout_s: float, what: str, step_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A one-node Slurm cluster on 127.0.0.1, configured and run from a temp dir (munged, slurmctld,
    slurmd as root, each stopped by its pid at the end); yields the environment its commands need."""
    why = _install_slurm()
    if why:
        pytest.skip(why)
    if os.geteuid() != 0:
        pytest.skip("slurmd runs jobs as their users, so it must run as root; this test is not root")
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    node = socket.gethostname().split(".")[0]
    ctld_port, d_port = _free_ports(2)
    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 1024
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=rpgtest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
# cred_expire: a requeued job waits this long before it starts again (slurm.conf(5); default 120 s)
AuthInfo=socket={root}/munge.sock,cred_expire=30
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
# no cgroups in a container: processes are tracked by their parents
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
CommunicationParameters=NoInAddrAny
SlurmdParameters=config_overrides
KillWait=10
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons: list[subprocess.Popen] = []

    def start(*argv: str, log: str) -> None:
        with open(root / log, "w") as out:
            daemons.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env))

    try:
        start(
            "munged",
            "--foreground",
            "--force",  # as root
            f"--socket={root}/munge.sock",
            f"--key-file={key}",
            f"--log-file={root}/munged.log",
            f"--pid-file={root}/munged.pid",
            f"--seed-file={root}/munged.seed",
            log="munged.out",
        )
        _wait_for(lambda: (root / "munge.sock").exists(), 30, "munged's socket")
        start("slurmctld", "-D", "-i", "-f", str(conf), log="slurmctld.out")
        start("slurmd", "-D", "-f", str(conf), "-N", node, log="slurmd.out")

        def idle() -> bool:
            done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env)
            return done.stdout.strip() == "idle"

        _wait_for(idle, 60, "the node to be idle in sinfo")
        yield env
    finally:
        subprocess.run(["scancel", "--full", "--partition=debug"], capture_output=True, env=env)
        for daemon in reversed(daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    """The toy task, as `rpg prepare-data --toy` writes it, once for the module (its warm-up takes a while)."""
    data = tmp_path_factory.mktemp("toy") / "data"
    result = CliRunner().invoke(app, ["prepare-data", "--toy", "--out", str(data)])
    assert result.exit_code == 0, result.output
    return data


@pytest.fixture
def toy_workdir(tmp_path, toy_data):
    """A working directory with the toy task under data/toy/ (a copy: each test's own)."""
    shutil.copytree(toy_data, tmp_path / "data")
    return tmp_path


def rpg(*args: str, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rpg_cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def job_id_of(result: subprocess.CompletedProcess) -> str:
    found = re.search(r"submitted Slurm job (\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    return found.group(1)


def ray_processes(job_id: str) -> list[int]:
    """Processes whose environment marks them as Ray of this Slurm job (the script's RPG_SLURM_RAY)."""
    marker = f"RPG_SLURM_RAY={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def assert_job_gone(job_id: str, work: Path, sweep: str, env: dict) -> None:
    """The job left Slurm's queue, and its Ray with it: no process, no temp dir, no token."""

    def left_queue() -> bool:
        done = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, env=env)
        return not done.stdout.strip()

    _wait_for(left_queue, 60, f"Slurm job {job_id} to leave the queue")
    _wait_for(lambda: not ray_processes(job_id), 30, f"job {job_id}'s Ray processes to end")
    assert not Path(f"/tmp/rpg-ray-{os.geteuid()}-{job_id}").exists()
    assert not (work / "runs" / sweep / "slurm" / "ray" / job_id).exists()


def store_runs(work: Path, sweep: str) -> dict[int, tuple]:
    """The sweep's runs in the store by their number of steps: (record, the steps it has metrics for)."""
    from rpg_cli.store import open_store

    store = open_store(f"sqlite:///{work}/runs/results.db", create=False)
    try:
        return {r.spec["steps"]: (r, sorted(store.run_history(r.id)[0])) for r in store.runs(sweep=sweep)}
    finally:
        store.close()


@pytest.mark.cluster
def test_a_sweep_runs_through_slurm_and_a_second_submission_does_nothing(slurm_cluster, toy_workdir):
    work, env = toy_workdir, slurm_cluster
    write_sweep(work, "through", "  steps: [2, 3]")
    first = rpg("slurm", "through.yaml", "--wait", cwd=work, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    job_id = job_id_of(first)
    output = (work / "runs" / "through" / "slurm" / f"slurm-{job_id}.out").read_text()
    assert "rpg slurm: Ray is up on 1 node(s)" in output and "rpg slurm: Ray stopped on 1 node(s)" in output
    assert "connecting to http://127.0.0.1:" in output  # the job's own head, its dashboard on loopback
    runs = store_runs(work, "through")
    assert {n: (r.status, r.attempts, steps) for n, (r, steps) in runs.items()} == {
        2: ("succeeded", 1, [0, 1, 2]),  # step 0: the validation before training
        3: ("succeeded", 1, [0, 1, 2, 3]),
    }
    assert_job_gone(job_id, work, "through", env)

    second = rpg("slurm", "through.yaml", "--wait", cwd=work, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nothing to run: 2 of 2 runs of through succeeded" in second.stdout
    assert (work / "runs" / "through" / "slurm" / "job_id").read_text().strip() == job_id  # no new job
    again = store_runs(work, "through")
    assert {n: (r.attempts, r.finished_at) for n, (r, _) in again.items()} == {
        n: (r.attempts, r.finished_at) for n, (r, _) in runs.items()
    }


@pytest.mark.cluster
def test_a_cancelled_allocation_loses_nothing_and_resubmitting_continues_it(slurm_cluster, toy_workdir):
    work, env = toy_workdir, slurm_cluster
    write_sweep(work, "cancelled", "  steps: [2, 1000]", save_every=50)  # a toy step takes ~15 ms
    first = rpg("slurm", "cancelled.yaml", cwd=work, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    job_id = job_id_of(first)

    def logged_steps(path: Path) -> list[int]:
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line)["step"] for line in lines[:-1] if '"step"' in line]  # the last may be torn

    def short_done_long_saved() -> bool:
        try:
            runs = store_runs(work, "cancelled")
        except Exception:  # no store yet
            return False
        if set(runs) != {2, 1000}:
            return False
        (short, _), (long, ingested) = runs[2], runs[1000]
        # the store ingests on the sweep's poll, behind the file: cancel once it holds the first checkpoint's steps
        return (
            short.status == "succeeded"
            and max(ingested, default=0) >= 100 <= max(logged_steps(long.metrics_path), default=0) - 20
        )

    _wait_for(short_done_long_saved, 240, "the short run to succeed and the long one to save a checkpoint", 1)
    subprocess.run(["scancel", job_id], env=env, check=True, timeout=60)
    assert_job_gone(job_id, work, "cancelled", env)
    cut = store_runs(work, "cancelled")
    (short, _), (long, steps_before) = cut[2], cut[1000]
    # live, or preempted where it saw Slurm's TERM and saved its step: the next submission resumes it
    assert long.status in ("running", "submitted", "preempted"), long.error
    assert 100 <= steps_before[-1] < 1000

    second = rpg("slurm", "cancelled.yaml", "--wait", cwd=work, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert job_id_of(second) != job_id
    after = store_runs(work, "cancelled")
    (short_after, _), (long_after, steps) = after[2], after[1000]
    assert (short_after.status, short_after.attempts, short_after.finished_at) == ("succeeded", 1, short.finished_at)
    assert (long_after.status, long_after.attempts) == ("succeeded", 2)
    assert steps == list(range(1001))  # every step, none lost (0: the validation before training)
    restarts = [json.loads(line) for line in long_after.metrics_path.read_text().splitlines() if '"restart"' in line]
    assert len(restarts) == 1 and restarts[0]["restart"]["keep_through"] >= 100  # resumed from its checkpoint


@pytest.mark.cluster
def test_usr1_lets_the_runs_save_their_step_and_requeue_continues_the_sweep(slurm_cluster, toy_workdir):
    """`rpg slurm --requeue`; USR1 to the batch script at a known step (as Slurm sends it --grace s before the time
    limit): the long run finishes the step it is in, saves it (save_every is far: only the stop saves) and is
    recorded preempted, and Ray stops; the job requeues itself (Slurm holds it for cred_expire, 30 s here: the
    moment to look), starts again, and its `rpg sweep` resumes the run after that step: every step once."""
    from rpg_cli import rundir
    from rpg_cli.orchestration.cancel import attempt_step
    from rpg_cli.store.ingest import stopped_at_end

    work, env = toy_workdir, slurm_cluster
    spec = write_sweep(work, "preempt", "  steps: [2, 1500]", save_every=1500)  # ~25 s of toy steps
    spec.write_text(spec.read_text().replace("every: 50", "every: 1500"))  # validation at 0 and the end only
    sweep = subprocess.Popen(
        [sys.executable, "-m", "rpg_cli", "slurm", "preempt.yaml", "--requeue", "--wait"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job_file = work / "runs" / "preempt" / "slurm" / "job_id"
        job_id = _wait_for(lambda: job_file.exists() and job_file.read_text().strip(), 120, "the job's id")

        def long_in_training() -> Path | None:
            try:
                runs = store_runs(work, "preempt")
            except Exception:  # no store yet
                return None
            if set(runs) != {2, 1500} or runs[2][0].status != "succeeded":
                return None
            path = runs[1500][0].metrics_path
            return path if (attempt_step(path) or 0) >= 20 else None

        metrics = _wait_for(long_in_training, 300, "the short run to succeed and the long one to train", 0.5)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True, timeout=60)

        def requeued() -> bool:
            done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, env=env)
            return done.stdout.strip() == "PENDING"

        _wait_for(requeued, 120, f"job {job_id} to requeue itself")
        cut = store_runs(work, "preempt")
        (short, _), (long, steps) = cut[2], cut[1500]
        stopped = stopped_at_end(metrics)
        assert stopped is not None and stopped.why == rundir.PREEMPTED, metrics.read_text()[-300:]
        at = stopped.step
        assert long.status == "preempted" and f"at step {at}" in long.error, long.error
        assert 20 <= at < 1500 and at in rundir.find_checkpoints(long.run_dir)  # the stop saved it
        assert steps == list(range(at + 1))
        assert not ray_processes(job_id) and not Path(f"/tmp/rpg-ray-{os.geteuid()}-{job_id}").exists()
        output = (work / "runs" / "preempt" / "slurm" / f"slurm-{job_id}.out").read_text()
        assert f"rpg slurm: {long.name} stopped at step {at}, its checkpoint saved (preempted)" in output
        assert "rpg slurm: Ray stopped on 1 node(s)" in output and f"requeueing job {job_id} (--requeue)" in output

        out, err = sweep.communicate(timeout=420)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            subprocess.run(["scancel", job_id], env=env, timeout=60)
    assert sweep.returncode == 0, out + err
    assert f"Slurm job {job_id} ended (exit 0)" in out
    output = (work / "runs" / "preempt" / "slurm" / f"slurm-{job_id}.out").read_text()
    assert f"rpg slurm: job {job_id} starts again (requeued 1 time(s))" in output
    assert output.index("requeueing job") < output.index("starts again")  # one file, both allocations
    assert_job_gone(job_id, work, "preempt", env)
    after = store_runs(work, "preempt")
    (short_after, _), (long_after, steps) = after[2], after[1500]
    assert (short_after.status, short_after.attempts, short_after.finished_at) == ("succeeded", 1, short.finished_at)
    assert (long_after.status, long_after.attempts) == ("succeeded", 2)
    assert steps == list(range(1501))  # every step once (0: the validation before training)
    lines = [json.loads(line) for line in long_after.metrics_path.read_text().splitlines()]
    assert [x["restart"] for x in lines if "restart" in x] == [{"keep_through": at}]  # resumed after its step
