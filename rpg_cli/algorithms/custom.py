"""A researcher's own per-token policy loss, run the way rpg runs its own (MATH.md section 11).

`custom_policy_loss` is the one place both backends call a spec's `loss: "package.module:function"`: it
neutralises the padding before the function sees the batch, checks what comes back, zeroes the padding of the
result, aggregates with the spec's `loss_agg_mode` and gathers the metrics. Pure torch, like the rest of
`rpg_cli.algorithms`: finding and importing the function is `rpg_cli.custom_loss`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from rpg_cli.algorithms.kl import clamp_log_ratio
from rpg_cli.algorithms.losses import LOSS_AGG_MODES, TokenLoss, _metrics, aggregate, rollout_weighted

# what rpg logs of every custom loss (policy_loss's own names, computed by losses._metrics)
LOGGED = ("pg_loss", "ppo_kl", "ratio_mean")
# names a custom loss's own metrics may not take: rpg's loss metrics and what verl's actor logs beside them
# (verl 0.9.1: workers/utils/losses.py, trainer/ppo/metric_utils.py), logged under `actor/<name>`
RESERVED_METRICS = frozenset(
    {
        *LOGGED,
        *("clipfrac", "clipfrac_high", "clipfrac_low", "clipfrac_dual", "kl", "rpg_kl"),
        *("pg_clipfrac", "pg_clipfrac_lower", "kl_loss", "kl_coef", "entropy", "entropy_loss", "grad_norm", "lr"),
        *("mfu", "reward_kl_penalty", "reward_kl_penalty_coeff"),
    }
)


def function_name(fn: Callable[..., Any]) -> str:
    """`module:qualname`, as a spec's `loss` names it (errors name the function the researcher wrote)."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def custom_policy_loss(
    fn: Callable[..., Any],
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_log_prob: torch.Tensor | None = None,
    settings: Mapping[str, Any] | None = None,
    loss_agg_mode: str = "token-mean",
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss of `fn` on a padded batch and its metrics (MATH.md section 11).

    `fn` is called by keyword with clean per-token tensors of shape (batch, response_len): `log_prob` (carries
    the gradient), `old_log_prob` and `ref_log_prob` (detached; None for the iterative reference),
    `advantages` (detached; a per-sequence advantage broadcast to its tokens), `response_mask` (bool) and
    `settings` (a copy of the spec's `loss_settings`). Padding holds 0 in every tensor (torch.where, never a
    multiplication, so -inf/NaN there cannot leak into the value or the gradient). `fn` returns the per-token
    loss, or (per-token loss, {name: float or 0-d tensor}); its padding is zeroed again (junk a function writes
    there does not count), it is multiplied by `weights` (rollout correction's per-token weights, optional)
    and reduced with `aggregate(..., loss_agg_mode)` (MATH.md section 5).

    Metrics: pg_loss, ppo_kl and ratio_mean as `policy_loss` computes them, plus the function's own under
    their names (a name rpg logs itself is refused). A wrong shape, return type or metric: ValueError, one line.
    """
    name = function_name(fn)
    mask = _checked_mask(name, log_prob, old_log_prob, advantages, response_mask, ref_log_prob, weights)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    clean_log_prob = torch.where(mask, log_prob, zero)
    clean_old = torch.where(mask, old_log_prob.detach(), zero)
    clean_ref = None if ref_log_prob is None else torch.where(mask, ref_log_prob.detach(), zero)
    adv = advantages.detach()
    clean_adv = torch.where(mask, adv if adv.dim() == 2 else adv.unsqueeze(-1), zero)

    out = fn(
        log_prob=clean_log_prob,
        old_log_prob=clean_old,
        ref_log_prob=clean_ref,
        advantages=clean_adv,
        response_mask=mask,
        settings=dict(settings or {}),
    )
    loss_mat, own = _unpack(name, out, tuple(log_prob.shape))
    loss_mat = rollout_weighted(loss_mat, weights, mask)
    loss_mat = torch.where(mask, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    loss = aggregate(loss_mat, mask, loss_agg_mode)

    log_w = clamp_log_ratio(clean_log_prob.detach() - clean_old)  # 0 on padding, as _metrics needs
    metrics = _metrics(loss, TokenLoss(loss_mat, torch.exp(log_w)), log_w, mask)
    return loss, {**{key: metrics[key] for key in LOGGED}, **_own_metrics(name, own)}


def _checked_mask(name, log_prob, old_log_prob, advantages, response_mask, ref_log_prob, weights) -> torch.Tensor:
    """The bool mask, after checking that every input is shaped like log_prob (batch, response_len)."""
    shape = tuple(log_prob.shape)
    if len(shape) != 2:
        raise ValueError(f"{name}: log_prob must be (batch, response_len), got shape {shape}")
    named = {"old_log_prob": old_log_prob, "response_mask": response_mask, "ref_log_prob": ref_log_prob}
    named["weights"] = weights
    for key, tensor in named.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{name}: {key} has shape {tuple(tensor.shape)}, but log_prob has shape {shape}")
    if tuple(advantages.shape) not in (shape, shape[:1]):
        raise ValueError(f"{name}: advantages has shape {tuple(advantages.shape)}, expected {shape} or ({shape[0]},)")
    mask = response_mask.bool()
    if not bool(mask.any()):
        raise ValueError(f"{name}: response_mask selects no token: nothing to compute a loss on")
    return mask


def _unpack(name: str, out: Any, shape: tuple[int, ...]) -> tuple[torch.Tensor, Mapping[str, Any]]:
    """(per-token loss, metrics) from what the function returned, checked."""
    own: Any = {}
    if isinstance(out, tuple | list) and len(out) == 2:
        out, own = out
    if not isinstance(out, torch.Tensor):
        raise ValueError(
            f"loss function {name} returned {type(out).__name__}; return the per-token loss tensor {shape}, "
            "or (that tensor, a dict of metrics)"
        )
    if tuple(out.shape) != shape:
        raise ValueError(
            f"loss function {name} returned shape {tuple(out.shape)}, expected {shape}: one loss per token "
            "(batch, response_len), not reduced; rpg aggregates it with the spec's loss_agg_mode"
        )
    if not out.is_floating_point():
        raise ValueError(f"loss function {name} returned a {out.dtype} tensor; return a floating-point loss")
    if not isinstance(own, Mapping):
        raise ValueError(f"loss function {name} returned metrics of type {type(own).__name__}; return a dict")
    return out, own


def _own_metrics(name: str, own: Mapping[str, Any]) -> dict[str, float]:
    """The function's metrics as floats: each a number or a 0-d tensor, under a name rpg does not log itself.
    Tensors are gathered into one, so that a GPU syncs once."""
    numbers: dict[str, float] = {}
    tensors: dict[str, torch.Tensor] = {}
    for key, value in own.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"loss function {name} returned a metric named {key!r}; name each with a string")
        if key in RESERVED_METRICS:
            raise ValueError(f"loss function {name} returned metric {key!r}, which rpg logs itself; rename it")
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            tensors[key] = value.detach().reshape(()).to(torch.float64)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            numbers[key] = float(value)
        else:
            shown = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else f"type {type(value).__name__}"
            raise ValueError(
                f"loss function {name} returned metric {key!r} of {shown}; return a number or a 0-d tensor "
                "(e.g. x.mean())"
            )
    if tensors:
        device = next(iter(tensors.values())).device
        numbers.update(zip(tensors, torch.stack([t.to(device) for t in tensors.values()]).tolist()))
    return {key: numbers[key] for key in own}
