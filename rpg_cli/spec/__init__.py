"""Typed experiment specs: one run (`ExperimentSpec`) and a grid of runs (`SweepSpec`).

    errors      SpecError, and pydantic's errors as one line
    models      ExperimentSpec and its parts, its rules across fields, its canonical spec
    contexts    a run's context: Nk or explicit token budgets, and its label
    identity    the run id (the canonical spec's hash less NOT_IN_RUN_ID), its cell's, the run's name
    fields      fields by dotted path: lookup, and a spec as dotted paths (flatten)
    algorithm_blocks  the algorithm's blocks: clip, KL loss, SAPO's gate, a custom loss, rollout correction
    algorithm_rules   the algorithm table as spec rules: defaults, what each algorithm takes, collapsing axes
    verl_block  the `verl` block: overrides, site settings, env
    reference   ReferenceTracker: when pi_ref is reset, one schedule for both backends
    sweep       SweepSpec and its expansion (include/exclude, collapsing axes)
    loading     YAML files: load_spec, load_sweep

Only pydantic and PyYAML are imported by these (omegaconf only for files with `${...}`), so
`rpg sweep --dry-run` stays fast; each name below is imported from its module when first used. A data file's
problems and a run's validation cost: `rpg_cli.inputs`.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpg_cli.spec.contexts import CONTEXT_LENGTHS, context_label, context_lengths
    from rpg_cli.spec.errors import SpecError
    from rpg_cli.spec.fields import field_info, field_names, flatten
    from rpg_cli.spec.identity import NOT_IN_RUN_ID, cell_id, run_identity
    from rpg_cli.spec.loading import load_spec, load_sweep
    from rpg_cli.spec.models import DEFAULT_KL_EMA, TRACKER_NAMES, Every, ExperimentSpec, Trackers, val_sampling
    from rpg_cli.spec.reference import ReferenceTracker
    from rpg_cli.spec.sweep import SweepSpec, expand_sweep
    from rpg_cli.spec.verl_block import override_key

# name -> its module, imported when first asked: a module of the package (a report's `contexts`) costs only
# itself and what it imports, not every model's pydantic classes
_LAZY = {
    "CONTEXT_LENGTHS": "contexts",
    "context_label": "contexts",
    "context_lengths": "contexts",
    "SpecError": "errors",
    "field_info": "fields",
    "field_names": "fields",
    "flatten": "fields",
    "NOT_IN_RUN_ID": "identity",
    "cell_id": "identity",
    "run_identity": "identity",
    "load_spec": "loading",
    "load_sweep": "loading",
    "DEFAULT_KL_EMA": "models",
    "TRACKER_NAMES": "models",
    "Every": "models",
    "ExperimentSpec": "models",
    "Trackers": "models",
    "val_sampling": "models",
    "ReferenceTracker": "reference",
    "SweepSpec": "sweep",
    "expand_sweep": "sweep",
    "override_key": "verl_block",
}

__all__ = [
    "CONTEXT_LENGTHS",
    "DEFAULT_KL_EMA",
    "NOT_IN_RUN_ID",
    "TRACKER_NAMES",
    "Every",
    "ExperimentSpec",
    "ReferenceTracker",
    "SpecError",
    "SweepSpec",
    "Trackers",
    "cell_id",
    "context_label",
    "context_lengths",
    "expand_sweep",
    "field_info",
    "field_names",
    "flatten",
    "load_spec",
    "load_sweep",
    "override_key",
    "run_identity",
    "val_sampling",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"rpg_cli.spec.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
