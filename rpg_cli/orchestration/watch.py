"""The watcher's policy, as `rpg sweep` applies it (orchestration/sweep.py and reconcile.py call these;
rpg_cli/watch.py has the rules): when a live run must be stopped and failed (a non-finite loss, a step beyond a bound, a stall past
`--stall-timeout`), and whether a run whose job exited 0 has earned `succeeded`.

A job that exits 0 is not proof of a run: verl trains on through a NaN loss and exits 0, a trainer that ends
early for a reason of its own exits 0 too, and a resume at an epoch boundary exits 0 having updated nothing
(verl #7401). So a run is recorded succeeded only with every step from 1 through its spec's `steps` in the store;
else it fails, its reason naming the last step it reached (a resumed attempt that logged no step of its own
says so). A run that stopped on request (a `stopped` line: preempted, `rpg cancel --graceful`) is mapped
before this is asked.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from rpg_cli import watch

if TYPE_CHECKING:
    from rpg_cli.store import RunRecord, Store


def breach(store: Store, run: RunRecord) -> str | None:
    """Why the run must stop for what it logged: a non-finite loss (`Store.divergence`), else the first step
    beyond one of its bounds (rpg_cli/watch.py), as one line; None when neither."""
    if why := store.divergence(run.id):
        return why
    rules = {b.key: b for b in watch.bounds(run.spec)}
    found = store.first_breach(run.id, [(b.key, b.max, b.min, b.after_step) for b in rules.values()])
    return None if found is None else watch.breach_line(rules[found[1]], found[0], found[2])


def stall(store: Store, run: RunRecord, now: datetime | None = None) -> watch.Stall | None:
    """The run's stall (rpg_cli/watch.py), from what the store holds of it and its metrics file; None if none."""
    advanced_at, step_times = store.stall_facts([run.id])[run.id]
    step = store.last_steps([run.id]).get(run.id)
    return watch.stalled(run.spec, run.run_dir, step, advanced_at, step_times, now or _now())


def stop_reason(store: Store, run: RunRecord, stall_timeout: float | None = None) -> str | None:
    """Why a live run the watcher follows must be stopped and failed now, else None: `breach`, or (with
    `stall_timeout`, seconds) a stall that has lasted that much longer than the run's limit."""
    if why := breach(store, run):
        return why
    if stall_timeout is None or run.status != "running":
        return None
    found = stall(store, run)
    if found is None or found.idle_s - found.limit_s <= stall_timeout:
        return None
    return watch.stall_line(found, stall_timeout)


def verdict(store: Store, run: RunRecord) -> str | None:
    """Why a run whose job exited 0 is not `succeeded` (its failure reason), else None: a breach (as while it
    ran), or steps missing from 1 through its spec's `steps` (module docstring). Its metrics are ingested."""
    if why := breach(store, run):
        return why
    steps = run.spec.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        return None  # a plan without a step count (a job rpg does not train): nothing to hold it to
    logged = store.logged_steps(run.id, steps)
    if len(logged) == steps:
        return None
    last = logged[-1] if logged else None
    if run.attempts > 1 and store.stall_facts([run.id])[run.id][0] is None:
        after = "before any step" if last is None else f"after step {last}"
        return (
            f"the resumed attempt ended without a new step {after} of {steps} (verl #7401: a resume at an epoch "
            "boundary exits 0 having updated nothing); `rpg logs RUN` shows what it did, then check the "
            f"checkpoint it resumed from; {watch.RETRY.replace('resumes', 'reruns')}"
        )
    if last is None:
        return f"the job exited 0 without logging a step of {steps}; `rpg logs RUN` shows what it did"
    if last == steps:
        have = set(logged)
        missing = next(s for s in range(1, steps + 1) if s not in have)
        return (
            f"the job exited 0 but {steps - len(logged)} of its {steps} steps have no metrics (the first: step "
            f"{missing}); `rpg logs RUN` shows what it did; {watch.RETRY}"
        )
    return (
        f"the job exited 0 at step {last} of {steps}: the run is short of its steps; `rpg logs RUN` shows why "
        f"it ended; {watch.RETRY}"
    )


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # naive UTC, as the store's times
