"""The iterative reference on verl 0.9.1 (backends/verl/reference.py): every verl name it relies on, pinned;
the trainer hook driven with a stand-in worker group; the shard copy. The worker itself runs in verl's engine
in tests/test_verl_workers_cpu.py."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from conftest import make_spec

verl = pytest.importorskip("verl", reason="the verl extra is not installed")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from rpg_cli.backends.verl import launch  # noqa: E402
from rpg_cli.backends.verl import reference as ref  # noqa: E402
from rpg_cli.spec import Every, ExperimentSpec  # noqa: E402

VERL_CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")


def cell(reference) -> ExperimentSpec:
    """A verl run on two GPUs with the given reference."""
    return make_spec(
        algorithm="rpg_reinforce",
        reference=reference,
        model="Qwen/Qwen3-4B",
        train_batch_size=8,
        ppo_mini_batch_size=4,
        backend="verl",
        resources={"nodes": 1, "gpus_per_node": 2, "cpus": 2},
    )


def composed(spec: ExperimentSpec, run_dir: Path):
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=launch.overrides(spec, run_dir))


# ---------------------------------------------------------------- verl's names, pinned


def source(obj) -> str:
    return inspect.getsource(obj)


def test_verl_0_9_1_names_the_reference_hook_relies_on():
    import transfer_queue
    import verl.trainer.main_ppo as main_ppo
    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

    assert verl.__version__ == "0.9.1"
    # main_ppo: TaskRunnerV1 builds the trainer registered under trainer.v1.trainer_mode
    runner = Path(main_ppo.__file__).read_text()
    assert "run_ppo(config, task_runner_class=TaskRunnerV1)" in runner
    assert "trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)" in runner
    assert trainer_base.get_trainer_cls("rpg") is ref.RPGTrainer  # the plugin registered it
    assert trainer_base.TRAINER_REGISTRY["sync"] is PPOTrainerSync and issubclass(ref.RPGTrainer, PPOTrainerSync)
    # the trainer methods RPGTrainer overrides, with the signatures it calls them with
    expected = {
        "_init_resource_pool_mgr": ["self"],
        "_setup": ["self"],
        "on_step_begin": ["self"],
        "_compute_ref_log_prob": ["self", "batch", "metrics"],
        "_compute_metrics": ["self", "batch", "metrics", "timing_raw", "global_steps", "epoch"],
        "_save_checkpoint": ["self"],
        "_load_checkpoint": ["self"],
    }
    for name, params in expected.items():
        assert list(inspect.signature(getattr(trainer_base.PPOTrainer, name)).parameters) == params, name
    # the order it relies on: the hook before the step, old log-probs before reference log-probs
    fit, step_once = source(trainer_base.PPOTrainer.fit), source(trainer_base.PPOTrainer._step_once)
    assert fit.index("self.on_step_begin()") < fit.index("batch = self.step(metrics, self.timing_raw)")
    assert fit.index("self._compute_metrics(batch") < fit.index("self.logger.log(data=metrics")
    # verl saves step N before it validates and logs step N (RPGTrainer defers the save past the log), through the
    # Tracking it builds in fit
    assert fit.index("self._save_checkpoint()") < fit.index("self._validate()", fit.index("self._save_checkpoint()"))
    assert fit.index("self._save_checkpoint()") < fit.index("self.logger.log(data=metrics")
    assert "self.logger = Tracking(" in fit and "default_backend=self.config.trainer.logger" in fit
    # verl's file logger starts metrics.jsonl over ("wb") in every job: RPGTrainer puts rpg's append-only log in its
    # place, as one more entry of the Tracking's backends, which log() and finish() walk
    from verl.utils import tracking

    assert 'open(self.filepath, "wb"' in source(tracking.FileLogger.__init__)
    assert 'if "file" in default_backend:' in source(tracking.Tracking.__init__)
    assert "for default_backend, logger_instance in self.logger.items():" in source(tracking.Tracking.log)
    assert 'loggers["file"].finish()' in source(tracking.Tracking.finish)
    assert step_once.index("self._compute_old_log_prob(") < step_once.index("self._compute_ref_log_prob(")
    # the worker class it replaces, the worker groups it calls, the checkpoint folder it writes into
    pool = source(trainer_base.PPOTrainer._init_resource_pool_mgr)
    assert "self.role_worker_mapping[role] = ray.remote(ActorRolloutRefWorker)" in pool
    assert "self._check_resource_available()" in source(ResourcePoolManager.create_resource_pool)
    setup = source(trainer_base.PPOTrainer._setup)
    assert "self.ref_policy_wg = all_wg[str(actor_role)]" in setup and "self._load_checkpoint()" in setup
    assert 'f"global_step_{self.global_steps}"' in source(trainer_base.PPOTrainer._save_checkpoint)
    assert '"ref_log_prob"' in source(trainer_base.PPOTrainer._compute_ref_log_prob)
    assert 'data["old_log_probs"]' in source(trainer_base.PPOTrainer._compute_old_log_prob)
    assert trainer_base.tq is transfer_queue and callable(transfer_queue.kv_batch_get)
    # verl branches on the mode's name "sync", which RPGTrainer therefore keeps
    assert 'self.trainer_mode == "sync"' in source(trainer_base.PPOTrainer._build_replay_buffer)
    # the worker: actor and reference engines in one process, FSDP modules at .engine.module
    init = source(ActorRolloutRefWorker.init_model)
    assert "self.ref = self.ref_worker_cls(" in init and "self.actor = self.actor_worker_cls(" in init
    assert "self.engine: BaseEngine = EngineRegistry.new(" in source(TrainingWorker.__init__)
    for name in ("reset_reference", "save_reference", "load_reference"):
        assert getattr(getattr(ref.RPGActorRolloutRefWorker, name), MAGIC_ATTR)["dispatch_mode"] is Dispatch.ONE_TO_ALL


def test_verl_binds_the_reset_to_the_colocated_worker_group():
    # what create_colocated_worker_cls does for the actor_rollout_ref role: the methods registered with verl's
    # decorator become the worker group's `actor_rollout_ref_<name>` (spawn strips the prefix)
    from verl.single_controller.ray.base import _bind_workers_method_to_parent

    class Parent:
        pass

    _bind_workers_method_to_parent(Parent, "actor_rollout_ref", ref.RPGActorRolloutRefWorker)
    for name in ("reset_reference", "save_reference", "load_reference", "compute_ref_log_prob"):
        assert hasattr(Parent, f"actor_rollout_ref_{name}")


# ---------------------------------------------------------------- the trainer, with a stand-in worker group


class Group:
    """A worker group that records the calls the trainer makes."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args)) or [None]


