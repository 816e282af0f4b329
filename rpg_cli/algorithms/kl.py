"""KL estimators (MATH.md section 1).

Everything takes *log*-ratios, so no caller ever divides probabilities. Tokens come from pi_old;
with a reference pi_ref (pi_ref = pi_old in the paper's iterative setting) the ratios are

    w   = pi_theta / pi_old   (log_w = logp - old_logp, carries gradient)
    rho = pi_ref   / pi_old   (log_rho = ref_logp - old_logp, no gradient; None when pi_ref = pi_old)
    u   = pi_theta / pi_ref   (log_u = log_w - log_rho)

Each divergence below is an importance-weighted k-estimator whose expectation under pi_old is the
exact divergence, and whose derivative with respect to logp is the paper's gradient (section 1, and
"With a separate reference pi_ref"). `reinforce_weight` is the matching `kl_component` of section 3:
the no-gradient weight w.r.t. which `-kl_component * logp` has the divergence's gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

KL_VARIANTS = ("fkl", "rkl", "ufkl", "urkl")

# exp() of a log-ratio beyond this overflows float32 products and sums; verl clamps at the same bound.
LOG_RATIO_LIMIT = 20.0


def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """k1(y) = -log y."""
    return -log_ratio


def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """k2(y) = (log y)^2 / 2."""
    return 0.5 * log_ratio.square()


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3(y) = y - 1 - log y  (>= 0; expm1 keeps it exact near y = 1)."""
    return torch.expm1(log_ratio) - log_ratio


def clamp_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """Clamp to +-LOG_RATIO_LIMIT before any exp: a ratio beyond e^20 is a broken sample, not data.

    The estimators below take log-ratios clamped this way, so their exps stay finite in float32.
    """
    return log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def log_u_of(log_w: torch.Tensor, log_rho: torch.Tensor | None) -> torch.Tensor:
    """log u = log(pi_theta/pi_ref); log_rho None is the iterative reference pi_ref = pi_old (u = w), the
    paper's default, where no all-ones rho is ever built."""
    return log_w if log_rho is None else log_w - log_rho


class KLTerm(NamedTuple):
    value: torch.Tensor  # per-token estimate; E_old[value] = the divergence, d value / d logp = its gradient
    reinforce_weight: torch.Tensor  # kl_component of MATH.md section 3 (no gradient)


def forward_kl(log_w: torch.Tensor, log_rho: torch.Tensor | None) -> KLTerm:
    """KL(pi_ref || pi_theta) = E_old[rho * k1(u)];  gradient term -rho * logp;  kl_component +rho."""
    if log_rho is None:
        return KLTerm(k1(log_w), torch.ones_like(log_w))
    rho = torch.exp(log_rho)
    return KLTerm(rho * k1(log_w - log_rho), rho)


def reverse_kl(log_w: torch.Tensor, log_rho: torch.Tensor | None) -> KLTerm:
    """KL(pi_theta || pi_ref) = E_old[w log u];  kl_component -w (log u + 1)."""
    w = torch.exp(log_w)
    log_u = log_u_of(log_w, log_rho)
    return KLTerm(w * log_u, (-w * (log_u + 1)).detach())


def forward_ukl(log_w: torch.Tensor, log_rho: torch.Tensor | None) -> KLTerm:
    """UKL(pi_ref || pi_theta) = E_old[rho * k3(u)] = E_old[w - rho - rho log u];  kl_component -(w - rho).

    With pi_ref = pi_old this is E_old[k3(pi_theta/pi_old)] (the k3 identity of section 1).
    """
    w = torch.exp(log_w.detach())
    if log_rho is None:
        return KLTerm(k3(log_w), 1 - w)
    rho = torch.exp(log_rho)
    return KLTerm(rho * k3(log_w - log_rho), rho - w)


def reverse_ukl(log_w: torch.Tensor, log_rho: torch.Tensor | None) -> KLTerm:
    """UKL(pi_theta || pi_ref) = E_old[w * k3(1/u)] = E_theta[k3(pi_ref/pi_theta)];  kl_component -w log u.

    This is also GRPO's KL term with its importance-weight correction.
    """
    w = torch.exp(log_w)
    log_u = log_u_of(log_w, log_rho)
    return KLTerm(w * k3(-log_u), (-w * log_u).detach())


KL_TERMS = {"fkl": forward_kl, "rkl": reverse_kl, "ufkl": forward_ukl, "urkl": reverse_ukl}


def kl_term(variant: str, log_w: torch.Tensor, log_rho: torch.Tensor | None) -> KLTerm:
    try:
        return KL_TERMS[variant](log_w, log_rho)
    except KeyError:
        raise ValueError(f"unknown KL variant {variant!r}; expected one of {', '.join(KL_VARIANTS)}") from None
