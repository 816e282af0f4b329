"""Sources -> cleaned problems -> verl parquet files, with a report of every row dropped and why.

All sources are read and cleaned before anything is written, so a bad source (unreachable hub,
malformed rows under --strict, nothing usable left) leaves no output at all; each file is then
written to a temporary name and renamed into place.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rpg_cli.datasets.clean import (
    DROP_REASONS,
    DUPLICATE,
    DUPLICATE_OTHER_ANSWER,
    EMPTY_QUESTION,
    MISSING_ANSWER,
    NON_ENGLISH,
    UNREADABLE,
    answer_text,
    dedup_key,
    integer_answer,
    is_english,
    question_text,
)
from rpg_cli.datasets.readers import RawRows, SourceError, read_origin
from rpg_cli.datasets.sources import SourceSpec
from rpg_cli.datasets.template import VERL_SCHEMA, verl_row

# Auto-detected field names, most specific first (matched case-insensitively).
QUESTION_FIELDS = ("problem", "question", "extra_info.raw_problem", "prompt", "query")
# Not "solution": in most math sets it holds a worked solution, not the final answer.
ANSWER_FIELDS = ("answer", "reward_model.ground_truth", "ground_truth", "final_answer", "label")

ROWS_PER_GROUP = 8192  # parquet row-group size; rows are serialized one group at a time
HOLDOUT_SEED = 0  # the held-out problems of `--holdout`: fixed, so that re-preparing gives the same split


@dataclass
class SourceReport:
    """What happened to one source: rows read, dropped by reason, problems kept (one row each in the file)."""

    name: str
    origin: str
    output: Path
    question_field: str
    answer_field: str
    read: int
    dropped: dict[str, int]  # reason -> rows, in DROP_REASONS order, zero counts left out
    malformed: list[tuple[str, str]]  # (location, why) of rows that are broken, not just filtered
    problems: int  # written to `output` (held-out ones excluded)
    held_out: int = 0  # written to `holdout_output` instead
    holdout_output: Path | None = None
    normalized: int = 0  # answers written otherwise than the source stored them (extra_info.raw_answer keeps it)


class PrepareError(SourceError):
    """Preparation stopped before writing anything; `reports` says what was read up to then."""

    def __init__(self, message: str, reports: list[SourceReport]):
        super().__init__(message)
        self.reports = reports


# (raw problem, ground truth as written, the source's answer where that differs, else None)
Problem = tuple[str, str, str | None]


@dataclass
class Collected:
    spec: SourceSpec
    problems: list[Problem]  # first-seen order
    report: SourceReport = field(repr=False)


def prepare(specs: Sequence[SourceSpec], *, strict: bool = False) -> list[SourceReport]:
    """Read and clean every source, then write one verl parquet file per source.

    Malformed rows are skipped and listed in the reports; with `strict` they stop everything.
    """
    collected = [collect(spec) for spec in specs]
    reports = [c.report for c in collected]
    broken = [(r.name, where, why) for r in reports for where, why in r.malformed]
    if strict and broken:
        name, where, why = broken[0]
        raise PrepareError(
            f"--strict: {len(broken)} malformed row(s), first {name} {where}: {why}; "
            "fix them or drop --strict to skip them (nothing was written)",
            reports,
        )
    for c in collected:
        if not c.problems:
            drops = ", ".join(f"{reason}: {n}" for reason, n in c.report.dropped.items()) or "no rows"
            raise PrepareError(
                f"{c.spec.name}: no usable rows in {c.spec.origin} ({drops}); nothing was written", reports
            )
    splits = [split_holdout(c) for c in collected]  # before writing: a holdout too large writes nothing
    for c, (kept, held) in zip(collected, splits):
        write_verl_parquet(verl_batches(kept, c.spec.data_source), c.spec.output)
        if held:
            write_verl_parquet(verl_batches(held, c.spec.holdout_data_source), c.spec.holdout_output)
    return reports


def split_holdout(collected: Collected) -> tuple[list[Problem], list[Problem]]:
    """(kept, held out): `spec.holdout` problems drawn at random (seed HOLDOUT_SEED, so the same file
    gives the same split) and held out of training, both in file order; the report updated."""
    spec, problems = collected.spec, collected.problems
    if not spec.holdout:
        return problems, []
    if spec.holdout >= len(problems):
        raise PrepareError(
            f"--holdout {spec.holdout}: {spec.name} has {len(problems):,} problems, none would be left to train on; "
            "hold out fewer (nothing was written)",
            [collected.report],
        )
    held = set(random.Random(HOLDOUT_SEED).sample(range(len(problems)), spec.holdout))
    kept = [p for i, p in enumerate(problems) if i not in held]
    collected.report.problems, collected.report.held_out = len(kept), len(held)
    collected.report.holdout_output = spec.holdout_output
    return kept, [p for i, p in enumerate(problems) if i in held]


def collect(spec: SourceSpec) -> Collected:
    """Read one source and keep its distinct, well-formed (and, if asked, English) problems."""
    label = f"{spec.name} ({spec.origin})"
    rows = read_origin(spec.origin, spec.name, spec.local_hint)
    question_field = resolve_field(rows, spec.question_field, QUESTION_FIELDS, "question", label)
    answer_field = resolve_field(rows, spec.answer_field, ANSWER_FIELDS, "answer", label)

    dropped: Counter[str] = Counter({UNREADABLE: len(rows.unreadable)})
    malformed: list[tuple[int, str]] = list(rows.unreadable)  # (row or line number, why)
    first_answer: dict[str, str] = {}  # dedup key -> answer of its first occurrence
    # Raw question text -> raw answer of its first kept-or-filtered occurrence: DAPO-Math-17k
    # repeats each prompt ~100 times verbatim, and those rows need no parsing at all.
    seen_raw: dict[str, Any] = {}
    problems: list[Problem] = []
    normalized = 0
    try:
        for number, (question_value, answer_value) in rows.iter_values([question_field, answer_field]):
            if (
                spec.dedup
                and isinstance(question_value, str)
                and question_value in seen_raw
                and seen_raw[question_value] == answer_value
            ):
                dropped[DUPLICATE] += 1
                continue
            problem = question_text(question_value)
            if problem is None:
                dropped[EMPTY_QUESTION] += 1
                malformed.append((number, f"{EMPTY_QUESTION} (field {question_field})"))
                continue
            answer = answer_text(answer_value)
            if answer is None:
                dropped[MISSING_ANSWER] += 1
                malformed.append((number, f"{MISSING_ANSWER} (field {answer_field})"))
                continue
            if spec.integer_answers:
                answer = integer_answer(answer)
            if spec.dedup:
                key = dedup_key(problem)
                if key in first_answer:
                    dropped[DUPLICATE if first_answer[key] == answer else DUPLICATE_OTHER_ANSWER] += 1
                    continue
                first_answer[key] = answer
                if isinstance(question_value, str):
                    seen_raw[question_value] = answer_value
            if spec.english_only and not is_english(problem):
                dropped[NON_ENGLISH] += 1
                continue
            stored = source_answer(answer_value)
            raw_answer = stored if stored is not None and stored != answer else None
            normalized += raw_answer is not None
            problems.append((problem, answer, raw_answer))
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{label}: cannot read rows: {' '.join(str(exc).split())}") from exc

    malformed.sort()
    report = SourceReport(
        name=spec.name,
        origin=str(spec.origin),
        output=spec.output,
        question_field=question_field,
        answer_field=answer_field,
        read=len(rows),
        dropped={reason: dropped[reason] for reason in DROP_REASONS if dropped[reason]},
        malformed=[(rows.location(number), why) for number, why in malformed],
        problems=len(problems),
        normalized=normalized,
    )
    return Collected(spec=spec, problems=problems, report=report)


def source_answer(value: Any) -> str | None:
    """An answer as its source stored it, as text (a list as JSON); None for numbers, whose text is rpg's."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value), ensure_ascii=False)
    return None


