"""metrics.jsonl -> rows: the training metrics, and the validation accuracy the trainer logged itself
(verl's, or the local backend's in verl's format) as `evals` rows. Pure Python: the store writes both
in one pass over the new bytes of the file.

The file, as the store reads it (rundir.py has the layout):

    {"step": N, "data": {...}}            a record; a (step, key) logged again later wins (a live run's)
    {"restart": {"keep_through": N}}      a resumed attempt starts here: the steps above N logged so far
                                          are void (N null: all of them); both backends write it
                                          (rundir.MetricsLog)
    {"stopped": {"step": N, "why": W}}    the attempt stopped on request after step N's checkpoint (W:
                                          "preempted" or "cancelled"; rundir.stopped_line): no metric, read
                                          by the orchestrator at the job's end (`stopped_at_end`)
    anything else on a complete line      corrupt (a crash cut it, or another writer): skipped, warned

A job's files are untrusted input, read by the `rpg` process that holds the store: every field is checked
against its type and range before it reaches the store (a step is a whole number in [0, INT_MAX], a
metric name 1 to KEY_CHARS printable characters, a value a number a float can hold (NaN: NULL; an
infinity is a divergence, kept), a validation accuracy in [0, 1] (metrics.accepted_range), the N of
`mean@N` a column's integer, a benchmark name a column's width; a line is at most MAX_LINE bytes). A line
that fails is skipped whole, with one warning naming its file and line number; the lines around it are
read as usual. rpg eval's scored-samples files get the same (scored.py's `parse_sample_line`).

The store is the record; the file only adds to it (store/ingestion.py applies these rules):
  - a restart record voids stored steps only for a live run (states.LIVE), and once per attempt: the
    first restart the store reads after `runs.attempts` grew (begin_attempt); any other is ignored,
    warned. The first read of a file folds it as written: the store holds nothing of it yet.
  - a finished run's rows are never replaced or deleted: lines appended after it finished add only the
    (step, key) the store lacks.
  - a file that no longer matches what was read (truncated, rewritten, replaced: its fingerprint) is
    believed only as a live run's new attempt starting it over (verl's own file logger opens it with
    "wb": a verl run by hand), and then its first record is a restart that keeps its own step and
    those below (verl logs the resumed step's validation there first). Otherwise it is reported in one
    line, the store keeps what it has, reads on from the file's end, and `rpg runs` marks the run.

verl logs `val-core/<data_source>/acc/mean@N`, `.../acc/best@N/mean`, `.../acc/maj@N/mean` and more
(`val-aux/...`: std@N, worst@N/..., and best/maj for smaller N). They are stored with scorer
"verl-val", benchmark = the data source's benchmark name (rpg_cli/benchmarks.py, as `rpg eval` names
it), metric = verl's name with N written k (`mean@k`, `best@k/mean`, `maj@k/std`, ...) and k = n = N.
verl's best@N and maj@N are bootstrap estimates (subsets of N drawn with replacement), biased low:
they are never labelled pass@k, and verl's std@N (spread of samples within a problem) is not rpg's
std@k; the scorer label keeps them apart.
"""

from __future__ import annotations

import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpg_cli import rundir
from rpg_cli.benchmarks import benchmark_name
from rpg_cli.metrics import VAL_ACC_KEY_RE, accepted_range, out_of_range
from rpg_cli.rundir import CANCELLED, PREEMPTED, RESTART_KEY, STOPPED_KEY

# Re-exported: this module was the one home of the limits, the reader and the scored-samples format, and the
# store's callers import them from here (its columns: schema.py; `rpg eval`: evaluation/files.py, recording.py).
from rpg_cli.store.jsonl import (  # noqa: F401
    FINGERPRINT_WINDOW,
    MAX_LINE,
    READ_LIMIT,
    Cursor,
    Parsed,
    changed_since,
    end_cursor,
    file_id,
    fingerprint,
    parse_lines,
    read_new,
)
from rpg_cli.store.limits import (  # noqa: F401
    INT_MAX,
    INT_MIN,
    KEY_CHARS,
    NAME_CHARS,
    PROBLEM_CHARS,
    int_in,
    is_name,
    load_json,
    show,
)
from rpg_cli.store.scored import SAMPLE_FORM, SAMPLE_PROTOCOL, parse_sample_line, sample_line, sample_rows  # noqa: F401

