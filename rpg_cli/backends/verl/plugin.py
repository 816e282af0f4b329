"""verl plugin: every `rpg_cli.algorithms` policy loss as a verl 0.9.1 policy loss.

Loaded by verl itself in every process that imports it: through the `verl.plugins` entry point, and
through `VERL_USE_EXTERNAL_MODULES=rpg_cli.backends.verl.plugin` (set in each job's runtime_env, since
verl logs entry-point failures only at debug level). Importing it:

- registers each name of `LOSS_NAMES` with verl's `register_policy_loss`, less those a run takes verl's
  own function for (`launch.VERL_OWN_LOSSES`, the table's `verl_loss`: GSPO, CISPO, SAPO); the math is
  `policy_loss`, no formula lives here. Extra hyperparameters (beta, clip on/off, whether a separate reference
  is used) travel in `RPGPolicyLossConfig`, which the run's overrides select by `policy_loss._target_`;
  the clip ratios and c are the actor's own `clip_ratio_low/high/c`, so verl's config holds them once.
- registers `custom` (MATH.md section 11): the spec's own function (`policy_loss.custom`, imported once per
  process) through `rpg_cli.algorithms.custom.custom_policy_loss`, with the spec's settings, the separate
  reference's log-probs (None for the iterative reference: pi_ref is pi_old, which the function has), and its
  metrics under `actor/<name>`.
- applies rollout correction (`rollout_is_weights`, MATH.md section 10) as verl's own losses do: the per-token
  loss times the weights, before aggregation; a micro-batch whose every token rejection sampling removed adds 0.
- wraps verl's `ppo_loss` (workers/utils/losses.py, patched wherever it is bound: `internals.wrap_ppo_loss`),
  because verl's policy-loss signature carries no `ref_log_prob`: the wrapper hands the batch's padded
  ref_log_prob to our loss for the duration of the call (a context variable, set and reset around verl's own ppo_loss, which stays in charge of
  entropy, the KL loss and metrics).
- gives verl's own KL loss (`use_kl_loss`, `kl_loss_type`, `kl_loss_coef`) pi_old as its reference when
  `policy_loss.kl_loss_to_old` is set: the iterative reference of REINFORCE++ as the paper's scripts ran
  it. verl's ref worker always holds the frozen initial model, so the run leaves `use_kl_loss` off (no ref
  worker, no reference forward pass) and the wrapper turns it on for the loss with old_log_probs in the
  place of ref_log_prob; verl's kl_penalty and agg_loss compute the term as for a frozen reference.
- imports `reference`, which registers rpg's trainer (the iterative reference) with verl.
- puts TransferQueue's named actors into the run's own Ray namespace (`isolation.py`): several runs share a
  cluster.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss
from verl.workers.config import PolicyLossConfig

from rpg_cli.algorithms import LOSS_NAMES, policy_loss
from rpg_cli.backends.verl import internals
from rpg_cli.backends.verl.isolation import per_run_transfer_queue
from rpg_cli.backends.verl.launch import CUSTOM_LOSS, plugin_losses
from rpg_cli.metrics import PG_LOSS, loss_metrics

_reference: ContextVar[torch.Tensor | None] = ContextVar("rpg_ref_log_prob", default=None)


@dataclass
class RPGPolicyLossConfig(PolicyLossConfig):
    """verl's policy_loss config plus what the RPG losses need.

    beta: KL coefficient inside the loss. clip: RPG-Style/dual clip on (eps and c: the actor's
    clip_ratio_low, clip_ratio_high, clip_ratio_c). use_reference: regularise toward verl's frozen ref
    model (its ref_log_prob) instead of pi_old, the paper's iterative reference. kl_loss_to_old: verl's
    KL loss (actor.kl_loss_*) toward pi_old instead of the ref worker's model. custom, custom_settings: the
    `custom` loss's function (`package.module:function`) and the settings it is called with.
    """

    beta: float = 0.0
    clip: bool = True
    use_reference: bool = False
    clipped_weight: bool = False  # Remark F.2 (rpg_reinforce_* only): clip(w) replaces w and log w inside SG
    kl_clamp: bool = True  # grpo, grpo_corrected: k3 as verl's clamped low_var_kl
    kl_loss_to_old: bool = False
    custom: str | None = None
    custom_settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.loss_mode in LOSS_NAMES and self.beta < 0:
            raise ValueError(f"policy_loss.beta must be >= 0, got {self.beta}")
        if self.loss_mode == CUSTOM_LOSS and not self.custom:
            raise ValueError(
                f"policy_loss.loss_mode {CUSTOM_LOSS} needs policy_loss.custom (package.module:function); "
                "rpg's overrides set it from the spec's loss"
            )


def rpg_policy_loss(
    name: str,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's PolicyLossFn for loss `name`: `policy_loss` (or the spec's own function, `custom`) scaled to verl's
    global-batch aggregation, the per-token loss weighted by rollout correction's `rollout_is_weights` if any."""
    settings = config.policy_loss
    if not isinstance(settings, RPGPolicyLossConfig):
        raise TypeError(
            f"policy loss {name} needs actor.policy_loss._target_="
            f"{RPGPolicyLossConfig.__module__}.RPGPolicyLossConfig (rpg's overrides set it)"
        )
    if settings.use_reference:
        ref_log_prob = _reference.get() if ref_log_prob is None else ref_log_prob
        if ref_log_prob is None:
            raise ValueError(
                f"policy loss {name} regularises toward the frozen reference, but the batch has "
                "no ref_log_prob (actor.use_kl_loss must be true so that verl computes it)"
            )
    else:
        ref_log_prob = None  # the iterative reference: pi_ref = pi_old
    mask = response_mask.bool()
    # The loss path's device-to-host syncs are three, as many as verl's own vanilla loss makes for its metrics
    # (.item() x 3): this check, policy_loss's same check of its input, and its metrics (gathered into one); the
    # loss and its scale stay on the device (`loss_scale`).
    if not bool(mask.any()):
        # rejection sampling (rollout correction) removed every token of this micro-batch: it adds nothing, but
        # its backward still runs (FSDP's gradient reduction waits for every rank's)
        return torch.where(mask, log_prob, 0.0).sum() * 0.0, {}
    tensors = dict(log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=response_mask)
    if name == CUSTOM_LOSS:
        loss, metrics = _custom_loss(settings, tensors, ref_log_prob, loss_agg_mode, rollout_is_weights)
    else:
        # the weights multiply the per-token loss inside policy_loss, before it aggregates (as verl's losses do)
        loss, metrics = policy_loss(
            name,
            **tensors,
            ref_log_prob=ref_log_prob,
            beta=settings.beta,
            clip=settings.clip,
            eps_low=config.clip_ratio_low,
            eps_high=config.clip_ratio_high,
            clip_c=config.clip_ratio_c,
            loss_agg_mode=loss_agg_mode,
            clipped_weight=getattr(settings, "clipped_weight", False),
            kl_clamp=getattr(settings, "kl_clamp", True),
            weights=rollout_is_weights,
        )
    scale = loss_scale(loss_agg_mode, response_mask, getattr(config, "global_batch_info", None) or {})
    return scaled(loss, scale), _verl_metrics(metrics)


