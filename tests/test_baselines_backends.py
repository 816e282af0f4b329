"""Today's baselines (MATH.md section 9), rollout correction (section 10) and a researcher's own loss (section 11)
on both backends.

verl: each algorithm's overrides carry verl's own loss mode, estimator, temperatures and KL settings exactly, and
verl's Hydra config takes them (composed and validated as `main_ppo` does); rollout correction becomes verl's
`algorithm.rollout_correction`, whose weights reach every loss through verl's own `ppo_loss`; a custom loss runs
through rpg's plugin as the local path runs it. Local: each new algorithm trains two steps on a tiny toy task, a
custom loss among them, and rollout correction changes nothing there. (verl's worker on the CPU with a custom loss:
tests/test_verl_workers_cpu.py.)
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import spec_dict

verl = pytest.importorskip("verl", reason="the verl extra is not installed")

import torch  # noqa: E402
from test_verl_backend import assert_config_is_the_spec, compose_verl, paper_run, verl_actor_loss, verl_batch  # noqa: E402
from verl_worker_harness import CUSTOM_LOSS_MODULE as CUSTOM_MODULE  # noqa: E402

from rpg_cli.algorithms import LOSS_NAMES, policy_loss  # noqa: E402
from rpg_cli.algorithms.table import ADVANTAGES  # noqa: E402
from rpg_cli.backends.verl import launch  # noqa: E402
from rpg_cli.spec import ExperimentSpec  # noqa: E402

# a researcher's loss that reads every keyword rpg passes (the worker harness's), under a module name of its own
CUSTOM = "rpg_baselines_test_loss:capped_pg"
SETTINGS = {"cap": 1.1, "beta": 0.5}


@pytest.fixture(scope="module")
def custom_module(tmp_path_factory) -> Iterator[Path]:
    """The loss's module in a directory of its own, on sys.path (as a job's PYTHONPATH puts it), for this module's
    tests (once imported, the module stays in sys.modules)."""
    root = tmp_path_factory.mktemp("losses")
    (root / "rpg_baselines_test_loss.py").write_text(CUSTOM_MODULE)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        yield root


# fields an algorithm may take or not (the table's NEUTRAL ones, its defaults): left out so the table fills them
ALGORITHM_FIELDS = ("kl", "beta", "clip", "reference", "kl_loss", "kl_correction", "kl_clamp", "loss_agg_mode")
ALGORITHM_FIELDS += ("dynamic_sampling", "overlong")


def baseline(**changes) -> ExperimentSpec:
    """A cell of the Qwen3-4B grid as another algorithm: its algorithm's fields from the table, then `changes`."""
    base = {k: v for k, v in paper_run().canonical().items() if k not in ALGORITHM_FIELDS}
    return ExperimentSpec.model_validate({**base, **changes})


# ---------------------------------------------------------------- verl: each algorithm's overrides

CLIP = {"eps_low": 0.2, "eps_high": 0.28}
VERL_CASES = {
    # name: (spec changes, expected: loss_mode, (adv_estimator, norm_by_std), loss_agg_mode, clip low/high)
    "dr_grpo": (
        dict(algorithm="dr_grpo", clip=CLIP),
        ("ppo", ("grpo", False), "seq-mean-token-sum-norm", (0.2, 0.28)),
    ),
    "rloo-kl-in-reward": (
        dict(algorithm="rloo", clip=CLIP, beta=1e-3, reference="frozen"),
        ("ppo", ("rloo_vectorized", True), "token-mean", (0.2, 0.28)),
    ),
    "rloo-kl-loss-iterative": (
        dict(algorithm="rloo", clip=CLIP, beta=0.0, kl_loss={"estimator": "k1", "coef": 1e-3}),
        ("ppo", ("rloo_vectorized", True), "token-mean", (0.2, 0.28)),
    ),
    "gspo": (dict(algorithm="gspo"), ("gspo", ("grpo", True), "seq-mean-token-mean", (3e-4, 4e-4))),
    "gspo-kl-loss-frozen": (
        dict(algorithm="gspo", reference="frozen", kl_loss={"estimator": "k3", "coef": 1e-3}),
        ("gspo", ("grpo", True), "seq-mean-token-mean", (3e-4, 4e-4)),
    ),
    "cispo": (dict(algorithm="cispo"), ("cispo", ("grpo", True), "token-mean", (1 - 1e-9, 0.2))),
    "cispo-kl-loss-iterative": (
        dict(algorithm="cispo", kl_loss={"estimator": "k2", "coef": 1e-2}),
        ("cispo", ("grpo", True), "token-mean", (1 - 1e-9, 0.2)),
    ),
    "gmpo": (dict(algorithm="gmpo"), ("gmpo", ("grpo", True), "seq-mean-token-mean", (0.4, 0.4))),
    "sapo": (dict(algorithm="sapo"), ("sapo", ("grpo", True), "seq-mean-token-mean", None)),
    "sapo-own-temperatures": (
        dict(algorithm="sapo", sapo={"tau_pos": 1.5, "tau_neg": 2.5}),
        ("sapo", ("grpo", True), "seq-mean-token-mean", None),
    ),
}


