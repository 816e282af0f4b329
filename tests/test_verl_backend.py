"""verl backend: spec -> verl 0.9.1 overrides, the plugin, the loss call path, a CPU start of main_ppo.

Every check goes through verl's own code: its Hydra config composed with our overrides and validated
the way `main_ppo` does, its `ppo_loss` (what the actor calls) on our registered losses, its optimizer
and reward loaders, and `python -m verl.trainer.main_ppo` itself. Skipped where verl is not installed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import make_spec

verl = pytest.importorskip("verl", reason="the verl extra is not installed")

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from run_inputs import write_inputs  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from rpg_cli.algorithms import LOSS_AGG_MODES, LOSS_NAMES, policy_loss  # noqa: E402
from rpg_cli.backends.verl import diagnose, launch  # noqa: E402
from rpg_cli.cli import app  # noqa: E402
from rpg_cli.orchestration.plan import plan_sweep  # noqa: E402
from rpg_cli.spec import Every, ExperimentSpec, SpecError, load_sweep  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# the losses rpg's plugin registers and runs through verl's path (the others run verl's own function on verl);
# the custom loss is tests/test_baselines_backends.py's
PLUGIN_LOSSES = [n for n in launch.plugin_losses(LOSS_NAMES) if n != launch.CUSTOM_LOSS]
GRIDS = [REPO / "experiments" / "paper-qwen25-7b-instruct.yaml", REPO / "experiments" / "paper-qwen3-4b.yaml"]
VERL_CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")


@pytest.fixture(autouse=True)
def _no_local_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the grids' data/ paths resolve here: never to a checkout's own data files


def compose_verl(spec: ExperimentSpec, run_dir: Path):
    """verl's ppo_trainer config with the spec's overrides, validated as `main_ppo` validates it."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=launch.overrides(spec, run_dir))
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    return cfg


