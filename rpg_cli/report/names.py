"""How the report names things: methods as in the paper (GRPO, RPG-REINFORCE-URKL (clip 0.1/0.1)),
models, contexts, benchmarks, and the rows' order."""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rpg_cli.algorithms import table

if TYPE_CHECKING:
    from rpg_cli.store import RunRecord


def _method_order() -> list[str]:
    """Rows in the table's order (`rpg_cli.algorithms.table`): the paper's methods (GRPO-Corrected after GRPO, RPG
    and RPG-REINFORCE by KL variant), then today's baselines; a custom loss (named by its function) comes last."""
    order = []
    for alg in table.ALGORITHMS.values():
        if "{loss}" in alg.display:
            continue
        kls = table.KL_VARIANTS if "{kl}" in alg.display else ("",)
        order += [alg.display.format(kl=kl.upper()) for kl in kls]
        if alg.takes("kl_correction"):
            order.append(f"{order[-1]}-Corrected")
    return order


METHOD_ORDER = _method_order()
CONTEXT_ORDER = {"2K": 0, "4K": 1, "8K": 2}
# Spec fields that never name a method: they group rows (model, context), are averaged over (seed)
# or say where/how a run ran, not what it computed.
NOT_A_VARIANT = {"seed", "model", "context", "model_max_length", "data", "backend", "resources"}
OPTIMIZER_NAMES = {"adamw": "AdamW", "schedule_free": "Schedule-Free"}


def method_base(spec: dict[str, Any]) -> str:
    """The name of the algorithm a spec runs, the paper's where it has one (GRPO, DAPO, RPG-UFKL,
    RPG-REINFORCE-URKL), the table's for the rest (GSPO, SAPO), a custom loss's function name; with what sets the
    run apart from the method as published in parentheses: GRPO's exact k3 (the paper ran it clamped), a rollout
    correction (`GRPO (exact k3, TIS token 2)`)."""
    alg = table.ALGORITHMS.get(str(spec.get("algorithm", "?")))
    if alg is None:
        return str(spec.get("algorithm", "?"))
    name = alg.method_name(spec)
    if alg.takes("kl_correction") and spec.get("kl_correction"):
        name += "-Corrected"
    notes = []
    if alg.takes("kl_clamp") and spec.get("kl_clamp") is False:
        notes.append("exact k3")
    if isinstance(spec.get("rollout_correction"), dict):
        notes.append(rollout_correction_name(spec["rollout_correction"]))
    return f"{name} ({', '.join(notes)})" if notes else name


def rollout_correction_name(block: dict[str, Any]) -> str:
    """verl's rollout correction in a few words: `TIS token 2` (weights truncated at 2), `RS seq_mean_k3 0.01`,
    both joined by a comma."""
    parts = []
    if block.get("rollout_is"):
        normalized = " normalized" if block.get("rollout_is_batch_normalize") else ""
        parts.append(f"TIS {block['rollout_is']} {_num(block.get('rollout_is_threshold'))}{normalized}")
    if block.get("rollout_rs"):
        parts.append(f"RS {block['rollout_rs']} {_num(block.get('rollout_rs_threshold'))}")
    return ", ".join(parts) or "rollout correction"


def model_name(spec: dict[str, Any]) -> str:
    """The model as the paper writes it: a hub id without its owner (Qwen/Qwen3-4B -> Qwen3-4B); a
    local path by its last two parts (data/toy/model -> toy/model), the last alone often says nothing."""
    model = str(spec.get("model", "?")).rstrip("/")
    parts = model.split("/")
    is_hub_id = len(parts) == 2 and not model.startswith((".", "~"))
    return parts[-1] if is_hub_id or len(parts) == 1 else "/".join(parts[-2:])


def context_name(spec: dict[str, Any]) -> str:
    """ "2K" as the paper writes it, or "64+32" for explicit token budgets."""
    context = spec.get("context")
    return "?" if context is None else _context_name(json.dumps(context, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _context_name(context: str) -> str:
    """context_name of a context as JSON: a few distinct ones among thousands of runs, each worded once."""
    from rpg_cli.spec import context_label

    return context_label(json.loads(context)).upper()


def _variant_fields(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in NOT_A_VARIANT}


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def _variant_text(key: str, value: Any, others: Sequence[Any]) -> str:
    if key == "optimizer":
        return OPTIMIZER_NAMES.get(value, str(value))
    if key == "clip":
        if not isinstance(value, dict):
            return "no clip"
        text = f"clip {_num(value.get('eps_low'))}/{_num(value.get('eps_high'))}"
        cs = {o.get("c") for o in others if isinstance(o, dict)}
        return text + (f" c={_num(value.get('c'))}" if len(cs) > 1 else "")
    if isinstance(value, dict):
        return f"{key}=" + ",".join(f"{k}:{_num(v)}" for k, v in sorted(value.items()))
    return f"{key}={_num(value)}"


def method_labels(specs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """{run id: method label}. The base name, plus the settings that tell apart runs of the same
    method on the same model and context (optimizer, clip, anything else but the seed):
    `RPG-REINFORCE-UFKL (clip 0.1/0.1, Schedule-Free)`. Seeds of one setting share a label."""
    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for run_id, spec in specs.items():
        groups[(method_base(spec), model_name(spec), context_name(spec))].append(run_id)
    labels = {}
    for (base, _, _), ids in groups.items():
        settings = [json.dumps(_variant_fields(specs[i]), sort_keys=True) for i in ids]
        distinct = {text: json.loads(text) for text in dict.fromkeys(settings)}  # a cell's seeds share one
        fields = list(distinct.values())
        keys = sorted({k for f in fields for k in f})
        varying = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True) for f in fields}) > 1]
        # optimizer and clip first (the paper's own axes), then the rest alphabetically
        varying.sort(key=lambda k: ({"clip": 0, "optimizer": 1}.get(k, 2), k))
        label = {
            text: _with_notes(base, [_variant_text(k, f.get(k), [g.get(k) for g in fields]) for k in varying])
            for text, f in distinct.items()
        }
        labels.update((run_id, label[text]) for run_id, text in zip(ids, settings))
    return labels


def _with_notes(base: str, notes: list[str]) -> str:
    """`base (notes)`, the notes joined to a base's own: GRPO (exact k3) + AdamW -> GRPO (exact k3, AdamW)."""
    if not notes:
        return base
    if base.endswith(")") and " (" in base:
        return f"{base[:-1]}, {', '.join(notes)})"
    return f"{base} ({', '.join(notes)})"


def method_sort_key(label: str) -> tuple[int, str]:
    base = label.split(" (", 1)[0]
    return (METHOD_ORDER.index(base) if base in METHOD_ORDER else len(METHOD_ORDER), label)


def run_labels(runs: Sequence[RunRecord], seed: bool = True, variants: bool = True) -> dict[str, str]:
    """A legend label per run: its method, plus model, context and seed (unless seed=False: then the
    seeds of a method share it) where the runs differ in them. variants=False: the method's base name
    only (`method_base`), so that every cell of a grid that runs the method shares it."""
    labels = method_labels({r.id: r.spec for r in runs}) if variants else {r.id: method_base(r.spec) for r in runs}
    varies = {k: len({str(r.spec.get(k)) for r in runs}) > 1 for k in ("model", "context", "seed")}
    out = {}
    for r in runs:
        parts = [labels[r.id]]
        if varies["model"]:
            parts.append(model_name(r.spec))
        if varies["context"]:
            parts.append(context_name(r.spec))
        if seed and varies["seed"]:
            parts.append(f"seed {r.spec.get('seed')}")
        out[r.id] = " · ".join(parts)
    return out
