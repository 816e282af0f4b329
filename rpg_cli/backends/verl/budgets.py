"""What a verl run's memory depends on beyond its model, read before a GPU is paid for: the token budgets rpg
gives verl (`token_budgets`: their one home, launch.py writes them) and the run's `Settings`, read from the
overrides launch.py hands verl (rpg's, then the spec's `verl.overrides` and `verl.site`), verl 0.9.1's defaults
where none is given. Pure Python; the estimate is footprint.py's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rpg_cli.spec import SpecError, override_key

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rpg_cli.spec import ExperimentSpec

# verl 0.9.1's defaults where rpg sets nothing (trainer/config/rollout/rollout.yaml, engine/fsdp.yaml)
VLLM_UTILIZATION = 0.5  # rollout.gpu_memory_utilization: vLLM's share of each GPU while it is awake
ENTROPY_CHUNK = 2048  # actor.entropy_from_logits_chunk_size

# where each role's settings live in verl's config
ACTOR, ROLLOUT, REF, MODEL = (
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
    ppo = int(number(f"{ACTOR}.ppo_max_token_len_per_gpu", budgets.ppo))
    budgets = dataclasses.replace(
        budgets,
        ppo=ppo,  # the log-prob budgets follow the actor's (the interpolation above) unless set
        log_prob=int(number(f"{ROLLOUT}.log_prob_max_token_len_per_gpu", ppo)),
        ref_log_prob=int(number(f"{REF}.log_prob_max_token_len_per_gpu", ppo)),
    )
    gpus_per_node = spec.resources.gpus_per_node
    chunking, chunk, checkpointing = (
        f"{ACTOR}.entropy_from_logits_with_chunking",
        f"{ACTOR}.entropy_from_logits_chunk_size",
        f"{ACTOR}.entropy_checkpointing",
    )
    fsdp = f"{ACTOR}.fsdp_config"  # the actor's fsdp_config reads the three from the actor (oc.select)
    return Settings(
        gpus=spec.resources.nodes * gpus_per_node,
        budgets=budgets,
        # verl's need_reference_policy (trainer/ppo/utils.py): a KL in the reward or a KL loss
        reference_loaded=flag("algorithm.use_kl_in_reward", False) or flag(f"{ACTOR}.use_kl_loss", False),
        utilization=number(f"{ROLLOUT}.gpu_memory_utilization", VLLM_UTILIZATION),
        tensor_parallel=int(number(f"{ROLLOUT}.tensor_model_parallel_size", 1)),
        free_cache_engine=flag(f"{ROLLOUT}.free_cache_engine", True),
        param_offload=flag(f"{fsdp}.param_offload", False),
        optimizer_offload=flag(f"{fsdp}.optimizer_offload", False),
        entropy_in_update=number(f"{ACTOR}.entropy_coeff", spec.entropy_coeff) != 0
        or flag(f"{ACTOR}.calculate_entropy", False),
        entropy_chunking=flag(chunking, False, chunking.replace(ACTOR, fsdp)),
        entropy_chunk=int(number(chunk, ENTROPY_CHUNK, chunk.replace(ACTOR, fsdp))),
        entropy_checkpointing=flag(checkpointing, False, checkpointing.replace(ACTOR, fsdp)),
        fused_kernels=flag(f"{MODEL}.use_fused_kernels", False),
        gradient_checkpointing=flag(f"{MODEL}.enable_gradient_checkpointing", True),
        unit_temperature=number(f"{ROLLOUT}.temperature", spec.rollout.temperature) == 1.0,
    )


def _values(generated: Sequence[str]) -> dict[str, str]:
    """key -> value of Hydra overrides (a later one wins, as in Hydra; `~key` deletions dropped)."""
    out = {}
    for item in generated:
        if not item.startswith("~"):
            out[override_key(item)] = item.split("=", 1)[1].strip().strip("'\"")
    return out
