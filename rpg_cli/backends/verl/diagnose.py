"""Orchestrator-side checks for verl runs (no verl import in this process); `launch` hands them to the
orchestrator as the backend's `preflight` and `failure_reason`.

`check_plugin_loads` runs at submit time: verl imports plugins from its `verl.plugins` entry point and
logs a failure only at debug level, so a broken install would otherwise train with verl's losses or
fail deep inside a worker. `failure_reason` turns the tail of a failed job's log into the one line
`rpg runs` shows.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from rpg_cli.rundir import failure_line, last_error_line

# stdin: a JSON list of [run name, overrides]; each is composed into verl's ppo_trainer config and validated as
# main_ppo validates it (verl's own check of what the spec's `verl` block adds, before a GPU is paid for)
_PROBE = """
import json, sys
import verl
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from rpg_cli.algorithms import LOSS_NAMES
plugin = sys.argv[1]
from rpg_cli.backends.verl.launch import plugin_losses
missing = [n for n in plugin_losses(LOSS_NAMES) if getattr(POLICY_LOSS_REGISTRY.get(n), "__module__", "") != plugin]
if missing:
    sys.exit(print("missing:" + ",".join(missing)))
if sys.argv[2:] == ["node"]:  # a node's check: verl's platform and the vLLM version, as this environment gives them
    import importlib.metadata
    from verl.plugin.platform import get_platform
    platform = get_platform()
    try:
        vllm = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        vllm = None
    print("node:" + json.dumps({"vendor": platform.vendor_name, "device": platform.device_name, "vllm": vllm}))
runs = json.load(sys.stdin)
if runs:
    from pathlib import Path
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    with initialize_config_dir(str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        for name, overrides in runs:
            try:
                cfg = compose(config_name="ppo_trainer", overrides=overrides)
                validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
            except Exception as exc:
                text = " ".join(str(exc).split())
                sys.exit(print(f"config:{name}: verl's config refuses its overrides: {text[:400]}"))
print("ok")
"""


def check_plugin_loads(
    plugin_module: str,
    python: str | None = None,
    timeout_s: float = 120.0,
    configs: dict[str, list[str]] | None = None,
    env: Mapping[str, str] | None = None,
    node: bool = False,
) -> dict[str, Any] | None:
    """Raise RuntimeError (one line) unless a fresh `python` importing verl the way a job does
    (VERL_USE_EXTERNAL_MODULES=`plugin_module`, from the runtime_env) sees every rpg policy loss
    registered by that module, and verl composes and validates each run's overrides in `configs`
    (run name -> Hydra overrides).

    `env`: a job's whole environment instead of this process's (its VERL_USE_EXTERNAL_MODULES, which lists the
    plugin, may load other modules first: a platform). `node`: also return what a node's check reads there
    (node.py): verl's platform ({vendor, device}) and the vLLM version verl reads ({vllm}: None when none)."""
    import json

    environment = {**os.environ, "VERL_USE_EXTERNAL_MODULES": plugin_module} if env is None else dict(env)
    try:
        done = subprocess.run(
            [python or sys.executable, "-c", _PROBE, plugin_module, *(["node"] if node else [])],
            env=environment,
            input=json.dumps(list((configs or {}).items())),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"the verl plugin check did not finish in {timeout_s:.0f} s (importing verl hangs?)"
        ) from None
    out = done.stdout.strip().splitlines()
    if out and out[-1].startswith("config:"):
        raise RuntimeError(out[-1].removeprefix("config:"))
    if done.returncode != 0 or not out:
        raise RuntimeError(
            f"the rpg verl plugin does not load: {last_error_line(done.stderr) or 'no output'}; "
            "install verl (pip install -r requirements/gpu.txt on a GPU node, or -e '.[verl]')"
        )
    if out[-1] != "ok":
        raise RuntimeError(
            f"verl loaded the rpg plugin but lacks losses ({out[-1].removeprefix('missing:')}); "
            "reinstall rpg-cli so both come from the same version"
        )
    seen = [line.removeprefix("node:") for line in out if line.startswith("node:")]
    return json.loads(seen[-1]) if seen else None


# verl's own known failures -> what the user should do (disk full and out of memory are every job's:
# rundir.failure_line); matched against the last error line, then the whole tail.
_HINTS = (
    (
        re.compile(r"Total available GPUs (\d+) is less than total desired GPUs (\d+)"),
        "verl needs {1} GPU(s) but the Ray cluster has {0} free: run on a GPU cluster (rpg sweep --address ...) "
        "or use --backend local",
    ),
    (
        re.compile(r"Unsupported loss mode: (\S+)"),
        "verl does not know loss {0}: the rpg plugin did not load in the job (VERL_USE_EXTERNAL_MODULES)",
    ),
    (
        re.compile(r"(?:No such file or directory|FileNotFoundError).*?'([^']+\.parquet)'"),
        "data file {0} is missing on the node that ran the job: run rpg prepare-data on a shared filesystem",
    ),
)


# how a job's node check (start.py, before verl starts) says why it refused to start verl: its line is the reason
NODE_CHECK = "rpg node check: "


def failure_reason(log_tail: str, limit: int = 300) -> str:
    """One readable line for a failed verl job, from the tail of its log."""
    refused = [line for line in log_tail.splitlines() if line.startswith(NODE_CHECK)]
    if refused:
        return refused[-1].removeprefix(NODE_CHECK).strip()[:limit]
    error = last_error_line(log_tail)
    for pattern, hint in _HINTS:
        match = pattern.search(error) or pattern.search(log_tail)
        if match:
            return hint.format(*match.groups())[:limit]
    return failure_line(log_tail, limit)
