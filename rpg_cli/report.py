"""Tables and plots from the results store: the paper's Last/Best tables, training curves, run summaries.

Scores come from the `evals` table (`rpg eval`) and, for runs never evaluated that way, from the
validation metrics the trainer logged (`val-core/<data_source>/<var>/mean@k` in verl's names). The
heavy lifting (last and best value per run and benchmark) is one aggregate query; Python only
averages seeds. Rendering to text (Markdown, LaTeX, CSV, JSON) lives here; the terminal table is the
CLI's. matplotlib is imported only by the plotting functions.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import statistics
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from rpg_cli.store import RunRecord, Store


class ReportError(RuntimeError):
    """Input the report cannot use (no runs, unknown sweep, metric nobody logged); one-line message."""


# ------------------------------------------------------------------------------------------- names

BASE_METHOD_NAMES = {
    "grpo": "GRPO",
    "dapo": "DAPO",
    "reinforce_pp": "REINFORCE++",
    "reinforce_pp_baseline": "REINFORCE++-Baseline",
}
# Rows appear in the paper's order: baselines, then RPG and RPG-REINFORCE by KL variant.
METHOD_ORDER = [
    "GRPO", "GRPO-Corrected", "DAPO", "REINFORCE++", "REINFORCE++-Baseline",
    *(f"RPG-{kl}" for kl in ("FKL", "RKL", "UFKL", "URKL")),
    *(f"RPG-REINFORCE-{kl}" for kl in ("FKL", "RKL", "UFKL", "URKL")),
]  # fmt: skip
CONTEXT_ORDER = {"2K": 0, "4K": 1, "8K": 2}
# Spec fields that never name a method: they group rows (model, context), are averaged over (seed)
# or say where/how a run ran, not what it computed.
NOT_A_VARIANT = {"seed", "model", "context", "model_max_length", "data", "backend", "resources"}
OPTIMIZER_NAMES = {"adamw": "AdamW", "schedule_free": "Schedule-Free"}

# verl names validation sets by data_source; the paper's evaluation files use these.
BENCHMARK_ALIASES = {
    "math_dapo": "aime24",  # DAPO's AIME 2024 file keeps the training set's data_source
    "aime2024": "aime24",
    "aime_2024": "aime24",
    "aime-2024": "aime24",
    "aime2025": "aime25",
    "aime_2025": "aime25",
    "aime-2025": "aime25",
    "amc_23": "amc23",
    "amc2023": "amc23",
    "amc-23": "amc23",
}
BENCHMARK_ORDER = {"aime24": 0, "aime25": 1, "amc23": 2}


def benchmark_name(data_source: str) -> str:
    return BENCHMARK_ALIASES.get(data_source, data_source)


def method_base(spec: dict[str, Any]) -> str:
    """The paper's name of the algorithm a spec runs: GRPO, DAPO, RPG-UFKL, RPG-REINFORCE-URKL, ..."""
    alg = spec.get("algorithm", "?")
    if alg == "grpo" and spec.get("kl_correction"):
        return "GRPO-Corrected"
    if alg in BASE_METHOD_NAMES:
        return BASE_METHOD_NAMES[alg]
    kl = str(spec.get("kl", "")).upper()
    return {"rpg": f"RPG-{kl}", "rpg_reinforce": f"RPG-REINFORCE-{kl}"}.get(alg, str(alg))


def model_name(spec: dict[str, Any]) -> str:
    """The model as the paper writes it: a hub id without its owner (Qwen/Qwen3-4B -> Qwen3-4B); a
    local path by its last two parts (data/toy/model -> toy/model), the last alone often says nothing."""
    model = str(spec.get("model", "?")).rstrip("/")
    parts = model.split("/")
    is_hub_id = len(parts) == 2 and not model.startswith((".", "~"))
    return parts[-1] if is_hub_id or len(parts) == 1 else "/".join(parts[-2:])


def context_name(spec: dict[str, Any]) -> str:
    return str(spec.get("context", "?")).upper()


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
        fields = [_variant_fields(specs[i]) for i in ids]
        keys = sorted({k for f in fields for k in f})
        varying = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True) for f in fields}) > 1]
        # optimizer and clip first (the paper's own axes), then the rest alphabetically
        varying.sort(key=lambda k: ({"clip": 0, "optimizer": 1}.get(k, 2), k))
        for run_id, f in zip(ids, fields):
            parts = [_variant_text(k, f.get(k), [g.get(k) for g in fields]) for k in varying]
            labels[run_id] = f"{base} ({', '.join(parts)})" if parts else base
    return labels