@functools.cache
def load_custom(target: str) -> Callable[..., Any]:
    """The spec's loss function, imported once per process (`rpg_cli.custom_loss.load`: one-line ValueError)."""
    from rpg_cli import custom_loss

    return custom_loss.load(target)


def _custom_loss(
    settings: RPGPolicyLossConfig,
    tensors: dict[str, torch.Tensor],
    ref_log_prob: torch.Tensor | None,
    loss_agg_mode: str,
    weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The spec's own function through `custom_policy_loss` (clean tensors in, aggregated by loss_agg_mode), its
    per-token loss times rollout correction's weights if any."""
    from omegaconf import DictConfig, OmegaConf

    from rpg_cli.algorithms.custom import custom_policy_loss

    options = settings.custom_settings
    options = OmegaConf.to_container(options) if isinstance(options, DictConfig) else dict(options or {})
    return custom_policy_loss(
        load_custom(str(settings.custom)),
        **tensors,
        ref_log_prob=ref_log_prob,
        settings=options,
        loss_agg_mode=loss_agg_mode,
        weights=weights,
    )


def loss_scale(loss_agg_mode: str, response_mask: torch.Tensor, info: dict[str, Any]) -> torch.Tensor | float:
    """Factor turning `policy_loss`'s micro-batch aggregate into verl's `agg_loss` with global batch info.

    verl normalises each micro-batch by the whole mini-batch (over all data-parallel ranks) and multiplies
    by dp_size, so that summed micro-batch gradients, averaged over ranks, are the mini-batch's gradient.
    `policy_loss` normalises by the micro-batch itself; both share the numerator, so only the normaliser
    changes. Without global info (one rank, one micro-batch) the factor is 1.

    A count of the micro-batch's tokens or sequences stays a float64 tensor on its device, the same number a
    Python float would hold: the loss is multiplied by it (`scaled`) without a device-to-host sync (one per
    micro-batch on a GPU, where it stalls the launch of the backward). verl's totals are Python ints already.
    """
    dp_size = int(info.get("dp_size") or 1)
    mask = response_mask.bool()
    if loss_agg_mode == "token-mean":
        total = info.get("batch_num_tokens")
        return mask.sum(dtype=torch.float64) * dp_size / float(total) if total is not None else float(dp_size)
    if loss_agg_mode == "token-sum":
        return float(dp_size)
    total = info.get("global_batch_size")
    sequences = mask.any(-1).sum(dtype=torch.float64)
    scale = sequences * dp_size / float(total) if total is not None else float(dp_size)
    if loss_agg_mode == "seq-mean-token-sum-norm" and info.get("loss_scale_factor") is not None:
        scale *= mask.shape[-1] / float(info["loss_scale_factor"])  # policy_loss divides by the response length
    return scale


def scaled(loss: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """`loss` times `scale` in the loss's dtype, rounded once as with a Python float: a half-precision loss is
    multiplied in float32 (PyTorch's arithmetic for a scalar), a float32 or float64 one in its own dtype."""
    if not isinstance(scale, torch.Tensor):
        return loss * scale
    wide = torch.promote_types(loss.dtype, torch.float32)
    return (loss.to(wide) * scale.to(wide)).to(loss.dtype)


def global_batch_scale(loss_agg_mode: str, response_mask: torch.Tensor, info: dict[str, Any]) -> float:
    """`loss_scale` as a number, for checks and tests (it syncs: the loss path uses `loss_scale`)."""
    return float(loss_scale(loss_agg_mode, response_mask, info))


def _verl_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The loss's metrics under their logged names (rpg_cli.metrics), less the loss, which verl logs itself."""
    return {k: v for k, v in loss_metrics(metrics).items() if k != PG_LOSS}


def _register(name: str) -> None:
    def loss_fn(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        return rpg_policy_loss(
            name, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
        )

    loss_fn.__name__ = loss_fn.__qualname__ = f"rpg_policy_loss_{name}"
    loss_fn.__module__ = __name__
    existing = POLICY_LOSS_REGISTRY.get(name)
    if existing is not None and getattr(existing, "__module__", None) != __name__:
        raise RuntimeError(
            f"verl already has a policy loss named {name!r} ({existing.__module__}); rpg will not replace it"
        )
    register_policy_loss(name)(loss_fn)


# ---------------------------------------------------------------- ref_log_prob for the losses


def wrap_ppo_loss(verl_ppo_loss):
    """verl's ppo_loss, with the batch's ref_log_prob visible to our losses while it runs."""
    if getattr(verl_ppo_loss, "_rpg_wrapped", False):
        return verl_ppo_loss

    def ppo_loss(config, model_output, data, dp_group=None):
        ref_log_prob = None
        settings = config.policy_loss
        if isinstance(settings, RPGPolicyLossConfig) and settings.kl_loss_to_old:
            data = data.copy()  # shallow: the caller's micro-batch keeps its keys
            data["ref_log_prob"] = data["old_log_probs"]
            config = dataclasses.replace(config, use_kl_loss=True)
        # TensorDict has no `in`: keys() it is
        if isinstance(settings, RPGPolicyLossConfig) and settings.use_reference and "ref_log_prob" in data.keys():  # noqa: SIM118
            # the same padded layout verl's ppo_loss gives old_log_probs
            ref_log_prob = data.select("ref_log_prob").to_padded_tensor()["ref_log_prob"]
        token = _reference.set(ref_log_prob)
        try:
            return verl_ppo_loss(config, model_output, data, dp_group)
        finally:
            _reference.reset(token)

    ppo_loss._rpg_wrapped = True
    ppo_loss.__wrapped__ = verl_ppo_loss
    ppo_loss.__doc__ = verl_ppo_loss.__doc__
    return ppo_loss


def registered_names() -> list[str]:
    """The rpg losses verl can see right now (what the submit-time check looks for)."""
    return [
        name
        for name in plugin_losses(LOSS_NAMES)
        if getattr(POLICY_LOSS_REGISTRY.get(name), "__module__", None) == __name__
    ]


for _name in plugin_losses(LOSS_NAMES):
    _register(_name)
internals.wrap_ppo_loss(wrap_ppo_loss)  # verl's ppo_loss and the modules that bound it by name
per_run_transfer_queue()  # several runs on one Ray cluster: each its own TransferQueue (isolation.py)

# rpg's trainer and worker for the iterative reference (registered with verl's register_trainer on import)
from rpg_cli.backends.verl import reference  # noqa: E402, F401
