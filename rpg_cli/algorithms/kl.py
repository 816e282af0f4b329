"""KL estimators (MATH.md section 1).

Everything takes *log*-ratios, so no caller ever divides probabilities. Tokens come from pi_old;
with a reference pi_ref (pi_ref = pi_old in the paper's iterative setting) the ratios are

    w   = pi_theta / pi_old   (log_w = logp - old_logp, carries gradient)
    rho = pi_ref   / pi_old   (log_rho = ref_logp - old_logp, no gradient; None when pi_ref = pi_old)
    u   = pi_theta / pi_ref   (log_u = log_w - log_rho)

Each divergence below is an importance-weighted k-estimator whose expectation under pi_old is the
exact divergence, and whose derivative with respect to logp is the paper's gradient (section 1, and
"With a separate reference pi_ref"). `kl_component` is the matching weight of section 3: the
no-gradient factor w.r.t. which `-kl_component * logp` has the divergence's gradient.
"""

from __future__ import annotations

import torch

from rpg_cli.algorithms.table import KL_VARIANTS

# exp() of a log-ratio beyond this overflows float32 products and sums; verl clamps at the same bound.
LOG_RATIO_LIMIT = 20.0
# verl's `low_var_kl` (and the paper's fork) also clamps the k3 value itself to [-LIMIT, LIMIT].
K3_VALUE_LIMIT = 10.0


def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """k1(y) = -log y."""
    return -log_ratio


def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """k2(y) = (log y)^2 / 2."""
    return 0.5 * log_ratio.square()


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3(y) = y - 1 - log y  (>= 0; expm1 keeps it exact near y = 1)."""
    return torch.expm1(log_ratio) - log_ratio


def low_var_kl(log_ref_ratio: torch.Tensor) -> torch.Tensor:
    """k3(pi_ref/pi_theta) as GRPO ran it (MATH.md section 4): verl's `low_var_kl`, also the paper's fork.

    The log-ratio log(pi_ref/pi_theta) is clamped to +-20 and the value to [-10, 10], so tokens beyond
    either bound carry no gradient. `k3` itself stays exact; this is the clamped estimator of the runs.
    """
    return k3(log_ref_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)).clamp(-K3_VALUE_LIMIT, K3_VALUE_LIMIT)


def kl_loss_term(estimator: str, log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """Per-token KL-loss term toward pi_ref, as verl's actor computes `kl_penalty` (MATH.md section 4).

    k1: log pi_theta - log pi_ref (verl `kl`); k2: (log pi_theta - log pi_ref)^2 / 2 (verl `mse`);
    k3: `low_var_kl` (verl `low_var_kl`). Not importance-weighted, as the runs used it.
    """
    log_ratio = log_prob - ref_log_prob
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return k2(log_ratio)
    if estimator == "k3":
        return low_var_kl(-log_ratio)
    raise ValueError(f"unknown KL-loss estimator {estimator!r}; expected one of k1, k2, k3")


def clamp_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """Clamp to +-LOG_RATIO_LIMIT before any exp: a ratio beyond e^20 is a broken sample, not data.

    The estimators below take log-ratios clamped this way, so their exps stay finite in float32.
    """
    return log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def log_u_of(log_w: torch.Tensor, log_rho: torch.Tensor | None) -> torch.Tensor:
    """log u = log(pi_theta/pi_ref); log_rho None is the iterative reference pi_ref = pi_old (u = w), the
    paper's default, where no all-ones rho is ever built."""
    return log_w if log_rho is None else log_w - log_rho


def forward_kl(log_w: torch.Tensor, log_rho: torch.Tensor | None, w: torch.Tensor | None = None) -> torch.Tensor:
    """KL(pi_ref || pi_theta) = E_old[rho * k1(u)]; its gradient term is -rho * logp."""
    if log_rho is None:
        return k1(log_w)
    return torch.exp(log_rho) * (log_rho - log_w)  # rho k1(u), k1(u) = log rho - log w: one op less to backprop


def reverse_kl(log_w: torch.Tensor, log_rho: torch.Tensor | None, w: torch.Tensor | None = None) -> torch.Tensor:
    """KL(pi_theta || pi_ref) = E_old[w log u]."""
    return (torch.exp(log_w) if w is None else w) * log_u_of(log_w, log_rho)


