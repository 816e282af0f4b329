"""Sweep-grid expansion: a grid of runs (`SweepSpec`) into validated `ExperimentSpec`s.

A sweep YAML holds `name`, `base` (spec fields shared by every cell), `grid` (field -> list of values),
`include`/`exclude` (GitHub-Actions-matrix semantics) and `seeds`. Expansion merges base and cell,
collapses fields that do not apply to a cell when they come from `base` or a `grid` axis (the KL variant
of `grpo`, clip sub-fields of an unclipped run), validates every cell and drops cells that turn out
identical (same run id). A value written in a cell's own `include` entry (or in a single-run spec) is
explicit: where it has no effect it is an error, never silently dropped.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, field_validator

from rpg_cli.backends.registry import backend_names
from rpg_cli.rundir import reserved_name
from rpg_cli.spec import algorithm_rules
from rpg_cli.spec.errors import SpecError, _from_pydantic, _validate
from rpg_cli.spec.fields import field_info, field_names, model_at
from rpg_cli.spec.identity import label
from rpg_cli.spec.models import ExperimentSpec, _clip_off, _Frozen

MAX_SWEEP_NAME = 100


# ---------------------------------------------------------------------------------------------
# Sweeps


class SweepSpec(_Frozen):
    """A grid of runs. `include`/`exclude` follow GitHub Actions' matrix rules (see `expand_sweep`)."""

    # a directory name under runs/ (file systems take 255 bytes; run names are added below it)
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=MAX_SWEEP_NAME)
    base: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    include: list[dict[str, Any]] = Field(default_factory=list)
    exclude: list[dict[str, Any]] = Field(default_factory=list)
    seeds: list[int] | None = None
    _source: str = PrivateAttr("")  # the file it came from, for error messages

    @field_validator("name")
    @classmethod
    def _not_rpgs_own(cls, name: str) -> str:
        # runs/<name>/ sits beside what rpg and its trackers keep under runs/ (rundir.RESERVED_NAMES)
        if (what := reserved_name(name)) is not None:
            raise ValueError(
                f"{name!r} is taken under runs/ by {what} (runs/{name.casefold()}); allowed: any other name"
            )
        return name

    @property
    def source(self) -> str:
        return self._source or f"sweep {self.name}"

    def expand(self, backend: str | None = None) -> list[ExperimentSpec]:
        return expand_sweep(self, backend=backend)


def expand_sweep(sweep: SweepSpec, backend: str | None = None) -> list[ExperimentSpec]:
    """Cells of the sweep as validated specs, in grid order, identical cells (same run id) once.

    Matrix rules (GitHub Actions): the grid's cartesian product; `exclude` drops every combination
    that matches all of an entry's key/values; each `include` entry is added to every combination
    whose grid values it does not contradict (it may add fields and overwrite what earlier includes
    added, never a grid value), and becomes a combination of its own if it fits none. `seeds` then
    replicates every cell. A mapping value matches when each key it gives matches (so
    `clip: {eps_low: 0.1}` matches any clip with eps_low 0.1). `backend` overrides every cell's backend.
    """
    _check_fragments(sweep)
    cells = _cells(sweep)
    if not cells:
        raise SpecError(
            "removes every grid combination and nothing is included; allowed: a sweep with runs",
            "exclude",
            sweep.source,
        )
    specs: dict[str, ExperimentSpec] = {}
    for index, (cell, explicit) in enumerate(cells, start=1):
        data, skipped = _merge(sweep.base, cell)
        where = f"cell {index} ({label(data)})"
        for key in skipped:
            if key in explicit:
                raise SpecError(
                    f"sets {key.partition('.')[2]} of a {key.partition('.')[0]} that is off in this "
                    f"cell (set in {explicit[key][1]}); allowed: drop it, or turn "
                    f"{key.partition('.')[0]} on",
                    key,
                    sweep.source,
                    where,
                )
        if backend is not None:
            data["backend"] = backend
        data = _collapse(data, keep=lambda path, explicit=explicit: _written(explicit, path) is not None)
        try:
            spec = _validate(ExperimentSpec, data)
        except SpecError as e:
            origin = _written(explicit, e.path)
            if origin is not None:
                e = SpecError(f"{e.reason} (set in {origin})", e.path)
            raise e.within(source=sweep.source, where=where) from None
        specs.setdefault(spec.run_id, spec)
    return list(specs.values())


# (value, where it was written) of each field a cell's own include entry sets
Explicit = dict[str, tuple[Any, str]]


def _cells(sweep: SweepSpec) -> list[tuple[dict[str, Any], Explicit]]:
    """Each cell's fields, and which of them its include entries wrote (explicit, never collapsed)."""
    axes = list(sweep.grid)
    combos = [dict(zip(axes, values)) for values in itertools.product(*sweep.grid.values())] if axes else []
    combos = [c for c in combos if not any(_matches(c, entry) for entry in sweep.exclude)]
    cells: list[tuple[dict[str, Any], Explicit]] = [(dict(c), {}) for c in combos]
    for i, entry in enumerate(sweep.include):
        fitted = False
        for original, (cell, explicit) in zip(combos, cells):
            if all(_same(original[k], v) for k, v in entry.items() if k in original):
                added = {k: v for k, v in entry.items() if k not in original}
                cell.update(added)
                explicit.update({k: (v, f"include[{i}].{k}") for k, v in added.items()})
                fitted = True
        if not fitted:  # a combination of its own; later includes do not extend it
            cells.append((dict(entry), {k: (v, f"include[{i}].{k}") for k, v in entry.items()}))
    if not axes and not sweep.include:
        cells = [({}, {})]  # no grid at all: the base is the one cell
    if sweep.seeds is not None:
        cells = [({**cell, "seed": seed}, explicit) for cell, explicit in cells for seed in sweep.seeds]
    return cells


