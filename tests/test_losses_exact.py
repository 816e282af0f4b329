"""MATH.md section 6: every policy loss against the exact gradient of its objective, by enumeration.

A categorical policy over V outcomes stands in for one token position. x ~ pi_old; the expected loss
sum_x pi_old(x) L(x) is built from `policy_loss` called on each outcome, and its gradient in theta is
compared with -grad J(theta), J computed in closed form from its definition (float64, 1e-10).

Two parameterisations: softmax (normalized, as an LLM's next-token distribution) and exp(theta)
(unnormalized). For normalized policies KL and UKL have the same gradient, so only the unnormalized
one tells fkl from ufkl and rkl from urkl; both must pass.
"""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

from rpg_cli.algorithms import LOSS_NAMES, policy_loss

V = 7
F64 = torch.float64
TOL = dict(rtol=0, atol=1e-10)


class Case:
    """pi_old, pi_ref, advantages and the log pi_theta(theta) map for one configuration."""

    def __init__(self, seed: int, normalized: bool, separate_ref: bool, on_policy: bool):
        g = torch.Generator().manual_seed(seed)
        self.normalized = normalized
        self.log_old = torch.log_softmax(torch.randn(V, generator=g, dtype=F64), 0)
        self.log_ref = (
            torch.log_softmax(self.log_old + 0.5 * torch.randn(V, generator=g, dtype=F64), 0) if separate_ref else None
        )
        self.adv = torch.randn(V, generator=g, dtype=F64) - 0.2  # R - b with an arbitrary baseline
        # small moves keep every ratio inside the clip window, so clipped losses must be exact as well
        step = torch.zeros(V, dtype=F64) if on_policy else 0.08 * torch.randn(V, generator=g, dtype=F64)
        start = self.log_old.clone()
        if not normalized:
            start = start + 0.05 * torch.randn(V, generator=g, dtype=F64)  # off the simplex: sum pi != 1
            if on_policy:
                start = self.log_old.clone()
        self.theta = (start + step).requires_grad_(True)

    def log_pi(self, theta: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(theta, 0) if self.normalized else theta

    @property
    def log_ref_or_old(self) -> torch.Tensor:
        return self.log_old if self.log_ref is None else self.log_ref


def expected_loss(case: Case, name: str, **kw) -> torch.Tensor:
    """sum_x pi_old(x) * policy_loss(one token x)."""
    log_pi = case.log_pi(case.theta)
    total = torch.zeros((), dtype=F64)
    one = torch.ones(1, 1, dtype=torch.bool)
    for x in range(V):
        loss, _ = policy_loss(
            name,
            log_prob=log_pi[x].view(1, 1),
            old_log_prob=case.log_old[x].view(1, 1),
            advantages=case.adv[x].view(1),
            response_mask=one,
            ref_log_prob=None if case.log_ref is None else case.log_ref[x].view(1, 1),
            **kw,
        )
        total = total + case.log_old[x].exp() * loss
    return total


# ------------------------------------------------------------------ closed-form objectives


def kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum p log(p/q), for possibly unnormalized p, q."""
    return (log_p.exp() * (log_p - log_q)).sum()


def ukl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """UKL(p || q) = sum p log(p/q) + sum (q - p)."""
    return kl(log_p, log_q) + (log_q.exp() - log_p.exp()).sum()


DIVERGENCES = {
    "fkl": lambda log_pi, log_ref: kl(log_ref, log_pi),
    "rkl": lambda log_pi, log_ref: kl(log_pi, log_ref),
    "ufkl": lambda log_pi, log_ref: ukl(log_ref, log_pi),
    "urkl": lambda log_pi, log_ref: ukl(log_pi, log_ref),
}


def sapo_gate(w: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """SAPO's f_tau(w) = sigma(tau (w - 1)) 4 / tau (MATH.md section 9.6)."""
    return torch.sigmoid(tau * (w - 1)) * 4 / tau


def objective(case: Case, name: str, beta: float) -> torch.Tensor:
    """J(theta) of each loss name, from its definition (MATH.md sections 1, 4 and 9)."""
    log_pi = case.log_pi(case.theta)
    reward = (log_pi.exp() * case.adv).sum()  # E_pi[A], = E_old[w A]
    if name in ("ppo", "gspo", "cispo", "gmpo"):  # one-token sequences inside the clip window: the plain reward
        return reward
    if name == "sapo":  # E_old[f_tau(w) A], tau_pos = 1.0 for A > 0, tau_neg = 1.05 otherwise
        tau = torch.where(case.adv > 0, torch.ones_like(case.adv), torch.full_like(case.adv, 1.05))
        return (case.log_old.exp() * sapo_gate((log_pi - case.log_old).exp(), tau) * case.adv).sum()
    if name == "grpo_corrected":
        return reward - beta * ukl(log_pi, case.log_ref_or_old)
    if name == "grpo":
        # what the published loss optimises: sum_x pi_old(x) k3(pi_ref(x)/pi_theta(x)), pi_old held fixed
        log_y = case.log_ref_or_old - log_pi
        return reward - beta * (case.log_old.exp() * (log_y.exp() - 1 - log_y)).sum()
    variant = name.rsplit("_", 1)[1]
    return reward - beta * DIVERGENCES[variant](log_pi, case.log_ref_or_old)


def grad(value: torch.Tensor, case: Case) -> torch.Tensor:
    return torch.autograd.grad(value, case.theta)[0]


CASES = list(itertools.product([True, False], [False, True], [True, False]))  # normalized, separate ref, on-policy
CASE_IDS = [
    f"{'softmax' if n else 'unnormalized'}-{'ref' if r else 'iterative'}-{'on' if o else 'off'}" for n, r, o in CASES
]


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize(("normalized", "separate_ref", "on_policy"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("clip", [False, True], ids=["unclipped", "clipped"])
def test_gradient_equals_minus_gradient_of_objective(name, normalized, separate_ref, on_policy, clip):
    beta = 0.37
    case = Case(
        seed=zlib.crc32(f"{name}{normalized}{separate_ref}{on_policy}".encode()),
        normalized=normalized,
        separate_ref=separate_ref,
        on_policy=on_policy,
    )
    # GMPO's bounds are on log w: +-0.4, its default, holds every ratio the cases reach
    eps = dict(eps_low=0.4, eps_high=0.4) if name == "gmpo" else dict(eps_low=0.2, eps_high=0.28)
    surrogate = grad(expected_loss(case, name, beta=beta, clip=clip, clip_c=3.0, **eps), case)
    exact = grad(objective(case, name, beta), case)
    assert torch.allclose(surrogate, -exact, **TOL), (surrogate, -exact)
    assert exact.abs().max() > 1e-3  # the comparison is not between two zeros


def test_the_cases_are_off_policy_and_off_the_simplex_where_claimed():
    case = Case(seed=1, normalized=False, separate_ref=True, on_policy=False)
    pi = case.log_pi(case.theta).exp()
    assert abs(pi.sum().item() - 1) > 1e-3
    assert (case.log_pi(case.theta) - case.log_old).abs().max() > 1e-2
    ratios = (case.log_pi(case.theta) - case.log_old).exp()
    assert ((ratios > 0.8) & (ratios < 1.28)).all()  # inside the clip window: clipped == unclipped gradient


@pytest.mark.parametrize("variant", ["fkl", "ufkl", "rkl", "urkl"])
def test_unnormalized_policies_tell_kl_from_ukl(variant):
    """Guard for the test design: on the unnormalized case the four objectives have different gradients."""
    case = Case(seed=3, normalized=False, separate_ref=True, on_policy=False)
    grads = {v: grad(objective(case, f"rpg_{v}", 1.0), case) for v in DIVERGENCES}
    others = [v for v in DIVERGENCES if v != variant]
    assert all((grads[variant] - grads[o]).abs().max() > 1e-3 for o in others)


def test_published_grpo_kl_is_not_the_reverse_kl_gradient():
    """GRPO's unweighted k3 term: off-policy its gradient is not grad UKL(pi_theta || pi_ref) ..."""
    case = Case(seed=5, normalized=True, separate_ref=True, on_policy=False)
    kw = dict(beta=1.0, clip=False)
    published = grad(expected_loss(case, "grpo", **kw), case)
    corrected = grad(expected_loss(case, "grpo_corrected", **kw), case)
    reverse_ukl = grad(objective(case, "grpo_corrected", 1.0), case)
    assert torch.allclose(corrected, -reverse_ukl, **TOL)
    assert (published - corrected).abs().max() > 1e-3


def test_published_grpo_kl_on_policy_is_the_forward_kl_gradient():
    """... and on-policy it is the gradient of the *forward* UKL(pi_ref || pi_theta)."""
    case = Case(seed=6, normalized=True, separate_ref=True, on_policy=True)
    case.adv = torch.zeros(V, dtype=F64)  # isolate the KL term
    published = grad(expected_loss(case, "grpo", beta=1.0, clip=False), case)
    forward = grad(DIVERGENCES["ufkl"](case.log_pi(case.theta), case.log_ref), case)
    backward = grad(DIVERGENCES["urkl"](case.log_pi(case.theta), case.log_ref), case)
    assert torch.allclose(published, forward, **TOL)
    assert (published - backward).abs().max() > 1e-3


@pytest.mark.parametrize("name", [n for n in LOSS_NAMES if n.startswith(("rpg", "grpo"))])  # the KL losses
@pytest.mark.parametrize("separate_ref", [False, True], ids=["iterative", "ref"])
def test_kl_metric_is_the_exact_divergence_in_expectation(name, separate_ref):
    """The `kl` metric averaged under pi_old equals the penalised divergence (an unbiased estimate)."""
    case = Case(seed=11, normalized=False, separate_ref=separate_ref, on_policy=False)
    log_pi = case.log_pi(case.theta).detach()
    estimate = 0.0
    for x in range(V):
        _, metrics = policy_loss(
            name,
            log_prob=log_pi[x].view(1, 1),
            old_log_prob=case.log_old[x].view(1, 1),
            advantages=case.adv[x].view(1),
            response_mask=torch.ones(1, 1, dtype=torch.bool),
            ref_log_prob=None if case.log_ref is None else case.log_ref[x].view(1, 1),
            beta=0.1,
        )
        estimate += case.log_old[x].exp().item() * metrics["kl"]
    if name == "grpo":
        log_y = case.log_ref_or_old - log_pi
        exact = (case.log_old.exp() * (log_y.exp() - 1 - log_y)).sum()
    elif name == "grpo_corrected":
        exact = ukl(log_pi, case.log_ref_or_old)
    else:
        exact = DIVERGENCES[name.rsplit("_", 1)[1]](log_pi, case.log_ref_or_old)
    assert estimate == pytest.approx(exact.item(), abs=1e-12)


# ------------------------------------------------------------------ per-token REINFORCE weights


def reinforce_weight(variant: str, log_w, log_rho, adv, beta):
    """The 'gradient of J' column of MATH.md section 1 (and its pi_ref form), written out independently:
    d J / d logp(x) per sampled token, i.e. the weight g with grad J = E_old[g grad log pi]."""
    w, rho, log_u = log_w.exp(), log_rho.exp(), log_w - log_rho
    return {
        "fkl": w * adv + beta * rho,
        "rkl": w * (adv - beta * (log_u + 1)),
        "ufkl": w * adv - beta * (w - rho),
        "urkl": w * (adv - beta * log_u),
    }[variant]


@pytest.mark.parametrize("family", ["rpg", "rpg_reinforce"])
@pytest.mark.parametrize("variant", ["fkl", "rkl", "ufkl", "urkl"])
@pytest.mark.parametrize("separate_ref", [False, True], ids=["iterative", "ref"])
@pytest.mark.parametrize("clip", [False, True], ids=["unclipped", "clipped-inside-window"])
def test_per_token_gradient_is_the_reinforce_weight(family, variant, separate_ref, clip):
    """Stronger than the expectation: every single token's d loss / d logp is -g(x) (token-sum aggregation)."""
    g = torch.Generator().manual_seed(7)
    n = 64
    old = -torch.rand(n, 1, generator=g, dtype=F64) * 3
    logp = (old + 0.1 * torch.randn(n, 1, generator=g, dtype=F64)).requires_grad_(True)
    ref = old + 0.4 * torch.randn(n, 1, generator=g, dtype=F64) if separate_ref else None
    adv = torch.randn(n, 1, generator=g, dtype=F64)
    beta = 0.3
    loss, _ = policy_loss(
        f"{family}_{variant}",
        log_prob=logp,
        old_log_prob=old,
        advantages=adv,
        response_mask=torch.ones(n, 1, dtype=torch.bool),
        ref_log_prob=ref,
        beta=beta,
        clip=clip,
        eps_low=0.5,
        eps_high=0.5,
        clip_c=3.0,
        loss_agg_mode="token-sum",
    )
    (d_logp,) = torch.autograd.grad(loss, logp)
    log_w = (logp - old).detach()
    log_rho = torch.zeros_like(old) if ref is None else ref - old
    expected = -reinforce_weight(variant, log_w, log_rho, adv, beta)
    assert torch.allclose(d_logp, expected, **TOL)
