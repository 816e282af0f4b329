"""The plan of a sweep before anything is written: its runs, their states in the store and what `rpg sweep` does
with each, the checks of their inputs, whether rpg's own local head is used, and the dry run's rows and lines.

`plan_submission` makes it; `rpg sweep --dry-run` renders it and a submission (orchestration/sweep.py's
`run_sweep`) acts on it: so the states are read once, the inputs checked once and the head decided once per
command. What only the dry run shows (footprints, its rows, `--check`'s verdicts) is computed when first asked.
Pure Python: no torch, ray, verl or SQLAlchemy.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

from rpg_cli.orchestration.head import cluster_address
from rpg_cli.orchestration.plan import (
    Check,
    PlanSummary,
    RunPlan,
    check_line,
    check_plans,
    footprints,
    known_states,
    plan_sweep,
    recorded_elsewhere,
    refuse_bad_inputs,
    summarize,
    validation_costs,
)
from rpg_cli.states import SUBMIT, run_action

COLUMNS = ("name", "id", "algorithm", "kl", "clip", "optimizer", "context", "seed", "state")
SIZE_COLUMNS = ("GPU GiB", "disk GB")  # where some run's footprint is known


class Line(NamedTuple):
    """A line under the dry run's table; `whole`: printed unwrapped however narrow the terminal (to copy)."""

    text: str
    whole: bool = False


