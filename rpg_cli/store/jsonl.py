"""Reading a job's JSONL file as untrusted input, incrementally: only the bytes past a cursor, in bounded
chunks, a line at most MAX_LINE bytes, each complete line handed to a parser that returns its event or why it is
none (`parse_lines`); the cursor's fingerprint notices a file truncated, replaced or rewritten in place
(`read_new`: `Parsed.changed`). The files' formats and what the store believes of them are ingest.py's
(metrics.jsonl) and scored.py's (`rpg eval`'s scored samples)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from rpg_cli import rundir

MAX_LINE = 4 << 20  # bytes: no line rpg writes comes near (a scored problem of 4096 samples: ~1 MiB)
READ_LIMIT = 64 << 20  # bytes `read_new` reads at most per call; the next call reads on
FINGERPRINT_WINDOW = 4096

# --------------------------------------------------------------------------------------------- lines


@dataclass
class Parsed:
    """What one read of a file found: its events in order, the bad lines, and how far it got."""

    events: list[Any] = field(default_factory=list)  # records, restarts, stops (or scored problems), in file order
    where: list[int] = field(default_factory=list)  # each event's line: its index among this read's lines
    consumed: int = 0  # bytes
    lines: int = 0  # complete lines consumed (an overlong line: when its first bytes are)
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line index in the chunk, why)
    more: bool = False  # the read stopped at its limit: more bytes wait (read_new)
    changed: str | None = None  # how the file no longer matched the cursor: read from its start (read_new)

    @property
    def records(self) -> list[tuple[int, dict[str, Any]]]:
        return [e for e in self.events if isinstance(e, tuple) and e[0] is not None]


def parse_lines(
    chunk: bytes, parse_line: Callable[[bytes], Any], mid_line: bool = False, at_end: bool = True
) -> Parsed:
    """The lines in `chunk` of any JSONL file rpg ingests (metrics.jsonl's: ingest.parse_metric_lines):
    `parse_line` returns the event, or (a str) why the line is not one.

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


# ------------------------------------------------------------------------------------------ identity


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


# ------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Cursor:
    """How far a file has been read, and what was read (a fingerprint; file_id: where it was): a file
    truncated, replaced or rewritten in place is read from its start again, and `Parsed.changed` says so
    (the store decides whether to believe it: store/ingestion.py)."""

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
