"""`rpg report` and `rpg compare`: the paper's tables with intervals, plots, and B - A with a verdict."""

from __future__ import annotations

import typer

from rpg_cli.cli.common import (
    address_option,
    check_format,
    comma_list,
    db_option,
    existing_store,
    fail,
    format_option,
    live_runs,
    make_console,
    one_blas_thread,
    reconcile_shown,
    rpg_command,
    runs_dir_option,
    sweep_option,
    where_option,
)

COMPARE_FORMATS = ("text", "json")


@rpg_command()
def report(
    table: bool = typer.Option(
        False, "--table", metavar="", help="The Last/Best table (the default when neither --table nor --plot is given)."
    ),
    plot: bool = typer.Option(
        False,
        "--plot",
        metavar="",
        help="Training-dynamics figures (PNG and SVG), one panel per metric, one line per run.",
    ),
    cost: bool = typer.Option(
        False,
        "--cost",
        metavar="",
        help="What each cell cost: runs, device-hours (mean ± 95% interval over seeds, and the total), each phase's share of the step time, tokens/s per device, MFU. Same cells and formats as --table.",
    ),
    sweep_name: str = sweep_option(),
    metric: str = typer.Option(
        "mean@k",
        "--metric",
        metavar="METRIC",
        help="Score to tabulate: mean@K, pass@K or maj@K; K=k takes the largest k scored.",
    ),
    benchmarks: str = typer.Option(
        None,
        "--benchmarks",
        metavar="B[,B]",
        help="Columns to show, e.g. aime24,aime25 (default: every benchmark scored).",
    ),
    output_format: str = format_option(
        None,
        "Table format: table, markdown, latex, csv or json (default: from --output's suffix .md/.tex/.csv/.json, else a terminal table).",
    ),
    output: str = typer.Option(
        None,
        "--output",
        "-o",
        metavar="FILE|DIR",
        help="--table: write to FILE instead of printing. --plot: directory of the figures (default runs/plots).",
    ),
    compare_paper: bool = typer.Option(
        False,
        "--compare-paper",
        metavar="",
        help="Add the paper's Best (test-selected: the maximum over test evaluations) and put the paper's published numbers and the difference beside Last and that Best.",
    ),
    select_on: str = typer.Option(
        None,
        "--select-on",
        metavar="BENCHMARK",
        help="Held-out benchmark that picks each run's step for Best (val-selected), reported on the test benchmarks at that step; it is then not a test column. Default: none (no Best (val-selected) column).",
    ),
    scorer: str = typer.Option(
        None,
        "--scorer",
        metavar="SCORER",
        help="`rpg eval` scorer whose scores to show (default: the one with the most scores).",
    ),
    per_seed: bool = typer.Option(
        False,
        "--per-seed",
        metavar="",
        help="--plot: also draw each seed's run as a thin line under its method's mean and band.",
    ),
    metrics: str = typer.Option(
        None,
        "--metrics",
        metavar="M[,M]",
        help="--plot panels: reward, entropy, response_length, kl, reference_kl, reference_age, val (one per benchmark), or any logged key. Default: those of these that were logged.",
    ),
    smooth: int = typer.Option(1, "--smooth", min=1, metavar="N", help="--plot: moving average over N logged steps."),
    x_axis: str = typer.Option(
        "step",
        "--x",
        metavar="step|device-hours",
        help="--plot's x axis: the training step, or each run's cumulative device-hours through it (devices x summed timing_s/step + timing_s/testing).",
    ),
    fixed_problems: bool = typer.Option(
        False,
        "--fixed-problems",
        metavar="",
        help="Intervals over new seeds on these problems (what most papers mean), not the default over new seeds and new problems of the same kind; one run per method then gives no interval.",
    ),
    db: str = db_option(),
    address: str = address_option(),
    runs_dir: str = runs_dir_option(),
) -> None:
    """Print the paper's Last/Best tables, with 95% confidence intervals, and training curves with bands.

    Rows are methods named as in the paper (optimizer, clip... added where runs of one method differ),
    grouped by model, context and sampling protocol. A cell holds one source (`rpg eval` of one scorer and
    protocol, else logged validation): runs scored there only another way are named in the footer, never
    averaged in; other protocols get their own section or a footer line with the flags that show them.
    Columns per benchmark: Last (the final evaluated step); Best (val-selected) with --select-on; Best
    (test-selected, the paper's, biased upward) with --compare-paper. Each cell is the mean over seeds in
    percent, ± half its 95% confidence interval: over new seeds and new problems when `rpg eval` stored
    the samples (--fixed-problems: new seeds, these problems), over seeds only from logged validation
    means. The footer says which, with the seeds, problems and sampling settings, and warns where few
    seeds make the interval cover less. Best of each column bold, second underlined.

    Only runs that finished give scores. A run that failed, diverged, stopped, was preempted or still
    runs counts in its row's seeds as finished/ran ("2/3"), and the footer names it with its state,
    reason and the step it reached; CSV and JSON list those runs per cell.

    --cost: per cell, device-hours (devices x the time each run held them, not the time it queued: mean
    over the runs that finished ± half its 95% interval over seeds, and the total over every run), the
    share of each phase (generation, old log-prob, reference, update, weight sync, validation; other: the
    rest) of the summed step time, tokens/s per device and MFU ("-": not logged, as on a CPU).

    Examples:

      rpg report --table --sweep smoke-seeds
      rpg report --table --select-on aime25 --format markdown
      rpg report --table --sweep paper-qwen3-4b --compare-paper -o table.tex
      rpg report --plot --metrics reward,val --per-seed --smooth 5
      rpg report --cost --sweep smoke-seeds
      rpg report --cost --sweep paper-qwen3-4b -o cost.csv
      rpg report --plot --metrics val --x device-hours
    """
    from pathlib import Path

    one_blas_thread()
    from rpg_cli import report as rp
    from rpg_cli.rundir import PLOTS_DIR, write_atomic
    from rpg_cli.store import StoreError

    check_format("report", output_format, ("table", *rp.RENDERERS))
    if (table or cost) and plot and output:
        fail(
            "report",
            ValueError("--output names the table file or the plots directory: use it with --table or --plot, not both"),
        )
    if table and cost:
        fail("report", ValueError("--table and --cost: ask for one table at a time"))
    if x_axis not in rp.X_AXES:
        fail("report", ValueError(f"--x {x_axis}: expected {' or '.join(rp.X_AXES)}"))
    with existing_store("report", db) as store:
        try:
            reconcile_shown("report", store, live_runs(store, sweep_name), address, runs_dir, marked=False)
            if cost:
                fmt = output_format or (
                    rp.FORMAT_BY_SUFFIX.get(Path(output).suffix.lower(), "table") if output else "table"
                )
                costs = rp.build_cost_table(store, sweep_name)
                text = rp.COST_RENDERERS[fmt](costs) if fmt != "table" else _render_cost(costs, to_text=bool(output))
                if output:
                    typer.echo(f"wrote {write_atomic(output, text)}")
                elif text:
                    typer.echo(text, nl=False)
            elif table or not plot:
                fmt = output_format or (
                    rp.FORMAT_BY_SUFFIX.get(Path(output).suffix.lower(), "table") if output else "table"
                )
                built = rp.build_table(
                    store,
                    rp.TableOptions(
                        sweep=sweep_name,
                        metric=metric,
                        benchmarks=comma_list(benchmarks),
                        compare_paper=compare_paper,
                        select_on=select_on,
                        scorer=scorer,
                        fixed_problems=fixed_problems,
                    ),
                )
                text = rp.RENDERERS[fmt](built) if fmt != "table" else _render_report_table(built, to_text=bool(output))
                if output:
                    typer.echo(f"wrote {write_atomic(output, text)}")
                elif text:
                    typer.echo(text, nl=False)
            if plot:
                fig = rp.plot_training(
                    store,
                    rp.PlotOptions(
                        sweep=sweep_name,
                        metrics=comma_list(metrics) or rp.DEFAULT_PLOT_METRICS,
                        smooth_window=smooth,
                        strict=metrics is not None,
                        per_seed=per_seed,
                        x=x_axis,
                    ),
                )
                for path in rp.save_figure(fig, output or f"runs/{PLOTS_DIR}", f"training-{sweep_name or 'all'}"):
                    typer.echo(f"wrote {path}")
        except (rp.ReportError, StoreError) as e:
            fail("report", e)


