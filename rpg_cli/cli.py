"""The `rpg` command line: parse, call one function, render. No logic lives here.

Heavy packages (torch, ray, verl, transformers, SQLAlchemy) are imported inside the commands that need
them, so that `rpg --help` and `rpg sweep --dry-run` answer at once.
"""

from __future__ import annotations

import functools
import inspect

import typer

from rpg_cli.store.url import DB_ENVVAR

app = typer.Typer(
    name="rpg",
    help=(
        "Run, evaluate and compare KL-regularized policy-gradient algorithms for LLM reasoning "
        "(RPG, arXiv 2505.17508).\n\n"
        "prepare-data -> sweep -> eval -> report: raw sources become verl parquet, a grid of typed "
        "specs becomes one Ray job per run, checkpoints are scored with accuracy@k, and the results "
        "store prints the paper's Last/Best tables."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _command(name: str | None = None):
    """`app.command`, with the docstring as help that wraps to the terminal: each paragraph becomes
    one line (rich wraps it), indented blocks (the examples) stay line by line. A file the command
    cannot write or read (read-only, full disk, no permission) ends it with one line naming the path
    and the fix, exit 2."""

    def register(function):
        paragraphs = inspect.cleandoc(function.__doc__ or "").split("\n\n")
        text = "\n\n".join(p if p.startswith(" ") else " ".join(p.split()) for p in paragraphs)

        @functools.wraps(function)
        def command(*args, **kwargs):
            from rpg_cli.rundir import known_failure, os_error_line

            try:
                return function(*args, **kwargs)
            except OSError as e:
                _fail(name or function.__name__, OSError(os_error_line(e)))
            except Exception as e:  # a full disk met by a library that does not raise OSError (torch.save, safetensors)
                if isinstance(e, typer.Exit) or not (line := known_failure(f"{type(e).__name__}: {e}")):
                    raise
                _fail(name or function.__name__, RuntimeError(line))

        return app.command(name, help=text)(command)

    return register


_DB_HELP = "Results store: a SQLAlchemy URL or a SQLite file path; default: $RPG_DB, else sqlite:///runs/results.db."
_ADDRESS_HELP = (
    "Ray cluster (dashboard URL or head address); default: $RAY_ADDRESS, else the local head under --runs-dir."
)
_RUNS_DIR_HELP = "Root of the run directories; the local Ray head keeps its files in PATH/ray."
_STATUS_STYLE = {
    "pending": "dim",
    "submitted": "cyan",
    "running": "blue",
    "succeeded": "green",
    "failed": "red",
    "stopped": "yellow",
}


@_command("prepare-data")
def prepare_data(
    sources: list[str] = typer.Argument(
        None,
        metavar="SOURCE",
        show_default=False,
        help="Presets dapo-math-17k, aime24, aime25, amc23 (the default), minerva_math, olympiadbench; PRESET=FILE or PRESET=hf:OWNER/NAME:CONFIG@SPLIT reads another copy.",
    ),
    out: str = typer.Option("data", "--out", "-o", metavar="DIR", help="Directory for the parquet files."),
    from_origin: str = typer.Option(
        None,
        "--from",
        metavar="FILE|hf:ID",
        help="Read the one preset named from this local file or hub dataset (same as PRESET=FILE).",
    ),
    input_file: str = typer.Option(
        None,
        "--input",
        "-i",
        metavar="FILE",
        help="Any local file of problems (.jsonl, .json, .csv, .tsv, .parquet), written as NAME.parquet.",
    ),
    name: str = typer.Option(
        None,
        "--name",
        metavar="NAME",
        help="Name of the --input set: output NAME.parquet, data_source NAME (default: the file's stem).",
    ),
    data_source: str = typer.Option(
        None,
        "--data-source",
        metavar="NAME",
        help="data_source of the --input rows (default: NAME); it picks verl's reward function and names the metrics.",
    ),
    question_field: str = typer.Option(
        None,
        "--question-field",
        metavar="FIELD",
        help="Field holding the problem (default: auto-detect); dotted paths reach into structs, as in extra_info.raw_problem",
    ),
    answer_field: str = typer.Option(
        None,
        "--answer-field",
        metavar="FIELD",
        help="Field holding the final answer (default: auto-detect), as in reward_model.ground_truth",
    ),
    english_only: bool = typer.Option(
        None,
        "--english-only/--any-language",
        show_default=False,
        metavar="",
        help="Drop problems written mostly in non-Latin scripts (default: on for dapo-math-17k only).",
    ),
    dedup: bool = typer.Option(
        True,
        "--dedup/--no-dedup",
        metavar="",
        help="Drop repeated problems (equal up to case, whitespace and Unicode form).",
    ),
    strict: bool = typer.Option(
        False,
        "--strict",
        metavar="",
        help="Stop on any malformed row (empty question, missing answer) and write nothing, instead of skipping it.",
    ),
    toy: bool = typer.Option(
        False,
        "--toy",
        metavar="",
        help="Instead, write the local backend's toy task and tiny model (no download) to OUT/toy: model/, train.parquet, val.parquet.",
    ),
) -> None:
    """Write verl-format parquet for training (DAPO-Math-17k) and evaluation (AIME24/25, AMC23, ...).

    Each problem becomes one row with the paper's prompt (DAPO's "Answer:" template), its ground
    truth and data_source; the k samples of accuracy@k come from the sampler (a run's val.n, rpg eval
    --k), not from copies. A table shows, per source, the rows read, dropped (and why) and the problems
    written. Everything is read before anything is written; files are replaced atomically.

    Sources: dapo-math-17k (math-dataset/DAPO-17k-Eng, the paper's English DAPO-Math-17k,
    deduplicated, data_source math_dapo), aime24 (HuggingFaceH4/aime_2024, math_dapo), aime25
    (math-ai/aime25, aime2025), amc23 (math-ai/amc23, amc_23), minerva_math (math-ai/minervamath,
    minerva_math), olympiadbench (math-ai/olympiadbench, olympiadbench). Fields of local files are
    auto-detected (problem, question, prompt, ... / answer, reward_model.ground_truth, ...); verl files
    are unwrapped to raw problems.

    Examples:

      # the training set and the three evaluation sets from the Hub into data/
      rpg prepare-data

      # the evaluation sets only; the appendix benchmarks (Table 7)
      rpg prepare-data aime24 aime25 amc23
      rpg prepare-data minerva_math olympiadbench

      # local copies (offline machines), another hub copy, any file of problems
      rpg prepare-data aime24=aime24.jsonl
      rpg prepare-data dapo-math-17k --from dapo-math-17k-eng.parquet
      rpg prepare-data dapo-math-17k=hf:BytedTsinghua-SIA/DAPO-Math-17k@train
      rpg prepare-data --input mine.csv --question-field q --answer-field a

      # the local backend's toy task and tiny model in data/toy/
      rpg prepare-data --toy
    """
    from pathlib import Path

    if toy:
        if sources or from_origin or input_file:
            raise typer.BadParameter("--toy writes the toy task only; drop the sources", param_hint="--toy")
        from rpg_cli.datasets.toy import write_toy

        paths = write_toy(Path(out) / "toy")
        typer.echo(f"toy task: model {paths.model}, train {paths.train}, val {paths.val}")
        return

    from rpg_cli.datasets import PrepareError, SourceError, SourceOptions, prepare, resolve_sources

    options = SourceOptions(
        question_field=question_field, answer_field=answer_field, english_only=english_only, dedup=dedup
    )
    try:
        specs = resolve_sources(
            sources or [],
            out_dir=Path(out),
            options=options,
            from_origin=from_origin,
            input_file=Path(input_file) if input_file else None,
            name=name,
            data_source=data_source,
        )
        reports = prepare(specs, strict=strict)
    except PrepareError as e:
        _print_malformed_rows(e.reports)
        _fail("prepare-data", e)
    except SourceError as e:
        _fail("prepare-data", e)
    _print_malformed_rows(reports)
    _print_prepare_summary(reports)


def _print_malformed_rows(reports: list, limit: int = 20) -> None:
    for r in reports:
        for where, why in r.malformed[:limit]:
            typer.echo(f"rpg prepare-data: {r.name} ({r.origin}) {where}: {why}", err=True)
        if len(r.malformed) > limit:
            typer.echo(f"rpg prepare-data: {r.name}: ... and {len(r.malformed) - limit} more malformed rows", err=True)


def _print_prepare_summary(reports: list) -> None:
    import sys

    from rich.console import Console
    from rich.table import Table

    table = Table(title="prepare-data")
    for column in ("source", "from", "read", "dropped", "problems", "file"):
        table.add_column(column, justify="right" if column in ("read", "problems") else "left")
    for r in reports:
        dropped = "\n".join(f"{n:,} {reason}" for reason, n in r.dropped.items()) or "-"
        origin = f"{r.origin}\nfields: {r.question_field}, {r.answer_field}"
        table.add_row(r.name, origin, f"{r.read:,}", dropped, f"{r.problems:,}", str(r.output))
    Console(width=None if sys.stdout.isatty() else 200).print(table, highlight=False)


@_command()
def sweep(
    spec: str = typer.Argument(..., metavar="SPEC", help="Sweep YAML: name, base, grid, include/exclude, seeds."),
    dry_run: bool = typer.Option(
        False, "--dry-run", metavar="", help="Print the plan (runs, their state in the store) and write nothing."
    ),
    output_format: str = typer.Option(
        "table",
        "--format",
        metavar="table|json",
        help="Plan output: a table, or JSON (id, name, spec, state, entrypoint).",
    ),
    db: str = typer.Option(None, "--db", metavar="URL", envvar=DB_ENVVAR, show_envvar=False, help=_DB_HELP),
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
    live ones, and resubmits failed ones only with --retry-failed.

    Examples:

      # the CPU grid, on a local Ray head
      rpg sweep experiments/smoke.yaml

      # the 20 runs of a paper grid and their state; nothing is written
      rpg sweep experiments/paper-qwen3-4b.yaml --dry-run

      # on a GPU cluster, without waiting for the runs to finish
      rpg sweep experiments/paper-qwen3-4b.yaml --address http://head:8265 \\
          --detach
    """
    if output_format not in ("table", "json"):
        raise typer.BadParameter(f"{output_format!r}; allowed: table, json", param_hint="--format")
    if backend not in (None, "verl", "local"):
        raise typer.BadParameter(f"{backend!r}; allowed: verl, local", param_hint="--backend")
    from pathlib import Path

    from rpg_cli.orchestration.plan import known_states, plan_sweep
    from rpg_cli.spec import SpecError, load_sweep
    from rpg_cli.store.url import DEFAULT_DB_URL

    db = db or DEFAULT_DB_URL

    try:
        plans = plan_sweep(load_sweep(spec), Path(runs_dir), backend=backend)
    except SpecError as e:
        _fail("sweep", e)
    if not dry_run:
        _watch_sweep(
            plans, plans[0].sweep, db, address=address, detach=detach, retry_failed=retry_failed, runs_dir=runs_dir
        )
        return
    try:
        states = known_states(db, plans)
    except Exception as e:  # a store we cannot read must not hide the plan
        _warn("sweep", f"cannot read run states from {db} ({type(e).__name__}: {e}); showing them as unknown")
        states = {p.id: "unknown" for p in plans}
    if output_format == "json":
        import json

        from rpg_cli.spec import validation_cost

        rows = [
            {
                "id": p.id,
                "name": p.name,
                "spec": p.spec,
                "state": states[p.id],
                "entrypoint": p.entrypoint,
                "validation": (cost := validation_cost(p.spec)) and cost.as_dict(),
            }
            for p in plans
        ]
        typer.echo(json.dumps(rows, indent=2))
    else:
        _print_sweep_plan(plans, states, retry_failed)
    if _print_checks(plans, states, retry_failed):
        raise typer.Exit(2)


def _print_checks(plans: list, states: dict[str, str], retry_failed: bool) -> bool:
    """The inputs of the runs to start, checked (data files, model, prompt lengths): one line each on
    stderr; returns whether any is an error."""
    from rpg_cli.orchestration.plan import check_line, check_plans

    checks = check_plans(plans, states, retry_failed)
    for check in checks:
        _warn("sweep", check_line(check, len(plans)))
    return any(c.finding.error for c in checks)


def _print_sweep_plan(plans: list, states: dict[str, str], retry_failed: bool) -> None:
    from rich.table import Table

    from rpg_cli.orchestration.plan import summarize, validation_costs

    table = Table(title=f"sweep {plans[0].sweep}" if plans else "sweep", show_lines=False)
    for column in ("name", "id", "algorithm", "kl", "clip", "optimizer", "context", "seed", "state"):
        table.add_column(column, no_wrap=column != "name")
    for p in plans:
        clip = p.spec["clip"]
        clip_text = f"{clip['eps_low']:g}/{clip['eps_high']:g} c={clip['c']:g}" if clip else "off"
        table.add_row(
            p.name,
            p.id,
            p.spec["algorithm"],
            p.spec["kl"],
            clip_text,
            p.spec["optimizer"],
            p.spec["context"],
            str(p.spec["seed"]),
            states[p.id],
        )
    console = _console()
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


@_command("eval")
def evaluate(
    ref: str = typer.Argument(
        ...,
        metavar="RUN_OR_CHECKPOINT",
        help="A run (id, id prefix, name), a sweep (all its runs), a run directory, one checkpoint (step_N, global_step_N) or any HF model directory.",
    ),
    benchmarks: str = typer.Option(
        "aime24,aime25,amc23",
        "--benchmarks",
        "-b",
        metavar="NAME|FILE,...",
        help="Presets aime24, aime25, amc23 (their files in --data-dir) and/or prepared .parquet files.",
    ),
    k: int = typer.Option(
        None,
        "--k",
        "-k",
        min=1,
        metavar="K",
        help="Samples per problem (default: the run's val.n; 32 for a bare model).",
    ),
    steps: str = typer.Option("last", "--steps", metavar="last|all|N,M", help="Which checkpoints of a run."),
    scorer: str = typer.Option(
        "dapo",
        "--scorer",
        metavar="SCORER",
        help="dapo (the paper's Answer: rule) or math_verify (symbolic equivalence).",
    ),
    data_dir: str = typer.Option(
        "data", "--data-dir", metavar="DIR", help="Where `rpg prepare-data` wrote the benchmark files."
    ),
    db: str = typer.Option(None, "--db", metavar="URL", envvar=DB_ENVVAR, show_envvar=False, help=_DB_HELP),
    address: str = typer.Option(
        None,
        "--address",
        metavar="ADDRESS",
        help="Ray cluster to run the evaluation job on; default: $RAY_ADDRESS, else the local head under --runs-dir.",
    ),
    local: bool = typer.Option(False, "--local", metavar="", help="Evaluate in this process instead of as a Ray job."),
    runs_dir: str = typer.Option(
        "runs",
        "--runs-dir",
        metavar="PATH",
        help="Root of the run directories (bare models are recorded under PATH/checkpoints/).",
    ),
    engine: str = typer.Option(
        "auto",
        "--engine",
        metavar="auto|vllm|hf",
        help="auto: vLLM when installed and a GPU is present, else transformers.",
    ),
    temperature: float = typer.Option(
        None, "--temperature", min=0.0, metavar="T", help="Default: the run's val.temperature."
    ),
    top_p: float = typer.Option(None, "--top-p", metavar="P", help="Default: the run's val.top_p."),
    max_tokens: int = typer.Option(
        None,
        "--max-tokens",
        min=1,
        metavar="N",
        help="Response budget; default: the run's context (its response length).",
    ),
    seed: int = typer.Option(
        0, "--seed", metavar="N", help="Sampling seed (each problem draws from its own seed derived from it)."
    ),
    gpus: float = typer.Option(
        None,
        "--gpus",
        min=0.0,
        metavar="N",
        help="GPUs the Ray job reserves (default: 1 when the run trained on GPUs, else 0).",
    ),
) -> None:
    """Score checkpoints on AIME24/AIME25/AMC23: k samples per problem, mean@k, pass@k (unbiased), maj@k, std@k.

    Every sample and metric lands in the results store, per benchmark, step and scorer. Resumes:
    problems already scored for a checkpoint and scorer are not generated again, and cached
    responses (RUN/eval/) are rescored instead of regenerated. The run's own logged validation
    metrics (verl's val-core/...) are copied into the store too, under verl's names.

    Examples:

      # every checkpoint of a run, with its own validation settings
      rpg eval rpg_reinforce-urkl-clip0.2_0.28-adamw-4k-s0-1a2b3c4d --steps all

      # one verl checkpoint on AIME 2025, 32 samples, the symbolic scorer
      rpg eval runs/paper/RUN/checkpoints/global_step_400 -b aime25 --k 32 \\
          --scorer math_verify

      # any HF model on AMC23 and a file of your own, in this process
      rpg eval Qwen2.5-Math-7B/ -b amc23,data/mine.parquet --local
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rpg_cli.evaluation.job import JobFailed
    from rpg_cli.evaluation.job import evaluate as run_evaluation
    from rpg_cli.evaluation.options import EvalError, EvalOptions
    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.store import DEFAULT_DB_URL, StoreError

    console = _console()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples"),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("eval", total=None)

    def planned(plan) -> None:
        for line in plan.skipped:
            typer.echo(f"rpg eval: skipped {line}", err=True)
        progress.update(task, total=plan.total_samples)
        progress.start()

    try:
        options = EvalOptions(
            ref=ref,
            benchmarks=tuple(b.strip() for b in benchmarks.split(",") if b.strip()),
            k=k,
            steps=steps,
            scorer=scorer,
            data_dir=data_dir,
            db=db or DEFAULT_DB_URL,
            runs_dir=runs_dir,
            engine=engine,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            seed=seed,
        )
        results = run_evaluation(
            options,
            local=local,
            address=address,
            gpus=gpus,
            on_plan=planned,
            on_progress=lambda done, label: progress.update(task, completed=done, description=label),
        )
    except (EvalError, StoreError, ClusterError) as e:
        _fail("eval", e)
    except JobFailed as e:
        _fail("eval", e, code=1)
    except KeyboardInterrupt:
        where = "" if local else "; the Ray job keeps running and the same command re-attaches to it"
        typer.echo(
            f"rpg eval: interrupted; every sample scored so far is stored, the same command resumes{where}", err=True
        )
        raise typer.Exit(130) from None
    finally:
        progress.stop()
    _print_eval_results(results, scorer, console)


def _print_eval_results(results: list, scorer: str, console) -> None:
    from rich.table import Table

    table = Table(title=f"eval (scorer {scorer})")
    passes = sorted({name for r in results for name in r.values if name.startswith("pass@")}, key=lambda n: int(n[5:]))
    columns = ["mean@k", *passes, "maj@k", "std@k"]
    for column in ("run", "step", "benchmark", "k", *columns):
        table.add_column(column, justify="left" if column in ("run", "benchmark") else "right")
    for r in results:
        cells = [r.values.get(c) for c in columns]
        table.add_row(r.run, str(r.step), r.benchmark, str(r.k), *("-" if v is None else f"{v:.4f}" for v in cells))
    console.print(table)


@_command()
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
    sweep_name: str = typer.Option(
        None, "--sweep", metavar="NAME", help="Only this sweep's runs (default: every run in the store)."
    ),
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
    output_format: str = typer.Option(
        None,
        "--format",
        metavar="FORMAT",
        help="Table format: table, markdown, latex, csv or json (default: from --output's suffix .md/.tex/.csv/.json, else a terminal table).",
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
    db: str = typer.Option(None, "--db", metavar="URL", envvar=DB_ENVVAR, show_envvar=False, help=_DB_HELP),
    address: str = typer.Option(None, "--address", metavar="ADDRESS", help=_ADDRESS_HELP),
    runs_dir: str = typer.Option("runs", "--runs-dir", metavar="PATH", help=_RUNS_DIR_HELP),
) -> None:
    """Print the paper's Last/Best tables, with 95% confidence intervals, and training curves with bands.

    Rows are methods named as in the paper (optimizer, clip... added where runs of one method differ),
    grouped by model, context and sampling protocol (scores drawn differently never share a cell).
    Columns per benchmark: Last (the final evaluated step); Best (val-selected) with --select-on; Best
    (test-selected, the paper's, biased upward) with --compare-paper. Each cell is the mean over seeds in
    percent, ± half its 95% confidence interval: a bootstrap over seeds and problems when `rpg eval`
    stored the samples, over seeds only from logged validation means. The footer says which, with the
    seeds, problems and sampling settings. Best of each column bold, second underlined.

    Examples:

      rpg report --table --sweep smoke-seeds
      rpg report --table --select-on aime25 --format markdown
      rpg report --table --sweep paper-qwen3-4b --compare-paper -o table.tex
      rpg report --plot --metrics reward,val --per-seed --smooth 5
    """
    from pathlib import Path

    from rpg_cli import report as rp
    from rpg_cli.rundir import write_atomic
    from rpg_cli.store import StoreError

    formats = ("table", *rp.RENDERERS)
    if output_format is not None and output_format not in formats:
        _fail("report", ValueError(f"unknown --format {output_format!r}; allowed: {', '.join(formats)}"))
    if table and plot and output:
        _fail(
            "report",
            ValueError("--output names the table file or the plots directory: use it with --table or --plot, not both"),
        )
    with _open_store("report", db) as store:
        try:
            _reconcile("report", store, store.runs(sweep=sweep_name), address, runs_dir)  # runs that ended unwatched
            if table or not plot:
                fmt = output_format or (
                    rp.FORMAT_BY_SUFFIX.get(Path(output).suffix.lower(), "table") if output else "table"
                )
                wanted = [b.strip() for b in benchmarks.split(",") if b.strip()] if benchmarks else None
                built = rp.build_table(store, sweep_name, metric, wanted, compare_paper, select_on, scorer)
                text = rp.RENDERERS[fmt](built) if fmt != "table" else _render_report_table(built, to_text=bool(output))
                if output:
                    typer.echo(f"wrote {write_atomic(output, text)}")
                elif text:
                    typer.echo(text, nl=False)
            if plot:
                names = (
                    [m.strip() for m in metrics.split(",") if m.strip()] if metrics else list(rp.DEFAULT_PLOT_METRICS)
                )
                fig = rp.plot_training(store, sweep_name, names, smooth, strict=metrics is not None, per_seed=per_seed)
                for path in rp.save_figure(fig, output or "runs/plots", f"training-{sweep_name or 'all'}"):
                    typer.echo(f"wrote {path}")
        except (rp.ReportError, StoreError) as e:
            _fail("report", e)


@_command()
def compare(
    a: str = typer.Argument(
        ...,
        metavar="A",
        help="The baseline: a method as `rpg report` names it (GRPO, 'RPG-REINFORCE-URKL (clip 0.1/0.1)'), run ids or names (comma-separated), or a spec filter FIELD=VALUE[&FIELD=VALUE...].",
    ),
    b: str = typer.Argument(..., metavar="B", help="The challenger, given the same ways: the differences are B - A."),
    sweep_name: str = typer.Option(
        None, "--sweep", metavar="NAME", help="Only this sweep's runs (default: every run in the store)."
    ),
    where: list[str] = typer.Option(
        None,
        "--where",
        metavar="FIELD=VALUE",
        help="Only runs whose spec matches, on both sides (as `rpg runs --where`). Repeatable.",
    ),
    step: str = typer.Option(
        "last", "--step", metavar="last|N", help="Each run's final evaluated step, or step N of every run."
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
    output_format: str = typer.Option(
        "text", "--format", metavar="text|json", help="Lines for a terminal, or everything as JSON."
    ),
    db: str = typer.Option(None, "--db", metavar="URL", envvar=DB_ENVVAR, show_envvar=False, help=_DB_HELP),
) -> None:
    """Say whether B beats A: the paired difference B - A per benchmark and overall, with its 95% interval.

    Runs are paired by problem (the same problems resampled for both) and by seed where both sides have
    the same seeds. Each line gives B - A in points, P(B > A) (the probability that a random run of B
    beats a random run of A on a random problem) with its interval, the seeds per method that would
    detect this difference at 80% power, and the verdict: "B better", "A better" or "no detectable
    difference". Spec fields that also differ between the groups (other than the compared ones and
    the seed) are listed in bold: they make the comparison unfair. Scores drawn under different
    sampling settings or scorers are refused.

    Examples:

      rpg compare GRPO DAPO --sweep smoke-seeds
      rpg compare algorithm=grpo 'algorithm=rpg&kl=urkl' --where context=4k
      rpg compare GRPO RPG-REINFORCE-URKL --step 200 -b aime24 --format json
      rpg compare grpo-s0-1a2b3c4d,grpo-s1-5e6f7a8b dapo-s0-9c0d1e2f
    """
    from rpg_cli import report as rp
    from rpg_cli.stats import StatsError
    from rpg_cli.store import StoreError

    if output_format not in ("text", "json"):
        _fail("compare", ValueError(f"unknown --format {output_format!r}; allowed: text, json"))
    if step != "last" and not step.isdigit():
        _fail("compare", ValueError(f"--step {step!r}: expected last or a step number"))
    wanted = [x.strip() for x in benchmarks.split(",") if x.strip()] if benchmarks else None
    with _open_store("compare", db) as store:
        try:
            result = rp.compare_groups(
                store, a, b, sweep_name, where or (), metric, scorer, None if step == "last" else int(step), wanted
            )
        except (rp.ReportError, StoreError, StatsError) as e:
            _fail("compare", e)
    if output_format == "json":
        typer.echo(result.to_json(), nl=False)
        return
    from rich.markup import escape

    console = _console()
    for line in [*result.header(), *result.lines()]:
        console.print(escape(line), highlight=False)
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

    console = Console(file=io.StringIO(), width=200, color_system=None) if to_text else _console()
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
            table.add_row(row.method.replace("[", r"\["), str(len(row.runs)), *cells)
        console.print(table)
    console.print("bold: best of its column, underlined: second.", *rp.footer(built), sep="\n", highlight=False)
    return console.file.getvalue() if to_text else ""


# --- runs, logs, cancel, and the live sweep view (the results store and Ray jobs) ----------------


def _fail(command: str, error: Exception, code: int = 2) -> None:
    _warn(command, str(error))
    raise typer.Exit(code)


def _warn(command: str, message: str) -> None:
    """One line on stderr, passwords in URLs masked (every message rpg prints goes through here or `_say`)."""
    from rpg_cli.store.url import redact

    typer.echo(redact(f"rpg {command}: {message}"), err=True)


def _console():
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)  # pipes get whole rows


def _open_store(command: str, db: str | None):
    """The existing results store, closed on exit; `rpg COMMAND: ...` (exit 2) when there is none."""
    import contextlib

    from rpg_cli.store import DEFAULT_DB_URL, StoreError, open_store

    try:
        store = open_store(db or DEFAULT_DB_URL, create=False)
    except StoreError as e:
        _fail(command, e)
    return contextlib.closing(store)


def _status_text(status: str) -> str:
    return f"[{_STATUS_STYLE.get(status, '')}]{status}[/]"


def _error_line(error: str | None, width: int | None = 60) -> str:
    """The failure reason on one line: its last line, cut to `width` characters (None: whole)."""
    from rpg_cli.rundir import last_lines

    line = last_lines(error or "")
    return line[: width - 1] + "…" if width is not None and len(line) > width else line


def _reconcile(command: str, store, runs: list, address: str | None, runs_dir: str, quiet: bool = False) -> frozenset:
    """Bring the live ones among `runs` up to what Ray knows before showing them; the ids of those it
    could not check (shown as stored, possibly stale), with one line saying why unless `quiet`."""
    from pathlib import Path

    from rpg_cli.orchestration.sweep import reconcile

    result = reconcile(store, runs, address=address, runs_dir=Path(runs_dir))
    if result.unconfirmed and not quiet:
        _warn(
            command,
            f"{len(result.unconfirmed)} live run(s) shown as last recorded, possibly stale (marked ?): {result.why}",
        )
    return result.unconfirmed


@_command("runs")
def runs_command(
    sweep_name: str = typer.Option(None, "--sweep", metavar="NAME", help="Only this sweep's runs."),
    status: str = typer.Option(
        None,
        "--status",
        metavar="STATE[,STATE]",
        help="Only runs in these states: pending, submitted, running, succeeded, failed, stopped.",
    ),
    where: list[str] = typer.Option(
        None,
        "--where",
        metavar="FIELD=VALUE",
        help="Only runs whose spec matches: FIELD=V[,V...] or FIELD!=V; dotted paths reach nested fields (clip.eps_low=0.1). Repeatable; all must hold.",
    ),
    output_format: str = typer.Option(
        "table", "--format", metavar="table|csv|json", help="A terminal table, or every column as CSV or JSON."
    ),
    wide: bool = typer.Option(
        False, "--wide", metavar="", help="Show each failure reason whole instead of its first 60 characters."
    ),
    db: str = typer.Option(None, "--db", metavar="URL", envvar=DB_ENVVAR, show_envvar=False, help=_DB_HELP),
    address: str = typer.Option(None, "--address", metavar="ADDRESS", help=_ADDRESS_HELP),
    runs_dir: str = typer.Option("runs", "--runs-dir", metavar="PATH", help=_RUNS_DIR_HELP),
) -> None:
    """List runs: seed, state, attempts, last step, reward and validation accuracy, wall time.

    The reward is the last critic/score/mean logged; the validation accuracy the mean over benchmarks
    of each one's last val-core mean@k. Runs recorded as live are first checked with the Ray cluster
    (a run that finished unwatched shows as finished); when no cluster answers, they are shown as
    last recorded, marked ?.

    Examples:

      rpg runs --where algorithm=rpg --where kl=ufkl,urkl
      rpg runs --sweep smoke --format csv
      rpg runs --status failed --wide
    """
    from rpg_cli.report import ReportError, runs_summary, summary_csv, wall_text
    from rpg_cli.report.summary import SUMMARY_FIELDS, TABLE_TITLES
    from rpg_cli.states import STATUSES
    from rpg_cli.store import DEFAULT_DB_URL, EmptyStoreError, NoStoreError, StoreError, open_store

    if output_format not in ("table", "csv", "json"):
        _fail("runs", ValueError(f"unknown --format {output_format!r}; allowed: table, csv, json"))
    wanted = [s.strip() for s in status.split(",")] if status else None
    if wanted and (bad := [s for s in wanted if s not in STATUSES]):
        _fail("runs", ValueError(f"unknown --status {', '.join(bad)}; allowed: {', '.join(STATUSES)}"))
    try:
        store = open_store(db or DEFAULT_DB_URL, create=False)
    except NoStoreError as e:
        if isinstance(e, EmptyStoreError):
            _fail("runs", e)
        _warn("runs", f"no runs recorded yet ({e})")
        return
    except StoreError as e:
        _fail("runs", e)
    try:
        stale = _reconcile("runs", store, store.runs(sweep=sweep_name), address, runs_dir)
        rows = runs_summary(store, sweep_name, wanted, where or [])
    except ReportError as e:
        _fail("runs", e)
    finally:
        store.close()
    if output_format == "json":
        import json

        typer.echo(json.dumps(rows, indent=2))
        return
    if output_format == "csv":
        typer.echo(summary_csv(rows), nl=False)
        return
    from rich.table import Table

    table = Table(title=f"runs of {sweep_name}" if sweep_name else "runs")
    for field in SUMMARY_FIELDS:
        if field != "finished":
            table.add_column(
                TABLE_TITLES.get(field, field),
                justify="right" if field in ("seed", "attempts", "step", "reward", "val", "wall_s") else "left",
                no_wrap=field not in ("name", "error"),
            )
    cut = 0
    for r in rows:
        error = _error_line(r["error"], width=None if wide else 60)
        cut += error.endswith("…")
        table.add_row(
            r["sweep"],
            r["name"],
            r["id"],
            "-" if r["seed"] is None else str(r["seed"]),
            _status_text(r["status"]) + ("?" if r["id"] in stale else ""),
            str(r["attempts"]),
            "-" if r["step"] is None else str(r["step"]),
            "-" if r["reward"] is None else f"{r['reward']:.4f}",
            "-" if r["val"] is None else f"{r['val']:.4f}",
            wall_text(r["wall_s"]),
            (r["started"] or "-")[:16],
            error.replace("[", r"\["),
        )
    console = _console()
    console.print(table)
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    console.print(
        f"{len(rows)} runs: "
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + (f" ({cut} failure reason(s) cut short: --wide shows them whole)" if cut else ""),
        highlight=False,
    )


@_command("logs")
def logs_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id, id prefix or name."),
    follow: bool = typer.Option(False, "--follow", "-f", metavar="", help="Keep printing output until the job ends."),
    db: str = typer.Option(None, "--db", metavar="URL", envvar=DB_ENVVAR, show_envvar=False, help=_DB_HELP),
    address: str = typer.Option(None, "--address", metavar="ADDRESS", help=_ADDRESS_HELP),
    runs_dir: str = typer.Option("runs", "--runs-dir", metavar="PATH", help=_RUNS_DIR_HELP),
) -> None:
    """Print a run's job output (from the cluster while it knows the job, else the run's job.log)."""
    from pathlib import Path

    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.orchestration.sweep import job_logs
    from rpg_cli.store import StoreError
    from rpg_cli.store.url import redact

    with _open_store("logs", db) as store:
        found = store.resolve(run)
        if len(found) != 1:
            why = (
                "is not a run id, id prefix, name or sweep in the store"
                if not found
                else f"names {len(found)} runs (a sweep?)"
            )
            _fail("logs", LookupError(f"{run!r} {why}; give one run's id or name (`rpg runs` lists them)"))
        _reconcile("logs", store, found, address, runs_dir, quiet=True)  # a finished job's log is saved as job.log
        record = store.run(found[0].id)
    try:
        for chunk in job_logs(record, address=address, runs_dir=Path(runs_dir), follow=follow):
            typer.echo(redact(chunk), nl=False)
    except (ClusterError, StoreError) as e:
        _fail("logs", e)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@_command("cancel")
def cancel_command(
    ref: str = typer.Argument(
        ..., metavar="RUN|SWEEP", help="A run id, id prefix or name, or a sweep name (all its runs)."
    ),
    db: str = typer.Option(None, "--db", metavar="URL", envvar=DB_ENVVAR, show_envvar=False, help=_DB_HELP),
    address: str = typer.Option(None, "--address", metavar="ADDRESS", help=_ADDRESS_HELP),
    runs_dir: str = typer.Option("runs", "--runs-dir", metavar="PATH", help=_RUNS_DIR_HELP),
) -> None:
    """Stop a run's job, or every unfinished run of a sweep; they are recorded as stopped.

    The cluster is asked first: a run whose job has already ended is recorded as it ended (a run that
    succeeded stays succeeded).
    """
    from pathlib import Path

    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.orchestration.sweep import cancel
    from rpg_cli.store import DEFAULT_DB_URL, StoreError

    try:
        done = cancel(ref, db or DEFAULT_DB_URL, address=address, runs_dir=Path(runs_dir))
    except (ClusterError, StoreError) as e:
        _fail("cancel", e)
    if done.finished:
        typer.echo(
            f"{len(done.finished)} run(s) had already ended: "
            + ", ".join(r.name for r in done.finished)
            + " (`rpg runs` shows how)"
        )
    if done.stopped:
        typer.echo(f"stopped {len(done.stopped)} run(s): " + ", ".join(r.name for r in done.stopped))
    elif not done.finished:
        typer.echo(f"rpg cancel: nothing to stop: every run of {ref!r} has finished")


@_command("stop")
def stop_command(
    runs_dir: str = typer.Option("runs", "--runs-dir", metavar="PATH", help=_RUNS_DIR_HELP),
    db: str = typer.Option(None, "--db", metavar="URL", envvar=DB_ENVVAR, show_envvar=False, help=_DB_HELP),
    force: bool = typer.Option(
        False, "--force", metavar="", help="Stop it even while jobs run on it (they die with it)."
    ),
) -> None:
    """Stop the local Ray head that `rpg sweep` and `rpg eval` started under --runs-dir.

    The head stays up between commands so that the next one starts at once. It is not stopped while
    jobs run on it, unless --force. Results and run directories are kept.
    """
    from pathlib import Path

    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.orchestration.sweep import LiveRunsError, stop
    from rpg_cli.store import DEFAULT_DB_URL

    try:
        stopped = stop(Path(runs_dir), db or DEFAULT_DB_URL, force=force)
    except (LiveRunsError, ClusterError) as e:
        _fail("stop", e)
    if stopped:
        typer.echo(f"stopped the local Ray head in {runs_dir}/ray")
    else:
        typer.echo(f"no local Ray head is running in {runs_dir}/ray")


def _progress_caption(snapshot) -> str:
    counts = snapshot.counts
    return (
        f"pending {counts['pending'] + counts['submitted']} · running {counts['running']} · "
        f"succeeded {counts['succeeded']} · failed {counts['failed']} · stopped {counts['stopped']}"
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
            _status_text(r.status),
            str(r.attempts),
            "-" if r.step is None else str(r.step),
            "-" if r.reward is None else f"{r.reward:.4f}",
            _error_line(r.error, 50),
        )
    return table


def _watch_sweep(
    plans: list,
    sweep_name: str,
    db: str,
    address: str | None = None,
    detach: bool = False,
    retry_failed: bool = False,
    runs_dir: str = "runs",
) -> None:
    """Submit a sweep's plans as Ray jobs and, unless `detach`, follow them until all have finished:
    a live table on a terminal, a line per change of the counts otherwise (logs, CI). Exits 0 when
    every run succeeded, 1 when some failed or stopped, 2 on a cluster or store error, 130 on Ctrl-C
    (the jobs keep running; the same command re-attaches)."""
    import os
    from pathlib import Path

    from rich.live import Live

    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.orchestration.plan import PreflightError, check_line, check_plans, known_states, refuse_bad_inputs
    from rpg_cli.orchestration.sweep import run_sweep
    from rpg_cli.store import StoreError

    console = _console()
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
        checks = check_plans(plans, known_states(db, plans), retry_failed)
        for check in checks:
            if not check.finding.error:
                _warn("sweep", check_line(check, len(plans)))
        refuse_bad_inputs(checks, len(plans))
    except (StoreError, PreflightError) as e:
        _fail("sweep", e)
    where = (
        address
        or os.environ.get("RAY_ADDRESS")
        or f"the local Ray head in {runs_dir}/ray (started on first use, ~15 s)"
    )
    _warn("sweep", f"{sweep_name}: {len(plans)} runs; connecting to {where}")
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
        )
    except KeyboardInterrupt:
        typer.echo(
            f"rpg sweep: stopped following {sweep_name}; its jobs keep running. Run the same command to "
            f"re-attach, `rpg runs --sweep {sweep_name}` to look, `rpg cancel {sweep_name}` to stop them.",
            err=True,
        )
        raise typer.Exit(130) from None
    except (ClusterError, StoreError, PreflightError) as e:
        _fail("sweep", e)
    finally:
        if live is not None:
            live.stop()
    if live is None:
        console.print(_progress_table(final))
    if detach:
        typer.echo(f"submitted; follow with `rpg runs --sweep {sweep_name}` or `rpg logs RUN --follow`")
    elif any(r.status in ("failed", "stopped") for r in final.runs):
        raise typer.Exit(1)


@_command("export")
def export_command(
    to: str = typer.Option(..., "--to", metavar="wandb|tensorboard|mlflow", help="The tracker to push to."),
    sweep_name: str = typer.Option(
        None, "--sweep", metavar="NAME", help="Only this sweep's runs (default: every run in the store)."
    ),
    db: str = typer.Option(None, "--db", metavar="URL", envvar=DB_ENVVAR, show_envvar=False, help=_DB_HELP),
    project: str = typer.Option(
        None, "--project", help="W&B project / MLflow experiment (default: the run's trackers.project, else rpg)."
    ),
    directory: str = typer.Option(
        None,
        "--dir",
        metavar="DIR",
        help="TensorBoard log root (default: runs/tensorboard); W&B writes its files under DIR/wandb/ (default: runs/wandb/).",
    ),
    tracking_uri: str = typer.Option(
        None,
        "--tracking-uri",
        metavar="URI",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///runs/mlflow.db). Credentials go in MLFLOW_TRACKING_USERNAME/PASSWORD or _TOKEN.",
    ),
    entity: str = typer.Option(None, "--entity", help="W&B entity (default: $WANDB_ENTITY, else your default entity)."),
    offline: bool = typer.Option(
        False, "--offline", help="W&B offline: write run files to upload later with `wandb sync`."
    ),
) -> None:
    """Push what the results store holds to W&B, TensorBoard or MLflow, for runs not tracked live.

    Metrics go at their steps, evals at their checkpoints' steps, the spec as config. Runs are grouped
    by cell (seeds band together) and tagged with the sweep and its varying fields, as live runs are.
    Exporting again adds only what is new: no duplicate runs or steps.

    Examples:

      # the smoke sweep as TensorBoard event files under runs/tensorboard/
      rpg export --to tensorboard --sweep smoke

      # every run to W&B, offline (upload later with `wandb sync`)
      rpg export --to wandb --offline

      # a team's MLflow server
      rpg export --to mlflow --tracking-uri http://mlflow.internal:5000
    """
    from pathlib import Path

    from rpg_cli.store import DEFAULT_DB_URL, StoreError, open_store
    from rpg_cli.trackers import TrackerError
    from rpg_cli.trackers.export import ExportOptions, export

    options = ExportOptions(
        project=project,
        directory=Path(directory) if directory else None,
        tracking_uri=tracking_uri,
        entity=entity,
        offline=offline,
    )
    try:
        store = open_store(db or DEFAULT_DB_URL, create=False)
    except StoreError as e:
        _fail("export", e)
    try:
        done = export(
            store,
            to,
            sweep_name,
            options,
            on_run=lambda r: typer.echo(f"{r.sweep}/{r.name}: {r.steps} steps -> {r.where}"),
        )
    except (TrackerError, StoreError) as e:
        _fail("export", e)
    finally:
        store.close()
    typer.echo(f"exported {sum(r.steps > 0 for r in done)} of {len(done)} run(s) to {to}")


if __name__ == "__main__":  # pragma: no cover
    app()
