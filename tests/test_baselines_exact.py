"""Today's baselines (MATH.md section 9) against verl 0.9.1's own registered functions, and their properties.

gspo, cispo, gmpo (verl: geo_mean) and sapo from `policy_loss` against `get_policy_loss_fn(...)` with a real
verl ActorConfig: gradient always, value wherever both define the same surrogate (CISPO's value differs by
construction, by a known term; GMPO's only by verl counting all-padding rows; SAPO's verl always aggregates
seq-mean-token-mean). Float64 and float32, every loss_agg_mode that applies, log-ratios up to +-30, empty rows,
per-token and per-sequence advantages; our side also with NaN/-inf in the padding of every input. Then RLOO's
and Dr. GRPO's pieces against verl's advantage estimators and agg_loss. Skipped where verl is not installed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="the verl extra is not installed")

from verl.trainer.ppo.core_algos import (  # noqa: E402
    agg_loss,
    compute_grpo_outcome_advantage,
    compute_policy_loss_vanilla,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    get_policy_loss_fn,
)
from verl.workers.config import ActorConfig  # noqa: E402

from rpg_cli.algorithms import LOSS_AGG_MODES, aggregate, policy_loss  # noqa: E402
from rpg_cli.algorithms import advantages as A  # noqa: E402
from rpg_cli.algorithms import defaults as d  # noqa: E402

F64, F32 = torch.float64, torch.float32
VERL_NAME = {"gspo": "gspo", "cispo": "cispo", "gmpo": "geo_mean", "sapo": "sapo"}
CLIP = {"gspo": (0.2, 0.28), "cispo": (0.2, 0.28), "gmpo": (0.4, 0.4), "sapo": (0.2, 0.28)}  # wide: clips bite
TAU_POS, TAU_NEG = 1.0, 1.05
# float64: verl adds 1e-8 to token counts (seq-mean-token-mean, geo_mean), we do not: 1e-8 relative per sequence
TOL = {F64: dict(rtol=1e-7, atol=1e-10), F32: dict(rtol=2e-5, atol=1e-6)}


def actor_config(name: str) -> ActorConfig:
    """verl's own ActorConfig (its gspo, cispo and sapo assert isinstance), micro-batch settings only to pass
    its validation; clip ratios and SAPO's temperatures as the test uses them."""
    low, high = CLIP[name]
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        tau_pos=TAU_POS,
        tau_neg=TAU_NEG,
    )


def extreme_batch(seed: int, dtype=F64, per_token: bool = False, empty_row: bool = False, b: int = 8, t: int = 12):
    """Padded batch whose log pi_theta - log pi_old reach +-30 on some tokens, moderate elsewhere; padding
    holds finite junk, as verl's padded tensors do. Rows have >= 2 tokens; `empty_row` masks row 1 out."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 4
    log_w = 0.3 * torch.randn(b, t, generator=g, dtype=F64)
    pick = torch.rand(b, t, generator=g, dtype=F64)
    log_w = torch.where(pick < 0.08, torch.full_like(log_w, 30.0), log_w)
    log_w = torch.where(pick > 0.92, torch.full_like(log_w, -30.0), log_w)
    logp = old + log_w
    if per_token:
        adv = torch.randn(b, t, generator=g, dtype=F64)
    else:
        adv = torch.randn(b, 1, generator=g, dtype=F64).expand(b, t).clone()
    lengths = torch.randint(2, t + 1, (b,), generator=g)
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths[:, None]
    if empty_row:
        mask[1] = False
    return logp.to(dtype), old.to(dtype), adv.to(dtype), mask


def poison(x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    return torch.where(mask, x, torch.full_like(x, value))


def ours(name, logp, old, adv, mask, agg, poisoned=False, **kw):
    """rpg's loss and d loss / d logp; `poisoned` puts -inf in log_prob's padding and NaN in the others'."""
    if poisoned:
        logp, old, adv = poison(logp, mask, -math.inf), poison(old, mask, math.nan), poison(adv, mask, math.nan)
    x = logp.clone().requires_grad_(True)
    low, high = CLIP[name]
    loss, metrics = policy_loss(
        name,
        log_prob=x,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        eps_low=low,
        eps_high=high,
        tau_pos=TAU_POS,
        tau_neg=TAU_NEG,
        loss_agg_mode=agg,
        **kw,
    )
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad, metrics