@rpg_command()
def compare(
    a: str = typer.Argument(
        ...,
        metavar="A",
        help="The baseline: a method as `rpg report` names it (GRPO, 'RPG-REINFORCE-URKL (clip 0.1/0.1)'), run ids or names (comma-separated), or a spec filter FIELD=VALUE[&FIELD=VALUE...].",
    ),
    b: str = typer.Argument(..., metavar="B", help="The challenger, given the same ways: the differences are B - A."),
    sweep_name: str = sweep_option(),
    where: list[str] = where_option(" On both sides."),
    step: str = typer.Option(
        "last", "--step", metavar="last|N", help="Each run's final evaluated step, or step N of every run."
    ),
    budget: float = typer.Option(
        None,
        "--budget",
        metavar="DEVICE-HOURS",
        help="Compare at equal compute: each run's score by H device-hours (devices x its summed step time), read as a step function: its last evaluated step at or below H, no interpolation. A run that finished before H keeps its final score; one still running, or that failed/stopped before H, is named and not compared.",
    ),
    metric: str = typer.Option(
        "mean@k",
        "--metric",
        metavar="METRIC",
        help="mean@K or pass@K (per problem, from `rpg eval` samples), maj@K (benchmark means); K=k: the largest k scored.",
    ),
    scorer: str = typer.Option(
        None, "--scorer", metavar="SCORER", help="`rpg eval` scorer (default: the one with the most scores)."
    ),
    benchmarks: str = typer.Option(
        None,
        "--benchmarks",
        "-b",
        metavar="B[,B]",
        help="Benchmarks to compare on (default: every one scored for all runs of both sides).",
    ),
    output_format: str = format_option("text", "Lines for a terminal, or everything as JSON.", COMPARE_FORMATS),
    fixed_problems: bool = typer.Option(
        False,
        "--fixed-problems",
        metavar="",
        help="Intervals over new seeds on these problems (what most papers mean), not the default over new seeds and new problems of the same kind.",
    ),
    pair_seeds: bool = typer.Option(
        False,
        "--pair-seeds",
        metavar="",
        help="Pair A's and B's runs by seed number: only for runs that share their randomness (the same seed rarely gives the same rollouts). Default: seeds unpaired.",
    ),
    effect: float = typer.Option(
        None,
        "--effect",
        metavar="POINTS",
        help="An effect size in points (e.g. 5): also print the seeds per method that would detect it at 80% power.",
    ),
    db: str = db_option(),
) -> None:
    """Say whether B beats A: the paired difference B - A per benchmark and overall, with its 95% interval.

    Runs are paired by problem (both sides answer the same problems); seeds are unpaired unless
    --pair-seeds. Each line gives B - A in points with its interval (over new seeds and new problems, or
    with --fixed-problems over new seeds on these problems: the line says which), P(B > A) (the
    probability that a random run of B beats a random run of A on a random problem) with its interval,
    the smallest difference these seeds and problems detect at 80% power (--effect POINTS: the seeds per
    method that detect that effect), and the verdict: "B better", "A better" or "no detectable
    difference"; under no true difference it says "better" in at most about 5% of experiments, from 2
    seeds on. Spec fields that also differ between the groups (other than the compared ones and the
    seed) are listed in bold: they make the comparison unfair. Scores drawn under different sampling
    settings or scorers are refused. Only finished runs are compared: a side that lost seeds (failed,
    diverged, stopped, preempted, still running) says how many and how ("GRPO: 1 of 3 seeds diverged at
    step 120; the interval is over the 2 that finished").

    --budget H compares at equal compute instead of at a step: each run's cumulative device-hours at each
    evaluated step (devices x the summed timing_s/step + timing_s/testing through it), and the score it
    had reached by H: the one at its last evaluated step at or below H (no interpolation between
    evaluations). A run that finished before H keeps its final score; a run that reached H counts
    whatever its state now; one still running, or that ended otherwise before H, or with no evaluation
    by H, never reached it: one line per side names them; a side with none left is an error. The header
    gives each side's mean device-hours behind its scores.

    Examples:

      rpg compare GRPO DAPO --sweep smoke-seeds
      rpg compare algorithm=grpo 'algorithm=rpg&kl=urkl' --where context=4k
      rpg compare GRPO RPG-REINFORCE-URKL --step 200 -b aime24 --format json
      rpg compare GRPO DAPO --fixed-problems --effect 5
      rpg compare grpo-s0-1a2b3c4d,grpo-s1-5e6f7a8b dapo-s0-9c0d1e2f
      rpg compare GRPO RPG-REINFORCE-URKL --budget 120
    """
    one_blas_thread()
    from rpg_cli import report as rp
    from rpg_cli.stats import StatsError
    from rpg_cli.store import StoreError

    check_format("compare", output_format, COMPARE_FORMATS)
    if step != "last" and not step.isdigit():
        fail("compare", ValueError(f"--step {step!r}: expected last or a step number"))
    if budget is not None and step != "last":
        fail("compare", ValueError("--budget and --step: compare at a step or at a budget, not both"))
    if budget is not None and not budget > 0:
        fail("compare", ValueError(f"--budget {budget:g}: give device-hours above 0"))
    if effect is not None and not 0 < effect <= 100:
        fail("compare", ValueError(f"--effect {effect:g}: give a difference in points, above 0 and at most 100"))
    options = rp.CompareOptions(
        sweep=sweep_name,
        where=tuple(where or ()),
        metric=metric,
        scorer=scorer,
        step=None if step == "last" else int(step),
        benchmarks=comma_list(benchmarks),
        pair_seeds=pair_seeds,
        fixed_problems=fixed_problems,
        effect=None if effect is None else effect / 100,
        budget=budget,
    )
    with existing_store("compare", db) as store:
        try:
            result = rp.compare_groups(store, a, b, options)
        except (rp.ReportError, StoreError, StatsError) as e:
            fail("compare", e)
    if output_format == "json":
        typer.echo(result.to_json(), nl=False)
        return
    from rich.markup import escape

    console = make_console()
    for line in [*result.header(), *result.lines()]:
        console.print(escape(line), highlight=False, soft_wrap=True)  # one compare line stays one line
    for line in result.difference_text():
        console.print(f"[bold]also differs: {escape(line)}[/]", highlight=False)
    for line in result.notes:
        console.print(f"note: {escape(line)}", highlight=False)


