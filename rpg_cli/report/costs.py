"""What each cell of the table cost (`rpg report --cost`), and the device-hours behind each logged step (the x
axis of `rpg report --plot --x device-hours`, the budget of `rpg compare --budget`).

A cell is a method on a model and context, grouped as the Last/Best table groups them (rows in its order). Per
cell: its runs (finished/ran), device-hours per run (rpg_cli.cost: devices x the time the run held them, queued
time excluded; mean over the runs that finished with the 95% t interval over seeds of rpg_cli.stats, the total
over every run, finished or not, since all of it was paid for), the share of each phase of training
(metrics.PHASES) in the cell's summed step device time (cost.step_seconds over every logged step of its runs;
"other" is the rest of the step), tokens per second per device (perf/throughput) and MFU (perf/mfu/actor), each
the mean over a run's steps, then over the runs that logged it ("-" where none did: a CPU run reports no MFU).

Every number is read in one query of the few keys it needs for the cells' runs (store.series).
"""

from __future__ import annotations

import json
import math
import statistics
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from rpg_cli import cost, stats
from rpg_cli.metrics import MFU, PHASES, STEP_TIME, TESTING_TIME, THROUGHPUT
from rpg_cli.report.names import CONTEXT_ORDER, context_name, method_labels, method_sort_key, model_name
from rpg_cli.report.scores import runs_text, select_runs, unfinished_runs

if TYPE_CHECKING:
    from rpg_cli.store import RunRecord, Store

OTHER = "other"  # the part of the step time no phase accounts for
STEP_KEYS = (STEP_TIME, TESTING_TIME)  # what cost.step_seconds adds up


# ------------------------------------------------------------------------------ device-hours of a run


def _now() -> datetime:
    """Now as the store keeps times: naive UTC."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def step_seconds_by_run(series: Mapping[tuple[str, str], tuple[list[int], list[float]]]) -> dict[str, dict[int, float]]:
    """{run id: {step: its device time in seconds (cost.step_seconds)}} from store.series of STEP_KEYS."""
    out: dict[str, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for (run_id, key), (steps, values) in series.items():
        if key in STEP_KEYS:
            for step, value in zip(steps, values):
                out[run_id][step][key] = value
    return {run_id: {s: cost.step_seconds(v) for s, v in sorted(by_step.items())} for run_id, by_step in out.items()}


@dataclass(frozen=True)
class Clock:
    """A run's cumulative device-hours through each logged step: devices x the summed step seconds / 3600."""

    steps: tuple[int, ...]
    hours: tuple[float, ...]

    @classmethod
    def of(cls, devices: int, seconds: Mapping[int, float]) -> Clock:
        steps, hours, total = [], [], 0.0
        for step in sorted(seconds):
            total += seconds[step]
            steps.append(step)
            hours.append(cost.device_hours(devices, total))
        return cls(tuple(steps), tuple(hours))

    @property
    def total(self) -> float:
        """Device-hours through its last logged step (0 before any)."""
        return self.hours[-1] if self.hours else 0.0

    def at(self, step: int) -> float:
        """Device-hours through `step`: through the last logged step at or before it (0 before the first)."""
        i = bisect_right(self.steps, step)
        return self.hours[i - 1] if i else 0.0


def clocks(store: Store, runs: Sequence[RunRecord]) -> dict[str, Clock]:
    """Every run's Clock, from one query of its step times."""
    seconds = step_seconds_by_run(store.series([r.id for r in runs], list(STEP_KEYS))) if runs else {}
    return {r.id: Clock.of(cost.devices(r.spec), seconds.get(r.id, {})) for r in runs}


# ----------------------------------------------------------------------------------------- the table


@dataclass
class CostRow:
    model: str
    context: str
    method: str
    runs: list[str]  # the names of its runs that finished
    ran: int  # every run of the cell, finished or not
    hours: stats.Band | None  # device-hours over the finished runs (one point: mean, 95% band); None: none
    total: float  # device-hours of every run of the cell
    shares: dict[str, float | None]  # phase label (and OTHER) -> share of the summed step time; None: no step time
    throughput: float | None  # tokens/s per device
    mfu: float | None

    @property
    def runs_text(self) -> str:
        """'3' when every run finished, else finished/ran: '2/3' (as the table's seeds column)."""
        return str(self.ran) if len(self.runs) == self.ran else f"{len(self.runs)}/{self.ran}"

    @property
    def mean(self) -> float | None:
        return None if self.hours is None else float(self.hours.mean[0])

    @property
    def low(self) -> float | None:
        return None if self.hours is None or math.isnan(self.hours.low[0]) else float(self.hours.low[0])

    @property
    def high(self) -> float | None:
        return None if self.hours is None or math.isnan(self.hours.high[0]) else float(self.hours.high[0])


@dataclass
class CostTable:
    sweep: str | None
    phases: list[str]  # the phase labels any run logged, in metrics.PHASES' order
    rows: list[CostRow]
    notes: list[str] = field(default_factory=list)