def forward_ukl(log_w: torch.Tensor, log_rho: torch.Tensor | None, w: torch.Tensor | None = None) -> torch.Tensor:
    """UKL(pi_ref || pi_theta) = E_old[rho * k3(u)] = E_old[w - rho - rho log u].

    With pi_ref = pi_old this is E_old[k3(pi_theta/pi_old)] (the k3 identity of section 1).
    """
    if log_rho is None:
        return k3(log_w)
    if w is None:
        return torch.exp(log_rho) * k3(log_w - log_rho)
    # rho k3(u) = w - rho (1 + log w - log rho), with the w the caller has and the constant part apart
    rho = torch.exp(log_rho)
    return w - rho * log_w - rho * (1 - log_rho)


def reverse_ukl(log_w: torch.Tensor, log_rho: torch.Tensor | None, w: torch.Tensor | None = None) -> torch.Tensor:
    """UKL(pi_theta || pi_ref) = E_old[w * k3(1/u)] = E_theta[k3(pi_ref/pi_theta)].

    This is also GRPO's KL term with its importance-weight correction.
    """
    return (torch.exp(log_w) if w is None else w) * k3(-log_u_of(log_w, log_rho))


KL_ESTIMATORS = {"fkl": forward_kl, "rkl": reverse_kl, "ufkl": forward_ukl, "urkl": reverse_ukl}


def kl_estimate(
    variant: str, log_w: torch.Tensor, log_rho: torch.Tensor | None, w: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token estimate of the variant's divergence: E_old[estimate] is the divergence, and
    d estimate / d logp is the paper's gradient term. `w` = exp(log_w) when the caller has it."""
    try:
        return KL_ESTIMATORS[variant](log_w, log_rho, w)
    except KeyError:
        raise ValueError(f"unknown KL variant {variant!r}; expected one of {', '.join(KL_VARIANTS)}") from None


@torch.no_grad()
def kl_component(variant: str, log_w: torch.Tensor, log_rho: torch.Tensor | None) -> torch.Tensor:
    """`kl_component(w)` of MATH.md section 3, so that w A_R + beta * kl_component is the REINFORCE weight
    of section 1's gradient column (= -d kl_estimate / d logp):

        variant   reference = pi_old     separate pi_ref
        fkl       +1                     +rho
        rkl       -w (log w + 1)         -w (log u + 1)
        ufkl      -(w - 1)               -(w - rho)
        urkl      -w log w               -w log u
    """
    w = torch.exp(log_w)
    rho = 1.0 if log_rho is None else torch.exp(log_rho)
    log_u = log_u_of(log_w, log_rho)
    if variant == "fkl":
        return torch.ones_like(w) if log_rho is None else rho
    if variant == "rkl":
        return -w * (log_u + 1)
    if variant == "ufkl":
        return rho - w
    if variant == "urkl":
        return -w * log_u
    raise ValueError(f"unknown KL variant {variant!r}; expected one of {', '.join(KL_VARIANTS)}")


@torch.no_grad()
def reference_kl(old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The KL to the reference that the iterative reference tracks (section 1, "With a separate reference
    pi_ref"; the paper's "token-level KL"): the token-mean over all valid tokens of the batch of

        k3(pi_ref / pi_old) = rho - 1 - log rho,   log rho = ref_logp - old_logp,

    whose expectation under x ~ pi_old is UKL(pi_old || pi_ref) = KL(pi_old || pi_ref) (the k3 identity of
    section 1), i.e. how far the policy that sampled the batch has moved from pi_ref. 0 when no token is
    valid; padded positions never enter (masked before the exp); computed in at least float32 (verl's
    log-probs may be bf16).
    """
    dtype = torch.promote_types(torch.promote_types(old_log_prob.dtype, ref_log_prob.dtype), torch.float32)
    mask = response_mask.bool()
    log_rho = torch.where(mask, clamp_log_ratio(ref_log_prob.to(dtype) - old_log_prob.to(dtype)), 0.0)
    return k3(log_rho).sum() / mask.sum().clamp(min=1)
