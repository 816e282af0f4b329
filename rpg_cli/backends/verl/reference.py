"""The paper's iterative reference on verl 0.9.1: pi_ref <- pi_theta inside verl's own workers, no fork.

verl 0.9.1's `main_ppo` runs `TaskRunnerV1`, which builds the trainer registered (verl's `register_trainer`)
under `trainer.v1.trainer_mode`; that trainer starts one `engine_workers.ActorRolloutRefWorker` per GPU with
the role actor_rollout_ref, holding the actor and the reference as two FSDP training engines in one process,
on the same device mesh. verl cannot change its reference after start. rpg adds, through those extension
points (the overrides select them: `trainer.v1.trainer_mode=rpg`, see `launch.reference_overrides`):

- `RPGActorRolloutRefWorker`, verl's worker plus three methods registered with verl's dispatch decorator
  (ONE_TO_ALL: every rank runs them): `reset_reference` copies this rank's shard of every actor parameter into
  the matching shard of the reference engine, in place (both engines wrap and shard the model alike, so shard
  i of the actor is shard i of the reference: nothing is gathered, nothing goes through disk);
  `save_reference` / `load_reference` write and read those shards next to verl's checkpoint.
- `RPGTrainer`, verl's synchronous trainer (`PPOTrainerSync`, registered as `rpg`) that starts the worker above
  and runs the schedule of `rpg_cli.spec.reference.ReferenceTracker`: `on_step_begin` resets the reference when the
  schedule says so, before the step's reference log-probs; right after them, the step's KL to the reference
  (`rpg_cli.algorithms.kl.reference_kl` of old_log_probs and ref_log_prob) feeds the KL trigger; `ref/resets`,
  `ref/steps_since_reset`, `ref/kl`, `ref/kl_ema` go to metrics.jsonl with the step's other metrics.

Checkpoints follow the step's metrics: verl 0.9.1 saves step N's checkpoint before it validates and logs step
N, so a job that dies in between resumes at step N + 1 and step N's metrics are never written anywhere (found by
the end-to-end test). `RPGTrainer` saves once the step is logged; a job that dies in between re-runs the step,
and the store keeps the latest value of each (step, metric).

metrics.jsonl is rpg's (`rundir.MetricsLog`, as on the local backend), not verl's file logger, which opens the
file with "wb" when a job starts: a resumed job would erase every step of the attempts before it. `fit` takes
"file" out of `trainer.logger` before verl builds its Tracking and puts rpg's log in its place, which appends a
restart line (keep the steps through the resumed checkpoint's) and then the resumed attempt's steps.

Graceful stop (rundir.request_stop: a preemption's signal, which the job's entrypoint turns into the request
file, start.py; or `rpg cancel --graceful`): after each step is logged (and its checkpoint, if verl asked for
one, saved), `RPGTrainer` reads the request; if there is one and the step is not the run's last, it saves the
step's checkpoint through the same path (the reference with it) unless the step saved one, ends metrics.jsonl
with `rundir.stopped_line`, and ends verl's loop there: `fit` returns as at a run's end, and main_ppo exits 0.
A request made before the first step of an attempt ends the loop before that step (the checkpoint the attempt
resumed from stands). verl 0.9.1's loop runs `while ... self.global_steps <= self.total_training_steps`, after
it has logged step N and counted on to N + 1: setting total_training_steps to N ends it there, through verl's
own exit (on_train_end, the dump executor shut down). verl issue 7401 (a resume at an epoch boundary exits
with no update) does not arise: rpg sets total_epochs far above what its steps need (launch.py).

Resume: a checkpoint (`global_step_N/`) also holds the schedule's state (`rpg_reference.json`) and, once the
reference has been reset (so it is neither the initial model nor the current one), its weights
(`reference/`, one shard file per rank, like verl's own model shards); `_load_checkpoint` restores both, so
a resumed run continues with the reference it had. This needs the same number of GPUs as the run that
saved, which verl's own sharded checkpoints need too.

What it uses of verl beyond `register_trainer` (the trainer and worker classes, their private hooks and state,
the dispatch decorator, TransferQueue, verl's Tracking and checkpoint layout) goes through `internals.py`.

The copy assumes the actor and reference engines shard alike: verl's defaults (`ref.strategy` and the ref's
fsdp settings follow the actor's). If they differ, `reset_reference` stops the run with the first mismatch.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import ray
import torch
from omegaconf import OmegaConf, open_dict
from torch.distributed.tensor import DTensor
from verl.trainer.ppo.v1.trainer_base import register_trainer

from rpg_cli import rundir
from rpg_cli.algorithms.kl import reference_kl
from rpg_cli.backends.verl import internals
from rpg_cli.backends.verl.admission import admit, release_lease
from rpg_cli.backends.verl.internals import SyncTrainer, Worker
from rpg_cli.backends.verl.launch import RPG_TRAINER, reference_from_config
from rpg_cli.rundir import MetricsLog
from rpg_cli.spec import Every
from rpg_cli.spec.reference import ReferenceTracker

logger = logging.getLogger(__name__)

REFERENCE_DIR = "reference"  # in global_step_N/: the reference's shards, when it has been reset
REFERENCE_STATE = "rpg_reference.json"  # in global_step_N/: ReferenceTracker.state_dict()


# ---------------------------------------------------------------- the worker


def local_shard(param: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter, where it is kept: FSDP2's DTensor local tensor; FSDP1's flat
    parameter `_local_shard` (with CPU offload a pinned copy that the forward reads, not `.data`, until
    FSDP's first forward makes them one); a plain parameter's data. Writing into it changes the parameter."""
    if isinstance(param, DTensor):
        return param.to_local()
    return getattr(param, "_local_shard", param.data)


