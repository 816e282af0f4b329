"""A sweep's progress as the store has it: each run's state, step and reward, and the sweep's ETA (what `rpg sweep`
shows while it follows its runs)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from rpg_cli.metrics import REWARD
from rpg_cli.states import LIVE, STATUSES, TERMINAL

if TYPE_CHECKING:
    from rpg_cli.store import RunRecord, Store


@dataclass(frozen=True)
class RunProgress:
    id: str
    name: str
    status: str
    attempts: int
    step: int | None  # last step ingested from metrics.jsonl
    reward: float | None  # last critic/score/mean
    error: str | None


@dataclass(frozen=True)
class SweepEta:
    """How far a sweep has come and how long it has to go (`sweep_eta`): what its progress line shows."""

    runs_done: int  # runs in a terminal state
    runs: int
    steps_done: int  # steps logged, through each run's `steps` (a succeeded run's all)
    steps: int  # the runs' `steps`, summed
    eta_s: float | None  # None: no run has a pace yet


@dataclass(frozen=True)
class SweepProgress:
    sweep: str
    runs: tuple[RunProgress, ...]
    eta: SweepEta | None = None  # only when asked for (run_sweep's `eta`: a terminal shows it)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.runs) for s in STATUSES}

    @property
    def finished(self) -> bool:
        return all(r.status in TERMINAL for r in self.runs)


def progress(store: Store, sweep: str, run_ids: Iterable[str], eta: bool = False) -> SweepProgress:
    """The sweep's runs as the store has them now; with `eta`, its `sweep_eta` too."""
    records = store.runs(ids=list(run_ids))
    ids = [r.id for r in records]
    steps = store.last_steps(ids)
    rewards = store.latest_values(ids, [REWARD])
    return SweepProgress(
        sweep,
        tuple(
            RunProgress(
                r.id,
                r.name,
                r.status,
                r.attempts,
                steps.get(r.id),
                rewards.get(r.id, {}).get(REWARD, (None, None))[1],
                r.error,
            )
            for r in records
        ),
        sweep_eta(store, records, steps) if eta else None,
    )


def sweep_eta(
    store: Store, records: Sequence[RunRecord], steps: dict[str, int], now: datetime | None = None
) -> SweepEta:
    """How far the sweep's runs (`records`, their last steps `steps`) have come, and its ETA: the work left (each
    live run's ETA at its own pace, report/summary.py; a run that has no pace yet, pending or loading, its steps
    at the median pace of those that have one) spread over as many runs at once as run now (at least one), and
    never less than the longest live run's ETA. Finished runs have no work left (a failed one is not retried while
    the sweep watches). None when work is left and no run has a pace yet."""
    from rpg_cli.report.summary import run_costs

    costs = run_costs(store, records, now or _now(), steps)
    paces = [c.s_per_step for c in costs.values() if c.s_per_step is not None]
    median = statistics.median(paces) if paces else None
    done = total = 0
    work, longest, unknown = 0.0, 0.0, False
    for r in records:
        want = r.spec.get("steps")
        want = want if isinstance(want, int) and not isinstance(want, bool) and want > 0 else 0
        last = want if r.status == "succeeded" else min(steps.get(r.id) or 0, want)
        done, total = done + last, total + want
        if r.status not in LIVE:
            continue
        eta = costs[r.id].eta_s
        if eta is None and median is not None:
            eta = (want - last) * median
        if eta is None:
            unknown = unknown or want > last
            continue
        work += eta
        longest = max(longest, eta) if r.status == "running" else longest
    at_once = max(sum(r.status == "running" for r in records), 1)
    eta_s = None if unknown else max(work / at_once, longest)
    runs_done = sum(r.status in TERMINAL for r in records)
    return SweepEta(runs_done, len(records), done, total, eta_s)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # naive UTC, as the store's times
