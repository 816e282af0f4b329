"""A run's states and what `rpg sweep` does with a run in each: the one table that the store (its
status column), the dry-run's plan, the real launch, `rpg stop` and `rpg runs` all read.

    new        not in the store yet                       -> submit
    pending    recorded; its submission may not have reached Ray yet
    submitted  Ray accepted the job (it may wait for resources)
    running    the job runs                               -> attach (live: a job may be running for it)
    succeeded                                             -> done, never resubmitted
    failed, stopped                                       -> skipped, resubmitted with --retry-failed
    preempted  a signal (SIGTERM, Slurm's USR1) stopped it
               after a checkpoint of the step it was in   -> submit: resumed from that checkpoint
                                                             (orchestration/stops.py says which)

A run stopped on purpose after a checkpoint (`rpg cancel --graceful`) is `stopped`, its reason naming the step;
like any stopped run it is resumed with --retry-failed.

"Attach" is what the dry run reports for a live run; the launch refines it with what Ray knows: a
live run whose job Ray has lost is submitted again (see orchestration/sweep.py).
"""

from __future__ import annotations

SUBMIT, ATTACH, DONE, SKIP = "submit", "attach", "done", "skip"
NEW = "new"

# state -> (action, action with --retry-failed)
ACTIONS: dict[str, tuple[str, str]] = {
    NEW: (SUBMIT, SUBMIT),
    "pending": (ATTACH, ATTACH),
    "submitted": (ATTACH, ATTACH),
    "running": (ATTACH, ATTACH),
    "succeeded": (DONE, DONE),
    "failed": (SKIP, SUBMIT),
    "stopped": (SKIP, SUBMIT),
    "preempted": (SUBMIT, SUBMIT),
}
STATUSES = tuple(state for state in ACTIONS if state != NEW)  # what the store records
LIVE = frozenset(state for state, (action, _) in ACTIONS.items() if action == ATTACH)
TERMINAL = frozenset(STATUSES) - LIVE


def run_action(state: str, retry_failed: bool = False) -> str:
    """What a sweep does with a run in `state` (a state the table does not know counts as new)."""
    return ACTIONS.get(state, ACTIONS[NEW])[retry_failed]
