"""Reading raw rows from local files (JSONL, JSON, CSV/TSV, parquet) and from the Hugging Face Hub.

A reader gives back `RawRows`: the top-level field names, and an iterator over the rows that
yields each row's number (a line number for text files, 1-based row number otherwise) with the
values of the fields asked for. Rows that cannot be parsed at all (a broken JSONL line) are kept
aside with their number, to be reported.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

LOCAL_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet")
# Rows converted to Python objects at a time: the 1.8M-row DAPO-Math-17k stays out of memory as
# Python objects.
_ARROW_BATCH_ROWS = 65_536


class SourceError(Exception):
    """A source cannot be read or used; the message is one line naming the problem and the fix."""


@dataclass(frozen=True)
class LocalFile:
    path: Path

    def __str__(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class HubDataset:
    """A dataset on the Hugging Face Hub, written hf:OWNER/NAME[:CONFIG][@SPLIT]."""

    repo_id: str
    config: str | None = None
    split: str | None = None  # None: the dataset's only split

    def __str__(self) -> str:
        config = f":{self.config}" if self.config else ""
        split = f"@{self.split}" if self.split else ""
        return f"hf:{self.repo_id}{config}{split}"


Origin = LocalFile | HubDataset


@dataclass
class RawRows:
    """The rows of one source, before any cleaning."""

    fields: list[str]
    records: list[tuple[int, dict[str, Any]]] | None = None  # (number, row) for Python sources
    arrow: pa.Table | pq.ParquetFile | None = None  # Arrow sources: hub tables, parquet files
    unreadable: list[tuple[int, str]] = field(default_factory=list)  # (number, why)
    unit: str = "row"  # what the numbers count: "line" for JSONL and CSV, else "row"

    def location(self, number: int) -> str:
        return f"{self.unit} {number}"

    def __len__(self) -> int:
        if isinstance(self.arrow, pq.ParquetFile):
            parsed = self.arrow.metadata.num_rows
        elif self.arrow is not None:
            parsed = self.arrow.num_rows
        else:
            parsed = len(self.records or [])
        return parsed + len(self.unreadable)

    def has(self, path: str) -> bool:
        """Whether a dotted field path (`reward_model.ground_truth`) exists in these rows."""
        head, *rest = path.split(".")
        if head not in self.fields:
            return False
        if self.arrow is not None:
            kind = self.arrow.schema_arrow if isinstance(self.arrow, pq.ParquetFile) else self.arrow.schema
            kind = kind.field(head).type
            for part in rest:
                if not pa.types.is_struct(kind) or kind.get_field_index(part) < 0:
                    return False
                kind = kind.field(part).type
            return True
        for _, row in self.records or []:
            value = row.get(head)
            if value is None:
                continue
            for part in rest:
                if not isinstance(value, dict) or part not in value:
                    return False
                value = value[part]
            return True
        return not rest

    def iter_values(self, paths: list[str]) -> Iterator[tuple[int, tuple[Any, ...]]]:
        """(number, (value of each path)) for every parsed row, in file order."""
        if self.arrow is None:
            for number, row in self.records or []:
                yield number, tuple(_walk(row.get(p.split(".")[0]), p) for p in paths)
            return
        heads = list(dict.fromkeys(p.split(".")[0] for p in paths))
        if isinstance(self.arrow, pq.ParquetFile):  # streamed: only the columns needed, a batch at a time
            batches = self.arrow.iter_batches(batch_size=_ARROW_BATCH_ROWS, columns=heads)
        else:
            batches = self.arrow.select(heads).to_batches(max_chunksize=_ARROW_BATCH_ROWS)
        number = 1
        for batch in batches:
            columns = [_narrow(batch.column(p.split(".")[0]), p).to_pylist() for p in paths]
            yield from zip(range(number, number + batch.num_rows), zip(*columns))
            number += batch.num_rows


def _walk(value: Any, path: str) -> Any:
    for part in path.split(".")[1:]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _narrow(column: pa.Array, path: str) -> pa.Array:
    """The values at `path` inside an Arrow column, computed in Arrow rather than row by row.

    A chat prompt (list of {role, content}) whose first message is the user's in every row is
    narrowed to that message's text: this is what makes the 1.8M-row DAPO-Math-17k fast.
    Anything else is left for `clean.question_text` to interpret per row.
    """
    for part in path.split(".")[1:]:
        column = pc.struct_field(column, part)
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return column
    message = kind.value_type
    if not (pa.types.is_struct(message) and message.get_field_index("content") >= 0):
        return column
    if column.null_count or len(column) == 0 or pc.min(pc.list_value_length(column)).as_py() < 1:
        return column
    first = pc.list_element(column, 0)
    if (
        message.get_field_index("role") >= 0
        and not pc.all(pc.equal(pc.struct_field(first, "role"), "user"), skip_nulls=False).as_py()
    ):
        return column
    return pc.struct_field(first, "content")


def read_origin(origin: Origin, label: str, local_hint: str) -> RawRows:
    """Read every row of a source. `local_hint` is the command line that reads a local copy."""
    if isinstance(origin, HubDataset):
        return read_hub(origin, label, local_hint)
    return read_local(origin.path, label)


def read_local(path: Path, label: str) -> RawRows:
    if not path.exists():
        raise SourceError(f"{label}: file not found: {path}")
    if path.is_dir():
        raise SourceError(f"{label}: {path} is a directory; pass one {'/'.join(LOCAL_SUFFIXES)} file")
    suffix = path.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            return _read_jsonl(path)
        if suffix == ".json":
            return _read_json(path, label)
        if suffix in (".csv", ".tsv"):
            return _read_csv(path, delimiter="\t" if suffix == ".tsv" else ",")
        if suffix == ".parquet":
            parquet = pq.ParquetFile(path)
            return RawRows(fields=parquet.schema_arrow.names, arrow=parquet)
    except (OSError, UnicodeDecodeError, csv.Error, pa.ArrowException) as exc:
        raise SourceError(f"{label}: cannot read {path}: {_one_line(exc)}") from exc
    raise SourceError(
        f"{label}: unsupported file type {path.suffix or '(none)'} for {path}; use one of {', '.join(LOCAL_SUFFIXES)}"
    )


def _read_jsonl(path: Path) -> RawRows:
    parsed: list[tuple[int, Any]] = []
    unparsable: list[tuple[int, str]] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                parsed.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                unparsable.append((number, f"invalid JSON ({exc.msg})"))
    rows = _json_objects(parsed, unit="line")
    rows.unreadable = sorted(unparsable + rows.unreadable)
    return rows


def _read_json(path: Path, label: str) -> RawRows:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SourceError(f"{label}: {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(data, list):
        raise SourceError(f"{label}: {path} must hold a JSON list of objects (or use JSONL, one object a line)")
    return _json_objects(enumerate(data, start=1))


def _json_objects(numbered: Iterable[tuple[int, Any]], unit: str = "row") -> RawRows:
    """The JSON objects among (number, value) pairs as records; any other value is an unreadable row."""
    rows = RawRows(fields=[], records=[], unit=unit)
    seen_fields: dict[str, None] = {}
    for number, record in numbered:
        if not isinstance(record, dict):
            rows.unreadable.append((number, "not a JSON object"))
            continue
        seen_fields.update(dict.fromkeys(record))
        rows.records.append((number, record))
    rows.fields = list(seen_fields)
    return rows


def _read_csv(path: Path, delimiter: str) -> RawRows:
    # Every cell stays text: type guessing would turn an answer like "007" or "0.50" into a number.
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter=delimiter)
        records = [(reader.line_num, dict(row)) for row in reader]
        return RawRows(fields=list(reader.fieldnames or []), records=records, unit="line")


def read_hub(hub: HubDataset, label: str, local_hint: str) -> RawRows:
    try:
        import datasets
        from datasets.exceptions import DatasetNotFoundError
    except ImportError as exc:
        raise SourceError(
            f"{label}: reading {hub} needs the `datasets` package (pip install datasets); "
            f"or use a local copy: {local_hint}"
        ) from exc
    with _quiet_hub_logs():
        try:
            loaded = datasets.load_dataset(hub.repo_id, hub.config, split=hub.split)
        except DatasetNotFoundError as exc:
            raise SourceError(
                f"{label}: {hub} was not found on the Hugging Face Hub (or needs a login); "
                f"check the id, or use a local copy: {local_hint}"
            ) from exc
        except ValueError as exc:  # the dataset was found; a split or config name is wrong
            raise SourceError(f"{label}: {hub}: {_one_line(exc)}") from exc
        except Exception as exc:  # noqa: BLE001 - any failure of the hub is reported as one line
            raise SourceError(
                f"{label}: cannot load {hub} from the Hugging Face Hub ({_one_line(exc)}); "
                f"use a local copy instead: {local_hint}"
            ) from exc
    if isinstance(loaded, datasets.DatasetDict):
        if len(loaded) != 1:
            raise SourceError(f"{label}: {hub} has splits {', '.join(loaded)}; pick one as hf:{hub.repo_id}@SPLIT")
        loaded = next(iter(loaded.values()))
    table = loaded.with_format("arrow")[:]  # memory-mapped by `datasets`: no copy
    return RawRows(fields=table.schema.names, arrow=table)


@contextmanager
def _quiet_hub_logs() -> Iterator[None]:
    """Silence the hub client's retry warnings: an unreachable hub must end in one line."""
    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "datasets")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