@pytest.mark.parametrize("case", list(VERL_CASES))
def test_each_baseline_becomes_verls_own_loss_estimator_and_settings(case, tmp_path):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    changes, (loss_mode, estimator, agg, clip) = VERL_CASES[case]
    spec = baseline(**changes)
    cfg = compose_verl(spec, tmp_path)
    assert_config_is_the_spec(spec, cfg, tmp_path)  # every field, as for the paper's runs
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    algorithm = omega_conf_to_dataclass(cfg.algorithm)
    assert actor.policy_loss.loss_mode == loss_mode
    assert (algorithm.adv_estimator, algorithm.norm_adv_by_std_in_grpo) == estimator == ADVANTAGES[spec.entry.advantage]
    assert actor.loss_agg_mode == agg
    if clip is not None:
        assert (actor.clip_ratio_low, actor.clip_ratio_high) == pytest.approx(clip, rel=1e-12)
    # where the table names verl's function, verl's own math runs (not a plugin loss of the same name)
    fn = get_policy_loss_fn(loss_mode)
    owner = "verl.trainer.ppo.core_algos" if spec.entry.verl_loss else "rpg_cli.backends.verl.plugin"
    assert fn.__module__ == owner
    if spec.sapo is not None:  # verl's sapo reads the actor's temperatures
        assert (actor.tau_pos, actor.tau_neg) == (spec.sapo.tau_pos, spec.sapo.tau_neg)
    else:
        assert (actor.tau_pos, actor.tau_neg) == (1.0, 1.05)  # verl's defaults, unused
    # Dr. GRPO divides by a constant: the response budget
    assert actor.loss_scale_factor == (spec.max_response_length if agg == "seq-mean-token-sum-norm" else None)
    if spec.kl_loss is not None:  # a KL loss on any algorithm that takes one: verl's own
        assert (actor.kl_loss_type, actor.kl_loss_coef) == (
            launch.KL_LOSS_ESTIMATORS[spec.kl_loss.estimator],
            spec.kl_loss.coef,
        )
        assert actor.use_kl_loss == (spec.reference != "iterative")
        assert actor.policy_loss.kl_loss_to_old == (spec.reference == "iterative")
    assert algorithm.use_kl_in_reward == (spec.entry.beta_in == "reward" and spec.beta > 0)


BASELINE_GRIDS = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("baselines-*.yaml"))


@pytest.mark.parametrize("grid", BASELINE_GRIDS, ids=lambda p: p.stem)
def test_every_baseline_grid_run_composes_into_a_valid_verl_config_equal_to_its_spec(grid, tmp_path, monkeypatch):
    from rpg_cli.spec import load_sweep

    monkeypatch.chdir(tmp_path)  # the grids' data/ paths resolve here: never to a checkout's own data files
    specs = load_sweep(grid).expand()
    assert {s.algorithm for s in specs} >= {"dr_grpo", "rloo", "gspo", "cispo", "gmpo", "sapo"}
    for spec in specs:
        run_dir = tmp_path / spec.run_name
        assert_config_is_the_spec(spec, compose_verl(spec, run_dir), run_dir)


def test_rloo_folds_beta_into_the_reward_only_toward_a_separate_reference(tmp_path):
    from rpg_cli.spec import SpecError

    with pytest.raises(SpecError) as caught:
        launch.entrypoint(baseline(algorithm="rloo", clip=CLIP, beta=1e-3, reference="iterative"), tmp_path)
    assert caught.value.path == "reference"