def verls(name, logp, old, adv, mask, agg):
    """verl's registered loss and its d loss / d logp (verl's ppo_loss hands it a bool mask)."""
    x = logp.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn(VERL_NAME[name])(
        old_log_prob=old, log_prob=x, advantages=adv, response_mask=mask, loss_agg_mode=agg, config=actor_config(name)
    )
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad, metrics


def agg_weight(mask: torch.Tensor, agg: str) -> torch.Tensor:
    """d aggregate / d loss_t for each token: how a mode weights one token's loss (0 on padding)."""
    m = mask.to(F64)
    rows = (m.sum(-1, keepdim=True) > 0).to(F64)
    if agg == "token-mean":
        return m / m.sum()
    if agg == "token-sum":
        return m
    if agg == "seq-mean-token-sum":
        return m / rows.sum()
    if agg == "seq-mean-token-sum-norm":
        return m / rows.sum() / mask.shape[-1]
    return m / m.sum(-1, keepdim=True).clamp(min=1) / rows.sum()


def assert_close(a, b, dtype, scale=1.0):
    tol = TOL[dtype]
    assert torch.allclose(a.to(F64), b.to(F64), rtol=tol["rtol"], atol=tol["atol"] * scale), (a, b)


DTYPES = pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
ADVS = pytest.mark.parametrize("per_token", [False, True], ids=["seq-adv", "token-adv"])
SEEDS = pytest.mark.parametrize("seed", [0, 1])


def check_padding_never_leaks(name, logp, old, adv, mask, agg):
    """NaN/-inf in the padding of every input: the same value and gradient, bit for bit, and finite."""
    clean = ours(name, logp, old, adv, mask, agg)
    dirty = ours(name, logp, old, adv, mask, agg, poisoned=True)
    assert torch.isfinite(dirty[0]) and torch.isfinite(dirty[1]).all()
    assert torch.equal(clean[0], dirty[0]) and torch.equal(clean[1], dirty[1])
    assert clean[2] == dirty[2]
    assert (dirty[1][~mask] == 0).all()
    return clean


# ------------------------------------------------------------------ GSPO: value and gradient, every mode


@DTYPES
@ADVS
@SEEDS
@pytest.mark.parametrize("empty_row", [False, True], ids=["full-rows", "empty-row"])
@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_gspo_equals_verls(agg, empty_row, seed, per_token, dtype):
    logp, old, adv, mask = extreme_batch(seed, dtype, per_token, empty_row)
    assert ((logp - old).abs() > 20).any()
    loss, grad, metrics = check_padding_never_leaks("gspo", logp, old, adv, mask, agg)
    v_loss, v_grad, v_metrics = verls("gspo", logp, old, adv, mask, agg)
    assert_close(loss, v_loss, dtype)
    assert_close(grad, v_grad, dtype, scale=1e-2)
    assert metrics["clipfrac"] == pytest.approx(v_metrics["actor/pg_clipfrac"], abs=1e-6)  # verl counts in float32
    assert 0 < metrics["clipfrac"] < 1 and v_grad.abs().sum() > 0  # the clip bites, and not everywhere


# ------------------------------------------------------------------ CISPO: gradient; value up to the known term


@DTYPES
@ADVS
@SEEDS
@pytest.mark.parametrize("empty_row", [False, True], ids=["full-rows", "empty-row"])
@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_cispo_gradient_equals_verls_and_value_differs_by_the_documented_term(agg, empty_row, seed, per_token, dtype):
    logp, old, adv, mask = extreme_batch(seed, dtype, per_token, empty_row)
    loss, grad, metrics = check_padding_never_leaks("cispo", logp, old, adv, mask, agg)
    v_loss, v_grad, v_metrics = verls("cispo", logp, old, adv, mask, agg)
    assert_close(grad, v_grad, dtype, scale=1e-2)
    # verl's value is -SG(w^) A log pi; ours -w^ A: per token ours = verl's - w^ A (1 - log pi)
    low, high = CLIP["cispo"]
    w_hat = torch.exp((logp - old).clamp(-20, 20)).clamp(1 - low, 1 + high)
    assert_close(loss, v_loss + agg_loss(-w_hat * adv * (1 - logp), mask, agg), dtype, scale=10)
    assert_close(loss, aggregate(-w_hat * adv, mask, agg), dtype)  # the clipped IS-weighted advantage
    assert metrics["clipfrac"] == pytest.approx(v_metrics["actor/pg_clipfrac"], abs=1e-6)  # verl counts in float32