def assert_config_is_the_spec(spec: ExperimentSpec, cfg, run_dir: Path) -> None:
    from verl.trainer.ppo.utils import need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import build_optimizer

    from rpg_cli.backends.verl.optim import AdamWScheduleFree
    from rpg_cli.backends.verl.plugin import RPGPolicyLossConfig

    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # verl's own dataclasses, _target_ included
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    algorithm = omega_conf_to_dataclass(cfg.algorithm)
    loss = actor.policy_loss
    assert isinstance(loss, RPGPolicyLossConfig)
    assert loss.loss_mode == (spec.entry.verl_loss or spec.loss_name)  # verl's own function where verl has it
    assert (loss.beta, loss.clip) == (spec.beta, spec.clip is not None)
    if spec.clip is not None:
        assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (
            spec.clip.eps_low,
            spec.clip.eps_high,
            spec.clip.c,
        )
    assert loss.clipped_weight == (spec.clip is not None and spec.clip.clipped_weight_in_sg)
    assert loss.kl_clamp == spec.kl_clamp
    # the reference: a frozen or reset one is verl's ref worker, started only when something reads it (the
    # reset schedule's KL trigger does); the iterative one is pi_old and needs no worker at all
    separate = spec.reference != "iterative"
    resets = isinstance(spec.reference, Every)
    kl_in_reward = spec.entry.beta_in == "reward" and spec.beta > 0
    custom = spec.loss_name == launch.CUSTOM_LOSS  # its function gets a separate reference's log-probs (no beta)
    kl_in_loss = (spec.entry.beta_in == "loss" and spec.beta > 0) or custom
    assert loss.use_reference == (separate and kl_in_loss)
    assert need_reference_policy(cfg) == (
        separate and (kl_in_loss or kl_in_reward or resets or spec.kl_loss is not None)
    )
    assert cfg.trainer.v1.trainer_mode == "rpg" and launch.reference_from_config(cfg) == spec.reference
    assert algorithm.use_kl_in_reward == kl_in_reward
    if algorithm.use_kl_in_reward:
        assert (algorithm.kl_penalty, algorithm.kl_ctrl.kl_coef) == ("kl", spec.beta)
    if spec.kl_loss is None:
        assert actor.kl_loss_coef == 0.0 and not loss.kl_loss_to_old  # verl's own KL loss never adds to ours
    else:  # verl computes it: toward its ref worker (frozen) or toward pi_old, handed in by the plugin
        assert (actor.kl_loss_type, actor.kl_loss_coef) == (
            launch.KL_LOSS_ESTIMATORS[spec.kl_loss.estimator],
            spec.kl_loss.coef,
        )
        assert actor.use_kl_loss == separate and loss.kl_loss_to_old == (spec.reference == "iterative")
    # lengths, batches, sampling
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (
        spec.max_prompt_length,
        spec.max_response_length,
    )
    assert (rollout.prompt_length, rollout.response_length) == (spec.max_prompt_length, spec.max_response_length)
    assert (cfg.data.train_batch_size, actor.ppo_mini_batch_size, actor.ppo_epochs) == (
        spec.train_batch_size,
        spec.ppo_mini_batch_size,
        spec.ppo_epochs,
    )
    assert (rollout.n, rollout.temperature, rollout.top_p, rollout.name) == (
        spec.rollout_n,
        spec.rollout.temperature,
        spec.rollout.top_p,
        spec.rollout.engine,
    )
    assert (rollout.val_kwargs.n, rollout.val_kwargs.temperature, rollout.val_kwargs.top_p) == (
        spec.val.n,
        spec.val.temperature,
        spec.val.top_p,
    )
    assert cfg.trainer.test_freq == spec.val.every
    assert [Path(f) for f in cfg.data.train_files] == [Path(f).absolute() for f in spec.data.train_files]
    assert [Path(f) for f in cfg.data.val_files] == [Path(f).absolute() for f in spec.data.val_files]
    assert cfg.actor_rollout_ref.model.path == spec.model
    # optimizer: built by verl's own builder from the composed config
    optim = actor.optim
    assert (optim.lr, optim.lr_warmup_steps, optim.weight_decay, optim.clip_grad) == (
        spec.lr,
        spec.lr_warmup_steps,
        spec.weight_decay,
        spec.grad_clip,
    )
    built = build_optimizer([torch.nn.Parameter(torch.zeros(2))], optim)
    assert isinstance(built, AdamWScheduleFree) == (spec.optimizer == "schedule_free")
    assert isinstance(built, torch.optim.AdamW) == (spec.optimizer == "adamw")
    # loss aggregation and the rest of the objective
    assert (actor.loss_agg_mode, actor.entropy_coeff) == (spec.loss_agg_mode, spec.entropy_coeff)
    estimator = {
        "grpo": ("grpo", True),
        "rpg": ("grpo", False),
        "reinforce_pp": ("reinforce_plus_plus", True),
        "reinforce_pp_baseline": ("reinforce_plus_plus_baseline", True),
        "rloo": ("rloo_vectorized", True),  # verl 0.9.1: a group of one gets 0, as rpg
    }[spec.advantage_estimator]
    assert (algorithm.adv_estimator, algorithm.norm_adv_by_std_in_grpo) == estimator
    # Dr. GRPO's constant normaliser: the response budget, not each micro-batch's longest response
    norm = spec.max_response_length if spec.loss_agg_mode == "seq-mean-token-sum-norm" else None
    assert actor.loss_scale_factor == norm
    # DAPO's tricks, on any algorithm: verl's own dynamic sampling and overlong shaping
    assert algorithm.filter_groups.enable == (spec.dynamic_sampling is not None)
    if spec.dynamic_sampling is not None:
        ds = spec.dynamic_sampling
        assert algorithm.filter_groups.metric == "acc"
        assert (algorithm.filter_groups.max_inflight_gen_batches, algorithm.filter_groups.max_num_gen_batches) == (
            ds.gen_batches,
            ds.max_num_gen_batches,
        )
    if spec.overlong is not None:
        assert cfg.reward.reward_manager.name == "dapo"
        shaping = cfg.reward.reward_kwargs.overlong_buffer_cfg
        assert (shaping.enable, shaping.len, shaping.penalty_factor) == (
            True,
            spec.overlong.buffer,
            spec.overlong.penalty_factor,
        )
        assert cfg.reward.reward_kwargs.max_resp_len == spec.max_response_length
    else:
        assert cfg.reward.reward_manager.name == "naive"
    # seeds: data shuffling, rollout sampling, the actor's data loader and engine
    assert cfg.data.shuffle and cfg.data.seed == spec.seed
    assert (rollout.seed, actor.data_loader_seed, actor.fsdp_config.seed) == (spec.seed,) * 3
    # resources, checkpoints, resume, metrics, rewards, plugin
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (spec.resources.nodes, spec.resources.gpus_per_node)
    assert (cfg.trainer.total_training_steps, cfg.trainer.save_freq, cfg.trainer.resume_mode) == (
        spec.steps,
        spec.save_every,
        "auto",
    )
    assert cfg.trainer.default_local_dir == str(run_dir / "checkpoints")
    assert "file" in cfg.trainer.logger
    env_vars = launch.env(spec, run_dir)  # the job's runtime_env, their one home (not verl's ray.init's)
    assert "env_vars" not in cfg.ray_kwargs.ray_init.get("runtime_env", {})
    assert str(run_dir / "metrics.jsonl") == env_vars["VERL_FILE_LOGGER_PATH"]
    assert env_vars["VERL_USE_EXTERNAL_MODULES"] == "rpg_cli.backends.verl.plugin"
    assert cfg.reward.custom_reward_function.path == "pkg://rpg_cli.rewards"


