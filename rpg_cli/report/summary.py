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

from rpg_cli.report.scores import ReportError, pick_val_keys, val_keys
from rpg_cli.rundir import REWARD_KEY
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
    "wall_s",
    "started",
    "finished",
    "error",
)
TABLE_TITLES = {"val": "val acc", "wall_s": "wall", "started": "started (UTC)"}


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
        out.append((path, op == "!=", [v.strip() for v in value.split(",")]))
    return out


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
    last val-core mean@k), wall_s (finished or now, minus started), started, finished, error."""
    filters = parse_where(where)
    runs = [
        r for r in store.runs(sweep=sweep, status=list(status) if status else None) if spec_matches(r.spec, filters)
    ]
    ids = [r.id for r in runs]
    steps = store.last_steps(ids) if ids else {}
    val = pick_val_keys(val_keys(store, ids), "mean", None) if ids else {}
    latest = store.latest_values(ids, [REWARD_KEY, *val]) if ids else {}
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    out = []
    for r in runs:
        values = latest.get(r.id, {})
        reward = values.get(REWARD_KEY, (None, None))[1]
        vals = [values[k][1] for k in val if k in values and values[k][1] is not None]
        end = r.finished_at or (now if r.status in LIVE else None)
        wall = (end - r.started_at).total_seconds() if r.started_at and end else None
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
                "wall_s": wall,
                "started": r.started_at.isoformat(sep=" ", timespec="seconds") if r.started_at else None,
                "finished": r.finished_at.isoformat(sep=" ", timespec="seconds") if r.finished_at else None,
                "error": r.error,
            }
        )
    return out


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
