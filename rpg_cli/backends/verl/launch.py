"""How a job starts the verl backend: spec -> `python -m verl.trainer.main_ppo <hydra overrides>`, behind
`python -m rpg_cli.backends.verl.start`, which first waits for the run's GPUs (start.py).

Pure python (no verl, torch or ray import), so `rpg sweep --dry-run` stays fast. Targets verl 0.9.1:
every key below exists in its `ppo_trainer.yaml` (or is added with `+`), which tests/test_verl_backend.py
checks by composing that config with these overrides and validating it the way `main_ppo` does.

Spec fields verl 0.9.1 cannot honour are rejected here, at plan time, as a `SpecError` naming the field.

What each algorithm becomes on verl is read from its entry in `rpg_cli.algorithms.table` (no list of algorithm
names here): its advantage estimator (`ADVANTAGES`), where beta goes (`beta_in`: verl's KL-in-reward, or rpg's loss
toward a separate reference), and its loss: verl's own registered function where the table says so (`verl_loss`:
GSPO, CISPO, SAPO), else rpg's plugin (`spec.loss_name`, `plugin.py`). A spec's `rollout_correction`
becomes verl's `algorithm.rollout_correction` (MATH.md section 10), on every algorithm. A custom loss
(`algorithm: custom`, MATH.md section 11) is imported in every verl process from the job's PYTHONPATH, which
`env` leads with the module's directory: on a multi-node cluster that directory must be on a filesystem every
node mounts at the same path (as the data and the run directory are).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpg_cli import custom_loss, rundir
from rpg_cli.algorithms.table import ADVANTAGES, ALGORITHMS
from rpg_cli.backends.verl import diagnose
from rpg_cli.backends.verl.footprint import disk, gpu_memory, token_budgets
from rpg_cli.inputs import Finding, check_run, count_problems
from rpg_cli.model_shape import model_shape
from rpg_cli.spec import Every, SpecError, override_key
from rpg_cli.trackers import TRACKERS
from rpg_cli.trackers.runs import enabled, run_info

# the spec's KL-loss estimators -> verl 0.9.1's kl_loss_type (core_algos.kl_penalty_forward), which
# rpg_cli.algorithms.kl.kl_loss_term computes alike
KL_LOSS_ESTIMATORS = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}

if TYPE_CHECKING:
    from rpg_cli.spec import ExperimentSpec

PLUGIN_MODULE = "rpg_cli.backends.verl.plugin"
POLICY_LOSS_CONFIG = f"{PLUGIN_MODULE}.RPGPolicyLossConfig"
OPTIMIZER_MODULE = "rpg_cli.backends.verl.optim"
REWARD_FUNCTION = "pkg://rpg_cli.rewards"  # verl's load_module imports `pkg://` paths as modules
# rpg's verl trainer (reference.RPGTrainer, registered with verl's register_trainer) and its settings, where
# verl keeps each trainer mode's own (trainer.v1.<mode>)
RPG_TRAINER = "rpg"
REFERENCE_SETTINGS = f"trainer.v1.{RPG_TRAINER}"

# the policy losses the table runs with verl's own function on verl (`Algorithm.verl_loss`): rpg's plugin leaves
# these names to verl (verl 0.9.1 registers gspo, cispo and sapo itself) and registers every other `LOSS_NAMES`
VERL_OWN_LOSSES = frozenset(a.loss for a in ALGORITHMS.values() if a.verl_loss is not None)
CUSTOM_LOSS = ALGORITHMS["custom"].loss  # the plugin's loss that runs the spec's own function (MATH.md section 11)


ENTRYPOINT = ("python", "-m", "rpg_cli.backends.verl.start")  # waits for the run's GPUs, then runs main_ppo

# What the registry asks (rpg_cli.backends.registry.Backend), per the README's "What the paper grids need": a run
# needs 3 CPUs per GPU plus 11 on each node (its placement group's {CPU: 3, GPU: 1} bundles, the transfer queue's 9
# actors, the job's entrypoint and verl's task runner) and the whole node's memory; verl's own Tracking reports to
# the spec's trackers, set up by `env` (tracker_env) and `trainer.logger` (tracker_loggers).
NODE_CPUS = (3, 11)
RUN_MEM_MB = None
WRITES_TRACKERS = False


def entrypoint(spec: ExperimentSpec, run_dir: Path) -> list[str]:
    """The job's command line: rpg's start (start.py), which waits for the run's GPUs and then becomes verl's
    PPO entry point, with one Hydra override per argument after `--`."""
    gpus = spec.resources.nodes * spec.resources.gpus_per_node
    return [*ENTRYPOINT, "--gpus", str(gpus), "--run", namespace(spec), "--", *overrides(spec, run_dir)]


def namespace(spec: ExperimentSpec) -> str:
    """The run's own Ray namespace (verl's ray_init: what TransferQueue names, isolation.py) and GPU lease name."""
    return f"rpg-{spec.run_id}"


def overrides_of(argv: list[str]) -> list[str]:
    """The Hydra overrides of an `entrypoint` command line."""
    return argv[argv.index("--") + 1 :]


def resources(spec: ExperimentSpec) -> tuple[float, float]:
    """(CPUs, GPUs) the job's entrypoint reserves. The verl driver only orchestrates: its Ray workers
    ask for the spec's GPUs themselves, so an entrypoint holding them would deadlock the run."""
    return 1.0, 0.0


