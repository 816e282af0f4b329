"""`rpg slurm --nodes 2` end to end on one machine: a Slurm cluster of two nodes, each a network namespace
(tests/netns.py) with a slurmd of its own (one slurmd per namespace, its own address and spool dir), one
slurmctld beside the first, one munged for both. The sbatch script finds the head by its node's name,
starts Ray's head on the first node and the worker on the second with `srun`; the toy sweep's runs are
placed on both nodes, succeed, and Ray is gone from both afterwards. Everything is started and ended
by pid; the namespaces are removed at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("ray.job_submission", reason="the Ray tests need ray[default]")
pytest.importorskip("psutil")

from netns import Pair, end_group, in_namespace, namespace_pair, quick_toy, start_group, wait_for  # noqa: E402
from test_slurm import _install_slurm, job_id_of, ray_processes, write_sweep  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

HEAD, WORKER = 0, 1
NODES = ("node1", "node2")  # Slurm's node names; inside the namespaces they resolve to each one's address
PORTS = (6817, 6818)  # slurmctld's, slurmd's: each namespace has every port free


def slurm_conf(root: Path, pair: Pair) -> str:
    """Two nodes at the namespaces' addresses, the controller on the first; the job ids start where no
    other test's cluster on this machine has its own (Ray's files and processes are marked by job id)."""
    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 1024
    nodes = "\n".join(
        f"NodeName={name} NodeAddr={addr} CPUs={os.cpu_count()} RealMemory={mem_mb} State=UNKNOWN"
        for name, addr in zip(NODES, pair.addrs)
    )
    return f"""ClusterName=rpgtwo
SlurmctldHost={socket.gethostname().split(".")[0]}({pair.addrs[HEAD]})
SlurmctldPort={PORTS[0]}
SlurmdPort={PORTS[1]}
FirstJobId={1_000_000 + os.getpid() % 1_000_000}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
# no cgroups in a container: processes are tracked by their parents
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
KillWait=10
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """The two-node cluster; `run` runs a command on the first node (in its namespace)."""

    def __init__(self, pair: Pair, root: Path, env: dict[str, str]):
        self.pair, self.root, self.env = pair, root, env

    def run(self, argv: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.pair.inside(HEAD, argv), cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def logs(self) -> str:
        return "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.root.glob("*.log")))


@pytest.fixture(scope="module")
def slurm_two_nodes(tmp_path_factory):
    """munged (on the machine: its socket is a file), slurmctld and node1's slurmd in the first namespace,
    node2's slurmd in the second, each stopped by its process group at the end."""
    if why := _install_slurm():
        pytest.skip(why)
    with namespace_pair(NODES) as pair:
        if isinstance(pair, str):
            pytest.skip(pair)
        root = tmp_path_factory.mktemp("slurm2")
        for sub in ("state", *(f"spool-{n}" for n in NODES)):
            (root / sub).mkdir()
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        conf = root / "slurm.conf"
        conf.write_text(slurm_conf(root, pair))
        env = {**os.environ, "SLURM_CONF": str(conf)}
        daemons: list[int] = []
        try:
            munged = [
                "munged", "--foreground", "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
                f"--log-file={root}/munged.log", f"--pid-file={root}/munged.pid", f"--seed-file={root}/munged.seed",
            ]  # fmt: skip
            daemons.append(start_group(munged, root / "munged.out", env).pid)
            wait_for(lambda: (root / "munge.sock").exists(), 30, "munged's socket")
            ctld = ["slurmctld", "-D", "-i", "-f", str(conf)]
            daemons.append(start_group(pair.inside(HEAD, ctld), root / "slurmctld.out", env).pid)
            for i, node in enumerate(NODES):
                slurmd = ["slurmd", "-D", "-f", str(conf), "-N", node]
                daemons.append(start_group(pair.inside(i, slurmd), root / f"slurmd-{node}.out", env).pid)
            cluster = SlurmCluster(pair, root, env)

            def idle() -> bool:
                states = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], root).stdout.split()
                return states == [NODES[0], "idle", NODES[1], "idle"]

            wait_for(idle, 60, "both nodes to be idle in sinfo")
            yield cluster
        finally:
            if daemons[1:]:
                subprocess.run(pair.inside(HEAD, ["scancel", "--full", "--partition=debug"]), env=env, timeout=30)
            for pgid in reversed(daemons):
                end_group(pgid, str(root), grace_s=20)


class Trainers(threading.Thread):
    """Watches the machine's processes while a sweep runs: in which namespaces the toy runs' trainers lived."""

    def __init__(self, pair: Pair, work: Path):
        super().__init__(daemon=True)
        self.pair, self.work, self.seen, self.done = pair, str(work), set(), threading.Event()

    def run(self) -> None:
        import psutil

        while not self.done.wait(0.1):
            for p in psutil.process_iter(["cmdline"]):
                line = " ".join(p.info["cmdline"] or ())
                if "rpg_cli.backends.local" in line and self.work in line:
                    self.seen.update(i for i in (HEAD, WORKER) if in_namespace(p.pid, self.pair, i))


def test_a_sweep_runs_on_two_slurm_nodes_and_leaves_no_ray_behind(slurm_two_nodes, tmp_path):
    cluster, work = slurm_two_nodes, tmp_path
    quick_toy(work / "data" / "toy")
    write_sweep(work, "twonodes", "  steps: [2, 3]")
    watch = Trainers(cluster.pair, work)
    watch.start()
    try:
        argv = [sys.executable, "-m", "rpg_cli", "slurm", "twonodes.yaml", "--nodes", "2", "--wait"]
        done = cluster.run(argv, work, timeout=400)
    finally:
        watch.done.set()
        watch.join()
    job_id = job_id_of(done)
    out = work / "runs" / "twonodes" / "slurm" / f"slurm-{job_id}.out"
    said = out.read_text() if out.exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + said + cluster.logs()
    assert "#SBATCH --nodes=2" in (work / "runs" / "twonodes" / "slurm" / "sweep.sbatch").read_text()
    # the head at the address node1's name resolves to (in the namespaces' hosts files only), the worker joined it
    assert f"ray start --address='{cluster.pair.addrs[HEAD]}:" in said, said
    assert "rpg slurm: Ray is up on 2 node(s)" in said and "rpg slurm: Ray stopped on 2 node(s)" in said, said
    assert WORKER in watch.seen, f"no run was placed on {NODES[1]}: {watch.seen}"  # the srun-started worker ran one

    from rpg_cli.store import open_store

    store = open_store(f"sqlite:///{work}/runs/results.db", create=False)
    try:
        runs = {r.spec["steps"]: (r.status, sorted(store.run_history(r.id)[0])) for r in store.runs(sweep="twonodes")}
    finally:
        store.close()
    assert runs == {2: ("succeeded", [0, 1, 2]), 3: ("succeeded", [0, 1, 2, 3])}

    # Ray is gone from both nodes: no process of the job's, no temp dir, no token
    def left_queue() -> bool:
        return not cluster.run(["squeue", "-h", "-j", job_id], work).stdout.strip()

    wait_for(left_queue, 60, f"Slurm job {job_id} to leave the queue")
    wait_for(lambda: not ray_processes(job_id), 30, f"job {job_id}'s Ray processes to end")
    assert not Path(f"/tmp/rpg-ray-{os.geteuid()}-{job_id}").exists()
    assert not (work / "runs" / "twonodes" / "slurm" / "ray" / job_id).exists()