def trainer_shell(reference, use_reference_policy=True):
    trainer = ref.RPGTrainer.__new__(ref.RPGTrainer)
    trainer.reference = ref.ReferenceTracker(reference)
    trainer.use_reference_policy = use_reference_policy
    trainer.ref_policy_wg = trainer.actor_rollout_wg = Group()
    trainer.timing_raw = {}
    return trainer


def test_rpg_trainer_is_verls_sync_trainer_with_rpgs_worker_and_schedule(tmp_path, monkeypatch):
    spec = cell({"every": 3, "kl_target": 0.2})
    cfg = composed(spec, tmp_path)
    trainer = ref.RPGTrainer(cfg)
    assert trainer.trainer_mode == "sync" and cfg.trainer.v1.trainer_mode == "sync"  # verl's sync semantics
    assert type(trainer.replay_buffer).__name__ == "ReplayBuffer"
    assert (trainer.reference.every, trainer.reference.kl_target, trainer.reference.alpha) == (3, 0.2, 0.1)
    trainer._init_resource_pool_mgr()
    (worker,) = trainer.role_worker_mapping.values()
    assert worker.__ray_actor_class__ is ref.RPGActorRolloutRefWorker
    assert [str(role) for role in trainer.role_worker_mapping] == ["actor_rollout_ref"]
    # verl's check of free GPUs (it fails a run that others' runs make wait) is rpg's admission: 0 GPUs in all
    monkeypatch.setattr(ref.ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(ValueError, match="Total available GPUs 0 is less than total desired GPUs 2"):
        trainer.resource_pool_manager._check_resource_available()


def test_the_hook_resets_before_the_steps_the_schedule_names():
    trainer = trainer_shell(Every(every=2))
    for step in range(1, 7):
        trainer.global_steps = step
        trainer.on_step_begin()
        trainer.reference.observe(0.0)
    assert len(trainer.ref_policy_wg.calls) == 2  # before steps 3 and 5
    assert "reset_reference" in trainer.timing_raw
    iterative = trainer_shell("iterative", use_reference_policy=False)  # no ref worker: pi_ref is pi_old
    for step in range(1, 4):
        iterative.global_steps = step
        iterative.on_step_begin()
    assert iterative.ref_policy_wg.calls == [] and iterative.reference.resets == 2


def test_checkpoints_carry_the_schedule_and_a_reset_reference(tmp_path, monkeypatch):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    order = []
    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: order.append("verl's save"))
    trainer = trainer_shell(Every(every=2))
    trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto"}})
    for step in (1, 2, 3):
        trainer.global_steps = step
        trainer.on_step_begin()
        trainer.reference.observe(0.25 if step == 2 else 0.0)
    trainer._save_checkpoint_now()
    folder = tmp_path / "global_step_3"
    assert trainer.ref_policy_wg.calls[-1] == ("save_reference", (str(folder / "reference"),))
    assert order == ["verl's save"]  # after rpg's files, so verl's latest-checkpoint marker comes last
    saved = json.loads((folder / "rpg_reference.json").read_text())
    assert saved == trainer.reference.state_dict() and saved["resets"] == 1

    def verl_load(self):
        self.global_steps = 3

    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", verl_load)
    resumed = trainer_shell(Every(every=2))
    resumed.config = trainer.config
    resumed._load_checkpoint()
    assert resumed.reference.state_dict() == saved
    assert resumed.ref_policy_wg.calls == [("load_reference", (str(folder / "reference"),))]