def env(spec: ExperimentSpec, run_dir: Path) -> dict[str, str]:
    """The job's runtime_env env vars, which Ray passes on to every verl process of the job: the plugin,
    metrics into the run directory, and what verl's tracking.py reads for the spec's trackers (W&B
    group/tags/id, TENSORBOARD_DIR, MLflow's URI). Their one home: verl's own ray.init runtime_env must
    not repeat them (Ray 2.60 fails the job: "Failed to merge the Job's runtime env").

    A custom loss's module directory leads PYTHONPATH (`custom_loss.job_pythonpath`): every verl worker imports the
    function. On a multi-node cluster that directory must be on a filesystem the nodes share."""
    extra = dict(spec.verl.env)
    # modules the spec names load first (a platform must be registered before rpg's plugin imports verl's workers)
    modules = [m for m in extra.pop("VERL_USE_EXTERNAL_MODULES", "").split(",") if m.strip()]
    pythonpath = custom_loss.job_pythonpath(spec.loss, extra.get("PYTHONPATH"))
    return {
        **extra,
        **({"PYTHONPATH": pythonpath} if pythonpath else {}),
        "VERL_USE_EXTERNAL_MODULES": ",".join([*modules, PLUGIN_MODULE]),
        "VERL_FILE_LOGGER_PATH": str(rundir.metrics_path(Path(run_dir).absolute())),
        **tracker_env(spec, run_dir),
    }


def tracker_loggers(spec: ExperimentSpec) -> list[str]:
    """verl 0.9.1 `trainer.logger` entries for the spec's trackers (its names are ours)."""
    return enabled(spec.trackers)


def tracker_env(spec: ExperimentSpec, run_dir: Path) -> dict[str, str]:
    """The env vars verl 0.9.1's verl/utils/tracking.py (and the libraries it calls) read for the spec's
    trackers (`Tracker.library_env`): verl passes the libraries only a few settings, the group, tags, run id
    and URIs travel as their own env vars. No credentials."""
    if spec.trackers is None or not enabled(spec.trackers):
        return {}
    run_dir = Path(run_dir).absolute()
    info = run_info(spec.canonical(), spec.run_id, spec.run_name, run_dir.parent.name, run_dir, spec.trackers)
    found: dict[str, str] = {}
    for name in enabled(info.trackers):
        found.update(TRACKERS[name].library_env(info))
    return found


