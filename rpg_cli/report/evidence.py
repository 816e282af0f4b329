"""What an interval is computed from: per run, benchmark and evaluated step, the per-problem scores of
an `rpg eval` evaluation (its stored samples: mean@k is the fraction correct, pass@k the unbiased
estimate from the correct count), else only the benchmark's score at that step (logged validation, or
maj@k, which needs the answers). Always under the one scorer and protocol a run's scores came from
(`scores.Origin`): samples drawn another way never enter. The statistics are rpg_cli.stats'."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from rpg_cli import stats
from rpg_cli.evaluation.metrics import pass_at_k
from rpg_cli.report.scores import Origin, Scores
from rpg_cli.store.schema import PROTOCOL

if TYPE_CHECKING:
    from rpg_cli.store import Store

# (run id, step): one run's evaluation to take a score from; step None: no step (the value alone)
Pick = tuple[str, "int | None"]


class Evidence:
    """Per-step benchmark scores of the runs of a `Scores` (read at once: the `evals` rows, a few per
    step), and the per-problem scores of only the evaluations a table or comparison shows (`read`): the
    samples table holds every sample of every checkpoint, so what is read grows with what is shown, not
    with what is stored."""

    def __init__(self, store: Store, result: Scores):
        self.result = result
        self._store = store
        self._series: dict[tuple[str, str], dict[int, float]] = {}
        self._problems: dict[tuple[str, int, str], dict[str, float]] = {}
        self._read: set[tuple[str, int, str]] = set()  # (run id, step, benchmark) whose problems were asked for
        self._origins: dict[Origin, list[str]] = defaultdict(list)
        for run_id, origin in result.origins.items():
            self._origins[origin].append(run_id)
        for origin, ids in self._origins.items():
            if origin.protocol is not None:
                self._series.update(
                    store.eval_series(ids, origin.names, origin.k, origin.scorer, dict(origin.protocol))
                )

    def read(self, bench: str, steps: Mapping[str, Collection[int]]) -> None:
        """Read the per-problem scores of `bench` at these steps of each run (one query per source),
        under each run's own scorer and protocol; only runs scored by `rpg eval` with mean or pass have them."""
        for origin, ids in self._origins.items():
            if origin.protocol is None or not origin.evaluated or origin.stat not in ("mean", "pass"):
                continue
            wanted = {r: sorted(set(steps[r]) - {None}) for r in ids if steps.get(r)}
            wanted = {r: s for r, s in wanted.items() if s}
            if not wanted:
                continue
            self._read |= {(r, step, bench) for r, s in wanted.items() for step in s}
            protocol = dict(origin.protocol)
            expected = tuple(protocol[name] for name in PROTOCOL)
            rows = self._store.problem_scores(
                list(wanted), benchmark=bench, scorer=origin.scorer, steps=wanted, protocol=protocol
            )
            protocol_of = attrgetter(*PROTOCOL)
            for row in rows:
                if protocol_of(row) != expected:
                    continue  # never another protocol's samples, whatever the store was asked
                value = row.accuracy
                if origin.stat == "pass":
                    if origin.k > row.n:
                        continue
                    value = pass_at_k(row.n, round(row.accuracy * row.n), origin.k)
                self._problems.setdefault((row.run_id, row.step, row.benchmark), {})[row.problem] = value

    def steps(self, run_id: str, bench: str) -> dict[int, float]:
        """{step: score} of every evaluated step (empty for a run read from `metrics`)."""
        return self._series.get((run_id, bench), {})

    def problems(self, run_id: str, step: int | None, bench: str) -> dict[str, float] | None:
        """{problem fingerprint: score} of the run's evaluation at `step`; None without samples. Read
        here when `read` was not asked for it (callers ask first, in one query per benchmark)."""
        if step is None:
            return None
        if (run_id, step, bench) not in self._read:
            self.read(bench, {run_id: [step]})
        return self._problems.get((run_id, step, bench))


def wanted_steps(picks: Sequence[Pick]) -> dict[str, set[int]]:
    """{run id: steps} of picks: what `Evidence.read` is asked for."""
    out: dict[str, set[int]] = defaultdict(set)
    for run_id, step in picks:
        if step is not None:
            out[run_id].add(step)
    return dict(out)


def aligned(per_run: Sequence[dict[str, float] | None]) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """(runs, problems) matrix on the problems every run was scored on, in the first run's order, with
    their ids; None when a run has no per-problem scores or the runs share no problem."""
    if not per_run or any(p is None for p in per_run):
        return None
    common = set(per_run[0]).intersection(*per_run[1:])
    ids = tuple(p for p in per_run[0] if p in common)
    if not ids:
        return None
    return np.array([[p[i] for i in ids] for p in per_run]), ids


def cell_interval(
    evidence: Evidence, picks: Sequence[Pick], values: Sequence[float], bench: str, fixed_problems: bool = False
) -> stats.Interval:
    """One method's score on a benchmark from its runs' picks: the interval over seeds and problems
    (or over seeds on these problems) when every run has per-problem scores there, else over seeds
    only from the values (`values[i]` is run i's benchmark score)."""
    matrix = aligned([evidence.problems(run_id, step, bench) for run_id, step in picks])
    if matrix is None:
        return stats.score_from_means(values, fixed_problems=fixed_problems)
    scores, ids = matrix
    return stats.score(stats.Runs({bench: scores}, problems={bench: ids}), bench, fixed_problems=fixed_problems)
