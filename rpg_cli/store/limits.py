"""What a value from a job's file may be before the store takes it: the columns' limits (schema.py declares its
columns with them) and the checks of untrusted values against them, shared by every file rpg ingests (ingest.py:
metrics.jsonl; scored.py: `rpg eval`'s scored samples). A value outside them would end a write in an error on
PostgreSQL (32-bit INTEGER, VARCHAR(n)), whatever SQLite accepts."""

from __future__ import annotations

import json
import math
import re
from typing import Any

INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # sa.Integer: 32 bits on PostgreSQL and MySQL
KEY_CHARS = 200  # metrics.key
NAME_CHARS = 100  # benchmark, scorer, scorer_version (evals, samples)
PROBLEM_CHARS = 64  # samples.problem: a fingerprint

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def is_int(value: Any) -> bool:
    """An integer, and not a bool (JSON's true is no step)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_in(value: Any, low: int = 0, high: int = INT_MAX) -> bool:
    return is_int(value) and low <= value <= high


def is_finite(value: Any) -> bool:
    """A number, not a bool, neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def storable_text(text: str) -> bool:
    """Whether `text` is text a database takes: no NUL (PostgreSQL refuses it), no lone surrogate
    (JSON's \\ud800 escapes decode to one; UTF-8 cannot encode it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def is_name(value: Any, limit: int) -> bool:
    """A name the store keeps and prints on one line: 1 to `limit` characters, none a control character."""
    return isinstance(value, str) and 0 < len(value) <= limit and not _CONTROL.search(value) and storable_text(value)


def show(value: Any) -> str:
    """`value` as the file wrote it, cut short: a warning stays one line."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def load_json(line: bytes) -> Any:
    """The JSON of one line; ValueError when it is none (RecursionError: nesting deeper than the
    parser's stack, which json.loads does not turn into a ValueError itself)."""
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError("nested too deep") from None