def plugin_losses(loss_names: Iterable[str]) -> list[str]:
    """The policy losses rpg's plugin registers with verl (and the submit-time check looks for): `loss_names`
    (`rpg_cli.algorithms.LOSS_NAMES`) less those runs use verl's own function for, and the custom loss."""
    return [name for name in loss_names if name not in VERL_OWN_LOSSES] + [CUSTOM_LOSS]


def preflight(spec: ExperimentSpec) -> list[Finding]:
    """What can be checked of a run before a GPU is paid for: its data files, model and prompt lengths, and
    whether its estimated per-GPU peak fits its GPUs (footprint.py; an error naming the setting that fixes it)."""
    findings = check_run(spec)
    if why := custom_loss.not_found(spec.loss):
        findings.append(Finding("loss", why, error=True))
    shape = model_shape(spec.model)
    if shape is None:
        return [
            *findings,
            Finding(
                "model",
                f"no config.json for {spec.model} here (a model directory or the Hugging Face cache): memory and "
                f"disk not estimated; download it first (huggingface-cli download {spec.model})",
                error=False,
            ),
        ]
    memory = gpu_memory(spec, shape, overrides(spec, Path("run")), spec.resources.gpu_memory_gib)
    if not memory.fits:
        findings.append(Finding("resources.gpu_memory_gib", str(memory), error=True))
    return findings


def footprint(spec: ExperimentSpec) -> dict[str, float | None]:
    """The dry run's figures (footprint.py): the estimated per-GPU peak in GiB and the disk the run's checkpoints
    leave (and take at most, while the newest is written) in GB; None where the model's config.json is not here."""
    shape = model_shape(spec.model)
    if shape is None:
        return {"gpu_memory_gib": None, "disk_gb": None, "disk_peak_gb": None}
    space = disk(spec, shape)
    memory = gpu_memory(spec, shape, overrides(spec, Path("run")), spec.resources.gpu_memory_gib)
    return {
        "gpu_memory_gib": round(memory.peak_gib, 1),
        "disk_gb": round(space.run_gb, 1),
        "disk_peak_gb": round(space.peak_gb, 1),
    }


def check_install(entrypoints: dict[str, list[str]] | None = None) -> None:
    """Before any verl run is submitted: the plugin must load in a fresh interpreter, and verl's own config
    must take each run's overrides (run name -> `entrypoint`), the spec's `verl` block included, composed once per
    distinct configuration (diagnose.ALIKE) (RuntimeError, one line, if not)."""
    configs = {name: overrides_of(argv) for name, argv in (entrypoints or {}).items()}
    diagnose.check_plugin_loads(PLUGIN_MODULE, configs=configs)


def check_configs(entrypoints: dict[str, list[str]]) -> diagnose.ConfigCheck:
    """`rpg sweep --dry-run --check`: what `check_install` checks, without submitting, as verdicts: one per
    distinct verl configuration of the runs (run name -> `entrypoint`), with the runs that share it (diagnose.ALIKE)
    and verl's refusal, if any. RuntimeError (one line) when the plugin does not load or the check runs out of
    time."""
    configs = {name: overrides_of(argv) for name, argv in entrypoints.items()}
    return diagnose.check_configs(PLUGIN_MODULE, configs)


def check_node(runs: list[tuple[list[str], dict[str, str]]] | None = None) -> list[dict[str, Any]]:
    """`rpg doctor`: this machine checked as a node of verl runs (node.py), each check a dict (status, name, ok,
    needed, detail, fix). `runs`: (entrypoint, env) of each; flash-attn is checked when one loads its model with
    flash_attention_2 (verl's default: also with no runs), verl's platform read with the first one's env."""
    from rpg_cli.backends.verl import node

    runs = runs or []
    flash = not runs or any(node.uses_flash_attention(overrides_of(argv)) for argv, _ in runs)
    return [c.as_dict() for c in node.node_checks(flash, runs[0][1] if runs else None, PLUGIN_MODULE)]


