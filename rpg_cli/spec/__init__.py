"""Typed experiment specs: one run (`ExperimentSpec`) and a grid of runs (`SweepSpec`)."""

from rpg_cli.spec.models import *  # noqa: F403
from rpg_cli.spec.models import _field_info, _field_names, _validate  # noqa: F401