def build_cost_table(store: Store, sweep: str | None = None, now: datetime | None = None) -> CostTable:
    """The cost of every cell of a sweep (or of every run): module docstring. ReportError when there are no runs."""
    runs = select_runs(store, sweep)
    lost = unfinished_runs(store, runs)
    keys = [*STEP_KEYS, *PHASES.values(), THROUGHPUT, MFU]
    series = store.series([r.id for r in runs], keys)
    seconds = step_seconds_by_run(series)
    labels = method_labels({r.id: r.spec for r in runs})
    cells: dict[tuple[str, str, str], list[RunRecord]] = defaultdict(list)
    for r in runs:
        cells[(model_name(r.spec), context_name(r.spec), labels[r.id])].append(r)
    logged = {label for label, key in PHASES.items() if any(k == key for _, k in series)}
    phases = [label for label in PHASES if label in logged]
    rows = []
    for (model, context, label), members in sorted(
        cells.items(), key=lambda kv: (kv[0][0], CONTEXT_ORDER.get(kv[0][1], 9), kv[0][1], method_sort_key(kv[0][2]))
    ):
        finished = [r for r in members if r.id not in lost]
        held = {r.id: cost.run_device_hours(r, now or _now()) for r in members}  # None: it never held devices
        hours = [h for r in finished if (h := held[r.id]) is not None]
        rows.append(
            CostRow(
                model,
                context,
                label,
                [r.name for r in finished],
                len(members),
                stats.curve_band([([0], [h]) for h in hours], bounds=(0.0, None)) if hours else None,
                sum(h for h in held.values() if h is not None),
                _shares(series, seconds, [r.id for r in members], phases),
                _mean_of_means(series, [r.id for r in members], THROUGHPUT),
                _mean_of_means(series, [r.id for r in members], MFU),
            )
        )
    table = CostTable(sweep, phases, rows)
    table.notes = _notes(table, [r for r in runs if r.id in lost])
    return table


def _shares(
    series: Mapping[tuple[str, str], tuple[list[int], list[float]]],
    seconds: Mapping[str, Mapping[int, float]],
    run_ids: Sequence[str],
    phases: Sequence[str],
) -> dict[str, float | None]:
    """Each phase's share of the runs' summed step device time (only the steps that logged a step time), and
    OTHER: what is left (never below 0)."""
    total = sum(sum(seconds.get(r, {}).values()) for r in run_ids)
    if total <= 0:
        return {label: None for label in (*phases, OTHER)}
    shares: dict[str, float | None] = {}
    for label in phases:
        spent = 0.0
        for r in run_ids:
            steps, values = series.get((r, PHASES[label]), ([], []))
            timed = seconds.get(r, {})
            spent += sum(v for s, v in zip(steps, values) if s in timed)
        shares[label] = spent / total
    shares[OTHER] = max(1.0 - sum(v for v in shares.values() if v is not None), 0.0)
    return shares


def _mean_of_means(
    series: Mapping[tuple[str, str], tuple[list[int], list[float]]], run_ids: Sequence[str], key: str
) -> float | None:
    """The mean over runs of each run's mean over its steps (None when no run logged `key`)."""
    means = [statistics.fmean(series[(r, key)][1]) for r in run_ids if series.get((r, key), ([], []))[1]]
    return statistics.fmean(means) if means else None


def _notes(table: CostTable, lost: Sequence[RunRecord]) -> list[str]:
    """The footer: what each column is, and the cells whose device-hours have no interval."""
    notes = [
        "device-hours: devices x the time each run held them (queued time excluded); mean over the runs that "
        f"finished ±half of its {stats.CONFIDENCE:.0%} confidence interval over seeds (t); total: every run, "
        "finished or not"
    ]
    single = [row.method for row in table.rows if len(row.runs) == 1]
    if single:
        notes.append(f"no interval (one run finished): {', '.join(single)}")
    if lost:
        notes.append(f"runs: finished/ran; did not finish (in the total only): {runs_text(len(lost))}")
    phases = ", ".join(f"{label} {PHASES[label]}" for label in table.phases) or "none logged"
    notes.append(
        f"phases: share of the cell's summed step device time ({STEP_TIME} + {TESTING_TIME}) over every logged "
        f"step of its runs ({phases}); {OTHER}: the rest of the step"
    )
    notes.append(
        f"tokens/s per device: {THROUGHPUT}; MFU: {MFU}; each the mean over a run's steps, then over its runs; "
        "-: not logged (a CPU run reports no MFU)"
    )
    return notes


# ---------------------------------------------------------------------------------------- as text


def hours_text(x: float | None) -> str:
    """Device-hours as printed: '123', '1.23', '0.50', '0.0042'; '-' for none."""
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.2f}" if x >= 0.1 or x == 0 else f"{x:.2g}"


