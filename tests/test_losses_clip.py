"""RPG-Style Clip branch by branch (MATH.md sections 2 and 3): the value of each branch and whether it
carries gradient, on single tokens with hand-picked ratios."""

from __future__ import annotations

import math

import pytest
import torch

from rpg_cli.algorithms import policy_loss

E1, E2, C = 0.2, 0.28, 3.0
F64 = torch.float64


def one_token(name, *, w, adv, old_logp=-1.5, beta=0.0, ref_logp=None, clip=True, clipped_weight=False):
    """Loss value, d loss / d logp and metrics for a single token with ratio w."""
    logp = torch.tensor([[old_logp + math.log(w)]], dtype=F64, requires_grad=True)
    loss, metrics = policy_loss(
        name,
        log_prob=logp,
        old_log_prob=torch.tensor([[old_logp]], dtype=F64),
        advantages=torch.tensor([adv], dtype=F64),
        response_mask=torch.ones(1, 1, dtype=torch.bool),
        ref_log_prob=None if ref_logp is None else torch.tensor([[ref_logp]], dtype=F64),
        beta=beta,
        clip=clip,
        eps_low=E1,
        eps_high=E2,
        clip_c=C,
        clipped_weight=clipped_weight,
    )
    (d,) = torch.autograd.grad(loss, logp)
    return loss.item(), d.item(), metrics


# (w, A) -> expected value, whether a gradient flows, which clip counter fires
PPO_BRANCHES = [
    pytest.param(1.1, 2.0, -1.1 * 2.0, True, None, id="A>0 inside window"),
    pytest.param(1.5, 2.0, -(1 + E2) * 2.0, False, "clipfrac_high", id="A>0 above 1+e2: clipped"),
    pytest.param(0.5, 2.0, -0.5 * 2.0, True, None, id="A>0 below 1-e1: not clipped"),
    pytest.param(0.5, -2.0, (1 - E1) * 2.0, False, "clipfrac_low", id="A<0 below 1-e1: clipped"),
    pytest.param(1.5, -2.0, 1.5 * 2.0, True, None, id="A<0 between 1+e2 and c: gradient"),
    pytest.param(5.0, -2.0, C * 2.0, False, "clipfrac_dual", id="A<0 above c: dual clip"),
]


@pytest.mark.parametrize(("w", "adv", "value", "has_grad", "counter"), PPO_BRANCHES)
def test_dual_clip_branches(w, adv, value, has_grad, counter):
    loss, d, metrics = one_token("ppo", w=w, adv=adv)
    assert loss == pytest.approx(value, abs=1e-12)
    assert d == (pytest.approx(-w * adv, abs=1e-12) if has_grad else 0.0)
    for key in ("clipfrac_high", "clipfrac_low", "clipfrac_dual"):
        assert metrics[key] == (1.0 if key == counter else 0.0)


def test_rkl_clip_acts_on_the_kl_shaped_advantage():
    """rpg_rkl clips -w Â with Â = A - beta (log w + 1): a small positive A turns negative under a large beta,
    so a ratio below 1-e1 is clipped (the plain advantage would not be)."""
    w, adv, beta = 0.5, 0.1, 1.0
    a_hat = adv - beta * (math.log(w) + 1)  # = 0.1 - (1 - 0.693) < 0
    assert a_hat < 0
    loss, d, metrics = one_token("rpg_rkl", w=w, adv=adv, beta=beta)
    assert loss == pytest.approx(-(1 - E1) * a_hat, abs=1e-12)
    assert d == 0.0 and metrics["clipfrac_low"] == 1.0
    _, d_ppo, _ = one_token("ppo", w=w, adv=adv)
    assert d_ppo != 0.0


