"""`rpg eval`: checkpoints scored with accuracy@k, as Ray jobs or in this process."""

from __future__ import annotations

import typer

from rpg_cli.cli.common import db_option, fail, make_console, rpg_command


@rpg_command("eval")
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
        None,
        "--scorer",
        metavar="SCORER",
        help="dapo (the paper's Answer: rule) or math_verify (symbolic equivalence) for every benchmark "
        "(default: each benchmark's, as training scored it: the run's `scorers:`, else the paper's choice).",
    ),
    data_dir: str = typer.Option(
        "data", "--data-dir", metavar="DIR", help="Where `rpg prepare-data` wrote the benchmark files."
    ),
    db: str = db_option(),
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
    tp: int = typer.Option(
        None,
        "--tp",
        min=1,
        metavar="N",
        help="vLLM's tensor parallel size (default: the most of the visible GPUs vLLM can split the model over, "
        "e.g. 4 of 8 for 28 attention heads); a Ray job reserves N GPUs unless --gpus says otherwise.",
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

      # a 7B model over 4 GPUs with vLLM (28 attention heads: 1, 2 or 4, not 8)
      rpg eval Qwen2.5-7B-Instruct/ --tp 4
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rpg_cli.evaluation.job import JobFailed
    from rpg_cli.evaluation.job import evaluate as run_evaluation
    from rpg_cli.evaluation.options import EvalError, EvalOptions
    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.store import StoreError

    console = make_console()
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
            db=db,
            runs_dir=runs_dir,
            engine=engine,
            tp=tp,
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
        fail("eval", e)
    except JobFailed as e:
        fail("eval", e, code=1)
    except KeyboardInterrupt:
        where = "" if local else "; the Ray job keeps running and the same command re-attaches to it"
        typer.echo(
            f"rpg eval: interrupted; every sample scored so far is stored, the same command resumes{where}", err=True
        )
        raise typer.Exit(130) from None
    finally:
        progress.stop()
    _print_eval_results(results, console)


def _print_eval_results(results: list, console) -> None:
    from rich.table import Table

    table = Table(title="eval")
    passes = sorted({name for r in results for name in r.values if name.startswith("pass@")}, key=lambda n: int(n[5:]))
    columns = ["mean@k", *passes, "maj@k", "std@k"]
    for column in ("run", "step", "benchmark", "scorer", "k", *columns):
        table.add_column(column, justify="left" if column in ("run", "benchmark", "scorer") else "right")
    for r in results:
        cells = [r.values.get(c) for c in columns]
        table.add_row(
            r.run, str(r.step), r.benchmark, r.scorer, str(r.k), *("-" if v is None else f"{v:.4f}" for v in cells)
        )
    console.print(table)