def hours_cell(row: CostRow, bounds: bool = False) -> str:
    """'1.23 ±0.45' (or with `bounds` '1.23 [0.78, 1.68]'), '1.23' without an interval, '-' without a run."""
    if row.mean is None:
        return "-"
    if row.low is None or row.high is None:
        return hours_text(row.mean)
    if bounds:
        return f"{hours_text(row.mean)} [{hours_text(row.low)}, {hours_text(row.high)}]"
    return f"{hours_text(row.mean)} ±{hours_text((row.high - row.low) / 2)}"


def share_text(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def throughput_text(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def mfu_text(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def header(table: CostTable) -> list[str]:
    """Column titles after method and runs."""
    return ["device-hours", "total", *table.phases, OTHER, "tokens/s/device", "MFU"]


def cells(table: CostTable, row: CostRow, bounds: bool = False) -> list[str]:
    """A row's printed cells after method and runs, in header's order."""
    shares = [share_text(row.shares.get(label)) for label in (*table.phases, OTHER)]
    return [
        hours_cell(row, bounds),
        hours_text(row.total),
        *shares,
        throughput_text(row.throughput),
        mfu_text(row.mfu),
    ]


def groups(table: CostTable) -> dict[tuple[str, str], list[CostRow]]:
    """Rows by (model, context), in the table's order."""
    out: dict[tuple[str, str], list[CostRow]] = {}
    for row in table.rows:
        out.setdefault((row.model, row.context), []).append(row)
    return out


def title(table: CostTable) -> str:
    return f"{table.sweep or 'all runs'}: cost per cell"


def to_markdown(table: CostTable) -> str:
    out = [f"## {title(table)}", ""]
    titles = ["Method", "Runs", *header(table)]
    for (model, context), rows in groups(table).items():
        out += [
            f"### {model} · {context}",
            "",
            "| " + " | ".join(titles) + " |",
            "|" + "|".join([":---"] + ["---:"] * (len(titles) - 1)) + "|",
        ]
        for row in rows:
            line = [row.method.replace("|", "\\|"), row.runs_text, *cells(table, row, bounds=True)]
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    out += [f"- {line}" for line in table.notes]
    return "\n".join(out) + "\n"


def to_latex(table: CostTable) -> str:
    """A booktabs table: one row per cell, a group header per model and context."""
    from rpg_cli.report.render import latex_escape

    titles = ["Method", "Runs", *header(table)]
    lines = [
        "% needs \\usepackage{booktabs}",
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{{latex_escape(title(table))}}}",
        f"\\begin{{tabular}}{{l{'r' * (len(titles) - 1)}}}",
        "\\toprule",
        " & ".join(latex_escape(t) for t in titles) + " \\\\",
    ]
    for (model, context), rows in groups(table).items():
        lines += [
            "\\midrule",
            f"\\multicolumn{{{len(titles)}}}{{l}}{{\\textit{{{latex_escape(f'{model} · {context}')}}}}} \\\\",
        ]
        for row in rows:
            printed = [
                latex_escape(c).replace("-", "--") if c == "-" else latex_escape(c) for c in cells(table, row, True)
            ]
            lines.append(" & ".join([latex_escape(row.method), row.runs_text, *printed]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    lines += [f"\\par\\footnotesize {latex_escape(line)}" for line in table.notes]
    lines += ["\\end{table}"]
    return "\n".join(lines) + "\n"


def _key(label: str) -> str:
    """A phase label as a CSV/JSON field: 'old log-prob' -> 'old_log_prob'."""
    return label.replace(" ", "_").replace("-", "_")


def records(table: CostTable) -> list[dict[str, Any]]:
    """One flat dict per cell: model, context, method, finished, ran, runs (the finished ones), device_hours (mean
    over the finished runs) with its 95% interval (device_hours_low/high; empty with one run) and device_hours_total
    (every run), share_<phase> and share_other (fractions), tokens_per_s_per_device, mfu (a fraction)."""
    out = []
    for row in table.rows:
        rec: dict[str, Any] = {
            "model": row.model,
            "context": row.context,
            "method": row.method,
            "finished": len(row.runs),
            "ran": row.ran,
            "runs": " ".join(row.runs),
            "device_hours": row.mean,
            "device_hours_low": row.low,
            "device_hours_high": row.high,
            "device_hours_total": row.total,
        }
        rec.update({f"share_{_key(label)}": row.shares.get(label) for label in (*table.phases, OTHER)})
        rec["tokens_per_s_per_device"] = row.throughput
        rec["mfu"] = row.mfu
        out.append(rec)
    return out


def to_csv(table: CostTable) -> str:
    from rpg_cli.report.render import records_csv

    return records_csv(records(table))


def to_json(table: CostTable) -> str:
    doc = {
        "sweep": table.sweep,
        "phases": {label: PHASES[label] for label in table.phases},
        "confidence": stats.CONFIDENCE,
        "notes": table.notes,
        "cells": records(table),
    }
    return json.dumps(doc, indent=2) + "\n"


COST_RENDERERS = {"markdown": to_markdown, "latex": to_latex, "csv": to_csv, "json": to_json}
