"""`rpg sweep`: the plan (dry run) or the submission of a grid, and the live view of its runs."""

from __future__ import annotations

import typer

from rpg_cli.algorithms.table import algorithm
from rpg_cli.cli.common import db_option, error_line, fail, make_console, rpg_command, status_text, warn
from rpg_cli.watch import STALL_FACTOR, STALL_FLOOR_S


@rpg_command()
def sweep(
    spec: str = typer.Argument(..., metavar="SPEC", help="Sweep YAML: name, base, grid, include/exclude, seeds."),
    dry_run: bool = typer.Option(
        False, "--dry-run", metavar="", help="Print the plan (runs, their state in the store) and write nothing."
    ),
    check: bool = typer.Option(
        False,
        "--check",
        metavar="",
        help="With --dry-run: also run the backend's pre-submission check (verl: its plugin loads and its config "
        "takes the runs' overrides, once per distinct configuration) and print its verdicts; exit 2 if it refuses.",
    ),
    output_format: str = typer.Option(
        "table",
        "--format",
        metavar="table|json",
        help="Plan output: a table, or JSON (id, name, spec, state, entrypoint).",
    ),
    db: str = db_option(),
    runs_dir: str = typer.Option(
        "runs", "--runs-dir", metavar="PATH", help="Root of the run directories: PATH/<sweep>/<run>/."
    ),
    backend: str = typer.Option(
        None, "--backend", metavar="verl|local", help="Run every cell on this backend instead of the spec's."
    ),
    detach: bool = typer.Option(
        False, "--detach", metavar="", help="Submit and return at once instead of following progress."
    ),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", metavar="", help="Resubmit runs that failed or were stopped."
    ),
    stall_timeout: float = typer.Option(
        None,
        "--stall-timeout",
        metavar="SECONDS",
        help="Stop and fail a run that stays stalled this long: its metrics silent for longer than the spec's "
        f"watch.stall ({STALL_FACTOR:g} x its median step, at least {STALL_FLOOR_S:g} s by default), then SECONDS "
        "more. --retry-failed resumes it from its checkpoint.",
    ),
    address: str = typer.Option(
        None,
        "--address",
        envvar="RAY_ADDRESS",
        metavar="ADDR",
        help="Ray cluster (e.g. http://head:8265). Default: a local head bound to 127.0.0.1, started on first use, its files under --runs-dir.",
    ),
) -> None:
    """Expand a sweep spec into runs and submit one Ray job per run (or --dry-run to see the plan).

    Each run gets runs/<sweep>/<run>/ (spec.json, metrics.jsonl, checkpoints/, job.log) and a row in
    the results store; progress is followed live until every run has finished (Ctrl-C leaves the jobs
    running: the same command re-attaches). Re-running a sweep skips succeeded runs, re-attaches to
    live ones, and resubmits failed ones only with --retry-failed. While following, a run that logs a
    step beyond its bounds (the spec's watch block: by default the gap between vLLM's and the trainer's
    probabilities) is stopped and failed; with --stall-timeout, so is one whose metrics stopped coming.

    Examples:

      # the CPU grid, on a local Ray head
      rpg sweep experiments/smoke.yaml

      # the 20 runs of a paper grid and their state; nothing is written
      rpg sweep experiments/paper-qwen3-4b.yaml --dry-run

      # ... and whether verl takes their configuration, as a submission checks it
      rpg sweep experiments/paper-qwen3-4b.yaml --dry-run --check

      # on a GPU cluster, without waiting for the runs to finish
      rpg sweep experiments/paper-qwen3-4b.yaml --address http://head:8265 \\
          --detach

      # follow it, failing a run that hangs for an hour past its stall limit
      rpg sweep experiments/paper-qwen3-4b.yaml --address http://head:8265 \\
          --stall-timeout 3600
    """
    if output_format not in ("table", "json"):
        raise typer.BadParameter(f"{output_format!r}; allowed: table, json", param_hint="--format")
    if backend not in (None, "verl", "local"):
        raise typer.BadParameter(f"{backend!r}; allowed: verl, local", param_hint="--backend")
    if stall_timeout is not None and not (stall_timeout >= 0 and stall_timeout < float("inf")):
        raise typer.BadParameter(f"{stall_timeout!r}; allowed: seconds >= 0", param_hint="--stall-timeout")
    if check and not dry_run:
        raise typer.BadParameter("goes with --dry-run (a submission always runs the check)", param_hint="--check")
    if stall_timeout is not None and detach:
        raise typer.BadParameter(
            "stops stalled runs while `rpg sweep` follows them; drop --detach, or --stall-timeout",
            param_hint="--stall-timeout",
        )
    from pathlib import Path

    from rpg_cli.orchestration.plan import known_states, plan_sweep
    from rpg_cli.spec import SpecError, load_sweep

    try:
        plans = plan_sweep(load_sweep(spec), Path(runs_dir), backend=backend)
    except SpecError as e:
        fail("sweep", e)
    if not dry_run:
        _watch_sweep(
            plans,
            plans[0].sweep,
            db,
            address=address,
            detach=detach,
            retry_failed=retry_failed,
            runs_dir=runs_dir,
            stall_timeout=stall_timeout,
        )
        return
    try:
        states = known_states(db, plans)
    except Exception as e:  # a store we cannot read must not hide the plan
        warn("sweep", f"cannot read run states from {db} ({type(e).__name__}: {e}); showing them as unknown")
        states = {p.id: "unknown" for p in plans}
    checked = _config_checks(plans, states) if check and output_format == "json" else None
    verdicts = _verdicts(checked) if checked is not None else None
    if output_format == "json":
        import json

        from rpg_cli.benchmarks import describe_scorers
        from rpg_cli.inputs import validation_cost
        from rpg_cli.orchestration.plan import footprints

        figures = footprints(plans)
        rows = [
            {
                "id": p.id,
                "name": p.name,
                "spec": p.spec,
                "state": states[p.id],
                "entrypoint": p.entrypoint,
                "validation": (cost := validation_cost(p.spec)) and cost.as_dict(),
                "scorers": describe_scorers(p.spec),
                **figures[p.id],
                **({"check": verdicts.get(p.name)} if verdicts is not None else {}),
            }
            for p in plans
        ]
        typer.echo(json.dumps(rows, indent=2))
    else:
        _print_sweep_plan(plans, states, retry_failed)
    _print_elsewhere(plans, states, db)
    bad_inputs = _print_checks(plans, states, retry_failed)
    if check and checked is None:  # the plan is on screen first: the check takes a while
        checked = _config_checks(plans, states)
        for line in _config_check_lines(checked):
            typer.echo(line)
    if checked is not None:
        _say_check_times(checked)
    if bad_inputs or (checked and any(c is not None and c.refused for c in checked.values())):
        raise typer.Exit(2)


