"""The spec's model base: every block of a spec is strict, frozen and closed (spec/models.py, spec/verl_block.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Frozen(BaseModel):
    # strict: a YAML typo like `rollout_n: "16"` or `clip: yes` is an error, not a silent coercion;
    # no float field takes .inf or .nan (a NaN loss trains nothing and still "succeeds")
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