def resolve_field(rows: RawRows, explicit: str | None, candidates: Iterable[str], kind: str, label: str) -> str:
    """The field holding the question (or answer): the one named, else the first known name found."""
    fields = ", ".join(rows.fields) or "none"
    if explicit is not None:
        if rows.has(explicit):
            return explicit
        raise SourceError(f"{label}: no field {explicit!r} (fields: {fields}); name the {kind} with --{kind}-field")
    by_lower = {name.lower(): name for name in rows.fields}
    for candidate in candidates:
        head, dot, rest = candidate.partition(".")
        path = by_lower.get(head, head) + dot + rest
        if rows.has(path):
            return path
    raise SourceError(
        f"{label}: cannot tell which field holds the {kind} (fields: {fields}); name it with --{kind}-field"
    )


def verl_batches(
    problems: Sequence[Problem], data_source: str, rows_per_group: int | None = None
) -> Iterator[pa.RecordBatch]:
    """The rows of one output file: one per problem, `extra_info.index` its position.

    (The paper's evaluation files held 32 copies of each problem, numbered 0..31, sampled once each;
    here a problem's k samples come from the sampler, grouped, so that pass@k and maj@k can be computed.)
    """
    size = rows_per_group or ROWS_PER_GROUP
    rows: list[dict[str, Any]] = []
    for position, (problem, answer, raw_answer) in enumerate(problems):
        rows.append(verl_row(problem, answer, data_source, position, raw_answer))
        if len(rows) == size:
            yield rows_to_batch(rows)
            rows = []
    if rows:
        yield rows_to_batch(rows)


def rows_to_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=VERL_SCHEMA)


def write_verl_parquet(batches: Iterable[pa.RecordBatch], path: Path) -> None:
    """Write to a temporary file next to `path`, then rename: readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with pq.ParquetWriter(temporary, VERL_SCHEMA) as writer:
            for batch in batches:
                writer.write_batch(batch)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None:  # pyarrow's errors name no file: name the target
            raise OSError(exc.errno, os.strerror(exc.errno), str(path)) from None
        raise