@dataclass
class SweepPlan:
    """A sweep's runs and what `rpg sweep` would do with them (see the module's docstring)."""

    sweep: str
    runs: list[RunPlan]  # one per cell, in the grid's order
    states: dict[str, str]  # run id -> its state in the store ("new" where it has none)
    checks: list[Check]  # the inputs of the runs to start, checked (errors first)
    address: str | None  # the Ray cluster; None: rpg's own local head (head.cluster_address)
    retry_failed: bool = False
    unread: str | None = None  # why the states could not be read (the dry run shows them as unknown)
    check: bool = False  # `--check`: each backend's pre-submission check, run when first asked
    db_url: str = ""

    @property
    def local_head(self) -> bool:
        return self.address is None

    def refuse_bad_inputs(self) -> None:
        """PreflightError (one line) when a run to start would fail on its inputs."""
        refuse_bad_inputs(self.checks, len(self.runs))

    def check_lines(self, errors: bool = True) -> list[str]:
        """The input checks as lines (`errors=False`: the notes only, what a submission says before it refuses)."""
        return [check_line(c, len(self.runs)) for c in self.checks if errors or not c.finding.error]

    @property
    def bad_inputs(self) -> bool:
        return any(c.finding.error for c in self.checks)

    @property
    def refused(self) -> bool:
        """Whether the dry run exits 2: an input error, or a configuration its backend's check refused."""
        checked = self.config_check or {}
        return self.bad_inputs or any(c is not None and c.refused for c in checked.values())

    # ------------------------------------------------------------------------------------- what is known

    @cached_property
    def summary(self) -> PlanSummary:
        return summarize(self.runs, self.states, self.retry_failed)

    @cached_property
    def figures(self) -> dict[str, dict[str, float | None]]:
        return footprints(self.runs)

    @cached_property
    def config_check(self) -> dict[str, Any | None] | None:
        """backend -> its pre-submission check's result (None: it has none); None when not asked. RuntimeError
        (one line) when a check cannot run (the plugin does not load, a stage runs out of time)."""
        from rpg_cli.orchestration.preflight import check_configs

        return check_configs(self.runs, self.states) if self.check else None

    @cached_property
    def elsewhere(self) -> dict[str, Counter]:
        """{other sweep: Counter of states} of the runs another sweep created ({} when the store cannot say)."""
        try:
            return recorded_elsewhere(self.db_url, self.runs, self.states)
        except Exception:  # the states could not be read either: said once, by `unread`
            return {}

    # ----------------------------------------------------------------------------------- the dry run's view

    def json_rows(self) -> list[dict[str, Any]]:
        """`--format json`: a row per run (its `check` verdict when --check)."""
        from rpg_cli.benchmarks import describe_scorers
        from rpg_cli.inputs import validation_cost

        verdicts = _verdicts(self.config_check) if self.config_check is not None else None
        figures = self.figures
        return [
            {
                "id": p.id,
                "name": p.name,
                "spec": p.spec,
                "state": self.states[p.id],
                "entrypoint": p.entrypoint,
                "validation": (cost := validation_cost(p.spec)) and cost.as_dict(),
                "scorers": describe_scorers(p.spec),
                **figures[p.id],
                **({"check": verdicts.get(p.name)} if verdicts is not None else {}),
            }
            for p in self.runs
        ]

    @property
    def title(self) -> str:
        return f"sweep {self.runs[0].sweep}" if self.runs else "sweep"

    @property
    def columns(self) -> tuple[str, ...]:
        sized = any(f.get("gpu_memory_gib") is not None for f in self.figures.values())
        return (*COLUMNS, *SIZE_COLUMNS) if sized else COLUMNS

    def table_rows(self) -> list[tuple[str, ...]]:
        """The table's rows, one per run, as text in `columns`' order."""
        from rpg_cli.algorithms.table import algorithm
        from rpg_cli.spec import context_label

        sized = len(self.columns) > len(COLUMNS)
        rows = []
        for p in self.runs:
            clip = p.spec["clip"]
            clip_text = f"{clip['eps_low']:g}/{clip['eps_high']:g}" if clip else "off"
            if clip and algorithm(p.spec["algorithm"]).takes("clip.c"):  # the dual clip's bound, where it has one
                clip_text += f" c={clip['c']:g}"
            figures = self.figures[p.id]
            rows.append(
                (
                    p.name,
                    p.id,
                    p.spec["algorithm"],
                    p.spec["kl"],
                    clip_text,
                    p.spec["optimizer"],
                    context_label(p.spec["context"]),
                    str(p.spec["seed"]),
                    self.states[p.id],
                    *((_figure(figures, "gpu_memory_gib"), _figure(figures, "disk_gb")) if sized else ()),
                )
            )
        return rows

    def notes(self) -> list[Line]:
        """The lines under the table: what the sweep would do, validation's cost, memory and disk, the verl
        blocks, the scorers."""
        n = self.summary
        lines = [
            Line(
                f"{n.runs} runs: {n.submit} to submit ({n.gpus:g} GPUs), {n.attach} live to re-attach, "
                f"{n.done} succeeded, {n.skip} failed/stopped skipped"
                + ("" if self.retry_failed or not n.skip else " (--retry-failed resubmits them)")
                + ". Dry run: nothing was written."
            )
        ]
        for runs, problems, samples, count, every in validation_costs(self.runs):
            per = (
                f"{problems:,} problems x {samples} samples = {problems * samples:,} generations"
                if problems is not None
                else f"{samples} samples per problem (problems not counted: the files are not readable here)"
            )
            lines.append(
                Line(
                    f"validation ({runs} runs): {per} per validation, {count} per run (before training, every "
                    f"{every} steps and at the last)"
                )
            )
        lines += [Line(line) for line in self._footprint_lines()]
        lines += [Line(f"verl ({runs} runs): {block}", whole=True) for block, runs in _verl_blocks(self.runs).items()]
        lines += [Line(f"{line} ({runs} runs)") for line, runs in _scoring_lines(self.runs).items()]
        return lines

    def elsewhere_lines(self) -> list[str]:
        """One line per other sweep that already has some of these runs (a copied sweep file)."""
        lines = []
        for home, counts in self.elsewhere.items():
            how = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            what = "succeeded" if set(counts) == {"succeeded"} else f"recorded ({how})"
            lines.append(
                f"{sum(counts.values())} run(s) already {what} in sweep {home}: a run is its spec, not its "
                f"sweep's name, so they are not run again and their files stay in {home}'s directory"
            )
        return lines

    def config_check_lines(self) -> list[str]:
        """`--check`'s verdicts: per backend, how many distinct configurations its runs make, how many runs it
        takes, and a line per refused configuration naming its runs and the reason (masked like every printout)."""
        from rpg_cli.store.url import redact

        checked = self.config_check or {}
        lines = [] if checked else ["check: nothing to check (every run succeeded)"]
        for backend, found in checked.items():
            if found is None:
                lines.append(f"{backend} check: none (backend {backend} has no pre-submission check)")
                continue
            runs, n = sum(len(v.runs) for v in found.verdicts), len(found.verdicts)
            lines.append(
                f"{backend} check: {runs:,} run(s) in {n:,} distinct configuration(s), each checked once "
                f"({found.alike})"
            )
            taken = [v for v in found.verdicts if v.refusal is None]
            if taken:
                lines.append(
                    f"{backend} check: ok: {sum(len(v.runs) for v in taken):,} run(s) ({len(taken):,} configuration(s))"
                )
            for v in found.refused:
                lines.append(f"{backend} check: refused: {len(v.runs):,} run(s) ({_names(v.runs)}): {v.refusal}")
        return [redact(line) for line in lines]

    def check_time_lines(self) -> list[str]:
        """How long each backend's check took (stderr: it varies from run to run)."""
        return [
            f"the {backend} check took {found.total_s:.1f} s ({found.import_s:.1f} s importing)"
            for backend, found in (self.config_check or {}).items()
            if found is not None
        ]

    def _footprint_lines(self) -> list[str]:
        """What the runs to submit need, summed (disk) and at most (a GPU's memory), before a GPU is paid for."""
        figures = self.figures
        todo = [p for p in self.runs if run_action(self.states[p.id], self.retry_failed) == SUBMIT and figures[p.id]]
        known = [p for p in todo if figures[p.id].get("disk_gb") is not None]
        if not todo:
            return []
        if not known:
            return [f"memory and disk ({len(todo)} runs): not estimated, no model config.json here (see the notes)"]
        disk = sum(figures[p.id]["disk_gb"] for p in known)
        peak = max(known, key=lambda p: figures[p.id]["gpu_memory_gib"])
        unknown = (
            f"; {len(todo) - len(known)} not estimated (no model config.json here)" if len(known) < len(todo) else ""
        )
        return [
            f"disk ({len(known)} runs to submit): {disk:,.0f} GB of checkpoints when they end, at most "
            f"{max(figures[p.id]['disk_peak_gb'] for p in known):,.0f} GB for one run while it saves "
            f"(spec: checkpoints){unknown}",
            f"memory: at most ~{figures[peak.id]['gpu_memory_gib']:.1f} GiB per GPU ({peak.name}), estimated for "
            f"{peak.spec['resources']['gpu_memory_gib']:g} GiB GPUs (spec: resources.gpu_memory_gib)",
        ]


