"""`rpg prepare-data`: raw sources and local files into verl parquet, with a summary of what was kept."""

from __future__ import annotations

import typer

from rpg_cli.cli.common import fail, rpg_command


@rpg_command("prepare-data")
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
    holdout: int = typer.Option(
        0,
        "--holdout",
        metavar="N",
        help="Hold N random problems of the training set out of it (fixed seed), written to its NAME-holdout.parquet with data_source <its data_source>_holdout: a selection set for `rpg report --select-on`, never trained on.",
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

      # 500 training problems held out to pick each run's step on: add
      # dapo-math-17k-eng-holdout.parquet to val_files, then select on it
      # with rpg report --select-on math_dapo_holdout
      rpg prepare-data dapo-math-17k --holdout 500

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
        question_field=question_field,
        answer_field=answer_field,
        english_only=english_only,
        dedup=dedup,
        holdout=holdout,
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
        fail("prepare-data", e)
    except SourceError as e:
        fail("prepare-data", e)
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
        if r.normalized:  # the source's answers are kept in extra_info.raw_answer
            origin += f"\nanswers normalized: {r.normalized:,} (extra_info.raw_answer)"
        table.add_row(r.name, origin, f"{r.read:,}", dropped, f"{r.problems:,}", str(r.output))
        if r.held_out:
            held = f"{r.held_out:,}"
            table.add_row(f"{r.name} (held out)", f"{held} of its problems", "-", "-", held, str(r.holdout_output))
    Console(width=None if sys.stdout.isatty() else 200).print(table, highlight=False)