@pytest.mark.slow
@pytest.mark.parametrize("grid", GRIDS, ids=lambda p: p.stem)
def test_every_paper_run_composes_into_a_valid_verl_config_equal_to_its_spec(grid, tmp_path):
    specs = load_sweep(grid).expand()
    assert len(specs) > 10
    for spec in specs:
        run_dir = tmp_path / spec.run_name
        assert_config_is_the_spec(spec, compose_verl(spec, run_dir), run_dir)


def paper_run(**changes) -> ExperimentSpec:
    """A cell of the Qwen3-4B grid with some fields changed."""
    spec = load_sweep(GRIDS[1]).expand()[0]
    return ExperimentSpec.model_validate({**spec.canonical(), **changes})


@pytest.mark.parametrize(
    "changes",
    [
        {"algorithm": "rpg_reinforce", "kl": "fkl", "clip": "off", "optimizer": "schedule_free"},
        {
            "algorithm": "rpg_reinforce",
            "kl": "urkl",
            "clip": {"eps_low": 0.2, "eps_high": 0.28, "clipped_weight_in_sg": True},
        },
        {
            "algorithm": "grpo",
            "kl": "none",
            "kl_correction": True,
            "reference": "frozen",
            "loss_agg_mode": "seq-mean-token-mean",
        },
        {"algorithm": "reinforce_pp", "kl": "none", "reference": "frozen", "beta": 1e-3, "context": "8k"},
        {"algorithm": "dapo", "kl": "none", "beta": 0.0, "dynamic_sampling": None, "overlong": {"buffer": 1024}},
        {
            "algorithm": "reinforce_pp_baseline",
            "kl": "none",
            "beta": 0.0,
            "reference": "frozen",
            "kl_loss": {"estimator": "k3", "coef": 1e-3},
        },
        {"algorithm": "grpo", "kl": "none", "reference": "frozen", "beta": 1e-3, "kl_clamp": False},
        {
            "data": {"train_files": ["odd dir/train=1,b's.parquet"]},
            "resources": {"nodes": 2, "gpus_per_node": 4, "cpus": 4},
        },
        {"reference": {"every": 10}},
        {"reference": {"kl_target": 0.05, "ema": 0.2, "every": 50}, "optimizer": "schedule_free"},
        {"algorithm": "reinforce_pp", "kl": "none", "reference": {"every": 10}, "beta": 1e-3},
        {"algorithm": "rpg", "kl": "urkl", "beta": 0.0, "reference": {"every": 10}},
        {"algorithm": "rpg", "kl": "urkl", "beta": 0.0, "reference": "frozen"},
    ],
    ids=[
        "unclipped-schedule_free",
        "clipped-weight-remark-F2",
        "grpo_corrected",
        "reinforce_pp-8k",
        "dapo-no-dynamic-sampling",
        "rfppb-k3-kl-loss-frozen",
        "grpo-exact-k3",
        "2-nodes-no-val",
        "reference-every",
        "reference-kl-target-and-every",
        "reinforce_pp-reference-every",
        "reset-reference-nothing-reads",
        "frozen-reference-nothing-reads",
    ],
)
def test_off_grid_variants_compose_equal_to_their_spec(changes, tmp_path):
    spec = paper_run(**changes)
    cfg = compose_verl(spec, tmp_path)
    if spec.data.val_files:
        assert_config_is_the_spec(spec, cfg, tmp_path)
    else:  # no validation data: verl never validates
        assert (cfg.trainer.test_freq, cfg.trainer.val_before_train) == (-1, False)
        assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 4)
        assert list(cfg.data.train_files) == [str(Path("odd dir/train=1,b's.parquet").absolute())]  # quoted intact


