"""The reference schedule: when pi_ref is reset to the current policy. Both backends run this one
definition (the local trainer and verl's `rpg_cli.backends.verl.reference`); pure python, no torch."""

from __future__ import annotations

from rpg_cli.metrics import REF_AGE, REF_KL, REF_KL_EMA, REF_RESETS
from rpg_cli.spec.models import DEFAULT_KL_EMA, Every


class ReferenceTracker:
    """When pi_ref is reset to the current policy, and the `ref/*` metrics: one schedule for both backends.

    The paper's iterative reference (section 4; MATH.md section 1, "With a separate reference pi_ref"):
    pi_ref <- pi_theta every K steps, or when a moving average of the token-level KL to pi_ref exceeds a
    target kappa. Precisely, for training step t = 1, 2, ... (one rollout batch and its updates):

    1. `begin_step(t)`, before step t's reference log-probs; True means: copy the current policy (the one
       that sampled step t, so pi_ref = pi_old of step t) into the reference now. It is True when
         - the reference is `iterative` and t > 1 (pi_ref = pi_old every step, i.e. `every: 1`),
         - `every: K` and t - born >= K (the reference has served K steps: resets before steps 1+K, 1+2K, ...
           unless a KL reset moved born),
         - `kl_target: kappa` and ema > kappa (the average after step t-1's KL),
       and a reset sets born = t, resets += 1, ema = 0 (the KL to a fresh reference is 0). Step 1's
       reference is the initial model, which is pi_old at step 1: born = 1 without a reset. `frozen`
       never resets.
    2. `observe(kl)`: kl is step t's KL to its reference, `rpg_cli.algorithms.kl.reference_kl`: the
       token-mean over the batch's response tokens of k3(pi_ref/pi_old), from the log-probs the step
       trains on (an estimate of KL(pi_old || pi_ref); 0 for `iterative`, which has no separate
       reference). ema <- (1 - alpha) * ema + alpha * kl, alpha = `ema` of the spec (DEFAULT_KL_EMA
       where the spec sets no KL target: the average is then only reported).
    3. `metrics(t)`: `ref/resets` (resets so far, step t's included), `ref/steps_since_reset` (t - born:
       how many steps' updates pi_old is ahead of pi_ref), `ref/kl`, `ref/kl_ema` (after step t's kl).

    `state_dict()` is what a checkpoint keeps so that a resumed run continues the same schedule.
    """

    def __init__(self, reference: str | Every):
        self.reference = reference
        every = reference if isinstance(reference, Every) else None
        self.every = 1 if reference == "iterative" else (every.every if every else None)
        self.kl_target = every.kl_target if every else None
        self.alpha = every.ema if every is not None and every.ema is not None else DEFAULT_KL_EMA
        self.resets, self.born, self.ema, self.kl = 0, 1, 0.0, 0.0

    def begin_step(self, step: int) -> bool:
        due = self.every is not None and step - self.born >= self.every
        drifted = self.kl_target is not None and self.ema > self.kl_target
        if not (due or drifted):
            return False
        self.resets, self.born, self.ema = self.resets + 1, step, 0.0
        return True

    def observe(self, kl: float) -> None:
        self.kl = float(kl)
        self.ema = (1 - self.alpha) * self.ema + self.alpha * self.kl

    def metrics(self, step: int) -> dict[str, float]:
        return {
            REF_RESETS: float(self.resets),
            REF_AGE: float(step - self.born),
            REF_KL: self.kl,
            REF_KL_EMA: self.ema,
        }

    def state_dict(self) -> dict[str, float]:
        return {"resets": self.resets, "born": self.born, "ema": self.ema, "kl": self.kl}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.resets, self.born = int(state["resets"]), int(state["born"])
        self.ema, self.kl = float(state["ema"]), float(state["kl"])
