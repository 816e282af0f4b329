"""The losses the paper ran inside verl, against verl 0.9.1's own functions (MATH.md section 4).

`grpo` is the paper's GRPO baseline: verl's dual-clip PPO loss plus kl_loss_coef times the aggregate of
its `low_var_kl` (k3 of pi_ref/pi_theta, log-ratio clamped to +-20, value to [-10, 10]). `grpo_corrected`
weights that same clamped k3 by w. The KL loss of the PPO-family runs (REINFORCE++ as the scripts ran it)
is verl's `kl_penalty` aggregated like the policy loss. Value and gradient, on random padded batches
whose log-ratios reach +-30, so every clamp is exercised. Skipped where verl is not installed.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl", reason="the verl extra is not installed")

from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla, kl_penalty  # noqa: E402

from rpg_cli.algorithms import LOSS_AGG_MODES, kl_penalty_loss, policy_loss  # noqa: E402
from rpg_cli.backends.verl.launch import KL_LOSS_ESTIMATORS  # noqa: E402

F64 = torch.float64
EPS_LOW, EPS_HIGH, CLIP_C, BETA = 0.2, 0.28, 10.0, 1e-3


class ActorSettings(dict):
    """The fields of verl's actor config that compute_policy_loss_vanilla reads (a Mapping with .get)."""

    __getattr__ = dict.__getitem__


SETTINGS = ActorSettings(
    clip_ratio=EPS_LOW, clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH, clip_ratio_c=CLIP_C, global_batch_info={}
)


def extreme_batch(seed: int, b: int = 8, t: int = 12):
    """Padded float64 batch: log pi_theta - log pi_old and log pi_ref - log pi_theta reach +-30 on some tokens
    (beyond both clamps), moderate elsewhere; padding holds finite junk, as verl's padded tensors do."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 4
    log_w = 0.5 * torch.randn(b, t, generator=g, dtype=F64)
    log_ref_ratio = 0.5 * torch.randn(b, t, generator=g, dtype=F64)
    pick = torch.rand(b, t, generator=g, dtype=F64)
    log_w = torch.where(pick < 0.15, torch.full_like(log_w, 30.0), log_w)
    log_w = torch.where(pick > 0.85, torch.full_like(log_w, -30.0), log_w)
    pick = torch.rand(b, t, generator=g, dtype=F64)
    log_ref_ratio = torch.where(pick < 0.15, torch.full_like(log_w, 30.0), log_ref_ratio)
    log_ref_ratio = torch.where(pick > 0.85, torch.full_like(log_w, -30.0), log_ref_ratio)
    log_ref_ratio = torch.where((pick > 0.5) & (pick < 0.6), torch.full_like(log_w, -12.0), log_ref_ratio)  # k3 > 10
    logp = old + log_w
    ref = logp + log_ref_ratio
    adv = torch.randn(b, 1, generator=g, dtype=F64).expand(b, t).clone()
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return logp, old, ref, adv, mask


def verl_grpo(logp, old, ref, adv, mask, agg, corrected):
    pg_loss, _ = compute_policy_loss_vanilla(old, logp, adv, mask, agg, SETTINGS)
    kld = kl_penalty(logprob=logp, ref_logprob=ref, kl_penalty="low_var_kl")
    if corrected:  # the same clamped k3, weighted by verl's own (clamped) ratio
        kld = torch.exp(torch.clamp(logp - old, -20.0, 20.0)) * kld
    return pg_loss + BETA * agg_loss(kld, mask, agg)


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", ["grpo", "grpo_corrected"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_equals_verls_ppo_loss_plus_low_var_kl(name, agg, seed):
    logp, old, ref, adv, mask = extreme_batch(seed)
    assert ((logp - old).abs() > 20).any() and ((ref - logp) < -12).any()  # both clamps are reached
    x_ours = logp.clone().requires_grad_(True)
    x_verl = logp.clone().requires_grad_(True)
    ours, _ = policy_loss(
        name,
        log_prob=x_ours,
        old_log_prob=old,
        ref_log_prob=ref,
        advantages=adv,
        response_mask=mask,
        beta=BETA,
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        clip_c=CLIP_C,
        loss_agg_mode=agg,
    )
    theirs = verl_grpo(x_verl, old, ref, adv, mask, agg, corrected=name == "grpo_corrected")
    (g_ours,) = torch.autograd.grad(ours, x_ours)
    (g_verl,) = torch.autograd.grad(theirs, x_verl)
    # seq-mean-token-mean: verl adds its 1e-8 guard to a float32 token count (where it vanishes), ours
    # to a float64 one: 1e-8 relative per sequence
    atol = 1e-9 if agg == "seq-mean-token-mean" else 1e-12
    assert torch.allclose(ours, theirs, rtol=1e-8, atol=atol), (ours.item(), theirs.item())
    assert torch.allclose(g_ours, g_verl, rtol=1e-8, atol=atol)
    assert g_verl.abs().sum() > 0


def test_kl_clamp_off_is_the_exact_k3_and_differs_where_the_clamp_bites():
    logp, old, ref, adv, mask = extreme_batch(3)
    kw = dict(log_prob=logp, old_log_prob=old, ref_log_prob=ref, advantages=adv, response_mask=mask, beta=BETA)
    clamped, _ = policy_loss("grpo", **kw)
    exact, _ = policy_loss("grpo", kl_clamp=False, **kw)
    assert exact > clamped  # k3 beyond 10 is cut by the clamp
    # inside both clamps the two agree exactly
    moderate = extreme_batch(4)
    logp, old, ref, adv, mask = moderate
    inside = ((logp - old).abs() < 20) & ((ref - logp).abs() < 2)
    kw = dict(log_prob=logp, old_log_prob=old, ref_log_prob=ref, advantages=adv, response_mask=mask & inside, beta=BETA)
    assert policy_loss("grpo", **kw)[0] == policy_loss("grpo", kl_clamp=False, **kw)[0]


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("estimator", list(KL_LOSS_ESTIMATORS))
def test_kl_loss_equals_verls_kl_penalty_aggregated(estimator, agg):
    logp, old, _, _, mask = extreme_batch(5)
    x_ours = logp.clone().requires_grad_(True)
    x_verl = logp.clone().requires_grad_(True)
    ours = kl_penalty_loss(estimator, log_prob=x_ours, ref_log_prob=old, response_mask=mask, loss_agg_mode=agg)
    theirs = agg_loss(kl_penalty(x_verl, old, KL_LOSS_ESTIMATORS[estimator]), mask, agg)
    (g_ours,) = torch.autograd.grad(ours, x_ours)
    (g_verl,) = torch.autograd.grad(theirs, x_verl)
    assert torch.allclose(ours, theirs, rtol=1e-8, atol=1e-12)
    assert torch.allclose(g_ours, g_verl, rtol=1e-8, atol=1e-12)