def check_cluster(client: Any, runs: list[tuple[list[str], dict[str, str]]] | None = None) -> None:
    """Before verl runs are submitted (once per sweep; `runs`: (entrypoint, env) of each run to submit): every GPU
    node of the cluster checked as `check_node` checks one, by a Ray job through the Jobs API `client`, with the
    runs' env; RuntimeError, one line naming the node and the fix, when one lacks what a run needs, or when the
    cluster has no GPU node (node.check_cluster)."""
    from rpg_cli.backends.verl import node

    node.check_cluster(client, [(overrides_of(argv), env) for argv, env in runs or []], PLUGIN_MODULE)


failure_reason = diagnose.failure_reason  # one line for a failed job, from the tail of its log


def check(spec: ExperimentSpec) -> None:
    """Reject what verl 0.9.1 cannot run as specified (one-line SpecError with the field path)."""
    if spec.rollout.engine != "vllm":
        raise SpecError(
            f"got {spec.rollout.engine!r}: verl 0.9.1 rolls out with vllm, sglang or trtllm servers only; "
            "allowed with backend verl: vllm (hf is the local backend's)",
            "rollout.engine",
        )
    if spec.kl_in_reward and spec.reference == "iterative":
        raise SpecError(
            f"{spec.algorithm} folds beta * k1(pi_old/pi_ref) into the reward, which is 0 for the iterative "
            "reference; allowed: reference frozen, every or kl_target, or beta 0",
            "reference",
        )
    if spec.overlong is not None and spec.overlong.buffer > spec.max_response_length:
        raise SpecError(
            f"{spec.overlong.buffer} exceeds the {spec.context} response length {spec.max_response_length}; "
            f"allowed: 1..{spec.max_response_length}",
            "overlong.buffer",
        )
    for name in spec.data.val_files:
        _check_one_row_per_problem(name, spec.val.n)
    if spec.resources.gpus_per_node < 1:
        raise SpecError(
            "verl trains on GPUs; allowed with backend verl: >= 1 (use backend local on CPUs)",
            "resources.gpus_per_node",
        )
    rollouts = spec.train_batch_size * spec.rollout_n
    gpus = spec.resources.nodes * spec.resources.gpus_per_node
    if rollouts % gpus:
        raise SpecError(
            f"train_batch_size x rollout_n = {rollouts} responses do not split over {gpus} GPUs (verl requires "
            "it); allowed: a batch divisible by nodes x gpus_per_node",
            "train_batch_size",
        )


def _check_one_row_per_problem(name: str, n: int) -> None:
    """verl samples val_kwargs.n responses for every row of a validation file and groups them by row: a file
    holding each problem k times (the paper's files, older prepare-data output) would generate k times the
    samples and split each problem's into k groups of n (so best@n/maj@n would not be the problem's). An
    error, not a warning: the fix takes seconds, the waste a GPU node for hours. Files that are not local
    (or too big to read at plan time) are not checked."""
    count = count_problems(name)
    if count is None or count.rows == count.problems:
        return
    raise SpecError(
        f"{name} holds {count.rows:,} rows for {count.problems:,} distinct problems; verl samples val.n = {n} per "
        f"row, {count.rows * n:,} responses per validation instead of {count.problems * n:,}; allowed: one row per "
        f"problem (rewrite it with `rpg prepare-data PRESET={name}` or `--input {name}`; val.n sets the samples)",
        "data.val_files",
    )


