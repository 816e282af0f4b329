"""What an interval is computed from: per run, benchmark and evaluated step, the per-problem scores of
an `rpg eval` evaluation (its stored samples: mean@k is the fraction correct, pass@k the unbiased
estimate from the correct count), else only the benchmark's score at that step (logged validation, or
maj@k, which needs the answers). Always under the one scorer and protocol a run's scores came from
(`scores.Origin`): samples drawn another way never enter. The statistics are rpg_cli.stats'."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from rpg_cli import stats
from rpg_cli.evaluation.metrics import pass_at_k
from rpg_cli.report.scores import Origin, Scores

if TYPE_CHECKING:
    from rpg_cli.store import Store

# (run id, step): one run's evaluation to take a score from; step None: no step (the value alone)
Pick = tuple[str, "int | None"]
# One evaluation's problems: their fingerprints, in position order, and each one's score (mean@k or pass@k)
Problems = tuple[tuple[str, ...], np.ndarray]


class Evidence:
    """Per-step benchmark scores of the runs of a `Scores` (read at once when first asked: the `evals` rows, a
    few per step), and the per-problem scores of only the evaluations a table or comparison shows (`read`): the
    samples table holds every sample of every checkpoint, so what is read grows with what is shown, not
    with what is stored."""

    def __init__(self, store: Store, result: Scores):
        self.result = result
        self._store = store
        self._series: dict[tuple[str, str], dict[int, float]] | None = None  # read when first asked (`steps`)
        self._problems: dict[tuple[str, int, str], Problems] = {}
        self._read: set[tuple[str, int, str]] = set()  # (run id, step, benchmark) whose problems were asked for
        # one tuple per distinct list of problems (a benchmark file's): thousands of runs' evaluations share a few
        self._same: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._origins: dict[Origin, list[str]] = defaultdict(list)
        for run_id, origin in result.origins.items():
            self._origins[origin].append(run_id)

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
            n = protocol["n"]
            found = self._store.evaluation_problems(wanted, bench, origin.scorer, protocol)
            for (run_id, step), (problems, correct) in found.items():
                if origin.stat == "mean":
                    values = np.asarray(correct, dtype=float) / n
                elif origin.k <= n:
                    values = np.array([pass_at_k(n, c, origin.k) for c in correct], dtype=float)
                else:
                    continue
                self._problems[(run_id, step, bench)] = (self._same.setdefault(problems, problems), values)

    def steps(self, run_id: str, bench: str) -> dict[int, float]:
        """{step: score} of every evaluated step (empty for a run read from `metrics`). Every run's are read at
        the first call: a Last-only table never needs them."""
        if self._series is None:
            self._series = {}
            for origin, ids in self._origins.items():
                if origin.protocol is not None:
                    self._series.update(
                        self._store.eval_series(ids, origin.names, origin.k, origin.scorer, dict(origin.protocol))
                    )
        return self._series.get((run_id, bench), {})

    def problems(self, run_id: str, step: int | None, bench: str) -> Problems | None:
        """(problem fingerprints, their scores) of the run's evaluation at `step`; None without samples. Read
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


def aligned(per_run: Sequence[Problems | None]) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """(runs, problems) matrix on the problems every run was scored on, in the first run's order, with
    their ids; None when a run has no per-problem scores or the runs share no problem."""
    if not per_run or any(p is None for p in per_run):
        return None
    ids = per_run[0][0]
    if all(problems == ids for problems, _ in per_run[1:]):  # the usual case: one benchmark file, one order
        return np.vstack([scores for _, scores in per_run]), ids
    common = set(ids).intersection(*(problems for problems, _ in per_run[1:]))
    ids = tuple(p for p in ids if p in common)
    if not ids:
        return None
    by_id = [dict(zip(problems, scores)) for problems, scores in per_run]
    return np.array([[p[i] for i in ids] for p in by_id]), ids


def cell_interval(
    evidence: Evidence, picks: Sequence[Pick], values: Sequence[float], bench: str, fixed_problems: bool = False
) -> stats.Interval:
    """One method's score on a benchmark from its runs' picks: the interval over seeds and problems
    (or over seeds on these problems) when every run has per-problem scores there, else over seeds
    only from the values (`values[i]` is run i's benchmark score)."""
    matrix = aligned([evidence.problems(run_id, step, bench) for run_id, step in picks])
    if matrix is None:
        return stats.score_from_means(values, fixed_problems=fixed_problems)
    scores, _ = matrix  # a score needs no problem labels (a comparison pairs by them)
    return stats.score(stats.Runs({bench: scores}), bench, fixed_problems=fixed_problems)