def test_the_plugin_registers_rpgs_losses_and_leaves_verls_own_to_verl():
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    from rpg_cli.backends.verl import plugin

    assert {"gspo", "cispo", "sapo"} == launch.VERL_OWN_LOSSES
    assert set(plugin.registered_names()) == set(launch.plugin_losses(LOSS_NAMES))
    assert launch.CUSTOM_LOSS in plugin.registered_names() and "gmpo" in plugin.registered_names()
    for name in launch.VERL_OWN_LOSSES:
        assert POLICY_LOSS_REGISTRY[name].__module__ == "verl.trainer.ppo.core_algos"


# ---------------------------------------------------------------- verl: rollout correction

CORRECTIONS = {
    "token-is": {"rollout_is": "token", "rollout_is_threshold": 2.5},
    "sequence-is-normalised": {"rollout_is": "sequence", "rollout_is_batch_normalize": True},
    "rejection-only": {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"},
    "both": {"rollout_is": "token", "rollout_rs": "seq_mean_k3,token_k1", "rollout_rs_threshold": "0.01,0.5_2.0"},
}


@pytest.mark.parametrize("correction", list(CORRECTIONS))
@pytest.mark.parametrize("algorithm", ["rpg", "gspo", "sapo", "rloo"])
def test_rollout_correction_is_verls_with_the_spec_values_on_every_algorithm(algorithm, correction, tmp_path):
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.utils.config import omega_conf_to_dataclass

    block = CORRECTIONS[correction]
    changes = dict(paper_run().canonical()) if algorithm == "rpg" else {}
    changes.update(algorithm=algorithm, rollout_correction=block)
    if algorithm == "rloo":
        changes.update(clip=CLIP, beta=0.0)
    spec = ExperimentSpec.model_validate(changes) if algorithm == "rpg" else baseline(**changes)
    cfg = compose_verl(spec, tmp_path)
    assert_config_is_the_spec(spec, cfg, tmp_path)
    # verl reads it as a mapping (config.algorithm.get("rollout_correction")); its dataclass takes the same values
    correction_config = omega_conf_to_dataclass(cfg.algorithm).rollout_correction
    assert {k: correction_config[k] for k in spec.rollout_correction.model_dump()} == (
        spec.rollout_correction.model_dump()
    )
    assert RolloutCorrectionConfig(**correction_config).rollout_is == block.get("rollout_is")
    assert correction_config["bypass_mode"] is False  # decoupled: verl recomputes pi_old and corrects toward it
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True  # vLLM's log-probs, which the weights need
    # verl's own helper takes the composed settings: weights where rollout_is is set, rejection where rollout_rs is
    weights, mask = verl_rollout_correction(cfg.algorithm.rollout_correction)
    assert (weights is not None) == (block.get("rollout_is") is not None)
    assert bool((mask == 0).any()) == (block.get("rollout_rs") is not None)


def verl_rollout_correction(config):
    """verl's rollout correction (trainer_base._compute_advantage calls it) on a batch whose rollout log-probs
    stray from pi_old: its weights (None: off) and the response mask after rejection."""
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 9, generator=g) * 2
    rollout = old + torch.randn(6, 9, generator=g) * torch.linspace(0.01, 3.0, 6).unsqueeze(-1)
    mask = torch.ones(6, 9)
    batch = DataProto(
        batch=TensorDict({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask}, batch_size=[6])
    )
    out, metrics = compute_rollout_correction_and_add_to_batch(batch, config)
    assert metrics and all(k.startswith("rollout_corr/") for k in metrics)
    return out.batch.get("rollout_is_weights", None), out.batch["response_mask"]


PLUGIN_LOSSES = [n for n in launch.plugin_losses(LOSS_NAMES) if n != launch.CUSTOM_LOSS]