def overrides(spec: ExperimentSpec, run_dir: Path) -> list[str]:
    """`key=value` Hydra overrides of verl's ppo_trainer config for this spec (`+key` adds a new key)."""
    check(spec)
    run_dir = Path(run_dir).absolute()
    prompt_len, response_len = spec.max_prompt_length, spec.max_response_length
    entry = spec.entry  # the algorithm's row of rpg_cli.algorithms.table
    separate_reference = spec.reference != "iterative"  # frozen, or reset now and then: verl's ref worker
    kl_in_reward = spec.kl_in_reward
    custom = spec.loss_name == CUSTOM_LOSS
    # our loss reads verl's ref_log_prob (a separate reference); the iterative one is pi_old, no model at all. A
    # custom loss gets a separate reference's log-probs (it has no beta: a KL term is the researcher's function's)
    loss_uses_reference = separate_reference and ((entry.beta_in == "loss" and spec.beta > 0) or custom)
    kl_loss = spec.kl_loss
    # verl starts its ref worker only for a KL in the reward or a KL loss: a weight-0 KL loss starts it where
    # only our loss or the reset schedule (whose KL trigger reads ref_log_prob) needs it
    needs_ref_worker = loss_uses_reference or (isinstance(spec.reference, Every) and not kl_in_reward)
    adv_estimator, norm_by_std = ADVANTAGES[spec.advantage_estimator]
    gpus = spec.resources.gpus_per_node
    clip = spec.clip
    # unclipped runs keep verl's own valid defaults in its fields; policy_loss.clip=false switches clipping off
    eps_low, eps_high, clip_c = (clip.eps_low, clip.eps_high, clip.c) if clip is not None else (0.2, 0.2, 3.0)
    tokens_per_gpu = token_budgets(spec).ppo  # dynamic micro-batches: two full sequences per GPU pass
    val_files = spec.data.val_files or spec.data.train_files  # verl builds a val loader even when it never runs
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"

    values: dict[str, Any] = {
        # data
        "data.train_files": [_data_path(f) for f in spec.data.train_files],
        "data.val_files": [_data_path(f) for f in val_files],
        "data.prompt_key": "prompt",
        "data.max_prompt_length": prompt_len,
        "data.max_response_length": response_len,
        "data.train_batch_size": spec.train_batch_size,
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "data.shuffle": True,
        "data.seed": spec.seed,  # the shuffle's generator
        # as the local backend and `rpg eval` apply them (`++`: Hydra merges a dict into verl's {} only so)
        "++data.apply_chat_template_kwargs": spec.chat_template_kwargs,
        # model
        "actor_rollout_ref.model.path": _model_path(spec.model),
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        # actor: batches, optimizer, loss
        f"{actor}.ppo_mini_batch_size": spec.ppo_mini_batch_size,
        f"{actor}.ppo_epochs": spec.ppo_epochs,
        f"{actor}.use_dynamic_bsz": True,
        f"{actor}.ppo_max_token_len_per_gpu": tokens_per_gpu,
        f"{actor}.data_loader_seed": spec.seed,
        f"{actor}.fsdp_config.seed": spec.seed,
        f"{actor}.optim.lr": spec.lr,
        f"{actor}.optim.lr_warmup_steps": spec.lr_warmup_steps,
        f"{actor}.optim.lr_scheduler_type": "constant",
        f"{actor}.optim.weight_decay": spec.weight_decay,
        f"{actor}.optim.clip_grad": spec.grad_clip,
        f"{actor}.clip_ratio": eps_low,
        f"{actor}.clip_ratio_low": eps_low,
        f"{actor}.clip_ratio_high": eps_high,
        f"{actor}.clip_ratio_c": clip_c,
        f"{actor}.loss_agg_mode": spec.loss_agg_mode,
        f"{actor}.entropy_coeff": spec.entropy_coeff,
        f"{actor}.policy_loss._target_": POLICY_LOSS_CONFIG,
        # verl's own function where verl has the loss (its math runs), else rpg's plugin
        f"{actor}.policy_loss.loss_mode": entry.verl_loss or spec.loss_name,
        f"+{actor}.policy_loss.beta": spec.beta,
        f"+{actor}.policy_loss.clip": clip is not None,
        f"+{actor}.policy_loss.use_reference": loss_uses_reference,
        f"+{actor}.policy_loss.clipped_weight": clip is not None and clip.clipped_weight_in_sg,
        f"+{actor}.policy_loss.kl_clamp": spec.kl_clamp,
        # verl's own KL loss: the spec's kl_loss (its reference: verl's ref worker when separate, pi_old handed in
        # by the plugin when iterative, which needs no ref worker); else off, or weight 0 (needs_ref_worker)
        f"{actor}.use_kl_loss": separate_reference and (kl_loss is not None or needs_ref_worker),
        f"{actor}.kl_loss_coef": kl_loss.coef if kl_loss is not None else 0.0,
        f"{actor}.kl_loss_type": KL_LOSS_ESTIMATORS[kl_loss.estimator] if kl_loss is not None else "low_var_kl",
        f"+{actor}.policy_loss.kl_loss_to_old": kl_loss is not None and spec.reference == "iterative",
        f"{actor}.checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"],
        # rollout (vLLM) and validation sampling
        f"{rollout}.name": spec.rollout.engine,
        f"{rollout}.n": spec.rollout_n,
        f"{rollout}.temperature": spec.rollout.temperature,
        f"{rollout}.top_p": spec.rollout.top_p,
        f"{rollout}.seed": spec.seed,
        f"{rollout}.tensor_model_parallel_size": 2 if gpus % 2 == 0 else 1,
        f"{rollout}.max_num_batched_tokens": max(8192, prompt_len + response_len),
        f"{rollout}.val_kwargs.n": spec.val.n,
        f"{rollout}.val_kwargs.temperature": spec.val.temperature,
        f"{rollout}.val_kwargs.top_p": spec.val.top_p,
        f"{rollout}.val_kwargs.do_sample": spec.val.temperature > 0,
        # advantages and the KL-in-reward of REINFORCE++
        "algorithm.adv_estimator": adv_estimator,
        "algorithm.norm_adv_by_std_in_grpo": norm_by_std,
        "algorithm.use_kl_in_reward": kl_in_reward,
        "algorithm.kl_penalty": "kl",  # k1, MATH.md section 4
        "algorithm.kl_ctrl.type": "fixed",
        "algorithm.kl_ctrl.kl_coef": spec.beta,
        # rewards: the same scorer as `rpg eval`
        "reward.custom_reward_function.path": REWARD_FUNCTION,
        "reward.custom_reward_function.name": "compute_score",
        # the spec's scorer overrides, over rpg_cli.benchmarks' table (compute_score reads both)
        "+reward.custom_reward_function.reward_kwargs": {"scorers": spec.scorers} if spec.scorers else {},
        # trainer: resources, schedule, checkpoints, metrics
        "trainer.nnodes": spec.resources.nodes,
        "trainer.n_gpus_per_node": gpus,
        "trainer.total_training_steps": spec.steps,
        "trainer.total_epochs": 1000,  # steps bound the run; epochs only must not run out first
        "trainer.test_freq": spec.val.every if spec.data.val_files else -1,
        "trainer.val_before_train": bool(spec.data.val_files),
        "trainer.save_freq": spec.save_every,
        "trainer.default_local_dir": str(rundir.checkpoints_dir(run_dir)),
        "trainer.resume_mode": "auto",
        "trainer.logger": ["console", "file", *tracker_loggers(spec)],  # `file` is what rpg ingests
        "trainer.project_name": spec.trackers.project if spec.trackers else "rpg",
        "trainer.experiment_name": spec.run_name,
        # main_ppo runs under @hydra.main, whose output folder (.hydra/, main_ppo.log) is outputs/<date>/<time>/ of
        # the directory rpg ran from unless told: the run's outputs stay in its directory
        "hydra.run.dir": str(run_dir / "hydra"),
        # a namespace of the run's own on a shared Ray cluster: what verl's TransferQueue names (isolation.py)
        "+ray_kwargs.ray_init.namespace": namespace(spec),
    }
    if spec.optimizer == "schedule_free":
        values[f"{actor}.optim.optimizer"] = "AdamWScheduleFree"
        values[f"{actor}.optim.optimizer_impl"] = OPTIMIZER_MODULE
    values.update(_tricks(spec))
    values.update(loss_overrides(spec))
    values.update(rollout_correction_overrides(spec))
    values.update(reference_overrides(spec))
    values.update(checkpoint_overrides(spec))
    # env(spec) is the job's runtime_env only: Ray hands a job's runtime_env to every task and actor of the
    # job, and refuses a ray.init whose runtime_env repeats one of its keys (even with the same value)
    return _with_spec_overrides([f"{key}={_hydra_value(value)}" for key, value in values.items()], spec)


