"""A run's identity and name: which fields of its canonical spec its id hashes (all but `NOT_IN_RUN_ID`, and
the `OMITTED_WHEN_EMPTY` fields while empty, so published ids stand), the id itself, and its readable name.
`ExperimentSpec.run_id`/`run_name` (spec/models.py) are these functions of its canonical spec."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from rpg_cli.spec import algorithm_rules
from rpg_cli.spec.contexts import context_label
from rpg_cli.spec.errors import _num

# Where metrics are reported and how a run executes, not what it computes: spec.json records these fields
# (dotted: a field of a block), the run id ignores them.
NOT_IN_RUN_ID = ("trackers", "verl.site", "verl.env", "checkpoints", "resources.gpu_memory_gib", "watch")
# Added after run ids were published: left out of the canonical spec while empty, so older ids stand.
OMITTED_WHEN_EMPTY = (
    "chat_template_kwargs",
    "scorers",
    "verl",
    "sapo",
    "loss",
    "loss_settings",
    "loss_source",
    "advantage",
    "rollout_correction",
)
# a researcher's own mapping: empty only when it holds no key ({x: null} is a setting)
_FREE_FORM = ("loss_settings",)


def without_empty(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` less the OMITTED_WHEN_EMPTY fields that hold nothing (a block: nothing in any of its fields)."""

    def empty(value: Any) -> bool:
        # None or an empty container: a false or zero value is a setting ({enable_thinking: false})
        if isinstance(value, dict):
            return all(empty(v) for v in value.values())
        return value is None or value == "" or value == []

    def omitted(key: str, value: Any) -> bool:
        return key in OMITTED_WHEN_EMPTY and (value in (None, {}) if key in _FREE_FORM else empty(value))

    return {k: v for k, v in spec.items() if not omitted(k, v)}


def run_identity(spec: dict[str, Any]) -> dict[str, Any]:
    """A canonical spec less NOT_IN_RUN_ID: what a run's id hashes (and, less the seed, its cell's)."""
    identity = copy.deepcopy(dict(spec))
    for path in NOT_IN_RUN_ID:
        *parents, last = path.split(".")
        node: Any = identity
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return without_empty(identity)


def canonical_json(canonical: dict[str, Any]) -> str:
    """What the run id hashes: a canonical spec (`ExperimentSpec.canonical()`) less NOT_IN_RUN_ID, as JSON."""
    return _json(run_identity(canonical))


def run_id(canonical: dict[str, Any]) -> str:
    """The run id: the first 8 hex digits of the SHA-256 of `canonical_json`."""
    return _digest(canonical_json(canonical))


def cell_id(canonical: dict[str, Any]) -> str:
    """The id of a run's cell: as the run id, less the seed, so the runs of one cell across seeds share it."""
    return _digest(_json({k: v for k, v in run_identity(canonical).items() if k != "seed"}))


def _json(identity: dict[str, Any]) -> str:
    # sorted keys, no whitespace; json renders floats with repr, so 1e-4 and 0.0001 agree
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def run_name(canonical: dict[str, Any]) -> str:
    """Readable and unique: rpg_reinforce-urkl-clip0.2_0.28-adamw-4k-s0-1a2b3c4d."""
    return f"{label(canonical)}-{run_id(canonical)}"


def label(spec: dict[str, Any]) -> str:
    """The readable part of a run name, from a (possibly not yet valid) spec dict."""
    alg = spec.get("algorithm", "?")
    entry = algorithm_rules.entry(alg)
    parts = [f"{alg}_corrected" if alg == "grpo" and spec.get("kl_correction") is True else str(alg)]
    if entry is not None and entry.takes("loss") and isinstance(spec.get("loss"), str):
        parts.append(spec["loss"].rpartition(":")[2])  # custom-<function name>-...
    if spec.get("kl") not in (None, "none"):
        parts.append(str(spec["kl"]))
    clip = spec.get("clip")
    if isinstance(clip, dict):
        parts.append(f"clip{_num(clip.get('eps_low'))}_{_num(clip.get('eps_high'))}")
    elif clip is None and "clip" in spec and entry is not None and entry.clip == "optional":
        parts.append("noclip")
    parts += [str(spec["optimizer"])] if "optimizer" in spec else []
    parts += [_context_part(spec["context"])] if "context" in spec else []
    if "seed" in spec:
        parts.append(f"s{spec['seed']}")
    return "-".join(parts)


def _context_part(context: Any) -> str:
    """A run name's context part: "2k", or "64+32" (a value that is not yet valid as it was written)."""
    try:
        return context_label(context)
    except (KeyError, TypeError, ValueError):
        return str(context)
