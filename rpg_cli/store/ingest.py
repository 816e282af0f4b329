"""metrics.jsonl -> rows: the training metrics, and the validation accuracy the trainer logged itself
(verl's, or the local backend's in verl's format) as `evals` rows. Pure Python: the store writes both
in one pass over the new bytes of the file.

The file, as the store reads it (rundir.py has the layout):

    {"step": N, "data": {...}}            a record; a (step, key) logged again later wins
    {"restart": {"keep_through": N}}      a resumed attempt starts here: the steps above N logged so far
                                          are void (N null: all of them); the local trainer writes it
    anything else on a complete line      corrupt (a crash cut it, or another writer): skipped, warned

verl's file logger opens the file with "wb" when a job starts, so a resumed verl run starts the file
over instead of writing a restart line: the store notices (metric_files keeps the file's identity and
a fingerprint of what it read) and treats the first record of a file read from its start as a restart
that keeps its own step and those below (verl logs the resumed step's validation there first).

verl logs `val-core/<data_source>/acc/mean@N`, `.../acc/best@N/mean`, `.../acc/maj@N/mean` and more
(`val-aux/...`: std@N, worst@N/..., and best/maj for smaller N). They are stored with scorer
"verl-val", benchmark = the data source's benchmark name (rpg_cli/benchmarks.py, as `rpg eval` names
it), metric = verl's name with N written k (`mean@k`, `best@k/mean`, `maj@k/std`, ...) and k = n = N.
verl's best@N and maj@N are bootstrap estimates (subsets of N drawn with replacement), biased low:
they are never labelled pass@k, and verl's std@N (spread of samples within a problem) is not rpg's
std@k; the scorer label keeps them apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from rpg_cli.benchmarks import benchmark_name
from rpg_cli.rundir import RESTART_KEY

VERL_VAL_SCORER = "verl-val"
VERL_VAL_SCORER_VERSION = "verl-validation"
_VAL_KEY = re.compile(
    r"^val-(?:core|aux)/(?P<source>.+)/acc/(?P<name>(?:mean|std|best|worst|maj)@(?P<n>\d+)(?:/(?:mean|std))?)$"
)

Record = tuple[int, dict[str, Any]]  # (step, data) of one metrics.jsonl line
Restart = tuple[None, "int | None"]  # (None, keep_through) of a restart line


def _parse_line(line: bytes) -> Record | Restart | str:
    """A record, a restart, or why the line is neither."""
    try:
        obj = json.loads(line)
    except ValueError:
        return "not JSON"
    if isinstance(obj, dict) and set(obj) == {RESTART_KEY} and isinstance(obj[RESTART_KEY], dict):
        keep = obj[RESTART_KEY].get("keep_through")
        if keep is None or (isinstance(keep, int) and not isinstance(keep, bool)):
            return None, keep
    if not isinstance(obj, dict):
        return "not a JSON object"
    step, data = obj.get("step"), obj.get("data")
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(data, dict):
        return 'not a {"step": N, "data": {...}} record'
    return step, data


@dataclass
class Parsed:
    events: list[Record | Restart] = field(default_factory=list)  # records and restarts, in file order
    consumed: int = 0  # bytes
    lines: int = 0  # complete lines consumed
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line index in the chunk, why)

    @property
    def records(self) -> list[Record]:
        return [e for e in self.events if e[0] is not None]  # type: ignore[misc]


def parse_metric_lines(chunk: bytes) -> Parsed:
    """Parse the lines in `chunk`: records and restarts in order, bytes and lines consumed, bad lines.

    A last line without its newline is consumed only if it is a complete record: a writer caught
    mid-line leaves invalid JSON there, which is left for the next ingestion. Blank lines are skipped;
    other complete lines that are neither records nor restarts are skipped and listed in `bad`.
    """
    lines = chunk.split(b"\n")
    tail = lines.pop()
    out = Parsed()
    for index, line in enumerate(lines):
        out.consumed += len(line) + 1
        if line.strip():
            parsed = _parse_line(line)
            if isinstance(parsed, str):
                out.bad.append((index, parsed))
            else:
                out.events.append(parsed)
    out.lines = len(lines)
    if tail.strip() and not isinstance(parsed_tail := _parse_line(tail), str):
        out.events.append(parsed_tail)
        out.consumed += len(tail)
        out.lines += 1
    return out


def segments(events: list[Record | Restart], from_start: bool) -> list[tuple[bool, int | None, list[Record]]]:
    """The events as (restart?, keep_through, the records after it) in order. A file read `from_start`
    begins with a restart that keeps the first record's step (module docstring), unless it begins
    with a restart line of its own."""
    out: list[tuple[bool, int | None, list[Record]]] = [(False, None, [])]
    for step, value in events:
        if step is None:
            out.append((True, value, []))
        else:
            if from_start and len(out) == 1 and not out[0][2]:
                out[0] = (True, step, [])
            out[-1][2].append((step, value))
    return [s for s in out if s[0] or s[2]]


# ------------------------------------------------------------------------------------------ identity

FINGERPRINT_WINDOW = 4096


def file_id(stat: os.stat_result) -> str:
    return f"{stat.st_dev}:{stat.st_ino}"


def fingerprint(f: BinaryIO, offset: int) -> str:
    """A hash of the file's first and last FINGERPRINT_WINDOW bytes before `offset`: what the store read
    of it. A file started over (verl) or rewritten in place (another writer) no longer matches: it
    starts with another step, or holds other lines (other timings, at least) where the store stopped."""
    h = hashlib.sha256()
    f.seek(0)
    h.update(f.read(min(offset, FINGERPRINT_WINDOW)))
    tail = max(0, offset - FINGERPRINT_WINDOW)
    f.seek(tail)
    h.update(f.read(offset - tail))
    return h.hexdigest()[:32]


# --------------------------------------------------------------------------------------------- rows

MetricRow = tuple[str, str, int, "float | None"]  # run_id, key, step, value
ValRow = tuple[int, str, str, int, "float | None"]  # step, benchmark, metric, k (= n), value


def ingest_rows(run_id: str, records: list[Record]) -> tuple[list[MetricRow], list[ValRow]]:
    """One pass over the records: the `metrics` rows of every numeric value (strings, lists, dicts,
    None are skipped; NaN becomes NULL), and the validation accuracy among them (module docstring).

    Metric rows are grouped by key, so that they reach the (run, key, step) b-tree nearly in order:
    appends instead of scattered page writes. Within a key the file's order is kept, so a step logged
    twice keeps its last value; likewise for a validation row's (step, benchmark, metric, k).
    """
    by_key: dict[str, list[MetricRow]] = defaultdict(list)
    evals: dict[tuple[int, str, str, int], ValRow] = {}
    for step, data in records:
        for key, value in data.items():
            if not isinstance(value, (int, float)):
                continue
            number = None if value != value else float(value)  # NaN -> NULL (SQLite cannot store NaN)
            by_key[key].append((run_id, key, step, number))
            if key.startswith("val-") and not isinstance(value, bool) and (match := _VAL_KEY.match(key)):
                metric, k = re.sub(r"@\d+", "@k", match["name"]), int(match["n"])
                bench = benchmark_name(match["source"])
                evals[(step, bench, metric, k)] = (step, bench, metric, k, number)
    return [row for key in sorted(by_key) for row in by_key[key]], list(evals.values())


def metrics_view(text: str) -> dict[int, dict[str, Any]]:
    """What a metrics.jsonl says, read whole: {step: {key: value}} with restarts applied and the last
    value of a (step, key) kept. For people and tests; the store reads incrementally."""
    view: dict[int, dict[str, Any]] = {}
    for restart, keep, records in segments(parse_metric_lines(text.encode()).events, from_start=False):
        if restart:
            view = {s: d for s, d in view.items() if keep is not None and s <= keep}
        for step, data in records:
            view.setdefault(step, {}).update(data)
    return dict(sorted(view.items()))
