"""Padding, extreme ratios, Monte Carlo agreement, aggregation modes and input validation."""

from __future__ import annotations

import pytest
import torch

from rpg_cli.algorithms import LOSS_AGG_MODES, LOSS_NAMES, aggregate, policy_loss
from rpg_cli.algorithms.losses import SEQUENCE_LOSSES

F64 = torch.float64


def batch(seed=0, b=6, t=9, dtype=torch.float32, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 4
    logp = old + spread * torch.randn(b, t, generator=g)
    ref = old + spread * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return logp.to(dtype), old.to(dtype), ref.to(dtype), adv.to(dtype), mask


def poison(x, mask, value):
    return torch.where(mask, x, torch.full_like(x, value))


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_padding_never_leaks(name, mode):
    """Masked positions holding -inf/NaN/inf change nothing: same loss and gradient as clean padding, all finite."""
    logp, old, ref, adv, mask = batch()
    results = []
    for pad_logp, pad_other in ((0.0, 0.0), (float("-inf"), float("nan"))):
        x = poison(logp, mask, pad_logp).requires_grad_(True)
        loss, metrics = policy_loss(
            name,
            log_prob=x,
            old_log_prob=poison(old, mask, pad_other),
            ref_log_prob=poison(ref, mask, pad_other),
            advantages=poison(adv[:, None].expand_as(logp), mask, pad_other),
            response_mask=mask,
            beta=0.1,
            loss_agg_mode=mode,
        )
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
        assert (x.grad[~mask] == 0).all()
        results.append((loss.detach(), x.grad, metrics))
    (l0, g0, m0), (l1, g1, m1) = results
    assert torch.equal(l0, l1) and torch.equal(g0, g1) and m0 == m1


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("extreme", [50.0, -50.0])
@pytest.mark.parametrize("clip", [True, False])
def test_extreme_log_ratios_stay_finite(name, extreme, clip):
    logp, old, ref, adv, mask = batch(dtype=torch.float32)
    logp = logp.clone()
    logp[:, 0] = old[:, 0] + extreme  # log w = +-50
    ref = ref.clone()
    ref[:, 1] = old[:, 1] - extreme  # log rho = -+50
    x = logp.requires_grad_(True)
    loss, metrics = policy_loss(
        name, log_prob=x, old_log_prob=old, ref_log_prob=ref, advantages=adv, response_mask=mask, beta=0.1, clip=clip
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


def test_padding_holds_no_weight_in_token_mean():
    logp, old, _, adv, mask = batch()
    full, _ = policy_loss("ppo", log_prob=logp, old_log_prob=old, advantages=adv, response_mask=mask)
    keep = mask[0]
    row, _ = policy_loss("ppo", log_prob=logp[:1], old_log_prob=old[:1], advantages=adv[:1], response_mask=mask[:1])
    assert keep.all() and not torch.equal(full, row)  # the batch average differs from one row's ...
    per_token = -(logp - old).exp() * adv[:, None]
    clipped = torch.maximum(per_token, -(logp - old).exp().clamp(0.8, 1.28) * adv[:, None])
    clipped = torch.where(adv[:, None] < 0, torch.minimum(clipped, -10.0 * adv[:, None]), clipped)
    assert full.item() == pytest.approx(clipped[mask].mean().item(), rel=1e-6)  # ... and is the valid-token mean


# ------------------------------------------------------------------ Monte Carlo


@pytest.mark.parametrize("name", ["rpg_fkl", "rpg_urkl", "rpg_reinforce_rkl", "rpg_reinforce_ufkl", "grpo_corrected"])
def test_monte_carlo_gradient_agrees_with_exact(name):
    """Tokens sampled from pi_old (token-mean over a batch) estimate the exact gradient within 5 standard errors."""
    g = torch.Generator().manual_seed(42)
    v, n, beta = 6, 200_000, 0.4
    log_old = torch.log_softmax(torch.randn(v, generator=g, dtype=F64), 0)
    log_ref = torch.log_softmax(log_old + 0.5 * torch.randn(v, generator=g, dtype=F64), 0)
    adv = torch.randn(v, generator=g, dtype=F64)
    theta = (log_old + 0.1 * torch.randn(v, generator=g, dtype=F64)).requires_grad_(True)  # unnormalized policy

    x = torch.multinomial(log_old.exp(), n, replacement=True, generator=g)
    logp = theta[x].unsqueeze(-1)
    loss, _ = policy_loss(
        name,
        log_prob=logp,
        old_log_prob=log_old[x].unsqueeze(-1),
        advantages=adv[x],
        response_mask=torch.ones(n, 1, dtype=torch.bool),
        ref_log_prob=log_ref[x].unsqueeze(-1),
        beta=beta,
        clip=False,
    )
    (estimate,) = torch.autograd.grad(loss, theta)
    # the exact gradient and the per-outcome weights g(k) = d L(k) / d logp, for the standard error
    one = torch.ones(1, 1, dtype=torch.bool)
    per_outcome = torch.zeros(v, dtype=F64)
    for k in range(v):
        t = theta.detach()[k].view(1, 1).requires_grad_(True)
        lk, _ = policy_loss(
            name,
            log_prob=t,
            old_log_prob=log_old[k].view(1, 1),
            advantages=adv[k].view(1),
            response_mask=one,
            ref_log_prob=log_ref[k].view(1, 1),
            beta=beta,
            clip=False,
        )
        (per_outcome[k],) = torch.autograd.grad(lk, t)[0].view(1)
    exact = log_old.exp() * per_outcome  # d/d theta_k of E_old[L] for log pi = theta
    counts = torch.bincount(x, minlength=v).to(F64)
    # estimate_k = (1/n) sum_i g(x_i) [x_i = k]; its variance is (E[g^2 1_k] - E[g 1_k]^2) / n
    second = log_old.exp() * per_outcome.square()
    se = ((second - exact.square()) / n).sqrt()
    assert counts.min() > 0
    assert ((estimate - exact).abs() <= 5 * se + 1e-12).all(), (estimate, exact, se)
    assert ((estimate - exact).abs() > 0).any()  # sampled, not exact


# ------------------------------------------------------------------ aggregation


def test_aggregation_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(36 / 5)
    assert aggregate(loss, mask, "token-sum").item() == pytest.approx(36)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 30) / 2)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 15) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx((6 + 30) / 2 / 4)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=8).item() == pytest.approx(
        (6 + 30) / 2 / 8
    )


