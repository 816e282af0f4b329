"""The end-to-end loop's fixtures: a Ray head on 127.0.0.1 that declares one GPU, the toy task, and the sweep.

Run by `make e2e` in its own environment (.venv-e2e: verl 0.9.1, vLLM's CPU build, PyPI's torch); never
skipped there. `make test` leaves this directory out (pyproject.toml's norecursedirs).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

E2E = Path(__file__).parent
BIN = Path(sys.executable).parent  # the e2e environment's `rpg`, `ray` and `python`
# vLLM's CPU build: 1 GiB of KV cache, no core pinning (2 cores shared with FSDP), one thread per process;
# for the training jobs (through the spec's verl.env) and `rpg eval`'s job (through the head's environment)
VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
# verl's settings for one CPU "GPU": the rest of its defaults size a GPU node (8 reward and agent-loop
# workers, 8 transfer-queue storage actors, flash-attention, CUDA graphs, sleep mode)
SITE = [
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "+actor_rollout_ref.rollout.enable_sleep_mode=false",
    "actor_rollout_ref.rollout.free_cache_engine=false",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "data.dataloader_num_workers=0",  # 8 forked loader processes per run, for 18 problems
]
STAND_INS = {
    "PYTHONPATH": str(E2E),
    "VERL_USE_EXTERNAL_MODULES": "stand_ins",  # rpg appends its plugin
    "VERL_ENGINE_DEVICE": "cuda",
    **VLLM_CPU_ENV,
}


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


# The head's token (Ray's token authentication, as a secured cluster runs it): every client here sends it. Its own
# file, so that ~/.ray/auth_token, whose mere presence switches Ray's authentication on, decides nothing.
TOKEN_FILE = Path(tempfile.mkdtemp(prefix="rpge2etoken")) / "auth_token"


def environment(**extra: str) -> dict[str, str]:
    """This process's environment with the e2e environment's programs first, the head's token, and no ambient
    cluster or store."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RPG_DB", "RAY_AUTH_TOKEN")}
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(TOKEN_FILE)}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", **auth, **extra}


@pytest.fixture(scope="session")
def run_rpg(workdir):
    """`rpg ARGS...` of the e2e environment, in the work directory; its CompletedProcess."""

    def run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "rpg"), *args], cwd=workdir, env=environment(), capture_output=True, text=True, timeout=timeout
        )

    return run


@pytest.fixture(scope="session")
def ray_head():
    """`ray start --head --block` in a process group of its own, on 127.0.0.1, with 16 CPUs and one GPU that
    nobody has (verl places its workers in {CPU, GPU: 1} bundles); its jobs inherit the vLLM CPU settings.
    Stopped at the end by its process group and its temp dir (the workers and drivers Ray started)."""
    import psutil

    temp = Path(tempfile.mkdtemp(prefix="rpge2e"))  # short: Ray's socket paths have a length limit
    TOKEN_FILE.write_text(secrets.token_hex(32))
    TOKEN_FILE.chmod(0o600)
    gcs, dashboard, client, agent_http, agent_grpc, metrics, runtime_env = free_ports(7)
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
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
            f"--temp-dir={temp}",
            "--num-cpus=16",
            "--num-gpus=1",
            "--disable-usage-stats",
        ],
        env=environment(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", **VLLM_CPU_ENV),
        stdout=open(temp / "head.log", "w"),  # noqa: SIM115 (closed with the process)
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError):
                request = urllib.request.Request(
                    f"{address}/api/version", headers={"Authorization": f"Bearer {TOKEN_FILE.read_text()}"}
                )
                urllib.request.urlopen(request, timeout=2).read()
                break
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not start:\n{(temp / 'head.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield address
    finally:
        mine = [head.pid]
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.pid != head.pid and (os.getpgid(proc.pid) == head.pid or str(temp) in " ".join(proc.cmdline())):
                    mine.append(proc.pid)
        for pid in mine:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        head.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(TOKEN_FILE.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    """A directory with the toy task (`rpg prepare-data --toy`) and two sweep files of tiny verl cells on the toy
    model, rolled out by vLLM's CPU build. `e2e.yaml`:

    - rpg_reinforce: RPG-REINFORCE, the reference reset every 3 steps, 5 steps with checkpoints at 2 and 4; its
      job kills itself right after the checkpoint of step 4 (once), to be resumed;
    - grpo: GRPO as published (frozen reference, clamped k3);
    - dapo: DAPO (dynamic sampling and overlong shaping).

    `control.yaml`: RPG-REINFORCE whose vLLM never takes the trained weights (the control of the sync check).
    """
    root = tmp_path_factory.mktemp("e2e")
    done = subprocess.run(
        [str(BIN / "rpg"), "prepare-data", "--toy"], cwd=root, env=environment(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    toy = root / "data" / "toy"
    base = {
        "optimizer": "adamw",
        "context": {"prompt": 8, "response": 16},  # the toy model has 32 positions
        "model": str(toy / "model"),
        "data": {"train_files": [str(toy / "train.parquet")], "val_files": [str(toy / "val.parquet")]},
        "train_batch_size": 4,
        "rollout_n": 4,
        "ppo_mini_batch_size": 2,
        "lr": 1.0e-3,
        "steps": 2,
        "save_every": 2,
        "seed": 0,
        "val": {"n": 2, "every": 2},
        "backend": "verl",
        "resources": {"nodes": 1, "gpus_per_node": 1, "cpus": 1},
        "verl": {"site": SITE, "env": STAND_INS},
    }
    rpg = {"algorithm": "rpg_reinforce", "kl": "urkl", "beta": 0.05, "clip": {"eps_low": 0.2, "eps_high": 0.28}}
    sweep = {
        "name": "e2e",
        "base": base,
        "grid": {"algorithm": ["rpg_reinforce", "grpo", "dapo"]},
        "include": [
            {
                **rpg,
                "reference": {"every": 3},
                "steps": 5,
                "verl": {"site": SITE, "env": {**STAND_INS, "RPG_E2E_KILL_AFTER_CHECKPOINT": "4"}},
            },
            {"algorithm": "grpo", "beta": 1.0e-3, "clip": {"eps_low": 0.2, "eps_high": 0.2}, "reference": "frozen"},
            {"algorithm": "dapo", "beta": 0.0, "clip": {"eps_low": 0.2, "eps_high": 0.28}, "overlong": {"buffer": 8}},
        ],
    }
    control = {
        "name": "e2e-control",
        "base": {
            **base,
            **rpg,
            "steps": 4,
            "data": {"train_files": [str(toy / "train.parquet")]},  # no validation
            "verl": {"site": SITE, "env": {**STAND_INS, "RPG_E2E_SKIP_WEIGHT_SYNC": "1"}},
        },
    }
    for name, content in (("e2e.yaml", sweep), ("control.yaml", control)):
        (root / name).write_text(yaml.safe_dump(content, sort_keys=False))
    return root