def test_reward_function_is_loaded_by_verl_and_scores_like_rpg_eval(tmp_path):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from rpg_cli.rewards import compute_score

    reward_fn = get_custom_reward_fn(compose_verl(paper_run(), tmp_path))
    for response, truth in [("so Answer: 42", "42"), ("Answer: 41", "42"), ("no answer", "7")]:
        got = reward_fn(data_source="math_dapo", solution_str=response, ground_truth=truth, extra_info={})
        assert got == compute_score("math_dapo", response, truth)
    assert reward_fn(data_source="math_dapo", solution_str="Answer: 42", ground_truth="42")["score"] == 1.0


def test_schedule_free_steps_in_train_mode_and_exposes_the_averaged_weights():
    from rpg_cli.backends.verl.optim import AdamWScheduleFree, eval_weights

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    opt = AdamWScheduleFree([p], lr=0.1, betas=(0.9, 0.999))
    for _ in range(3):  # verl never calls .train(): stepping must work as built
        p.grad = torch.randn(5)
        opt.step()
    y = p.detach().clone()
    x = eval_weights(y, opt.state[p]["z"], 0.9)
    opt.eval()
    assert torch.allclose(p.detach(), x, atol=1e-6) and not torch.allclose(x, y)
    p.grad = torch.randn(5)
    opt.step()  # back in train mode by itself, from y
    assert opt.param_groups[0]["train_mode"]


# ---------------------------------------------------------------- the plugin, in fresh interpreters


def test_plugin_registers_every_loss_in_a_fresh_interpreter():
    launch.check_install()  # the submit-time check the orchestrator runs: raises with a one-line reason


def test_plugin_check_fails_with_a_readable_reason_when_verl_cannot_load_it(tmp_path):
    broken = tmp_path / "python"  # an interpreter on which `import verl` fails
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named verl' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"plugin does not load: ModuleNotFoundError: No module named verl"):
        diagnose.check_plugin_loads(launch.PLUGIN_MODULE, python=str(broken))


ENTRY_POINT = 'rpg = "rpg_cli.backends.verl.plugin"'  # pyproject: [project.entry-points."verl.plugins"]


def losses_seen_by_a_fresh_verl(extra_path: Path | None = None) -> str:
    code = (
        "import verl; from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R; "
        f"print(all(n in R for n in {launch.plugin_losses(LOSS_NAMES)!r}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_verl_entry_point_discovery_loads_the_plugin_without_env_vars(tmp_path):
    from importlib.metadata import entry_points

    installed = [ep for ep in entry_points(group="verl.plugins") if ep.value == "rpg_cli.backends.verl.plugin"]
    if not installed:
        # the entry point as pyproject declares it, in a distribution's metadata only verl's discovery reads
        dist_info = tmp_path / "rpg_verl_plugin_probe-0.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: rpg-verl-plugin-probe\nVersion: 0\n")
        ini_line = ENTRY_POINT.replace('"', "")  # TOML string -> entry_points.txt
        (dist_info / "entry_points.txt").write_text(f"[verl.plugins]\n{ini_line}\n")
        assert losses_seen_by_a_fresh_verl() == "False"  # nothing else registers them
    assert losses_seen_by_a_fresh_verl(None if installed else tmp_path) == "True"


# ---------------------------------------------------------------- verl's loss call path == policy_loss


_composed_actors: dict = {}


def actor_config(loss_name: str, tmp_path: Path, *, use_reference: bool, clip: bool = True, agg: str = "token-mean"):
    """verl's actor config of a composed run, with another loss plugged in."""
    from verl.utils.config import omega_conf_to_dataclass

    actor = _composed_actors.get("base")
    if actor is None:
        cfg = compose_verl(paper_run(), tmp_path)
        actor = _composed_actors["base"] = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    loss = dataclasses.replace(
        actor.policy_loss, loss_mode=loss_name, beta=0.05, clip=clip, use_reference=use_reference
    )
    return dataclasses.replace(
        actor, policy_loss=loss, loss_agg_mode=agg, use_kl_loss=use_reference, global_batch_info={}
    )


