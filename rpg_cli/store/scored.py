"""`rpg eval`'s scored-samples file: one line per scored problem, written by the evaluation
(`sample_line`), checked as untrusted input by the `rpg` process that holds the store (`parse_sample_line`, with
limits.py's checks), and turned into the store's `samples` rows (`sample_rows`). Read with jsonl.py's reader.

An evaluation (a Ray job, or `rpg eval --local`) never writes to the store: it appends what it scores
to <run_dir>/eval/step_N/<benchmark>.scored.jsonl, one line per problem with all its samples:

    {"problem": KEY, "position": P, "scorer": S, "scorer_version": V,
     "protocol": {"n": K, "temperature": T, "top_p": P, "max_tokens": M, "seed": S},
     "samples": [{"extracted": "42" | null, "correct": true, "length": 17}, ... K of them]}

and the `rpg` process that holds --db ingests the file (`SampleFiles`). A problem is one line, so a
killed evaluation leaves whole problems or a torn last line (skipped; the writer ends it before its
next line); a sample's identity in the store is its primary key (run, step, benchmark, problem,
index, scorer, protocol), so reading a line twice, or a file again from its start, counts nothing
twice, and a problem scored again later (a later line) wins. Every field is checked as ingest.py's
module docstring says (`parse_sample_line`): a line that fails is skipped and warned about.
"""

from __future__ import annotations

import json
from typing import Any

from rpg_cli.store.limits import (
    INT_MAX,
    INT_MIN,
    NAME_CHARS,
    PROBLEM_CHARS,
    int_in,
    is_finite,
    is_name,
    load_json,
    show,
    storable_text,
)

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


def parse_sample_line(line: bytes) -> dict[str, Any] | str:
    """A scored problem as written by `sample_line`, or why the line is not one: every field of its
    type and inside the store's columns and the protocol's ranges (evaluation/options.py's)."""
    try:
        obj = load_json(line)
    except ValueError:
        return "not JSON"
    if not isinstance(obj, dict) or not isinstance(obj.get("protocol"), dict):
        return SAMPLE_FORM
    if not is_name(obj.get("problem"), PROBLEM_CHARS):
        return f"problem {show(obj.get('problem'))} is not 1 to {PROBLEM_CHARS} printable characters"
    if not is_name(obj.get("scorer"), NAME_CHARS):
        return f"scorer {show(obj.get('scorer'))} is not 1 to {NAME_CHARS} printable characters"
    version = obj.get("scorer_version")
    if version is not None and not is_name(version, NAME_CHARS):
        return f"scorer_version {show(version)} is not 1 to {NAME_CHARS} printable characters"
    if obj.get("position") is not None and not int_in(obj["position"]):
        return f"position {show(obj['position'])} is not a whole number from 0 to {INT_MAX}"
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
        "n": (int_in(protocol.get("n"), 1), f"a whole number from 1 to {INT_MAX}"),
        "temperature": (is_finite(protocol.get("temperature")) and protocol["temperature"] >= 0, "a number >= 0"),
        "top_p": (is_finite(protocol.get("top_p")) and 0 < protocol["top_p"] <= 1, "a number in (0, 1]"),
        "max_tokens": (int_in(protocol.get("max_tokens"), 1), f"a whole number from 1 to {INT_MAX}"),
        "seed": (int_in(protocol.get("seed"), INT_MIN), f"a whole number from {INT_MIN} to {INT_MAX}"),
    }
    for name, (ok, what) in checks.items():
        if not ok:
            return f"protocol.{name} {show(protocol.get(name))} is not {what}"
    return None


def _sample_fault(sample: Any) -> str | None:
    if not isinstance(sample, dict) or not isinstance(sample.get("correct"), bool):
        return 'not a {"correct": true|false, ...} sample'
    extracted = sample.get("extracted")
    if extracted is not None and not (isinstance(extracted, str) and storable_text(extracted)):
        return "extracted is neither null nor text"
    if sample.get("length") is not None and not int_in(sample["length"]):
        return f"length {show(sample['length'])} is not a whole number from 0 to {INT_MAX}"
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
