"""A researcher's own loss for rpg (MATH.md section 11): REINFORCE with a capped importance weight.

    algorithm: custom
    loss: examples.my_loss:capped_reinforce
    loss_settings: {clip: 2.0}

Check it before paying for GPUs: rpg check-loss examples.my_loss:capped_reinforce --set clip=2.0
"""

import torch


def capped_reinforce(*, log_prob, old_log_prob, advantages, response_mask, settings, **_):
    """-SG(min(w, clip)) A log pi per token, w = pi/pi_old: every token keeps its gradient, its weight capped.

    rpg hands clean per-token tensors (padding holds 0) and aggregates the result with the spec's loss_agg_mode.
    """
    w = torch.exp(log_prob.detach() - old_log_prob)
    weight = w.clamp(max=settings.get("clip", 2.0))
    loss = -weight * advantages * log_prob
    capped = (w > weight) & response_mask
    return loss, {"capped_frac": capped.sum() / response_mask.sum()}
