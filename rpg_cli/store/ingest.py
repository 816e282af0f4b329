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
read as usual. rpg eval's scored-samples files get the same (`parse_sample_line`).

The store is the record; the file only adds to it (store/db.py applies these rules):
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

import hashlib
import json
import math
import os
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from rpg_cli import rundir
from rpg_cli.benchmarks import benchmark_name
from rpg_cli.metrics import VAL_ACC_KEY_RE, accepted_range, out_of_range
from rpg_cli.rundir import CANCELLED, PREEMPTED, RESTART_KEY, STOPPED_KEY

VERL_VAL_SCORER = "verl-val"
VERL_VAL_SCORER_VERSION = "verl-validation"

# ----------------------------------------------------------------------------------------- limits
# What the store's columns hold (schema.py declares its columns with these): a value outside them would
# end a write in an error on PostgreSQL (32-bit INTEGER, VARCHAR(n)), whatever SQLite accepts.

INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # sa.Integer: 32 bits on PostgreSQL and MySQL
KEY_CHARS = 200  # metrics.key
NAME_CHARS = 100  # benchmark, scorer, scorer_version (evals, samples)
PROBLEM_CHARS = 64  # samples.problem: a fingerprint
MAX_LINE = 4 << 20  # bytes: no line rpg writes comes near (a scored problem of 4096 samples: ~1 MiB)
READ_LIMIT = 64 << 20  # bytes `read_new` reads at most per call; the next call reads on
METRICS_CHUNK = 8 << 20  # bytes of metrics.jsonl the store ingests in one transaction (memory stays bounded)
INGEST_BYTES = 256 << 20  # bytes one Store.ingest_metrics reads at most; the next call reads on

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(value: Any, low: int = 0, high: int = INT_MAX) -> bool:
    return _int(value) and low <= value <= high


def _unicode(text: str) -> bool:
    """Whether `text` is text a database takes: no NUL (PostgreSQL refuses it), no lone surrogate
    (JSON's \\ud800 escapes decode to one; UTF-8 cannot encode it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def _name(value: Any, limit: int) -> bool:
    """A name the store keeps and prints on one line: 1 to `limit` characters, none a control character."""
    return isinstance(value, str) and 0 < len(value) <= limit and not _CONTROL.search(value) and _unicode(value)


def _show(value: Any) -> str:
    """`value` as the file wrote it, cut short: a warning stays one line."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _load(line: bytes) -> Any:
    """The JSON of one line; ValueError when it is none (RecursionError: nesting deeper than the
    parser's stack, which json.loads does not turn into a ValueError itself)."""
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError("nested too deep") from None


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
        obj = _load(line)
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
    if not _int_in(step):
        return f"step {_show(step)} is not a whole number from 0 to {INT_MAX}"
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
    if keep is not None and not _int_in(keep):
        return f"restart keep_through {_show(keep)} is neither null nor a step from 0 to {INT_MAX}"
    return None, keep


def _stopped(obj: dict[str, Any]) -> Stopped | str:
    """The documented form only (rundir.stopped_line): {"stopped": {"step": N, "why": "preempted"|"cancelled"}}."""
    body = obj[STOPPED_KEY]
    if set(obj) != {STOPPED_KEY} or not isinstance(body, dict) or set(body) != {"step", "why"}:
        return STOPPED_FORM
    if not _int_in(body["step"]):
        return f"stopped step {_show(body['step'])} is not a whole number from 0 to {INT_MAX}"
    if body["why"] not in (PREEMPTED, CANCELLED):
        return f"stopped why {_show(body['why'])} is neither {PREEMPTED!r} nor {CANCELLED!r}"
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
    if not _name(key, KEY_CHARS):
        return f"metric name {_show(key)} is not 1 to {KEY_CHARS} printable characters"
    match = VAL_ACC_KEY_RE.match(key) if key.startswith("val-") else None
    if match is None:
        return None
    if not (len(match["n"]) <= 10 and 1 <= int(match["n"]) <= INT_MAX):
        return f"{key}: {_show(match['n'])} samples per problem is not from 1 to {INT_MAX}"
    if not _name(benchmark_name(match["source"]), NAME_CHARS):
        return f"{key}: the data source is not 1 to {NAME_CHARS} printable characters"
    return None


# --------------------------------------------------------------------------------------------- lines


@dataclass
class Parsed:
    events: list[Any] = field(default_factory=list)  # records, restarts, stops (or scored problems), in file order
    where: list[int] = field(default_factory=list)  # each event's line: its index among this read's lines
    consumed: int = 0  # bytes
    lines: int = 0  # complete lines consumed (an overlong line: when its first bytes are)
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line index in the chunk, why)
    more: bool = False  # the read stopped at its limit: more bytes wait (read_new)
    changed: str | None = None  # how the file no longer matched the cursor: read from its start (read_new)

    @property
    def records(self) -> list[Record]:
        return [e for e in self.events if isinstance(e, tuple) and e[0] is not None]