def actor_config(loss_mode: str, tmp_path: Path, *, use_reference: bool = False, agg: str = "token-mean", **extra):
    """verl's actor config of a composed run, another loss plugged in (and the plugin's settings in `extra`)."""
    from verl.utils.config import omega_conf_to_dataclass

    actor = omega_conf_to_dataclass(compose_verl(paper_run(), tmp_path).actor_rollout_ref.actor)
    loss = dataclasses.replace(actor.policy_loss, loss_mode=loss_mode, beta=0.05, use_reference=use_reference, **extra)
    return dataclasses.replace(
        actor, policy_loss=loss, loss_agg_mode=agg, use_kl_loss=use_reference, global_batch_info={}
    )


def padded_log_prob(flat: torch.Tensor) -> torch.Tensor:
    """verl_batch's response log-probs, padded by hand (response j of sequence i is at flat end_i - len_i - 1 + j)."""
    ends = torch.tensor([3 + 5, 2 + 1, 4 + 7, 2 + 3]).cumsum(0).tolist()
    return torch.nn.utils.rnn.pad_sequence(
        [flat[e - n - 1 : e - 1] for e, n in zip(ends, [5, 1, 7, 3])], batch_first=True
    )


def with_weights(data, padded, seed: int):
    """verl_batch's micro-batch with rollout correction's weights (jagged, one per response token)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 1, 7, 3]
    weights = [0.3 + 1.5 * torch.rand(n, generator=g, dtype=torch.float64) for n in lengths]
    data = data.copy()
    data["rollout_is_weights"] = torch.nested.nested_tensor(weights, layout=torch.jagged)
    return data, torch.nested.to_padded_tensor(data["rollout_is_weights"], 0.0)


def test_rollout_weights_multiply_rpgs_per_token_loss_as_verl_multiplies_its_own(tmp_path):
    """rpg's `ppo` is verl's `vanilla` per token: with rollout correction's weights in the batch both give the
    same loss and gradient through verl's ppo_loss, the weights applied before aggregation."""
    from verl.workers.config import PolicyLossConfig

    data, flat, padded = verl_batch(seed=4)
    weighted, _ = with_weights(data, padded, seed=4)
    ours, _ = verl_actor_loss(actor_config("ppo", tmp_path), flat, weighted)
    vanilla = dataclasses.replace(actor_config("ppo", tmp_path), policy_loss=PolicyLossConfig(loss_mode="vanilla"))
    theirs, _ = verl_actor_loss(vanilla, flat, weighted)
    plain, _ = verl_actor_loss(actor_config("ppo", tmp_path), flat, data)
    (g_ours,), (g_theirs,), (g_plain,) = (torch.autograd.grad(x, flat) for x in (ours, theirs, plain))
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=0) and torch.allclose(g_ours, g_theirs, rtol=1e-12, atol=0)
    assert not torch.allclose(g_ours, g_plain)  # the weights changed something


@pytest.mark.parametrize("name", PLUGIN_LOSSES)
def test_every_plugin_loss_takes_the_rollout_weights_policy_loss_takes(name, tmp_path):
    data, flat, padded = verl_batch(seed=PLUGIN_LOSSES.index(name))
    weighted, weights = with_weights(data, padded, seed=PLUGIN_LOSSES.index(name))
    config = actor_config(name, tmp_path)
    loss, _ = verl_actor_loss(config, flat, weighted)
    ours, _ = policy_loss(
        name,
        log_prob=padded_log_prob(flat),
        old_log_prob=padded["old"],
        advantages=padded["adv"],
        response_mask=padded["mask"].bool(),
        beta=0.05,
        eps_low=config.clip_ratio_low,
        eps_high=config.clip_ratio_high,
        clip_c=config.clip_ratio_c,
        weights=weights,
    )
    (g_verl,), (g_ours,) = (torch.autograd.grad(x, flat) for x in (loss, ours))
    assert torch.equal(loss.detach(), ours.detach()) and torch.equal(g_verl, g_ours)


@pytest.mark.parametrize("name", [*PLUGIN_LOSSES, launch.CUSTOM_LOSS])
def test_a_micro_batch_whose_every_token_was_rejected_adds_nothing(name, tmp_path, custom_module):
    """Rejection sampling (rollout_rs) zeroes response_mask: a micro-batch left with no token gives loss 0 and a
    zero gradient (its backward still runs, as FSDP needs), not an error."""
    extra = dict(custom=CUSTOM, custom_settings=SETTINGS) if name == launch.CUSTOM_LOSS else {}
    data, flat, _ = verl_batch(seed=2)
    data = data.copy()
    data["response_mask"] = torch.nested.nested_tensor(
        [torch.zeros(n, dtype=torch.long) for n in [5, 1, 7, 3]], layout=torch.jagged
    )
    loss, _ = verl_actor_loss(actor_config(name, tmp_path, **extra), flat, data)
    (grad,) = torch.autograd.grad(loss, flat)
    assert float(loss) == 0.0 and not grad.any()