def _with_spec_overrides(generated: list[str], spec: ExperimentSpec) -> list[str]:
    """The generated overrides, then the spec's `verl.overrides` (part of the run id: they may replace any of them)
    and `verl.site` (keys of the site table only, checked with the spec: they may replace a generated value of how
    the run executes, e.g. the rollout's tensor_model_parallel_size), each passed on as written. A generated
    override a spec's one replaces is left out (Hydra refuses `+key` twice)."""
    replaced = {override_key(item) for item in [*spec.verl.overrides, *spec.verl.site]}
    kept = [item for item in generated if override_key(item) not in replaced]
    return [*kept, *spec.verl.overrides, *spec.verl.site]


def loss_overrides(spec: ExperimentSpec) -> dict[str, Any]:
    """What a loss takes beyond the clip and beta: SAPO's gate temperatures (verl's actor `tau_pos`/`tau_neg`, which
    its `sapo` loss reads), Dr. GRPO's constant normaliser (verl's `loss_scale_factor`: the response budget, as
    the paper divides by the generation length, MATH.md section 9.1; unset, verl divides by each micro-batch's
    longest response), and a custom loss's function and settings (`plugin.RPGPolicyLossConfig`)."""
    actor = "actor_rollout_ref.actor"
    values: dict[str, Any] = {}
    if spec.sapo is not None:
        values[f"{actor}.tau_pos"] = spec.sapo.tau_pos
        values[f"{actor}.tau_neg"] = spec.sapo.tau_neg
    if spec.loss_agg_mode == "seq-mean-token-sum-norm":
        values[f"{actor}.loss_scale_factor"] = spec.max_response_length
    if spec.loss_name == CUSTOM_LOSS:
        values[f"+{actor}.policy_loss.custom"] = spec.loss
        values[f"+{actor}.policy_loss.custom_settings"] = dict(spec.loss_settings)
    return values