def parse_metric_lines(chunk: bytes) -> Parsed:
    """Parse the lines in `chunk`: records, restarts and stops in order, bytes and lines consumed, bad lines.

    A last line without its newline is consumed only if it is a complete record: a writer caught
    mid-line leaves invalid JSON there, which is left for the next ingestion. Blank lines are skipped;
    other complete lines that are none of them are skipped and listed in `bad`.
    """
    return parse_lines(chunk, parse_metric_line)


def parse_lines(
    chunk: bytes, parse_line: Callable[[bytes], Any], mid_line: bool = False, at_end: bool = True
) -> Parsed:
    """`parse_metric_lines` for any JSONL file rpg ingests: `parse_line` returns the event, or (a str)
    why the line is not one.

    `mid_line`: the chunk starts inside a line already counted (an overlong one, or a complete last
    record a writer then ended): its rest, up to the first newline, is skipped unread. `at_end`: the
    chunk ends where the file does (else a last line without its newline waits for the next read,
    whatever it holds). A line longer than MAX_LINE is bad; when its newline is not in the chunk yet,
    its bytes so far are consumed and it is counted now, so a huge line is never read twice.
    """
    out = Parsed()
    pos = 0
    if mid_line:
        newline = chunk.find(b"\n")
        if newline < 0:
            out.consumed = len(chunk)
            return out
        pos = newline + 1
    while (newline := chunk.find(b"\n", pos)) >= 0:
        _take(out, chunk[pos:newline], parse_line)
        pos = newline + 1
    tail = chunk[pos:]
    if len(tail) > MAX_LINE:
        out.bad.append((out.lines, f"longer than {MAX_LINE} bytes"))
        out.lines += 1
        pos = len(chunk)
    elif at_end and tail.strip() and not isinstance(event := parse_line(tail), str):
        out.events.append(event)
        out.where.append(out.lines)
        out.lines += 1
        pos = len(chunk)
    out.consumed = pos
    return out


def _take(out: Parsed, line: bytes, parse_line: Callable[[bytes], Any]) -> None:
    """One complete line into `out`: an event, a bad line, or nothing (blank)."""
    index = out.lines
    out.lines += 1
    if len(line) > MAX_LINE:
        out.bad.append((index, f"longer than {MAX_LINE} bytes"))
    elif line.strip():
        event = parse_line(line)
        if isinstance(event, str):
            out.bad.append((index, event))
        else:
            out.events.append(event)
            out.where.append(index)


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
# twice, and a problem scored again later (a later line) wins. Every field is checked as the module
# docstring says (`parse_sample_line`): a line that fails is skipped and warned about.

SAMPLE_PROTOCOL = ("n", "temperature", "top_p", "max_tokens", "seed")
SAMPLE_FORM = "not a scored-problem line"


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


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_sample_line(line: bytes) -> dict[str, Any] | str:
    """A scored problem as written by `sample_line`, or why the line is not one: every field of its
    type and inside the store's columns and the protocol's ranges (evaluation/options.py's)."""
    try:
        obj = _load(line)
    except ValueError:
        return "not JSON"
    if not isinstance(obj, dict) or not isinstance(obj.get("protocol"), dict):
        return SAMPLE_FORM
    if not _name(obj.get("problem"), PROBLEM_CHARS):
        return f"problem {_show(obj.get('problem'))} is not 1 to {PROBLEM_CHARS} printable characters"
    if not _name(obj.get("scorer"), NAME_CHARS):
        return f"scorer {_show(obj.get('scorer'))} is not 1 to {NAME_CHARS} printable characters"
    version = obj.get("scorer_version")
    if version is not None and not _name(version, NAME_CHARS):
        return f"scorer_version {_show(version)} is not 1 to {NAME_CHARS} printable characters"
    if obj.get("position") is not None and not _int_in(obj["position"]):
        return f"position {_show(obj['position'])} is not a whole number from 0 to {INT_MAX}"
    if why := _protocol_fault(obj["protocol"]):
        return why
    samples = obj.get("samples")
    if not isinstance(samples, list) or len(samples) != obj["protocol"]["n"]:
        return f"samples is not a list of protocol.n = {obj['protocol']['n']} samples"
    for j, sample in enumerate(samples):
        if why := _sample_fault(sample):
            return f"sample {j}: {why}"
    return obj


def _protocol_fault(protocol: dict[str, Any]) -> str | None:
    """Why a scored line's protocol is not one `rpg eval` draws with, else None."""
    checks = {
        "n": (_int_in(protocol.get("n"), 1), f"a whole number from 1 to {INT_MAX}"),
        "temperature": (_finite(protocol.get("temperature")) and protocol["temperature"] >= 0, "a number >= 0"),
        "top_p": (_finite(protocol.get("top_p")) and 0 < protocol["top_p"] <= 1, "a number in (0, 1]"),
        "max_tokens": (_int_in(protocol.get("max_tokens"), 1), f"a whole number from 1 to {INT_MAX}"),
        "seed": (_int_in(protocol.get("seed"), INT_MIN), f"a whole number from {INT_MIN} to {INT_MAX}"),
    }
    for name, (ok, what) in checks.items():
        if not ok:
            return f"protocol.{name} {_show(protocol.get(name))} is not {what}"
    return None