def test_a_frozen_reference_is_neither_saved_nor_loaded(tmp_path, monkeypatch):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: None)
    trainer = trainer_shell("frozen")
    trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto"}})
    trainer.global_steps = 5
    trainer._save_checkpoint_now()
    assert trainer.ref_policy_wg.calls == [] and (tmp_path / "global_step_5" / "rpg_reference.json").exists()


def test_a_steps_checkpoint_is_saved_after_its_metrics_are_logged(tmp_path, monkeypatch):
    """verl asks for step N's checkpoint before it logs step N: a job killed in between would resume after N
    with N's metrics written nowhere. RPGTrainer saves only once the step is logged."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    order = []
    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: order.append(("save", self.global_steps)))

    class Tracking:
        def log(self, data, step, backend=None):
            order.append(("log", step))

        def finish(self):
            order.append("finish")

    trainer = trainer_shell("frozen")
    trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto"}})
    trainer.logger = Tracking()  # as verl's fit() does
    trainer.global_steps = 0
    trainer.logger.log(data={"val": 1.0}, step=0)  # validation before training: nothing to save
    for step in (1, 2):
        trainer.global_steps = step
        if step == 2:
            trainer._save_checkpoint()  # verl's loop, before validation and the log
            assert order[-1] == ("log", 1)
        trainer.logger.log(data={"loss": 0.5}, step=step)
    trainer.logger.finish()
    assert order == [("log", 0), ("log", 1), ("log", 2), ("save", 2), "finish"]


def test_a_resumed_job_continues_metrics_jsonl_instead_of_starting_it_over(tmp_path, monkeypatch):
    """verl's fit builds its Tracking from trainer.logger; with RPGTrainer the first attempt's lines (a torn
    one too) stay, a restart line keeps the steps through the resumed checkpoint, the second attempt follows."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.tracking import Tracking

    from rpg_cli.store.ingest import metrics_view

    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: None)

    def verls_fit(self, steps):  # what verl's fit does with its logger: build it, log each step, finish
        self.logger = Tracking("p", "e", default_backend=self.config.trainer.logger)
        for step in steps:
            self.logger.log(data={"actor/pg_loss": np.float32(step / 10), "val": 1.0 if step == 0 else 0.5}, step=step)
        self.logger.finish()

    monkeypatch.setattr(ref.SyncTrainer, "fit", verls_fit)
    for resumed, steps in ((0, [0, 1, 2, 3]), (2, [2, 3, 4])):  # killed after step 3, resumed from global_step_2
        trainer = trainer_shell("frozen")
        trainer.config = OmegaConf.create({"trainer": {"logger": ["console", "file"]}})
        trainer.global_steps = resumed
        trainer.fit(steps)
        assert list(trainer.config.trainer.logger) == ["console"]  # verl's own file logger never opened the file
        if not resumed:
            with path.open("ab") as f:
                f.write(b'{"step": 4, "data": {"actor/pg_lo')  # the crash cut a line short
    lines = path.read_text().splitlines()
    assert [json.loads(line).get("step") for line in lines[:4]] == [0, 1, 2, 3]
    assert lines[4] == '{"step": 4, "data": {"actor/pg_lo' and lines[5] == '{"restart": {"keep_through": 2}}'
    assert [json.loads(line)["step"] for line in lines[6:]] == [2, 3, 4]
    view = metrics_view(path.read_text())
    assert sorted(view) == [0, 1, 2, 3, 4] and view[3]["actor/pg_loss"] == pytest.approx(0.3)