def _method_sort_key(label: str) -> tuple[int, str]:
    base = label.split(" (", 1)[0]
    return (METHOD_ORDER.index(base) if base in METHOD_ORDER else len(METHOD_ORDER), label)


# ------------------------------------------------------------------------------------ run selection


def select_runs(store: Store, sweep: str | None = None) -> list[RunRecord]:
    """The runs a report covers (a sweep's, or all); ReportError naming what exists when there are none."""
    runs = store.runs(sweep=sweep)
    if runs:
        return runs
    if sweep is not None and (sweeps := store.sweeps()):
        raise ReportError(f"no sweep {sweep!r} in the results store; sweeps: {', '.join(sweeps)}")
    raise ReportError("the results store has no runs yet; run `rpg sweep SPEC` first (or pass --db URL)")


# ----------------------------------------------------------------------------------- score queries

_METRIC_RE = re.compile(r"^(mean|pass|maj)(?:@(k|\d+))?$")
# verl: val-core/<data_source>/<var>/mean@N and maj@N/mean. Its best@N is a bootstrap estimate, biased
# low, so it is never shown as pass@k: pass@k comes from `rpg eval` only.
_VAL_KEY_RE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>[^/]+)/(?P<stat>mean|maj)@(?P<k>\d+)(?:/mean)?$")
# The scorer under which `rpg eval` copies a run's logged validation metrics into `evals`, with
# verl's metric names (the value of rpg_cli.evaluation.verl_val.VERL_SCORER; not imported, to keep
# the report free of the evaluation package).
VERL_VAL_SCORER = "verl-val"
_VERL_VAL_METRICS = {"mean@k": "mean", "maj@k/mean": "maj"}


def parse_metric(metric: str) -> tuple[str, int | None]:
    """'mean@32' -> ('mean', 32); 'pass@k' or 'pass' -> ('pass', None): the largest k logged."""
    m = _METRIC_RE.match(metric.strip())
    if not m:
        raise ReportError(f"unknown metric {metric!r}; allowed: mean@K, pass@K, maj@K (K a number, or k for the largest logged)")
    k = m.group(2)
    return m.group(1), None if k in (None, "k") else int(k)


@dataclass(frozen=True)
class Score:
    last: float | None  # the value at the run's final evaluated step
    best: float | None  # the maximum over its evaluated steps
    last_step: int
    steps: int  # how many evaluated steps
    first_step: int | None = None
    first: float | None = None  # the value at the first evaluated step (step 0: the starting policy)


@dataclass
class Scores:
    """Per-run, per-benchmark Last/Best of one metric, and where they came from."""

    values: dict[str, dict[str, Score]]  # run id -> benchmark -> score
    sources: list[str]  # human-readable: "rpg eval (scorer dapo, mean@32): 12 runs"
    metric: str  # the resolved name, e.g. mean@32 (or mean@32/mean@4 when sources differ)


def _eval_stat(metric: str, scorer: str) -> str | None:
    """The table statistic (mean, pass, maj) an `evals` row holds; None for the others (std@k, ...)."""
    if scorer == VERL_VAL_SCORER:
        return _VERL_VAL_METRICS.get(metric)
    m = _METRIC_RE.match(metric)
    return m.group(1) if m else None


def _eval_names(stat: str, k: int, scorer: str) -> list[str]:
    if scorer == VERL_VAL_SCORER:
        return [name for name, s in _VERL_VAL_METRICS.items() if s == stat]
    return [f"{stat}@k", f"{stat}@{k}", stat]


def available_metrics(store: Store, run_ids: Sequence[str]) -> list[str]:
    """Every `stat@k` some run has a score for, from evals or logged validation metrics."""
    return sorted({f"{s}@{k}" for s, k, _ in _eval_combos(store, run_ids)} | {f"{s}@{k}" for s, k in _val_combos(store, run_ids)})


def _eval_combos(store: Store, run_ids: Sequence[str]) -> set[tuple[str, int, str]]:
    """(stat, k, scorer) of the table statistics in `evals` for these runs."""
    import sqlalchemy as sa

    e = store.t.evals.c
    query = sa.select(e.metric, e.k, e.scorer).where(e.run_id.in_(list(run_ids))).distinct()
    with store.engine.connect() as conn:
        rows = list(conn.execute(query))
    return {(stat, k, scorer) for metric, k, scorer in rows if (stat := _eval_stat(metric, scorer)) is not None}