# ------------------------------------------------------------------ GMPO: the paper's sequence mean


@DTYPES
@ADVS
@SEEDS
def test_gmpo_equals_verls_geo_mean_on_full_rows(seed, per_token, dtype):
    """seq-mean-token-mean is the paper's (1/G) sum_i -A_i s_i, which verl's geo_mean computes (any mode)."""
    logp, old, adv, mask = extreme_batch(seed, dtype, per_token)
    loss, grad, metrics = check_padding_never_leaks("gmpo", logp, old, adv, mask, "seq-mean-token-mean")
    assert metrics["clipfrac"] > 0
    for agg in LOSS_AGG_MODES:  # verl ignores loss_agg_mode
        v_loss, v_grad, _ = verls("gmpo", logp, old, adv, mask, agg)
        assert_close(loss, v_loss, dtype)
        assert_close(grad, v_grad, dtype, scale=1e-2)
    assert v_grad.abs().sum() > 0


@DTYPES
@ADVS
def test_gmpo_with_empty_rows_is_verls_without_its_zero_rows(per_token, dtype):
    """verl's torch.mean counts an all-padding row as a 0; ours leaves it out: ours = verl's * B / B_nonempty."""
    logp, old, adv, mask = extreme_batch(4, dtype, per_token, empty_row=True)
    loss, grad, _ = check_padding_never_leaks("gmpo", logp, old, adv, mask, "seq-mean-token-mean")
    v_loss, v_grad, _ = verls("gmpo", logp, old, adv, mask, "seq-mean-token-mean")
    scale = mask.shape[0] / mask.any(-1).sum().item()
    assert scale > 1
    assert_close(loss, v_loss * scale, dtype)
    assert_close(grad, v_grad * scale, dtype, scale=1e-2)


def gmpo_by_hand(logp, old, adv, mask, low, high):
    """Per row: A_i = token mean of A; s_i = exp(mean of log w, clipped per token by the sign of A_t)."""
    log_w = (logp - old).to(F64)
    adv = adv.to(F64)
    clipped = torch.where(adv > 0, log_w.clamp(max=high), log_w.clamp(min=-low))
    clipped = torch.where(adv == 0, torch.zeros_like(log_w), clipped)
    n = mask.sum(-1)
    s = torch.exp(torch.where(mask, clipped, 0).sum(-1) / n)
    return -torch.where(mask, adv, 0).sum(-1) / n * s  # the row's loss -A_i s_i


@DTYPES
@ADVS
@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_gmpo_modes_weight_the_sequence_terms(agg, per_token, dtype):
    """Every mode aggregates the per-token form -A_i s_i: its value from the rows by hand, and its gradient is
    verl's (sequence mean) gradient re-weighted token by token as the mode weights tokens."""
    logp, old, adv, mask = extreme_batch(5, dtype, per_token)
    loss, grad, _ = check_padding_never_leaks("gmpo", logp, old, adv, mask, agg)
    rows = gmpo_by_hand(logp, old, adv, mask, *CLIP["gmpo"])
    expected = aggregate(rows[:, None].expand_as(logp) * mask, mask, agg)
    assert_close(loss, expected, dtype)
    _, v_grad, _ = verls("gmpo", logp, old, adv, mask, agg)
    reweighted = v_grad.to(F64) / agg_weight(mask, "seq-mean-token-mean").clamp(min=1e-300) * agg_weight(mask, agg)
    assert_close(grad, torch.where(mask, reweighted, 0), dtype, scale=1e-2)


# ------------------------------------------------------------------ SAPO: verl aggregates seq-mean-token-mean


