"""`rpg runs`: one row per run with the columns a user scans first, filtered by sweep, state and spec."""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from rpg_cli.metrics import REWARD
from rpg_cli.report.scores import ReportError, pick_val_keys, val_keys
from rpg_cli.states import LIVE

if TYPE_CHECKING:
    from rpg_cli.store import Store

# A row of `rpg runs` (its CSV and JSON), in order; the table shows all but `finished`, some retitled.
SUMMARY_FIELDS = (
    "sweep",
    "name",
    "id",
    "seed",
    "status",
    "attempts",
    "step",
    "reward",
    "val",
    "queued_s",
    "run_s",
    "wall_s",
    "submitted",
    "started",
    "finished",
    "error",
)
# the table's columns (wall = queued + run, and the times but one, are in the CSV and JSON only)
TABLE_FIELDS = tuple(f for f in SUMMARY_FIELDS if f not in ("wall_s", "submitted", "finished"))
TABLE_TITLES = {"val": "val acc", "queued_s": "queued", "run_s": "run", "started": "started (UTC)"}


def parse_where(clauses: Sequence[str]) -> list[tuple[str, bool, list[str]]]:
    """`field=value[,value...]` or `field!=value[,...]` (dotted paths reach nested fields: clip.eps_low)
    -> (path, negated, values). ReportError naming the spec fields when a field is unknown."""
    from rpg_cli.spec import ExperimentSpec

    out = []
    for clause in clauses:
        m = re.match(r"^\s*([A-Za-z_][\w.]*)\s*(!=|=)\s*(.*?)\s*$", clause)
        if not m:
            raise ReportError(f"--where {clause!r}: expected FIELD=VALUE or FIELD!=VALUE (VALUE may be a comma list)")
        path, op, value = m.groups()
        if path.split(".")[0] not in ExperimentSpec.model_fields:
            raise ReportError(
                f"--where {clause!r}: no spec field {path.split('.')[0]!r}; fields: {', '.join(ExperimentSpec.model_fields)}"
            )
        values = [v.strip() for v in value.split(",")]
        for v in values:
            _check_where_value(clause, path, v)
        out.append((path, op == "!=", values))
    return out


def _check_where_value(clause: str, path: str, value: str) -> None:
    """ReportError when `value` could match no value of the spec field `path` (a typo would list 0 runs)."""
    import typing

    from rpg_cli.spec import _field_info, _field_names

    info = _field_info(path)
    if info is None:
        raise ReportError(f"--where {clause!r}: no spec field {path!r}; fields there: {', '.join(_field_names(path))}")
    kinds: list[Any] = []

    def walk(annotation: Any) -> None:
        if typing.get_origin(annotation) is typing.Annotated:
            walk(typing.get_args(annotation)[0])
        elif typing.get_origin(annotation) is typing.Literal:
            kinds.extend(str(v) for v in typing.get_args(annotation))
        elif typing.get_args(annotation) and typing.get_origin(annotation) not in (list, dict):
            for arg in typing.get_args(annotation):
                walk(arg)
        else:
            kinds.append(annotation)

    walk(info.annotation)
    w = value.lower()
    if type(None) in kinds and w in ("none", "null", "off", ""):
        return
    if bool in kinds and w in ("true", "false"):
        return
    if value in kinds or any(not isinstance(k, str) and k not in (int, float, bool, type(None)) for k in kinds):
        return  # a literal, or text, a list or a mapping (compared as text)
    if int in kinds or float in kinds:
        try:
            float(value)
            return
        except ValueError:
            pass
    allowed = [k for k in kinds if isinstance(k, str)]
    allowed += [
        {int: "an integer", float: "a number", bool: "true or false", type(None): "none"}[k]
        for k in kinds
        if not isinstance(k, str)
    ]
    raise ReportError(f"--where {clause!r}: {value!r} is not a value of {path}; allowed: {', '.join(allowed)}")


def _spec_value(spec: dict[str, Any], path: str) -> Any:
    value: Any = spec
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _value_matches(actual: Any, wanted: str) -> bool:
    w = wanted.lower()
    if actual is None:
        return w in ("none", "null", "off", "")
    if isinstance(actual, bool):
        return w == str(actual).lower()
    if isinstance(actual, (int, float)):
        try:
            return float(wanted) == float(actual)
        except ValueError:
            return False
    if isinstance(actual, (dict, list)):
        return w == json.dumps(actual, sort_keys=True).lower() or (w == "on" and bool(actual))
    return str(actual) == wanted


def spec_matches(spec: dict[str, Any], where: Sequence[tuple[str, bool, list[str]]]) -> bool:
    for path, negated, values in where:
        hit = any(_value_matches(_spec_value(spec, path), v) for v in values)
        if hit == negated:
            return False
    return True


def runs_summary(
    store: Store,
    sweep: str | None = None,
    status: Sequence[str] | None = None,
    where: Sequence[str] = (),
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """The columns a user scans first, one dict per run: sweep, name, id, seed, status, attempts, step
    (last step logged), reward (last critic/score/mean), val (the mean over benchmarks of each one's
    last val-core mean@k), queued_s (in Ray's queue: from submitted to started), run_s (from started to
    finished or now), wall_s (both), submitted (Ray took the job), started (rpg first saw it running; the
    watcher looks every few seconds), finished, error. A time rpg did not see is None."""
    filters = parse_where(where)
    runs = [
        r for r in store.runs(sweep=sweep, status=list(status) if status else None) if spec_matches(r.spec, filters)
    ]
    ids = [r.id for r in runs]
    steps = store.last_steps(ids) if ids else {}
    val = pick_val_keys(val_keys(store, ids), "mean", None) if ids else {}
    latest = store.latest_values(ids, [REWARD, *val]) if ids else {}
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    out = []
    for r in runs:
        values = latest.get(r.id, {})
        reward = values.get(REWARD, (None, None))[1]
        vals = [values[k][1] for k in val if k in values and values[k][1] is not None]
        end = r.finished_at or (now if r.status in LIVE else None)
        wall = (end - r.started_at).total_seconds() if r.started_at and end else None
        queued = (r.running_at - r.started_at).total_seconds() if r.running_at and r.started_at else None
        run = (end - r.running_at).total_seconds() if r.running_at and end else None
        out.append(
            {
                "sweep": r.sweep,
                "name": r.name,
                "id": r.id,
                "seed": r.spec.get("seed"),
                "status": r.status,
                "attempts": r.attempts,
                "step": steps.get(r.id),
                "reward": reward,
                "val": statistics.fmean(vals) if vals else None,
                "queued_s": None if queued is None else max(queued, 0.0),
                "run_s": run,
                "wall_s": wall,
                "submitted": _when(r.started_at),
                "started": _when(r.running_at),
                "finished": _when(r.finished_at),
                "error": r.error,
            }
        )
    return out


def _when(at: datetime | None) -> str | None:
    return at.isoformat(sep=" ", timespec="seconds") if at else None


def summary_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=SUMMARY_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def wall_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
