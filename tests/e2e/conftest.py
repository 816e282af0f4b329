"""The end-to-end loop's fixtures: rpg's own Ray head, declaring one GPU, the toy task, and the sweeps.

Run by `make e2e` in its own environment (.venv-e2e: verl 0.9.1, vLLM's CPU build, PyPI's torch); never
skipped there. `make test` leaves this directory out (tests/conftest.py's collect_ignore, unless RPG_E2E=1).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
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
    "data.dataloader_num_workers=0",  # 8 forked loader processes per run, for 144 problems
]
STAND_INS = {
    "PYTHONPATH": str(E2E),
    "VERL_USE_EXTERNAL_MODULES": "stand_ins",  # rpg appends its plugin
    "VERL_ENGINE_DEVICE": "cuda",
    **VLLM_CPU_ENV,
}


# The Ray head is rpg's own local head (orchestration/head.py: loopback, a token of its own) in a directory of the
# test's, declaring one GPU; `rpg sweep --address` reaches it as it would a cluster's, with its token.
HEAD_HOME = Path(tempfile.mkdtemp(prefix="rpge2e"))  # short: Ray's socket paths have a length limit
TOKEN_FILE = HEAD_HOME / "ray" / "auth_token"


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
    """rpg's local head with 16 CPUs and one GPU that nobody has (verl places its workers in {CPU, GPU: 1}
    bundles); its jobs inherit the vLLM CPU settings from its environment. Stopped at the end (by its pids)."""
    from rpg_cli.orchestration.head import local_head, stop_local_head

    saved = {name: os.environ.get(name) for name in VLLM_CPU_ENV}
    os.environ.update(VLLM_CPU_ENV)
    try:
        head = local_head(HEAD_HOME, num_cpus=16, num_gpus=1)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    assert Path(head.token_file) == TOKEN_FILE
    try:
        yield head.dashboard_url
    finally:
        stop_local_head(HEAD_HOME)
        shutil.rmtree(HEAD_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    """A directory with the toy task (`rpg prepare-data --toy`) and two sweep files of tiny verl cells on the toy
    model, rolled out by vLLM's CPU build. `e2e.yaml`:

    - rpg_reinforce: RPG-REINFORCE, the reference reset every 3 steps, 5 steps with checkpoints at 2 and 4; its
      job kills itself right after the checkpoint of step 4 (once), to be resumed;
    - grpo: GRPO as published (frozen reference, clamped k3); its job's entrypoint gets SIGTERM in the middle of
      step 1 (a preemption), so it stops after step 1 with a checkpoint and the next sweep resumes it at step 2;
    - dapo: DAPO (dynamic sampling and overlong shaping, its buffer 12 of the 16 response tokens, so it acts),
      with verl's rollout correction (token-level importance weights pi_old/pi_vLLM, truncated at 2).

    `control.yaml`: RPG-REINFORCE whose vLLM never takes the trained weights (the control of the sync check), with
    a k3 bound for fp32 that the watchdog stops it by.
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
            {
                "algorithm": "grpo",
                "beta": 1.0e-3,
                "clip": {"eps_low": 0.2, "eps_high": 0.2},
                "reference": "frozen",
                "verl": {"site": SITE, "env": {**STAND_INS, "RPG_E2E_SIGTERM_IN_STEP": "1"}},
            },
            {
                "algorithm": "dapo",
                "beta": 0.0,
                "clip": {"eps_low": 0.2, "eps_high": 0.28},
                "overlong": {"buffer": 12},
                "rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 2.0},
            },
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
            # fp32 on a CPU: a synced k3 is <= 1.4e-5, one missed update 7.8e-4 (the default bound is bf16's)
            "watch": {"rollout_corr/k3_kl": {"max": 3.0e-4}},
        },
    }
    for name, content in (("e2e.yaml", sweep), ("control.yaml", control)):
        (root / name).write_text(yaml.safe_dump(content, sort_keys=False))
    return root