# ---------------------------------------------------------------- verl: a custom loss through the plugin


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "rollout-weights"])
@pytest.mark.parametrize("use_reference", [False, True], ids=["iterative", "frozen"])
def test_the_plugins_custom_loss_is_the_local_paths_custom_policy_loss(
    use_reference, weighted, tmp_path, custom_module
):
    """verl's actor path (engine_workers' ppo_loss, the plugin's `custom`) on a jagged micro-batch: value,
    gradient and the function's own metric as `custom_policy_loss` gives them on the same padded tensors, with
    the settings, the separate reference's log-probs (None for the iterative one) and rollout weights."""
    from rpg_cli.algorithms.custom import custom_policy_loss
    from rpg_cli.custom_loss import load

    data, flat, padded = verl_batch(seed=9)
    weights = None
    if weighted:
        data, weights = with_weights(data, padded, seed=9)
    config = actor_config(
        launch.CUSTOM_LOSS, tmp_path, use_reference=use_reference, custom=CUSTOM, custom_settings=SETTINGS
    )
    loss, metrics = verl_actor_loss(config, flat, data)
    local, local_metrics = custom_policy_loss(
        load(CUSTOM),
        log_prob=padded_log_prob(flat),
        old_log_prob=padded["old"],
        advantages=padded["adv"],
        response_mask=padded["mask"].bool(),
        ref_log_prob=padded["ref"] if use_reference else None,
        settings=SETTINGS,
        weights=weights,
    )
    (g_verl,), (g_local,) = (torch.autograd.grad(x, flat) for x in (loss, local))
    assert torch.equal(loss.detach(), local.detach()) and torch.equal(g_verl, g_local) and g_local.any()
    assert metrics["actor/capped_frac"].values == [local_metrics["capped_frac"]]  # its own, as actor/<name>
    assert "actor/ppo_kl" in metrics


def test_a_custom_specs_overrides_name_its_function_settings_and_reference(tmp_path, custom_module):
    from verl.utils.config import omega_conf_to_dataclass

    from rpg_cli.backends.verl.plugin import RPGPolicyLossConfig

    settings = {"cap": 1.5, "name": "it's a:b", "nested": {"k": [1, 2.5, None, True]}}
    for reference in ("iterative", "frozen", {"every": 5}):
        spec = baseline(algorithm="custom", loss=CUSTOM, loss_settings=settings, reference=reference)
        cfg = compose_verl(spec, tmp_path)
        assert_config_is_the_spec(spec, cfg, tmp_path)
        loss = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
        assert isinstance(loss, RPGPolicyLossConfig) and loss.loss_mode == launch.CUSTOM_LOSS == spec.loss_name
        assert loss.custom == CUSTOM and dict(loss.custom_settings) == settings
        # a separate reference's log-probs reach the function (it has no beta: a KL term is its own)
        assert loss.use_reference == (reference != "iterative") and loss.beta == 0.0


def test_a_custom_jobs_pythonpath_leads_with_the_modules_directory(tmp_path, custom_module):
    from rpg_cli.backends.local import launch as local_launch

    spec = baseline(algorithm="custom", loss=CUSTOM)
    assert launch.env(spec, tmp_path)["PYTHONPATH"] == f"{custom_module}:${{PYTHONPATH}}"  # Ray expands the node's
    own = baseline(algorithm="custom", loss=CUSTOM, verl={"env": {"PYTHONPATH": "/shared/lab"}})
    assert launch.env(own, tmp_path)["PYTHONPATH"] == f"{custom_module}:/shared/lab"  # the spec's own, kept
    assert "PYTHONPATH" not in launch.env(paper_run(), tmp_path)
    local = local_spec(algorithm="custom", loss=CUSTOM)
    assert local_launch.env(local, tmp_path) == {"PYTHONPATH": f"{custom_module}:${{PYTHONPATH}}"}
    assert not [f for f in launch.preflight(spec) if f.field == "loss"]


