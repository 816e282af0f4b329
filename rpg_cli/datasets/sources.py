"""The named sources of the paper (presets) and turning command-line arguments into sources.

Hub ids were chosen among public copies of each set; any other copy works as `PRESET=hf:ID` or
as a local file `PRESET=FILE`. Every file holds one row per problem: the k samples of accuracy@k come
from the sampler (a run's val.n, `rpg eval --k`), never from copies of a problem.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rpg_cli.datasets.readers import HubDataset, LocalFile, Origin, SourceError


@dataclass(frozen=True)
class Preset:
    name: str
    title: str
    filename: str
    data_source: str  # selects the reward function in verl and names the validation metrics
    hub: HubDataset
    question_field: str | None  # fields of `hub` (None: auto-detected, as for local files)
    answer_field: str | None
    english_only: bool
    train: bool = False  # the training set; every other preset is an evaluation benchmark
    default: bool = True  # prepared by a bare `rpg prepare-data`
    integer_answers: bool = False  # every answer an integer: "27.0" and "033" are written 27 and 33


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        # The paper's own filtered training file (the RPG repository's README): DAPO-Math-17k with the
        # non-English problems removed, ~13.9k problems. Its English filter still runs, so that the original
        # BytedTsinghua-SIA/DAPO-Math-17k (1.79M rows: ~17.4k distinct problems, each ~100 times) works as
        # a fallback: `rpg prepare-data dapo-math-17k=hf:BytedTsinghua-SIA/DAPO-Math-17k@train`.
        Preset(
            name="dapo-math-17k",
            title="DAPO-Math-17k (training, English, deduplicated)",
            filename="dapo-math-17k-eng.parquet",
            data_source="math_dapo",
            hub=HubDataset("math-dataset/DAPO-17k-Eng"),
            question_field=None,
            answer_field=None,
            english_only=True,
            train=True,
        ),
        # The paper's files label AIME 2024 `math_dapo`, like the training set.
        Preset(
            name="aime24",
            title="AIME 2024",
            filename="aime-2024.parquet",
            data_source="math_dapo",
            hub=HubDataset("HuggingFaceH4/aime_2024", split="train"),
            question_field="problem",
            answer_field="answer",
            english_only=False,
            integer_answers=True,
        ),
        Preset(
            name="aime25",
            title="AIME 2025",
            filename="aime-2025.parquet",
            data_source="aime2025",
            hub=HubDataset("math-ai/aime25", split="test"),
            question_field="problem",
            answer_field="answer",
            english_only=False,
            integer_answers=True,
        ),
        Preset(
            name="amc23",
            title="AMC 2023",
            filename="amc-2023.parquet",
            data_source="amc_23",
            hub=HubDataset("math-ai/amc23", split="test"),
            question_field="question",
            answer_field="answer",
            english_only=False,
            integer_answers=True,
        ),
        # The appendix benchmarks (Table 7), named as the paper's table names them.
        Preset(
            name="minerva_math",
            title="Minerva-Math",
            filename="minerva-math.parquet",
            data_source="minerva_math",
            hub=HubDataset("math-ai/minervamath", split="test"),
            question_field="question",
            answer_field="answer",
            english_only=False,
            default=False,
        ),
        Preset(
            name="olympiadbench",
            title="OlympiadBench",
            filename="olympiadbench.parquet",
            data_source="olympiadbench",
            hub=HubDataset("math-ai/olympiadbench", split="test"),
            question_field="question",
            answer_field="final_answer",
            english_only=False,
            default=False,
        ),
    )
}


@dataclass(frozen=True)
class SourceOptions:
    """Choices from the command line that apply to every source of one run."""

    question_field: str | None = None  # None: the preset's hub field, else auto-detected
    answer_field: str | None = None
    english_only: bool | None = None  # None: each source's default
    dedup: bool = True
    holdout: int = 0  # problems of the training set held out of it, into a selection set


@dataclass(frozen=True)
class SourceSpec:
    """Everything needed to turn one source into one parquet file."""

    name: str
    origin: Origin
    output: Path
    data_source: str
    english_only: bool
    dedup: bool
    question_field: str | None  # None: auto-detect
    answer_field: str | None
    local_hint: str  # how to point this source at a local file instead
    holdout: int = 0  # problems held out of `output` into `holdout_output` (a training set's selection set)
    integer_answers: bool = False  # the preset's: integer-valued answers written as integers

    @property
    def holdout_output(self) -> Path:
        """The held-out problems' file: NAME-holdout.parquet beside the training file."""
        return self.output.with_name(f"{self.output.stem}-holdout{self.output.suffix}")

    @property
    def holdout_data_source(self) -> str:
        """Their data_source, which names them as a benchmark (`rpg report --select-on`)."""
        return f"{self.data_source}_holdout"


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_origin(text: str) -> Origin:
    """`hf:OWNER/NAME[:CONFIG][@SPLIT]` names a hub dataset; anything else is a local path."""
    if not text.startswith("hf:"):
        return LocalFile(Path(text).expanduser())
    rest, _, split = text[3:].partition("@")
    repo_id, _, config = rest.partition(":")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise SourceError(f"bad hub dataset {text!r}; write hf:OWNER/NAME, hf:OWNER/NAME:CONFIG or add @SPLIT")
    return HubDataset(repo_id, config=config or None, split=split or None)