def test_aggregation_matches_verl_when_installed():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl not installed")
    logp, old, _, adv, mask = batch(seed=3)
    loss_mat = (logp - old) * adv[:, None]
    for mode in LOSS_AGG_MODES:
        ours = aggregate(loss_mat, mask, mode)
        theirs = core_algos.agg_loss(loss_mat=loss_mat, loss_mask=mask.float(), loss_agg_mode=mode)
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-6), mode


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(name="rpg_kl"), "unknown policy loss 'rpg_kl'"),
        (dict(loss_agg_mode="mean"), "unknown loss_agg_mode 'mean'"),
        (dict(old_log_prob=torch.zeros(6, 8)), "old_log_prob has shape (6, 8), but log_prob has shape (6, 9)"),
        (dict(ref_log_prob=torch.zeros(6, 8)), "ref_log_prob has shape (6, 8)"),
        (dict(advantages=torch.zeros(5)), "advantages has shape (5,)"),
        (dict(response_mask=torch.zeros(6, 9, dtype=torch.bool)), "response_mask selects no token"),
        (dict(beta=-1.0), "beta must be >= 0"),
        (dict(clip_c=1.0), "clip_c > 1"),
        (dict(eps_low=0.0), "eps_low > 0"),
    ],
)
def test_bad_input_says_what_is_wrong(change, message):
    logp, old, _, adv, mask = batch()
    kwargs = dict(name="rpg_urkl", log_prob=logp, old_log_prob=old, advantages=adv, response_mask=mask)
    kwargs.update(change)
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=None) as err:
        policy_loss(name, **kwargs)
    assert message in str(err.value)


def test_unclipped_run_ignores_clip_parameters():
    logp, old, _, adv, mask = batch()
    loss, metrics = policy_loss(
        "rpg_fkl",
        log_prob=logp,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        clip=False,
        clip_c=1.0,
        eps_low=0.0,
    )
    assert torch.isfinite(loss) and metrics["clipfrac"] == 0.0


@pytest.mark.parametrize("name", [n for n in LOSS_NAMES if n not in SEQUENCE_LOSSES])
@pytest.mark.parametrize("with_ref", [False, True], ids=["iterative", "ref"])
def test_padded_batch_equals_packed_valid_tokens(name, with_ref):
    """Loss (token-mean) and every metric of a padded batch equal those of its valid tokens packed in one row.
    (Not for GSPO and GMPO, whose rows are sequences: tests/test_baselines_exact.py checks them row by row.)"""
    logp, old, ref, adv, mask = batch(seed=9, spread=0.6)
    adv_tokens = adv[:, None].expand_as(logp)
    kw = dict(beta=0.2, eps_low=0.1, eps_high=0.1, clip_c=1.5)
    padded = policy_loss(
        name,
        log_prob=logp,
        old_log_prob=old,
        ref_log_prob=ref if with_ref else None,
        advantages=adv_tokens,
        response_mask=mask,
        **kw,
    )
    packed = policy_loss(
        name,
        log_prob=logp[mask][None],
        old_log_prob=old[mask][None],
        ref_log_prob=ref[mask][None] if with_ref else None,
        advantages=adv_tokens[mask][None],
        response_mask=torch.ones(1, int(mask.sum()), dtype=torch.bool),
        **kw,
    )
    assert padded[0].item() == pytest.approx(packed[0].item(), rel=1e-5)
    assert padded[1] == pytest.approx(packed[1], rel=1e-5, abs=1e-7)
    assert not mask.all()  # padding present ...
    assert padded[1]["clipfrac"] > 0 or name == "sapo"  # ... and clipping exercised (SAPO has none)
