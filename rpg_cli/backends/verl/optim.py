"""Schedule-free AdamW for verl: `actor.optim.optimizer=AdamWScheduleFree`,
`actor.optim.optimizer_impl=rpg_cli.backends.verl.optim` (verl's `build_optimizer` imports the class
from that module and passes lr, weight_decay and betas).

Schedule-free keeps two points: y, where gradients are taken (the parameters in "train" mode), and the
average x (the parameters after `.eval()`). verl 0.9.1 never calls `optimizer.train()`/`.eval()`, and
the upstream optimizer refuses to step in eval mode, so this subclass is in train mode from the start
and before every step.

Which weights are used, with verl 0.9.1:
- rollouts: verl syncs the FSDP parameters to vLLM after each update, i.e. y. Sampling from y is
  on-policy for the loss (old_log_prob is computed with the same y), which the importance weights of
  every loss assume; switching to x for generation would need a hook in verl's weight sync, which it
  does not offer.
- checkpoints: verl saves the parameters (y) plus the optimizer state, which holds z, so a resumed run
  continues exactly. Its HF model (what `rpg eval` loads) is therefore y; the averaged x of a checkpoint
  is `eval_weights(y, z, beta1)` below (verl offers no pre-save hook to write x instead).
verl's LR scheduler (constant with `lr_warmup_steps` warmup) scales the group lr that schedule-free
reads each step, so the optimizer's own warmup stays 0.
"""

from __future__ import annotations

import torch
from schedulefree import AdamWScheduleFree as _AdamWScheduleFree


class AdamWScheduleFree(_AdamWScheduleFree):
    """Schedule-free AdamW that is always in train mode when it steps."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        r: float = 0.0,
        weight_lr_power: float = 2.0,
        foreach: bool | None = None,
    ):
        if foreach is None:
            foreach = hasattr(torch, "_foreach_mul_")
        super().__init__(
            params,
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            warmup_steps=warmup_steps,
            r=r,
            weight_lr_power=weight_lr_power,
            foreach=foreach,
        )
        self.train()  # no state yet: only sets the mode flag

    @torch.no_grad()
    def step(self, closure=None):
        if not self.param_groups[0]["train_mode"]:
            self.train()
        return super().step(closure)


def eval_weights(y: torch.Tensor, z: torch.Tensor, beta1: float) -> torch.Tensor:
    """The averaged point x from a train-mode parameter y and its state z (what `.eval()` computes)."""
    return torch.lerp(y, z.to(y.device), 1 - 1 / beta1)