def _config_checks(plans: list, states: dict[str, str]) -> dict:
    """Each backend's pre-submission check of the runs (orchestration/preflight.py); one line and exit 2 when a
    check cannot run (the plugin does not load, a stage runs out of time)."""
    from rpg_cli.orchestration.preflight import check_configs

    try:
        return check_configs(plans, states)
    except RuntimeError as e:
        fail("sweep", e)


def _names(runs: tuple[str, ...], shown: int = 3) -> str:
    more = f" and {len(runs) - shown:,} more" if len(runs) > shown else ""
    return ", ".join(runs[:shown]) + more


def _config_check_lines(checked: dict) -> list[str]:
    """`--check`'s verdicts: per backend, how many distinct configurations its runs make, how many runs it
    takes, and a line per refused configuration naming its runs and the reason (masked like every printout)."""
    from rpg_cli.store.url import redact

    lines = [] if checked else ["check: nothing to check (every run succeeded)"]
    for backend, found in checked.items():
        if found is None:
            lines.append(f"{backend} check: none (backend {backend} has no pre-submission check)")
            continue
        runs, n = sum(len(v.runs) for v in found.verdicts), len(found.verdicts)
        lines.append(
            f"{backend} check: {runs:,} run(s) in {n:,} distinct configuration(s), each checked once ({found.alike})"
        )
        taken = [v for v in found.verdicts if v.refusal is None]
        if taken:
            lines.append(
                f"{backend} check: ok: {sum(len(v.runs) for v in taken):,} run(s) ({len(taken):,} configuration(s))"
            )
        for v in found.refused:
            lines.append(f"{backend} check: refused: {len(v.runs):,} run(s) ({_names(v.runs)}): {v.refusal}")
    return [redact(line) for line in lines]


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