@DTYPES
@ADVS
@SEEDS
@pytest.mark.parametrize("empty_row", [False, True], ids=["full-rows", "empty-row"])
def test_sapo_equals_verls_in_its_mode(empty_row, seed, per_token, dtype):
    logp, old, adv, mask = extreme_batch(seed, dtype, per_token, empty_row)
    loss, grad, metrics = check_padding_never_leaks("sapo", logp, old, adv, mask, "seq-mean-token-mean")
    for agg in LOSS_AGG_MODES:  # verl always uses seq-mean-token-mean
        v_loss, v_grad, _ = verls("sapo", logp, old, adv, mask, agg)
        assert_close(loss, v_loss, dtype)
        assert_close(grad, v_grad, dtype, scale=1e-2)
    assert metrics["clipfrac"] == 0.0


@DTYPES
@ADVS
@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_sapo_other_modes_aggregate_the_same_token_loss(agg, per_token, dtype):
    logp, old, adv, mask = extreme_batch(6, dtype, per_token, empty_row=True)
    loss, grad, _ = check_padding_never_leaks("sapo", logp, old, adv, mask, agg)
    w = torch.exp((logp - old).clamp(-20, 20))
    tau = torch.where(adv > 0, torch.full_like(w, TAU_POS), torch.full_like(w, TAU_NEG))
    gate = torch.sigmoid(tau * (w - 1)) * (4 / tau)
    assert_close(loss, agg_loss(-gate * adv, mask, agg), dtype)
    _, v_grad, _ = verls("sapo", logp, old, adv, mask, agg)
    reweighted = v_grad.to(F64) / agg_weight(mask, "seq-mean-token-mean").clamp(min=1e-300) * agg_weight(mask, agg)
    assert_close(grad, torch.where(mask, reweighted, 0), dtype, scale=1e-2)


# ------------------------------------------------------------------ properties that could fail


