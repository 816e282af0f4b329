"""metrics.jsonl -> rows: the training metrics, and the validation accuracy the trainer logged itself
(verl's, or the local backend's in verl's format) as `evals` rows. Pure Python: the store writes both
in one pass over the new bytes of the file.

verl logs `val-core/<data_source>/acc/mean@N`, `.../acc/best@N/mean`, `.../acc/maj@N/mean` and more
(`val-aux/...`: std@N, worst@N/..., and best/maj for smaller N). They are stored with scorer
"verl-val", benchmark = verl's data source name, metric = verl's name with N written k (`mean@k`,
`best@k/mean`, `maj@k/std`, ...) and k = N. verl's best@N and maj@N are bootstrap estimates (subsets
of N drawn with replacement), biased low: they are never labelled pass@k, and verl's std@N (spread of
samples within a problem) is not rpg's std@k; the scorer label keeps them apart.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

VERL_VAL_SCORER = "verl-val"
VERL_VAL_SCORER_VERSION = "verl-validation"
_VAL_KEY = re.compile(
    r"^val-(?:core|aux)/(?P<source>.+)/acc/(?P<name>(?:mean|std|best|worst|maj)@(?P<n>\d+)(?:/(?:mean|std))?)$"
)

Record = tuple[int, dict[str, Any]]  # (step, data) of one metrics.jsonl line


def _parse_record(line: bytes) -> Record | None:
    """One verl file-logger line `{"step": N, "data": {...}}`; None when it is not one."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    step, data = obj.get("step"), obj.get("data")
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(data, dict):
        return None
    return step, data


def parse_metric_lines(chunk: bytes) -> tuple[list[Record], int]:
    """Parse the records in `chunk`; return them and how many bytes were consumed.

    A last line without its newline is consumed only if it is a complete record: a writer caught
    mid-line leaves invalid JSON there, which is left for the next ingestion. Complete lines that are
    not records (blank, garbage) are consumed and skipped.
    """
    lines = chunk.split(b"\n")
    tail = lines.pop()
    records, consumed = [], 0
    for line in lines:
        consumed += len(line) + 1
        if line.strip() and (rec := _parse_record(line)) is not None:
            records.append(rec)
    if tail.strip() and (rec := _parse_record(tail)) is not None:
        records.append(rec)
        consumed += len(tail)
    return records, consumed


MetricRow = tuple[str, str, int, "float | None"]  # run_id, key, step, value
EvalRow = tuple[str, int, str, str, int, str, "float | None", str]  # the `evals` columns, in order


def ingest_rows(run_id: str, records: list[Record]) -> tuple[list[MetricRow], list[EvalRow]]:
    """One pass over the records: the `metrics` rows of every numeric value (strings, lists, dicts,
    None are skipped; NaN becomes NULL), and the `evals` rows of the validation accuracy among them
    (module docstring).

    Metric rows are grouped by key, so that they reach the (run, key, step) b-tree nearly in order:
    appends instead of scattered page writes. Within a key the file's order is kept, so a step logged
    twice keeps its last value; likewise for an eval row's (step, benchmark, metric, k).
    """
    by_key: dict[str, list[MetricRow]] = defaultdict(list)
    evals: dict[tuple[int, str, str, int], EvalRow] = {}
    for step, data in records:
        for key, value in data.items():
            if not isinstance(value, (int, float)):
                continue
            number = None if value != value else float(value)  # NaN -> NULL (SQLite cannot store NaN)
            by_key[key].append((run_id, key, step, number))
            if key.startswith("val-") and not isinstance(value, bool) and (match := _VAL_KEY.match(key)):
                metric, k = re.sub(r"@\d+", "@k", match["name"]), int(match["n"])
                row = (run_id, step, match["source"], metric, k, VERL_VAL_SCORER, number, VERL_VAL_SCORER_VERSION)
                evals[(step, match["source"], metric, k)] = row
    return [row for key in sorted(by_key) for row in by_key[key]], list(evals.values())
