"""Training dynamics from the store: one panel per metric (reward, entropy, response length, KL, the
validation score per benchmark), one line per method (the mean over its seeds) with a shaded 95% band
(rpg_cli.stats.curve_band), optionally each seed's run as a thin line. A grid of more cells than a legend
can hold (MAX_CELLS) gets one line per method, its cells averaged, never a line per cell. The x axis is the
training step, or (x device-hours) each run's cumulative device-hours through the step. matplotlib is
imported only when a figure is drawn."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpg_cli import cost
from rpg_cli.benchmarks import benchmark_sort_key
from rpg_cli.metrics import (
    ENTROPY,
    KL_LOSS,
    PPO_KL,
    REF_AGE,
    REF_KL,
    RESPONSE_LENGTH,
    REWARD,
    RPG_KL,
    STEP_TIME,
    VAL_KEY_RE,
    axis_label,
    bounds,
)
from rpg_cli.report.costs import STEP_KEYS, Clock, step_seconds_by_run
from rpg_cli.report.names import method_sort_key, run_labels
from rpg_cli.report.options import PlotOptions, given
from rpg_cli.report.scores import ReportError, pick_val_keys, select_runs, val_keys
from rpg_cli.rundir import write_atomic
from rpg_cli.stats import BAND_MEANING, curve_band, curve_mean

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from rpg_cli.store import Store

# Panel name -> the metrics it shows (rpg_cli.metrics), first one any run logged wins (so one panel never
# mixes two). The kl panel: the separate KL loss, else the loss's own KL term, else ppo_kl (DAPO has neither).
PLOT_METRICS: dict[str, tuple[str, ...]] = {
    "reward": (REWARD,),
    "entropy": (ENTROPY,),
    "response_length": (RESPONSE_LENGTH,),
    "kl": (KL_LOSS, RPG_KL, PPO_KL),
    "reference_kl": (REF_KL,),
    "reference_age": (REF_AGE,),
}


# The x axis: the training step, or each run's cumulative device-hours through it (report.costs.Clock)
STEP, DEVICE_HOURS = "step", "device-hours"
X_AXES = (STEP, DEVICE_HOURS)
HOURS_LABEL = "device-hours (devices x summed step time)"
HOURS_MEANING = "x: cumulative device-hours through each step, the line's runs' mean"


@dataclass
class Panel:
    title: str
    key: str  # the metrics key it plots
    ylabel: str


def plot_panels(store: Store, run_ids: Sequence[str], metrics: Sequence[str], strict: bool = True) -> list[Panel]:
    """Resolve panel names (reward, entropy, response_length, kl, reference_kl, reference_age, val, or any
    logged key) to keys;
    `val` becomes one panel per validation benchmark. ReportError when a name has nothing logged
    (with strict=False: only when none has)."""
    logged = store.logged_keys(run_ids, {key for name in metrics for key in PLOT_METRICS.get(name, (name,))})
    panels, missing = [], []
    for name in metrics:
        if name == "val":
            val = pick_val_keys(val_keys(store, run_ids), "mean", None)
            if not val:
                missing.append(name)
            for key, bench in sorted(val.items(), key=lambda kv: benchmark_sort_key(kv[1])):
                stat = VAL_KEY_RE.match(key)
                panels.append(Panel(f"val {bench}", key, f"{bench} mean@{stat['k']}"))
            continue
        key = next((k for k in PLOT_METRICS.get(name, (name,)) if k in logged), None)
        if key is None:
            missing.append(name)
        else:
            panels.append(Panel(name.replace("_", " "), key, axis_label(key)))
    if missing and (strict or not panels):
        raise ReportError(
            f"nothing logged for {', '.join(missing)}; plottable: " + ", ".join(sorted(_plottable(store, run_ids)))
        )
    return panels


def _plottable(store: Store, run_ids: Sequence[str]) -> set[str]:
    logged = store.logged_keys(run_ids, {key for name in PLOT_METRICS for key in PLOT_METRICS[name]})
    names = {name for name, ks in PLOT_METRICS.items() if logged & set(ks)}
    return names | ({"val"} if pick_val_keys(val_keys(store, run_ids), "mean", None) else set()) or {"nothing yet"}


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over `window` points (fewer at the start); window 1 is the identity."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


# Above this many cells (a method and its settings, on a model and context), a figure draws one line per method:
# the mean of its cells' curves, its band over them; never hundreds of lines and legend entries nobody can read.
MAX_CELLS = 12
CELLS_MEANING = (
    "one line per method: the mean over its cells (its settings) of each one's mean over seeds; band: 95% "
    "confidence interval of that mean (t over cells, per step, within the metric's range)"
)


@dataclass
class Line:
    """One line of every panel, with its band: a cell (its runs are seeds) or, over many cells, a method
    (its runs grouped by cell: each cell's mean curve is one unit of the band)."""

    label: str
    cells: list[list[str]]  # run ids, one list per cell


def plot_lines(runs: Sequence[Any]) -> list[Line]:
    """The lines a figure draws, in the table's method order: one per cell (a method with its settings,
    its seeds averaged) while there are at most MAX_CELLS, else one per method (its cells averaged)."""
    labels = run_labels(runs, seed=False)
    ordered = sorted(runs, key=lambda r: (method_sort_key(labels[r.id].split(" · ")[0]), labels[r.id]))
    cells: dict[str, list[str]] = {}
    for r in ordered:
        cells.setdefault(labels[r.id], []).append(r.id)
    if len(cells) <= MAX_CELLS:
        return [Line(label, [ids]) for label, ids in cells.items()]
    bases = run_labels(runs, seed=False, variants=False)
    methods: dict[str, list[list[str]]] = {}
    for ids in cells.values():
        methods.setdefault(bases[ids[0]], []).append(ids)
    ranked = sorted(methods.items(), key=lambda kv: (method_sort_key(kv[0].split(" · ")[0]), kv[0]))
    return [Line(base, grouped) for base, grouped in ranked]


def _line_curves(
    line: Line, data: dict, key: str, window: int, grouped: bool
) -> tuple[list[tuple[Any, list[float]]], list[tuple[Any, list[float]]], int, list[str]]:
    """(the band's units, every run's smoothed curve, cells with data, those runs' ids) of one line in one panel:
    the units are the runs (seeds) of a cell, or with `grouped` each cell's mean curve (a method with one cell: no
    band)."""
    runs, units, cells, run_ids = [], [], 0, []
    for ids in line.cells:
        have = [r for r in ids if (r, key) in data]
        curves = [(data[(r, key)][0], smooth(data[(r, key)][1], window)) for r in have]
        if not curves:
            continue
        cells += 1
        runs += curves
        run_ids += have
        if grouped and len(curves) == 1:  # a cell of one seed: its curve is its mean
            units.append(curves[0])
        elif grouped:
            units.append(curve_mean(curves))
    return (units if grouped else runs), runs, cells, run_ids


def hours_at(steps: Sequence[int], clocks: Sequence[Clock]) -> list[float]:
    """The x of each step on a device-hours axis: the mean over the runs' clocks of their cumulative device-hours
    through it (a run's own clock for its thin line; the band, computed per step over seeds, sits at its runs' mean)."""
    return [sum(clock.at(int(step)) for clock in clocks) / len(clocks) for step in steps]


def plot_training(store: Store, options: PlotOptions | None = None, **fields: Any) -> Figure:
    """Training dynamics: one panel per metric (val: per benchmark), one line per method (the mean over
    its seeds, each seed's curve smoothed first) with its 95% band, and with per_seed each run as a thin
    line; shared legend below the panels, the band's meaning in the title. Over more than MAX_CELLS cells
    (a grid's settings), one line per method: the mean of its cells' mean curves, the band over its cells.
    With strict=False, metrics nobody logged are left out instead of an error. Uses matplotlib's Agg
    backend (no display needed)."""
    options = given(PlotOptions, options, fields)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    if options.x not in X_AXES:
        raise ReportError(f"--x {options.x}: expected one of {', '.join(X_AXES)}")
    runs = select_runs(store, options.sweep)
    ids = [r.id for r in runs]
    panels = plot_panels(store, ids, options.metrics, options.strict)
    by_hours = options.x == DEVICE_HOURS
    keys = {p.key for p in panels} | (set(STEP_KEYS) if by_hours else set())
    data = store.series(ids, sorted(keys))  # one query: the panels' keys and, for device-hours, the step times
    timed: dict[str, Clock] = {}
    if by_hours:
        seconds = step_seconds_by_run({k: v for k, v in data.items() if k[1] in STEP_KEYS})
        timed = {r.id: Clock.of(cost.devices(r.spec), seconds.get(r.id, {})) for r in runs}
        if not any(clock.steps for clock in timed.values()):
            raise ReportError(f"--x {DEVICE_HOURS}: no run logged {STEP_TIME}; plot against the step (--x step)")
    lines = plot_lines(runs)
    grouped = any(len(line.cells) > 1 for line in lines)  # more than MAX_CELLS cells: a line per method
    colors = matplotlib.colormaps["tab10" if len(lines) <= 10 else "tab20"]

    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.3 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        for i, line in enumerate(lines):
            units, curves, cells, run_ids = _line_curves(line, data, panel.key, options.smooth_window, grouped)
            if not curves:
                continue
            color = colors(i % colors.N)
            band = curve_band(units, bounds=bounds(panel.key))  # the range its metric cannot leave
            if grouped:
                count = f" ({cells} cell{'s' if cells > 1 else ''}, {len(curves)} run{'s' if len(curves) > 1 else ''})"
            else:
                count = f" ({len(curves)} seeds)" if len(curves) > 1 else ""
            x = hours_at(band.steps, [timed[r] for r in run_ids]) if by_hours else band.steps
            ax.plot(x, band.mean, label=line.label + count, color=color, linewidth=1.6)
            ax.fill_between(x, band.low, band.high, color=color, alpha=0.2, linewidth=0)
            if options.per_seed:
                for run_id, (steps, values) in zip(run_ids, curves):
                    ax.plot(
                        hours_at(steps, [timed[run_id]]) if by_hours else steps,
                        values,
                        color=color,
                        linewidth=0.5,
                        alpha=0.6,
                    )
        ax.set_title(panel.title)
        ax.set_xlabel(HOURS_LABEL if by_hours else "training step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    handles, names = [], []
    for ax in axes[: len(panels)]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            if name not in names:
                handles.append(handle)
                names.append(name)
    fig.legend(handles, names, loc="outside lower center", ncols=min(4, max(1, len(names))), frameon=False)
    fig.suptitle(
        f"{options.sweep or 'all runs'}: training dynamics"
        + (f" (moving average over {options.smooth_window} steps)" if options.smooth_window > 1 else "")
        + f"\n{CELLS_MEANING if grouped else BAND_MEANING}"
        + (f"; {HOURS_MEANING}" if by_hours else "")
        + ("; thin lines: single seeds" if options.per_seed else ""),
        fontsize="medium",
    )
    return fig


def save_figure(fig: Figure, out_dir: str | Path, stem: str) -> list[Path]:
    """Write `<out_dir>/<stem>.png` and `.svg` atomically; returns their paths."""
    paths = []
    for ext in ("png", "svg"):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=150 if ext == "png" else None)
        paths.append(write_atomic(Path(out_dir) / f"{stem}.{ext}", buf.getvalue()))
    return paths