def test_a_custom_module_that_cannot_be_found_is_one_line_before_any_gpu(tmp_path):
    """A spec.json read back keeps its loss_source (its run id), so it validates where the module is gone: both
    backends' preflight (the dry run's) names the problem and the fix in one line, and the job's env leaves
    PYTHONPATH alone."""
    from rpg_cli.backends.local import launch as local_launch
    from rpg_cli.backends.local.preflight import BackendError, check

    target = "no_such_rpg_module.losses:fn"
    spec = baseline(algorithm="custom", loss=target, loss_source="0123456789ab")
    (finding,) = [f for f in launch.preflight(spec) if f.field == "loss"]
    assert finding.error and "cannot find module" in finding.message and "PYTHONPATH" in finding.message
    assert "\n" not in str(finding) and "PYTHONPATH" not in launch.env(spec, tmp_path)
    local = local_spec(algorithm="custom", loss=target, loss_source="0123456789ab")
    (finding,) = [f for f in local_launch.preflight(local) if f.field == "loss"]
    assert finding.error and "cannot find module" in finding.message
    path = tmp_path / "run" / "spec.json"
    path.parent.mkdir()
    path.write_text(json.dumps(local.canonical()))
    with pytest.raises(BackendError, match=r"^loss: cannot find module") as caught:
        check(path)
    assert "\n" not in str(caught.value)


# ---------------------------------------------------------------- local: each new algorithm trains


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The toy task with the toy's tokenizer and a random (not warmed-up) model: enough to take steps, in seconds."""
    from rpg_cli.datasets.pipeline import rows_to_batch, write_verl_parquet
    from rpg_cli.datasets.toy import ToyPaths, build_model, build_tokenizer, split, toy_row

    root = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=0)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    paths = ToyPaths(root / "model", root / "train.parquet", root / "val.parquet")
    for path, part in zip((paths.train, paths.val), split()):
        write_verl_parquet([rows_to_batch([toy_row(q, a, i) for i, (q, a) in enumerate(part)])], path)
    return paths


def local_spec(**changes) -> ExperimentSpec:
    """conftest's smallest local run as another algorithm: its algorithm's fields from the table, then `changes`."""
    base = {k: v for k, v in spec_dict().items() if k not in ALGORITHM_FIELDS}
    return ExperimentSpec.model_validate({**base, **changes})


def local_run(run_dir: Path, tiny, **changes) -> list[dict]:
    """Two steps of 2 prompts x 4 responses in 2 mini-batches (the second off-policy), no validation; the lines."""
    from rpg_cli.backends.local.trainer import main as run_trainer
    from rpg_cli.store.ingest import metrics_view

    spec = local_spec(
        **{
            "model": str(tiny.model),
            "data": {"train_files": [str(tiny.train)]},
            "train_batch_size": 2,
            "rollout_n": 4,
            "ppo_mini_batch_size": 1,
            "lr": 1e-3,
            "steps": 2,
            "save_every": 2,
            "context": {"prompt": 8, "response": 16},
            "rollout": {"temperature": 1.0, "top_p": 1.0, "engine": "hf"},
            **changes,
        }
    )
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec.canonical()))
    assert run_trainer(str(run_dir / "spec.json")) == 0
    lines = [
        {"step": step, "data": data} for step, data in metrics_view((run_dir / "metrics.jsonl").read_text()).items()
    ]
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert all(math.isfinite(v) for v in line["data"].values()), line
    return lines


LOCAL_CASES = {
    "dr_grpo": dict(algorithm="dr_grpo", clip=CLIP),
    "rloo-kl-in-reward": dict(algorithm="rloo", clip=CLIP, beta=0.05, reference="frozen"),
    "gspo-kl-loss": dict(algorithm="gspo", kl_loss={"estimator": "k3", "coef": 0.1}),
    "cispo": dict(algorithm="cispo"),
    "gmpo": dict(algorithm="gmpo"),
    "sapo": dict(algorithm="sapo", sapo={"tau_pos": 1.5, "tau_neg": 2.5}),
}


