"""One GPU's memory in each phase of a verl run's step, in bytes: every term with where verl 0.9.1 (and torch,
transformers, vLLM as verl pairs them) decides it, and the phases they add up to (`phases`). Pure Python; the
run's settings are budgets.py's, the peak and the setting that makes it fit footprint.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rpg_cli.backends.verl.budgets import Settings

if TYPE_CHECKING:
    from rpg_cli.model_shape import ModelShape

GIB = 2**30  # memory is reported in GiB (what torch and nvidia-smi count)
FP32, BF16 = 4, 2
ADAM_STATES = 2  # fp32 tensors per parameter: AdamW's exp_avg and exp_avg_sq; schedule-free's z and exp_avg_sq

# verl 0.9.1's defaults where rpg sets nothing (trainer/config/rollout/rollout.yaml)
WEIGHT_BUCKET_MB = 2048  # rollout.checkpoint_engine.update_weights_bucket_megabytes
FUSED_CHUNK = 512  # verl.utils.experimental.torch_functional.FusedLinearForPPO's chunk_size

# Assumptions, not in any source: what a process holds outside torch's allocator on an H100-class node
TRAINER_RUNTIME_GIB = 1.0  # the trainer's CUDA context and NCCL communicators
VLLM_ASLEEP_GIB = 1.0  # a sleeping vLLM worker: its CUDA context and the CUDA graphs it keeps
ALLOCATOR_SLACK = 0.05  # torch's caching allocator holds somewhat more than the live tensors


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
