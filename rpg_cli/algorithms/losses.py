"""Policy losses of the RPG paper (MATH.md sections 1-3, 5) and today's baselines (section 9) behind one entry
point, `policy_loss`.

Each per-token formula is a function of its own, readable next to MATH.md. `policy_loss` validates
its inputs, turns them into clean per-token log-ratios, calls the formula and aggregates with verl's
`loss_agg_mode` semantics.

Padding never leaks: masked positions may hold -inf/NaN in any input; they are replaced (torch.where,
never multiplication) by log-ratio 0 and advantage 0 before any exp/log, so every per-token quantity
there is finite (and in fact 0), in the loss and in its gradient. Sequence-level quantities (GSPO's ratio,
GMPO's geometric mean) are means over each row's valid tokens only; an all-padding row contributes nothing.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from rpg_cli.algorithms.defaults import CLIP_C, EPS_HIGH, EPS_LOW, SAPO_TAU_NEG, SAPO_TAU_POS
from rpg_cli.algorithms.kl import (
    KL_VARIANTS,
    LOG_RATIO_LIMIT,
    clamp_log_ratio,
    k3,
    kl_component,
    kl_estimate,
    kl_loss_term,
    log_u_of,
    low_var_kl,
)

LOSS_NAMES = (
    *(f"rpg_{v}" for v in KL_VARIANTS),
    *(f"rpg_reinforce_{v}" for v in KL_VARIANTS),
    "ppo",
    "grpo",
    "grpo_corrected",
    "gspo",
    "cispo",
    "gmpo",
    "sapo",
)
SEQUENCE_LOSSES = ("gspo", "gmpo")  # one importance ratio per sequence: rows are not interchangeable with tokens
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


class TokenLoss(NamedTuple):
    """Per-token loss matrix plus what the metrics need (masks are bool, None when unclipped)."""

    loss: torch.Tensor
    ratio: torch.Tensor  # the importance weight w used
    kl: torch.Tensor | None = None  # per-token estimate of the penalised divergence
    clip_high: torch.Tensor | None = None  # ratio above 1+eps_high with a positive advantage: no gradient
    clip_low: torch.Tensor | None = None  # ratio below 1-eps_low with a negative advantage: no gradient
    clip_dual: torch.Tensor | None = None  # ratio above c with a negative advantage: bounded, no gradient
    # (CISPO's clip_high/clip_low: the weight was clipped to its bound, the token keeps its gradient)


# ---------------------------------------------------------------- clipping (section 2)


def dual_clip(w: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, c: float) -> TokenLoss:
    """RPG-Style Clip / dual-clip PPO on a fixed advantage Â (MATH.md section 2).

        L_clip = max(-w Â, -clip(w, 1-e1, 1+e2) Â)
        L      = L_clip               if Â >= 0
        L      = min(L_clip, -c Â)    if Â < 0

    Computed in the equivalent single-clamp form (same values, same gradients off the measure-zero
    boundaries): max(-w Â, -clip(w) Â) is -Â min(w, 1+e2) for Â >= 0 and -Â max(w, 1-e1) for Â < 0,
    whose min with -c Â is -Â clamp(w, 1-e1, c). The gradient flows only where w is not clamped.
    """
    negative = adv < 0
    effective = torch.where(negative, w.clamp(1 - eps_low, c), w.clamp(max=1 + eps_high))
    loss = -adv * effective
    with torch.no_grad():
        clip_high = (adv > 0) & (w > 1 + eps_high)
        clip_low = negative & (w < 1 - eps_low)
        clip_dual = negative & (w > c)
    return TokenLoss(loss, w, None, clip_high, clip_low, clip_dual)


# ---------------------------------------------------------------- PPO, DAPO, REINFORCE++ (section 4)


def ppo_loss(
    log_w: torch.Tensor, adv: torch.Tensor, *, clip: bool, eps_low: float, eps_high: float, c: float
) -> TokenLoss:
    """Dual-clip PPO without KL: `-w A` unclipped, `dual_clip(w, A)` clipped."""
    w = torch.exp(log_w)
    return dual_clip(w, adv, eps_low, eps_high, c) if clip else TokenLoss(-w * adv, w)


# ---------------------------------------------------------------- RPG, fully differentiable (Algorithm 1)


def rpg_loss(
    variant: str,
    log_w: torch.Tensor,
    log_rho: torch.Tensor | None,
    adv: torch.Tensor,
    *,
    beta: float,
    clip: bool,
    eps_low: float,
    eps_high: float,
    c: float,
) -> TokenLoss:
    """Fully differentiable RPG loss (MATH.md section 1 table, section 2, paper Algorithm 1).

    Unclipped: `-w A + beta * D`, with D the importance-weighted estimator of the variant's divergence
    (kl.py). Its gradient is exactly section 1's; its value differs from the table's loss only by
    terms without gradient (e.g. `fkl`'s `beta log pi_old`), chosen so that D estimates the divergence.

    Clipped: `fkl`, `ufkl` clip `-w A` and add `beta * D` outside the clip (the paper's "common
    simplification"); `rkl`, `urkl` put the KL inside the (detached) advantage and clip that:
        rkl:  Â = A - beta (log u + 1)        urkl: Â = A - beta log u
    (u = pi_theta/pi_ref; u = w for the iterative reference). Detaching Â makes the unclipped limit
    have section 1's per-token gradient exactly.
    """
    w = torch.exp(log_w)
    kl = kl_estimate(variant, log_w, log_rho, w)
    if not clip:
        return TokenLoss(-w * adv + beta * kl, w, kl)
    if variant in ("rkl", "urkl"):
        log_u = log_u_of(log_w, log_rho)
        adv_hat = adv - beta * (log_u + 1) if variant == "rkl" else adv - beta * log_u
        return dual_clip(w, adv_hat.detach(), eps_low, eps_high, c)._replace(kl=kl.detach())
    clipped = dual_clip(w, adv, eps_low, eps_high, c)
    return clipped._replace(loss=clipped.loss + beta * kl, kl=kl)


# ---------------------------------------------------------------- RPG-REINFORCE (Algorithm 2, eq. 4.1)


def rpg_reinforce_loss(
    variant: str,
    log_w: torch.Tensor,
    log_rho: torch.Tensor | None,
    log_prob: torch.Tensor,
    adv: torch.Tensor,
    *,
    beta: float,
    clip: bool,
    eps_low: float,
    eps_high: float,
    c: float,
    clipped_weight: bool = False,
) -> TokenLoss:
    """REINFORCE-style RPG loss with RPG-Style Clip (MATH.md section 3, paper Algorithm 2).

    With ℓ = -logp, C_KL = beta * kl_component(w), A' = A + SG(C_KL)/SG(w), psi = A' ℓ:

        psi >= 0:  w < 1+e2      -> psi SG(w)                                  (gradient via ℓ)
                   otherwise     -> (A + SG(C_KL)/(1+e2)) SG(ℓ) (1+e2)          (no gradient)
        psi < 0:   w <= 1-e1     -> (A + SG(C_KL)/(1-e1)) SG(ℓ) (1-e1)          (no gradient)
                   w < c         -> psi SG(w)                                  (gradient via ℓ)
                   otherwise     -> A SG(ℓ) c + SG(C_KL) SG(ℓ)                  (no gradient)

    Every branch is (w̄ A + C_KL) ℓ, with w̄ the ratio w or the bound of its branch (1+e2, 1-e1, c),
    which is how it is computed; only the unclipped branches let the gradient through ℓ.
    Unclipped it is section 1's REINFORCE-style loss `-SG(w A + C_KL) logp`. `clipped_weight` is
    Remark F.2 (section 3, default off): inside SG the clipped w̄ = clip(w, 1-e1, 1+e2) replaces w *and*
    log w everywhere, so C_KL = beta * kl_component(w̄), psi's sign and the gradient branches' weight use w̄.
    """
    with torch.no_grad():  # every weight of a REINFORCE loss is a constant; the KL value is a metric
        w = torch.exp(log_w)
        kl = kl_estimate(variant, log_w, log_rho, w)
        log_w_sg = log_w
        if clip and clipped_weight:
            log_w_sg = log_w.clamp(math.log1p(-eps_low), math.log1p(eps_high))
        w_sg = torch.exp(log_w_sg)
        c_kl = beta * kl_component(variant, log_w_sg, log_rho)
    ell = -log_prob
    if not clip:
        return TokenLoss((w * adv + c_kl) * ell, w, kl)
    hi, lo = 1 + eps_high, 1 - eps_low
    with torch.no_grad():
        positive = (adv + c_kl / w_sg) * ell >= 0  # the sign of psi
        clip_high = positive & (w >= hi)
        clip_low = ~positive & (w <= lo)
        clip_dual = ~positive & (w >= c)
        no_gradient = clip_high | clip_low | clip_dual
        w_bar = torch.where(positive, w.clamp(max=hi), w.clamp(lo, c))
        if clipped_weight:
            w_bar = torch.where(no_gradient, w_bar, w_sg)
    loss = (w_bar * adv + c_kl) * torch.where(no_gradient, ell.detach(), ell)
    return TokenLoss(loss, w, kl, clip_high, clip_low, clip_dual)


# ---------------------------------------------------------------- GRPO (section 1 "GRPO's KL term")


def grpo_loss(
    log_w: torch.Tensor,
    log_ref_ratio: torch.Tensor,
    adv: torch.Tensor,
    *,
    corrected: bool,
    kl_clamp: bool,
    beta: float,
    clip: bool,
    eps_low: float,
    eps_high: float,
    c: float,
) -> TokenLoss:
    """GRPO (MATH.md sections 1 "GRPO's KL term" and 4): dual-clip PPO on A plus beta * k3(pi_ref/pi_theta).

    `log_ref_ratio` = log(pi_ref/pi_theta), unclamped. As published (`corrected=False`) the k3 term is not
    importance-weighted although tokens come from pi_old, so its gradient is not that of
    UKL(pi_theta || pi_ref). `corrected=True` weights it by w, the `urkl` estimator:
    E_old[w k3(pi_ref/pi_theta)] = UKL(pi_theta || pi_ref).
    `kl_clamp=True` (how the paper ran GRPO, and the default) takes k3 as verl's `low_var_kl`: log-ratio
    clamped to +-20, value to [-10, 10], so the loss equals verl's PPO loss + beta * low_var_kl on every
    input, value and gradient. `kl_clamp=False` is the exact k3 (log-ratio bounded at +-20 only, so
    exp() stays finite).
    """
    pg = ppo_loss(log_w, adv, clip=clip, eps_low=eps_low, eps_high=eps_high, c=c)
    kl = low_var_kl(log_ref_ratio) if kl_clamp else k3(clamp_log_ratio(log_ref_ratio))
    if corrected:
        kl = pg.ratio * kl
    return pg._replace(loss=pg.loss + beta * kl, kl=kl)


# ---------------------------------------------------------------- today's baselines (section 9)

# verl 0.9.1 bounds GSPO's sequence log-ratio at 10 (compute_policy_loss_gspo): s_i <= e^10, no gradient beyond
GSPO_LOG_RATIO_LIMIT = 10.0


def sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over each row's valid tokens, shape (batch, 1); 0 for a row without one. x is 0 on padding."""
    return x.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)


def token_form(seq_log_ratio: torch.Tensor, token_log_ratio: torch.Tensor, limit: float) -> torch.Tensor:
    """A sequence ratio written per token (GSPO's "GSPO-token" form): exp(min(SG(m_i) + x_t - SG(x_t), limit)).

    Its value is s_i = exp(m_i) on every token of sequence i and its derivative in x_t is s_i, so the per-sequence
    token mean of -A s_{i,t} has exactly the value -A s_i and the gradient -A s_i (1/|y_i|) sum_t grad x_t of
    -A exp(m_i), m_i = (1/|y_i|) sum_t x_t. Beyond `limit` the ratio is bounded and carries no gradient.
    """
    return torch.exp((seq_log_ratio.detach() + token_log_ratio - token_log_ratio.detach()).clamp(max=limit))


def gspo_loss(
    log_w: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *, clip: bool, eps_low: float, eps_high: float
) -> TokenLoss:
    """GSPO (MATH.md section 9.3; Zheng et al., arXiv 2507.18071, eq. 5 and its GSPO-token form).

        s_i     = exp( (1/|y_i|) sum_t log w_{i,t} )            sequence ratio: geometric mean of the token ratios
        s_{i,t} = SG(s_i) pi_theta(y_{i,t}) / SG(pi_theta(y_{i,t}))   value s_i, gradient s_i grad log pi_theta
        L_{i,t} = max(-A_{i,t} s_{i,t}, -A_{i,t} clip(s_{i,t}, 1-e1, 1+e2))       (clip=False: -A_{i,t} s_{i,t})

    seq-mean-token-mean (the paper's mean over sequences) gives eq. 5 exactly; with per-sequence advantages every
    token of a sequence has the same ratio and the same clip decision. PPO's clip only, no dual clip (the paper's).
    `log_w` is the unclamped log-ratio (0 on padding), as verl takes it; log s_i is bounded at
    GSPO_LOG_RATIO_LIMIT as verl 0.9.1 bounds it, so the loss equals verl's `gspo` on every input.
    """
    s = token_form(sequence_mean(log_w, mask), log_w, GSPO_LOG_RATIO_LIMIT)
    loss = -adv * s
    if clip:
        loss = torch.maximum(loss, -adv * s.clamp(1 - eps_low, 1 + eps_high))
    ratio = torch.where(mask, s.detach(), torch.ones_like(s))  # 1 on padding, as the metrics expect
    if not clip:
        return TokenLoss(loss, ratio)
    with torch.no_grad():
        clip_high = (adv > 0) & (ratio > 1 + eps_high)
        clip_low = (adv < 0) & (ratio < 1 - eps_low)
    return TokenLoss(loss, ratio, None, clip_high, clip_low)


def cispo_loss(
    log_w: torch.Tensor, log_prob: torch.Tensor, adv: torch.Tensor, *, clip: bool, eps_low: float, eps_high: float
) -> TokenLoss:
    """CISPO (MATH.md section 9.4; MiniMax-M1, arXiv 2506.13585, eqs. 4-5): the clipped IS weight as a constant.

        w^ = clip(w, 1-e1, 1+e2)                          (clip=False: w^ = w)
        L  = -SG(w^ A) (1 + log pi_theta - SG(log pi_theta))

    The gradient is -w^ A grad log pi_theta on every token: a clipped weight never drops a token's gradient
    (RPG-REINFORCE's clip and PPO's do). It is the paper's and verl's `cispo` gradient exactly. The value is not:
    theirs is -SG(w^) A log pi_theta, which moves with log pi_theta itself; ours is -w^ A, the clipped
    importance-weighted advantage (PPO's pg_loss at w inside the clip), so that pg_loss means the same thing for
    every loss. Per token, ours = theirs - w^ A (1 - log pi_theta), before aggregation.
    The paper sets no lower bound (e1 "large"); e1 >= 1 is allowed here and means none (w >= 0 always).
    """
    w = torch.exp(log_w)
    weight = w.clamp(1 - eps_low, 1 + eps_high) if clip else w
    loss = -(weight * adv).detach() * (1 + log_prob - log_prob.detach())
    if not clip:
        return TokenLoss(loss, w)
    with torch.no_grad():
        clip_high = w > 1 + eps_high  # the weight was capped; the token keeps its gradient
        clip_low = w < 1 - eps_low
    return TokenLoss(loss, w, None, clip_high, clip_low)


def gmpo_loss(
    log_w: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *, clip: bool, eps_low: float, eps_high: float
) -> TokenLoss:
    """GMPO (MATH.md section 9.5; Zhao et al., arXiv 2507.20673): the geometric mean of token ratios, clipped per
    token in log space (e1, e2 are log-space bounds: the paper's range (e^-0.4, e^0.4) is e1 = e2 = 0.4).

        l_{i,t} = min(log w_{i,t}, e2) if A_{i,t} > 0;  max(log w_{i,t}, -e1) if A_{i,t} < 0;  0 if A_{i,t} = 0
        s_i     = exp( (1/|y_i|) sum_t l_{i,t} )               (clip=False: l = log w)
        A_i     = (1/|y_i|) sum_t A_{i,t}                      (the sequence's advantage)
        L_i     = -A_i s_i,  written per token as -A_i s_{i,t} (`token_form`)

    seq-mean-token-mean gives the paper's (1/G) sum_i -A_i s_i, value and gradient; the other modes weight the same
    sequence terms by their lengths. With per-token advantages the clip direction follows each token's sign and
    the multiplier is their mean, as verl's `geo_mean`. verl's function ignores loss_agg_mode and averages over
    all rows with torch.mean, so an all-padding row counts as a 0 in its denominator; here it contributes nothing
    (it holds no response), and the two agree on batches without empty rows. `log_w` is unclamped, as verl's;
    log s_i is bounded above at LOG_RATIO_LIMIT (verl: unbounded) so that s_i stays finite in float32.
    """
    if clip:
        tokens = torch.where(adv > 0, log_w.clamp(max=eps_high), log_w.clamp(min=-eps_low))
        tokens = torch.where(adv == 0, torch.zeros_like(log_w), tokens)
    else:
        tokens = log_w
    s = token_form(sequence_mean(tokens, mask), tokens, LOG_RATIO_LIMIT)
    seq_adv = sequence_mean(adv, mask)
    loss = torch.where(mask, -seq_adv * s, torch.zeros_like(s))  # the sequence's term on its valid tokens
    ratio = torch.where(mask, s.detach(), torch.ones_like(s))
    if not clip:
        return TokenLoss(loss, ratio)
    with torch.no_grad():
        clip_high = (adv > 0) & (log_w > eps_high)
        clip_low = (adv < 0) & (log_w < -eps_low)
    return TokenLoss(loss, ratio, None, clip_high, clip_low)


def sapo_loss(log_w: torch.Tensor, adv: torch.Tensor, *, tau_pos: float, tau_neg: float) -> TokenLoss:
    """SAPO (MATH.md section 9.6; Gao et al., arXiv 2511.20347): a sigmoid gate of w in place of the clip.

        f_tau(w) = sigma(tau (w - 1)) 4 / tau,   tau = tau_pos if A > 0 else tau_neg
        L        = -f_tau(w) A

    d f / d log w = 4 sigma (1 - sigma) w: exactly w (PPO's unclipped weight) at w = 1, decaying smoothly as w
    leaves 1, faster for tau_neg > tau_pos. The paper averages tokens per sequence and then sequences
    (seq-mean-token-mean), which verl 0.9.1's `sapo` always does; here the spec's loss_agg_mode applies.
    """
    w = torch.exp(log_w)
    tau = torch.where(adv > 0, torch.full_like(w, tau_pos), torch.full_like(w, tau_neg))
    gate = torch.sigmoid(tau * (w - 1.0)) * (4.0 / tau)
    return TokenLoss(-gate * adv, w)


def kl_penalty_loss(
    estimator: str,
    *,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
) -> torch.Tensor:
    """The KL loss of the PPO-family runs (MATH.md section 4), aggregated like the policy loss: the term to
    add times its coefficient. As verl's actor computes it (`use_kl_loss`, `kl_loss_type`): k1 (`kl`),
    k2 (`mse`) or k3 (`low_var_kl`) of pi_ref/pi_theta per token, not importance-weighted. pi_ref is the
    frozen model's log-probs, or pi_old's for the iterative reference (REINFORCE++ as the scripts ran it).
    Padding holds log-ratio 0, so nothing there leaks into the value or gradient.
    """
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    log_prob = torch.where(mask, log_prob, zero)
    ref = torch.where(mask, ref_log_prob.detach(), zero)
    return aggregate(kl_loss_term(estimator, log_prob, ref), mask, loss_agg_mode)


# ---------------------------------------------------------------- rollout correction (section 10)


def rollout_weighted(loss_mat: torch.Tensor, weights: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """The per-token loss times rollout correction's importance weights (MATH.md section 10), before it is
    aggregated, as verl 0.9.1's own losses apply `rollout_is_weights`; constants, and 1 on padding."""
    if weights is None:
        return loss_mat
    one = torch.ones((), dtype=loss_mat.dtype, device=loss_mat.device)
    return loss_mat * torch.where(mask, weights.detach().to(loss_mat.dtype), one)


# ---------------------------------------------------------------- aggregation (section 5)


def aggregate(
    loss_mat: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str, loss_scale_factor: float | None = None
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar with verl's `loss_agg_mode` semantics (single data-parallel rank).

    token-mean: sum over the batch's valid tokens / their count; token-sum: their sum;
    seq-mean-token-sum: per-sequence token sum, mean over sequences with a valid token;
    seq-mean-token-mean: per-sequence token mean, mean over those sequences;
    seq-mean-token-sum-norm (Dr. GRPO): seq-mean-token-sum / loss_scale_factor (default: max response length).
    """
    mask = response_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum()
    if loss_agg_mode == "token-sum":
        return (loss_mat * mask).sum()
    tokens = mask.sum(-1)
    has_tokens = (tokens > 0).to(loss_mat.dtype)
    seq_sum = (loss_mat * mask).sum(-1)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss = (seq_sum * has_tokens).sum() / has_tokens.sum()
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mat.shape[-1])
        return loss
    if loss_agg_mode == "seq-mean-token-mean":
        return (seq_sum / (tokens + 1e-8) * has_tokens).sum() / has_tokens.sum()
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")


# ---------------------------------------------------------------- the entry point


def _check_inputs(
    name,
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    ref_log_prob,
    loss_agg_mode,
    clip,
    eps_low,
    eps_high,
    clip_c,
    beta,
    weights=None,
):
    if name not in LOSS_NAMES:
        raise ValueError(f"unknown policy loss {name!r}; expected one of {', '.join(LOSS_NAMES)}")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")
    shape = tuple(log_prob.shape)
    if len(shape) != 2:
        raise ValueError(f"log_prob must be (batch, response_len), got shape {shape}")
    named = {"old_log_prob": old_log_prob, "response_mask": response_mask}
    if ref_log_prob is not None:
        named["ref_log_prob"] = ref_log_prob
    if weights is not None:
        named["weights"] = weights
    for key, tensor in named.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{key} has shape {tuple(tensor.shape)}, but log_prob has shape {shape}")
    if tuple(advantages.shape) not in (shape, shape[:1]):
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}, expected {shape} or ({shape[0]},)")
    if not bool(response_mask.bool().any()):
        raise ValueError("response_mask selects no token: nothing to compute a loss on")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if clip and not (eps_low > 0 and eps_high > 0 and clip_c > 1):
        raise ValueError(f"clip needs eps_low > 0, eps_high > 0 and clip_c > 1, got {eps_low}, {eps_high}, {clip_c}")


def policy_loss(
    name: str,
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_log_prob: torch.Tensor | None = None,
    beta: float = 0.0,
    clip: bool = True,
    eps_low: float = EPS_LOW,
    eps_high: float = EPS_HIGH,
    clip_c: float = CLIP_C,
    loss_agg_mode: str = "token-mean",
    clipped_weight: bool = False,
    kl_clamp: bool = True,
    tau_pos: float = SAPO_TAU_POS,
    tau_neg: float = SAPO_TAU_NEG,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss to minimise and the metrics a researcher watches.

    name: rpg_{fkl,rkl,ufkl,urkl} (Algorithm 1), rpg_reinforce_{fkl,rkl,ufkl,urkl} (Algorithm 2),
          ppo (dual-clip, no KL: DAPO, REINFORCE++), grpo (published k3 KL), grpo_corrected (w-weighted k3),
          today's baselines without a KL term of their own (section 9): gspo, cispo, gmpo (eps_low/eps_high are
          log-space bounds), sapo (tau_pos, tau_neg; no clip). beta, ref_log_prob and clip_c apply to none of them.
    log_prob: log pi_theta of the sampled tokens (carries gradient), (batch, response_len).
    old_log_prob: log pi_old (the sampling policy), same shape. ref_log_prob: log pi_ref, or None for the
          iterative reference pi_ref = pi_old.
    advantages: the baseline-subtracted reward R - b (or an estimator's output), per token or per sequence.
    clip=False gives the unclipped losses of MATH.md section 1. clipped_weight (rpg_reinforce_* only) is
    Remark F.2: the clipped ratio replaces w inside the stop-gradient. kl_clamp (grpo, grpo_corrected):
    GRPO's k3 as verl's clamped `low_var_kl` (default, as the paper ran it) or exact.

    Metrics: pg_loss (the returned loss), kl (mean estimate of the penalised divergence, KL losses only),
    ppo_kl (mean -log w: drift from the sampling policy), ratio_mean (mean w; gspo, gmpo: the sequence ratio),
    clipfrac_high/low/dual (fractions of valid tokens in each no-gradient branch; cispo: whose weight was
    clipped) and clipfrac (high + low).
    """
    _check_inputs(
        name,
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        ref_log_prob,
        loss_agg_mode,
        clip,
        eps_low,
        eps_high,
        clip_c,
        beta,
        weights,
    )
    if clipped_weight and not name.startswith("rpg_reinforce_"):
        raise ValueError(f"clipped_weight (Remark F.2) applies to the rpg_reinforce_* losses only, not {name!r}")
    if name == "sapo" and not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"sapo needs tau_pos > 0 and tau_neg > 0, got {tau_pos}, {tau_neg}")
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    raw_log_w = torch.where(mask, log_prob - old_log_prob.detach(), zero)  # GSPO's and GMPO's, unclamped as verl's
    log_w = clamp_log_ratio(raw_log_w)
    log_rho = None  # the iterative reference pi_ref = pi_old
    if ref_log_prob is not None:
        log_rho = clamp_log_ratio(torch.where(mask, ref_log_prob.detach() - old_log_prob.detach(), zero))
    adv = advantages.detach()
    adv = torch.where(mask, adv if adv.dim() == 2 else adv.unsqueeze(-1), zero)
    clipping = dict(clip=clip, eps_low=eps_low, eps_high=eps_high, c=clip_c)

    if name == "ppo":
        out = ppo_loss(log_w, adv, **clipping)
    elif name in ("gspo", "gmpo"):
        formula = gspo_loss if name == "gspo" else gmpo_loss
        out = formula(raw_log_w, adv, mask, clip=clip, eps_low=eps_low, eps_high=eps_high)
    elif name == "cispo":
        logp = torch.where(mask, log_prob, zero)
        out = cispo_loss(log_w, logp, adv, clip=clip, eps_low=eps_low, eps_high=eps_high)
    elif name == "sapo":
        out = sapo_loss(log_w, adv, tau_pos=tau_pos, tau_neg=tau_neg)
    elif name in ("grpo", "grpo_corrected"):
        ref = old_log_prob if ref_log_prob is None else ref_log_prob
        log_ref_ratio = torch.where(mask, ref.detach() - log_prob, zero)  # unclamped, as verl's low_var_kl takes it
        out = grpo_loss(
            log_w, log_ref_ratio, adv, corrected=name == "grpo_corrected", kl_clamp=kl_clamp, beta=beta, **clipping
        )
    elif name.startswith("rpg_reinforce_"):
        logp = torch.where(mask, log_prob, zero)
        out = rpg_reinforce_loss(
            name.removeprefix("rpg_reinforce_"),
            log_w,
            log_rho,
            logp,
            adv,
            beta=beta,
            clipped_weight=clipped_weight,
            **clipping,
        )
    else:
        out = rpg_loss(name.removeprefix("rpg_"), log_w, log_rho, adv, beta=beta, **clipping)

    loss = aggregate(rollout_weighted(out.loss, weights, mask), mask, loss_agg_mode)
    return loss, _metrics(loss, out, log_w, mask)


def _metrics(loss: torch.Tensor, out: TokenLoss, log_w: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Token means over the valid tokens, gathered into one tensor so that a GPU syncs once.

    No mask is applied: padding holds log w = 0 and advantage 0, where every per-token quantity below is
    0 (w is 1, hence the correction) and no clip branch fires (tests check the metrics against packed batches).
    """
    with torch.no_grad():
        n = torch.count_nonzero(mask)  # counts of bool tensors without sum()'s int64 copy of each
        values = {
            "pg_loss": loss.detach(),
            "ppo_kl": -log_w.sum() / n,
            "ratio_mean": (out.ratio.sum() - (mask.numel() - n)) / n,
        }
        for key in ("clip_high", "clip_low", "clip_dual"):
            branch = getattr(out, key)
            values[key.replace("clip_", "clipfrac_")] = (
                torch.count_nonzero(branch) / n if branch is not None else torch.zeros((), device=n.device)
            )
        if out.kl is not None:
            values["kl"] = out.kl.sum() / n
        numbers = torch.stack([v.to(torch.float64) for v in values.values()]).tolist()
    metrics = dict(zip(values, numbers))
    metrics["clipfrac"] = metrics["clipfrac_high"] + metrics["clipfrac_low"]
    return metrics