@pytest.mark.parametrize("case", list(LOCAL_CASES))
def test_the_local_backend_trains_each_new_algorithm(case, tiny, tmp_path):
    lines = local_run(tmp_path / case, tiny, **LOCAL_CASES[case])
    last = lines[-1]["data"]
    assert {"actor/pg_loss", "actor/ppo_kl", "actor/grad_norm", "critic/score/mean"} <= set(last)
    if "kl_loss" in LOCAL_CASES[case]:  # a KL loss on any algorithm that takes one
        assert "actor/kl_loss" in last
    if case.startswith("rloo"):  # beta in the reward: the table's beta_in, not a list of names
        assert last["actor/reward_kl_penalty_coeff"] == 0.05 and "actor/reward_kl_penalty" in last


def test_the_local_backend_runs_a_custom_loss_with_its_settings_and_reference(tiny, tmp_path, custom_module):
    lines = local_run(
        tmp_path / "custom",
        tiny,
        algorithm="custom",
        loss=CUSTOM,
        loss_settings=SETTINGS,
        reference="frozen",
    )
    for line in lines:
        assert 0.0 <= line["data"]["actor/capped_frac"] <= 1.0  # the function's own metric, as on verl
        assert {"actor/pg_loss", "actor/ppo_kl", "actor/ratio_mean"} <= set(line["data"])


def test_rollout_correction_is_accepted_and_changes_nothing_on_the_local_backend(tiny, tmp_path):
    """Rollout and training log-probs come from one model in one process: every weight is 1, nothing is rejected,
    so the run is the run without it, number for number."""
    block = {"rollout_is": "token", "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}
    plain = local_run(tmp_path / "plain", tiny, algorithm="gspo")
    corrected = local_run(tmp_path / "corrected", tiny, algorithm="gspo", rollout_correction=block)
    for a, b in zip(plain, corrected):
        same = {k: v for k, v in a["data"].items() if not k.startswith(("timing_s/", "perf/"))}
        assert same == {k: b["data"][k] for k in same}
        assert not [k for k in b["data"] if "rollout_corr" in k]  # nothing logged that was not done


def test_the_local_advantage_table_covers_every_estimator():
    from rpg_cli.algorithms.advantages import ESTIMATORS

    assert set(ESTIMATORS) == set(ADVANTAGES)


def test_dr_grpo_on_the_local_backend_divides_by_the_response_budget(tiny, tmp_path):
    """Under seq-mean-token-sum-norm the micro-batch's tensors are padded to the response budget, so the loss is
    each sequence's token sum over that constant (verl's loss_scale_factor), whatever the batch's longest is."""
    from rpg_cli.backends.local.preflight import check
    from rpg_cli.backends.local.rollout import Rollouts
    from rpg_cli.backends.local.trainer import Trainer

    spec = local_spec(
        algorithm="dr_grpo",
        clip=CLIP,
        model=str(tiny.model),
        data={"train_files": [str(tiny.train)]},
        context={"prompt": 8, "response": 16},
        rollout={"temperature": 1.0, "top_p": 1.0, "engine": "hf"},
    )
    (tmp_path / "spec.json").write_text(json.dumps(spec.canonical()))
    trainer = Trainer(check(tmp_path / "spec.json"))
    g = torch.Generator().manual_seed(0)
    width = 5
    r = Rollouts(torch.ones(2, 6, dtype=torch.long), torch.ones(2, 6, dtype=torch.long), None, None, None, [])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    tensors = dict(
        log_prob=(-torch.rand(2, width, generator=g)).requires_grad_(True),
        old_log_prob=-torch.rand(2, width, generator=g),
        advantages=torch.tensor([[1.0] * width, [-0.5] * width]),
        response_mask=mask,
        ref_log_prob=None,
    )
    budget = trainer.max_new_tokens(r)
    padded = trainer.normalised_width(r, **tensors)
    assert budget == 16 and padded["response_mask"].shape == (2, budget) and padded["ref_log_prob"] is None
    loss, _ = trainer.policy_loss(**padded)
    unpadded, _ = trainer.policy_loss(**tensors)  # aggregate's default: the tensors' width
    assert torch.allclose(loss * budget, unpadded * width)
