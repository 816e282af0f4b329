"""metrics.jsonl -> rows: the training metrics, and the validation accuracy the trainer logged itself
(verl's, or the local backend's in verl's format) as `evals` rows. Pure Python: the store writes both
in one pass over the new bytes of the file.

The file, as the store reads it (rundir.py has the layout):

    {"step": N, "data": {...}}            a record; a (step, key) logged again later wins
    {"restart": {"keep_through": N}}      a resumed attempt starts here: the steps above N logged so far
                                          are void (N null: all of them); both backends write it
                                          (rundir.MetricsLog)
    anything else on a complete line      corrupt (a crash cut it, or another writer): skipped, warned

A file started over or rewritten in place (verl's own file logger opens it with "wb" when a job starts: a
verl run from before rpg's trainer wrote metrics.jsonl itself, or verl run by hand) is noticed
(metric_files keeps the file's identity and a fingerprint of what it read), and the first record of a
file read from its start is taken as a restart that keeps its own step and those below (verl logs the
resumed step's validation there first).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from rpg_cli import rundir
from rpg_cli.benchmarks import benchmark_name
from rpg_cli.metrics import VAL_ACC_KEY_RE
from rpg_cli.rundir import RESTART_KEY

VERL_VAL_SCORER = "verl-val"
VERL_VAL_SCORER_VERSION = "verl-validation"

Record = tuple[int, dict[str, Any]]  # (step, data) of one metrics.jsonl line
Restart = tuple[None, "int | None"]  # (None, keep_through) of a restart line


def parse_metric_line(line: bytes) -> Record | Restart | str:
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
    return parse_lines(chunk, parse_metric_line)


def parse_lines(chunk: bytes, parse_line: Callable[[bytes], Any]) -> Parsed:
    """`parse_metric_lines` for any JSONL file rpg ingests: `parse_line` returns the event, or (a str)
    why the line is not one."""
    lines = chunk.split(b"\n")
    tail = lines.pop()
    out = Parsed()
    for index, line in enumerate(lines):
        out.consumed += len(line) + 1
        if line.strip():
            parsed = parse_line(line)
            if isinstance(parsed, str):
                out.bad.append((index, parsed))
            else:
                out.events.append(parsed)
    out.lines = len(lines)
    if tail.strip() and not isinstance(parsed_tail := parse_line(tail), str):
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
            if key.startswith("val-") and not isinstance(value, bool) and (match := VAL_ACC_KEY_RE.match(key)):
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


# ------------------------------------------------------------------------------ scored samples (rpg eval)
#
# An evaluation (a Ray job, or `rpg eval --local`) never writes to the store: it appends what it scores
# to <run_dir>/eval/step_N/<benchmark>.scored.jsonl, one line per problem with all its samples:
#
#     {"problem": KEY, "position": P, "scorer": S, "scorer_version": V,
#      "protocol": {"n": K, "temperature": T, "top_p": P, "max_tokens": M, "seed": S},
#      "samples": [{"extracted": "42" | null, "correct": true, "length": 17}, ... K of them]}
#
# and the `rpg` process that holds --db ingests the file (`SampleFiles`). A problem is one line, so a
# killed evaluation leaves whole problems or a torn last line (skipped; the writer ends it before its
# next line); a sample's identity in the store is its primary key (run, step, benchmark, problem,
# index, scorer, protocol), so reading a line twice, or a file again from its start, counts nothing
# twice, and a problem scored again later (a later line) wins.

SAMPLE_PROTOCOL = ("n", "temperature", "top_p", "max_tokens", "seed")


def sample_line(
    problem: str, position: int, scorer: str, version: str, protocol: dict[str, Any], samples: list[tuple]
) -> str:
    """The line of one scored problem; `samples`: (extracted, correct, response length) in sample order."""
    return json.dumps(
        {
            "problem": problem,
            "position": position,
            "scorer": scorer,
            "scorer_version": version,
            "protocol": {name: protocol[name] for name in SAMPLE_PROTOCOL},
            "samples": [{"extracted": a, "correct": bool(c), "length": n} for a, c, n in samples],
        },
        ensure_ascii=False,
        sort_keys=True,
    )


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_sample_line(line: bytes) -> dict[str, Any] | str:
    """A scored problem as written by `sample_line`, or why the line is not one."""
    try:
        obj = json.loads(line)
    except ValueError:
        return "not JSON"
    bad = "not a scored-problem line"
    if not isinstance(obj, dict) or not isinstance(obj.get("problem"), str) or not isinstance(obj.get("scorer"), str):
        return bad
    protocol, samples = obj.get("protocol"), obj.get("samples")
    if not isinstance(protocol, dict) or any(protocol.get(name) is None for name in SAMPLE_PROTOCOL):
        return bad
    if not _int(protocol["n"]) or not isinstance(samples, list) or len(samples) != protocol["n"]:
        return bad
    for sample in samples:
        if not isinstance(sample, dict) or not isinstance(sample.get("correct"), bool):
            return bad
        if not (sample.get("extracted") is None or isinstance(sample["extracted"], str)):
            return bad
    return obj


def sample_rows(run_id: str, step: int, benchmark: str, line: dict[str, Any]) -> list[dict[str, Any]]:
    """The store's `samples` rows of one scored problem."""
    return [
        {
            "run_id": run_id,
            "step": step,
            "benchmark": benchmark,
            "problem": line["problem"],
            "sample_index": j,
            "scorer": line["scorer"],
            **{name: line["protocol"][name] for name in SAMPLE_PROTOCOL},
            "position": line.get("position") if _int(line.get("position")) else None,
            "extracted": sample.get("extracted"),
            "correct": sample["correct"],
            "response_length": sample.get("length") if _int(sample.get("length")) else None,
        }
        for j, sample in enumerate(line["samples"])
    ]


@dataclass(frozen=True)
class Cursor:
    """How far a file has been read, and which file that was (metrics.jsonl's identity: file_id and
    fingerprint): a file replaced or rewritten in place is read again from its start."""

    file_id: str
    offset: int
    fingerprint: str
    lines: int


def read_new(path: str | Path, cursor: Cursor | None, parse_line: Callable[[bytes], Any]) -> tuple[Parsed, Cursor]:
    """What is new in `path` since `cursor` (all of it when None, or when the file is not the one read
    before), parsed with `parse_line`, and the cursor after it. The file is opened without following a
    link (rundir.py's rule; anyone's regular file: a team's store ingests a teammate's runs);
    FileNotFoundError when there is none."""
    with os.fdopen(rundir.open_owned(path, anyone=True), "rb") as f:
        stat = os.fstat(f.fileno())
        start, lines = 0, 0
        if (
            cursor is not None
            and cursor.file_id == file_id(stat)
            and cursor.offset <= stat.st_size
            and cursor.fingerprint == fingerprint(f, cursor.offset)
        ):
            start, lines = cursor.offset, cursor.lines
        f.seek(start)
        parsed = parse_lines(f.read(stat.st_size - start), parse_line)
        offset = start + parsed.consumed
        return parsed, Cursor(file_id(stat), offset, fingerprint(f, offset), lines + parsed.lines)
