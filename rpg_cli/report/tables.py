"""The paper's Last/Best table as data: one row per method, grouped by model, context and protocol;
each cell a score with its 95% confidence interval (rpg_cli.stats, from evidence.py), ranked per column;
the paper's own numbers beside them on request. Renderers (render.py and the CLI's terminal table)
only write it out.

Scale: scores are fractions in [0, 1] in the data (the store's, the paper CSV's, CSV/JSON output);
every printed number (terminal, Markdown, LaTeX) is a percentage with one decimal (`fmt`), differences
in points.

Columns per benchmark: Last (each run's final evaluated step); Best (val-selected): each run's step
with the highest score on the selection benchmark (`select_on`; then not a test column), reported
on the test benchmark at that step; Best (test-selected): the maximum over evaluated steps on the
test benchmark itself, the paper's Best, biased upward, shown with --compare-paper only.

Runs that did not finish (failed, diverged, stopped, preempted, still running) give no score from any
source: a cell is over its finished seeds, its row says how many finished of how many ran ("2/3"), and
the footer names each other run with its state, reason and step (scores.Unfinished)."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from rpg_cli import stats
from rpg_cli.benchmarks import benchmark_sort_key
from rpg_cli.report.evidence import Evidence, Pick, cell_interval, wanted_steps
from rpg_cli.report.names import (
    CONTEXT_ORDER,
    context_name,
    method_base,
    method_labels,
    method_sort_key,
    model_name,
)
from rpg_cli.report.options import TableOptions, given
from rpg_cli.report.scores import (
    ReportError,
    Scores,
    Unfinished,
    not_shown,
    runs_text,
    scores,
    select_runs,
    unfinished_runs,
    who,
)
from rpg_cli.stats import NO_INTERVAL, Interval

if TYPE_CHECKING:
    from rpg_cli.store import RunRecord, Store

WHICH = ("last", "best_val", "best_test")
WHICH_TITLES = {"last": "Last", "best_val": "Best (val-selected)", "best_test": "Best (test-selected)"}
SCALE = 100.0  # printed numbers are percentages
NO_ACCURACY = "nothing (not accuracies in [0, 1]: no interval)"
DIGITS = 1


@dataclass
class Cell:
    mean: float | None = None  # the estimate: mean over seeds (and problems) in [0, 1]
    low: float | None = None  # its 95% confidence interval; None without one (one seed, benchmark means)
    high: float | None = None
    n: int = 0  # seeds with a value
    problems: int | None = None  # problems behind the estimate; None: benchmark means only
    covers: str = ""  # what the interval is about, in words (rpg_cli.stats: new seeds and new problems, ...)
    rank: int | None = None  # 1: best of its column (bold), 2: second (underlined)
    paper: float | None = None
    diff: float | None = None  # mean - paper
    caution: str = ""  # rpg_cli.stats.CAUTION where the interval is known to cover less than 95%
    steps: tuple[int, ...] = ()  # the evaluated steps of its runs (one per run), for the footer
    left_out: tuple[str, ...] = ()  # "run (its source)" of the row's runs scored here only by another source
    finished: int = 0  # the row's runs that finished (scored): the seeds the interval may be over
    ran: int = 0  # finished + not_finished
    not_finished: tuple[Unfinished, ...] = ()  # the row's runs that did not finish: no score, a footer line

    @classmethod
    def of(cls, interval: Interval) -> Cell:
        return cls(
            interval.estimate,
            interval.low,
            interval.high,
            interval.n_seeds,
            interval.n_problems,
            interval.covers,
            caution=interval.caution,
        )


@dataclass
class Row:
    method: str
    base: str  # the paper's name of the algorithm
    runs: list[str]  # run names
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)  # (benchmark, last|best) -> cell
    paper_method: str | None = None  # the paper's row it is compared with, when it is one
    seeds: list = field(default_factory=list)  # the seeds of `runs` (an unfinished run is named by its seed)
    not_finished: list[Unfinished] = field(default_factory=list)  # its runs that did not finish

    @property
    def seeds_text(self) -> str:
        """'3' when every run finished, else finished of ran: '2/3'."""
        ran = len(self.runs) + len(self.not_finished)
        return str(ran) if not self.not_finished else f"{len(self.runs)}/{ran}"

    def who(self, run: Unfinished) -> str:
        """'GRPO seed 2' (or its run name where its seed does not tell it from the row's other runs)."""
        return who(run, [*self.seeds, *(u.seed for u in self.not_finished)], self.method)


@dataclass
class Group:
    model: str
    context: str
    rows: list[Row]
    protocol: str = ""  # the source and sampling protocol of its scores, when the table has several


@dataclass
class Table:
    metric: str
    benchmarks: list[str]
    groups: list[Group]
    sources: list[str]
    compare_paper: bool = False
    sweep: str | None = None
    which: tuple[str, ...] = ("last",)  # the kinds of column per benchmark (WHICH)
    select_on: str | None = None
    notes: list[str] = field(default_factory=list)  # what the intervals cover, for the footer
    fixed_problems: bool = False  # intervals over new seeds on these problems (else also new problems)

    @property
    def columns(self) -> list[tuple[str, str]]:
        return [(b, w) for b in self.benchmarks for w in self.which]


def build_table(store: Store, options: TableOptions | None = None, **fields: Any) -> Table:
    """The Last/Best table of a sweep (or of every run): one row per method, grouped by model, context
    and protocol (scores drawn under different sampling settings never share a section, and a cell
    holds one source: runs scored there only by another are named in the footer, never averaged in).
    Columns per test benchmark: Last, Best (val-selected) when `select_on` names the selection
    benchmark, Best (test-selected) with `compare_paper`. Intervals over new seeds and new problems,
    or with `fixed_problems` over new seeds on these problems. Runs that did not finish give no score:
    they join their method's row in the first section, counted in its seeds and named in the footer."""
    options = given(TableOptions, options, fields)
    runs = select_runs(store, options.sweep)
    lost = unfinished_runs(store, runs)
    finished = [r for r in runs if r.id not in lost]
    if not finished:
        raise ReportError(_none_finished(list(lost.values())))
    ids = [r.id for r in finished]
    try:
        first = scores(store, ids, options.metric, options.scorer)
    except ReportError as e:  # about the finished runs: say that the others were not asked
        if not lost:
            raise
        raise ReportError(f"{e} (finished runs; {_states(lost.values())} did not finish and give none)") from None
    sections = [first]
    if first.other_protocols:
        eval_scorer = next(o.scorer for o in first.origins.values() if o.evaluated)
        sections += [scores(store, sorted(r), options.metric, eval_scorer, p) for p, r in first.other_protocols]
    logged = sorted(
        {b for result in sections for v in result.values.values() for b in v},
        key=benchmark_sort_key,
    )
    if options.select_on is not None and options.select_on not in logged:
        raise ReportError(
            f"--select-on {options.select_on}: no {first.metric} scores on it; scored: {', '.join(logged)}"
        )
    tests = [b for b in logged if b != options.select_on]
    if options.benchmarks:
        unknown = [b for b in options.benchmarks if b not in tests]
        if unknown:
            why = "it is the selection benchmark" if options.select_on in unknown else f"scored: {', '.join(tests)}"
            raise ReportError(f"no {first.metric} scores for benchmark {', '.join(unknown)}; {why}")
        tests = list(options.benchmarks)
    if not tests:
        raise ReportError(f"no test benchmark left: {options.select_on} is the only one scored and it selects the step")
    which = ("last", *(("best_val",) if options.select_on else ()), *(("best_test",) if options.compare_paper else ()))
    paper = paper_results() if options.compare_paper else {}
    groups: list[Group] = []
    scored_ids: set[str] = set()
    sources: list[str] = []
    for position, result in enumerate(sections):
        evidence = Evidence(store, result)
        _read_shown(evidence, result, tests, which, options.select_on)
        scored = [r for r in finished if r.id in result.values]
        scored_ids |= {r.id for r in scored}
        shown = scored + ([r for r in runs if r.id in lost] if position == 0 else [])  # the unfinished: first section
        labels = method_labels({r.id: r.spec for r in shown})
        by_row: dict[tuple[str, str, str], list[RunRecord]] = defaultdict(list)
        for r in shown:
            by_row[(model_name(r.spec), context_name(r.spec), labels[r.id])].append(r)
        section = "; ".join(result.sources) if len(sections) > 1 else ""
        in_section: dict[tuple[str, str], Group] = {}
        for (model, context, label), every in sorted(
            by_row.items(),
            key=lambda kv: (kv[0][0], CONTEXT_ORDER.get(kv[0][1], 9), kv[0][1], method_sort_key(kv[0][2])),
        ):
            members = [r for r in every if r.id not in lost]
            row = Row(
                label,
                method_base(every[0].spec),
                [r.name for r in members],
                seeds=[r.spec.get("seed") for r in members],
            )
            row.not_finished = [lost[r.id] for r in every if r.id in lost]
            for bench in tests:
                for kind in which:
                    cell = (
                        _cell(evidence, result, members, bench, kind, options.select_on, options.fixed_problems)
                        if members
                        else Cell()
                    )
                    cell.finished, cell.ran, cell.not_finished = len(members), len(every), tuple(row.not_finished)
                    row.cells[(bench, kind)] = cell
            if options.compare_paper and all(r.spec.get("optimizer") == "adamw" for r in every):
                _paper_cells(row, paper, model, context)
            in_section.setdefault((model, context), Group(model, context, [], section)).rows.append(row)
        groups += in_section.values()
        sources += result.sources + _starting_policy(result, scored, tests)
    if len(scored_ids) < len(finished):
        sources.append(f"not scored yet: {runs_text(len(finished) - len(scored_ids))}")
    table = Table(first.metric, tests, groups, sources, options.compare_paper, options.sweep, which, options.select_on)
    table.fixed_problems = options.fixed_problems
    for group in table.groups:
        _rank(group, table.columns)
    shown = {(o.scorer, o.k) for result in sections for o in result.origins.values()}
    stat = next(iter(first.origins.values())).stat
    table.notes = _notes(table) + not_shown(store, ids, stat, shown)
    return table


def _none_finished(lost: list[Unfinished]) -> str:
    """The one line for a table with no finished run."""
    return (
        f"no run has finished ({_states(lost)}): a table holds finished runs only; `rpg runs` shows where each one is"
    )


def _states(lost: Iterable[Unfinished]) -> str:
    """How many runs are in which state: '2 running, 1 diverged'."""
    states: dict[str, int] = defaultdict(int)
    for run in lost:
        states[run.state] += 1
    return ", ".join(f"{n} {state}" for state, n in states.items())


def _paper_cells(row: Row, paper: dict, model: str, context: str) -> None:
    """The paper's Last and Best (test-selected) beside ours: its tables are AdamW runs (the caller
    checks); a local copy of the paper's model (/models/Qwen3-4B) matches by its directory name."""
    for (bench, kind), cell in row.cells.items():
        if kind not in ("last", "best_test"):
            continue
        published = paper.get((model, context, row.base, bench)) or paper.get(
            (model.split("/")[-1], context, row.base, bench)
        )
        if published is not None:
            row.paper_method = row.base
            cell.paper = published[0 if kind == "last" else 1]
            cell.diff = None if cell.mean is None else cell.mean - cell.paper


def _cell(
    evidence: Evidence,
    result: Scores,
    members: list[RunRecord],
    bench: str,
    kind: str,
    select_on: str | None,
    fixed_problems: bool = False,
) -> Cell:
    """One method's cell: the runs' scores at their Last / val-selected / test-selected step, with the
    interval (evidence.cell_interval). One source per cell: the runs of its preferred source (`rpg
    eval` over logged validation; Origin.rank), the others left out and named."""
    scored = [r for r in members if bench in result.values[r.id]]
    if not scored:
        return Cell()
    origins = {r.id: result.origins[r.id] for r in scored}
    ranked = sorted(
        {o.source: o for o in origins.values()}.values(),
        key=lambda o: (o.rank, -sum(x.source == o.source for x in origins.values())),
    )
    have = [r.id for r in scored if origins[r.id].source == ranked[0].source]
    left_out = tuple(f"{r.name} ({origins[r.id].text()})" for r in scored if r.id not in have)
    cell = _scored_cell(evidence, result, have, bench, kind, select_on, fixed_problems)
    cell.left_out = left_out
    return cell


def _scored_cell(
    evidence: Evidence,
    result: Scores,
    have: list[str],
    bench: str,
    kind: str,
    select_on: str | None,
    fixed_problems: bool,
) -> Cell:
    if kind == "best_test":  # the maximum over steps: no single step, so no per-problem scores
        return _means_cell([result.values[r][bench].best for r in have], fixed_problems)
    picks, values = _picks(evidence, result, have, bench, kind, select_on)
    if not picks:
        return Cell()
    try:
        cell = Cell.of(cell_interval(evidence, picks, values, bench, fixed_problems))
    except stats.StatsError:  # not an accuracy (a reward in [-1, 1] logged as validation): no interval
        cell = Cell(statistics.fmean(values), n=len(values), covers=NO_ACCURACY)
    cell.steps = tuple(step for _, step in picks)
    return cell


def _picks(
    evidence: Evidence, result: Scores, have: Iterable[str], bench: str, kind: str, select_on: str | None
) -> tuple[list[Pick], list[float]]:
    """The (run, step) each run is scored at in a Last or Best (val-selected) column, with its score
    there: Last, its final evaluated step; val-selected, its step with the highest `select_on` score
    among those scored on `bench` too (the earliest on a tie)."""
    picks, values = [], []
    for r in have:
        if kind == "last":
            picks.append((r, result.values[r][bench].last_step))
            values.append(result.values[r][bench].last)
            continue
        selection, test = evidence.steps(r, select_on), evidence.steps(r, bench)
        candidates = [step for step in test if step in selection]
        if candidates:
            step = max(candidates, key=lambda s: (selection[s], -s))
            picks.append((r, step))
            values.append(test[step])
    return picks, values


def _read_shown(
    evidence: Evidence, result: Scores, tests: list[str], which: tuple[str, ...], select_on: str | None
) -> None:
    """Ask the store, once per benchmark, for the per-problem scores of only the steps the table's cells
    pick (Last, the val-selected step): never every checkpoint's samples."""
    for bench in tests:
        have = [r for r, by_bench in result.values.items() if bench in by_bench]
        picks = [
            p
            for kind in which
            if kind != "best_test"
            for p in _picks(evidence, result, have, bench, kind, select_on)[0]
        ]
        if picks:
            evidence.read(bench, wanted_steps(picks))


def _means_cell(values: list[float], fixed_problems: bool = False) -> Cell:
    try:
        return Cell.of(stats.score_from_means(values, fixed_problems=fixed_problems))
    except stats.StatsError:
        return Cell(statistics.fmean(values), n=len(values), covers=NO_ACCURACY)


# What each estimand means, once per footer: the words a reviewer needs to read the intervals.
ESTIMANDS = {
    stats.SEEDS_AND_PROBLEMS: (
        "intervals over new seeds and new problems: the score a new training run would get on new problems "
        "of the same kind, so a small benchmark keeps them wide however many seeds (--fixed-problems: these problems)"
    ),
    stats.THESE_PROBLEMS: (
        "intervals over new seeds, these problems (--fixed-problems): the score a new training run would get on "
        "these very problems, sampled anew; they say nothing about other problems"
    ),
}


def _notes(table: Table) -> list[str]:
    """The footer: what the numbers are, what their intervals are about (seeds, problems), and every
    cell that left runs out, mixes steps or covers less than it says."""
    notes = [f"cells: score ±half-width of its {stats.CONFIDENCE:.0%} confidence interval, in percent"]
    lost = [f"{row.who(run)}: {run.text()}" for group in table.groups for row in group.rows for run in row.not_finished]
    if lost:
        notes.append(
            "seeds: finished/ran; did not finish, so no score (each interval is over the seeds that finished): "
            + "; ".join(lost)
        )
    covers: dict[str, tuple[set[int], set[int]]] = {}
    caution, left_out, steps = [], [], []
    for group in table.groups:
        for row in group.rows:
            for (bench, kind), cell in row.cells.items():
                where = f"{row.method} {bench} {WHICH_TITLES[kind]}"
                if cell.left_out:
                    left_out.append(f"{where}: {', '.join(cell.left_out)}")
                if cell.mean is None:
                    continue
                seeds, problems = covers.setdefault(cell.covers, (set(), set()))
                seeds.add(cell.n)
                if cell.problems is not None:
                    problems.add(cell.problems)
                if cell.caution:
                    caution.append(where)
                if len(set(cell.steps)) > 1:
                    steps.append(f"{where} ({', '.join(map(str, sorted(set(cell.steps))))})")
    for covered, (seeds, problems) in covers.items():
        counts = _span(seeds, "seed") + (f" x {_span(problems, 'problem')}" if problems else "")
        what = "no interval" if covered in (*NO_INTERVAL, NO_ACCURACY) else f"interval over {covered}"
        notes.append(f"{what}: {counts}")
    notes += [ESTIMANDS[c] for c in ESTIMANDS if c in covers]
    if caution:
        notes.append(f"caution, {_listed(caution)}: {stats.CAUTION}")
    if steps:
        notes.append(f"runs at different steps, each counted at its own: {_listed(steps)}")
    if left_out:
        notes.append(
            "left out (scored there only by another source, never averaged in; evaluate them the same way): "
            + "; ".join(left_out)
        )
    if "best_val" in table.which:
        notes.append(
            f"Best (val-selected): each run's step with the highest {table.select_on} score, scored at that step"
        )
    else:
        notes.append(
            "Best (val-selected): pass --select-on BENCHMARK, a held-out benchmark to choose each run's step on"
        )
    if "best_test" in table.which:
        notes.append(
            "Best (test-selected): the maximum over the test benchmark's own evaluations (the paper's Best): biased upward"
        )
    return notes


def _listed(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def _span(values: set[int], unit: str) -> str:
    low, high = min(values), max(values)
    return f"{low} {unit}" + ("s" if high > 1 else "") if low == high else f"{low}-{high} {unit}s"


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


def _rank(group: Group, columns: list[tuple[str, str]]) -> None:
    """Bold the best mean of each column, underline the second; equal values (as printed) share a rank."""
    for column in columns:
        cells = [row.cells[column] for row in group.rows if row.cells[column].mean is not None]
        if len(cells) < 2:
            continue
        distinct = sorted({round(c.mean * SCALE, DIGITS) for c in cells}, reverse=True)
        for cell in cells:
            position = distinct.index(round(cell.mean * SCALE, DIGITS))
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
    """A score in [0, 1] as printed: a percentage with one decimal ('40.3'; signed: '+2.1' points)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x * SCALE:{'+' if signed else ''}.{DIGITS}f}"


def half_width(cell: Cell) -> float | None:
    return None if cell.low is None or cell.high is None else (cell.high - cell.low) / 2


def cell_bounds(cell: Cell) -> str:
    """'40.3 [36.9, 43.7]': the score and both bounds of its 95% interval (Markdown, LaTeX)."""
    if cell.mean is None or cell.low is None or cell.high is None:
        return fmt(cell.mean)
    return f"{fmt(cell.mean)} [{fmt(cell.low)}, {fmt(cell.high)}]"


def cell_text(cell: Cell, pm: str = "±") -> str:
    """'40.3 ±3.4' (± half the 95% interval's width; the bounds are in CSV/JSON), or '40.3' without one."""
    if cell.mean is None:
        return "-"
    hw = half_width(cell)
    return fmt(cell.mean) + ("" if hw is None else f" {pm}{fmt(hw)}")
