"""The paper's Last/Best table as data: one row per method, grouped by model and context; cells are
means and standard deviations over seeds, ranked per column; the paper's own numbers beside them on
request. Renderers (render.py and the CLI's terminal table) only write it out."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING

from rpg_cli.report.names import (
    BENCHMARK_ORDER,
    CONTEXT_ORDER,
    context_name,
    method_base,
    method_labels,
    method_sort_key,
    model_name,
)
from rpg_cli.report.scores import ReportError, Scores, runs_text, scores, select_runs

if TYPE_CHECKING:
    from rpg_cli.store import RunRecord, Store

WHICH = ("last", "best")


@dataclass
class Cell:
    mean: float | None = None
    std: float | None = None  # sample standard deviation over seeds; None with one seed
    n: int = 0  # seeds with a value
    rank: int | None = None  # 1: best of its column (bold), 2: second (underlined)
    paper: float | None = None
    diff: float | None = None  # mean - paper


@dataclass
class Row:
    method: str
    base: str  # the paper's name of the algorithm
    runs: list[str]  # run names
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)  # (benchmark, last|best) -> cell
    paper_method: str | None = None  # the paper's row it is compared with, when it is one


@dataclass
class Group:
    model: str
    context: str
    rows: list[Row]


@dataclass
class Table:
    metric: str
    benchmarks: list[str]
    groups: list[Group]
    sources: list[str]
    compare_paper: bool = False
    sweep: str | None = None

    @property
    def columns(self) -> list[tuple[str, str]]:
        return [(b, w) for b in self.benchmarks for w in WHICH]


def build_table(
    store: Store,
    sweep: str | None = None,
    metric: str = "mean@k",
    benchmarks: Sequence[str] | None = None,
    compare_paper: bool = False,
) -> Table:
    """The Last/Best table of a sweep (or of every run): one row per method, grouped by model and context."""
    runs = select_runs(store, sweep)
    result = scores(store, [r.id for r in runs], metric)
    scored = [r for r in runs if r.id in result.values]
    logged = sorted({b for v in result.values.values() for b in v}, key=lambda b: (BENCHMARK_ORDER.get(b, 99), b))
    if benchmarks:
        unknown = [b for b in benchmarks if b not in logged]
        if unknown:
            raise ReportError(
                f"no {result.metric} scores for benchmark {', '.join(unknown)}; scored: {', '.join(logged)}"
            )
        logged = list(benchmarks)
    labels = method_labels({r.id: r.spec for r in scored})
    by_row: dict[tuple[str, str, str], list[RunRecord]] = defaultdict(list)
    for r in scored:
        by_row[(model_name(r.spec), context_name(r.spec), labels[r.id])].append(r)
    paper = paper_results() if compare_paper else {}
    groups: dict[tuple[str, str], Group] = {}
    for (model, context, label), members in sorted(
        by_row.items(), key=lambda kv: (kv[0][0], CONTEXT_ORDER.get(kv[0][1], 9), kv[0][1], method_sort_key(kv[0][2]))
    ):
        base = method_base(members[0].spec)
        row = Row(label, base, [r.name for r in members])
        for bench in logged:
            for which in WHICH:
                got = [getattr(result.values[r.id].get(bench), which, None) for r in members]
                row.cells[(bench, which)] = _cell([v for v in got if v is not None])
        if compare_paper and all(r.spec.get("optimizer") == "adamw" for r in members):
            # the paper's tables are AdamW runs; other optimizers have nothing published to compare with
            for (bench, which), cell in row.cells.items():
                # a local copy of the paper's model (/models/Qwen3-4B) matches by its directory name
                published = paper.get((model, context, base, bench)) or paper.get(
                    (model.split("/")[-1], context, base, bench)
                )
                if published is not None:
                    row.paper_method = base
                    cell.paper = published[WHICH.index(which)]
                    cell.diff = None if cell.mean is None else cell.mean - cell.paper
        groups.setdefault((model, context), Group(model, context, [])).rows.append(row)
    sources = result.sources + (
        [f"not scored yet: {runs_text(len(runs) - len(scored))}"] if len(scored) < len(runs) else []
    )
    sources += _starting_policy(result, scored, logged)
    table = Table(result.metric, logged, list(groups.values()), sources, compare_paper, sweep)
    for group in table.groups:
        _rank(group, table.columns)
    return table


def _starting_policy(result: Scores, runs: list[RunRecord], benchmarks: list[str]) -> list[str]:
    """Runs validated before training (step 0) show where every method started: the starting policy's
    score per model and context, for the footer."""
    starts: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in runs:
        for bench in benchmarks:
            score = result.values[r.id].get(bench)
            if score is not None and score.first_step == 0 and score.first is not None:
                starts[(model_name(r.spec), context_name(r.spec), bench)].append(score.first)
    by_group: dict[tuple[str, str], list[str]] = defaultdict(list)
    for (model, context, bench), values in starts.items():
        by_group[(model, context)].append(f"{bench} {fmt(statistics.fmean(values))}")
    return [
        f"starting policy (step 0) on {model} {context}: {', '.join(parts)}"
        for (model, context), parts in by_group.items()
    ]


def _cell(values: list[float]) -> Cell:
    if not values:
        return Cell()
    std = statistics.stdev(values) if len(values) > 1 else None
    return Cell(statistics.fmean(values), std, len(values))


def _rank(group: Group, columns: list[tuple[str, str]]) -> None:
    """Bold the best mean of each column, underline the second; equal values (as printed) share a rank."""
    for column in columns:
        cells = [row.cells[column] for row in group.rows if row.cells[column].mean is not None]
        if len(cells) < 2:
            continue
        distinct = sorted({round(c.mean, 4) for c in cells}, reverse=True)
        for cell in cells:
            position = distinct.index(round(cell.mean, 4))
            cell.rank = position + 1 if position < 2 else None


def paper_results() -> dict[tuple[str, str, str, str], tuple[float, float]]:
    """The paper's published Last/Best figures: (model, context, method, benchmark) -> (last, best)."""
    try:
        text = resources.files("rpg_cli").joinpath("data", "paper_results.csv").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError("rpg_cli/data/paper_results.csv is missing from this install; reinstall rpg-cli") from None
    out = {}
    for rec in csv.DictReader(io.StringIO(text)):
        key = (rec["model"], rec["context"].upper(), rec["method"], rec["benchmark"])
        out[key] = (float(rec["last"]), float(rec["best"]))
    return out


def fmt(x: float | None, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def cell_text(cell: Cell) -> str:
    """'0.4031' or '0.4031 ± 0.0123' (the ± part when several seeds have a value)."""
    if cell.mean is None:
        return "-"
    return fmt(cell.mean) + (f" ± {fmt(cell.std)}" if cell.std is not None else "")
