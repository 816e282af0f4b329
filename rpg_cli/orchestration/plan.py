"""A run as the orchestrator sees it: what to start, where, with which resources; and the parts of a sweep's plan
(states, checks, footprints, counts) that orchestration/dryrun.py puts together.

`RunPlan` is the hand-off between the spec side (spec/sweep.py expands a sweep into specs) and the
execution side (sweep.py submits them, the store records them). Each backend supplies its part
through its `launch` module, found through the registry (`rpg_cli.backends.registry`: `BACKENDS`, and the
interface `Backend`, which lists these and the backend's facts):

    entrypoint(spec, run_dir) -> argv     the job's command (an argument list, never a shell string)
    resources(spec) -> (cpus, gpus)       what the job's entrypoint reserves
    env(spec, run_dir) -> {name: value}   the job's environment variables
    preflight(spec) -> [Finding]          optional: what can be checked of a run before a GPU is paid for
                                          (data, model, prompt lengths; rpg_cli/inputs.py); the dry run
                                          shows it, a real submission refuses a sweep with an error
    footprint(spec) -> {name: number}   optional: the dry run's figures, gpu_memory_gib (a GPU's estimated
                                          peak), disk_gb (what its checkpoints leave), disk_peak_gb; None: unknown
    check_install({run name: entrypoint}) optional: raise RuntimeError (one line) before any submission
    check_configs({run name: entrypoint}) optional: what check_install checks, as verdicts, without submitting
                                          (`rpg sweep --dry-run --check`: orchestration/preflight.py)
    check_node([(entrypoint, env)])       optional: this machine checked as a node of these runs (`rpg doctor`):
                                          dicts of status (ok, missing, warn), name, ok, needed, detail, fix
    check_cluster(client, [(entrypoint, env)])
                                          optional: the cluster's nodes checked for the runs to submit, through
                                          the Jobs API client, once per sweep; RuntimeError (one line) if one
                                          lacks what a run needs
    failure_reason(log_tail) -> str       optional: one line for a failed job (default: its last error)

Pure Python: no torch, ray or verl.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rpg_cli import rundir
from rpg_cli.states import ATTACH, DONE, NEW, SKIP, SUBMIT, run_action

if TYPE_CHECKING:
    from rpg_cli.inputs import Finding
    from rpg_cli.spec import ExperimentSpec, SweepSpec


@dataclass(frozen=True)
class RunPlan:
    id: str  # stable short hash of the canonical spec; also the Ray submission id
    name: str  # readable: rpg_reinforce-urkl-clip0.2_0.28-adamw-4k-s0-1a2b3c
    sweep: str  # the sweep's name
    backend: str  # "verl" | "local"
    spec: dict[str, Any]  # the canonical spec (JSON-serialisable), as written to spec.json
    run_dir: Path  # runs/<sweep>/<name>/
    entrypoint: list[str]  # the exact command the job runs, as an argument list (never a shell string)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    env: dict[str, str] = field(default_factory=dict)  # runtime_env env_vars


def launcher(backend: str) -> ModuleType:
    """The backend's `launch` module, for a name the registry holds (rpg_cli.backends.registry: its interface)."""
    from rpg_cli.backends import registry

    return registry.get(backend)


def failure_reason(backend: str, log_tail: str) -> str:
    """One line for a failed job of `backend`, from the tail of its log: the backend's own reading when
    it has one, else the log's last error line."""
    try:
        read = getattr(launcher(backend), "failure_reason", rundir.failure_line)
    except LookupError:  # registry.UnknownBackend: a run recorded by `rpg eval` for a bare model ("hf")
        read = rundir.failure_line
    return read(log_tail)


def plan_run(spec: ExperimentSpec, run_dir: Path, sweep: str) -> RunPlan:
    """The plan of one run; its backend's `launch` module supplies the command, the resources the
    entrypoint reserves (a verl driver reserves no GPU: its Ray workers take them) and the env vars."""
    launch = launcher(spec.backend)
    run_dir = Path(run_dir).absolute()
    num_cpus, num_gpus = launch.resources(spec)
    return RunPlan(
        id=spec.run_id,
        name=spec.run_name,
        sweep=sweep,
        backend=spec.backend,
        spec=spec.canonical(),
        run_dir=run_dir,
        entrypoint=list(launch.entrypoint(spec, run_dir)),
        num_cpus=float(num_cpus),
        num_gpus=float(num_gpus),
        env=dict(launch.env(spec, run_dir)),
    )


def rehome(plan: RunPlan, run_dir: Path) -> RunPlan:
    """The plan of a run whose directory is elsewhere: a run is its spec, shared by every sweep that
    lists it, and stays in the directory of the sweep that created it (the store knows which)."""
    from rpg_cli.spec import ExperimentSpec

    return plan_run(ExperimentSpec.model_validate(plan.spec), run_dir, plan.sweep)


def plan_sweep(sweep: SweepSpec, runs_root: Path, backend: str | None = None) -> list[RunPlan]:
    """One plan per distinct cell, run directories at `<runs_root>/<sweep>/<run name>/` (absolute).

    Pure: computes paths and commands, touches nothing on disk. `backend` overrides the spec's.
    """
    from rpg_cli.trackers.runs import plan_trackers

    root = Path(runs_root).absolute()
    specs = plan_trackers(sweep.expand(backend), sweep.name, root)  # group, tags and defaults, for spec.json
    return [plan_run(spec, root / sweep.name / spec.run_name, sweep.name) for spec in specs]


