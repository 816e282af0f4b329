"""Advantage estimators and DAPO's reward-side tricks (MATH.md section 4).

Outcome rewards are one scalar per response (`scores`, shape (batch,)); responses of the same prompt
share a group id (a tensor of ints or any list of hashables, e.g. verl's uid strings). Sequence-level
estimators return (batch,); `to_tokens` broadcasts them over the response mask. REINFORCE++ is
token-level by construction and returns (batch, response_len).

Differences from verl 0.9.1, on purpose (MATH.md is the contract): a group of size 1 has no baseline
information, so its GRPO/RPG/REINFORCE++-baseline/RLOO advantage is 0 (verl's grpo and rloo use mean 0 (and
std 1), i.e. the raw reward; verl's rloo_vectorized gives 0, as here).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from rpg_cli.algorithms.defaults import OVERLONG_BUFFER, OVERLONG_PENALTY_FACTOR

GROUP_STD_EPS = 1e-6
WHITEN_EPS = 1e-8

GroupIds = torch.Tensor | Sequence[Hashable]


def group_index(group_ids: GroupIds, batch: int) -> tuple[torch.Tensor, int]:
    """Dense group index in [0, n_groups) for each sample, and n_groups."""
    if isinstance(group_ids, torch.Tensor):
        if group_ids.shape != (batch,):
            raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}, expected ({batch},)")
        _, index = torch.unique(group_ids, return_inverse=True)
        return index, int(index.max()) + 1 if batch else 0
    if len(group_ids) != batch:
        raise ValueError(f"group_ids has {len(group_ids)} entries, expected {batch}")
    dense: dict[Hashable, int] = {}
    index = torch.tensor([dense.setdefault(g, len(dense)) for g in group_ids], dtype=torch.long)
    return index, len(dense)


def group_stats(scores: torch.Tensor, group_ids: GroupIds) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (group mean, unbiased group std, group size), vectorised with index_add."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be one scalar per response, got shape {tuple(scores.shape)}")
    index, n_groups = group_index(group_ids, scores.shape[0])
    index = index.to(scores.device)
    size = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, index, torch.ones_like(scores))
    total = torch.zeros_like(size).index_add_(0, index, scores)
    mean = (total / size)[index]
    sq_dev = torch.zeros_like(size).index_add_(0, index, (scores - mean).square())
    var = sq_dev / (size - 1).clamp(min=1)
    return mean, var.sqrt()[index], size[index]


def grpo_advantage(scores: torch.Tensor, group_ids: GroupIds, eps: float = GROUP_STD_EPS) -> torch.Tensor:
    """GRPO (and DAPO): (R - mean_g) / (std_g + eps), std unbiased; a singleton group gets 0."""
    mean, std, size = group_stats(scores, group_ids)
    adv = (scores - mean) / (std + eps)
    return torch.where(size > 1, adv, torch.zeros_like(adv))


def rpg_advantage(scores: torch.Tensor, group_ids: GroupIds) -> torch.Tensor:
    """RPG and Dr. GRPO (MATH.md section 9.1): R - mean_g (group mean, no std division); verl's grpo with
    norm_adv_by_std_in_grpo=False on every group of two or more."""
    mean, _, _ = group_stats(scores, group_ids)
    return scores - mean


def rloo_advantage(scores: torch.Tensor, group_ids: GroupIds) -> torch.Tensor:
    """RLOO (MATH.md section 9.2; Ahmadian et al., arXiv 2402.14740): R_i minus the mean of the group's other
    rewards, R_i - (sum_g - R_i) / (n - 1) = n / (n - 1) (R_i - mean_g), as verl's rloo computes it. The baseline
    leaves R_i out, so it is independent of R_i and the estimate unbiased. A group of one has no other reward:
    its advantage is 0 (verl's rloo leaves its raw reward, its rloo_vectorized gives 0)."""
    mean, _, size = group_stats(scores, group_ids)
    adv = (scores - mean) * size / (size - 1).clamp(min=1)
    return torch.where(size > 1, adv, torch.zeros_like(adv))


def batch_mean_advantage(scores: torch.Tensor) -> torch.Tensor:
    """`rpg_batchmean`: R - mean over the whole batch."""
    return scores - scores.mean()


def to_tokens(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sequence advantage to its valid tokens (0 on padding)."""
    return advantages.unsqueeze(-1) * response_mask.to(advantages.dtype)


def masked_whiten(values: torch.Tensor, response_mask: torch.Tensor, eps: float = WHITEN_EPS) -> torch.Tensor:
    """(x - mean) * rsqrt(var + eps) over all valid tokens of the batch (unbiased var); 0 on padding."""
    mask = response_mask.bool()
    n = mask.sum()
    if n < 2:
        raise ValueError("whitening needs at least two valid tokens in the batch")
    valid = torch.where(mask, values, torch.zeros_like(values))
    mean = valid.sum() / n
    var = torch.where(mask, values - mean, torch.zeros_like(values)).square().sum() / (n - 1)
    return torch.where(mask, (values - mean) * torch.rsqrt(var + eps), torch.zeros_like(values))


def reward_kl_penalty(
    old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """REINFORCE++'s per-token KL penalty (MATH.md section 4, before beta): k1 = old_logp - ref_logp on
    valid tokens, 0 on padding. `beta` times it is subtracted from the reward (verl's use_kl_in_reward)."""
    mask = response_mask.bool()
    return torch.where(mask, old_log_prob - ref_log_prob, torch.zeros_like(old_log_prob))


def reinforce_pp_returns(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_prob: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
    beta: float = 0.0,
) -> torch.Tensor:
    """REINFORCE++ token returns (gamma = 1): R minus the k1 penalties of this and all later tokens.

    The per-token reward is -beta * reward_kl_penalty, plus R on the last valid token; the return
    of token t is the sum of the rewards from t to the end of the response.
    """
    mask = response_mask.bool()
    reward = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    if beta:
        if old_log_prob is None or ref_log_prob is None:
            raise ValueError("REINFORCE++ with beta > 0 needs old_log_prob and ref_log_prob")
        reward = -beta * reward_kl_penalty(old_log_prob, ref_log_prob, mask)
    last = (mask.long().cumsum(-1) == mask.sum(-1, keepdim=True)) & mask
    reward = reward + torch.where(last, scores.unsqueeze(-1), torch.zeros_like(reward))
    returns = reward.flip(-1).cumsum(-1).flip(-1)
    return torch.where(mask, returns, torch.zeros_like(returns))


def reinforce_pp_advantage(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_prob: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
    beta: float = 0.0,
) -> torch.Tensor:
    """REINFORCE++: token returns with the k1 KL penalty folded in, whitened over the batch's tokens."""
    returns = reinforce_pp_returns(scores, response_mask, old_log_prob, ref_log_prob, beta)
    return masked_whiten(returns, response_mask)


def reinforce_pp_baseline_advantage(
    scores: torch.Tensor, group_ids: GroupIds, response_mask: torch.Tensor
) -> torch.Tensor:
    """REINFORCE++-baseline: R - mean_g per group, broadcast to tokens, whitened over the batch's tokens."""
    return masked_whiten(to_tokens(rpg_advantage(scores, group_ids), response_mask), response_mask)


def dynamic_sampling_keep(scores: torch.Tensor, group_ids: GroupIds) -> torch.Tensor:
    """DAPO dynamic sampling (MATH.md section 4): keep the responses of groups whose rewards are not all
    equal, and of groups of one response (bool mask), as the paper's fork does (`std > 0 or size == 1`).
    `scores` is the filter metric: raw accuracy in the runs, before any length penalty."""
    index, n_groups = group_index(group_ids, scores.shape[0])
    index = index.to(scores.device)
    lo = torch.full((n_groups,), float("inf"), dtype=scores.dtype, device=scores.device)
    hi = torch.full((n_groups,), float("-inf"), dtype=scores.dtype, device=scores.device)
    lo = lo.scatter_reduce(0, index, scores, reduce="amin")
    hi = hi.scatter_reduce(0, index, scores, reduce="amax")
    size = torch.zeros(n_groups, dtype=torch.long, device=scores.device).index_add_(0, index, torch.ones_like(index))
    return ((hi > lo) | (size == 1))[index]


def overlong_penalty(
    response_length: torch.Tensor,
    max_response_length: int,
    buffer: int = OVERLONG_BUFFER,
    penalty_factor: float = OVERLONG_PENALTY_FACTOR,
) -> torch.Tensor:
    """DAPO overlong reward shaping: min(-(L - (Lmax - buffer)) / buffer, 0) * factor, added to the reward.

    0 up to Lmax - buffer, then linearly down to -factor at Lmax.
    """
    if not 0 < buffer <= max_response_length:
        raise ValueError(f"overlong buffer must be in (0, max_response_length={max_response_length}], got {buffer}")
    length = response_length if response_length.is_floating_point() else response_length.to(torch.get_default_dtype())
    exceed = length - (max_response_length - buffer)
    return (-exceed / buffer * penalty_factor).clamp(max=0.0)


# ---------------------------------------------------------------- by name


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator reads of a step (MATH.md section 4)."""

    rewards: torch.Tensor  # one per response, net of any KL-in-reward penalty
    scores: torch.Tensor  # one per response, before it (REINFORCE++ folds the penalty in per token itself)
    group: torch.Tensor  # the prompt each response answers
    mask: torch.Tensor  # the response tokens
    old_log_prob: torch.Tensor
    ref_log_prob: torch.Tensor  # pi_old's own for the iterative reference (a penalty of 0)
    beta: float  # the KL-in-reward coefficient (0 unless the algorithm's beta is in the reward)


# rpg's advantage estimators (the keys of rpg_cli.algorithms.table.ADVANTAGES) -> per-token advantages
ESTIMATORS: dict[str, Callable[[AdvantageInputs], torch.Tensor]] = {
    "grpo": lambda x: to_tokens(grpo_advantage(x.rewards, x.group), x.mask),
    "rpg": lambda x: to_tokens(rpg_advantage(x.rewards, x.group), x.mask),
    "rloo": lambda x: to_tokens(rloo_advantage(x.rewards, x.group), x.mask),
    "reinforce_pp": lambda x: reinforce_pp_advantage(x.scores, x.mask, x.old_log_prob, x.ref_log_prob, x.beta),
    "reinforce_pp_baseline": lambda x: reinforce_pp_baseline_advantage(x.rewards, x.group, x.mask),
}
