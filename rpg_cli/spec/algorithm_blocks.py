"""The spec's blocks that say how an algorithm computes its loss: the clip, a KL loss, SAPO's gate temperatures,
a custom loss's target and settings (MATH.md section 11), and verl's rollout correction (MATH.md section 10).

Which algorithm takes which of them is the algorithm table's (`rpg_cli.algorithms.table`), checked in
`spec/algorithm_rules.py`; here each block checks only itself.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from rpg_cli.algorithms.defaults import CLIP_C, SAPO_TAU_NEG, SAPO_TAU_POS
from rpg_cli.spec.frozen import _Frozen

# KL-loss estimators of the PPO-family runs (MATH.md section 4); verl's names: kl, mse, low_var_kl.
KLLossEstimator = Literal["k1", "k2", "k3"]


class Clip(_Frozen):
    eps_low: float = Field(gt=0, lt=1)  # the ratio's lower bound 1 - eps_low must stay positive
    eps_high: float = Field(gt=0, lt=1)
    c: float = Field(CLIP_C, gt=1)  # dual-clip bound for negative advantages (paper gives none; reference code: 10)
    clipped_weight_in_sg: bool = False  # Remark F.2: the clipped weight inside stop-gradient


class KLLoss(_Frozen):
    """A KL loss toward the run's reference, added to the policy loss (MATH.md section 4): REINFORCE++ as the
    released scripts ran it (k1, 1e-4, toward the iterative reference pi_old)."""

    estimator: KLLossEstimator
    coef: float = Field(gt=0)


class Sapo(_Frozen):
    """SAPO's soft gate in place of the clip (MATH.md section 9.6): its temperatures for tokens with positive and
    negative advantages (verl 0.9.1: actor.policy_loss.tau_pos, tau_neg)."""

    tau_pos: float = Field(SAPO_TAU_POS, gt=0)
    tau_neg: float = Field(SAPO_TAU_NEG, gt=0)


# ---------------------------------------------------------------------------------------------
# A custom loss: `loss: package.module:function`, `loss_settings: {...}` (MATH.md section 11)

LOSS_TARGET = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)
LOSS_FORM = "package.module:function (a function of a module on PYTHONPATH, e.g. examples.my_loss:capped_reinforce)"
JSON_FORMS = "null, true/false, numbers, text, lists and mappings with text keys"


def _loss_target(text: str) -> str:
    if not LOSS_TARGET.fullmatch(text):
        raise ValueError(f"got {text!r}; allowed: {LOSS_FORM}")
    return text


def _json_fault(value: Any, where: str) -> str | None:
    """Where `value` holds something JSON cannot (a date, a set, a NaN), or None: settings travel as JSON
    (spec.json, the store, verl's Hydra config) and must read back as written."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where}: got {value!r}; allowed: a finite number"
    if isinstance(value, list):
        return next((f for i, v in enumerate(value) if (f := _json_fault(v, f"{where}[{i}]"))), None)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{where}: key {k!r} is not text; allowed: {JSON_FORMS}"
            if fault := _json_fault(v, f"{where}.{k}" if where else k):
                return fault
        return None
    return f"{where}: got {value!r} ({type(value).__name__}); allowed: {JSON_FORMS}"


def _json_settings(settings: dict[str, Any]) -> dict[str, Any]:
    if fault := _json_fault(settings, ""):
        raise ValueError(fault)
    return settings


LossTarget = Annotated[str, AfterValidator(_loss_target)]
LossSettings = Annotated[dict[str, Any], AfterValidator(_json_settings)]
LossSource = Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]  # rpg_cli.custom_loss.source_hash


def with_loss_source(data: Any, takes_loss: bool) -> Any:
    """`data` with `loss_source` filled from the loss module's source (`custom_loss.source_hash`) where it
    gives a well-formed `loss` and no source: an edited function is a new run. A module that cannot be found
    is a one-line SpecError on `loss`. A given source (spec.json read back) stands, so a run keeps its id."""
    from rpg_cli.spec.errors import SpecError

    if not (takes_loss and isinstance(data, dict) and data.get("loss_source") is None):
        return data
    loss = data.get("loss")
    if not isinstance(loss, str) or not LOSS_TARGET.fullmatch(loss):
        return data  # none, or malformed: the field's own check says so
    from rpg_cli.custom_loss import source_hash  # torch-free; the module is read, never executed

    try:
        return {**data, "loss_source": source_hash(loss)}
    except ValueError as e:
        raise SpecError(str(e), "loss") from None


# ---------------------------------------------------------------------------------------------
# Rollout correction: verl 0.9.1's algorithm.rollout_correction under verl's names (MATH.md section 10)

# verl/trainer/ppo/rollout_corr_helper.py, SUPPORTED_ROLLOUT_RS_OPTIONS
ROLLOUT_RS_MODES = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
ROLLOUT_IS_THRESHOLD = 2.0  # verl's RolloutCorrectionConfig default