def test_the_trainer_ends_its_gpu_lease_once_its_workers_hold_the_gpus_or_fail(monkeypatch):
    """start.py leased the run's GPUs (admission.py); verl's _setup reserves them with the workers' placement groups."""
    from omegaconf import OmegaConf

    released = []
    monkeypatch.setattr(ref, "release_lease", released.append)
    trainer = trainer_shell("frozen")
    trainer.config = OmegaConf.create({"ray_kwargs": {"ray_init": {"namespace": "rpg-1a2b3c4d"}}})
    monkeypatch.setattr(ref.SyncTrainer, "_setup", lambda self: released.append("workers"))
    trainer._setup()
    monkeypatch.setattr(ref.SyncTrainer, "_setup", lambda self: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        trainer._setup()
    assert released == ["workers", "rpg-1a2b3c4d", "rpg-1a2b3c4d"]


def test_a_job_without_rpgs_file_logger_path_keeps_verls_loggers(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.setattr(ref.SyncTrainer, "fit", lambda self: None)
    trainer = trainer_shell("frozen")
    trainer.config = OmegaConf.create({"trainer": {"logger": ["console", "file"]}})
    trainer.global_steps = 0
    trainer.fit()
    assert list(trainer.config.trainer.logger) == ["console", "file"] and "_metrics_log" not in trainer.__dict__


# ---------------------------------------------------------------- the pieces of the worker and the hook


def test_copy_shards_copies_in_place_across_dtypes_and_refuses_other_sharding():
    torch.manual_seed(0)
    actor, reference = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2).to(torch.bfloat16)
    storage = reference.weight.data_ptr()
    assert ref.copy_shards(ref.shards(actor), reference) == 8
    assert reference.weight.data_ptr() == storage  # in place
    assert torch.equal(reference.weight, actor.weight.to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="weight: the actor's shard has shape"):
        ref.copy_shards(ref.shards(torch.nn.Linear(4, 2)), reference)
    with pytest.raises(RuntimeError, match="not wrapped like the actor"):
        ref.copy_shards(ref.shards(torch.nn.Linear(3, 2, bias=False)), reference)


def test_batch_reference_kl_reads_verls_jagged_batch_and_skips_padding_rows():
    from verl.utils import tensordict_utils as tu

    def jagged(rows):
        return torch.nested.as_nested_tensor([torch.tensor(r) for r in rows], layout=torch.jagged)

    data = tu.get_tensordict(
        {
            "old_log_probs": jagged([[-1.0, -2.0], [-0.5], [-3.0, -3.0, -3.0]]),
            "ref_log_prob": jagged([[-1.5, -1.0], [-0.5], [0.0, 0.0, 0.0]]),
            "response_mask": jagged([[1, 1], [1], [0, 0, 0]]),  # the last: a padding row verl adds for balance
        }
    )
    log_rho = torch.tensor([-0.5, 1.0, 0.0])
    assert ref.batch_reference_kl(data) == pytest.approx(float((log_rho.exp() - 1 - log_rho).mean()), rel=1e-6)


def _verl_checkpoint(root, step: int) -> None:
    """global_step_N as verl 0.9.1 and rpg's trainer lay it out (model shards, optimizer, HF weights, reference)."""
    folder = root / f"global_step_{step}"
    hf = folder / "actor" / "huggingface"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"weights")
    for name in ("model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt", "extra_state_world_size_1_rank_0.pt"):
        (folder / "actor" / name).write_bytes(b"shard")
    (folder / "reference").mkdir()
    (folder / "reference" / "model_world_size_1_rank_0.pt").write_bytes(b"ref")
    (folder / "data.pt").write_bytes(b"loader")
    (folder / "rpg_reference.json").write_text("{}")


