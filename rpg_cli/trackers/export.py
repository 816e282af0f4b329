"""`rpg export --to wandb|tensorboard|mlflow`: what the results store holds, pushed to a tracker, for
runs that were not tracked live (a cluster without internet access, a tracker added afterwards).

Per run: every metric at its step under metrics.jsonl's (verl's) names, the evals at their checkpoint
steps (`eval_metrics`, with their problem-sampling intervals: `with_intervals`), the spec as config, and
the group and tags a live run gets (the sweep's varying fields are computed over the sweep's runs in the
store). Settings: the options given, else the run's
own `trackers` block, else the defaults of a live run (rpg_cli.trackers.runs.resolve).

Exporting twice creates no duplicates: W&B resumes the run's id (`rpg-<run id>`) and logs only steps
after the ones it has (offline: the new offline run directory replaces the earlier export's), MLflow
finds the run by its `rpg.run_id` tag and logs only (metric, step) pairs it lacks, TensorBoard's log
dir is written aside and swapped in whole.

Each writes in bulk, a run's whole history at once: TensorBoard one event per step straight into the
event file (tensorboard.EventFile, ~25x faster than torch's writer, value for value the same), MLflow
MLFLOW_METRICS_PER_BATCH values per log_batch across steps (mlflow.MlflowWriter, batched), W&B one `log`
per step (its only history API) without recording the exporting machine. Sampled problems are read only
at the steps of the evals that get an interval (`interval_scores`).

A tracker's server is asked first (`Tracker.check`, within `ExportOptions.timeout`): one that does not
answer stops the export with one line before anything is written, instead of the libraries' minutes of
retries. A run that fails midway stops it with one line saying how many runs went; run it again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rpg_cli import stats
from rpg_cli.spec import Trackers
from rpg_cli.store.schema import PROTOCOL
from rpg_cli.trackers import TRACKERS
from rpg_cli.trackers.base import ExportOptions, RunInfo, TrackerError, first_line
from rpg_cli.trackers.runs import axis_tags, require, run_info

if TYPE_CHECKING:
    from rpg_cli.store import RunRecord, Store

__all__ = ["ExportOptions", "Exported", "eval_metrics", "export", "history", "with_intervals"]

# Evals the store copied from the run's own validation metrics: exported already under their metric names.
SKIPPED_SCORERS = ("verl-val",)


@dataclass(frozen=True)
class Exported:
    sweep: str
    name: str
    steps: int  # steps written (0: the run has nothing recorded, skipped)
    metrics: int  # distinct metric names written
    where: str


def eval_metrics(rows: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """Eval rows of the store as tracker metrics: {checkpoint step: {`eval/<benchmark>/<scorer>/<metric@k>`: value}}.

    The one place eval rows become tracker values. Scores of one run under several sampling protocols
    (schema.PROTOCOL) never share a key: the protocol with the most rows keeps the plain keys, the others
    get theirs as a part before the metric (`.../dapo/n8_T0.6_top_p0.95_max1024_seed0/mean@8`). No key is
    another's prefix (`mean@8` beside `mean@8/...`): MLflow's file store keeps a key as a file path.
    """
    rows = [row for row in rows if row["scorer"] not in SKIPPED_SCORERS]
    counts: dict[str, int] = {}
    for row in rows:
        counts[protocol_tag(row)] = counts.get(protocol_tag(row), 0) + 1
    plain = min(counts, key=lambda tag: (-counts[tag], tag)) if counts else None
    out: dict[int, dict[str, float]] = {}
    for row in rows:
        metric = str(row["metric"]).replace("@k", f"@{row['k']}")
        tag = protocol_tag(row)
        key = f"eval/{row['benchmark']}/{row['scorer']}/{'' if tag == plain else tag + '/'}{metric}"
        out.setdefault(int(row["step"]), {})[key] = math.nan if row["value"] is None else float(row["value"])
    return out


def protocol_tag(row: Mapping[str, Any]) -> str:
    """How an eval's samples were drawn, as one key part: n8_T0.6_top_p0.95_max1024_seed0."""
    return f"n{row['n']}_T{row['temperature']:g}_top_p{row['top_p']:g}_max{row['max_tokens']}_seed{row['seed']}"


def with_intervals(evals: list[Mapping[str, Any]], problems: Iterable[Any]) -> list[Mapping[str, Any]]:
    """The eval rows, and for each mean@n (k = n) whose samples are stored (`Store.problem_scores`) the
    bounds of its 95% interval as rows `mean@k_ci_low` and `mean@k_ci_high`: one run's evaluation, so
    the interval covers the sampling of the benchmark's problems (rpg_cli.stats; seeds: `rpg report`)."""
    by_eval: dict[tuple[Any, ...], list[float]] = {}
    for p in problems:
        by_eval.setdefault((p.step, p.benchmark, p.scorer, *(getattr(p, n) for n in PROTOCOL)), []).append(p.accuracy)
    out = list(evals)
    for row in evals:
        if not has_interval(row):
            continue
        accuracy = by_eval.get((row["step"], row["benchmark"], row["scorer"], *(row[n] for n in PROTOCOL)))
        if accuracy is None or len(accuracy) < 2:
            continue
        interval = stats.score(stats.Runs({"b": np.array([accuracy])}), "b")
        out += [
            {**row, "metric": f"{row['metric']}_ci_{side}", "value": value}
            for side, value in (("low", interval.low), ("high", interval.high))
        ]
    return out