# ------------------------------------------------------------------------------------ states, counts


def known_states(db_url: str, plans: list[RunPlan]) -> dict[str, str]:
    """Each plan's state in the results store, "new" where it has none; reads only (SQLite with the
    standard library), and a database that does not exist yet is not created."""
    from rpg_cli.store.light import run_states

    states = run_states(db_url, [p.id for p in plans])
    return {p.id: states.get(p.id, NEW) for p in plans}


def recorded_elsewhere(db_url: str, plans: list[RunPlan], states: dict[str, str]) -> dict[str, Counter]:
    """{other sweep: Counter of states} of the plans the store already has under another sweep's name: a
    run is its spec (its id ignores the sweep's name), so a sweep file copied under a new `name:` re-runs
    nothing and its runs stay in the directory of the sweep that created them."""
    from rpg_cli.store.light import run_sweeps

    homes = run_sweeps(db_url, [p.id for p in plans if states.get(p.id, NEW) != NEW])
    out: dict[str, Counter] = {}
    for plan in plans:
        home = homes.get(plan.id)
        if home is not None and home != plan.sweep:
            out.setdefault(home, Counter())[states[plan.id]] += 1
    return out


@dataclass(frozen=True)
class PlanSummary:
    runs: int
    submit: int
    gpus: float  # GPUs the runs to submit train on (a verl driver reserves none itself: its workers do)
    attach: int
    done: int
    skip: int


def summarize(plans: list[RunPlan], states: dict[str, str], retry_failed: bool = False) -> PlanSummary:
    """What a sweep run would do with each plan, counted: the dry run's last line."""
    actions = {p.id: run_action(states[p.id], retry_failed) for p in plans}
    counts = Counter(actions.values())
    gpus = sum(
        p.spec["resources"]["nodes"] * p.spec["resources"]["gpus_per_node"] for p in plans if actions[p.id] == SUBMIT
    )
    return PlanSummary(len(plans), counts[SUBMIT], gpus, counts[ATTACH], counts[DONE], counts[SKIP])


# ----------------------------------------------------------------------------------------- checks


class PreflightError(RuntimeError):
    """A run of the sweep would fail on its inputs; one line naming the problem and the fix."""


@dataclass(frozen=True)
class Check:
    finding: Finding
    runs: tuple[str, ...]  # the names of the runs it is about


def check_plans(plans: list[RunPlan], states: dict[str, str] | None = None, retry_failed: bool = False) -> list[Check]:
    """Each backend's `preflight` of the runs a sweep would start (not those done, nor those skipped),
    a finding shared by several runs said once; errors first."""
    from rpg_cli.spec import ExperimentSpec, SpecError

    found: dict[Finding, list[str]] = {}
    for plan in plans:
        if states is not None and run_action(states.get(plan.id, NEW), retry_failed) in (DONE, SKIP):
            continue
        preflight = getattr(launcher(plan.backend), "preflight", None)
        try:
            spec = ExperimentSpec.model_validate(plan.spec)
        except (ValueError, SpecError):  # a plan made by hand, not from a spec: no inputs to check
            continue
        for finding in preflight(spec) if preflight is not None else []:
            found.setdefault(finding, []).append(plan.name)
    return sorted((Check(f, tuple(names)) for f, names in found.items()), key=lambda c: not c.finding.error)


def check_line(check: Check, total: int) -> str:
    """A check as one line: error or note, the runs it is about, the finding."""
    names = check.runs
    who = (
        "every run"
        if len(names) == total > 1
        else names[0]
        if len(names) == 1
        else f"{len(names)} runs ({names[0]}, ...)"
    )
    return f"{'error' if check.finding.error else 'note'}: {who}: {check.finding}"


def refuse_bad_inputs(checks: list[Check], total: int) -> None:
    """PreflightError (one line: the first error, and how many more) when a check found an error."""
    errors = [c for c in checks if c.finding.error]
    if errors:
        more = f" (and {len(errors) - 1} more: `rpg sweep SPEC --dry-run` lists them)" if len(errors) > 1 else ""
        raise PreflightError(check_line(errors[0], total).removeprefix("error: ") + more)


def footprints(plans: list[RunPlan]) -> dict[str, dict[str, float | None]]:
    """Each plan's backend `footprint` (run id -> its figures; {} for a backend that has none)."""
    from rpg_cli.spec import ExperimentSpec

    out: dict[str, dict[str, float | None]] = {}
    for plan in plans:
        estimate = getattr(launcher(plan.backend), "footprint", None)
        try:
            out[plan.id] = estimate(ExperimentSpec.model_validate(plan.spec)) if estimate is not None else {}
        except ValueError:  # a plan made by hand, not from a spec (SpecError is a ValueError): nothing to estimate
            out[plan.id] = {}
    return out


def validation_costs(plans: list[RunPlan]) -> list[tuple[int, int | None, int, int, int]]:
    """What validation costs before a GPU is paid for: (runs, problems or None when the files could not
    be read here, samples per problem, validations per run, every N steps), one entry per distinct cost."""
    from rpg_cli.inputs import validation_cost

    costs = Counter(
        (c.problems, c.samples_per_problem, c.validations, p.spec["val"]["every"])
        for p in plans
        if (c := validation_cost(p.spec)) is not None
    )
    return [(runs, *cost) for cost, runs in costs.items()]