# Distinct val-core keys by a "skip scan": per run, hop from one key to the next greater one through
# the (run_id, key, step) primary key, so the cost is one index seek per distinct key, not a scan of
# every logged step (a plain DISTINCT reads all 400 steps x all val keys of every run).
_VAL_KEYS_SQL = """
WITH RECURSIVE found(run_id, key) AS (
    SELECT r.id, (SELECT MIN(m.key) FROM metrics m WHERE m.run_id = r.id AND m.key >= :lo AND m.key < :hi)
    FROM runs r WHERE r.id IN :ids
    UNION ALL
    SELECT f.run_id, (SELECT MIN(m.key) FROM metrics m WHERE m.run_id = f.run_id AND m.key > f.key AND m.key < :hi)
    FROM found f WHERE f.key IS NOT NULL
)
SELECT DISTINCT key FROM found WHERE key IS NOT NULL
"""


def _val_keys(store: Store, run_ids: Sequence[str]) -> list[str]:
    """Every val-core/... key logged by any of the runs."""
    import sqlalchemy as sa

    if not run_ids:
        return []
    query = sa.text(_VAL_KEYS_SQL).bindparams(sa.bindparam("ids", expanding=True))
    with store.engine.connect() as conn:
        return sorted(conn.execute(query, {"ids": list(run_ids), "lo": "val-core/", "hi": "val-core0"}).scalars())


def _val_combos(store: Store, run_ids: Sequence[str]) -> set[tuple[str, int]]:
    out = set()
    for key in _val_keys(store, run_ids):
        if (m := _VAL_KEY_RE.match(key)) is not None:
            out.add((m["stat"], int(m["k"])))
    return out


def _last_and_best(store: Store, table: Any, group_col: Any, filters: list[Any]) -> list[tuple[str, str, int, int, float | None, float | None, int, float | None]]:
    """(run_id, group, last step, count, last value, best value, first step, first value) per (run, group)
    over the rows that pass `filters`, aggregated in the database: min/max(step) and max(value), then the
    values at those steps."""
    import sqlalchemy as sa

    c = table.c
    agg = (
        sa.select(
            c.run_id.label("run_id"),
            group_col.label("grp"),
            sa.func.max(c.step).label("last_step"),
            sa.func.count(c.value).label("n"),
            sa.func.max(c.value).label("best"),
            sa.func.min(c.step).label("first_step"),
        )
        .where(*filters)
        .group_by(c.run_id, group_col)
        .subquery()
    )
    first = table.alias("first")
    f = first.c
    f_group = getattr(f, group_col.key)
    query = (
        sa.select(agg.c.run_id, agg.c.grp, agg.c.last_step, agg.c.n, c.value, agg.c.best, agg.c.first_step, f.value)
        .select_from(agg)
        .join(table, sa.and_(c.run_id == agg.c.run_id, group_col == agg.c.grp, c.step == agg.c.last_step, *filters))
        .join(first, sa.and_(f.run_id == agg.c.run_id, f_group == agg.c.grp, f.step == agg.c.first_step,
                             *_same_filters(filters, table, first)))
    )
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(query)]


def _same_filters(filters: list[Any], table: Any, alias: Any) -> list[Any]:
    """`filters` written against `table`, restated against its `alias`."""
    import sqlalchemy as sa

    adapter = sa.sql.util.ClauseAdapter(alias)
    return [adapter.traverse(clause) for clause in filters]