def _written(explicit: Explicit, path: str) -> str | None:
    """Where a cell's include entry wrote the (dotted) field `path`, or None when it did not."""
    for key, (value, where) in explicit.items():
        if path == key or key.startswith(path + "."):
            return where
        if path.startswith(key + "."):
            rest = path[len(key) + 1 :].split(".")
            for part in rest:
                if not isinstance(value, dict) or part not in value:
                    break
                value = value[part]
            else:
                return ".".join([where, *rest])
    return None


def _matches(combo: dict[str, Any], entry: dict[str, Any]) -> bool:
    return all(k in combo and _same(combo[k], v) for k, v in entry.items())


def _same(have: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _same(have[k], v) for k, v in want.items())
    if isinstance(have, bool) or isinstance(want, bool):
        return have is want
    return have == want


def _merge(base: dict[str, Any], cell: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Base overlaid with a cell: mappings merge key by key, other values replace. Dotted keys
    (`clip.c`) set one nested field and are applied last; on a field that is off they do not apply
    (the dotted keys skipped so are returned)."""
    out = copy.deepcopy(base)
    skipped = []
    for key, value in sorted(cell.items(), key=lambda kv: "." in kv[0]):
        *parents, leaf = key.split(".")
        target = out
        for p in parents:
            if p in target and _clip_off(target[p]) is None:
                skipped.append(key)  # e.g. `clip.c` on an unclipped run (clip: off): the axis collapses
                break
            target = target.setdefault(p, {})
            if not isinstance(target, dict):
                break
        else:
            target[leaf] = _overlay(target.get(leaf), value)
    return out, skipped


def _overlay(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{k: _overlay(old.get(k), v) for k, v in new.items()}}
    return copy.deepcopy(new)


def _collapse(data: dict[str, Any], keep: Any = lambda path: False) -> dict[str, Any]:
    """Fields that do not apply to a cell's algorithm take their neutral value (the algorithm table's rules,
    `algorithm_rules.collapse`), so e.g. a kl axis crossed with `grpo` yields one grpo run, not four
    (identical cells are merged by run id); the `verl` block on any other registered backend likewise. Fields
    `keep(path)` names (written explicitly) stay as they are, for validation to reject."""
    data = algorithm_rules.collapse(data, keep)
    if data.get("backend") in backend_names() and data["backend"] != "verl" and "verl" in data and not keep("verl"):
        data["verl"] = {}
    return data


# ---------------------------------------------------------------------------------------------
# Fragment checks: each value of base/grid/include/exclude against its field's type


def _check_fragments(sweep: SweepSpec) -> None:
    for key, value in sweep.base.items():
        _check_field(key, value, f"base.{key}")
    axes = set(sweep.grid)
    for key, values in sweep.grid.items():
        if not values:
            raise SpecError("empty axis; allowed: a non-empty list of values", f"grid.{key}")
        for i, value in enumerate(values):
            _check_field(key, value, f"grid.{key}[{i}]")
    if sweep.seeds is not None:
        if "seed" in axes:
            raise SpecError("the grid already has a seed axis; allowed: seeds or grid.seed, not both", "seeds")
        if not sweep.seeds:
            raise SpecError("empty; allowed: a non-empty list of integers >= 0", "seeds")
        for i, seed in enumerate(sweep.seeds):
            _check_field("seed", seed, f"seeds[{i}]")
    for i, entry in enumerate(sweep.include):
        for key, value in entry.items():
            _check_field(key, value, f"include[{i}].{key}")
    for i, entry in enumerate(sweep.exclude):
        for key, value in entry.items():
            if key not in axes:
                allowed = ", ".join(sweep.grid) or "none (the grid is empty)"
                raise SpecError(f"not a grid axis; allowed: {allowed}", f"exclude[{i}].{key}")
            _check_field(key, value, f"exclude[{i}].{key}")  # a mapping may be partial


_ADAPTERS: dict[str, TypeAdapter] = {}


def _check_field(key: str, value: Any, where: str) -> None:
    """Validate one (possibly dotted) field alone; missing sub-fields are fine (the cell fills them)."""
    if key not in _ADAPTERS:
        info = field_info(key)
        if info is None:
            raise SpecError(f"unknown field; allowed: {', '.join(field_names(key))}", where)
        annotation = info.rebuild_annotation()
        is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)  # has its own config
        config = None if is_model else ConfigDict(strict=True, allow_inf_nan=False)
        _ADAPTERS[key] = TypeAdapter(annotation, config=config)
    try:
        _ADAPTERS[key].validate_python(value)
    except ValidationError as e:
        problems = [err for err in e.errors() if err["type"] != "missing"]
        if problems:
            raise _from_pydantic(problems[0], model_at(key)).within(prefix=where) from None
    except SpecError as e:
        raise e.within(prefix=where) from None