def _render_report_table(built, to_text: bool = False) -> str:
    """The terminal table: one rich table per model and context. Printed directly (returns ''), or
    returned as plain text when it goes to a file."""
    import io

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from rpg_cli import report as rp

    console = Console(file=io.StringIO(), width=200, color_system=None) if to_text else make_console()
    for group in built.groups:
        console.print(f"[bold]{escape(rp.group_title(group))} · {built.metric} (%)[/]", highlight=False)
        table = Table()
        table.add_column("method", no_wrap=True)
        table.add_column("seeds", justify="right")
        for bench, which in built.columns:
            table.add_column(rp.column_title(bench, which), justify="right", no_wrap=True)
        for row in group.rows:
            cells = []
            for column in built.columns:
                cell = row.cells[column]
                text = rp.cell_text(cell).replace("[", r"\[")
                text = f"[bold]{text}[/]" if cell.rank == 1 else f"[underline]{text}[/]" if cell.rank == 2 else text
                if cell.paper is not None:
                    text += f"\n[dim]paper {rp.fmt(cell.paper)} Δ {rp.fmt(cell.diff, signed=True)}[/]"
                cells.append(text)
            table.add_row(row.method.replace("[", r"\["), row.seeds_text, *cells)
        console.print(table)
    console.print("bold: best of its column, underlined: second.", *rp.footer(built), sep="\n", highlight=False)
    return console.file.getvalue() if to_text else ""


def _render_cost(costs, to_text: bool = False) -> str:
    """The terminal cost table: one rich table per model and context, then the footer. Printed directly
    (returns ''), or returned as plain text when it goes to a file."""
    import io

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from rpg_cli.report import costs as rc

    console = Console(file=io.StringIO(), width=200, color_system=None) if to_text else make_console()
    for (model, context), rows in rc.groups(costs).items():
        console.print(f"[bold]{escape(model)} · {escape(context)} · cost[/]", highlight=False)
        table = Table()
        table.add_column("method", no_wrap=True)
        table.add_column("runs", justify="right")
        for title in rc.header(costs):
            table.add_column(title, justify="right", no_wrap=True)
        for row in rows:
            table.add_row(escape(row.method), row.runs_text, *(escape(c) for c in rc.cells(costs, row)))
        console.print(table)
    for line in costs.notes:
        console.print(escape(line), highlight=False, soft_wrap=True)  # one note stays one line
    return console.file.getvalue() if to_text else ""
