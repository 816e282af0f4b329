"""Typed experiment specs: one run (`ExperimentSpec`) and a grid of runs (`SweepSpec`).

    errors      SpecError, and pydantic's errors as one line
    models      ExperimentSpec and its parts, contexts, the canonical spec and run id
    algorithm_blocks  the algorithm's blocks: clip, KL loss, SAPO's gate, a custom loss, rollout correction
    algorithm_rules   the algorithm table as spec rules: defaults, what each algorithm takes, collapsing axes
    verl_block  the `verl` block: overrides, site settings, env
    reference   ReferenceTracker: when pi_ref is reset, one schedule for both backends
    sweep       SweepSpec and its expansion (include/exclude, collapsing axes)
    loading     YAML files: load_spec, load_sweep

Only pydantic and PyYAML are imported here (omegaconf only for files with `${...}`), so
`rpg sweep --dry-run` stays fast. A data file's problems and a run's validation cost: `rpg_cli.inputs`.
"""

from rpg_cli.spec.errors import SpecError
from rpg_cli.spec.loading import load_spec, load_sweep
from rpg_cli.spec.models import (
    CONTEXT_LENGTHS,
    DEFAULT_KL_EMA,
    NOT_IN_RUN_ID,
    TRACKER_NAMES,
    Every,
    ExperimentSpec,
    Trackers,
    _field_info,  # noqa: F401 (rpg_cli.report.summary's dotted-path field lookups)
    _field_names,  # noqa: F401
    context_label,
    context_lengths,
    run_identity,
    val_sampling,
)
from rpg_cli.spec.reference import ReferenceTracker
from rpg_cli.spec.sweep import SweepSpec, expand_sweep
from rpg_cli.spec.verl_block import override_key

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
    "context_label",
    "context_lengths",
    "expand_sweep",
    "load_spec",
    "load_sweep",
    "override_key",
    "run_identity",
    "val_sampling",
]
