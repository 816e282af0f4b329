"""`rpg sweep SPEC --dry-run --check`: each backend's pre-submission check of a sweep's runs, run without
submitting anything, its verdicts returned for the CLI to print.

A backend's `launch.check_configs({run name: entrypoint})` (optional; verl's: backends/verl/diagnose.py) returns
what a submission's `check_install` would refuse on, as data: `verdicts`, each with `runs` (names) and `refusal`
(None: accepted); `alike` (which runs share one check, in words); `import_s` and `total_s` (seconds). It raises
RuntimeError (one line) when the check itself cannot run. Pure Python: the backend's check runs in its own
interpreter.
"""

from __future__ import annotations

from typing import Any

from rpg_cli.orchestration.plan import RunPlan, launcher


def check_configs(plans: list[RunPlan], states: dict[str, str]) -> dict[str, Any | None]:
    """backend -> its check's result (None: the backend has none), for the runs a submission checks: those not
    succeeded yet (as orchestration/sweep.py's `_check_install`)."""
    todo = [p for p in plans if states.get(p.id) != "succeeded"]
    found: dict[str, Any | None] = {}
    for backend in dict.fromkeys(p.backend for p in todo):
        check = getattr(launcher(backend), "check_configs", None)
        found[backend] = None if check is None else check({p.name: p.entrypoint for p in todo if p.backend == backend})
    return found