def plan_submission(
    spec_path: str,
    runs_dir: Path,
    db_url: str,
    backend: str | None = None,
    address: str | None = None,
    retry_failed: bool = False,
    dry_run: bool = False,
    check: bool = False,
) -> SweepPlan:
    """The plan of the sweep in the YAML at `spec_path` (SpecError, one line, for a bad spec): what `rpg sweep`
    shows (`dry_run`: a store it cannot read shows the states as unknown) or submits (StoreError)."""
    from rpg_cli.spec import load_sweep

    runs = plan_sweep(load_sweep(spec_path), Path(runs_dir), backend=backend)
    return plan_runs(runs, db_url, address, retry_failed, dry_run=dry_run, check=check)


def plan_runs(
    runs: list[RunPlan],
    db_url: str,
    address: str | None = None,
    retry_failed: bool = False,
    dry_run: bool = False,
    check: bool = False,
) -> SweepPlan:
    """The plan of `runs` (made by `plan_sweep`, or by hand): their states read once, their inputs checked once,
    the cluster decided once."""
    unread = None
    try:
        states = known_states(db_url, runs)
    except Exception as e:
        if not dry_run:
            raise
        unread = f"cannot read run states from {db_url} ({type(e).__name__}: {e}); showing them as unknown"
        states = {p.id: "unknown" for p in runs}
    return SweepPlan(
        sweep=runs[0].sweep if runs else "",
        runs=runs,
        states=states,
        checks=check_plans(runs, states, retry_failed),
        address=cluster_address(address),
        retry_failed=retry_failed,
        unread=unread,
        check=check,
        db_url=db_url,
    )


def _names(runs: tuple[str, ...], shown: int = 3) -> str:
    more = f" and {len(runs) - shown:,} more" if len(runs) > shown else ""
    return ", ".join(runs[:shown]) + more


def _verdicts(checked: dict) -> dict[str, str]:
    """Each checked run's verdict for --format json: "ok", or the backend's refusal (a run not in it: not checked,
    as succeeded, or of a backend without a check)."""
    return {
        name: "ok" if v.refusal is None else v.refusal
        for found in checked.values()
        if found is not None
        for v in found.verdicts
        for name in v.runs
    }


def _figure(figures: dict, key: str) -> str:
    value = figures.get(key)
    return "?" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _scoring_lines(plans: list[RunPlan]) -> dict[str, int]:
    """How the runs' answers are judged and their prompts tokenized: a line per distinct setting, with its runs."""
    from rpg_cli.benchmarks import describe_scorers

    lines: dict[str, int] = {}
    for p in plans:
        line = f"scorers: {describe_scorers(p.spec)}"
        kwargs = p.spec.get("chat_template_kwargs") or {}
        line += "; chat template: " + (", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "the tokenizer's defaults")
        lines[line] = lines.get(line, 0) + 1
    return lines


def _verl_blocks(plans: list[RunPlan]) -> dict[str, int]:
    """Each distinct `verl` block of the plans, as one line, with how many runs carry it; masked like every
    printout (a spec refuses credentials in the block: this is the second line of defence)."""
    from rpg_cli.store.url import redact

    lines: dict[str, int] = {}
    for p in plans:
        block = p.spec.get("verl") or {}
        parts = [
            f"{field} {' '.join(block[field])}" + (" (run id)" if field == "overrides" else "")
            for field in ("overrides", "site")
            if block.get(field)
        ]
        parts += [f"env {' '.join(f'{k}={v}' for k, v in block['env'].items())}"] if block.get("env") else []
        if parts:
            line = redact("; ".join(parts))
            lines[line] = lines.get(line, 0) + 1
    return lines
