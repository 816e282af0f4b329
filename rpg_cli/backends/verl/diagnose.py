"""Orchestrator-side checks for verl runs (no verl import in this process).

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

from rpg_cli.backends.verl.launch import PLUGIN_MODULE

_PROBE = f"""
import verl
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from rpg_cli.algorithms import LOSS_NAMES
missing = [n for n in LOSS_NAMES if getattr(POLICY_LOSS_REGISTRY.get(n), "__module__", "") != "{PLUGIN_MODULE}"]
print("missing:" + ",".join(missing) if missing else "ok")
"""


def check_plugin_loads(python: str | None = None, timeout_s: float = 120.0) -> None:
    """Raise RuntimeError (one line) unless a fresh `python` importing verl the way a job does
    (VERL_USE_EXTERNAL_MODULES from the runtime_env) sees every rpg policy loss registered."""
    environment = {**os.environ, "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE}
    try:
        done = subprocess.run([python or sys.executable, "-c", _PROBE], env=environment, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the verl plugin check did not finish in {timeout_s:.0f} s (importing verl hangs?)") from None
    out = done.stdout.strip().splitlines()
    if done.returncode != 0 or not out:
        raise RuntimeError(f"the rpg verl plugin does not load: {last_error_line(done.stderr) or 'no output'}; "
                           "install the verl extra (pip install 'rpg-cli[verl]')")
    if out[-1] != "ok":
        raise RuntimeError(f"verl loaded the rpg plugin but lacks losses ({out[-1].removeprefix('missing:')}); "
                           "reinstall rpg-cli so both come from the same version")


# Known failures -> what the user should do; matched against the last error line.
_HINTS = (
    (re.compile(r"Total available GPUs (\d+) is less than total desired GPUs (\d+)"),
     "verl needs {1} GPU(s) but the Ray cluster has {0} free: run on a GPU cluster (rpg sweep --address ...) "
     "or use --backend local"),
    (re.compile(r"Unsupported loss mode: (\S+)"),
     "verl does not know loss {0}: the rpg plugin did not load in the job (VERL_USE_EXTERNAL_MODULES)"),
    (re.compile(r"(?:No such file or directory|FileNotFoundError).*?'([^']+\.parquet)'"),
     "data file {0} is missing on the node that ran the job: run rpg prepare-data on a shared filesystem"),
    (re.compile(r"CUDA out of memory|torch\.OutOfMemoryError"),
     "GPU out of memory: lower the context, or raise nodes/gpus_per_node"),
)

_ERROR_LINE = re.compile(r"^\s*(?:\S*\.)?([A-Z]\w*(?:Error|Exception)|AssertionError|KeyboardInterrupt)\b:?\s*(.*)$")


def last_error_line(log: str) -> str:
    """The last `SomeError: message` line of a traceback-bearing log ("" when there is none)."""
    for line in reversed(log.splitlines()):
        match = _ERROR_LINE.match(line)
        if match and "Traceback" not in line:
            name, message = match.groups()
            return f"{name}: {message}".strip().rstrip(":")
    return ""


def failure_reason(log_tail: str, limit: int = 300) -> str:
    """One readable line for a failed verl job, from the tail of its log."""
    error = last_error_line(log_tail)
    for pattern, hint in _HINTS:
        match = pattern.search(error) or pattern.search(log_tail)
        if match:
            return hint.format(*match.groups())[:limit]
    if error:
        return error[:limit]
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    return (lines[-1] if lines else "the job failed without output")[:limit]