# verl 0.9.1's rollout correction settings (trainer/config/algorithm.py RolloutCorrectionConfig), the spec's names
ROLLOUT_CORRECTION = "algorithm.rollout_correction"


def rollout_correction_overrides(spec: ExperimentSpec) -> dict[str, Any]:
    """The spec's `rollout_correction` as verl's `algorithm.rollout_correction` (MATH.md section 10), decoupled mode
    (bypass_mode false: verl recomputes pi_old, and weighs each token by pi_old/pi_rollout, truncated, or rejects it).

    verl's trainer (`trainer/ppo/v1/trainer_base.py` `_compute_advantage`, which rpg's trainer inherits) computes the
    weights when the batch holds the rollout's own log-probs, which vLLM returns with `rollout.calculate_log_probs`
    (verl 0.9.1's default, set here all the same); `workers/utils/losses.py` `ppo_loss` hands them to the policy loss
    as `rollout_is_weights`, and rejection zeroes the rejected tokens' response_mask. Every loss takes them: verl's
    own multiply the per-token loss before aggregating, and rpg's plugin alike (`plugin.rpg_policy_loss`)."""
    correction = spec.rollout_correction
    if correction is None:
        return {}
    values: dict[str, Any] = {
        f"{ROLLOUT_CORRECTION}.{key}": value for key, value in correction.model_dump(mode="json").items()
    }
    values[f"{ROLLOUT_CORRECTION}.bypass_mode"] = False
    values["actor_rollout_ref.rollout.calculate_log_probs"] = True
    return values