def _say_check_times(checked: dict) -> None:
    for backend, found in checked.items():
        if found is not None:
            warn("sweep", f"the {backend} check took {found.total_s:.1f} s ({found.import_s:.1f} s importing)")


def _print_elsewhere(plans: list, states: dict[str, str], db: str) -> None:
    """One line on stderr per other sweep that already has some of these runs (a copied sweep file)."""
    from rpg_cli.orchestration.plan import recorded_elsewhere

    try:
        elsewhere = recorded_elsewhere(db, plans, states)
    except Exception:  # the states could not be read either: said above
        return
    for home, counts in elsewhere.items():
        how = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        what = "succeeded" if set(counts) == {"succeeded"} else f"recorded ({how})"
        warn(
            "sweep",
            f"{sum(counts.values())} run(s) already {what} in sweep {home}: a run is its spec, not its "
            f"sweep's name, so they are not run again and their files stay in {home}'s directory",
        )


def _print_checks(plans: list, states: dict[str, str], retry_failed: bool) -> bool:
    """The inputs of the runs to start, checked (data files, model, prompt lengths): one line each on
    stderr; returns whether any is an error."""
    from rpg_cli.orchestration.plan import check_line, check_plans

    checks = check_plans(plans, states, retry_failed)
    for check in checks:
        warn("sweep", check_line(check, len(plans)))
    return any(c.finding.error for c in checks)


def _print_sweep_plan(plans: list, states: dict[str, str], retry_failed: bool) -> None:
    from rich.table import Table

    from rpg_cli.orchestration.plan import footprints, summarize, validation_costs
    from rpg_cli.spec import context_label

    figures = footprints(plans)
    sized = any(f.get("gpu_memory_gib") is not None for f in figures.values())
    table = Table(title=f"sweep {plans[0].sweep}" if plans else "sweep", show_lines=False)
    columns = ("name", "id", "algorithm", "kl", "clip", "optimizer", "context", "seed", "state")
    for column in (*columns, "GPU GiB", "disk GB") if sized else columns:
        table.add_column(column, no_wrap=column != "name", justify="right" if column.endswith("B") else "left")
    for p in plans:
        clip = p.spec["clip"]
        clip_text = f"{clip['eps_low']:g}/{clip['eps_high']:g}" if clip else "off"
        if clip and algorithm(p.spec["algorithm"]).takes("clip.c"):  # the dual clip's bound, where it has one
            clip_text += f" c={clip['c']:g}"
        table.add_row(
            p.name,
            p.id,
            p.spec["algorithm"],
            p.spec["kl"],
            clip_text,
            p.spec["optimizer"],
            context_label(p.spec["context"]),
            str(p.spec["seed"]),
            states[p.id],
            *((_figure(figures[p.id], "gpu_memory_gib"), _figure(figures[p.id], "disk_gb")) if sized else ()),
        )
    console = make_console()
    console.print(table)
    n = summarize(plans, states, retry_failed)
    console.print(
        f"{n.runs} runs: {n.submit} to submit ({n.gpus:g} GPUs), {n.attach} live to re-attach, "
        f"{n.done} succeeded, {n.skip} failed/stopped skipped"
        + ("" if retry_failed or not n.skip else " (--retry-failed resubmits them)")
        + ". Dry run: nothing was written.",
        highlight=False,
    )
    for runs, problems, n, count, every in validation_costs(plans):
        per = (
            f"{problems:,} problems x {n} samples = {problems * n:,} generations"
            if problems is not None
            else f"{n} samples per problem (problems not counted: the files are not readable here)"
        )
        console.print(
            f"validation ({runs} runs): {per} per validation, {count} per run (before training, every "
            f"{every} steps and at the last)",
            highlight=False,
        )
    for line in _footprint_lines(plans, figures, states, retry_failed):
        console.print(line, highlight=False)
    for block, runs in _verl_blocks(plans).items():
        console.print(f"verl ({runs} runs): {block}", highlight=False, soft_wrap=True)
    for line, runs in _scoring_lines(plans).items():
        console.print(f"{line} ({runs} runs)", highlight=False)


