"""What a user asks of `rpg report` (a table, plots) and `rpg compare`, declared once with its defaults:
the CLI builds these, the report functions read them. Frozen, so one request is one value."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from rpg_cli.stats import N_RESAMPLES

# --plot panels when none are named (rpg_cli.report.plots.PLOT_METRICS, and val: one per benchmark)
DEFAULT_PLOT_METRICS = ("reward", "entropy", "response_length", "kl", "reference_kl", "reference_age", "val")


@dataclass(frozen=True)
class TableOptions:
    """The Last/Best table (rpg_cli.report.build_table)."""

    sweep: str | None = None  # None: every run in the store
    metric: str = "mean@k"  # mean@K, pass@K or maj@K; K=k: the largest k scored
    benchmarks: tuple[str, ...] | None = None  # columns; None: every benchmark scored
    compare_paper: bool = False  # the paper's Best (test-selected) and its published numbers beside ours
    select_on: str | None = None  # held-out benchmark that picks Best (val-selected)
    scorer: str | None = None  # `rpg eval` scorer; None: the one with the most scores
    fixed_problems: bool = False  # intervals over new seeds on these problems (else also new problems)


@dataclass(frozen=True)
class PlotOptions:
    """Training-dynamics figures (rpg_cli.report.plot_training)."""

    sweep: str | None = None
    metrics: tuple[str, ...] = DEFAULT_PLOT_METRICS  # panel names, or any logged key
    smooth_window: int = 1  # trailing moving average over this many logged steps
    strict: bool = True  # a panel nothing was logged for is an error (else left out)
    per_seed: bool = False  # each seed's run as a thin line too
    x: str = "step"  # the x axis: step, or device-hours (each run's cumulative device-hours through the step)


@dataclass(frozen=True)
class CompareOptions:
    """B against A (rpg_cli.report.compare_groups)."""

    sweep: str | None = None
    where: tuple[str, ...] = ()  # FIELD=VALUE filters, on both sides
    metric: str = "mean@k"
    scorer: str | None = None
    step: int | None = None  # None: each run's last evaluated step
    benchmarks: tuple[str, ...] | None = None  # None: every one scored for all runs of both sides
    n_resamples: int = N_RESAMPLES  # for P(B > A)
    pair_seeds: bool = False
    fixed_problems: bool = False
    effect: float | None = None  # a difference (fraction) whose seeds-per-method at 80% power to report
    budget: float | None = None  # device-hours: each run's score by then (compare.py); None: at `step`


Options = TypeVar("Options", TableOptions, PlotOptions, CompareOptions)


def given(kind: type[Options], options: Options | None, fields: dict[str, Any]) -> Options:
    """`options` (default: `kind()`) with `fields` changed: `build_table(store, compare_paper=True)` reads
    as `build_table(store, TableOptions(compare_paper=True))`. Sequences become tuples (frozen)."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    return dataclasses.replace(options if options is not None else kind(), **fields)