def scores(store: Store, run_ids: Sequence[str], metric: str = "mean@k") -> Scores:
    """Last and Best of `metric` for each run and benchmark, from the best source each run has:
    `rpg eval` scores (the scorer with the most rows when there are several), else its logged
    validation metrics (as `rpg eval` copied them into `evals`, else straight from `metrics`).
    ReportError listing what exists when no run has the metric."""
    stat, k = parse_metric(metric)
    run_ids = list(run_ids)
    values: dict[str, dict[str, Score]] = {}
    sources, resolved = [], []
    combos = [c for c in _eval_combos(store, run_ids) if c[0] == stat and (k is None or c[1] == k)]
    e = store.t.evals.c

    own = [c for c in combos if c[2] != VERL_VAL_SCORER]
    if own:
        k_eval = k if k is not None else max(c[1] for c in own)
        scorer = _most_rows_scorer(store, run_ids, stat, k_eval, sorted({c[2] for c in own if c[1] == k_eval}))
        filters = [e.run_id.in_(run_ids), e.metric.in_(_eval_names(stat, k_eval, scorer)), e.k == k_eval,
                   e.scorer == scorer, e.value.is_not(None)]  # fmt: skip
        for run_id, bench, last_step, n, last, best, first_step, first in _last_and_best(store, store.t.evals, e.benchmark, filters):
            values.setdefault(run_id, {})[bench] = Score(last, best, last_step, n, first_step, first)
        sources.append(f"rpg eval (scorer {scorer}, {stat}@{k_eval}): {_runs(len(values))}")
        resolved.append(f"{stat}@{k_eval}")

    rest = [r for r in run_ids if r not in values]
    copied = [c for c in combos if c[2] == VERL_VAL_SCORER]
    if rest and copied:
        k_val = k if k is not None else max(c[1] for c in copied)
        filters = [e.run_id.in_(rest), e.metric.in_(_eval_names(stat, k_val, VERL_VAL_SCORER)), e.k == k_val,
                   e.scorer == VERL_VAL_SCORER, e.value.is_not(None)]  # fmt: skip
        found: set[str] = set()
        for run_id, source, last_step, n, last, best, first_step, first in _last_and_best(store, store.t.evals, e.benchmark, filters):
            values.setdefault(run_id, {})[benchmark_name(source)] = Score(last, best, last_step, n, first_step, first)
            found.add(run_id)
        if found:
            sources.append(f"training validation ({stat}@{k_val}): {_runs(len(found))}")
            resolved.append(f"{stat}@{k_val}")

    rest = [r for r in run_ids if r not in values]
    by_key = _pick_val_keys(_val_keys(store, rest), stat, k) if rest else {}
    if by_key:
        m = store.t.metrics.c
        filters = [m.run_id.in_(rest), m.key.in_(list(by_key)), m.value.is_not(None)]
        found = set()
        for run_id, key, last_step, n, last, best, first_step, first in _last_and_best(store, store.t.metrics, m.key, filters):
            values.setdefault(run_id, {})[by_key[key]] = Score(last, best, last_step, n, first_step, first)
            found.add(run_id)
        label = "/".join(f"{stat}@{kk}" for kk in sorted({int(_VAL_KEY_RE.match(key)["k"]) for key in by_key}))
        sources.append(f"training validation ({label}): {_runs(len(found))}")
        resolved.append(label)
    if not values:
        have = available_metrics(store, run_ids)
        if have:
            raise ReportError(f"no run has {metric} scores; logged: {', '.join(have)} (pass one with --metric)")
        raise ReportError(
            "no evaluation scores yet: no `rpg eval` results and no val-core metrics logged for these runs; "
            "run `rpg eval RUN` (or train with validation on)"
        )
    return Scores(values, sources, "/".join(dict.fromkeys(resolved)))


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _most_rows_scorer(store: Store, run_ids: list[str], stat: str, k: int, scorers: list[str]) -> str:
    if len(scorers) == 1:
        return scorers[0]
    import sqlalchemy as sa

    e = store.t.evals.c
    query = (
        sa.select(e.scorer, sa.func.count())
        .where(e.run_id.in_(run_ids), e.k == k, e.scorer.in_(scorers), e.metric.in_(_eval_names(stat, k, "")))
        .group_by(e.scorer)
    )
    with store.engine.connect() as conn:
        counts = dict(conn.execute(query).all())
    return max(scorers, key=lambda s: (counts.get(s, 0), s == scorers[0]))


def _pick_val_keys(keys: Iterable[str], stat: str, k: int | None) -> dict[str, str]:
    """{val-core key: benchmark} for one stat: per data source the 'acc' variable when logged (verl's
    core variable; else the first), and the wanted k (else the largest logged)."""
    found: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    for key in keys:
        m = _VAL_KEY_RE.match(key)
        if m and m["stat"] == stat and (k is None or int(m["k"]) == k):
            found[m["source"]].append((m["var"], int(m["k"]), key))
    out = {}
    for source, options in found.items():
        var = "acc" if any(v == "acc" for v, _, _ in options) else sorted(v for v, _, _ in options)[0]
        out[max((kk, key) for v, kk, key in options if v == var)[1]] = benchmark_name(source)
    return out


