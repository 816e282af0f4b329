"""Per-GPU memory and per-run disk of a verl run as rpg configures it, known before a GPU is paid for.

    budgets = token_budgets(spec)               # the token budgets rpg gives verl (launch.py's one source)
    memory = gpu_memory(spec, shape, launch.overrides(spec, run_dir), gpu_gib=80.0)
    memory.peak_gib, memory.phase, memory.fits, memory.fix
    space = disk(spec, shape)                   # GB per checkpoint and per run, under spec.checkpoints

`shape` is `rpg_cli.model_shape.model_shape(spec.model)`. Pure Python, so that the dry run can print it.

Every term is a small function whose docstring names where verl 0.9.1 (and torch, transformers, vLLM as verl
pairs them: rpg_cli.gpu_stack) decides it. The run, step by step, on each of the N = nodes x gpus_per_node GPUs
(verl's hybrid engine: the FSDP trainer and a vLLM server share every GPU, trainer/ppo/v1/trainer_base.py):
rollout (vLLM awake; the trainer keeps its fp32 weights and optimizer states), the actor's log-probs of the
rollouts (no gradient, with entropy), the reference's log-probs (when a reference model is loaded), the update
(forward and backward of one micro-batch at a time), the optimizer step, and the weight sync to vLLM. The peak
is the largest of those phases.

It is an estimate. It leaves out (LEAVES_OUT): allocator fragmentation beyond a 5% slack, the real size of
CUDA contexts, NCCL buffers and vLLM's CUDA graphs (assumed: TRAINER_RUNTIME_GIB, VLLM_ASLEEP_GIB), the
reference's root unit that FSDP1 may leave gathered after a no-gradient forward, Ulysses sequence parallelism,
LoRA, FSDP2 and offload policies other than param/optimizer offload, and host memory (the reference's
fp32 shard lives in CPU memory). Activation terms are per-token approximations of transformers' Llama/Qwen
decoder layer under flash-attention 2.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rpg_cli.spec import Every, SpecError, override_key

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rpg_cli.model_shape import ModelShape
    from rpg_cli.spec import ExperimentSpec

GIB = 2**30  # memory is reported in GiB (what torch and nvidia-smi count)
GB = 1e9  # disk in GB (what df and storage quotas count)
FP32, BF16 = 4, 2
ADAM_STATES = 2  # fp32 tensors per parameter: AdamW's exp_avg and exp_avg_sq; schedule-free's z and exp_avg_sq

# verl 0.9.1's defaults where rpg sets nothing (trainer/config/rollout/rollout.yaml, engine/fsdp.yaml)
VLLM_UTILIZATION = 0.5  # rollout.gpu_memory_utilization: vLLM's share of each GPU while it is awake
WEIGHT_BUCKET_MB = 2048  # rollout.checkpoint_engine.update_weights_bucket_megabytes
ENTROPY_CHUNK = 2048  # actor.entropy_from_logits_chunk_size
FUSED_CHUNK = 512  # verl.utils.experimental.torch_functional.FusedLinearForPPO's chunk_size

# Assumptions, not in any source: what a process holds outside torch's allocator on an H100-class node
TRAINER_RUNTIME_GIB = 1.0  # the trainer's CUDA context and NCCL communicators
VLLM_ASLEEP_GIB = 1.0  # a sleeping vLLM worker: its CUDA context and the CUDA graphs it keeps
ALLOCATOR_SLACK = 0.05  # torch's caching allocator holds somewhat more than the live tensors

LEAVES_OUT = (
    "allocator fragmentation beyond 5%, the true size of CUDA contexts, NCCL buffers and vLLM's CUDA graphs, "
    "the reference's root unit FSDP1 may keep gathered after a no-grad forward, Ulysses sequence parallelism, "
    "LoRA, FSDP2, host memory; activations are per-token approximations of a Llama/Qwen layer"
)

_ACTOR, _ROLLOUT, _REF, _MODEL = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
)


# ---------------------------------------------------------------------------------------------- token budgets


@dataclass(frozen=True)
class TokenBudgets:
    """Tokens per GPU per micro-batch of each pass (verl's dynamic batches: use_dynamic_bsz=true)."""

    ppo: int  # actor.ppo_max_token_len_per_gpu: the update's micro-batches
    log_prob: int  # rollout.log_prob_max_token_len_per_gpu: the actor's (old) log-probs
    ref_log_prob: int  # ref.log_prob_max_token_len_per_gpu: the reference's log-probs
    sequence: int  # prompt + response: the longest sequence, below which no budget may go


def token_budgets(spec: ExperimentSpec) -> TokenBudgets:
    """The token budgets rpg gives verl, their one home (launch.py writes `ppo` as the actor's
    ppo_max_token_len_per_gpu): two full sequences per GPU pass. rpg sets no log-prob budget, so both
    log-prob passes take verl's default, which is the actor's budget (rollout.yaml and ref.yaml:
    log_prob_max_token_len_per_gpu: ${oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384}).
    A budget below prompt + response is refused by verl (seqlen_balancing.rearrange_micro_batches asserts
    max_token_len >= the longest sequence), and no micro-batch exceeds its budget (it adds micro-batches
    until every one is within it)."""
    sequence = spec.max_prompt_length + spec.max_response_length
    return TokenBudgets(ppo=2 * sequence, log_prob=2 * sequence, ref_log_prob=2 * sequence, sequence=sequence)


# ---------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """What the memory of a run depends on beyond the model: rpg's generated values, verl's defaults, and the
    spec's `verl.overrides` and `verl.site` over both."""

    gpus: int
    budgets: TokenBudgets
    reference_loaded: bool  # verl's ref worker (need_reference_policy: use_kl_in_reward or use_kl_loss)
    utilization: float = VLLM_UTILIZATION
    tensor_parallel: int = 1  # rollout.tensor_model_parallel_size
    free_cache_engine: bool = True  # vLLM sleeps (level 2: weights and KV cache freed) while the trainer works
    param_offload: bool = False
    optimizer_offload: bool = False
    entropy_in_update: bool = False  # entropy_coeff != 0 or actor.calculate_entropy
    entropy_chunking: bool = False
    entropy_chunk: int = ENTROPY_CHUNK
    entropy_checkpointing: bool = False
    fused_kernels: bool = False  # model.use_fused_kernels: log-probs and entropy without full logits
    gradient_checkpointing: bool = True
    unit_temperature: bool = True  # temperature 1 scales no logits (transformer_impl._scale_logits_by_temperature)


def settings(spec: ExperimentSpec, generated: Sequence[str]) -> Settings:
    """The run's `Settings`, read from `generated`, the overrides `launch.overrides` hands verl for it (what rpg
    generates, then the spec's `verl.overrides` and `verl.site`): the rules stay launch's, verl's defaults fill
    in where no override is given."""
    given = _values(generated)

    def number(key: str, default: float, *aliases: str) -> float:
        for name in (key, *aliases):
            if name in given:
                try:
                    return float(given[name])
                except ValueError:
                    raise SpecError(f"{name}={given[name]!r} is not a number; allowed: a number", "verl") from None
        return default

    def flag(key: str, default: bool, *aliases: str) -> bool:
        for name in (key, *aliases):
            if name in given:
                return given[name].strip().lower() in ("true", "1", "yes")
        return default

    budgets = token_budgets(spec)
    ppo = int(number(f"{_ACTOR}.ppo_max_token_len_per_gpu", budgets.ppo))
    budgets = dataclasses.replace(
        budgets,
        ppo=ppo,  # the log-prob budgets follow the actor's (the interpolation above) unless set
        log_prob=int(number(f"{_ROLLOUT}.log_prob_max_token_len_per_gpu", ppo)),
        ref_log_prob=int(number(f"{_REF}.log_prob_max_token_len_per_gpu", ppo)),
    )
    gpus_per_node = spec.resources.gpus_per_node
    chunking, chunk, checkpointing = (
        f"{_ACTOR}.entropy_from_logits_with_chunking",
        f"{_ACTOR}.entropy_from_logits_chunk_size",
        f"{_ACTOR}.entropy_checkpointing",
    )
    fsdp = f"{_ACTOR}.fsdp_config"  # the actor's fsdp_config reads the three from the actor (oc.select)
    return Settings(
        gpus=spec.resources.nodes * gpus_per_node,
        budgets=budgets,
        # verl's need_reference_policy (trainer/ppo/utils.py): a KL in the reward or a KL loss
        reference_loaded=flag("algorithm.use_kl_in_reward", False) or flag(f"{_ACTOR}.use_kl_loss", False),
        utilization=number(f"{_ROLLOUT}.gpu_memory_utilization", VLLM_UTILIZATION),
        tensor_parallel=int(number(f"{_ROLLOUT}.tensor_model_parallel_size", 1)),
        free_cache_engine=flag(f"{_ROLLOUT}.free_cache_engine", True),
        param_offload=flag(f"{fsdp}.param_offload", False),
        optimizer_offload=flag(f"{fsdp}.optimizer_offload", False),
        entropy_in_update=number(f"{_ACTOR}.entropy_coeff", spec.entropy_coeff) != 0
        or flag(f"{_ACTOR}.calculate_entropy", False),
        entropy_chunking=flag(chunking, False, chunking.replace(_ACTOR, fsdp)),
        entropy_chunk=int(number(chunk, ENTROPY_CHUNK, chunk.replace(_ACTOR, fsdp))),
        entropy_checkpointing=flag(checkpointing, False, checkpointing.replace(_ACTOR, fsdp)),
        fused_kernels=flag(f"{_MODEL}.use_fused_kernels", False),
        gradient_checkpointing=flag(f"{_MODEL}.enable_gradient_checkpointing", True),
        unit_temperature=number(f"{_ROLLOUT}.temperature", spec.rollout.temperature) == 1.0,
    )


def _values(generated: Sequence[str]) -> dict[str, str]:
    """key -> value of Hydra overrides (a later one wins, as in Hydra; `~key` deletions dropped)."""
    out = {}
    for item in generated:
        if not item.startswith("~"):
            out[override_key(item)] = item.split("=", 1)[1].strip().strip("'\"")
    return out


# ---------------------------------------------------------------------------------------------- memory terms
# Bytes on one GPU. P: parameters (each once), N: GPUs, T: tokens of the largest micro-batch, V: vocabulary.


def sharded_weights(shape: ModelShape, gpus: int) -> float:
    """4 P / N: the actor's fp32 weights, sharded over every GPU (engine/fsdp.yaml model_dtype: fp32;
    transformer_impl.FSDPEngine._build_fsdp_module: FSDP1 FULL_SHARD over one mesh of all ranks, fsdp_size -1).
    On the GPU in every phase unless fsdp_config.param_offload."""
    return FP32 * shape.params / gpus


def sharded_optimizer(shape: ModelShape, gpus: int) -> float:
    """8 P / N: two fp32 states per parameter shard (torch.optim.AdamW's exp_avg and exp_avg_sq; rpg's
    schedule-free AdamW keeps z and exp_avg_sq alike: optim.py). Created at the first step, then on the GPU
    in every phase unless fsdp_config.optimizer_offload (which still loads them for the update: base.py
    BaseEngineCtx moves the optimizer in on train_mode)."""
    return ADAM_STATES * FP32 * shape.params / gpus


def sharded_gradients(shape: ModelShape, gpus: int) -> float:
    """4 P / N: fp32 gradients of the shards, reduce-scattered after every micro-batch (engine/fsdp.yaml
    use_no_sync_for_gradient_accumulation: false; MixedPrecision reduce_dtype fp32). Freed when the update ends
    (EngineTrainModeCtx zeroes them, set_to_none)."""
    return FP32 * shape.params / gpus


def optimizer_temporary(shape: ModelShape, gpus: int) -> float:
    """4 P / N during optimizer.step: torch's foreach AdamW allocates exp_avg_sq_sqrt (torch/optim/adam.py
    _multi_tensor_adam), schedule-free its denom, one fp32 copy of the states' shape, while the gradients live."""
    return FP32 * shape.params / gpus


def gathered_root(shape: ModelShape) -> float:
    """2 B x (embedding + head + final norm): FSDP1 wraps each decoder layer (the model's _no_split_modules,
    fsdp_utils.get_fsdp_wrap_policy) and leaves the embeddings, head and final norm to the root unit, gathered
    in bf16 (MixedPrecision param_dtype) for the whole forward and backward (torch's _post_forward_reshard
    keeps the root unsharded)."""
    return BF16 * (shape.embedding_params + shape.hidden_size)


def gathered_layers(shape: ModelShape) -> float:
    """2 x 2 B x one layer: the layer being computed and the one prefetched (FSDP1's default
    backward_prefetch BACKWARD_PRE, limit_all_gathers keeps it to one ahead), in bf16."""
    return 2 * BF16 * shape.layer_params


def layer_gradient(shape: ModelShape) -> float:
    """(2 + 4) B x one layer: its unsharded bf16 gradient and the fp32 copy FSDP reduce-scatters
    (reduce_dtype fp32), before the shard is kept."""
    return (BF16 + FP32) * shape.layer_params


def checkpointed_activations(shape: ModelShape, tokens: int, checkpointing: bool = True) -> float:
    """L x T x h x 2 B: with gradient checkpointing (rpg sets model.enable_gradient_checkpointing; verl calls
    gradient_checkpointing_enable(use_reentrant=False)) each decoder layer keeps only its bf16 input for the
    backward; without it, every layer keeps what `recomputed_layer` counts for one."""
    if not checkpointing:
        return shape.num_layers * recomputed_layer(shape, tokens)
    return shape.num_layers * tokens * shape.hidden_size * BF16


def recomputed_layer(shape: ModelShape, tokens: int) -> float:
    """T x (18h + 2(3q + 4kv) + 14i) B, an approximation: what one decoder layer saves when it is recomputed
    in the backward (two RMSNorms with their fp32 upcast, q/k/v before and after rotary, flash-attention's
    output, the SwiGLU's gate, up, activation and product) plus the gradients of its widest tensors."""
    h, q, kv, inter = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.intermediate_size
    return tokens * (18 * h + 2 * (3 * q + 4 * kv) + 14 * inter)


def forward_layer(shape: ModelShape, tokens: int) -> float:
    """T x (8h + 2(q + 2kv) + 6i) B, an approximation: one decoder layer's working set in a no-gradient
    forward (the log-prob passes), where nothing is kept for a backward."""
    h, q, kv, inter = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.intermediate_size
    return tokens * (8 * h + 2 * (q + 2 * kv) + 6 * inter)


def head_activations(shape: ModelShape, tokens: int) -> float:
    """T x h x 8 B: the final RMSNorm's fp32 upcast and bf16 output, the head's input."""
    return tokens * shape.hidden_size * 8


def logits(shape: ModelShape, tokens: int, s: Settings, *, grad: bool, entropy: bool) -> float:
    """The largest micro-batch's logits and what is computed from them (transformer_impl.FSDPEngineWithLMHead).
    The head runs under bf16 autocast on bf16 weights, so logits are bf16: T x V x 2 B. Log-probs come from
    flash-attn's cross entropy (torch_functional.logprobs_from_logits; rpg's GPU install requires flash-attn),
    which upcasts inside its kernel and, without entropy, writes its gradient into the logits
    (inplace_backward): no second copy. Added to that:
    - a scaled copy when the temperature is not 1 (_scale_logits_by_temperature);
    - with entropy and no gradient (the actor's log-prob pass always computes it): the compiled
      entropy_from_logits' fp32 T x V buffer (engine/fsdp.yaml use_torch_compile: true; inductor's fused kernel
      still writes one, as its generated CPU code shows; eager would write two);
    - with entropy in the update: the cross entropy's own gradient (inplace_backward off) and the fp32 softmax
      kept with its gradient (4 + 4 B), or only its recompute (4 B) with entropy_checkpointing;
    - entropy_from_logits_with_chunking: a chunk of 2048 rows at a time (fp32 copy, softmax, product: 12 B)
      in place of the T x V buffer, where nothing is kept for a backward (no gradient, or checkpointing).
    With model.use_fused_kernels no logits exist: FusedLinearForPPO works 512 tokens at a time (16 B per
    logit: bf16, fp32 upcast, softmax, gradient)."""
    vocab = shape.vocab_size
    if s.fused_kernels:
        return FUSED_CHUNK * vocab * 16
    per_logit = BF16 + (0 if s.unit_temperature else BF16)
    chunk = 0.0
    if entropy:
        chunked = s.entropy_chunking and (not grad or s.entropy_checkpointing)
        if chunked:
            chunk = min(s.entropy_chunk, tokens) * vocab * 12
        elif grad:
            per_logit += FP32 if s.entropy_checkpointing else 2 * FP32
        else:
            per_logit += FP32
        if grad:
            per_logit += BF16  # the cross entropy's gradient, no longer written into the logits
    return tokens * vocab * per_logit + chunk


def vllm_awake(s: Settings, gpu_gib: float) -> float:
    """utilization x GPU: vLLM sizes its KV cache so that its weights, activations and cache take that share of
    each GPU (rollout.gpu_memory_utilization, default 0.5; vLLM's engine args: a per-instance fraction)."""
    return s.utilization * gpu_gib * GIB


def vllm_asleep(s: Settings, gpu_gib: float) -> float:
    """What vLLM holds while the trainer works: verl puts it to sleep at level 2 (vllm_async_server
    _resolve_sleep_level: weights and KV cache freed) when free_cache_engine (default true); its CUDA context
    and graphs stay (VLLM_ASLEEP_GIB, assumed). Without free_cache_engine it stays awake."""
    return VLLM_ASLEEP_GIB * GIB if s.free_cache_engine else vllm_awake(s, gpu_gib)


def vllm_weights(shape: ModelShape, s: Settings) -> float:
    """2 P / TP: vLLM's bf16 weights on each GPU, resumed before the weight sync (engine_workers.update_weights
    resumes "weights", then loads the actor's, then the KV cache)."""
    return BF16 * shape.params / s.tensor_parallel


# ---------------------------------------------------------------------------------------------- phases


@dataclass(frozen=True)
class Phase:
    name: str
    parts: dict[str, float]  # GiB by part

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def phases(shape: ModelShape, s: Settings, gpu_gib: float) -> list[Phase]:
    """Each phase of a step on one GPU, as parts in GiB (see the module doc for the order)."""
    n, b = s.gpus, s.budgets
    weights = sharded_weights(shape, n)
    states = sharded_optimizer(shape, n)
    runtime = TRAINER_RUNTIME_GIB * GIB
    asleep = vllm_asleep(s, gpu_gib)

    def phase(name: str, trainer: dict[str, float], other: dict[str, float]) -> Phase:
        trainer = {k: v for k, v in trainer.items() if v}
        slack = ALLOCATOR_SLACK * sum(trainer.values())
        parts = {**trainer, "allocator slack (5%)": slack, **other}
        return Phase(name, {k: v / GIB for k, v in parts.items()})

    resident = {"actor weights (fp32 shard)": weights, "optimizer states (fp32 shard)": states}
    rollout_resident = {
        "actor weights (fp32 shard)": 0.0 if s.param_offload else weights,
        "optimizer states (fp32 shard)": 0.0 if s.optimizer_offload else states,
    }
    log_prob_resident = {**resident, "optimizer states (fp32 shard)": rollout_resident["optimizer states (fp32 shard)"]}
    out = [
        phase("rollout", rollout_resident, {"trainer runtime": runtime, "vLLM (awake)": vllm_awake(s, gpu_gib)}),
        phase(
            "weight sync",
            {
                **log_prob_resident,
                "sync bucket": WEIGHT_BUCKET_MB * 2**20,
                "largest gathered tensor (bf16)": BF16 * shape.vocab_size * shape.hidden_size,
            },
            {"trainer runtime": runtime, "vLLM weights": vllm_weights(shape, s) + VLLM_ASLEEP_GIB * GIB},
        ),
        phase(
            "log-prob",
            {
                **log_prob_resident,
                "gathered bf16 weights": gathered_root(shape) + gathered_layers(shape),
                "activations": forward_layer(shape, b.log_prob) + head_activations(shape, b.log_prob),
                "logits": logits(shape, b.log_prob, s, grad=False, entropy=True),
            },
            {"trainer runtime": runtime, "vLLM (asleep)": asleep},
        ),
    ]
    if s.reference_loaded:  # the reference's fp32 shard is CPU-offloaded (CPUOffload for forward_only engines)
        out.append(
            phase(
                "reference log-prob",
                {
                    **log_prob_resident,
                    "gathered bf16 weights": gathered_root(shape) + gathered_layers(shape),
                    "activations": forward_layer(shape, b.ref_log_prob) + head_activations(shape, b.ref_log_prob),
                    "logits": logits(shape, b.ref_log_prob, s, grad=False, entropy=False),
                },
                {"trainer runtime": runtime, "vLLM (asleep)": asleep},
            )
        )
    # the update's backward peaks either at the head (logits and their gradient) or in a recomputed layer
    head = {
        "logits": logits(shape, b.ppo, s, grad=True, entropy=s.entropy_in_update),
        "head activations": head_activations(shape, b.ppo),
    }
    layer = {
        "recomputed layer": recomputed_layer(shape, b.ppo) if s.gradient_checkpointing else 0.0,
        "gathered layer weights and gradient": gathered_layers(shape) + layer_gradient(shape),
    }
    out.append(
        phase(
            "update",
            {
                **resident,
                "gradients (fp32 shard)": sharded_gradients(shape, n),
                "gathered bf16 root weights and gradient": 2 * gathered_root(shape),
                "checkpointed activations": checkpointed_activations(shape, b.ppo, s.gradient_checkpointing),
                **(head if sum(head.values()) >= sum(layer.values()) else layer),
            },
            {"trainer runtime": runtime, "vLLM (asleep)": asleep},
        )
    )
    out.append(
        phase(
            "optimizer step",
            {
                **resident,
                "gradients (fp32 shard)": sharded_gradients(shape, n),
                "optimizer step temporary": optimizer_temporary(shape, n),
            },
            {"trainer runtime": runtime, "vLLM (asleep)": asleep},
        )
    )
    return out


# ---------------------------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class MemoryEstimate:
    """One GPU's peak: the phase it is in, its parts (GiB), whether it fits, and the setting that makes it fit."""

    gpu_gib: float
    phase: str
    parts: dict[str, float]
    phases: tuple[Phase, ...] = field(repr=False)
    fix: str | None = None  # one line, when it does not fit
    leaves_out: str = LEAVES_OUT

    @property
    def peak_gib(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.gpu_gib

    def __str__(self) -> str:
        verdict = "fits" if self.fits else f"does not fit: {self.fix}"
        return f"~{self.peak_gib:.1f} of {self.gpu_gib:g} GiB per GPU at its peak ({self.phase}): {verdict}"


def gpu_memory(
    spec: ExperimentSpec, shape: ModelShape, generated: Sequence[str], gpu_gib: float = 80.0
) -> MemoryEstimate:
    """The per-GPU peak of `spec` as a verl run (FSDP trainer and vLLM on each of its GPUs) with `shape`'s model,
    on GPUs of `gpu_gib` (an 80 GB card shows torch about 79 GiB; pass that for a tight check)."""
    s = settings(spec, generated)
    return _estimate(shape, s, gpu_gib, fix=_fix(shape, s, gpu_gib))


def _estimate(shape: ModelShape, s: Settings, gpu_gib: float, fix: str | None = None) -> MemoryEstimate:
    every = phases(shape, s, gpu_gib)
    peak = max(every, key=lambda p: p.total)
    estimate = MemoryEstimate(gpu_gib, peak.name, peak.parts, tuple(every))
    return dataclasses.replace(estimate, fix=fix) if not estimate.fits else estimate


def _fits(shape: ModelShape, s: Settings, gpu_gib: float) -> bool:
    return _estimate(shape, s, gpu_gib).fits


def _fix(shape: ModelShape, s: Settings, gpu_gib: float) -> str | None:
    """The one setting that makes the run fit, tried in the order of what it costs (None if it fits): for the
    phase at the peak, a smaller vLLM share or token budget first, then chunked entropy, fused kernels or
    offload. Each candidate is checked with the same estimate."""
    if _fits(shape, s, gpu_gib):
        return None
    peak = _estimate(shape, s, gpu_gib).phase
    seq = s.budgets.sequence
    tries: list[tuple[str, Settings]] = []
    if peak in ("rollout", "weight sync"):
        without_vllm = next(p for p in phases(shape, _with(s, utilization=0.0), gpu_gib) if p.name == "rollout")
        share = math.floor(100 * (gpu_gib - without_vllm.total) / gpu_gib) / 100
        if share * gpu_gib * GIB > 1.2 * vllm_weights(shape, s):  # room for vLLM's weights and some KV cache
            tries.append(
                (f"lower {_ROLLOUT}.gpu_memory_utilization to {share:.2f} (verl.site)", _with(s, utilization=share))
            )
        offload = f"set {_ACTOR}.fsdp_config.param_offload=true and {_ACTOR}.fsdp_config.optimizer_offload=true"
        tries.append((f"{offload} (verl.site)", _with(s, param_offload=True, optimizer_offload=True)))
    if peak in ("log-prob", "reference log-prob"):
        chunking = f"set {_ACTOR}.entropy_from_logits_with_chunking=true (verl.site)"
        tries.append((chunking, _with(s, entropy_chunking=True)))
        name, key = ("log_prob", _ROLLOUT) if peak == "log-prob" else ("ref_log_prob", _REF)
        tokens = _largest_budget(shape, s, gpu_gib, name)
        if tokens is not None:
            message = f"lower {key}.log_prob_max_token_len_per_gpu to {tokens} (verl.site; at least {seq})"
            tries.append((message, _budget(s, name, tokens)))
    if peak == "update":
        tokens = _largest_budget(shape, s, gpu_gib, "ppo")
        if tokens is not None:
            message = f"lower {_ACTOR}.ppo_max_token_len_per_gpu to {tokens} (verl.site; at least {seq})"
            tries.append((message, _budget(s, "ppo", tokens)))
        tries.append((f"set {_MODEL}.use_fused_kernels=true (verl.site)", _with(s, fused_kernels=True)))
    for message, candidate in tries:
        if _fits(shape, candidate, gpu_gib):
            return message
    return (
        f"no one setting fits {shape.params / 1e9:.2f}B parameters on {s.gpus} GPU(s) of {gpu_gib:g} GiB; "
        "allowed: more GPUs (resources.nodes x gpus_per_node) or a smaller model"
    )


def _with(s: Settings, **changes: object) -> Settings:
    return dataclasses.replace(s, **changes)


def _budget(s: Settings, name: str, tokens: int) -> Settings:
    """`s` with one token budget changed; lowering the actor's lowers the log-prob budgets that follow it
    (equal to it: verl's default interpolation)."""
    changes = {name: tokens}
    if name == "ppo":
        changes.update({k: tokens for k in ("log_prob", "ref_log_prob") if getattr(s.budgets, k) == s.budgets.ppo})
    return dataclasses.replace(s, budgets=dataclasses.replace(s.budgets, **changes))


def _largest_budget(shape: ModelShape, s: Settings, gpu_gib: float, name: str) -> int | None:
    """The largest budget `name` below the current one (at least prompt + response, rounded down to 1024
    where that stays above it) with which the run fits; None if even the smallest does not."""
    low, high = s.budgets.sequence, getattr(s.budgets, name)
    if low >= high or not _fits(shape, _budget(s, name, low), gpu_gib):
        return None
    while high - low > 1:  # fits at low, not at high
        mid = (low + high) // 2
        low, high = (mid, high) if _fits(shape, _budget(s, name, mid), gpu_gib) else (low, mid)
    rounded = low // 1024 * 1024
    return rounded if rounded >= s.budgets.sequence else low


# ---------------------------------------------------------------------------------------------- disk


@dataclass(frozen=True)
class DiskEstimate:
    """What a run's checkpoints take (GB, 1e9 bytes) under its `checkpoints` setting."""

    full_parts: dict[str, float]  # one full checkpoint, by part
    weights_gb: float  # a checkpoint thinned to its Hugging Face weights (actor/huggingface/)
    saves: int  # checkpoints a run writes
    kept_full: int  # full checkpoints left at the end
    kept_weights: int  # weights-only checkpoints left at the end
    peak_gb: float  # the most on disk at once: the newest written before the oldest full one is thinned

    @property
    def full_gb(self) -> float:
        return sum(self.full_parts.values())

    @property
    def run_gb(self) -> float:
        """What the run leaves on disk."""
        return self.kept_full * self.full_gb + self.kept_weights * self.weights_gb

    @property
    def all_full_gb(self) -> float:
        """What it would leave keeping every checkpoint whole (checkpoints.keep: null)."""
        return self.saves * self.full_gb


def checkpoint_steps(steps: int, save_every: int) -> list[int]:
    """The steps verl saves at: every save_freq steps and the last one (trainer/ppo/v1/trainer_base.py fit:
    save_freq > 0 and (is_last_step or global_steps % save_freq == 0), steps counted from 1)."""
    saves = list(range(save_every, steps + 1, save_every))
    return saves if saves and saves[-1] == steps else [*saves, steps]


def disk(spec: ExperimentSpec, shape: ModelShape) -> DiskEstimate:
    """Bytes per checkpoint and per run (fp32 throughout, as verl saves: utils/checkpoint/fsdp_checkpoint_manager):
    model shards (4 P: the sharded state dict of the fp32 weights), optimizer (8 P: both moments), Hugging Face
    weights (4 P: the gathered fp32 state dict, save_contents hf_model, tied head saved once), and rpg's
    reference shards (4 P, reference.py save_reference: the fp32 reference engine's shards) when the reference
    is reset (`reference` an `Every`). Tokenizer, config, lr scheduler and data-loader state are megabytes and
    left out. `checkpoints.keep` full ones stay; with weights "all" the older are thinned to their HF weights,
    with "kept" deleted."""
    p = shape.params
    parts = {
        "model shards (fp32)": FP32 * p / GB,
        "optimizer (fp32 moments)": ADAM_STATES * FP32 * p / GB,
        "HF weights (fp32)": FP32 * p / GB,
    }
    if isinstance(spec.reference, Every):
        parts["reference shards (fp32)"] = FP32 * p / GB
    saves = len(checkpoint_steps(spec.steps, spec.save_every))
    keep = spec.checkpoints.keep
    weights = parts["HF weights (fp32)"]
    thin = spec.checkpoints.weights == "all"

    def left(count: int) -> tuple[int, int]:
        full = count if keep is None else min(keep, count)
        return full, (count - full) if thin else 0

    full, thinned = left(saves)
    before_full, before_thinned = left(saves - 1)
    full_gb = sum(parts.values())
    peak = (before_full + 1) * full_gb + before_thinned * weights
    return DiskEstimate(parts, weights, saves, full, thinned, max(peak, full * full_gb + thinned * weights))