@pytest.mark.parametrize(
    ("keep", "weights", "full", "thinned"),
    [(1, "all", [4], [1, 2, 3]), (2, "kept", [3, 4], []), (None, "all", [1, 2, 3, 4], [])],
)
def test_a_save_thins_or_removes_older_checkpoints_as_the_spec_says(
    tmp_path, monkeypatch, keep, weights, full, thinned
):
    """After verl's save of step 4 (and its latest marker), the spec's `checkpoints` applies: the newest `keep`
    stay whole, the older keep only actor/huggingface (weights: all) or go (weights: kept); keep null keeps all."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from rpg_cli import rundir

    run_dir = tmp_path / "run"
    root = rundir.checkpoints_dir(run_dir)
    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: _verl_checkpoint(root, self.global_steps))
    for step in (1, 2, 3):
        _verl_checkpoint(root, step)
    trainer = trainer_shell("frozen")
    settings = {"keep": keep, "weights": weights}
    trainer.config = OmegaConf.create(
        {"trainer": {"default_local_dir": str(root), "resume_mode": "auto", "v1": {"rpg": settings}}}
    )
    trainer.global_steps = 4
    trainer._save_checkpoint_now()
    whole = sorted(int(p.name.split("_")[-1]) for p in root.iterdir() if (p / "data.pt").exists())
    weights_only = sorted(
        int(p.name.split("_")[-1]) for p in root.iterdir() if [c.name for c in p.iterdir()] == ["actor"]
    )
    assert (whole, weights_only) == (full, thinned)
    for step in thinned:  # what `rpg eval` reads is still there, and nothing else
        actor = root / f"global_step_{step}" / "actor"
        assert [c.name for c in actor.iterdir()] == ["huggingface"]
    assert sorted(rundir.find_checkpoints(run_dir)) == sorted(full + thinned)
    assert all(rundir.find_checkpoints(run_dir).values())


# ---------------------------------------------------------------- a graceful stop at a step boundary (issue 30)


def test_verl_0_9_1_loop_the_graceful_stop_relies_on():
    """RPGTrainer ends verl's loop after step N by setting total_training_steps to N once N is logged: the loop
    counts on to N + 1 and tests `global_steps <= total_training_steps` before each step; it calls
    on_train_begin after it counted on to the first step, and on_train_end on the way out."""
    from verl.trainer.ppo.v1 import trainer_base

    fit = source(trainer_base.PPOTrainer.fit)
    loop = "while current_epoch < self.config.trainer.total_epochs and self.global_steps <= self.total_training_steps:"
    assert fit.count(loop) == 1 and fit.count("self.logger.log(data=metrics, step=self.global_steps)") == 1
    assert fit.index("self.global_steps += 1") < fit.index("self.on_train_begin()") < fit.index(loop)
    logged = fit.index("self.logger.log(data=metrics, step=self.global_steps)")
    assert logged < fit.index("self.global_steps += 1", logged) < fit.index("if is_last_step:", logged)
    assert fit.index("self.on_train_end()") > fit.index(loop)
    # the validation before training is logged through the same Tracking, before on_train_begin
    assert fit.index("self.logger.log(data=val_metrics, step=self.global_steps)") < fit.index("self.on_train_begin()")


def _saved_by_verl(root: Path, step: int) -> None:
    """What verl 0.9.1's own _save_checkpoint leaves (the HF weights, the latest-checkpoint marker)."""
    hf = root / f"global_step_{step}" / "actor" / "huggingface"
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"weights")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))