VERL_VAL_SCORER = "verl-val"
VERL_VAL_SCORER_VERSION = "verl-validation"
METRICS_CHUNK = 8 << 20  # bytes of metrics.jsonl the store ingests in one transaction (memory stays bounded)
INGEST_BYTES = 256 << 20  # bytes one Store.ingest_metrics reads at most; the next call reads on

# ----------------------------------------------------------------------------------------- metrics

Record = tuple[int, dict[str, Any]]  # (step, data) of one metrics.jsonl line
Restart = tuple[None, "int | None"]  # (None, keep_through) of a restart line
RECORD_FORM = 'not a {"step": N, "data": {...}} record'
RESTART_FORM = 'not a {"restart": {"keep_through": N}} record'
STOPPED_FORM = f'not a {{"stopped": {{"step": N, "why": "{PREEMPTED}" or "{CANCELLED}"}}}} record'


@dataclass(frozen=True)
class Stopped:
    """A stopped line (rundir.stopped_line): the attempt ended on request after the checkpoint of `step`. Not
    a tuple, so that nothing that reads records and restarts takes it for one."""

    step: int
    why: str


def parse_metric_line(line: bytes) -> Record | Restart | Stopped | str:
    """A record, a restart, a stopped line, or why the line is none of them (the module docstring's checks)."""
    try:
        obj = load_json(line)
    except ValueError:
        return "not JSON"
    if not isinstance(obj, dict):
        return "not a JSON object"
    if RESTART_KEY in obj:
        return _restart(obj)
    if STOPPED_KEY in obj:
        return _stopped(obj)
    if set(obj) != {"step", "data"} or not isinstance(obj["data"], dict):
        return RECORD_FORM
    step = obj["step"]
    if not int_in(step):
        return f"step {show(step)} is not a whole number from 0 to {INT_MAX}"
    for key, value in obj["data"].items():  # the fast path of metric_value_fault: ~25 values a line
        if isinstance(value, (int, float)):
            why, low, high = _KEY_RULES.get(key) or _key_rule(key)
            if (why or not low <= value <= high) and (why := metric_value_fault(key, value)):
                return why
    return step, obj["data"]


def _restart(obj: dict[str, Any]) -> Restart | str:
    """The documented form only (rundir.restart_line): {"restart": {"keep_through": N or null}}."""
    body = obj[RESTART_KEY]
    if set(obj) != {RESTART_KEY} or not isinstance(body, dict) or set(body) != {"keep_through"}:
        return RESTART_FORM
    keep = body["keep_through"]
    if keep is not None and not int_in(keep):
        return f"restart keep_through {show(keep)} is neither null nor a step from 0 to {INT_MAX}"
    return None, keep


def _stopped(obj: dict[str, Any]) -> Stopped | str:
    """The documented form only (rundir.stopped_line): {"stopped": {"step": N, "why": "preempted"|"cancelled"}}."""
    body = obj[STOPPED_KEY]
    if set(obj) != {STOPPED_KEY} or not isinstance(body, dict) or set(body) != {"step", "why"}:
        return STOPPED_FORM
    if not int_in(body["step"]):
        return f"stopped step {show(body['step'])} is not a whole number from 0 to {INT_MAX}"
    if body["why"] not in (PREEMPTED, CANCELLED):
        return f"stopped why {show(body['why'])} is neither {PREEMPTED!r} nor {CANCELLED!r}"
    return Stopped(body["step"], body["why"])


STOPPED_TAIL = 4096  # bytes `stopped_at_end` reads: a stopped line is under 100


def stopped_at_end(path: str | Path) -> Stopped | None:
    """The stopped line that ends a run's metrics.jsonl (its newest attempt stopped on request), else None:
    the file ends with another line, a torn one, or is missing. Reads the file's last bytes only, opened as
    the store opens it (read_new), the line checked as every line is."""
    try:
        fd = rundir.open_owned(path, os.O_RDONLY | os.O_NONBLOCK, anyone=True)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - STOPPED_TAIL)
        f.seek(start)
        tail = f.read(size - start)
    if not tail.endswith(b"\n"):  # empty, or the last line is not whole yet
        return None
    body = tail.rstrip(b"\n")
    cut = body.rfind(b"\n")
    if cut < 0 and start > 0:  # a last line longer than the tail: not a stopped line
        return None
    event = parse_metric_line(body[cut + 1 :])
    return event if isinstance(event, Stopped) else None


