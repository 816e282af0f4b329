"""k1/k2/k3 and the KL estimators of kl.py: exact identities by enumeration (MATH.md section 1)."""

from __future__ import annotations

import math

import pytest
import torch

from rpg_cli.algorithms.kl import KL_ESTIMATORS, k1, k2, k3, kl_component, kl_estimate

F64 = torch.float64


def test_k_estimators_values():
    y = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    log_y = y.log()
    assert torch.allclose(k1(log_y), -log_y)
    assert torch.allclose(k2(log_y), log_y.square() / 2)
    assert torch.allclose(k3(log_y), y - 1 - log_y)
    assert k3(torch.tensor(1e-9, dtype=F64)).item() == pytest.approx(5e-19, rel=1e-6)  # expm1: no cancellation


def distributions(seed=0, v=8):
    g = torch.Generator().manual_seed(seed)
    log_old = torch.log_softmax(torch.randn(v, generator=g, dtype=F64), 0)
    log_theta = log_old + 0.3 * torch.randn(v, generator=g, dtype=F64)  # unnormalized
    return log_old, log_theta


def ukl(log_p, log_q):
    return (log_p.exp() * (log_p - log_q)).sum() + (log_q.exp() - log_p.exp()).sum()


def test_k3_identities():
    """E_old[k3(pi_theta/pi_old)] = UKL(pi_old || pi_theta);  E_theta[k3(pi_old/pi_theta)] = UKL(pi_theta || pi_old)."""
    log_old, log_theta = distributions()
    forward = (log_old.exp() * k3(log_theta - log_old)).sum()
    reverse = (log_theta.exp() * k3(log_old - log_theta)).sum()
    assert forward.item() == pytest.approx(ukl(log_old, log_theta).item(), abs=1e-14)
    assert reverse.item() == pytest.approx(ukl(log_theta, log_old).item(), abs=1e-14)
    assert abs(forward.item() - reverse.item()) > 1e-3


@pytest.mark.parametrize("variant", list(KL_ESTIMATORS))
@pytest.mark.parametrize("separate_ref", [False, True], ids=["iterative", "ref"])
def test_kl_component_is_minus_the_derivative_of_the_estimate(variant, separate_ref):
    """kl_component (section 3) is exactly -d estimate / d logp, token by token."""
    g = torch.Generator().manual_seed(1)
    log_w = (0.5 * torch.randn(32, generator=g, dtype=F64)).requires_grad_(True)
    log_rho = 0.5 * torch.randn(32, generator=g, dtype=F64) if separate_ref else None
    (d,) = torch.autograd.grad(kl_estimate(variant, log_w, log_rho).sum(), log_w)
    component = kl_component(variant, log_w, log_rho)
    assert torch.allclose(component, -d, atol=1e-14)
    assert not component.requires_grad


def test_iterative_reference_estimators_are_the_k_estimators():
    """With pi_ref = pi_old: fkl -> k1(w), ufkl -> k3(w), rkl -> w log w, urkl -> w k3(1/w)."""
    log_w = torch.linspace(-2, 2, 9, dtype=F64)
    zero = torch.zeros_like(log_w)
    w = log_w.exp()
    for log_rho in (zero, None):  # an explicit all-zero log rho and the iterative shortcut agree
        assert torch.allclose(kl_estimate("fkl", log_w, log_rho), k1(log_w))
        assert torch.allclose(kl_estimate("ufkl", log_w, log_rho), k3(log_w))
        assert torch.allclose(kl_estimate("rkl", log_w, log_rho), w * log_w)
        assert torch.allclose(kl_estimate("urkl", log_w, log_rho), w * k3(-log_w))


def test_unknown_variant():
    with pytest.raises(ValueError, match="unknown KL variant 'kl'"):
        kl_estimate("kl", torch.zeros(1), None)
    with pytest.raises(ValueError, match="unknown KL variant 'kl'"):
        kl_component("kl", torch.zeros(1), None)


def test_k2_is_second_order_close_to_k3():
    small = torch.tensor([1e-3], dtype=F64)
    assert k2(small).item() == pytest.approx(k3(small).item(), rel=1e-3)
    assert math.isclose(k1(small).item(), -1e-3)


@pytest.mark.parametrize("variant", list(KL_ESTIMATORS))
def test_a_given_w_gives_the_same_estimate_and_gradient(variant):
    """The losses pass the w they already computed; the estimate and its gradient must not change."""
    g = torch.Generator().manual_seed(2)
    log_w = (0.5 * torch.randn(16, generator=g, dtype=F64)).requires_grad_(True)
    log_rho = 0.5 * torch.randn(16, generator=g, dtype=F64)
    alone = kl_estimate(variant, log_w, log_rho)
    given = kl_estimate(variant, log_w, log_rho, log_w.exp())
    assert torch.allclose(alone, given, atol=1e-14)
    (d_alone,) = torch.autograd.grad(alone.sum(), log_w)
    (d_given,) = torch.autograd.grad(given.sum(), log_w)
    assert torch.allclose(d_alone, d_given, atol=1e-14)
