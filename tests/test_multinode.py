"""A Ray cluster of two nodes on one machine: a head in one network namespace and a worker in another
(tests/netns.py), joined over a veth pair on private addresses, with Ray's token authentication as
rpg's own head uses it. The head offers no CPU, so every job lands on the worker. `rpg sweep --address`
runs inside the head's namespace, as a user on the head node would: its toy runs are placed on the
worker and write into the shared runs/ (the filesystem is shared, as NFS is on a cluster). The worker
node dies mid-run (every process of it killed at once, at a known step): the run fails with a reason,
and once a new worker has joined, the same sweep with --retry-failed resumes it from its checkpoint.
One cluster serves the module; everything it started is ended by pid, and the namespaces removed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.job_submission", reason="the Ray tests need ray[default]")
pytest.importorskip("psutil")

from netns import (  # noqa: E402
    Pair,
    end_group,
    group_family,
    in_namespace,
    namespace_pair,
    quick_toy,
    start_group,
    wait_for,
)
from test_slurm import store_runs, write_sweep  # noqa: E402

from rpg_cli.orchestration.head import ray_start_command  # noqa: E402
from rpg_cli.orchestration.submit import lost_node  # noqa: E402

pytestmark = pytest.mark.slow

HEAD, WORKER = 0, 1
# What the nodes and rpg must not inherit from the caller: another cluster, another token, a proxy
# (requests would send the head's private address through it).
DROPPED = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")
PROXIES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
# The head declares a node dead after 3 missed health checks 0.5 s apart (Ray's default: 5 x 3 s)
FAST_DEATH = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
              "RAY_health_check_failure_threshold": "3"}  # fmt: skip
# Ray's record of the cluster, asked from inside the head's namespace: each job's node, each node's address
CLUSTER_RECORD = textwrap.dedent(
    """
    import json, sys
    from ray.util.state import list_nodes
    from rpg_cli.orchestration.head import connect

    url = sys.argv[1]
    jobs = {j.submission_id: {"node": j.driver_node_id, "agent": j.driver_agent_http_address,
            "status": str(j.status), "message": j.message} for j in connect(url).list_jobs() if j.submission_id}
    nodes = {n.node_id: {"ip": n.node_ip, "head": n.is_head_node, "state": n.state} for n in list_nodes(address=url)}
    print(json.dumps({"jobs": jobs, "nodes": nodes}))
    """
)
# Until Ray lists COUNT live nodes. Not by a state filter: Ray 2.60's list_nodes(filters=[("state", "=",
# "ALIVE")]) raises "data truncation" while a dead node is on record (it counts the nodes before filtering).
WAIT_NODES = textwrap.dedent(
    """
    import sys, time
    from ray.util.state import list_nodes

    url, count, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if sum(n.state == "ALIVE" for n in list_nodes(address=url, timeout=10)) >= count:
                sys.exit(0)
        except Exception:  # the dashboard is not up yet
            pass
        time.sleep(0.5)
    sys.exit(f"Ray did not list {count} live nodes within 120 s")
    """
)


@dataclass
class Cluster:
    """The two-node Ray cluster of the module and how to reach it from inside the head's namespace."""

    pair: Pair
    root: Path  # Ray's files of both nodes, the token, the daemons' logs
    env: dict[str, str]  # what every Ray process and rpg run with (the token's path, rpg's python first)
    dashboard: str
    gcs: str
    head_pgid: int
    worker_pgid: int | None = None
    workers_started: int = 0

    def inside_head(self, argv: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.pair.inside(HEAD, argv), cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def rpg(self, *args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
        """The real `rpg`, run on the head node (in its namespace)."""
        return self.inside_head([sys.executable, "-m", "rpg_cli", *args], cwd, timeout)

    def wait_nodes(self, count: int) -> None:
        """Until Ray lists `count` live nodes."""
        done = self.inside_head([sys.executable, "-c", WAIT_NODES, self.dashboard, str(count)], self.root)
        assert done.returncode == 0, done.stderr[-2000:] + self.logs()

    def record(self) -> dict:
        """Ray's own record: {"jobs": {submission id: node id, agent, status, message}, "nodes": {id: ip, head}}."""
        done = self.inside_head([sys.executable, "-c", CLUSTER_RECORD, self.dashboard], self.root, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    def start_worker(self) -> None:
        """A worker node in the second namespace, joined to the head; waits until Ray lists it."""
        self.workers_started += 1
        temp_dir = self.root / f"w{self.workers_started}"  # each node its own files (Ray: "per node")
        argv = [
            sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={self.gcs}",
            f"--node-ip-address={self.pair.addrs[WORKER]}", "--num-cpus=2", "--num-gpus=0",
            "--object-store-memory=100000000", f"--temp-dir={temp_dir}", "--disable-usage-stats",
        ]  # fmt: skip
        proc = start_group(self.pair.inside(WORKER, argv), self.root / f"{temp_dir.name}.log", self.env)
        self.worker_pgid = proc.pid
        assert proc.wait(timeout=180) == 0, self.logs()
        self.wait_nodes(2)

    def kill_worker(self) -> int:
        """The worker node dies: every process of it (raylet, agents, workers, the jobs' trainers) SIGKILLed
        at once, as when its machine goes down. Returns how many there were."""
        assert self.worker_pgid is not None
        killed, self.worker_pgid = end_group(self.worker_pgid, str(self.root), grace_s=0), None
        return killed

    def logs(self) -> str:
        return "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.root.glob("*.log")))


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED + PROXIES}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the jobs' `python` is rpg's
    return env


@contextlib.contextmanager
def two_node_cluster() -> Iterator[Cluster | str]:
    """Two namespaces, a Ray head in the first (no CPUs: jobs cannot run there) on its private address,
    a worker in the second; all ended by their process groups and the namespaces removed at the end.
    Yields a one-line reason instead where namespaces or a head cannot be made here."""
    with namespace_pair() as pair:
        if isinstance(pair, str):
            yield pair
            return
        root = Path(tempfile.mkdtemp(prefix="rpg-mn-"))  # short: Ray's Unix socket paths have a length limit
        root.chmod(0o700)
        token = root / "auth_token"
        token.write_text(os.urandom(32).hex())
        token.chmod(0o600)
        env = {**base_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "COLUMNS": "250"}
        cmd, gcs, dashboard = ray_start_command(root / "h")  # rpg's own head, on the namespace's address
        address = pair.addrs[HEAD]
        cmd = [a.replace("=127.0.0.1", f"={address}") for a in cmd]
        cmd += ["--num-cpus=0", "--num-gpus=0", "--object-store-memory=100000000"]
        head = start_group(pair.inside(HEAD, cmd), root / "head.log", {**env, **FAST_DEATH})
        found = Cluster(pair, root, env, f"http://{address}:{dashboard}", f"{address}:{gcs}", head.pid)
        try:
            if head.wait(timeout=180) != 0:
                yield f"no Ray head could start in a network namespace: {found.logs()[-300:]}"
                return
            found.wait_nodes(1)
            found.start_worker()
            yield found
        finally:
            for pgid in (found.worker_pgid, found.head_pgid):
                if pgid is not None:
                    end_group(pgid, str(root))
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    """The module's two-node cluster (`two_node_cluster`); skips in one line where it cannot be made."""
    with two_node_cluster() as found:
        if isinstance(found, str):
            pytest.skip(found)
        yield found


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory) -> Path:
    return quick_toy(tmp_path_factory.mktemp("toy") / "toy")


@pytest.fixture
def toy_workdir(tmp_path, toy_data) -> Path:
    """A working directory with the toy task under data/toy/, as `rpg prepare-data --toy` lays it out."""
    shutil.copytree(toy_data, tmp_path / "data" / "toy")
    return tmp_path


def logged_steps(path: Path) -> list[int]:
    """The steps metrics.jsonl holds whole (a line being written, or cut by a kill, is not counted)."""
    steps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return steps


def worker_node_id(record: dict, cluster: Cluster) -> str:
    alive = [n for n, v in record["nodes"].items() if v["ip"] == cluster.pair.addrs[WORKER] and v["state"] == "ALIVE"]
    assert len(alive) == 1, record["nodes"]
    return alive[0]


# ---------------------------------------------------------------------------------------------- tests

# What Ray 2.60 recorded as the message of a job whose worker node was killed (this module's second test)
NODE_DIED = (
    "Job supervisor actor died: The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: JobSupervisor\n\tactor_id: b5ca0d583f6d11119439406401000000\n\tpid: 26675\n"
    "\tname: _ray_internal_job_actor_aa760369\n\tnamespace: SUPERVISOR_ACTOR_RAY_NAMESPACE\n\tip: 10.231.0.2\n"
    "The actor died because its node has died. Node Id: 9047e9f86fd749eecc5feeefe08f2f91f5b8452bf975167c7bd82e17\n"
    "\tthe actor's node was terminated unexpectedly: health check failed due to missing too many heartbeats\n."
)


def test_a_job_whose_node_died_gets_one_line_naming_the_node():
    assert lost_node(SimpleNamespace(message=NODE_DIED)) == (
        "node 10.231.0.2 running the job died (Ray: terminated unexpectedly: health check failed due to missing "
        "too many heartbeats); once the cluster has a live node for it, `rpg sweep SPEC --retry-failed` resumes "
        "the run from its last checkpoint"
    )
    process_died = (
        "Job supervisor actor died: The actor died unexpectedly before finishing this task.\n\tclass_name: "
        "JobSupervisor\n\tip: 10.231.0.2\nThe actor is dead because its worker process has died. Worker exit type: "
        "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2."
    )
    assert lost_node(SimpleNamespace(message=process_died)) == (
        "the job's supervisor on node 10.231.0.2 died (Ray: worker exit SYSTEM_ERROR; the node itself may be gone); "
        "once the cluster has a live node for it, `rpg sweep SPEC --retry-failed` resumes the run from its last "
        "checkpoint"
    )
    others = ("Job entrypoint command failed with exit code 1", "Job supervisor actor died: killed by the OOM killer")
    assert [lost_node(SimpleNamespace(message=m)) for m in (*others, None)] == [None, None, None]


@pytest.mark.cluster
def test_jobs_run_on_the_worker_node_and_write_the_shared_runs_dir(cluster, toy_workdir):
    work = toy_workdir
    write_sweep(work, "twonode", "  steps: [2, 3]")
    done = cluster.rpg("sweep", "twonode.yaml", "--address", cluster.dashboard, cwd=work)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = store_runs(work, "twonode")
    assert {n: (r.status, r.attempts, steps) for n, (r, steps) in runs.items()} == {
        2: ("succeeded", 1, [0, 1, 2]),  # step 0: the validation before training
        3: ("succeeded", 1, [0, 1, 2, 3]),
    }
    record = cluster.record()
    worker = worker_node_id(record, cluster)
    for r, _ in runs.values():  # Ray's own record: each job's driver ran on the worker node, at its address
        job = record["jobs"][r.submission_id]
        assert job["node"] == worker and job["agent"].startswith(f"http://{cluster.pair.addrs[WORKER]}:"), job
        assert (r.run_dir / "checkpoints").is_dir() and (r.run_dir / "job.log").is_file()


@pytest.mark.cluster
def test_a_dead_worker_node_fails_its_run_with_a_reason_and_a_rerun_on_a_new_node_resumes_it(cluster, toy_workdir):
    work = toy_workdir
    write_sweep(work, "nodedeath", "  steps: [400]", save_every=50)  # a toy step takes ~15 ms
    argv = [sys.executable, "-m", "rpg_cli", "sweep", "nodedeath.yaml", "--address", cluster.dashboard]
    with open(work / "watcher.log", "w") as log:  # rpg sweep following the run, as a user would
        watcher = subprocess.Popen(
            cluster.pair.inside(HEAD, argv), cwd=work, env=cluster.env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        run_dir = wait_for(lambda: next((work / "runs" / "nodedeath").glob("*/spec.json"), None), 120, "the run").parent
        metrics, saved = run_dir / "metrics.jsonl", run_dir / "checkpoints" / "step_50"
        wait_for(lambda: saved.is_dir() and max(logged_steps(metrics), default=0) >= 60, 120, "step 60, saved at 50")
        trainers = [
            p.pid
            for p in group_family(cluster.worker_pgid, str(cluster.root))
            if "rpg_cli.backends.local" in " ".join(p.cmdline())
        ]
        assert trainers and all(in_namespace(pid, cluster.pair, WORKER) for pid in trainers)  # on the worker node
        assert cluster.kill_worker() > 3
        cut = max(logged_steps(metrics))
        assert cut < 400, "the run ended before its node was killed"
        watcher.wait(timeout=120)  # it follows the run to its end: the failure
    finally:
        if watcher.poll() is None:
            watcher.kill()
    (run, steps_before), = store_runs(work, "nodedeath").values()  # fmt: skip
    assert run.status == "failed", (run.status, (work / "watcher.log").read_text()[-3000:])
    said = cluster.record()["jobs"][run.submission_id]["message"]  # Ray's dozen lines
    assert run.error == lost_node(SimpleNamespace(message=said)), run.error  # rpg's one line
    # which Ray sees dead first, the node or the job's supervisor process on it, is Ray's own race: both name it
    assert f"node {cluster.pair.addrs[WORKER]}" in run.error and "\n" not in run.error, run.error
    assert steps_before and steps_before[-1] <= cut

    cluster.start_worker()  # a new node joins; the same sweep, told to retry, resumes the run
    again = cluster.rpg("sweep", "nodedeath.yaml", "--address", cluster.dashboard, "--retry-failed", cwd=work)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    (run, steps), = store_runs(work, "nodedeath").values()  # fmt: skip
    assert (run.status, run.attempts) == ("succeeded", 2), run.error
    assert steps == list(range(401))  # every step once, none lost
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if '"restart"' in line]
    assert len(lines) == 1 and 50 <= lines[0]["restart"]["keep_through"] <= cut, lines  # from its checkpoint