def metric_value_fault(key: str, value: Any) -> str | None:
    """Why (key, value) of a record's data cannot be stored, else None. Values that are no number (text,
    lists, null) are not metric values: skipped, whatever their key."""
    if not isinstance(value, (int, float)):
        return None
    why, _, _ = _key_rule(key)
    if why:
        return why
    if type(value) is int and abs(value) > _FLOAT_MAX:  # a float cannot hold it (float() raises OverflowError)
        return f"{key} is a number too large for a float"
    return out_of_range(key, float(value))


KeyRule = tuple["str | None", float, float]  # why a key takes no value (None: it does); a range of them
_KEY_RULES: dict[str, KeyRule] = {}
_FLOAT_MAX = sys.float_info.max


def _key_rule(key: str) -> KeyRule:
    """(why values cannot be stored under `key`, else None; a range its values may take without a closer
    look: accepted_range within a float's, so NaN, infinities and huge integers get one). Remembered: a
    file logs the same keys every step."""
    if len(_KEY_RULES) > 4096:  # a forger's endless new keys cost time, never memory
        _KEY_RULES.clear()
    why = _key_fault(key)
    low, high = accepted_range(key) if why is None else (0.0, 0.0)
    _KEY_RULES[key] = rule = (why, max(low, -_FLOAT_MAX), min(high, _FLOAT_MAX))
    return rule


def _key_fault(key: str) -> str | None:
    """Why no value can be stored under `key` (a metrics row, and an evals row for a validation accuracy)."""
    if not is_name(key, KEY_CHARS):
        return f"metric name {show(key)} is not 1 to {KEY_CHARS} printable characters"
    match = VAL_ACC_KEY_RE.match(key) if key.startswith("val-") else None
    if match is None:
        return None
    if not (len(match["n"]) <= 10 and 1 <= int(match["n"]) <= INT_MAX):
        return f"{key}: {show(match['n'])} samples per problem is not from 1 to {INT_MAX}"
    if not is_name(benchmark_name(match["source"]), NAME_CHARS):
        return f"{key}: the data source is not 1 to {NAME_CHARS} printable characters"
    return None


def parse_metric_lines(chunk: bytes) -> Parsed:
    """Parse the lines in `chunk`: records, restarts and stops in order, bytes and lines consumed, bad lines.

    A last line without its newline is consumed only if it is a complete record: a writer caught
    mid-line leaves invalid JSON there, which is left for the next ingestion. Blank lines are skipped;
    other complete lines that are none of them are skipped and listed in `bad`.
    """
    return parse_lines(chunk, parse_metric_line)


@dataclass
class Segment:
    """A restart (or none: the records before the first) and the records after it. `line`: the
    restart's line index in the read; None for the restart a file read from its start begins with."""

    restart: bool
    keep: int | None
    line: int | None
    records: list[Record]


def segments(parsed: Parsed, from_start: bool) -> list[Segment]:
    """The events in order, cut at each restart. A file read `from_start` begins with a restart that
    keeps the first record's step (module docstring), unless it begins with a restart line of its own.
    A stopped line carries no metric: it is left out (the orchestrator reads it: `stopped_at_end`)."""
    out = [Segment(False, None, None, [])]
    for event, index in zip(parsed.events, parsed.where):
        if isinstance(event, Stopped):
            continue
        step, value = event
        if step is None:
            out.append(Segment(True, value, index, []))
        else:
            if from_start and len(out) == 1 and not out[0].records:
                out[0] = Segment(True, step, None, [])
            out[-1].records.append((step, value))
    return [s for s in out if s.restart or s.records]


# --------------------------------------------------------------------------------------------- rows

MetricRow = tuple[str, str, int, "float | None"]  # run_id, key, step, value
ValRow = tuple[int, str, str, int, "float | None"]  # step, benchmark, metric, k (= n), value


def ingest_rows(run_id: str, records: list[Record]) -> tuple[list[MetricRow], list[ValRow]]:
    """One pass over the records (checked by parse_metric_line): the `metrics` rows of every numeric
    value (strings, lists, dicts, None are skipped; NaN becomes NULL), and the validation accuracy among
    them (module docstring).

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
    for segment in segments(parse_metric_lines(text.encode()), from_start=False):
        if segment.restart:
            view = {s: d for s, d in view.items() if segment.keep is not None and s <= segment.keep}
        for step, data in segment.records:
            view.setdefault(step, {}).update(data)
    return dict(sorted(view.items()))