def test_fkl_clip_keeps_the_kl_gradient_outside_the_clip():
    """rpg_fkl adds beta * KL outside the clip: a clipped token still gets the KL gradient -beta * rho."""
    loss, d, metrics = one_token("rpg_fkl", w=1.5, adv=2.0, beta=0.5)
    assert metrics["clipfrac_high"] == 1.0
    assert d == pytest.approx(-0.5 * 1.0, abs=1e-12)  # rho = 1 for the iterative reference
    assert loss == pytest.approx(-(1 + E2) * 2.0 + 0.5 * -math.log(1.5), abs=1e-12)


def reinforce_value(branch, *, w, adv, c_kl, ell):
    return {
        "grad": (adv + c_kl / w) * ell * w,
        "high": (adv + c_kl / (1 + E2)) * ell * (1 + E2),
        "low": (adv + c_kl / (1 - E1)) * ell * (1 - E1),
        "dual": adv * ell * C + c_kl * ell,
    }[branch]


# (w, A, beta) for rpg_reinforce_urkl; C_KL = -beta w log w (iterative reference)
REINFORCE_BRANCHES = [
    pytest.param(1.1, 1.0, 0.0, "grad", None, id="psi>=0, w<1+e2: gradient"),
    pytest.param(1.4, 1.0, 0.0, "high", "clipfrac_high", id="psi>=0, w>=1+e2: clipped"),
    pytest.param(0.5, 1.0, 0.0, "grad", None, id="psi>=0, w small: gradient"),
    pytest.param(0.7, -1.0, 0.0, "low", "clipfrac_low", id="psi<0, w<=1-e1: clipped"),
    pytest.param(2.0, -1.0, 0.0, "grad", None, id="psi<0, 1-e1<w<c: gradient"),
    pytest.param(4.0, -1.0, 0.0, "dual", "clipfrac_dual", id="psi<0, w>=c: dual clip"),
    pytest.param(1.4, 1.0, 0.3, "high", "clipfrac_high", id="with KL: high"),
    pytest.param(0.7, -1.0, 0.3, "low", "clipfrac_low", id="with KL: low"),
    pytest.param(4.0, -1.0, 0.3, "dual", "clipfrac_dual", id="with KL: dual"),
    pytest.param(2.0, -1.0, 0.3, "grad", None, id="with KL: gradient"),
    # the sign is psi's, not A's: A > 0 but the KL weight makes A' = A + C_KL/w < 0
    pytest.param(2.5, 0.1, 0.5, "grad", None, id="A>0 but psi<0: negative branch"),
]


@pytest.mark.parametrize(("w", "adv", "beta", "branch", "counter"), REINFORCE_BRANCHES)
def test_rpg_reinforce_branches(w, adv, beta, branch, counter):
    old_logp = -1.5
    ell = -(old_logp + math.log(w))
    c_kl = beta * -w * math.log(w)
    loss, d, metrics = one_token("rpg_reinforce_urkl", w=w, adv=adv, beta=beta, old_logp=old_logp)
    assert loss == pytest.approx(reinforce_value(branch, w=w, adv=adv, c_kl=c_kl, ell=ell), abs=1e-12)
    if branch == "grad":
        assert d == pytest.approx(-(w * adv + c_kl), abs=1e-12)  # the REINFORCE weight of section 1
    else:
        assert d == 0.0
    for key in ("clipfrac_high", "clipfrac_low", "clipfrac_dual"):
        assert metrics[key] == (1.0 if key == counter else 0.0)


def test_negative_branch_case_really_has_negative_psi():
    w, adv, beta = 2.5, 0.1, 0.5
    assert adv + beta * -w * math.log(w) / w < 0