def reference_overrides(spec: ExperimentSpec) -> dict[str, Any]:
    """rpg's trainer (`reference.RPGTrainer`, which resets the reference and logs `ref/*`) and its schedule."""
    reference = spec.reference
    schedule = None if isinstance(reference, str) else reference
    return {
        "trainer.v1.trainer_mode": RPG_TRAINER,
        f"+{REFERENCE_SETTINGS}.reference": reference if isinstance(reference, str) else "reset",
        f"+{REFERENCE_SETTINGS}.every": schedule.every if schedule else None,
        f"+{REFERENCE_SETTINGS}.kl_target": schedule.kl_target if schedule else None,
        f"+{REFERENCE_SETTINGS}.kl_ema": schedule.ema if schedule else None,
    }


def checkpoint_overrides(spec: ExperimentSpec) -> dict[str, Any]:
    """What checkpoints keep on disk (the spec's `checkpoints`), applied by rpg's trainer after each save
    (`rundir.prune_checkpoints`). verl's own retention (`max_actor_ckpt_to_keep`) stays off: it deletes a
    checkpoint's `actor/` whole, the HF weights `rpg eval` reads with it, leaves the rest of `global_step_N/`
    (rpg's reference shards among it), and forgets on a resume what it saved before."""
    return {
        "trainer.max_actor_ckpt_to_keep": None,
        f"+{REFERENCE_SETTINGS}.keep": spec.checkpoints.keep,
        f"+{REFERENCE_SETTINGS}.weights": spec.checkpoints.weights,
    }


def reference_from_config(config: Any) -> str | Every:
    """The spec's `reference` back from a composed verl config (what `reference_overrides` wrote)."""
    settings = config.trainer.v1[RPG_TRAINER]
    if settings.reference != "reset":
        return str(settings.reference)
    return Every(every=settings.every, kl_target=settings.kl_target, ema=settings.kl_ema)


def _tricks(spec: ExperimentSpec) -> dict[str, Any]:
    """DAPO's dynamic sampling (verl's filter_groups) and overlong shaping (verl's `dapo` reward manager),
    on any algorithm; both off when the spec does not ask for them."""
    values: dict[str, Any] = {"algorithm.filter_groups.enable": spec.dynamic_sampling is not None}
    if spec.dynamic_sampling is not None:
        values.update(
            {
                "algorithm.filter_groups.metric": "acc",  # rpg_cli.rewards' correctness, before any length penalty
                # prompt batches in flight at once, in train_batch_size units: the scripts' generation batch of 3 x 512
                "algorithm.filter_groups.max_inflight_gen_batches": spec.dynamic_sampling.gen_batches,
                # verl 0.9.1's V1 sampler warns and ignores this (it refills until the batch is full); kept for the record
                "algorithm.filter_groups.max_num_gen_batches": spec.dynamic_sampling.max_num_gen_batches,
            }
        )
    if spec.overlong is not None:
        shaping = "+reward.reward_kwargs.overlong_buffer_cfg"
        values.update(
            {
                "reward.reward_manager.name": "dapo",
                f"{shaping}.enable": True,
                f"{shaping}.len": spec.overlong.buffer,
                f"{shaping}.penalty_factor": spec.overlong.penalty_factor,
                f"{shaping}.log": True,
                "+reward.reward_kwargs.max_resp_len": spec.max_response_length,
            }
        )
    return values


def _data_path(path: str) -> str:
    """Absolute (a job runs in its own working directory, on any node of a shared filesystem); URLs unchanged."""
    return path if "://" in path else str(Path(path).expanduser().absolute())


def _model_path(model: str) -> str:
    """A local model directory made absolute; a hub id like `Qwen/Qwen3-4B` (nothing of that name here) unchanged."""
    if "://" in model:
        return model
    p = Path(model).expanduser()
    return str(p.absolute()) if p.is_absolute() or p.exists() or model.startswith(".") else model


_PLAIN = re.compile(r"^[A-Za-z0-9_./:+-]+$")


def _hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: lists in brackets, odd strings single-quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_hydra_value(str(k))}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in ("true", "false", "null", "none") and not _is_number(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