def _sample_fault(sample: Any) -> str | None:
    if not isinstance(sample, dict) or not isinstance(sample.get("correct"), bool):
        return 'not a {"correct": true|false, ...} sample'
    extracted = sample.get("extracted")
    if extracted is not None and not (isinstance(extracted, str) and _unicode(extracted)):
        return "extracted is neither null nor text"
    if sample.get("length") is not None and not _int_in(sample["length"]):
        return f"length {_show(sample['length'])} is not a whole number from 0 to {INT_MAX}"
    return None


def sample_rows(run_id: str, step: int, benchmark: str, line: dict[str, Any]) -> list[dict[str, Any]]:
    """The store's `samples` rows of one scored problem (a line parse_sample_line accepted)."""
    return [
        {
            "run_id": run_id,
            "step": step,
            "benchmark": benchmark,
            "problem": line["problem"],
            "sample_index": j,
            "scorer": line["scorer"],
            **{name: line["protocol"][name] for name in SAMPLE_PROTOCOL},
            "position": line.get("position"),
            "extracted": sample.get("extracted"),
            "correct": sample["correct"],
            "response_length": sample.get("length"),
        }
        for j, sample in enumerate(line["samples"])
    ]


# ------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Cursor:
    """How far a file has been read, and what was read (a fingerprint; file_id: where it was): a file
    truncated, replaced or rewritten in place is read from its start again, and `Parsed.changed` says so
    (the store decides whether to believe it: store/db.py)."""

    file_id: str
    offset: int
    fingerprint: str
    lines: int


def changed_since(f: BinaryIO, size: int, cursor: Cursor) -> str | None:
    """How the open file `f` (`size` bytes) no longer holds what `cursor` read, else None. The bytes
    decide, not the inode: a copy of the file (a run directory restored) reads on where it stopped."""
    if size < cursor.offset:
        return f"it is {size} bytes, shorter than the {cursor.offset} already read: truncated or started over"
    if fingerprint(f, cursor.offset) != cursor.fingerprint:
        return "the bytes already read have changed: rewritten, or replaced by another file"
    return None


def read_new(
    path: str | Path, cursor: Cursor | None, parse_line: Callable[[bytes], Any], limit: int = READ_LIMIT
) -> tuple[Parsed, Cursor]:
    """What is new in `path` since `cursor` (all of it when None, or when the file is not the one read
    before: then `Parsed.changed` says how), at most `limit` bytes of it (`Parsed.more`: the rest waits
    for the next call), parsed with `parse_line`, and the cursor after it. The file is opened without
    following a link (rundir.py's rule; anyone's regular file: a team's store ingests a teammate's runs;
    non-blocking: a FIFO planted there is refused, never waited on); FileNotFoundError when there is none."""
    flags = os.O_RDONLY | os.O_NONBLOCK
    limit = max(limit, MAX_LINE + 1)  # a chunk always ends a line: each call reads on
    with os.fdopen(rundir.open_owned(path, flags, anyone=True), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start, lines, changed = 0, 0, None
        if cursor is not None and (changed := changed_since(f, size, cursor)) is None:
            start, lines = cursor.offset, cursor.lines
        mid_line = False
        if start:
            f.seek(start - 1)
            mid_line = f.read(1) != b"\n"
        f.seek(start)
        chunk = f.read(max(0, min(limit, size - start)))
        parsed = parse_lines(chunk, parse_line, mid_line=mid_line, at_end=start + len(chunk) >= size)
        parsed.changed = changed
        parsed.more = start + len(chunk) < size and parsed.consumed > 0
        offset = start + parsed.consumed
        return parsed, Cursor(file_id(os.fstat(f.fileno())), offset, fingerprint(f, offset), lines + parsed.lines)


def end_cursor(path: str | Path) -> Cursor:
    """A cursor at the end of the file's last complete line (a line being written is read when it is
    whole), its lines counted: reading on from there ignores everything before. Reads the file once."""
    with os.fdopen(rundir.open_owned(path, os.O_RDONLY | os.O_NONBLOCK, anyone=True), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        lines, offset, done = 0, 0, 0
        while done < size and (block := f.read(min(READ_LIMIT, size - done))):
            lines += block.count(b"\n")
            if (last := block.rfind(b"\n")) >= 0:
                offset = done + last + 1
            done += len(block)
        return Cursor(file_id(os.fstat(f.fileno())), offset, fingerprint(f, offset), lines)