def _figure(figures: dict, key: str) -> str:
    value = figures.get(key)
    return "?" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _footprint_lines(plans: list, figures: dict, states: dict[str, str], retry_failed: bool) -> list[str]:
    """What the runs to submit need, summed (disk) and at most (a GPU's memory), before a GPU is paid for."""
    from rpg_cli.states import SUBMIT, run_action

    todo = [p for p in plans if run_action(states[p.id], retry_failed) == SUBMIT and figures[p.id]]
    known = [p for p in todo if figures[p.id].get("disk_gb") is not None]
    if not todo:
        return []
    if not known:
        return [f"memory and disk ({len(todo)} runs): not estimated, no model config.json here (see the notes)"]
    disk = sum(figures[p.id]["disk_gb"] for p in known)
    peak = max(known, key=lambda p: figures[p.id]["gpu_memory_gib"])
    unknown = f"; {len(todo) - len(known)} not estimated (no model config.json here)" if len(known) < len(todo) else ""
    return [
        f"disk ({len(known)} runs to submit): {disk:,.0f} GB of checkpoints when they end, at most "
        f"{max(figures[p.id]['disk_peak_gb'] for p in known):,.0f} GB for one run while it saves (spec: checkpoints){unknown}",
        f"memory: at most ~{figures[peak.id]['gpu_memory_gib']:.1f} GiB per GPU ({peak.name}), estimated for "
        f"{peak.spec['resources']['gpu_memory_gib']:g} GiB GPUs (spec: resources.gpu_memory_gib)",
    ]