@pytest.mark.parametrize("name", ["rpg_reinforce_fkl", "rpg_reinforce_rkl", "rpg_reinforce_ufkl", "rpg_reinforce_urkl"])
def test_unclipped_reinforce_is_section_1_loss(name):
    """clip=False: L = -SG(w A + C_KL) * logp exactly, value and gradient, even far outside the window."""
    w, adv, beta, old_logp, ref_logp = 4.0, -1.0, 0.3, -1.5, -1.2
    logp = old_logp + math.log(w)
    log_u, rho = logp - ref_logp, math.exp(ref_logp - old_logp)
    c_kl = (
        beta
        * {
            "fkl": rho,
            "rkl": -w * (log_u + 1),
            "ufkl": -(w - rho),
            "urkl": -w * log_u,
        }[name.rsplit("_", 1)[1]]
    )
    loss, d, metrics = one_token(name, w=w, adv=adv, beta=beta, old_logp=old_logp, ref_logp=ref_logp, clip=False)
    assert loss == pytest.approx(-(w * adv + c_kl) * logp, abs=1e-12)
    assert d == pytest.approx(-(w * adv + c_kl), abs=1e-12)
    assert metrics["clipfrac"] == 0.0


def test_clipped_weight_option_replaces_w_inside_stop_gradient():
    """Remark F.2: with clipped_weight the gradient weight uses clip(w, 1-e1, 1+e2)."""
    from rpg_cli.algorithms.losses import rpg_reinforce_loss

    w, adv = 2.0, -1.0  # psi < 0 and 1-e1 < w < c: a gradient branch where w > 1+e2
    log_w = torch.tensor([[math.log(w)]], dtype=F64)
    logp = torch.tensor([[-1.0]], dtype=F64, requires_grad=True)
    zero = torch.zeros(1, 1, dtype=F64)
    kw = dict(beta=0.0, clip=True, eps_low=E1, eps_high=E2, c=C)
    plain = rpg_reinforce_loss("urkl", log_w, zero, logp, torch.tensor([[adv]], dtype=F64), **kw).loss
    clipped = rpg_reinforce_loss(
        "urkl", log_w, zero, logp, torch.tensor([[adv]], dtype=F64), clipped_weight=True, **kw
    ).loss
    (d_plain,) = torch.autograd.grad(plain.sum(), logp)
    (d_clipped,) = torch.autograd.grad(clipped.sum(), logp)
    assert d_plain.item() == pytest.approx(-w * adv)
    assert d_clipped.item() == pytest.approx(-(1 + E2) * adv)


def test_policy_loss_passes_the_clipped_weight_option_to_rpg_reinforce_only():
    w, adv = 2.0, -1.0  # a gradient branch with w > 1+e2: the option changes the gradient weight
    kw = dict(
        log_prob=torch.tensor([[-1.0]], dtype=F64, requires_grad=True),
        old_log_prob=torch.tensor([[-1.0 - math.log(w)]], dtype=F64),
        advantages=torch.tensor([adv], dtype=F64),
        response_mask=torch.ones(1, 1, dtype=torch.bool),
        eps_low=E1,
        eps_high=E2,
        clip_c=C,
    )
    plain, _ = policy_loss("rpg_reinforce_fkl", **kw)
    clipped, _ = policy_loss("rpg_reinforce_fkl", clipped_weight=True, **kw)
    assert torch.autograd.grad(plain, kw["log_prob"])[0].item() == pytest.approx(-w * adv)
    assert torch.autograd.grad(clipped, kw["log_prob"])[0].item() == pytest.approx(-(1 + E2) * adv)
    with pytest.raises(ValueError, match="rpg_reinforce_\\* losses only"):
        policy_loss("rpg_fkl", clipped_weight=True, **kw)


# Remark F.2 at beta > 0 (MATH.md section 3): inside SG, w-bar = clip(w, 1-e1, 1+e2) replaces w and log w
# everywhere, so C_KL = beta * kl_component(w-bar) in every branch and psi's sign uses w-bar.
# (w, A, beta, ref_logp, branch under F.2, counter)
F2_BRANCHES = [
    pytest.param(2.0, -1.0, 0.3, None, "grad", None, id="w>1+e2, psi<0: gradient weight w-bar A + C_KL(w-bar)"),
    pytest.param(0.5, 1.0, 0.3, None, "grad", None, id="w<1-e1, psi>=0: gradient weight w-bar A + C_KL(w-bar)"),
    pytest.param(2.5, 0.15, 0.5, None, "high", "clipfrac_high", id="sign of psi from w-bar: clipped, not a gradient"),
    pytest.param(4.0, -1.0, 0.3, None, "dual", "clipfrac_dual", id="dual clip value with C_KL(w-bar)"),
    pytest.param(0.7, -1.0, 0.3, None, "low", "clipfrac_low", id="low clip value with C_KL(w-bar)"),
    pytest.param(2.0, -1.0, 0.3, -1.2, "grad", None, id="separate reference: log u = log w-bar - log rho"),
]


