"""verl 0.9.1's own worker path in one process: on the CPU for tests/test_verl_workers_cpu.py, on one CUDA GPU for
`make gpu-check` (benchmarks/gpu_check.py). Run as a script, in a fresh process:

    python tests/verl_worker_harness.py WORK_DIR OUT_JSON [fsdp|fsdp2] [--cuda]

Builds a random causal LM locally (no download: the toy model of rpg_cli.datasets.toy on the CPU, a Llama of
about 400M parameters over the same vocabulary on CUDA), composes verl's config with the overrides rpg generates
for an RPG-REINFORCE cell (`launch.overrides`; the spec names the model; fsdp2 also sets
`actor_rollout_ref.actor.strategy=fsdp2`, which the reference follows), and drives rpg's
`RPGActorRolloutRefWorker` (verl's `ActorRolloutRefWorker`, role actor_rollout_ref) the way verl's synchronous
trainer does: init_model, compute_log_prob (old log-probs), compute_ref_log_prob, verl's advantage code,
update_actor, plus rpg's reference reset, checkpoints and the trainer hook that triggers the reset, and last an
update with a custom loss (`policy_loss.loss_mode=custom`, MATH.md section 11) and rollout correction's weights in
the batch, each micro-batch's loss and gradient compared with the local path's `custom_policy_loss`. Random
response tokens stand in for vLLM rollouts. It writes what it measured to OUT_JSON; the caller asserts.

Stand-ins on the CPU, all here and none in the package (each is why verl cannot run on a CPU as shipped):
- a CPU platform (tests/verl_cpu_platform.py) set with verl's platform hook `set_platform`, and VERL_ENGINE_DEVICE=cuda so that
  verl's engine registry hands out its FSDP engine (registered for cuda/npu only);
- a gloo process group of world size 1 (verl would ask for NCCL);
- attn_implementation=sdpa (verl's default is flash_attention_2);
- three GPU-only guards lifted: FSDP1's check that module states are on the GPU before `sync_module_states`,
  `Tensor.pin_memory` (the reference engine's CPU offload pins its shards; here an unpinned copy, so the
  shard FSDP reads is a tensor of its own as on a GPU machine), and verl's reload of the
  parameters to the GPU before saving a checkpoint (`load_fsdp_model_to_gpu`);
- a rollout class that builds nothing (the vLLM server verl would start).
With --cuda only the last remains: verl's CUDA platform, NCCL, bf16 compute, and flash_attention_2 where flash-attn
is installed (else sdpa, recorded in OUT_JSON).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

STARTED = time.perf_counter()
CUDA = "--cuda" in sys.argv[1:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PORT = free_port()
os.environ.update(
    RANK="0",
    WORLD_SIZE="1",
    LOCAL_RANK="0",
    LOCAL_WORLD_SIZE="1",
    MASTER_ADDR="127.0.0.1",
    MASTER_PORT=str(PORT),
    VERL_ENGINE_DEVICE="cuda",
    VERL_USE_EXTERNAL_MODULES="rpg_cli.backends.verl.plugin",
)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if CUDA:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{PORT}")
else:
    from verl.plugin.platform import set_platform
    from verl_cpu_platform import CPUPlatform

    set_platform(CPUPlatform())
    torch.set_num_threads(1)  # a model of 75k parameters: more threads only compete with the rest of the suite
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{PORT}")

    import torch.distributed.fsdp._init_utils as fsdp_init

    fsdp_init._check_module_states_for_sync_module_states = lambda module_states: None  # guard 1
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self.clone()  # guard 2: a new tensor, as pinning makes

import numpy as np  # noqa: E402
import verl  # noqa: E402  (loads rpg's plugin: VERL_USE_EXTERNAL_MODULES)
import verl.workers.engine.fsdp.transformer_impl as fsdp_engine  # noqa: E402
import verl.workers.engine_workers as engine_workers  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.rollout.base import BaseRollout  # noqa: E402
from verl.workers.utils.padding import response_from_nested, response_to_nested  # noqa: E402

if not CUDA:
    fsdp_engine.load_fsdp_model_to_gpu = lambda module: None  # guard 3: parameters stay where they are to be saved

import rpg_cli.backends.verl.plugin as plugin  # noqa: E402
from rpg_cli.backends.verl import launch  # noqa: E402
from rpg_cli.backends.verl.reference import (  # noqa: E402
    RPGActorRolloutRefWorker,
    RPGTrainer,
    batch_reference_kl,
    shards,
)
from rpg_cli.datasets.toy import build_model, build_tokenizer  # noqa: E402
from rpg_cli.spec import ExperimentSpec, ReferenceTracker  # noqa: E402


class NoRollout(BaseRollout):
    """The vLLM server verl would start: nothing (responses are random tokens here)."""

    def __init__(self, config, model_config, device_mesh):
        pass

    async def resume(self, tags):
        pass

    async def update_weights(self, *args, **kwargs):
        pass

    async def release(self):
        pass


engine_workers.get_rollout_class = lambda name, mode="async": NoRollout


class LocalGroup:
    """A worker group of one in-process worker: a ONE_TO_ALL call returns the list of per-rank results."""

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):
        method = getattr(self.worker, name)
        return lambda *args, **kwargs: [method(*args, **kwargs)]


# ---------------------------------------------------------------- the cell and the worker


# --cuda: a Llama of about 350M parameters over a 32,000-token vocabulary (the logits' share of memory is real), and
# 32 sequences of 300-600 tokens, about 14k tokens a step, in the 8,192-token micro-batches rpg gives a 2k context
CUDA_MODEL = dict(
    vocab_size=32_000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=8,
    max_position_embeddings=4096,
)
CUDA_BATCH = dict(groups=8, n=4, prompt=(100, 200), response=(200, 400))
CPU_BATCH = dict(groups=4, n=4, prompt=(3, 7), response=(1, 11))
BATCH = CUDA_BATCH if CUDA else CPU_BATCH


def build_cuda_model(tokenizer):
    """CUDA_MODEL with random weights (fp32, as verl's FSDP keeps its master weights), the toy's special tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **CUDA_MODEL,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def cell(model_dir: Path, data: Path) -> ExperimentSpec:
    """An RPG-REINFORCE cell as a sweep would expand it for verl: schedule-free, clipped, a reference reset
    every 2 steps, BATCH's prompts x responses in 2 mini-batches (so the second update is off-policy)."""
    return ExperimentSpec.model_validate(
        dict(
            algorithm="rpg_reinforce",
            kl="urkl",
            beta=0.05,
            clip={"eps_low": 0.2, "eps_high": 0.28, "c": 10.0},
            optimizer="schedule_free",
            context="2k",
            reference={"every": 2},
            model=str(model_dir),
            data={"train_files": [str(data)]},
            train_batch_size=BATCH["groups"],
            rollout_n=BATCH["n"],
            ppo_mini_batch_size=BATCH["groups"] // 2,
            lr=1e-4 if CUDA else 1e-2,  # a step the tiny model shows, that a 350M one survives in bf16
            steps=10,
            seed=0,
            save_every=1,
            backend="verl",
            resources={"nodes": 1, "gpus_per_node": 1, "cpus": 1},
        )
    )


def attention() -> str:
    """sdpa on the CPU (a stand-in); on CUDA verl's default, flash_attention_2, where flash-attn is installed."""
    import importlib.util

    return "flash_attention_2" if CUDA and importlib.util.find_spec("flash_attn") is not None else "sdpa"


def estimated_update_gib(spec: ExperimentSpec, model_dir: Path, run_dir: Path, strategy: str) -> float:
    """rpg's memory estimate (backends/verl/footprint.py) of what torch allocates in `update_actor` on one GPU: the
    trainer's tensors at the larger of the update and the optimizer step, less the CUDA context and vLLM (not
    torch's allocations, and no vLLM runs here)."""
    from rpg_cli.backends.verl import footprint
    from rpg_cli.model_shape import model_shape

    generated = launch.overrides(spec, run_dir) + [f"actor_rollout_ref.actor.strategy={strategy}"]
    settings = footprint.settings(spec, generated)
    shape = model_shape(str(model_dir))
    trainer = [
        sum(v for k, v in phase.parts.items() if k != "trainer runtime" and not k.startswith("vLLM"))
        for phase in footprint.phases(shape, settings, gpu_gib=80.0)
        if phase.name in ("update", "optimizer step")
    ]
    return max(trainer)


def composed_config(spec: ExperimentSpec, run_dir: Path, strategy: str):
    overrides = launch.overrides(spec, run_dir) + [f"actor_rollout_ref.actor.strategy={strategy}"]
    if attention() != "flash_attention_2":
        overrides.append("+actor_rollout_ref.model.override_config.attn_implementation=sdpa")
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def random_batch(vocab: int, groups: int, n: int, seed: int, prompt=(3, 7), response=(1, 11)):
    """`groups` prompts x `n` random responses, as verl's agent loop puts them into its TransferQueue
    (jagged prompts, responses, masks, input_ids, position_ids; the score on the last response token);
    lengths drawn from [low, high)."""
    g = torch.Generator().manual_seed(seed)
    rows, keys = [], []
    for group in range(groups):
        prompt_ids = torch.randint(3, vocab, (int(torch.randint(*prompt, (1,), generator=g)),), generator=g)
        uid = f"p{seed}g{group}"
        for j in range(n):
            response_ids = torch.randint(3, vocab, (int(torch.randint(*response, (1,), generator=g)),), generator=g)
            ids = torch.cat([prompt_ids, response_ids])
            scores = torch.zeros(len(response_ids))
            scores[-1] = float(torch.randint(0, 2, (1,), generator=g))
            rows.append(
                dict(
                    prompts=prompt_ids,
                    responses=response_ids,
                    response_mask=torch.ones(len(response_ids), dtype=torch.long),
                    loss_mask=torch.ones(len(response_ids), dtype=torch.long),
                    input_ids=ids,
                    position_ids=torch.arange(len(ids)),
                    rm_scores=scores,
                )
            )
            keys.append(f"{uid}_{j}_0")
    return tu.list_of_dict_to_tensordict(rows), keys


def with_info(data, **info):
    data = data.clone()
    tu.assign_non_tensor(data, **info)
    return data


def old_log_probs(worker, data, temperature: float):
    """What the trainer's `_compute_old_log_prob` asks the actor for."""
    out = worker.compute_log_prob(with_info(data, calculate_entropy=True, compute_loss=False, temperature=temperature))
    return response_from_nested(out["log_probs"], data["response_mask"])


def ref_log_probs(worker, data, temperature: float):
    """What the trainer's `_compute_ref_log_prob` asks the reference for."""
    out = worker.compute_ref_log_prob(
        with_info(data, calculate_entropy=False, compute_loss=False, temperature=temperature)
    )
    return response_from_nested(out["log_probs"], data["response_mask"])


def advantages(cfg, data, keys):
    """verl's advantage code, called as the trainer's `_compute_advantage` calls it."""
    padded = DataProto(
        batch=data.select("response_mask", "rm_scores", "old_log_probs", "ref_log_prob").to_padded_tensor()
    )
    padded.batch["token_level_scores"] = padded.batch["rm_scores"]
    padded.batch["token_level_rewards"] = padded.batch["rm_scores"]
    padded.non_tensor_batch["uid"] = np.array([k.split("_")[0] for k in keys], dtype=object)
    out = compute_advantage_for_multi_trajectories(
        padded,
        batch_keys=keys,
        adv_estimator=cfg.algorithm.adv_estimator,
        gamma=cfg.algorithm.gamma,
        lam=cfg.algorithm.lam,
        num_repeat=cfg.actor_rollout_ref.rollout.n,
        norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
        config=cfg.algorithm,
    )
    return response_to_nested(out.batch["advantages"], data["response_mask"])


def update_info(cfg) -> dict:
    """The extra info the trainer's `_update_actor` attaches."""
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    mini = actor.ppo_mini_batch_size * rollout.n
    return dict(
        calculate_entropy=actor.entropy_coeff != 0.0,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini,
        mini_batch_size=mini,
        epochs=actor.ppo_epochs,
        seed=actor.data_loader_seed,
        dataloader_kwargs={"shuffle": actor.shuffle},
        temperature=rollout.temperature,
    )


def max_diff(a, b) -> float:
    return float((a.values().float() - b.values().float()).abs().max())


def actor_shards(worker) -> dict[str, torch.Tensor]:
    return {name: shard.detach().clone() for name, shard in shards(worker.actor.engine.module).items()}


def same_shards(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# ---------------------------------------------------------------- a custom loss in verl's worker

# a researcher's loss (MATH.md section 11) that reads every keyword rpg passes: the reference (a separate one here),
# the settings, and returns a metric of its own
CUSTOM_LOSS_MODULE = """
import torch


def capped_pg(*, log_prob, old_log_prob, ref_log_prob, advantages, response_mask, settings):
    w = torch.exp(log_prob - old_log_prob)
    loss = -torch.minimum(w, torch.full_like(w, settings["cap"])) * advantages
    if ref_log_prob is not None:
        loss = loss + settings["beta"] * (log_prob - ref_log_prob) ** 2
    return loss, {"capped_frac": ((w > settings["cap"]) & response_mask).float().sum() / response_mask.sum()}
"""
CUSTOM_TARGET = "harness_losses:capped_pg"
CUSTOM_SETTINGS = {"cap": 1.02, "beta": 0.1}


def custom_loss_update(worker, data, cfg, work: Path) -> dict:
    """One update_actor with the plugin's `custom` loss (settings, the separate reference, rollout correction's
    weights), each call of it checked against `custom_policy_loss` on the same tensors: value and gradient with
    respect to log_prob (the local path), and the scale verl's global-batch normalisation gave it."""
    import dataclasses
    from functools import partial

    from rpg_cli.algorithms.custom import custom_policy_loss
    from rpg_cli.custom_loss import load

    root = work / "losses"
    root.mkdir(exist_ok=True)
    (root / "harness_losses.py").write_text(CUSTOM_LOSS_MODULE)
    sys.path.insert(0, str(root))
    fn = load(CUSTOM_TARGET)
    actor_config = worker.loss_fn.keywords["config"]
    config = dataclasses.replace(
        actor_config,
        policy_loss=dataclasses.replace(
            actor_config.policy_loss, loss_mode="custom", custom=CUSTOM_TARGET, custom_settings=CUSTOM_SETTINGS
        ),
    )
    registered = POLICY_LOSS_REGISTRY["custom"]
    seen = []

    def comparing(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        loss, metrics = registered(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
        )
        ref = plugin._reference.get()
        local, _ = custom_policy_loss(
            fn,
            log_prob=log_prob,
            old_log_prob=old_log_prob,
            advantages=advantages,
            response_mask=response_mask,
            ref_log_prob=ref,
            settings=CUSTOM_SETTINGS,
            loss_agg_mode=loss_agg_mode,
            weights=rollout_is_weights,
        )
        (ours,) = torch.autograd.grad(loss, log_prob, retain_graph=True)
        (theirs,) = torch.autograd.grad(local, log_prob, retain_graph=True)
        seen.append(
            dict(
                value_gap=abs(float(loss.detach()) - float(local.detach())),
                grad_gap=float((ours - theirs).abs().max()),
                grad_sum=float(theirs.abs().sum()),
                scale=plugin.global_batch_scale(loss_agg_mode, response_mask, config.global_batch_info),
                with_ref=ref is not None,
                with_weights=rollout_is_weights is not None,
            )
        )
        return loss, metrics

    g = torch.Generator().manual_seed(5)
    # rollout correction's truncated weights stand-in, one per response token
    weights = [0.5 + torch.rand(len(m), generator=g) for m in data["response_mask"].unbind()]
    weights = torch.nested.nested_tensor(weights, layout=torch.jagged)
    batch = data.clone()
    batch.set("rollout_is_weights", weights)
    POLICY_LOSS_REGISTRY["custom"] = comparing
    worker.set_loss_fn(partial(engine_workers.ppo_loss, config=config))
    try:
        metrics = tu.get(worker.update_actor(with_info(batch, **update_info(cfg))), "metrics")
    finally:
        POLICY_LOSS_REGISTRY["custom"] = registered
        worker.set_loss_fn(partial(engine_workers.ppo_loss, config=actor_config))
    return {"calls": seen, "metric_keys": sorted(metrics)}


# ---------------------------------------------------------------- the run


def main(work: Path, out_path: Path, strategy: str) -> None:
    out: dict = {"verl_version": verl.__version__, "strategy": strategy, "device": "cuda" if CUDA else "cpu"}
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_cuda_model(tokenizer) if CUDA else build_model(tokenizer, seed=0)
    out["parameters"] = sum(p.numel() for p in model.parameters())
    out["model_dir"] = str(work / "model")
    out["attention"] = attention()
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    data_file = work / "train.parquet"
    data_file.write_bytes(b"")  # the worker never reads training data; the spec wants a path
    spec = cell(work / "model", data_file)
    cfg = composed_config(spec, work / "run", strategy)
    out["trainer_mode"] = cfg.trainer.v1.trainer_mode
    out["loss_mode"] = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    temperature = cfg.actor_rollout_ref.rollout.temperature

    # who is called: a counter around the registered loss, a spy on the math it delegates to
    calls = {"loss": 0, "ref_seen": []}
    registered = POLICY_LOSS_REGISTRY[spec.loss_name]

    def counting_loss(*args, **kwargs):
        calls["loss"] += 1
        return registered(*args, **kwargs)

    POLICY_LOSS_REGISTRY[spec.loss_name] = counting_loss
    math = plugin.policy_loss

    def spying_policy_loss(name, **kwargs):
        ref, mask = kwargs.get("ref_log_prob"), kwargs["response_mask"].bool()
        calls["ref_seen"].append(None if ref is None else ref[mask].detach().float().tolist())
        return math(name, **kwargs)

    plugin.policy_loss = spying_policy_loss

    worker = RPGActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor_rollout_ref")
    worker.init_model()
    out["optimizer"] = (
        type(worker.actor.engine.optimizer).__module__ + "." + type(worker.actor.engine.optimizer).__name__
    )
    out["engines"] = [type(worker.actor.engine.module).__name__, type(worker.ref.engine.module).__name__]
    out["init_s"] = time.perf_counter() - STARTED

    # the trainer's hook, on a trainer shell whose worker group is this worker
    trainer = RPGTrainer.__new__(RPGTrainer)
    trainer.reference = ReferenceTracker(spec.reference)
    trainer.use_reference_policy = True
    trainer.ref_policy_wg = LocalGroup(worker)
    trainer.timing_raw = {}

    def begin_step(step: int) -> None:
        trainer.global_steps = step
        trainer.on_step_begin()

    vocab = model.config.vocab_size
    data, keys = random_batch(vocab, BATCH["groups"], BATCH["n"], 1, BATCH["prompt"], BATCH["response"])
    out["tokens"] = sum(len(x) for x in data["input_ids"].unbind())
    out["micro_batch_tokens"] = cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    out["estimated_update_gib"] = estimated_update_gib(spec, work / "model", work / "run", strategy)

    # packed sequences under sdpa: verl's log-probs are each sequence's own (a plain HF forward, one sequence)
    from transformers import AutoModelForCausalLM

    device = "cuda" if CUDA else "cpu"
    hf = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32).to(device).eval()
    begin_step(1)
    old = old_log_probs(worker, data, temperature)
    with torch.no_grad():
        gaps, contamination = [], []
        flat = torch.cat(list(data["input_ids"].unbind()))[None].to(device)
        flat_lp = torch.log_softmax(hf(input_ids=flat).logits[0], -1)
        offset = 0
        for i, ids in enumerate(data["input_ids"].unbind()):
            ids = ids.to(device)
            lp = torch.log_softmax(hf(input_ids=ids[None]).logits[0], -1)
            n_resp = len(data["responses"].unbind()[i])
            target = ids[-n_resp:]
            own = lp[-n_resp - 1 : -1].gather(-1, target[:, None])[:, 0]
            mixed = flat_lp[offset + len(ids) - n_resp - 1 : offset + len(ids) - 1].gather(-1, target[:, None])[:, 0]
            offset += len(ids)
            gaps.append(float((old.unbind()[i].float().to(device) - own).abs().max()))
            contamination.append(float((mixed - own).abs().max()))
    out["logprob_gap_to_hf"] = max(gaps)
    out["cross_sequence_gap"] = max(contamination[1:])  # what attending across sequences would change

    # step 1: the reference is the initial model = the actor
    ref = ref_log_probs(worker, data, temperature)
    out["step1_ref_minus_actor"] = max_diff(ref, old)
    data.set("old_log_probs", old)
    data.set("ref_log_prob", ref)
    trainer.reference.observe(batch_reference_kl(data))
    data.set("advantages", advantages(cfg, data, keys))
    out["advantages_nonzero"] = bool(data["advantages"].values().abs().sum() > 0)

    # summed micro-batch losses equal the full batch's (forward only, the same loss function and normalisation)
    def loss_with_budget(tokens: int) -> tuple[float, int]:
        before = calls["loss"]
        info = {**update_info(cfg), "global_batch_size": len(keys)}  # the whole batch is one mini-batch here
        probe = with_info(data, **info, compute_loss=True, max_token_len_per_gpu=tokens)
        result = worker.actor.infer_batch(probe)
        return float(tu.get(result, "metrics")["loss"]), calls["loss"] - before

    longest = max(len(x) for x in data["input_ids"].unbind())
    out["loss_whole"], out["micro_whole"] = loss_with_budget(10_000)
    out["loss_split"], out["micro_split"] = loss_with_budget(longest)
    # bf16 forwards of other packings round differently: the log-prob noise the loss comparison lives with
    split = worker.compute_log_prob(
        with_info(
            data, calculate_entropy=True, compute_loss=False, temperature=temperature, max_token_len_per_gpu=longest
        )
    )
    out["split_logprob_gap"] = max_diff(response_from_nested(split["log_probs"], data["response_mask"]), old)
    calls["ref_seen"].clear()

    del hf, flat_lp
    if CUDA:
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = calls["loss"]
    began = time.perf_counter()
    metrics = tu.get(worker.update_actor(with_info(data, **update_info(cfg))), "metrics")
    if CUDA:
        torch.cuda.synchronize()
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    out["update_s"] = time.perf_counter() - began
    out["update_loss_calls"] = calls["loss"] - before
    out["update_metric_keys"] = sorted(metrics)
    ref_values = sorted(ref.values().float().tolist())
    seen = [v for call in calls["ref_seen"] if call is not None for v in call]
    out["ref_reached_loss"] = {
        "calls": len(calls["ref_seen"]),
        "with_ref": sum(c is not None for c in calls["ref_seen"]),
        "max_gap": max(abs(a - b) for a, b in zip(sorted(seen), sorted(ref_values * spec.ppo_epochs)))
        if len(seen) == len(ref_values) * spec.ppo_epochs
        else None,
    }

    # after the update: the actor moved, the reference did not
    old2 = old_log_probs(worker, data, temperature)
    out["actor_moved"] = max_diff(old2, old)
    for step in (2, 3):  # every 2: no reset before step 2, a reset before step 3's reference log-probs
        begin_step(step)
        ref_now = ref_log_probs(worker, data, temperature)
        out[f"step{step}_reset"] = trainer.reference.resets
        out[f"step{step}_ref_minus_actor"] = max_diff(ref_now, old2)
        data.set("old_log_probs", old2)
        data.set("ref_log_prob", ref_now)
        trainer.reference.observe(batch_reference_kl(data))
        out[f"metrics_step{step}"] = trainer.reference.metrics(step)

    # schedule-free AdamW steps and round-trips a checkpoint (verl's save/load), and so does the reference
    checkpoint = work / "checkpoint"
    params_at_save = actor_shards(worker)
    worker.save_checkpoint(str(checkpoint / "actor"))
    worker.save_reference(str(checkpoint / "reference"))
    optimizer = worker.actor.engine.optimizer
    out["optimizer_steps_at_save"] = int(optimizer.param_groups[0]["k"])
    worker.update_actor(with_info(data, **update_info(cfg)))
    out["optimizer_steps_after_update"] = int(optimizer.param_groups[0]["k"])
    after_first = actor_shards(worker)
    out["params_moved_by_update"] = same_shards(after_first, params_at_save)
    worker.reset_reference()  # the reference moves on too
    moved_ref = max_diff(ref_log_probs(worker, data, temperature), old2)
    worker.load_checkpoint(str(checkpoint / "actor"))
    worker.load_reference(str(checkpoint / "reference"))
    out["params_restored"] = same_shards(actor_shards(worker), params_at_save)
    out["optimizer_steps_restored"] = int(optimizer.param_groups[0]["k"])
    out["ref_restored_minus_saved_actor"] = max_diff(ref_log_probs(worker, data, temperature), old2)
    out["ref_before_restore_minus_saved_actor"] = moved_ref
    worker.update_actor(with_info(data, **update_info(cfg)))
    out["repeat_update_gap"] = same_shards(actor_shards(worker), after_first)
    out["elements_copied"] = worker.reset_reference()
    out["actor_elements"] = sum(p.numel() for p in shards(worker.actor.engine.module).values())
    out["custom_loss"] = custom_loss_update(worker, data, cfg, work)
    out["total_s"] = time.perf_counter() - STARTED
    out_path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--cuda"]
    main(Path(args[0]), Path(args[1]), args[2] if len(args) > 2 else "fsdp")