def _scoring_lines(plans: list) -> dict[str, int]:
    """How the runs' answers are judged and their prompts tokenized: a line per distinct setting, with its runs."""
    from rpg_cli.benchmarks import describe_scorers

    lines: dict[str, int] = {}
    for p in plans:
        line = f"scorers: {describe_scorers(p.spec)}"
        kwargs = p.spec.get("chat_template_kwargs") or {}
        line += "; chat template: " + (", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "the tokenizer's defaults")
        lines[line] = lines.get(line, 0) + 1
    return lines


def _verl_blocks(plans: list) -> dict[str, int]:
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


def _progress_caption(snapshot) -> str:
    counts = snapshot.counts
    return (
        f"pending {counts['pending'] + counts['submitted']} · running {counts['running']} · "
        f"succeeded {counts['succeeded']} · failed {counts['failed']} · stopped {counts['stopped']}"
        + (f" · preempted {counts['preempted']}" if counts.get("preempted") else "")
    )


def _progress_table(snapshot):
    from rich.table import Table

    table = Table(title=f"sweep {snapshot.sweep}", caption=_progress_caption(snapshot))
    for column in ("name", "id", "status", "attempt", "step", "reward", "error"):
        table.add_column(
            column, justify="right" if column in ("attempt", "step", "reward") else "left", no_wrap=column != "error"
        )
    for r in snapshot.runs:
        table.add_row(
            r.name,
            r.id,
            status_text(r.status),
            str(r.attempts),
            "-" if r.step is None else str(r.step),
            "-" if r.reward is None else f"{r.reward:.4f}",
            error_line(r.error, 50),
        )
    return table


def _detached(before: dict[str, str], final, retry_failed: bool) -> str:
    """What `rpg sweep --detach` did, from the runs' states before it and after its submissions: how many
    it submitted, and what the others are (never "submitted" when nothing was)."""
    from rpg_cli.states import LIVE, SUBMIT, run_action

    status = {r.id: r.status for r in final.runs}  # one per run (a grid may name a run twice)
    to_submit = {i for i in status if run_action(before.get(i, "new"), retry_failed) == SUBMIT}
    submitted = sum(status[i] in LIVE for i in to_submit)
    refused = len(to_submit) - submitted  # Ray refused the job: recorded failed, with its answer
    others = [s for i, s in status.items() if i not in to_submit]
    live = sum(s in LIVE for s in others)  # re-attached (a job the cluster had lost is submitted again)
    parts = [
        f"{n} {what}"
        for n, what in (
            (sum(s == "succeeded" for s in others), "succeeded"),
            (live, "live"),
            (sum(s in ("failed", "stopped") for s in others), "failed or stopped (--retry-failed reruns them)"),
            (refused, "refused by Ray (`rpg runs --wide` shows why)"),
        )
        if n
    ]
    sweep = final.sweep
    line = f"submitted {submitted} run(s) of {sweep}" if submitted else f"nothing to submit in {sweep}"
    if parts:
        line += ("; " if submitted else ": ") + ", ".join(parts)
    if submitted or live:
        line += f"; follow with `rpg runs --sweep {sweep}` or `rpg logs RUN --follow`"
    return line


def _watch_sweep(
    plans: list,
    sweep_name: str,
    db: str,
    address: str | None = None,
    detach: bool = False,
    retry_failed: bool = False,
    runs_dir: str = "runs",
    stall_timeout: float | None = None,
) -> None:
    """Submit a sweep's plans as Ray jobs and, unless `detach`, follow them until all have finished:
    a live table on a terminal, a line per change of the counts otherwise (logs, CI). Exits 0 when
    every run succeeded, 1 when some failed, stopped or were preempted, 2 on a cluster or store error, 130 on Ctrl-C
    (the jobs keep running; the same command re-attaches)."""
    import os
    from pathlib import Path

    from rich.live import Live

    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.orchestration.plan import PreflightError, check_line, check_plans, known_states, refuse_bad_inputs
    from rpg_cli.orchestration.sweep import run_sweep
    from rpg_cli.store import StoreError

    console = make_console()
    live = Live(console=console, auto_refresh=False) if console.is_terminal and not detach else None
    last_caption = None

    def show(snapshot) -> None:
        nonlocal last_caption
        if live is not None:
            live.update(_progress_table(snapshot), refresh=True)
        elif not detach and _progress_caption(snapshot) != last_caption:
            last_caption = _progress_caption(snapshot)
            console.print(f"sweep {sweep_name}: {last_caption}", highlight=False)

    try:  # a run that would fail on its inputs: one line, before any head, run directory or row
        before = known_states(db, plans)
        checks = check_plans(plans, before, retry_failed)
        for check in checks:
            if not check.finding.error:
                warn("sweep", check_line(check, len(plans)))
        refuse_bad_inputs(checks, len(plans))
    except (StoreError, PreflightError) as e:
        fail("sweep", e)
    cluster = address or os.environ.get("RAY_ADDRESS")  # none: the local head rpg starts
    where = cluster or f"the local Ray head in {runs_dir}/ray (started on first use, ~15 s)"
    warn("sweep", f"{sweep_name}: {len(plans)} runs; connecting to {where}")
    try:
        if live is not None:
            live.start()
        final = run_sweep(
            plans,
            sweep_name,
            db,
            address=address,
            detach=detach,
            retry_failed=retry_failed,
            on_update=show,
            runs_dir=Path(runs_dir),
            stall_timeout=stall_timeout,
        )
    except KeyboardInterrupt:
        typer.echo(
            f"rpg sweep: stopped following {sweep_name}; its jobs keep running. Run the same command to "
            f"re-attach, `rpg runs --sweep {sweep_name}` to look, `rpg cancel {sweep_name}` to stop them.",
            err=True,
        )
        raise typer.Exit(130) from None
    except (ClusterError, StoreError, PreflightError) as e:
        fail("sweep", e)
    finally:
        if live is not None:
            live.stop()
    if live is None:
        console.print(_progress_table(final))
    if detach:
        typer.echo(_detached(before, final, retry_failed))
        return
    if not cluster:  # a head rpg started: say it is still there
        warn("sweep", f"the local Ray head in {runs_dir}/ray stays up for the next command; `rpg stop` ends it")
    if any(r.status in ("failed", "stopped", "preempted") for r in final.runs):
        raise typer.Exit(1)
