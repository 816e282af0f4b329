"""The store side of an evaluation, which only the `rpg` process that holds --db runs (the job never
opens the store): register a run the store does not know, ingest the scored-samples files as they grow
(`ScoredFeed`), record accuracy@k once every problem of a checkpoint is stored, and read back results
and progress. The metrics are always recomputed from the stored samples (the first k of each problem),
never carried in memory, so what the store says can be checked against what it holds."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpg_cli import rundir
from rpg_cli.evaluation.plan import PLAIN_SWEEP, Benchmark, EvalPlan, Sampling, Target
from rpg_cli.evaluation.results import METRICS, EvalResult, compute_metrics, result_values
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.rewards import scorer_version
from rpg_cli.store.ingest import SAMPLE_PROTOCOL, Cursor, parse_sample_line, read_new, sample_rows

if TYPE_CHECKING:
    from rpg_cli.store import Store

_log = logging.getLogger("rpg_cli.evaluation")


def prepare_target(store: Store, target: Target) -> None:
    """What the store needs of a run before its scored samples: its row, and the validation scores its
    own metrics.jsonl logged."""
    register_target(store, target)
    store.ingest_metrics(target.run_id, target.metrics_path)


def register_target(store: Store, target: Target) -> None:
    """Record a run the store does not know yet (a run directory from elsewhere, or a stand-alone model)."""
    if target.known:
        return
    spec = target.spec or {"model": str(target.checkpoints[0].path)}
    backend = str(spec.get("backend", "hf")) if target.spec else "hf"
    store.record_plans([RunPlan(target.run_id, target.name, target.sweep, backend, spec, target.run_dir, [])])
    if target.sweep == PLAIN_SWEEP and target.spec is None:
        store.set_status(target.run_id, "succeeded")  # a model, not a job: nothing to run or wait for


class ScoredFeed:
    """Ingests scored-samples files into a store as they grow: only the new lines of a file it read
    before (its cursor), all of a file that is new to it or was replaced or rewritten. Keeps the scorer
    version each (run, step, benchmark, scorer, protocol) was scored with, as the evaluation said."""

    def __init__(self) -> None:
        self.cursors: dict[Path, Cursor] = {}
        self.versions: dict[tuple, str] = {}

    def ingest(self, store: Store, target: Target, step: int, bench: Benchmark) -> int:
        """Record what is new in the file of (target, step, bench); returns the samples read."""
        path = rundir.eval_scored_path(target.run_dir, step, bench.name)
        try:
            parsed, cursor = read_new(path, self.cursors.get(path), parse_sample_line)
        except FileNotFoundError:
            return 0
        rows: dict[tuple, dict[str, Any]] = {}  # by primary key: a problem recorded twice, its last line
        for line in parsed.events:
            for row in sample_rows(target.run_id, step, bench.name, line):
                rows[(row["problem"], row["sample_index"], row["scorer"], *(row[n] for n in SAMPLE_PROTOCOL))] = row
            key = self._key(target, step, bench, line["scorer"], line["protocol"])
            self.versions[key] = str(line.get("scorer_version") or "")
        store.record_samples(rows.values())
        for index, why in parsed.bad:
            _log.warning("%s line %d: %s; skipped", path, cursor.lines - parsed.lines + index + 1, why)
        self.cursors[path] = cursor
        return len(rows)

    def version(self, target: Target, step: int, bench: Benchmark, scorer: str) -> str:
        """The scorer version the evaluation recorded for (target, step, bench, scorer), else this one's."""
        return self.versions.get(self._key(target, step, bench, scorer, target.sampling.protocol)) or scorer_version(
            scorer
        )

    @staticmethod
    def _key(target: Target, step: int, bench: Benchmark, scorer: str, protocol: dict[str, Any]) -> tuple:
        return (target.run_id, step, bench.name, scorer, *(protocol[n] for n in SAMPLE_PROTOCOL))


def finish_eval(store: Store, plan: EvalPlan, feed: ScoredFeed) -> list[tuple[Target, int, Benchmark]]:
    """After an evaluation job: ingest what its files hold, then record the metrics of every checkpoint
    and benchmark whose problems are all scored. Returns those that are not (nothing recorded for them)."""
    incomplete = []
    for target, step, bench, scorer in plan.cells():
        feed.ingest(store, target, step, bench)
        stored = store.stored_samples(target.run_id, step, bench.name, scorer, target.sampling.protocol)
        if any(problem.key not in stored for problem in bench.problems):
            incomplete.append((target, step, bench))
            continue
        version = feed.version(target, step, bench, scorer)
        record_metrics(store, target.run_id, step, bench, scorer, version, target.sampling)
    return incomplete


def record_metrics(
    store: Store, run_id: str, step: int, bench: Benchmark, scorer: str, version: str, sampling: Sampling
) -> None:
    samples = store.stored_samples(run_id, step, bench.name, scorer, sampling.protocol)
    missing = [p for p, problem in enumerate(bench.problems) if problem.key not in samples]
    if missing:  # cannot happen after a complete pass; never store metrics over a partial set
        raise RuntimeError(
            f"{bench.name} step {step}: problems {missing[:5]} have fewer than {sampling.k} stored samples"
        )
    store.record_evals(
        {
            "run_id": run_id,
            "step": step,
            "benchmark": bench.name,
            "metric": metric,
            "k": kk,
            "scorer": scorer,
            **sampling.protocol,
            "value": value,
            "scorer_version": version,
        }
        for metric, kk, value in compute_metrics([samples[problem.key] for problem in bench.problems])
    )


def eval_results(store: Store, plan: EvalPlan) -> list[EvalResult]:
    """What the store holds for the plan's runs, steps, benchmarks, scorer and sampling protocol."""
    out = []
    for target, step, bench, scorer in plan.cells():
        n = target.sampling.k
        rows = store.eval_values(target.run_id, step, bench.name, scorer, METRICS, target.sampling.protocol)
        values = result_values(rows, n)
        if "mean@k" in values:
            out.append(EvalResult(target.name, step, bench.name, n, scorer, values))
    return out


def scored_count(store: Store, plan: EvalPlan) -> int:
    """Samples of the plan already in the store (progress of an evaluation running elsewhere)."""
    return sum(
        store.count_samples(
            target.run_id,
            [c.step for c in target.checkpoints],
            bench.name,
            plan.scorer_for(target, bench),
            target.sampling.protocol,
            [problem.key for problem in bench.problems],
        )
        for target in plan.targets
        for bench in plan.benchmarks
    )