def has_interval(row: Mapping[str, Any]) -> bool:
    """An eval row `with_intervals` gives an interval to (when its samples are stored): a mean@n, k = n."""
    return str(row["metric"]).startswith("mean@") and row["k"] == row["n"] and row["value"] is not None


def interval_scores(store: Store, run_id: str, evals: Iterable[Mapping[str, Any]]) -> list[Any]:
    """The per-problem scores `with_intervals` reads for one run's evals: only at the steps of its mean@n
    rows (a run's other sampled steps are not read), and no query at all when it has none."""
    steps = {int(row["step"]) for row in evals if has_interval(row)}
    return store.problem_scores([run_id], steps={run_id: steps}) if steps else []


def eval_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each eval metric at its last checkpoint: a tracker's run summary."""
    summary: dict[str, float] = {}
    for _, values in sorted(eval_metrics(rows).items()):
        summary.update(values)
    return summary


def history(
    metrics: Mapping[int, Mapping[str, float | None]], evals: list[Mapping[str, Any]]
) -> dict[int, dict[str, float]]:
    """{step: {key: value}}: the run's metrics (NULL, the store's NaN, back to NaN) and its evals."""
    steps: dict[int, dict[str, float]] = {}
    for step, values in metrics.items():
        steps[step] = {k: math.nan if v is None else float(v) for k, v in values.items()}
    for step, values in eval_metrics(evals).items():
        steps.setdefault(step, {}).update(values)
    return dict(sorted(steps.items()))


def settings(to: str, run: RunRecord, options: ExportOptions) -> Trackers:
    """The run's own trackers block (if it was tracked live) with `to` switched on and the options applied."""
    base = Trackers.model_validate(run.spec.get("trackers") or {})
    own = TRACKERS[to].export_settings(getattr(base, to), options)
    return base.model_copy(update={to: own, **({"project": options.project} if options.project else {})})


def export(
    store: Store,
    to: str,
    sweep: str | None = None,
    options: ExportOptions = ExportOptions(),
    on_run: Callable[[int, int, Exported], None] | None = None,
) -> list[Exported]:
    """Export the runs of `sweep` (all runs when None) to tracker `to`; returns one Exported per run,
    each also given to `on_run(i, n, exported)` (the i-th of n) as soon as it is written."""
    if to not in TRACKERS:
        raise TrackerError(f"unknown tracker {to!r}; allowed: {', '.join(TRACKERS)}")
    runs = store.runs(sweep=sweep)
    if not runs:
        where = f"of sweep {sweep!r} " if sweep else ""
        raise TrackerError(f"no runs {where}in the store; `rpg runs` lists what it holds")
    require(settings(to, runs[0], options))
    by_sweep: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_sweep.setdefault(run.sweep, []).append(run)
    planned: list[tuple[RunRecord, RunInfo]] = []
    for sweep_name, group in by_sweep.items():
        members = group if sweep is not None else store.runs(sweep=sweep_name)
        axes = dict(zip([r.id for r in members], axis_tags([r.spec for r in members])))
        for run in group:
            own = settings(to, run, options)
            planned.append(
                (run, run_info(run.spec, run.id, run.name, run.sweep, run.run_dir, own, axes.get(run.id, [])))
            )
    tracker = TRACKERS[to]
    if options.timeout is not None:  # each server the runs report to, once, before anything is written
        servers = {getattr(info.trackers, to).model_dump_json(): getattr(info.trackers, to) for _, info in planned}
        for server in servers.values():
            tracker.check(server, options.timeout)
    done = []
    for i, (run, info) in enumerate(planned, 1):
        metrics, evals = store.run_history(run.id)
        evals = with_intervals(evals, interval_scores(store, run.id, evals))
        steps = history(metrics, evals)
        try:
            where = tracker.export_run(info, steps, eval_summary(evals), options) if steps else "nothing recorded"
        except TrackerError:
            raise
        except Exception as e:  # the tracker's library, e.g. a server gone midway: one line, what went, the fix
            raise TrackerError(
                f"trackers.{to}: exporting {info.sweep}/{info.name} failed ({first_line(e)}); {i - 1} of "
                f"{len(planned)} run(s) were exported before it: run the command again, it adds only what is missing"
            ) from None
        result = Exported(info.sweep, info.name, len(steps), len({k for v in steps.values() for k in v}), where)
        done.append(result)
        if on_run is not None:
            on_run(i, len(planned), result)
    return done
