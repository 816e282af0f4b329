"""Orchestrator-side checks for verl runs (no verl import in this process); `launch` hands them to the
orchestrator as the backend's `preflight` and `failure_reason`.

`check_plugin_loads` runs at submit time: verl imports plugins from its `verl.plugins` entry point and
logs a failure only at debug level, so a broken install would otherwise train with verl's losses or
fail deep inside a worker. It also composes and validates verl's config with the runs' overrides, once per
distinct configuration (`ALIKE`): a 1,000-run grid over seeds and learning rates is one composition, not a
thousand. `failure_reason` turns the tail of a failed job's log into the one line `rpg runs` shows.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from rpg_cli.backends.verl.internals import TOO_FEW_GPUS, UNKNOWN_LOSS
from rpg_cli.rundir import failure_line, last_error_line

# Override keys whose values verl 0.9.1's composition and validation never read, so runs whose overrides differ
# only there (values Hydra parses to the same type) get the same verdict and share one check. Read in verl's
# source: `utils/config.py` validate_config reads data.train_batch_size/val_batch_size, trainer.n_gpus_per_node/
# nnodes, rollout.n/name/temperature/val_kwargs.do_sample/log_prob_micro_batch_size*, the model's lora settings,
# algorithm.use_kl_in_reward/rollout_correction, and builds the actor's dataclasses (hydra instantiate, no type
# check): `workers/config/actor.py` ActorConfig.__post_init__/validate read the batch sizes, strategy, rollout_n,
# loss_agg_mode; `optimizer.py` OptimizerConfig.__post_init__ only asserts lr is set, FSDPOptimizerConfig reads
# lr_scheduler_type; `engine.py` FSDPEngineConfig reads strategy; rpg's RPGPolicyLossConfig (plugin.py) reads
# beta and loss_mode. None reads a seed, the learning rate, a name or a path; the config files interpolate
# trainer.experiment_name only into rollout.experiment_name and actor.data_loader_seed only into the critics'
# data_loader_seed (trainer/config/rollout/rollout.yaml, critic/*.yaml), neither read either. A value that is
# not a plain scalar (an interpolation, a list, quotes) is compared as written.
ALIKE = frozenset(
    {
        "data.seed",
        "actor_rollout_ref.actor.data_loader_seed",
        "actor_rollout_ref.actor.fsdp_config.seed",
        "actor_rollout_ref.rollout.seed",
        "actor_rollout_ref.actor.optim.lr",
        "trainer.experiment_name",
        "trainer.default_local_dir",
        "hydra.run.dir",
        "ray_kwargs.ray_init.namespace",
    }
)
ALIKE_TEXT = "runs that differ only in seeds, the learning rate, names and paths share one"

IMPORT_S = 120.0  # a fresh interpreter importing verl and rpg's plugin (~10 s on an idle core)
GROUP_S = 10.0  # then reading the runs' overrides with Hydra's parser (0.2 ms per value measured) ...
GROUP_S_PER_RUN = 0.05  # ... plus this per run
CHECK_S = 10.0  # each distinct configuration composed and validated (0.3-1 s measured: 10x for a busy login node)

PREFIX = "rpg-probe "  # marks the probe's own lines apart from what verl prints

# stdin: JSON {"runs": [overrides of each run], "alike": [keys]}; the runs are grouped by their overrides (each
# value of an `alike` key by its type only, as Hydra parses it), and one run of each group is composed into
# verl's ppo_trainer config and validated as main_ppo validates it (verl's own check of what the spec's `verl`
# block adds, before a GPU is paid for). Each stage says it is done on stdout, so a timeout names the stage.
_PROBE = """
import json, sys
P = "rpg-probe "
import verl
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from rpg_cli.algorithms import LOSS_NAMES
plugin = sys.argv[1]
from rpg_cli.backends.verl.launch import plugin_losses
missing = [n for n in plugin_losses(LOSS_NAMES) if getattr(POLICY_LOSS_REGISTRY.get(n), "__module__", "") != plugin]
if missing:
    sys.exit(print(P + "missing:" + ",".join(missing)))
if sys.argv[2:] == ["node"]:  # a node's check: verl's platform and the vLLM version, as this environment gives them
    import importlib.metadata
    from rpg_cli.backends.verl.internals import platform_names
    try:
        vllm = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        vllm = None
    print(P + "node:" + json.dumps({**platform_names(), "vllm": vllm}))