def shards(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's shard of every parameter, by parameter name."""
    return {name: local_shard(param) for name, param in module.named_parameters()}


@torch.no_grad()
def copy_shards(source: dict[str, torch.Tensor], target: torch.nn.Module) -> int:
    """Copy shards (`shards` of a module sharded like `target`) into `target`'s own, in place, on any device
    or dtype; returns the number of elements copied. Raises if they are not sharded alike."""
    targets = shards(target)
    if source.keys() != targets.keys():
        differ = sorted(source.keys() ^ targets.keys())[:3]
        raise RuntimeError(
            f"the reference engine is not wrapped like the actor (parameters differ: {differ}); "
            "give actor_rollout_ref.ref the actor's strategy and fsdp settings"
        )
    copied = 0
    for name, dst in targets.items():
        src = source[name]
        if src.shape != dst.shape:
            raise RuntimeError(
                f"{name}: the actor's shard has shape {tuple(src.shape)} and the reference's "
                f"{tuple(dst.shape)}; give actor_rollout_ref.ref the actor's strategy and fsdp settings"
            )
        dst.copy_(src)
        copied += dst.numel()
    return copied


class RPGActorRolloutRefWorker(Worker):
    """verl's actor/rollout/ref worker with the reference reset (module doc)."""

    @internals.every_rank
    def reset_reference(self) -> int:
        """pi_ref <- pi_theta on this rank: the actor's parameter shards into the reference's."""
        actor, ref = internals.worker_engines(self)
        return copy_shards(shards(actor), ref)

    @internals.every_rank
    def save_reference(self, local_path: str) -> None:
        """Write this rank's reference shards to `local_path` (written whole, then renamed into place)."""
        _, ref = internals.worker_engines(self)
        os.makedirs(local_path, exist_ok=True)
        path = internals.shard_file(local_path)
        torch.save({name: shard.detach().to("cpu", copy=True) for name, shard in shards(ref).items()}, path + ".tmp")
        os.replace(path + ".tmp", path)

    @internals.every_rank
    def load_reference(self, local_path: str) -> None:
        """Read this rank's reference shards written by `save_reference` back into the reference engine."""
        _, ref = internals.worker_engines(self)
        copy_shards(torch.load(internals.shard_file(local_path), map_location="cpu", weights_only=True), ref)


# ---------------------------------------------------------------- the trainer


def batch_reference_kl(data) -> float:
    """`reference_kl` of a batch as verl's TransferQueue holds it (jagged old_log_probs, ref_log_prob,
    response_mask); padding rows verl adds for balance have an all-zero mask and do not count."""
    padded = data.select("old_log_probs", "ref_log_prob", "response_mask").to_padded_tensor()
    return float(reference_kl(padded["old_log_probs"], padded["ref_log_prob"], padded["response_mask"]))


@register_trainer(RPG_TRAINER)
class RPGTrainer(SyncTrainer):
    """verl's synchronous PPO trainer with the paper's iterative reference (module doc)."""

    def __init__(self, config):
        self.reference = ReferenceTracker(reference_from_config(config))
        internals.as_sync_mode(config)  # verl branches on the mode's name: this trainer is its "sync"
        super().__init__(config)

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        internals.replace_worker(self.role_worker_mapping, RPGActorRolloutRefWorker)
        # wait for GPUs other runs hold, instead of failing (admission.py)
        internals.reserve_check(
            self.resource_pool_manager, lambda gpus: admit(gpus, ray.cluster_resources, ray.available_resources)
        )

    def _setup(self):
        try:
            super()._setup()  # the workers, in the placement groups that reserve the run's GPUs
        finally:  # the lease start.py took on them can go (admission.py)
            release_lease(OmegaConf.select(self.config, "ray_kwargs.ray_init.namespace"))
        resets = isinstance(self.reference.reference, Every)
        if resets and not self.use_reference_policy:
            raise ValueError(
                "the reference schedule needs verl's ref worker: set actor_rollout_ref.actor.use_kl_loss"
                "=true (rpg's overrides do)"
            )
        if resets and not internals.colocated_reference(self):
            raise ValueError(
                "resetting the reference needs the actor and the reference in one worker (no LoRA, "
                "actor_rollout_ref role)"
            )

    # -- the schedule ----------------------------------------------------------------------

    def on_train_begin(self):
        super().on_train_begin()
        self.__dict__["_training"] = True  # logs from here on are training steps' (before: validation's)
        resumed = self.global_steps - 1  # verl counts on to the first step before it calls this
        if self.global_steps <= self.total_training_steps and (why := rundir.stop_requested(self._run_dir())):
            self._stop(resumed, why)  # asked while verl started: the checkpoint resumed from (if any) stands

    def on_step_begin(self):
        super().on_step_begin()
        # before this step's reference log-probs; with no ref worker (iterative) pi_ref is pi_old anyway
        if self.reference.begin_step(self.global_steps) and self.use_reference_policy:
            with internals.timed("reset_reference", self.timing_raw):
                self.ref_policy_wg.reset_reference()

    def _compute_ref_log_prob(self, batch, metrics: dict):
        batch = super()._compute_ref_log_prob(batch, metrics)
        data = internals.batch_fields(batch, ["old_log_probs", "ref_log_prob", "response_mask"])
        self.reference.observe(batch_reference_kl(data))
        return batch

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        if self.use_reference_policy or self.reference.reference == "iterative":  # else a frozen reference that
            # nothing reads: verl starts no worker for it, and its KL is not measured
            metrics.update(self.reference.metrics(global_steps))

    # -- metrics.jsonl, and checkpoints after the step's metrics -------------------------------

    def fit(self, *args, **kwargs):
        # verl's Tracking would open metrics.jsonl with "wb": rpg's append-only log stands in (module doc)
        path, backends = os.environ.get(internals.FILE_LOGGER_ENV), self.config.trainer.logger
        if path and not isinstance(backends, str) and "file" in backends:
            with open_dict(self.config):
                self.config.trainer.logger = [b for b in backends if b != "file"]
            self.__dict__["_metrics_log"] = MetricsLog(Path(path), keep_through=self.global_steps or None)
        return super().fit(*args, **kwargs)

    @property
    def logger(self):
        return self.__dict__.get("_tracking")

    @logger.setter
    def logger(self, tracking):
        # verl builds its Tracking in fit(): rpg's metrics.jsonl joins its backends, and the step's checkpoint
        # waits for the step's log (module doc)
        if tracking is not None and (log := self.__dict__.get("_metrics_log")) is not None:
            internals.add_tracking_backend(tracking, "file", internals.FileBackend(log))
        self.__dict__["_tracking"] = internals.AfterEachLog(tracking, self._after_log) if tracking is not None else None

    def _save_checkpoint(self):
        self.__dict__["_save_pending"] = True  # verl's loop asks before the step is logged: done after it

    def _after_log(self):
        """What follows a step's log: the checkpoint verl asked for during the step, then a graceful stop if one
        is asked (module doc), with a checkpoint of this step if it had none."""
        saved = self.__dict__.pop("_save_pending", False)
        if saved:
            self._save_checkpoint_now()
        if not self.__dict__.get("_training") or self.global_steps >= self.total_training_steps:
            return  # the validation before training; or the last step, which ends the run anyway
        if why := rundir.stop_requested(self._run_dir()):
            if not saved:
                self._save_checkpoint_now()
            self._stop(self.global_steps, why)

    def _stop(self, step: int, why: str):
        """End verl's loop after step `step` (module doc), with the stopped line the orchestrator reads."""
        log = self.__dict__.get("_metrics_log")
        path = log.path if log is not None else rundir.metrics_path(self._run_dir())
        rundir.append_line(path, rundir.stopped_line(step, why))
        internals.end_loop_after(self, step)
        print(f"rpg: stopped after step {step} ({why}) as asked; a resume starts at step {step + 1}", flush=True)

    def _run_dir(self) -> Path:
        """runs/<sweep>/<run>: where verl's checkpoints go (trainer.default_local_dir) is its checkpoints/."""
        return Path(self.config.trainer.default_local_dir).parent

    # -- resume ----------------------------------------------------------------------------

    def _save_checkpoint_now(self):
        # before verl's save, which writes the latest-checkpoint marker last: a crash in between leaves the
        # previous checkpoint the latest
        folder = internals.step_folder(self.config.trainer.default_local_dir, self.global_steps)
        os.makedirs(folder, exist_ok=True)
        if self.reference.resets and self.use_reference_policy:
            self.ref_policy_wg.save_reference(os.path.join(folder, REFERENCE_DIR))
        with open(os.path.join(folder, REFERENCE_STATE), "w", encoding="utf-8") as handle:
            json.dump(self.reference.state_dict(), handle)
        super()._save_checkpoint()
        # after verl has marked this one the latest: the older ones are thinned or removed (spec `checkpoints`)
        settings = f"trainer.v1.{RPG_TRAINER}"
        keep, weights = (OmegaConf.select(self.config, f"{settings}.{key}") for key in ("keep", "weights"))
        rundir.prune_checkpoints(self._run_dir(), keep, weights or "all")

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps == 0:
            return  # trained from scratch
        folder = internals.resumed_folder(self.config.trainer, self.global_steps)
        state = os.path.join(folder, REFERENCE_STATE)
        if os.path.exists(state):
            with open(state, encoding="utf-8") as handle:
                self.reference.load_state_dict(json.load(handle))
            if self.reference.resets and self.use_reference_policy:
                self.ref_policy_wg.load_reference(os.path.join(folder, REFERENCE_DIR))
        elif isinstance(self.reference.reference, Every):
            # a checkpoint without rpg's state: the reference restarts from the resumed policy
            logger.warning("%s has no %s: the reference is reset to the resumed policy", folder, REFERENCE_STATE)
            self.reference.load_state_dict({"resets": 1, "born": self.global_steps + 1, "ema": 0.0, "kl": 0.0})
            if self.use_reference_policy:
                self.ref_policy_wg.reset_reference()
