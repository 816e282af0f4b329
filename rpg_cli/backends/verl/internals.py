"""What rpg takes from verl 0.9.1 that is not an extension point: the one module a verl release changes.

rpg extends verl through its documented points, which stay with their users: the policy-loss registry
(`register_policy_loss`, `POLICY_LOSS_REGISTRY`: plugin.py), `register_trainer` and `trainer.v1.trainer_mode`
(reference.py), external modules (`VERL_USE_EXTERNAL_MODULES`), the reward function and Hydra overrides
(launch.py). Everything else rpg relies on is verl's (or its TransferQueue's) internals, and lives here, each
behaviour behind a small name, so that rpg's own logic (the reference schedule, checkpoints after the step's
log, the graceful stop, admission) reads no verl module:

- the V1 synchronous trainer (`SyncTrainer`) whose private hooks reference.RPGTrainer overrides (`TRAINER_HOOKS`),
  and the state of it that rpg reads and writes (`global_steps`, `total_training_steps`, `use_reference_policy`,
  `ref_policy_wg`, `timing_raw`, `config`): `as_sync_mode`, `replace_worker`, `reserve_check`,
  `colocated_reference`, `end_loop_after`, `timed`, `batch_fields`, `step_folder`, `resumed_folder`;
- verl's Tracking, which rpg's metrics.jsonl joins and whose log is followed by the step's checkpoint
  (`FILE_LOGGER_ENV`, `FileBackend`, `AfterEachLog`);
- the actor/rollout/ref worker (`Worker`), its two engines' modules (`worker_engines`), methods every rank runs
  (`every_rank`), verl's file naming of a rank's shard (`shard_file`);
- the `ppo_loss` the plugin wraps, and the modules that bind it by name (`wrap_ppo_loss`);
- TransferQueue's fixed Ray namespace (`TRANSFER_QUEUE_NAMESPACE`: isolation.py);
- verl's GPU count, its refusal for too few GPUs and for an unknown loss (`ray_gpus`, `too_few_gpus`,
  `TOO_FEW_GPUS`, `UNKNOWN_LOSS`: admission.py, diagnose.py);
- verl's config check as main_ppo runs it, and its platform (`config_dir`, `validate`, `platform_names`: the
  probe of diagnose.py).

tests/test_verl_reference.py pins the verl source each of these relies on. Importing this module imports nothing
heavy: `SyncTrainer` and `Worker` import verl on first use (module `__getattr__`), each function what it needs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------- the trainer

# PPOTrainer's private methods reference.RPGTrainer overrides (with `fit`, the `logger` attribute and the
# on_train_begin / on_step_begin callbacks): a verl release that renames one silently skips rpg's code
TRAINER_HOOKS = (
    "_init_resource_pool_mgr",
    "_setup",
    "_compute_ref_log_prob",
    "_compute_metrics",
    "_save_checkpoint",
    "_load_checkpoint",
)
SYNC_MODE = "sync"  # verl branches on this trainer_mode name (replay buffer, refill, checkpoints)
FILE_LOGGER_ENV = "VERL_FILE_LOGGER_PATH"  # where verl's file logger (and rpg's, in its place) writes metrics.jsonl


def __getattr__(name: str) -> Any:
    """verl's classes rpg subclasses, imported when first asked for (this module imports no verl by itself)."""
    if name == "SyncTrainer":
        from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

        return PPOTrainerSync
    if name == "Worker":
        from verl.workers.engine_workers import ActorRolloutRefWorker

        return ActorRolloutRefWorker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def as_sync_mode(config) -> None:
    """Make a trainer registered under another name run as verl's "sync" trainer (verl reads the name)."""
    from omegaconf import open_dict

    with open_dict(config):
        config.trainer.v1.trainer_mode = SYNC_MODE


def replace_worker(role_worker_mapping: dict, worker_cls: type) -> None:
    """Start `worker_cls` (a `Worker` subclass) wherever verl's trainer would start its actor/rollout/ref worker."""
    import ray

    base = __getattr__("Worker")
    for role, worker in list(role_worker_mapping.items()):
        if getattr(worker, "__ray_actor_class__", worker) is base:
            role_worker_mapping[role] = ray.remote(worker_cls)


def reserve_check(manager, check: Callable[[int], None]) -> None:
    """`check(GPUs the run needs)` in place of verl's check of free GPUs before it reserves its placement groups
    (ResourcePoolManager._check_resource_available, which fails at once)."""
    manager._check_resource_available = lambda: check(manager.get_n_gpus())


def colocated_reference(trainer) -> bool:
    """Whether the reference is its own engine in the actor's worker (actor_rollout_ref role, no LoRA)."""
    return not trainer.ref_in_actor and trainer.ref_policy_wg is trainer.actor_rollout_wg


def end_loop_after(trainer, step: int) -> None:
    """End verl's training loop once step `step` is logged: it runs while global_steps <= total_training_steps,
    and exits through its own end (on_train_end, the dump executor shut down)."""
    trainer.total_training_steps = step


def timed(name: str, timing_raw: dict):
    """verl's timer of a step's stage (its `timing_s/<name>` metric), as a context manager."""
    from verl.utils.debug import marked_timer

    return marked_timer(name, timing_raw, color="olive")