@pytest.mark.parametrize("variant", ["fkl", "rkl", "ufkl", "urkl"])
@pytest.mark.parametrize(("w", "adv", "beta", "ref_logp", "branch", "counter"), F2_BRANCHES)
def test_remark_f2_evaluates_c_kl_at_the_clipped_weight(variant, w, adv, beta, ref_logp, branch, counter):
    old_logp = -1.5
    ell = -(old_logp + math.log(w))
    w_bar = min(max(w, 1 - E1), 1 + E2)
    rho = 1.0 if ref_logp is None else math.exp(ref_logp - old_logp)
    log_u_bar = math.log(w_bar) - math.log(rho)
    c_kl = (
        beta
        * {"fkl": rho, "rkl": -w_bar * (log_u_bar + 1), "ufkl": -(w_bar - rho), "urkl": -w_bar * log_u_bar}[variant]
    )
    psi_positive = (adv + c_kl / w_bar) * ell >= 0
    expected_branch = branch if variant == "urkl" else None  # the other variants may land elsewhere: derive it
    if expected_branch is None:
        if psi_positive:
            expected_branch = "grad" if w < 1 + E2 else "high"
        else:
            expected_branch = "low" if w <= 1 - E1 else ("grad" if w < C else "dual")
    loss, d, metrics = one_token(
        f"rpg_reinforce_{variant}", w=w, adv=adv, beta=beta, old_logp=old_logp, ref_logp=ref_logp, clipped_weight=True
    )
    value = {
        "grad": (w_bar * adv + c_kl) * ell,
        "high": ((1 + E2) * adv + c_kl) * ell,
        "low": ((1 - E1) * adv + c_kl) * ell,
        "dual": (C * adv + c_kl) * ell,
    }[expected_branch]
    assert loss == pytest.approx(value, abs=1e-12)
    assert d == (pytest.approx(-(w_bar * adv + c_kl), abs=1e-12) if expected_branch == "grad" else 0.0)
    if variant == "urkl":
        for key in ("clipfrac_high", "clipfrac_low", "clipfrac_dual"):
            assert metrics[key] == (1.0 if key == counter else 0.0)


def test_remark_f2_at_beta_above_zero_differs_from_clipping_only_the_w_a_factor():
    """The case a wrong C_KL passes at beta = 0: C_KL at w (not w-bar) gives another gradient weight."""
    w, adv, beta = 2.0, -1.0, 0.3
    _, d, _ = one_token("rpg_reinforce_urkl", w=w, adv=adv, beta=beta, clipped_weight=True)
    w_bar = 1 + E2
    c_kl_at_w, c_kl_at_w_bar = -beta * w * math.log(w), -beta * w_bar * math.log(w_bar)
    assert d == pytest.approx(-(w_bar * adv + c_kl_at_w_bar), abs=1e-12)
    assert d != pytest.approx(-(w_bar * adv + c_kl_at_w), abs=1e-6)
    # and the sign of psi is w-bar's: here it flips the branch from a gradient to a clipped one
    _, d_plain, _ = one_token("rpg_reinforce_urkl", w=2.5, adv=0.15, beta=0.5)
    _, d_f2, m_f2 = one_token("rpg_reinforce_urkl", w=2.5, adv=0.15, beta=0.5, clipped_weight=True)
    assert d_plain != 0.0 and d_f2 == 0.0 and m_f2["clipfrac_high"] == 1.0