def resolve_sources(
    args: Sequence[str],
    *,
    out_dir: Path,
    options: SourceOptions = SourceOptions(),
    from_origin: str | None = None,
    input_file: Path | None = None,
    name: str | None = None,
    data_source: str | None = None,
) -> list[SourceSpec]:
    """Sources for `rpg prepare-data ARGS...`.

    ARGS are preset names, optionally `PRESET=FILE` or `PRESET=hf:ID`; `from_origin` replaces the
    origin of the one preset named. `input_file` adds any local file, written as NAME.parquet.
    With neither presets nor an input file, the default presets are prepared (what the paper grids use).
    """
    if from_origin is not None and len(args) != 1:
        raise SourceError("--from replaces the origin of exactly one preset: rpg prepare-data PRESET --from FILE")
    if data_source is not None and input_file is None:
        raise SourceError("--data-source applies to --input only; the presets keep the paper's data_source names")
    if name is not None and input_file is None:
        raise SourceError("--name applies to --input only (it names the output file NAME.parquet)")

    if options.holdout < 0:
        raise SourceError(f"--holdout {options.holdout}: give a number of problems >= 0")
    specs = [_preset_spec(arg, from_origin, out_dir, options) for arg in args]
    if input_file is not None:
        specs.append(_input_spec(input_file, name, data_source, out_dir, options))
    if not specs:
        specs = [_preset_spec(name, None, out_dir, options) for name, preset in PRESETS.items() if preset.default]

    if options.holdout and not any(spec.holdout for spec in specs):
        trainers = ", ".join(name for name, preset in PRESETS.items() if preset.train)
        raise SourceError(f"--holdout holds problems of the training set out of it: name {trainers} among the sources")
    outputs: dict[Path, str] = {}
    for spec in specs:
        for output in (spec.output, spec.holdout_output) if spec.holdout else (spec.output,):
            if output in outputs:
                raise SourceError(f"{outputs[output]} and {spec.name} would both write {output}; name one differently")
            outputs[output] = spec.name
    return specs


def _preset_spec(arg: str, from_origin: str | None, out_dir: Path, options: SourceOptions) -> SourceSpec:
    name, has_origin, origin_text = arg.partition("=")
    preset = PRESETS.get(name)
    if preset is None:
        hint = (
            f"; for any local file use --input {arg} --question-field Q --answer-field A"
            if not has_origin and Path(arg).suffix
            else ""
        )
        raise SourceError(f"unknown source {name!r}: choose from {', '.join(PRESETS)}{hint}")
    if has_origin and from_origin is not None:
        raise SourceError(f"{name}: give its file either as {name}=FILE or with --from, not both")
    if has_origin and not origin_text:
        raise SourceError(f"{name}=: missing file after '='; write {name}=FILE or {name}=hf:OWNER/NAME")
    custom = origin_text if has_origin else from_origin
    origin = parse_origin(custom) if custom else preset.hub
    own_hub = origin == preset.hub
    return SourceSpec(
        name=preset.name,
        origin=origin,
        output=out_dir / preset.filename,
        data_source=preset.data_source,
        english_only=preset.english_only if options.english_only is None else options.english_only,
        dedup=options.dedup,
        question_field=options.question_field or (preset.question_field if own_hub else None),
        answer_field=options.answer_field or (preset.answer_field if own_hub else None),
        local_hint=f"rpg prepare-data {preset.name}=FILE",
        holdout=options.holdout if preset.train else 0,
        integer_answers=preset.integer_answers,
    )


def _input_spec(
    path: Path, name: str | None, data_source: str | None, out_dir: Path, options: SourceOptions
) -> SourceSpec:
    name = name or path.stem
    if not _SAFE_NAME.fullmatch(name):
        raise SourceError(f"--name {name!r}: use letters, digits, '.', '_' or '-' (it becomes the file name)")
    return SourceSpec(
        name=name,
        origin=LocalFile(path.expanduser()),
        output=out_dir / f"{name}.parquet",
        data_source=data_source or name,
        english_only=bool(options.english_only),
        dedup=options.dedup,
        question_field=options.question_field,
        answer_field=options.answer_field,
        local_hint=f"rpg prepare-data --input FILE --name {name}",
    )