def batch_fields(batch, names: list[str]):
    """The fields `names` of the step's batch (the trainer's handle on TransferQueue's copy), as a TensorDict."""
    import transfer_queue as tq

    return tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(names))


def step_folder(checkpoints: str, step: int) -> str:
    """verl's checkpoint folder of step `step` under trainer.default_local_dir."""
    return os.path.join(checkpoints, f"global_step_{step}")


def resumed_folder(trainer_config, step: int) -> str:
    """The global_step_N folder verl's `_load_checkpoint` resumed from, by its rules, as an absolute path."""
    if trainer_config.resume_mode == "resume_path":
        folder = trainer_config.resume_from_path
    else:
        folder = step_folder(trainer_config.default_local_dir, step)
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)


class FileBackend:
    """An object with `write(step, data)` (rundir.MetricsLog) as one of verl's Tracking backends."""

    def __init__(self, log):
        self._log = log

    def log(self, data, step):
        self._log.write(step, data)

    def finish(self):
        pass  # every line is written whole when it is logged


def add_tracking_backend(tracking, name: str, backend) -> None:
    """One more backend of verl's Tracking, which log() and finish() walk."""
    tracking.logger[name] = backend


class AfterEachLog:
    """verl's Tracking, which then calls `after()`: what follows the log of a step."""

    def __init__(self, tracking, after: Callable[[], None]):
        self._tracking, self._after = tracking, after

    def log(self, data, step, backend=None):
        self._tracking.log(data=data, step=step, backend=backend)
        self._after()

    def __getattr__(self, name):
        return getattr(self._tracking, name)


# ---------------------------------------------------------------- the worker


def every_rank(method: Callable) -> Callable:
    """Register a worker method with verl's dispatch (ONE_TO_ALL: every rank of the worker group runs it; the
    worker group gains a method of that name)."""
    from verl.single_controller.base.decorator import Dispatch, register

    return register(dispatch_mode=Dispatch.ONE_TO_ALL)(method)


def worker_engines(worker):
    """The torch modules of the actor's and the reference's training engines in one actor/rollout/ref worker."""
    if worker.actor is None or worker.ref is None:
        raise RuntimeError(
            f"resetting the reference needs the actor and the reference in one worker "
            f"(role actor_rollout_ref), got role {worker.role}"
        )
    return worker.actor.engine.module, worker.ref.engine.module


def shard_file(folder: str) -> str:
    """This rank's shard file in `folder`, named as verl names its model shards (FSDP checkpoint manager)."""
    import torch

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    return os.path.join(folder, f"model_world_size_{world}_rank_{rank}.pt")


# ---------------------------------------------------------------- the loss path

# modules that bind verl's ppo_loss by name (`from verl.workers.utils.losses import ppo_loss`)
PPO_LOSS_USERS = ("verl.workers.utils.losses", "verl.workers.engine_workers", "verl.trainer.distillation.losses")


def wrap_ppo_loss(wrap: Callable[[Callable], Callable]) -> None:
    """Replace verl's `ppo_loss` by `wrap(ppo_loss)` in its module and in every already-imported module that bound
    it by name (engine_workers binds it at import and looks it up when the actor is built); those imported later
    bind the wrapped one. `wrap` must return its argument when it is already wrapped (`__wrapped__`)."""
    import sys

    import verl.workers.utils.losses as losses

    original = getattr(losses.ppo_loss, "__wrapped__", losses.ppo_loss)
    wrapped = wrap(losses.ppo_loss)
    for module_name in PPO_LOSS_USERS:
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, "ppo_loss", None) is original:
            module.ppo_loss = wrapped


# ---------------------------------------------------------------- what the cluster and the checks see

TRANSFER_QUEUE_NAMESPACE = "transfer_queue"  # transfer_queue/interface.py, storage/clients/ray_storage_client.py
TOO_FEW_GPUS = re.compile(r"Total available GPUs (\d+) is less than total desired GPUs (\d+)")  # verl's refusal
UNKNOWN_LOSS = re.compile(r"Unsupported loss mode: (\S+)")  # verl's, for a loss its registry lacks


def ray_gpus(resources: dict[str, float]) -> float:
    """The GPUs in a Ray resource dict, as verl counts them (GPU, else NPU)."""
    return resources.get("GPU", resources.get("NPU", 0.0))


def too_few_gpus(total: float, required: int) -> str:
    """verl's own message for a cluster with fewer GPUs than a run needs (what `TOO_FEW_GPUS` reads)."""
    return f"Total available GPUs {total:g} is less than total desired GPUs {required}"


def config_dir() -> str:
    """verl's Hydra config folder (ppo_trainer.yaml), which main_ppo composes from."""
    import verl

    return str(Path(verl.__file__).parent / "trainer" / "config")


def validate(cfg) -> None:
    """verl's check of a composed ppo_trainer config, as main_ppo runs it (raises, sometimes without a message)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def platform_names() -> dict[str, str]:
    """verl's platform in this environment: its vendor and device names."""
    from verl.plugin.platform import get_platform

    platform = get_platform()
    return {"vendor": platform.vendor_name, "device": platform.device_name}