def verl_batch(seed: int, *, dp_size: int = 1, batch_num_tokens=None, global_batch_size=None):
    """A micro-batch as verl's engine hands it to ppo_loss: jagged (no-padding) tensors, and the model's
    log-probs over whole sequences (prompt + response, shifted by one)."""
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    prompt_lens, response_lens = [3, 2, 4, 2], [5, 1, 7, 3]

    def jagged(make):
        return torch.nested.nested_tensor([make(n) for n in response_lens], layout=torch.jagged)

    old = jagged(lambda n: -torch.rand(n, generator=g, dtype=torch.float64) * 3)
    ref = jagged(lambda n: -torch.rand(n, generator=g, dtype=torch.float64) * 3)
    adv = jagged(lambda n: torch.randn(1, generator=g, dtype=torch.float64).expand(n).clone())
    # current log-probs near the old ones, so every clip branch is visited
    new_response = [o + 0.6 * torch.randn(len(o), generator=g, dtype=torch.float64) for o in old.unbind()]
    whole = [
        torch.cat([torch.zeros(p - 1, dtype=torch.float64), r, torch.zeros(1, dtype=torch.float64)])
        for p, r in zip(prompt_lens, new_response)
    ]
    flat = torch.cat(whole).requires_grad_(True)
    data = tu.get_tensordict(
        {
            "prompts": torch.nested.nested_tensor(
                [torch.ones(p, dtype=torch.long) for p in prompt_lens], layout=torch.jagged
            ),
            "responses": torch.nested.nested_tensor(
                [torch.ones(n, dtype=torch.long) for n in response_lens], layout=torch.jagged
            ),
            "response_mask": jagged(lambda n: torch.ones(n, dtype=torch.long)),
            "old_log_probs": old,
            "advantages": adv,
            "ref_log_prob": ref,
        },
        {"dp_size": dp_size, "batch_num_tokens": batch_num_tokens, "global_batch_size": global_batch_size},
    )
    padded = {
        k: torch.nested.to_padded_tensor(v, 0.0)
        for k, v in {"old": old, "ref": ref, "adv": adv, "mask": data["response_mask"]}.items()
    }
    return data, flat, padded


def verl_actor_loss(config, flat, data):
    """What verl's actor calls: engine_workers binds ppo_loss (the plugin's wrapper) into its loss_fn."""
    import verl.workers.engine_workers as engine_workers

    return engine_workers.ppo_loss(config, {"log_probs": flat}, data)