def rs_modes(text: str) -> list[str]:
    """verl's comma-separated rejection modes, each once, in order."""
    return list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def _rs_threshold_fault(modes: list[str], threshold: float | str) -> str | None:
    """What verl 0.9.1 would refuse in a rejection threshold (rollout_corr_helper._parse_rollout_rs_thresholds):
    one value for every mode or one per mode; a k1 mode takes `lower_upper` ratio bounds (or an upper bound,
    the lower its reciprocal), a k2/k3 mode one positive upper bound."""
    parts = [str(threshold)] if isinstance(threshold, (int, float)) else [p.strip() for p in threshold.split(",")]
    parts = [p for p in parts if p]
    if len(parts) not in (1, len(modes)):
        return f"{len(parts)} thresholds for {len(modes)} modes; allowed: one for all, or one per mode"
    for mode, part in zip(modes, parts * len(modes) if len(parts) == 1 else parts):
        k1 = mode.endswith("k1")
        bounds = part.split("_", 1) if k1 else [part]
        if not all(_plain_number(b) for b in bounds):
            form = "lower_upper, or an upper bound" if k1 else "one upper bound (no '_')"
            return f"{mode}: got {part!r}; allowed: {form}"
        values = [float(b) for b in bounds]
        if not all(math.isfinite(v) and v > 0 for v in values) or values != sorted(values):
            return f"{mode}: got {part!r}; allowed: positive bounds, lower <= upper"
    return None


def _plain_number(text: str) -> bool:
    # float() reads "1_0" as 10; verl splits at "_" (k1 modes) or refuses it (k2, k3) first
    try:
        float(text)
    except ValueError:
        return False
    return "_" not in text


class RolloutCorrection(_Frozen):
    """verl's rollout correction (algorithm.rollout_correction, verl 0.9.1): importance weights pi_old / pi_rollout
    (truncated at a threshold) and/or rejection of tokens or sequences whose rollout policy strayed too far,
    for the gap between vLLM's sampler and the trainer. Under verl's own names; on every algorithm. Unlike
    verl's config (whose rollout_is defaults to sequence), nothing is on unless the block says so."""

    rollout_is: Literal["token", "sequence"] | None = None  # importance weights per token or per sequence
    rollout_is_threshold: float = Field(ROLLOUT_IS_THRESHOLD, gt=1)  # weights truncated at this (TIS)
    rollout_is_batch_normalize: bool = False  # weights rescaled to mean 1 over the batch
    rollout_rs: str | None = None  # rejection modes, comma-separated (verl's names: ROLLOUT_RS_MODES)
    rollout_rs_threshold: float | str | None = None  # as verl takes it: per mode, `lower_upper` for k1 modes

    @field_validator("rollout_rs")
    @classmethod
    def _known_modes(cls, text: str | None) -> str | None:
        if text is None:
            return None
        modes = rs_modes(text)
        if not modes or (unknown := [m for m in modes if m not in ROLLOUT_RS_MODES]):
            got = unknown[0] if modes else text
            raise ValueError(f"got {got!r}; allowed: {', '.join(ROLLOUT_RS_MODES)} (comma-separated for several)")
        return text

    @field_validator("rollout_rs_threshold")
    @classmethod
    def _threshold_as_verl_takes_it(cls, threshold: float | str | None, info: ValidationInfo) -> float | str | None:
        text = info.data.get("rollout_rs")
        if threshold is None or text is None:
            return threshold  # the block's check says what is missing or unused
        if isinstance(threshold, bool):
            raise ValueError("got a boolean; allowed: a number, or text as verl takes it (0.5_2.0, 2.0,0.01)")
        if fault := _rs_threshold_fault(rs_modes(text), threshold):
            raise ValueError(fault)
        return threshold

    @model_validator(mode="after")
    def _turns_something_on(self) -> RolloutCorrection:
        if self.rollout_is is None and self.rollout_rs is None:
            raise ValueError(
                "turns on neither importance weights nor rejection; allowed: rollout_is (token, sequence) "
                "and/or rollout_rs with rollout_rs_threshold (or no rollout_correction)"
            )
        if self.rollout_is is None and (
            self.rollout_is_threshold != ROLLOUT_IS_THRESHOLD or self.rollout_is_batch_normalize
        ):
            raise ValueError(
                "rollout_is_threshold and rollout_is_batch_normalize weigh importance weights, which are off; "
                "allowed: set rollout_is (token, sequence), or drop them"
            )
        if self.rollout_rs is not None and self.rollout_rs_threshold is None:
            raise ValueError(f"rollout_rs {self.rollout_rs} needs rollout_rs_threshold; allowed: a threshold per mode")
        if self.rollout_rs is None and self.rollout_rs_threshold is not None:
            raise ValueError(
                "rollout_rs_threshold without rollout_rs rejects nothing; allowed: set rollout_rs, or drop it"
            )
        return self