# ------------------------------------------------------------------------------------------ tables

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
            raise ReportError(f"no {result.metric} scores for benchmark {', '.join(unknown)}; scored: {', '.join(logged)}")
        logged = list(benchmarks)
    labels = method_labels({r.id: r.spec for r in scored})
    by_row: dict[tuple[str, str, str], list[RunRecord]] = defaultdict(list)
    for r in scored:
        by_row[(model_name(r.spec), context_name(r.spec), labels[r.id])].append(r)
    paper = paper_results() if compare_paper else {}
    groups: dict[tuple[str, str], Group] = {}
    for (model, context, label), members in sorted(
        by_row.items(), key=lambda kv: (kv[0][0], CONTEXT_ORDER.get(kv[0][1], 9), kv[0][1], _method_sort_key(kv[0][2]))
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
                published = paper.get((model, context, base, bench)) or paper.get((model.split("/")[-1], context, base, bench))
                if published is not None:
                    row.paper_method = base
                    cell.paper = published[WHICH.index(which)]
                    cell.diff = None if cell.mean is None else cell.mean - cell.paper
        groups.setdefault((model, context), Group(model, context, [])).rows.append(row)
    sources = result.sources + ([f"not scored yet: {_runs(len(runs) - len(scored))}"] if len(scored) < len(runs) else [])
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
    return [f"starting policy (step 0) on {model} {context}: {', '.join(parts)}" for (model, context), parts in by_group.items()]


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


# ---------------------------------------------------------------------------------------- renderers


def fmt(x: float | None, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def cell_text(cell: Cell) -> str:
    """'0.4031' or '0.4031 ± 0.0123' (the ± part when several seeds have a value)."""
    if cell.mean is None:
        return "-"
    return fmt(cell.mean) + (f" ± {fmt(cell.std)}" if cell.std is not None else "")


def column_title(bench: str, which: str) -> str:
    return f"{bench} {which.capitalize()}"


def title(table: Table) -> str:
    return f"{table.sweep or 'all runs'}: {table.metric}, Last/Best over evaluated steps"


def to_markdown(table: Table) -> str:
    """One Markdown table per model and context; best of each column **bold**, second <u>underlined</u>."""
    out = [f"## {title(table)}", ""]
    for group in table.groups:
        header = ["Method", "Seeds"]
        for bench, which in table.columns:
            header.append(column_title(bench, which))
            if table.compare_paper:
                header += ["paper", "Δ"]
        out += [f"### {group.model} · {group.context}", "", "| " + " | ".join(header) + " |",
                "|" + "|".join([":---", "---:"] + ["---:"] * (len(header) - 2)) + "|"]  # fmt: skip
        for row in group.rows:
            line = [_md_escape(row.method), str(len(row.runs))]
            for column in table.columns:
                cell = row.cells[column]
                text = cell_text(cell)
                line.append(f"**{text}**" if cell.rank == 1 else f"<u>{text}</u>" if cell.rank == 2 else text)
                if table.compare_paper:
                    line += [fmt(cell.paper), fmt(cell.diff, signed=True)]
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    out.append("Sources: " + "; ".join(table.sources) + ".")
    return "\n".join(out) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


_LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}"}  # fmt: skip


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def to_latex(table: Table) -> str:
    """A booktabs `table` environment: one row per method, a group header per model and context."""
    per_column = 3 if table.compare_paper else 1
    ncols = 2 + per_column * len(table.columns)
    spec = "lr" + "c" * (ncols - 2)
    lines = [
        "% needs \\usepackage{booktabs}",
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{{latex_escape(title(table))}}}",
        f"\\begin{{tabular}}{{{spec}}}",
        "\\toprule",
    ]
    top = [" ", " "] + [f"\\multicolumn{{{2 * per_column}}}{{c}}{{{latex_escape(b)}}}" for b in table.benchmarks]
    lines.append(" & ".join(top) + " \\\\")
    second = ["Method", "Seeds"]
    for _, which in table.columns:
        second.append(which.capitalize())
        if table.compare_paper:
            second += ["Paper", "$\\Delta$"]
    lines.append(" & ".join(second) + " \\\\")
    for group in table.groups:
        lines.append("\\midrule")
        lines.append(f"\\multicolumn{{{ncols}}}{{l}}{{\\textit{{{latex_escape(group.model)}, {latex_escape(group.context)}}}}} \\\\")
        for row in group.rows:
            cells = [latex_escape(row.method), str(len(row.runs))]
            for column in table.columns:
                cell = row.cells[column]
                text = "--" if cell.mean is None else fmt(cell.mean) + (f" $\\pm$ {fmt(cell.std)}" if cell.std is not None else "")
                cells.append(f"\\textbf{{{text}}}" if cell.rank == 1 else f"\\underline{{{text}}}" if cell.rank == 2 else text)
                if table.compare_paper:
                    cells += [fmt(cell.paper).replace("-", "--"), "--" if cell.diff is None else f"${fmt(cell.diff, signed=True)}$"]
            lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def table_records(table: Table) -> list[dict[str, Any]]:
    """One flat dict per row: model, context, method, seeds, runs, then per benchmark and Last/Best
    the mean, std, rank (and paper, diff with --compare-paper)."""
    records = []
    for group in table.groups:
        for row in group.rows:
            rec: dict[str, Any] = {"model": group.model, "context": group.context, "method": row.method,
                                   "seeds": len(row.runs), "runs": " ".join(row.runs)}  # fmt: skip
            for (bench, which), cell in row.cells.items():
                prefix = f"{bench}_{which}"
                rec[f"{prefix}_mean"], rec[f"{prefix}_std"], rec[f"{prefix}_rank"] = cell.mean, cell.std, cell.rank
                if table.compare_paper:
                    rec[f"{prefix}_paper"], rec[f"{prefix}_diff"] = cell.paper, cell.diff
            records.append(rec)
    return records