def simple_batch(b=4, t=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 3
    logp = old + 0.05 * torch.randn(b, t, generator=g, dtype=F64)
    adv = torch.randn(b, generator=g, dtype=F64)
    mask = torch.arange(t)[None, :] < torch.tensor([t, 4, 3, 5])[:b, None]
    return logp, old, adv, mask


def grad_of(name, logp, old, adv, mask, agg="token-sum", **kw):
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(
        name, log_prob=x, old_log_prob=old, advantages=adv, response_mask=mask, loss_agg_mode=agg, **kw
    )
    return torch.autograd.grad(loss, x)[0], loss.detach(), metrics


def test_cispo_keeps_the_gradient_rpg_reinforce_drops():
    """A token far above the clip with A > 0: RPG-REINFORCE's clip (and PPO's) gives it no gradient, CISPO's
    capped weight keeps it at -(1 + e2) A."""
    logp, old, adv, mask = simple_batch()
    logp = logp.clone()
    logp[0, 0] = old[0, 0] + 2.0  # w = e^2 > 1.28
    adv = adv.abs()  # positive advantages
    kw = dict(eps_low=0.2, eps_high=0.28)
    reinforce, _, _ = grad_of("rpg_reinforce_fkl", logp, old, adv, mask, **kw)
    ppo, _, _ = grad_of("ppo", logp, old, adv, mask, **kw)
    cispo, _, metrics = grad_of("cispo", logp, old, adv, mask, **kw)
    assert reinforce[0, 0] == 0 and ppo[0, 0] == 0
    assert cispo[0, 0].item() == pytest.approx(-1.28 * adv[0].item(), rel=1e-12)
    inside = mask & ((logp - old).exp() < 1.28)
    assert torch.allclose(cispo[inside], reinforce[inside], rtol=1e-12, atol=0)  # inside the clip: the same
    assert metrics["clipfrac"] == pytest.approx(1 / mask.sum().item())


def test_cispo_default_floor_never_binds():
    """The default eps_low (floor ~1e-9) is 'no lower bound': w = e^-20 (log-ratio clamped) keeps its weight,
    exactly as with verl's example clip_ratio_low = 10 (floor -9)."""
    logp, old, adv, mask = simple_batch()
    logp = logp.clone()
    logp[0, 0] = old[0, 0] - 30.0
    default, _, _ = grad_of("cispo", logp, old, adv, mask, eps_low=d.CISPO_EPS_LOW, eps_high=d.CISPO_EPS_HIGH)
    verl_example, _, _ = grad_of("cispo", logp, old, adv, mask, eps_low=10.0, eps_high=d.CISPO_EPS_HIGH)
    assert torch.equal(default, verl_example)
    assert default[0, 0].item() == pytest.approx(-math.exp(-20) * adv[0].item(), rel=1e-12)


def test_gspo_has_one_ratio_per_sequence():
    """Per-sequence advantages, seq-mean-token-mean: every token of row i has gradient -A_i s_i / (|y_i| B), the
    same along the row, and the ratio metric is the rows' geometric means."""
    logp, old, adv, mask = simple_batch()
    grad, _, metrics = grad_of("gspo", logp, old, adv, mask, "seq-mean-token-mean", clip=False)
    n = mask.sum(-1)
    s = torch.exp(torch.where(mask, logp - old, 0).sum(-1) / n)
    expected = -(adv * s / n / mask.shape[0])[:, None].expand_as(logp)
    assert torch.allclose(grad[mask], expected[mask], rtol=1e-8, atol=0)  # 1e-8: the mode's token-count guard
    assert metrics["ratio_mean"] == pytest.approx(((s * n).sum() / n.sum()).item(), rel=1e-12)


def test_gspo_clips_whole_sequences():
    """GSPO's clip is the sequence's: a row whose s_i leaves [1 - e1, 1 + e2] in the advantage's direction loses
    the gradient of all its tokens, even those whose own ratio is 1."""
    logp, old, adv, mask = simple_batch()
    logp = logp.clone()
    logp[0] = old[0]
    logp[0, 0] = old[0, 0] + 1.0  # one token moves: s_0 = e^(1/6) > 1 + 4e-4
    logp[1] = old[1]  # on-policy row: s_1 = 1, inside the clip
    adv = adv.abs()
    grad, _, metrics = grad_of("gspo", logp, old, adv, mask, eps_low=d.GSPO_EPS_LOW, eps_high=d.GSPO_EPS_HIGH)
    assert (grad[0] == 0).all()
    assert torch.allclose(grad[1][mask[1]], -adv[1] * torch.ones(int(mask[1].sum()), dtype=F64), rtol=1e-12, atol=0)
    assert metrics["clipfrac_high"] >= mask[0].sum().item() / mask.sum().item()


def test_gmpo_clips_tokens_not_sequences():
    """GMPO's clip is per token in log space: the token beyond e2 (A > 0) loses its gradient, its row keeps the
    others', each -A s_i / |y_i| (token-sum of the per-token form, one row)."""
    logp, old, adv, mask = simple_batch()
    logp, adv, mask = logp[:1].clone(), adv[:1].abs(), mask[:1]
    logp[0, 0] = old[0, 0] + 1.0  # log w = 1 > 0.4
    grad, loss, metrics = grad_of("gmpo", logp, old[:1], adv, mask, "seq-mean-token-mean", eps_low=0.4, eps_high=0.4)
    log_w = (logp - old[:1])[0]
    s = torch.exp(torch.cat([torch.tensor([0.4], dtype=F64), log_w[1:]]).mean())
    assert grad[0, 0] == 0
    assert torch.allclose(grad[0, 1:], -adv[0] * s / 6 * torch.ones(5, dtype=F64), rtol=1e-8, atol=0)
    assert loss.item() == pytest.approx((-adv[0] * s).item(), rel=1e-8)
    assert metrics["clipfrac_high"] == pytest.approx(1 / 6)


def test_sapo_gate_is_ppo_on_policy_and_decays_off_it():
    """At w = 1 the per-token gradient is -A (PPO's unclipped); away from 1 it decays, faster for A < 0
    (tau_neg > tau_pos)."""
    old = torch.zeros(1, 3, dtype=F64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    on = torch.zeros(1, 3, dtype=F64)
    grad, loss, _ = grad_of("sapo", on, old, torch.tensor([2.0], dtype=F64), mask)
    assert torch.allclose(grad, torch.full_like(grad, -2.0), rtol=1e-12, atol=0)
    assert loss.item() == pytest.approx(-3 * 2.0 * 4 * 0.5)  # f(1) = 4/tau * sigma(0) = 2 per token
    off = torch.full((1, 3), 2.0, dtype=F64)  # w = e^2
    pos, _, _ = grad_of("sapo", off, old, torch.tensor([1.0], dtype=F64), mask, tau_pos=1.0, tau_neg=1.05)
    neg, _, _ = grad_of("sapo", off, old, torch.tensor([-1.0], dtype=F64), mask, tau_pos=1.0, tau_neg=1.05)
    assert 0 < -pos[0, 0] < math.exp(2) and 0 < neg[0, 0] < -pos[0, 0]


@pytest.mark.parametrize("name", ["gspo", "gmpo"])
def test_sequence_losses_treat_rows_independently(name):
    """seq-mean-token-mean of a padded batch = the mean of each row's loss computed alone without padding, and
    each row's gradient = its own gradient / number of rows: no row sees another's tokens or the padding."""
    logp, old, adv, mask = extreme_batch(7)
    batch_grad, batch_loss, _ = grad_of(name, logp, old, adv, mask, "seq-mean-token-mean")
    rows = []
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        row = (logp[i : i + 1, :n], old[i : i + 1, :n], adv[i : i + 1, :n], mask[i : i + 1, :n])
        g_i, l_i, _ = grad_of(name, *row, "seq-mean-token-mean")
        rows.append(l_i)
        assert torch.allclose(batch_grad[i, :n], g_i[0] / mask.shape[0], rtol=1e-12, atol=1e-15)
    assert batch_loss.item() == pytest.approx(torch.stack(rows).mean().item(), rel=1e-12)


@pytest.mark.parametrize("name", ["gspo", "cispo", "gmpo", "sapo"])
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean"])
def test_an_all_padding_row_changes_nothing(name, agg):
    """Appending a row with no valid token (and NaN/-inf junk) leaves the loss, the gradient and the metrics."""
    logp, old, adv, mask = extreme_batch(8)
    junk = torch.full((1, logp.shape[1]), math.nan, dtype=F64)
    more = (
        torch.cat([logp, torch.full_like(junk, -math.inf)]),
        torch.cat([old, junk]),
        torch.cat([adv, junk]),
        torch.cat([mask, torch.zeros(1, mask.shape[1], dtype=torch.bool)]),
    )
    g0, l0, m0 = grad_of(name, logp, old, adv, mask, agg)
    g1, l1, m1 = grad_of(name, *more, agg)
    assert l0.item() == pytest.approx(l1.item(), rel=1e-12)
    assert torch.allclose(g0, g1[:-1], rtol=1e-12, atol=0) and (g1[-1] == 0).all()
    assert m0 == pytest.approx(m1, rel=1e-12)


def test_sapo_temperatures_must_be_positive():
    logp, old, adv, mask = simple_batch()
    with pytest.raises(ValueError, match=r"^sapo needs tau_pos > 0 and tau_neg > 0, got 0.0, 1.05$"):
        policy_loss("sapo", log_prob=logp, old_log_prob=old, advantages=adv, response_mask=mask, tau_pos=0.0)


# ------------------------------------------------------------------ RLOO and Dr. GRPO's pieces


def outcome_batch(seed: int, sizes: list[int], t: int = 5):
    """Scores, verl's token_level_rewards (the score on the last valid token), masks and uid strings."""
    g = torch.Generator().manual_seed(seed)
    uids = [f"q{k}" for k, n in enumerate(sizes) for _ in range(n)]
    order = torch.randperm(len(uids), generator=g).tolist()  # groups interleaved, as verl's batches may be
    uids = [uids[i] for i in order]
    scores = torch.randint(0, 3, (len(uids),), generator=g).to(F64) + torch.rand(len(uids), generator=g, dtype=F64)
    lengths = torch.randint(1, t + 1, (len(uids),), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    last = (mask.long().cumsum(-1) == lengths[:, None]) & mask
    rewards = torch.where(last, scores[:, None], torch.zeros(len(uids), t, dtype=F64))
    return scores, rewards, mask, uids


def test_rloo_equals_verls_rloo_on_groups_of_two_or_more():
    scores, rewards, mask, uids = outcome_batch(0, [4, 2, 5, 3])
    ours_ = A.rloo_advantage(scores, uids)
    theirs, _ = compute_rloo_outcome_advantage(rewards, mask.to(F64), np.array(uids, dtype=object))
    assert torch.allclose(ours_[:, None] * mask, theirs, rtol=1e-12, atol=1e-12)
    # leave-one-out by hand: the sample's score minus the mean of its group's other scores
    for i in range(len(uids)):
        others = [s for j, (s, u) in enumerate(zip(scores.tolist(), uids)) if u == uids[i] and j != i]
        assert ours_[i].item() == pytest.approx(scores[i].item() - sum(others) / len(others), rel=1e-12, abs=1e-12)


def test_rloo_singletons_get_zero_as_verls_rloo_vectorized():
    """A group of one has no leave-one-out baseline: 0, as verl's rloo_vectorized; verl's rloo keeps the raw
    score there (the only difference between the two, and between ours and verl's rloo)."""
    scores, rewards, mask, uids = outcome_batch(1, [3, 1, 4, 1])
    index = np.array(uids, dtype=object)
    ours_ = A.rloo_advantage(scores, uids)
    vectorized, _ = compute_rloo_vectorized_outcome_advantage(rewards, mask.to(F64), index)
    assert torch.allclose(ours_[:, None] * mask, vectorized, rtol=1e-12, atol=1e-12)
    loop, _ = compute_rloo_outcome_advantage(rewards, mask.to(F64), index)
    single = torch.tensor([uids.count(u) == 1 for u in uids])
    assert torch.allclose(loop[~single], vectorized[~single], rtol=1e-12, atol=1e-12)
    assert torch.allclose(loop[single], (scores[:, None] * mask)[single])
    assert (ours_[single] == 0).all() and (scores[single] != 0).all()


def test_dr_grpo_advantage_is_verls_grpo_without_std():
    scores, rewards, mask, uids = outcome_batch(2, [4, 2, 6])
    theirs, _ = compute_grpo_outcome_advantage(
        rewards, mask.to(F64), np.array(uids, dtype=object), norm_adv_by_std_in_grpo=False
    )
    assert torch.allclose(A.rpg_advantage(scores, uids)[:, None] * mask, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss_scale_factor", [None, 4096])
def test_seq_mean_token_sum_norm_equals_verls_agg_loss(loss_scale_factor):
    logp, old, adv, mask = extreme_batch(9, empty_row=True)
    loss_mat = (logp - old) * adv
    ours_ = aggregate(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor)
    theirs = agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=loss_scale_factor)
    assert ours_.item() == pytest.approx(theirs.item(), rel=1e-12)


@DTYPES
def test_dr_grpo_loss_is_verls_vanilla_with_seq_mean_token_sum_norm(dtype):
    """Dr. GRPO's loss: dual-clip PPO (`ppo`) aggregated by seq-mean-token-sum-norm, verl's vanilla loss."""
    logp, old, adv, mask = extreme_batch(10, dtype, empty_row=True)
    loss, grad, _ = check_padding_never_leaks_ppo(logp, old, adv, mask)
    settings = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=d.EPS_LOW,
        clip_ratio_low=d.EPS_LOW,
        clip_ratio_high=d.EPS_HIGH,
        clip_ratio_c=d.CLIP_C,
    )
    x = logp.clone().requires_grad_(True)
    v_loss, _ = compute_policy_loss_vanilla(old, x, adv, mask, "seq-mean-token-sum-norm", settings)
    (v_grad,) = torch.autograd.grad(v_loss, x)
    assert_close(loss, v_loss.detach(), dtype)
    assert_close(grad, v_grad, dtype, scale=1e-2)


def check_padding_never_leaks_ppo(logp, old, adv, mask):
    def run(poisoned):
        lp, o, a = logp, old, adv
        if poisoned:
            lp, o, a = poison(lp, mask, -math.inf), poison(o, mask, math.nan), poison(a, mask, math.nan)
        x = lp.clone().requires_grad_(True)
        loss, metrics = policy_loss(
            "ppo", log_prob=x, old_log_prob=o, advantages=a, response_mask=mask, loss_agg_mode="seq-mean-token-sum-norm"
        )
        return loss.detach(), torch.autograd.grad(loss, x)[0], metrics

    clean, dirty = run(False), run(True)
    assert torch.equal(clean[0], dirty[0]) and torch.equal(clean[1], dirty[1])
    return clean