print(P + "imported", flush=True)
payload = json.load(sys.stdin)
runs, alike = payload["runs"], frozenset(payload["alike"])
groups = {}
if runs:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from functools import lru_cache
    parser = OverridesParser.create()
    @lru_cache(maxsize=None)
    def kind(text):  # the type Hydra's grammar gives a value (seeds repeat across keys: parsed once)
        try:
            value = parser.parse_override("x=" + text).value()
        except Exception:
            return None  # composing it says what is wrong with it
        return type(value).__name__ if type(value) in (int, float, str, bool) else None
    def part(item):
        key, _, text = item.partition("=")
        if key.lstrip("+") not in alike or any(c in text for c in "$'\\"[]{}(),\\\\ \\t"):
            return item
        return (key, kind(text)) if kind(text) else item
    for i, overrides in enumerate(runs):
        groups.setdefault(tuple(part(item) for item in overrides), []).append(i)
print(P + "groups:" + json.dumps(list(groups.values())), flush=True)
if groups:
    from hydra import compose, initialize_config_dir
    from rpg_cli.backends.verl.internals import config_dir, validate
    with initialize_config_dir(config_dir(), version_base=None):
        for g, members in enumerate(groups.values()):
            try:
                cfg = compose(config_name="ppo_trainer", overrides=runs[members[0]])
                validate(cfg)
            except Exception as exc:
                text = " ".join(str(exc).split()) or type(exc).__name__  # verl asserts without a message too
                print(P + f"verdict:{g}:" + text[:400], flush=True)
            else:
                print(P + f"verdict:{g}:", flush=True)
print(P + "ok")
"""


@dataclass(frozen=True)
class Verdict:
    """verl's answer for one distinct configuration: the runs that share it, and why verl refuses it (None: it
    takes it)."""

    runs: tuple[str, ...]
    refusal: str | None = None


@dataclass(frozen=True)
class ConfigCheck:
    """What the probe found: a verdict per distinct configuration, in the runs' order; `node`: a node's facts
    (check_plugin_loads' `node`); the seconds importing verl took and the whole check. What `rpg sweep --dry-run
    --check` prints (orchestration/preflight.py)."""

    verdicts: tuple[Verdict, ...] = ()
    node: dict[str, Any] | None = None
    import_s: float = 0.0
    total_s: float = 0.0
    alike: str = ALIKE_TEXT  # which runs share a configuration, in words

    @property
    def refused(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.refusal is not None)


def check_plugin_loads(
    plugin_module: str,
    python: str | None = None,
    timeout_s: float = IMPORT_S,
    configs: dict[str, list[str]] | None = None,
    env: Mapping[str, str] | None = None,
    node: bool = False,
) -> dict[str, Any] | None:
    """Raise RuntimeError (one line) unless a fresh `python` importing verl the way a job does
    (VERL_USE_EXTERNAL_MODULES=`plugin_module`, from the runtime_env) sees every rpg policy loss
    registered by that module, and verl composes and validates each run's overrides in `configs`
    (run name -> Hydra overrides; once per distinct configuration, `check_configs`).

    `timeout_s`: what importing verl may take. `env`: a job's whole environment instead of this process's (its
    VERL_USE_EXTERNAL_MODULES, which lists the plugin, may load other modules first: a platform). `node`: also
    return what a node's check reads there (node.py): verl's platform ({vendor, device}) and the vLLM version
    verl reads ({vllm}: None when none)."""
    found = check_configs(plugin_module, configs or {}, python=python, import_s=timeout_s, env=env, node=node)
    if found.refused:
        first, others = found.refused[0], len(found.refused) - 1
        alike = f" and {len(first.runs) - 1} other run(s) like it" if len(first.runs) > 1 else ""
        more = (
            f"; {others} other configuration(s) refused too (`rpg sweep SPEC --dry-run --check` lists them)"
            if others
            else ""
        )
        raise RuntimeError(f"{first.runs[0]}{alike}: verl's config refuses its overrides: {first.refusal}{more}")
    return found.node


def check_configs(
    plugin_module: str,
    configs: Mapping[str, list[str]],
    python: str | None = None,
    import_s: float = IMPORT_S,
    env: Mapping[str, str] | None = None,
    node: bool = False,
    alike: Collection[str] = ALIKE,
) -> ConfigCheck:
    """verl's verdict on each distinct configuration of `configs` (run name -> Hydra overrides), from one fresh
    `python` that imports verl with rpg's plugin as a job does; runs whose overrides differ only in the values of
    `alike` keys (of one type) are one configuration, checked once (`alike=()`: every run checked on its own).

    RuntimeError (one line) when the plugin does not load, or a stage runs past its time: importing verl
    (`import_s`), reading the overrides (GROUP_S + GROUP_S_PER_RUN each), composing (CHECK_S each)."""
    import json

    environment = {**os.environ, "VERL_USE_EXTERNAL_MODULES": plugin_module} if env is None else dict(env)
    names = list(configs)
    payload = json.dumps({"runs": [list(configs[n]) for n in names], "alike": sorted(alike)})
    argv = [python or sys.executable, "-c", _PROBE, plugin_module, *(["node"] if node else [])]
    lines, stderr, returncode, import_s_taken, total_s = _run_probe(argv, environment, payload, import_s, len(names))
    ours = [line.removeprefix(PREFIX) for line in lines if line.startswith(PREFIX)]
    missing = [line.removeprefix("missing:") for line in ours if line.startswith("missing:")]
    if missing:
        raise RuntimeError(
            f"verl loaded the rpg plugin but lacks losses ({missing[-1]}); "
            "reinstall rpg-cli so both come from the same version"
        )
    if returncode != 0 or not ours or ours[-1] != "ok":
        raise RuntimeError(
            f"the rpg verl plugin does not load: {last_error_line(stderr) or 'no output'}; "
            "install verl (pip install -r requirements/gpu.txt on a GPU node, or -e '.[verl]')"
        )
    seen = [json.loads(line.removeprefix("node:")) for line in ours if line.startswith("node:")]
    groups = next((json.loads(line.removeprefix("groups:")) for line in ours if line.startswith("groups:")), [])
    said = dict(line.removeprefix("verdict:").split(":", 1) for line in ours if line.startswith("verdict:"))
    if sorted(said, key=int) != [str(g) for g in range(len(groups))] or sum(map(len, groups)) != len(names):
        raise RuntimeError(f"verl's config check answered for {len(said)} of {len(groups)} configuration(s)")
    verdicts = tuple(
        Verdict(tuple(names[i] for i in members), said[str(g)] or None) for g, members in enumerate(groups)
    )
    how = ALIKE_TEXT if set(alike) == ALIKE else f"runs that differ only in {', '.join(sorted(alike))} share one"
    if not alike:
        how = "each run on its own"
    return ConfigCheck(verdicts, seen[-1] if seen else None, import_s_taken, total_s, how)


def _run_probe(
    argv: list[str], env: Mapping[str, str], payload: str, import_s: float, runs: int
) -> tuple[list[str], str, int, float, float]:
    """Run the probe, feeding `payload` on stdin, its stdout read line by line so that each stage has its own
    time: importing verl (`import_s`), reading `runs` runs' overrides, then CHECK_S per distinct configuration.
    Returns (stdout lines, stderr, exit status, seconds to import, seconds in all); RuntimeError naming the stage
    that ran out of time (the probe is killed)."""
    import json

    started = time.monotonic()
    proc = subprocess.Popen(
        argv, env=dict(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out: queue.Queue[str | None] = queue.Queue()
    err: list[str] = []

    def feed() -> None:
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except OSError:  # the probe exited before reading it (a failed import): its output says why
            pass

    def read_out() -> None:
        for line in proc.stdout:
            out.put(line.rstrip("\n"))
        out.put(None)

    readers = [
        threading.Thread(target=f, daemon=True) for f in (feed, read_out, lambda: err.append(proc.stderr.read()))
    ]
    for reader in readers:
        reader.start()
    lines: list[str] = []
    imported_at = None
    stage, deadline = f"importing verl with rpg's plugin did not finish in {import_s:.0f} s", started + import_s
    checks, checked, checks_from = 0, 0, started
    while True:
        try:
            line = out.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            proc.wait()
            if not stage:  # composing: how far it got
                stage = (
                    f"verl's config check did not finish: {checked} of {checks} distinct configuration(s) "
                    f"({runs} runs) checked in {time.monotonic() - checks_from:.0f} s (allowed: {CHECK_S:g} s each)"
                )
            raise RuntimeError(stage) from None
        if line is None:
            break
        lines.append(line)
        if line == PREFIX + "imported":
            imported_at = time.monotonic()
            budget = GROUP_S + GROUP_S_PER_RUN * runs
            stage, deadline = (
                f"reading the overrides of {runs} runs did not finish in {budget:.0f} s",
                imported_at + budget,
            )
        elif line.startswith(PREFIX + "groups:"):
            checks, checks_from = len(json.loads(line.removeprefix(PREFIX + "groups:"))), time.monotonic()
            stage, deadline = "", checks_from + CHECK_S * max(checks, 1)
        elif line.startswith(PREFIX + "verdict:"):
            checked += 1
    returncode = proc.wait()
    for reader in readers[1:]:
        reader.join()
    ended = time.monotonic()
    return lines, "".join(err), returncode, (imported_at or ended) - started, ended - started


# verl's own known failures -> what the user should do (disk full and out of memory are every job's:
# rundir.failure_line); matched against the last error line, then the whole tail.
_HINTS = (
    (
        TOO_FEW_GPUS,
        "verl needs {1} GPU(s) but the Ray cluster has {0} free: run on a GPU cluster (rpg sweep --address ...) "
        "or use --backend local",
    ),
    (
        UNKNOWN_LOSS,
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