def to_csv(table: Table) -> str:
    records = table_records(table)
    buf = io.StringIO()
    if records:
        writer = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
        writer.writeheader()
        for rec in records:
            writer.writerow({k: "" if v is None else v for k, v in rec.items()})
    return buf.getvalue()


def to_json(table: Table) -> str:
    doc = {
        "sweep": table.sweep,
        "metric": table.metric,
        "benchmarks": table.benchmarks,
        "sources": table.sources,
        "groups": [
            {
                "model": g.model,
                "context": g.context,
                "rows": [
                    {
                        "method": row.method,
                        "base": row.base,
                        "paper_method": row.paper_method,
                        "runs": row.runs,
                        "cells": {
                            bench: {
                                which: {k: getattr(row.cells[(bench, which)], k) for k in ("mean", "std", "n", "rank", "paper", "diff")}
                                for which in WHICH
                            }
                            for bench in table.benchmarks
                        },
                    }
                    for row in g.rows
                ],
            }
            for g in table.groups
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


RENDERERS = {"markdown": to_markdown, "latex": to_latex, "csv": to_csv, "json": to_json}
FORMAT_BY_SUFFIX = {".md": "markdown", ".markdown": "markdown", ".tex": "latex", ".csv": "csv", ".json": "json"}


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write a file whole or not at all (temp file in the same directory + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ------------------------------------------------------------------------------------------- plots

# Panel name -> the verl keys it shows, first one any run logged wins (so one panel never mixes two).
PLOT_METRICS: dict[str, tuple[str, ...]] = {
    "reward": ("critic/score/mean",),
    "entropy": ("actor/entropy",),
    "response_length": ("response_length/mean",),
    "kl": ("actor/kl_loss", "actor/ppo_kl"),
    "reference_kl": ("ref/kl",),
    "reference_age": ("ref/steps_since_reset",),
}
PLOT_LABELS = {
    "critic/score/mean": "reward (mean score)",
    "actor/entropy": "entropy",
    "response_length/mean": "response length (tokens)",
    "actor/kl_loss": "KL loss",
    "actor/ppo_kl": "KL(π_old ‖ π) (ppo_kl)",
    "ref/kl": "KL(π_old ‖ π_ref), token mean of k3",
    "ref/steps_since_reset": "steps since the reference was reset",
}
DEFAULT_PLOT_METRICS = ("reward", "entropy", "response_length", "kl", "reference_kl", "reference_age", "val")


@dataclass
class Panel:
    title: str
    key: str  # the metrics key it plots
    ylabel: str


def plot_panels(store: Store, run_ids: Sequence[str], metrics: Sequence[str], strict: bool = True) -> list[Panel]:
    """Resolve panel names (reward, entropy, response_length, kl, reference_kl, reference_age, val, or any
    logged key) to keys; `val` becomes one panel per validation benchmark. ReportError when a name has
    nothing logged (with strict=False: only when none has)."""
    import sqlalchemy as sa

    m = store.t.metrics.c
    wanted = {key for name in metrics for key in PLOT_METRICS.get(name, (name,))}
    with store.engine.connect() as conn:
        logged = set(conn.execute(sa.select(m.key).where(m.run_id.in_(list(run_ids)), m.key.in_(sorted(wanted))).distinct()).scalars())
    panels, missing = [], []
    for name in metrics:
        if name == "val":
            val = _pick_val_keys(_val_keys(store, run_ids), "mean", None)
            if not val:
                missing.append(name)
            for key, bench in sorted(val.items(), key=lambda kv: (BENCHMARK_ORDER.get(kv[1], 99), kv[1])):
                stat = _VAL_KEY_RE.match(key)
                panels.append(Panel(f"val {bench}", key, f"{bench} mean@{stat['k']}"))
            continue
        key = next((k for k in PLOT_METRICS.get(name, (name,)) if k in logged), None)
        if key is None:
            missing.append(name)
        else:
            panels.append(Panel(name.replace("_", " "), key, PLOT_LABELS.get(key, key)))
    if missing and (strict or not panels):
        raise ReportError(
            f"nothing logged for {', '.join(missing)}; plottable: "
            + ", ".join(sorted(_plottable(store, run_ids)))
        )
    return panels


def _plottable(store: Store, run_ids: Sequence[str]) -> set[str]:
    import sqlalchemy as sa

    m = store.t.metrics.c
    keys = {key for name in PLOT_METRICS for key in PLOT_METRICS[name]}
    with store.engine.connect() as conn:
        logged = set(conn.execute(sa.select(m.key).where(m.run_id.in_(list(run_ids)), m.key.in_(sorted(keys))).distinct()).scalars())
    names = {name for name, ks in PLOT_METRICS.items() if logged & set(ks)}
    return names | ({"val"} if _pick_val_keys(_val_keys(store, run_ids), "mean", None) else set()) or {"nothing yet"}


def series(store: Store, run_ids: Sequence[str], keys: Sequence[str]) -> dict[tuple[str, str], tuple[list[int], list[float]]]:
    """{(run id, key): (steps, values)} in step order; NaN (NULL) values are left out."""
    import sqlalchemy as sa

    m = store.t.metrics.c
    query = (
        sa.select(m.run_id, m.key, m.step, m.value)
        .where(m.run_id.in_(list(run_ids)), m.key.in_(list(keys)), m.value.is_not(None))
        .order_by(m.run_id, m.key, m.step)
    )
    out: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    with store.engine.connect() as conn:
        for run_id, key, step, value in conn.execute(query):
            steps, values = out.setdefault((run_id, key), ([], []))
            steps.append(step)
            values.append(value)
    return out


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


def run_labels(runs: Sequence[RunRecord]) -> dict[str, str]:
    """A legend label per run: its method, plus model, context and seed where the runs differ in them."""
    labels = method_labels({r.id: r.spec for r in runs})
    varies = {k: len({str(r.spec.get(k)) for r in runs}) > 1 for k in ("model", "context", "seed")}
    out = {}
    for r in runs:
        parts = [labels[r.id]]
        if varies["model"]:
            parts.append(model_name(r.spec))
        if varies["context"]:
            parts.append(context_name(r.spec))
        if varies["seed"]:
            parts.append(f"seed {r.spec.get('seed')}")
        out[r.id] = " · ".join(parts)
    return out


def plot_training(
    store: Store,
    sweep: str | None = None,
    metrics: Sequence[str] = DEFAULT_PLOT_METRICS,
    smooth_window: int = 1,
    strict: bool = True,
) -> Figure:
    """Training dynamics: one panel per metric (val: per benchmark), one line per run, shared legend
    below the panels. With strict=False, metrics nobody logged are left out instead of an error.
    Uses matplotlib's Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    runs = select_runs(store, sweep)
    ids = [r.id for r in runs]
    panels = plot_panels(store, ids, metrics, strict)
    data = series(store, ids, sorted({p.key for p in panels}))
    labels = run_labels(runs)
    order = sorted(runs, key=lambda r: (_method_sort_key(labels[r.id].split(" · ")[0]), labels[r.id]))
    colors = matplotlib.colormaps["tab10" if len(order) <= 10 else "tab20"]

    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.3 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        for i, run in enumerate(order):
            if (run.id, panel.key) not in data:
                continue
            steps, values = data[(run.id, panel.key)]
            ax.plot(steps, smooth(values, smooth_window), label=labels[run.id], color=colors(i % colors.N), linewidth=1.4)
        ax.set_title(panel.title)
        ax.set_xlabel("training step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles, names = [], []
    for ax in axes[: len(panels)]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            if name not in names:
                handles.append(handle)
                names.append(name)
    fig.legend(handles, names, loc="outside lower center", ncols=min(4, max(1, len(names))), frameon=False)
    fig.suptitle(f"{sweep or 'all runs'}: training dynamics" + (f" (moving average over {smooth_window} steps)" if smooth_window > 1 else ""))
    return fig


def save_figure(fig: Figure, out_dir: str | Path, stem: str) -> list[Path]:
    """Write `<out_dir>/<stem>.png` and `.svg` atomically; returns their paths."""
    paths = []
    for ext in ("png", "svg"):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=150 if ext == "png" else None)
        paths.append(write_atomic(Path(out_dir) / f"{stem}.{ext}", buf.getvalue()))
    return paths


# -------------------------------------------------------------------------------------- run summary

REWARD_KEY = "critic/score/mean"


def parse_where(clauses: Sequence[str]) -> list[tuple[str, bool, list[str]]]:
    """`field=value[,value...]` or `field!=value[,...]` (dotted paths reach nested fields: clip.eps_low)
    -> (path, negated, values). ReportError naming the spec fields when a field is unknown."""
    from rpg_cli.spec import ExperimentSpec

    out = []
    for clause in clauses:
        m = re.match(r"^\s*([A-Za-z_][\w.]*)\s*(!=|=)\s*(.*?)\s*$", clause)
        if not m:
            raise ReportError(f"--where {clause!r}: expected FIELD=VALUE or FIELD!=VALUE (VALUE may be a comma list)")
        path, op, value = m.groups()
        if path.split(".")[0] not in ExperimentSpec.model_fields:
            raise ReportError(f"--where {clause!r}: no spec field {path.split('.')[0]!r}; fields: {', '.join(ExperimentSpec.model_fields)}")
        out.append((path, op == "!=", [v.strip() for v in value.split(",")]))
    return out


def _spec_value(spec: dict[str, Any], path: str) -> Any:
    value: Any = spec
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _value_matches(actual: Any, wanted: str) -> bool:
    w = wanted.lower()
    if actual is None:
        return w in ("none", "null", "off", "")
    if isinstance(actual, bool):
        return w == str(actual).lower()
    if isinstance(actual, (int, float)):
        try:
            return float(wanted) == float(actual)
        except ValueError:
            return False
    if isinstance(actual, (dict, list)):
        return w == json.dumps(actual, sort_keys=True).lower() or (w == "on" and bool(actual))
    return str(actual) == wanted


def spec_matches(spec: dict[str, Any], where: Sequence[tuple[str, bool, list[str]]]) -> bool:
    for path, negated, values in where:
        hit = any(_value_matches(_spec_value(spec, path), v) for v in values)
        if hit == negated:
            return False
    return True


def runs_summary(
    store: Store,
    sweep: str | None = None,
    status: Sequence[str] | None = None,
    where: Sequence[str] = (),
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """The columns a user scans first, one dict per run: sweep, name, id, status, attempts, step (last
    step logged), reward (last critic/score/mean), val (the mean over benchmarks of each one's last
    val-core mean@k), wall_s (finished or now, minus started), started, finished, error."""
    filters = parse_where(where)
    runs = [r for r in store.runs(sweep=sweep, status=list(status) if status else None) if spec_matches(r.spec, filters)]
    ids = [r.id for r in runs]
    steps = store.last_steps(ids) if ids else {}
    val_keys = _pick_val_keys(_val_keys(store, ids), "mean", None) if ids else {}
    latest = store.latest_values(ids, [REWARD_KEY, *val_keys]) if ids else {}
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    out = []
    for r in runs:
        values = latest.get(r.id, {})
        reward = values.get(REWARD_KEY, (None, None))[1]
        vals = [values[k][1] for k in val_keys if k in values and values[k][1] is not None]
        end = r.finished_at or (now if r.status in ("running", "submitted") else None)
        wall = (end - r.started_at).total_seconds() if r.started_at and end else None
        out.append({
            "sweep": r.sweep, "name": r.name, "id": r.id, "status": r.status, "attempts": r.attempts,
            "step": steps.get(r.id), "reward": reward, "val": statistics.fmean(vals) if vals else None,
            "wall_s": wall, "started": r.started_at.isoformat(sep=" ", timespec="seconds") if r.started_at else None,
            "finished": r.finished_at.isoformat(sep=" ", timespec="seconds") if r.finished_at else None,
            "error": r.error,
        })  # fmt: skip
    return out


def summary_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    fields = list(rows[0]) if rows else ["sweep", "name", "id", "status", "attempts", "step", "reward", "val", "wall_s", "started", "finished", "error"]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def wall_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
