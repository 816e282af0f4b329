"""The algorithm table (`rpg_cli.algorithms.table`) as the spec's rules, in one place: the defaults an
algorithm fills in, the fields it takes (each field of `table.NEUTRAL` it does not take must hold its neutral
value), its KL variant, its clip and its loss. Spec validation (`models.py`) and the sweep's collapsing of axes
(`sweep.py`) both read these functions, so a new table entry needs no edit here.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from rpg_cli.algorithms import table
from rpg_cli.spec.errors import SpecError, _num

# a NEUTRAL field as a message names it (a field missing here is named by its path)
NOUNS = {
    "kl": "KL variant",
    "beta": "KL term",
    "reference": "reference model",
    "kl_loss": "KL loss",
    "kl_correction": "KL correction",
    "kl_clamp": "clamp on its KL term",
    "clip.c": "dual-clip bound",
    "clip.clipped_weight_in_sg": "clipped weight inside stop-gradient (Remark F.2)",
    "sapo": "SAPO gate",
    "loss": "loss of its own",
    "loss_settings": "loss settings",
    "advantage": "choice of advantage",
}
# what a neutral value means, where its name alone does not say
NOTES = {"reference": "the default, which loads nothing"}
_ABSENT = object()


def entry(algorithm: Any) -> table.Algorithm | None:
    """The table's entry for `algorithm`, or None (the field's own check names the allowed ones)."""
    return table.ALGORITHMS.get(algorithm) if isinstance(algorithm, str) else None


def takers(path: str) -> list[str]:
    """The algorithms that take the NEUTRAL field `path`, in the table's order."""
    return [a.name for a in table.ALGORITHMS.values() if a.takes(path)]


def show(value: Any, quote: bool = True) -> str:
    """A value as a one-line message writes it (YAML's spelling: true, null, 0.001)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return _num(value)
    if isinstance(value, str):
        return repr(value) if quote else value
    if isinstance(value, dict):  # YAML's flow style: {estimator: k1, coef: 0.0001}
        return "{" + ", ".join(f"{k}: {show(v, quote=False)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(show(v, quote=False) for v in value) + "]"
    return str(value)


# ---------------------------------------------------------------------------------------------
# Before validation: the table's defaults


def with_defaults(data: Any) -> Any:
    """`data` (a spec mapping) with its algorithm's table defaults where it gives none (dapo's tricks, gspo's
    clip and loss_agg_mode, sapo's gate), and the neutral value of each field the algorithm does not take
    (gspo needs no `beta: 0`). What the spec gives stands; validation then judges it. The canonical spec
    (and so the run id) spells the defaults out."""
    alg = entry(data.get("algorithm")) if isinstance(data, dict) else None
    if alg is None:
        return data
    filled = {k: copy.deepcopy(v) for k, v in alg.defaults.items() if k not in data}
    for path, neutral in table.NEUTRAL.items():
        if "." not in path and not alg.takes(path) and path not in data and path not in filled:
            filled[path] = copy.deepcopy(neutral)
    return {**data, **filled}


# ---------------------------------------------------------------------------------------------
# After validation: what the algorithm takes


def _at(spec: BaseModel, path: str) -> Any:
    """The value at a dotted path of a validated spec (`clip.c`), or _ABSENT where a block on the way is off."""
    node: Any = spec
    for part in path.split("."):
        if node is None:
            return _ABSENT
        node = getattr(node, part, _ABSENT) if isinstance(node, BaseModel) else _ABSENT
        if node is _ABSENT:
            return _ABSENT
    return node


def check(spec: Any) -> None:
    """Refuse (SpecError, one line, the field's path) what the spec's algorithm does not take: a KL variant it
    lacks or needs, a NEUTRAL field off its neutral value, a clip it must have or cannot have, a missing loss."""
    alg = table.algorithm(spec.algorithm)
    name = alg.name
    if alg.takes("kl") and spec.kl not in table.KL_VARIANTS:
        raise SpecError(f"{name} needs a KL variant; allowed: {', '.join(table.KL_VARIANTS)}", "kl")
    for path, neutral in table.NEUTRAL.items():
        value = _at(spec, path)
        if alg.takes(path) or value is _ABSENT or value == neutral:
            continue
        allowed = show(neutral, quote=False)
        why = "; ".join(
            [*([NOTES[path]] if path in NOTES else []), f"{path} is for {', '.join(takers(path)) or 'none'}"]
        )
        raise SpecError(f"{name} has no {NOUNS.get(path, path)} (got {show(value)}); allowed: {allowed} ({why})", path)
    if alg.clip == "required" and spec.clip is None:
        fields = "eps_low, eps_high, c" if alg.takes("clip.c") else "eps_low, eps_high"
        optional = [a.name for a in table.ALGORITHMS.values() if a.clip == "optional"]
        raise SpecError(f"{name} needs a clip; allowed: {{{fields}}} (off only for {', '.join(optional)})", "clip")
    if alg.clip == "none" and spec.clip is not None:
        raise SpecError(f"{name} has no clip; allowed: off", "clip")
    if alg.fixed_agg is not None and spec.loss_agg_mode != alg.fixed_agg:
        raise SpecError(
            f"{name} aggregates as {alg.fixed_agg} (verl's own {alg.verl_loss} does, whatever the mode; got "
            f"{spec.loss_agg_mode}); allowed: {alg.fixed_agg}",
            "loss_agg_mode",
        )
    if alg.takes("loss") and spec.loss is None:
        from rpg_cli.spec.algorithm_blocks import LOSS_FORM

        raise SpecError(f"{name} needs a loss; allowed: {LOSS_FORM}", "loss")
    if spec.loss is None and spec.loss_source is not None:
        raise SpecError("is the hash of the loss's source, and there is no loss; allowed: null", "loss_source")


# ---------------------------------------------------------------------------------------------
# A sweep's cells: axes that do not apply collapse


def collapse(data: dict[str, Any], keep: Callable[[str], bool]) -> dict[str, Any]:
    """A cell's fields that its algorithm does not take (NEUTRAL, dotted paths inside their block) set to their
    neutral value, and its clip turned off where the algorithm has none, so that e.g. a kl axis crossed with
    `grpo` yields one grpo run, not four (identical cells are merged by run id). Only fields the cell has are
    touched; those `keep(path)` names (written explicitly) stay, for validation to reject."""
    alg = entry(data.get("algorithm"))
    if alg is None:
        return data
    for path, neutral in table.NEUTRAL.items():
        *parents, leaf = path.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if alg.takes(path) or not isinstance(node, dict) or leaf not in node or keep(path):
            continue
        node[leaf] = copy.deepcopy(neutral)
        if path == "loss" and "loss_source" in data and not keep("loss_source"):
            data["loss_source"] = None  # the hash of a loss the cell no longer has
    if alg.clip == "none" and "clip" in data and not keep("clip"):
        data["clip"] = None
    return data