@pytest.mark.parametrize("use_reference", [False, True], ids=["iterative", "frozen"])
@pytest.mark.parametrize("name", PLUGIN_LOSSES)
def test_verl_loss_path_computes_exactly_policy_loss(name, use_reference, tmp_path):
    config = actor_config(name, tmp_path, use_reference=use_reference)
    data, flat, padded = verl_batch(seed=PLUGIN_LOSSES.index(name))
    loss, metrics = verl_actor_loss(config, flat, data)
    (verl_grad,) = torch.autograd.grad(loss, flat)

    # the same tensors, padded by hand: response j of sequence i is predicted at flat offset end_i - len_i - 1 + j
    ends = torch.tensor([3 + 5, 2 + 1, 4 + 7, 2 + 3]).cumsum(0).tolist()
    log_prob = torch.nn.utils.rnn.pad_sequence(
        [flat[e - n - 1 : e - 1] for e, n in zip(ends, [5, 1, 7, 3])], batch_first=True
    )
    ours, _ = policy_loss(
        name,
        log_prob=log_prob,
        old_log_prob=padded["old"],
        advantages=padded["adv"],
        response_mask=padded["mask"].bool(),
        ref_log_prob=padded["ref"] if use_reference else None,
        beta=0.05,
        eps_low=config.clip_ratio_low,
        eps_high=config.clip_ratio_high,
        clip_c=config.clip_ratio_c,
    )
    (our_grad,) = torch.autograd.grad(ours, flat)
    assert torch.equal(loss.detach(), ours.detach())
    assert torch.equal(verl_grad, our_grad) and verl_grad.abs().sum() > 0
    assert {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl"} <= set(metrics)


def test_verl_loss_path_passes_remark_f2_clipped_weight(tmp_path):
    name = "rpg_reinforce_urkl"
    base = actor_config(name, tmp_path, use_reference=False)
    config = dataclasses.replace(base, policy_loss=dataclasses.replace(base.policy_loss, clipped_weight=True))
    data, flat, padded = verl_batch(seed=3)
    loss, _ = verl_actor_loss(config, flat, data)
    plain, _ = verl_actor_loss(base, flat, data)
    ends = torch.tensor([3 + 5, 2 + 1, 4 + 7, 2 + 3]).cumsum(0).tolist()
    log_prob = torch.nn.utils.rnn.pad_sequence(
        [flat[e - n - 1 : e - 1] for e, n in zip(ends, [5, 1, 7, 3])], batch_first=True
    )
    ours, _ = policy_loss(
        name,
        log_prob=log_prob,
        old_log_prob=padded["old"],
        advantages=padded["adv"],
        response_mask=padded["mask"].bool(),
        beta=0.05,
        eps_low=config.clip_ratio_low,
        eps_high=config.clip_ratio_high,
        clip_c=config.clip_ratio_c,
        clipped_weight=True,
    )
    assert torch.equal(loss.detach(), ours.detach())
    (verl_grad,), (our_grad,), (plain_grad,) = (torch.autograd.grad(x, flat) for x in (loss, ours, plain))
    assert torch.equal(verl_grad, our_grad) and not torch.equal(plain_grad, verl_grad)


def test_a_reference_changes_the_loss_and_a_missing_one_is_a_clear_error(tmp_path):
    name = "rpg_urkl"
    data, flat, _ = verl_batch(seed=7)
    with_ref, _ = verl_actor_loss(actor_config(name, tmp_path, use_reference=True), flat, data)
    without, _ = verl_actor_loss(actor_config(name, tmp_path, use_reference=False), flat, data)
    assert not torch.equal(with_ref, without)
    data_without_ref = data.exclude("ref_log_prob")
    config = dataclasses.replace(actor_config(name, tmp_path, use_reference=True), use_kl_loss=False)
    with pytest.raises(ValueError, match="no ref_log_prob"):
        verl_actor_loss(config, flat, data_without_ref)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_loss_toward_pi_old_is_verls_kl_loss_with_old_log_probs_as_its_reference(estimator, tmp_path):
    """REINFORCE++ as the scripts ran it: verl's KL loss toward the iterative reference. The run keeps
    use_kl_loss off (no ref worker); the plugin turns it on for the loss with pi_old as the reference."""
    from rpg_cli.algorithms import kl_penalty_loss

    base = actor_config("ppo", tmp_path, use_reference=False)
    kl_type, coef = launch.KL_LOSS_ESTIMATORS[estimator], 0.05
    ours_config = dataclasses.replace(
        base,
        use_kl_loss=False,
        kl_loss_type=kl_type,
        kl_loss_coef=coef,
        policy_loss=dataclasses.replace(base.policy_loss, kl_loss_to_old=True),
    )
    data, flat, padded = verl_batch(seed=11)
    batch = data.exclude("ref_log_prob")  # no ref worker ran
    loss, metrics = verl_actor_loss(ours_config, flat, batch)
    assert "ref_log_prob" not in batch.keys()  # noqa: SIM118 (TensorDict has no `in`); the caller's micro-batch is left as it was
    # verl's own KL loss, with old_log_probs put in the reference's place by hand
    by_hand = batch.copy()
    by_hand["ref_log_prob"] = batch["old_log_probs"]
    theirs, _ = verl_actor_loss(
        dataclasses.replace(base, use_kl_loss=True, kl_loss_type=kl_type, kl_loss_coef=coef), flat, by_hand
    )
    without, _ = verl_actor_loss(dataclasses.replace(ours_config, policy_loss=base.policy_loss), flat, batch)
    (g_ours,), (g_theirs,), (g_without,) = (torch.autograd.grad(x, flat) for x in (loss, theirs, without))
    assert torch.equal(loss.detach(), theirs.detach()) and torch.equal(g_ours, g_theirs)
    assert not torch.equal(g_ours, g_without) and "kl_loss" in metrics
    # the local backend's computation: policy_loss + coef x kl_penalty_loss toward pi_old
    ends = torch.tensor([3 + 5, 2 + 1, 4 + 7, 2 + 3]).cumsum(0).tolist()
    log_prob = torch.nn.utils.rnn.pad_sequence(
        [flat[e - n - 1 : e - 1] for e, n in zip(ends, [5, 1, 7, 3])], batch_first=True
    )
    mask = padded["mask"].bool()
    pg, _ = policy_loss(
        "ppo",
        log_prob=log_prob,
        old_log_prob=padded["old"],
        advantages=padded["adv"],
        response_mask=mask,
        eps_low=base.clip_ratio_low,
        eps_high=base.clip_ratio_high,
        clip_c=base.clip_ratio_c,
    )
    local = pg + coef * kl_penalty_loss(estimator, log_prob=log_prob, ref_log_prob=padded["old"], response_mask=mask)
    (g_local,) = torch.autograd.grad(local, flat)
    assert torch.allclose(local, loss, rtol=1e-12, atol=1e-15) and torch.allclose(
        g_local, g_ours, rtol=1e-12, atol=1e-15
    )


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("dp_size,tokens,seqs", [(1, None, None), (2, 40, 9), (4, 17, 5)])
def test_global_batch_aggregation_matches_verls_own_ppo_loss(agg, dp_size, tokens, seqs, tmp_path):
    # our `ppo` is verl's `vanilla` dual-clip PPO per token, so under verl's global-batch normalisation
    # (several micro-batches, several data-parallel ranks) both must give the same number
    data, flat, _ = verl_batch(seed=3, dp_size=dp_size, batch_num_tokens=tokens, global_batch_size=seqs)
    ours, _ = verl_actor_loss(actor_config("ppo", tmp_path, use_reference=False, agg=agg), flat, data)
    vanilla_config = actor_config("ppo", tmp_path, use_reference=False, agg=agg)
    from verl.workers.config import PolicyLossConfig

    vanilla_config = dataclasses.replace(vanilla_config, policy_loss=PolicyLossConfig(loss_mode="vanilla"))
    theirs, _ = verl_actor_loss(vanilla_config, flat, data)
    # float64 inputs: the only gap is seq-mean-token-mean's 1e-8 guard, which verl adds to an integer
    # token count in float32 (where it vanishes) and policy_loss in the loss's dtype: ~1e-9 relative
    assert torch.allclose(ours, theirs, rtol=1e-8, atol=0), (ours, theirs)


# ---------------------------------------------------------------- plan time: rejections, dry run


@pytest.mark.parametrize(
    "changes,field,words",
    [
        ({"rollout": {"engine": "hf"}}, "rollout.engine", "allowed with backend verl: vllm"),
        ({"resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 4}}, "resources.gpus_per_node", "verl trains on GPUs"),
        ({"resources": {"nodes": 1, "gpus_per_node": 3, "cpus": 4}}, "train_batch_size", "do not split over 3 GPUs"),
        ({"algorithm": "reinforce_pp", "kl": "none", "beta": 1e-3, "reference": "iterative"}, "reference", "frozen"),
    ],
)
def test_what_verl_cannot_run_is_rejected_at_plan_time(changes, field, words, tmp_path):
    spec = paper_run(**changes)
    with pytest.raises(SpecError) as caught:
        launch.entrypoint(spec, tmp_path)
    assert caught.value.path == field and words in caught.value.reason
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("reference", [{"every": 5}, {"kl_target": 0.05, "ema": 0.2}, {"every": 3, "kl_target": 0.1}])
def test_sweep_dry_run_takes_a_reset_reference_and_shows_its_overrides(reference, tmp_path, monkeypatch):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(json.dumps({"name": "s", "base": {**paper_run().canonical(), "reference": reference}}))
    write_inputs(tmp_path, [paper_run()])
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app, ["sweep", str(sweep), "--dry-run", "--format", "json", "--db", f"sqlite:///{tmp_path / 'none.db'}"]
    )
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    settings = {arg.split("=", 1)[0]: arg.split("=", 1)[1] for arg in launch.overrides_of(row["entrypoint"])}
    assert settings["trainer.v1.trainer_mode"] == "rpg"
    assert settings["+trainer.v1.rpg.reference"] == "reset"
    assert settings["+trainer.v1.rpg.every"] == str(reference.get("every", "null"))
    assert settings["+trainer.v1.rpg.kl_target"] == str(reference.get("kl_target", "null"))
    assert settings["+trainer.v1.rpg.kl_ema"] == str(reference.get("ema", 0.1 if "kl_target" in reference else "null"))
    assert settings["actor_rollout_ref.actor.use_kl_loss"] == "true"  # verl's ref worker runs
    assert settings["+actor_rollout_ref.actor.policy_loss.use_reference"] == "true"  # and the loss uses it


def test_dry_run_json_shows_the_full_verl_entrypoint_and_reserves_no_gpu(tmp_path, monkeypatch):
    write_inputs(tmp_path, GRIDS[1])
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app,
        [
            "sweep",
            str(GRIDS[1]),
            "--backend",
            "verl",
            "--dry-run",
            "--format",
            "json",
            "--db",
            f"sqlite:///{tmp_path / 'none.db'}",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == len(load_sweep(GRIDS[1]).expand())
    for row in rows:
        assert row["entrypoint"][:3] == ["python", "-m", "rpg_cli.backends.verl.start"]
        assert (
            f"actor_rollout_ref.actor.policy_loss.loss_mode={ExperimentSpec.model_validate(row['spec']).loss_name}"
            in row["entrypoint"]
        )
    plans = plan_sweep(load_sweep(GRIDS[1]), tmp_path / "runs")
    assert {(p.num_cpus, p.num_gpus) for p in plans} == {(1.0, 0.0)}
    assert all(p.env["VERL_FILE_LOGGER_PATH"] == str(p.run_dir / "metrics.jsonl") for p in plans)
    assert not (tmp_path / "runs").exists()


def test_planning_verl_runs_imports_neither_verl_nor_torch():
    code = (
        "import sys; from pathlib import Path; from rpg_cli.orchestration.plan import plan_sweep; from rpg_cli.spec import load_sweep; "
        f"plans = plan_sweep(load_sweep({str(GRIDS[0])!r}), Path('runs')); "
        "print(len(plans), [m for m in ('verl', 'torch', 'ray', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    count, imported = out.stdout.split(" ", 1)
    assert int(count) > 20 and imported.strip() == "[]"


# ---------------------------------------------------------------- a real main_ppo start on this CPU machine


def build_tiny_model_and_data(root: Path) -> tuple[Path, Path]:
    """A 1-layer Qwen2 with random weights and a character tokenizer, and a 4-row parquet in verl's format."""
    import pandas as pd
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *"0123456789+=?: Answer"])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}:{% endif %}"
    )
    model_dir = root / "model"
    fast.save_pretrained(model_dir)
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    rows = [
        {
            "data_source": "math_toy",
            "prompt": [{"role": "user", "content": f"{a}+{b}=?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate([(1, 2), (3, 4), (2, 2), (5, 1)])
    ]
    data = root / "train.parquet"
    pd.DataFrame(rows).to_parquet(data)
    return model_dir, data


@pytest.mark.slow
def test_main_ppo_on_a_cpu_machine_passes_validation_and_fails_readably_at_the_gpu_check(tmp_path):
    model_dir, data = build_tiny_model_and_data(tmp_path)
    spec = make_spec(
        beta=1e-4,
        optimizer="schedule_free",
        reference="frozen",
        model=str(model_dir),
        data={"train_files": [str(data)], "val_files": [str(data)]},
        train_batch_size=2,
        ppo_mini_batch_size=1,
        lr=1e-5,
        steps=2,
        save_every=1,
        backend="verl",
        resources={"nodes": 1, "gpus_per_node": 1, "cpus": 1},
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ray_dir = Path(tempfile.mkdtemp(prefix="rpgv"))  # short, unlike tmp_path: Ray's socket paths have a length limit
    command = [
        sys.executable,
        *launch.entrypoint(spec, run_dir)[1:],
        # a small local Ray (verl's transfer queue asks for 8 storage actors of 1 CPU by default)
        "+ray_kwargs.ray_init.num_cpus=4",
        "+ray_kwargs.ray_init.include_dashboard=false",
        "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
        f"+ray_kwargs.ray_init._temp_dir={ray_dir}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    env = {**os.environ, **launch.env(spec, run_dir)}
    proc = subprocess.Popen(
        command,
        cwd=run_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=170)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the process group this test started, Ray's daemons included
        log, _ = proc.communicate()
        pytest.fail("main_ppo did not stop at the GPU check in time:\n" + log[-3000:])
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert proc.returncode != 0
    assert "[validate_config] All configuration checks passed successfully!" in log
    assert "Total available GPUs 0 is less than total desired GPUs 1" in log, log[-3000:]
    reason = diagnose.failure_reason(log[-8000:])
    assert reason.startswith("verl needs 1 GPU(s) but the Ray cluster has 0 free") and "\n" not in reason


def test_failure_reason_reads_the_last_error_of_a_log():
    log = "step 1\nTraceback (most recent call last):\n  File 'x.py'\nKeyError: 'actor'\n\nSet HYDRA_FULL_ERROR=1\n"
    assert diagnose.failure_reason(log) == "KeyError: 'actor'"
    assert "rpg plugin did not load" in diagnose.failure_reason(
        "ValueError: Unsupported loss mode: rpg_urkl. Supported"
    )
    assert diagnose.failure_reason("") == "the job failed without output"
    assert diagnose.failure_reason("just a last line\n") == "just a last line"