def verls_own_fit(monkeypatch, run_dir: Path, total: int, resumed: int = 0, request=None):
    """verl 0.9.1's fit loop itself (PPOTrainer.fit) through RPGTrainer, its rollout, workers and TransferQueue
    stood in: each step logs actor/pg_loss = step / 10, every second step asks for a checkpoint (save_freq 2),
    validation runs before training. `request`: (step, why) whose step writes a stop request midway, as the
    job's signal handler would. Returns the trainer after fit returned."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import trainer_base

    from rpg_cli import rundir

    root = rundir.checkpoints_dir(run_dir)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(rundir.metrics_path(run_dir)))
    monkeypatch.setattr(trainer_base, "SkipManager", SimpleNamespace(init=lambda config: None, set_step=lambda s: None))
    monkeypatch.setattr(trainer_base.tq, "kv_clear", lambda **kwargs: None)
    monkeypatch.setattr(trainer_base.PPOTrainer, "_compute_metrics", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(
        trainer_base.PPOTrainer, "_save_checkpoint", lambda self: _saved_by_verl(root, self.global_steps)
    )
    trainer = trainer_shell(Every(every=2))
    trainer.config = OmegaConf.create(
        {
            "trainer": {
                "default_local_dir": str(root),
                "resume_mode": "auto",
                "logger": ["console", "file"],
                "project_name": "p",
                "experiment_name": "e",
                "val_before_train": True,
                "test_freq": -1,
                "save_freq": 2,
                "total_epochs": 1000,
            },
            "global_profiler": {"steps": None, "profile_continuous_steps": False},
        }
    )
    trainer.trainer_mode, trainer.steps_per_epoch = "sync", 1000
    trainer.total_training_steps, trainer.global_steps = total, resumed  # as _load_checkpoint leaves them
    trainer.checkpoint_manager = Group()
    trainer._init_dump_executor()
    trainer._validate = lambda: {"val-core/toy/acc/mean@1": 0.5}

    def step(metrics, timing_raw):
        if request and trainer.global_steps == request[0]:
            rundir.request_stop(run_dir, request[1])
        metrics["actor/pg_loss"] = trainer.global_steps / 10
        return SimpleNamespace(keys=[], partition_id="train")

    trainer.step = step
    trainer.fit(None)
    return trainer


def test_a_stop_asked_mid_step_saves_that_step_with_its_reference_and_ends_verls_loop(tmp_path, monkeypatch):
    """verl's own loop, asked to stop during step 3 of 6 (save_freq 2): step 3 is logged, then saved with the
    reference (reset before step 3) and rpg's schedule, the stopped line follows, and fit returns as at a run's
    end. The resumed job validates at step 3, continues at step 4 and logs every step once, to the end."""
    import json

    from rpg_cli import rundir
    from rpg_cli.store.ingest import metrics_view, stopped_at_end

    run_dir = tmp_path / "runs" / "sw" / "run"
    trainer = verls_own_fit(monkeypatch, run_dir, total=6, request=(3, rundir.PREEMPTED))
    assert trainer.global_steps == 4 and trainer.total_training_steps == 3  # verl counted on past 3, then stopped
    root = rundir.checkpoints_dir(run_dir)
    assert sorted(rundir.find_checkpoints(run_dir)) == [2, 3]
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "3"  # what verl's resume reads
    saved = json.loads((root / "global_step_3" / ref.REFERENCE_STATE).read_text())
    assert saved == {"resets": 1, "born": 3, "ema": 0.0, "kl": 0.0}  # the reset before step 3, as it stood
    assert ("save_reference", (str(root / "global_step_3" / ref.REFERENCE_DIR),)) in trainer.ref_policy_wg.calls
    lines = rundir.metrics_path(run_dir).read_text().splitlines()
    assert [json.loads(line).get("step") for line in lines[:-1]] == [0, 1, 2, 3]
    assert json.loads(lines[-1]) == {"stopped": {"step": 3, "why": "preempted"}}
    assert stopped_at_end(rundir.metrics_path(run_dir)).step == 3

    rundir.clear_stop_request(run_dir)  # what the next attempt's start.py does first
    resumed = verls_own_fit(monkeypatch, run_dir, total=6, resumed=3)
    assert resumed.global_steps == 7 and sorted(rundir.find_checkpoints(run_dir)) == [2, 3, 4, 6]
    lines = rundir.metrics_path(run_dir).read_text().splitlines()
    assert lines[5] == '{"restart": {"keep_through": 3}}' and json.loads(lines[6])["step"] == 3  # the validation
    assert [json.loads(line)["step"] for line in lines[7:]] == [4, 5, 6]
    assert stopped_at_end(rundir.metrics_path(run_dir)) is None
    view = metrics_view(rundir.metrics_path(run_dir).read_text())
    assert sorted(view) == [0, 1, 2, 3, 4, 5, 6]
    assert [view[s]["actor/pg_loss"] for s in range(1, 7)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])


def test_a_stop_asked_on_a_save_step_saves_once_and_one_asked_on_the_last_step_finishes(tmp_path, monkeypatch):
    from rpg_cli import rundir
    from rpg_cli.store.ingest import stopped_at_end

    saves = []
    monkeypatch.setattr(ref.RPGTrainer, "_save_checkpoint_now", lambda self: saves.append(self.global_steps))
    run_dir = tmp_path / "runs" / "sw" / "a"
    verls_own_fit(monkeypatch, run_dir, total=6, request=(4, rundir.CANCELLED))
    assert saves == [2, 4]  # step 4's own checkpoint, not a second one
    assert stopped_at_end(rundir.metrics_path(run_dir)).why == "cancelled"

    saves.clear()
    run_dir = tmp_path / "runs" / "sw" / "b"
    trainer = verls_own_fit(monkeypatch, run_dir, total=3, request=(3, rundir.PREEMPTED))
    assert saves == [2, 3] and trainer.total_training_steps == 3  # the run's end: nothing to stop
    assert stopped_at_end(rundir.metrics_path(run_dir)) is None


def test_a_stop_asked_while_verl_started_ends_before_the_first_step(tmp_path, monkeypatch):
    """A request already there when verl's loop begins (made while the workers and vLLM started): no step runs,
    the checkpoint the attempt resumed from stands, and the stopped line names it."""
    import json

    from rpg_cli import rundir

    run_dir = tmp_path / "runs" / "sw" / "run"
    rundir.make_run_dir(run_dir)
    rundir.request_stop(run_dir, rundir.PREEMPTED)
    trainer = verls_own_fit(monkeypatch, run_dir, total=6, resumed=4)
    assert trainer.global_steps == 5 and rundir.find_checkpoints(run_dir) == {}
    lines = rundir.metrics_path(run_dir).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"data": {"val-core/toy/acc/mean@1": 0.5}, "step": 4},  # the validation before training, of step 4
        {"stopped": {"step": 4, "why": "preempted"}},
    ]
