"""`rpg runs`: one row per run with the columns a user scans first, filtered by sweep, state and spec."""

from __future__ import annotations

import csv
import io
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from rpg_cli import cost
from rpg_cli.metrics import REWARD, THROUGHPUT
from rpg_cli.report.scores import ReportError, pick_val_keys, val_keys
from rpg_cli.states import LIVE
from rpg_cli.watch import last_line, stalled

if TYPE_CHECKING:
    from rpg_cli.store import RunRecord, Store

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
    "s_per_step",
    "tokens_s_per_device",
    "device_hours",
    "eta_s",
    "submitted",
    "started",
    "finished",
    "error",
    "stalled_s",
    "last_line",
)
# the table's columns (wall = queued + run, and the times but one, are in the CSV and JSON only; a stall shows
# in the state and error columns)
TABLE_FIELDS = tuple(
    f for f in SUMMARY_FIELDS if f not in ("wall_s", "submitted", "finished", "stalled_s", "last_line")
)
TABLE_TITLES = {
    "val": "val acc",
    "queued_s": "queued",
    "run_s": "run",
    "s_per_step": "s/step",
    "tokens_s_per_device": "tok/s/dev",
    "device_hours": "dev-h",
    "eta_s": "ETA",
    "started": "started (UTC)",
}
# a run's pace is the median time of its last this many steps: the rest of a run goes at its recent pace (its
# responses grow as it trains), and the read is bounded however long the run
PACE_STEPS = 100
# Above this many runs `rpg runs` prints one row per sweep (`--all`: every run): a terminal table of thousands of
# rows is read by nobody and costs seconds to lay out; CSV and JSON always hold every run.
SUMMARIZE_ABOVE = 200


def parse_where(clauses: Sequence[str]) -> list[tuple[str, bool, list[Any]]]:
    """`field=value[,value...]` or `field!=value[,...]` (dotted paths reach nested fields: clip.eps_low)
    -> (path, negated, wanted values). A value is written as a spec's YAML writes it (`clip=off`,
    `reference={every: 10}`, `data.train_files=[a.parquet]`; commas inside brackets stay in the value) and
    must be one the field takes, by the spec's own types (its literals, nested models, bounds): a value no
    run can have is a ReportError naming the field and what it takes (a typo would list 0 runs)."""
    from rpg_cli.spec import ExperimentSpec

    out = []
    for clause in clauses:
        m = re.match(r"^\s*([A-Za-z_][\w.]*)\s*(!=|=)\s*(.*?)\s*$", clause, re.S)
        if not m:
            raise ReportError(f"--where {clause!r}: expected FIELD=VALUE or FIELD!=VALUE (VALUE may be a comma list)")
        path, op, value = m.groups()
        if path.split(".")[0] not in ExperimentSpec.model_fields:
            fields = ", ".join(ExperimentSpec.model_fields)
            raise ReportError(f"--where {clause!r}: no spec field {path.split('.')[0]!r}; fields: {fields}")
        adapter = _field_adapter(clause, path)
        out.append((path, op == "!=", [_wanted(clause, path, adapter, text) for text in _split_values(value)]))
    return out


def _field_adapter(clause: str, path: str) -> Any:
    """A validator of one value of the spec field `path`, under the spec's own config (strict, finite)."""
    from pydantic import BaseModel, ConfigDict, TypeAdapter

    from rpg_cli.spec import ExperimentSpec, field_info, field_names

    info = field_info(path)
    if info is None:
        parent = path.rpartition(".")[0]
        if not field_names(path):
            raise ReportError(
                f"--where {clause!r}: {parent} has no fields of its own; filter on it whole ({parent}=VALUE)"
            )
        raise ReportError(f"--where {clause!r}: no spec field {path!r}; fields there: {', '.join(field_names(path))}")
    annotation = info.rebuild_annotation()
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return TypeAdapter(annotation)  # a model has its own config
    config = {k: ExperimentSpec.model_config[k] for k in ("strict", "allow_inf_nan")}
    return TypeAdapter(annotation, config=ConfigDict(**config))


def _split_values(text: str) -> list[str]:
    """`a,b` -> ['a', 'b']; commas inside [...], {...} or quotes belong to one value (`[a, b],c`)."""
    values, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i])
            start = i + 1
    return [v.strip() for v in [*values, text[start:]]]


def _wanted(clause: str, path: str, adapter: Any, text: str) -> Any:
    """What a run's spec holds at `path` when it has the value `text` (in YAML): the value as the spec
    validates it, in spec.json's form (the keys it sets only); a mapping that leaves out required keys
    (`clip={eps_low: 0.1}`) as written, matched on those keys. ReportError when no spec can hold it."""
    import yaml
    from pydantic import ValidationError

    from rpg_cli.spec import SpecError
    from rpg_cli.spec.errors import _from_pydantic
    from rpg_cli.spec.loading import _loader

    try:
        value = yaml.load(text, Loader=_loader())
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ReportError(f"--where {clause!r}: {text!r} is not a YAML value ({problem})") from None
    try:
        return adapter.dump_python(adapter.validate_python(value), mode="json", exclude_unset=True)
    except SpecError as e:  # a check of the spec's own (a validator raising it): its words
        raise ReportError(f"--where {clause!r}: {text!r} is not a value of {path}: {e.reason}") from None
    except ValidationError as e:
        found = _problem(path, value, e.errors())
    if found is None:
        return value  # a partial mapping (`clip={eps_low: 0.1}`): the keys it gives must match
    err, where, models = found
    said = f"--where {clause!r}: {text!r} is not a value of"
    if err["type"] == "extra_forbidden":
        fields = ", ".join(f for m in models for f in m.model_fields)
        raise ReportError(f"{said} {where} (no field {err['loc'][-1]!r}); allowed: a mapping of {fields}")
    if _is_mismatch(err) and (where != path or not _fits(value, adapter.core_schema)) and _field_info(where):
        raise ReportError(f"{said} {where}; allowed: {_takes(where)}")  # a kind the field does not take
    head, _, allowed = _from_pydantic(err, None).reason.partition("allowed: ")  # a bound, a check of its own
    head = "" if head.startswith("got ") else f" ({head.rstrip('; ')})"
    raise ReportError(f"{said} {where}{head}" + (f"; allowed: {allowed}" if allowed else ""))


def _problem(path: str, value: Any, errors: list[Any]) -> tuple[dict[str, Any], str, list[Any]] | None:
    """The error to report of a value of `path` that failed validation, with the (sub-)field it is about
    and the models there; None when only required keys are missing (a partial mapping). For a mapping
    or a list, the errors inside it come first (a union's other members' errors say less)."""
    located = [(err, *_sub_path(path, err["loc"])) for err in errors]
    inside = [x for x in located if x[1] != path or x[0]["type"] == "extra_forbidden"]  # about its keys, items
    inner = inside if isinstance(value, (dict, list)) else []
    real = [x for x in inner or located if x[0]["type"] != "missing"]
    return real[0] if real else None


def _field_info(path: str) -> Any:
    from rpg_cli.spec import field_info  # the spec imports pydantic: only when a --where is parsed

    return field_info(path)


def _is_mismatch(err: dict[str, Any]) -> bool:
    """A value of a kind the field does not take (not a bound or a check of its own)."""
    return err["type"] == "literal_error" or err["type"].endswith(("_type", "_parsing", "_from_float"))


def _fits(value: Any, schema: Any) -> bool:
    """Whether `value` is of a kind the field takes, its mismatch inside it (a mapping's key)."""
    kinds = _kinds_of(value)
    return bool(kinds) and any(k in kinds for k in _schema_kinds(schema))


def _kinds_of(value: Any) -> set[str]:
    if isinstance(value, dict):
        return {"dict", "model"}
    if isinstance(value, list):
        return {"list"}
    return set()


def _schema_kinds(schema: Any) -> set[str]:
    """The container kinds a pydantic core schema takes (models and dicts, lists), through unions and
    validators' wrappers."""
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    if kind in ("model", "dataclass"):
        return {"model"}
    if kind in ("dict", "typed-dict"):
        return {"dict"}
    if kind in ("list", "tuple", "set"):
        return {"list"}
    found: set[str] = set()
    for key in ("schema", "choices", "steps"):
        inner = schema.get(key)
        for item in inner if isinstance(inner, list) else [inner]:
            found |= _schema_kinds(item[0] if isinstance(item, tuple) else item)
    return found


def _takes(path: str) -> str:
    """What the spec field `path` takes, from its type: its literals, then the kinds of its other values."""
    import typing

    from pydantic import BaseModel

    words: list[str] = []

    def walk(annotation: Any) -> None:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            walk(typing.get_args(annotation)[0])
        elif origin is typing.Literal:
            words.extend(str(v) for v in typing.get_args(annotation))
        elif origin in (list, tuple, set):
            words.append("a list ([A, B])")
        elif origin is dict:
            words.append("a mapping ({KEY: VALUE})")
        elif typing.get_args(annotation):  # a union
            for arg in typing.get_args(annotation):
                walk(arg)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            words.append(f"a mapping of {', '.join(annotation.model_fields)}")
        else:
            names = {int: "an integer", float: "a number", bool: "true or false", type(None): "null", str: "text"}
            words.append(names.get(annotation, getattr(annotation, "__name__", str(annotation))))

    info = _field_info(path)
    assert info is not None
    walk(info.annotation)
    return ", ".join(dict.fromkeys(words))


def _sub_path(path: str, loc: tuple) -> tuple[str, list[Any]]:
    """`path` and the part of a value an error is about (`reference.every`), pydantic's union tags left
    out; with the models a value there may be."""
    from rpg_cli.spec.errors import _model_in

    info = _field_info(path)
    models = _models_in(info.annotation if info is not None else None, _model_in)
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            continue
        owner = next((m for m in models if part in m.model_fields), None)
        if owner is not None:  # else the name of a union's member, or a key the model lacks
            path += f".{part}"
            models = _models_in(owner.model_fields[part].annotation, _model_in)
    return path, models


def _models_in(annotation: Any, _model_in: Any) -> list[Any]:
    """Every model a field's annotation holds (each member of a union)."""
    import typing

    found = []
    for arg in (annotation, *typing.get_args(annotation)):
        model = _model_in(arg)
        if model is not None and model not in found:
            found.append(model)
    return found


def _spec_value(spec: dict[str, Any], path: str) -> Any:
    """The value at `path` of a stored canonical spec; a field it leaves out (an empty block, omitted so
    that older run ids stand) has its default."""
    value: Any = spec
    for depth, part in enumerate(path.split(".")):
        if not isinstance(value, dict):
            return None
        if part not in value:
            info = _field_info(".".join(path.split(".")[: depth + 1]))
            if info is None or info.is_required():
                return None
            default = info.get_default(call_default_factory=True)
            value = default.model_dump(mode="json") if hasattr(default, "model_dump") else default
            continue
        value = value[part]
    return value


def _value_matches(actual: Any, wanted: Any) -> bool:
    """Whether a stored value holds the wanted one: equal (numbers by value, true never 1), a mapping
    holding each key wanted with a matching value, a list matching item by item."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(k in actual and _value_matches(actual[k], v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(_value_matches(a, w) for a, w in zip(actual, wanted))
        )
    if isinstance(wanted, bool) or isinstance(actual, bool):
        return actual is wanted
    if isinstance(wanted, (int, float)) and isinstance(actual, (int, float)):
        return float(actual) == float(wanted)
    return actual == wanted


def spec_matches(spec: dict[str, Any], where: Sequence[tuple[str, bool, list[Any]]]) -> bool:
    """Whether a stored spec passes every filter of `parse_where`."""
    for path, negated, values in where:
        hit = any(_value_matches(_spec_value(spec, path), v) for v in values)
        if hit == negated:
            return False
    return True


@dataclass(frozen=True)
class RunCost:
    """What a run costs and how far it has to go (`run_costs`); None where it is not known yet."""

    s_per_step: float | None  # the median timing_s/step of its last PACE_STEPS steps
    tokens_s_per_device: float | None  # its last perf/throughput (tokens per second per device)
    device_hours: float | None  # so far: its devices x the time it held them (rpg_cli/cost.py); None: never held
    eta_s: float | None  # a live run's seconds to its last step at that pace; None for a finished one


def eta_seconds(steps: Any, last_step: int | None, s_per_step: float | None) -> float | None:
    """Seconds until a run that logged `last_step` (None: none yet) reaches its spec's `steps` at `s_per_step`;
    None when either is unknown."""
    if s_per_step is None or not isinstance(steps, int) or isinstance(steps, bool):
        return None
    return max(steps - (last_step or 0), 0) * s_per_step


def run_costs(
    store: Store,
    runs: Sequence[RunRecord],
    now: datetime,
    steps: dict[str, int] | None = None,
    with_pace: bool = True,
) -> dict[str, RunCost]:
    """Each run's `RunCost`: its pace, throughput, device-hours and (live runs) ETA; `steps`: its last steps when
    the caller has read them (`Store.last_steps`). `with_pace` False: device-hours only (no step times are read)."""
    ids = [r.id for r in runs]
    if not ids:
        return {}
    steps = store.last_steps(ids) if steps is None else steps
    times = store.step_times(ids, last=PACE_STEPS) if with_pace else {}
    throughput = store.latest_values(ids, [THROUGHPUT]) if with_pace else {}
    out = {}
    for r in runs:
        pace = statistics.median(times[r.id]) if times.get(r.id) else None
        eta = eta_seconds(r.spec.get("steps"), steps.get(r.id), pace) if r.status in LIVE else None
        tokens = throughput.get(r.id, {}).get(THROUGHPUT, (None, None))[1]
        out[r.id] = RunCost(pace, tokens, cost.run_device_hours(r, now), eta)
    return out


def runs_summary(
    store: Store,
    sweep: str | None = None,
    status: Sequence[str] | None = None,
    where: Sequence[str] = (),
    now: datetime | None = None,
    detail_limit: int | None = None,
) -> list[dict[str, Any]]:
    """The columns a user scans first, one dict per run: sweep, name, id, seed, status, attempts, step
    (last step logged), reward (last critic/score/mean), val (the mean over benchmarks of each one's
    last val-core mean@k), queued_s (in Ray's queue: from submitted to started), run_s (from started to
    finished or now), wall_s (both), submitted (Ray took the job), started (rpg first saw it running; the
    watcher looks every few seconds), finished, error; s_per_step (the median timing_s/step of its last
    PACE_STEPS steps), tokens_s_per_device (its last perf/throughput), device_hours (so far: `device_hours`),
    eta_s (a live run's seconds to its last step at that pace); and for a running run that has stalled
    (rpg_cli/watch.py: no new metrics for the spec's watch.stall), stalled_s (since its metrics last advanced) and
    last_line (the last line of its output). A time rpg did not see is None. `detail_limit`: above this many runs,
    what only a row per run shows (reward, val, s_per_step, tokens_s_per_device, eta_s) is None, not read
    (a table of sweeps does not show it; None: always read)."""
    filters = parse_where(where)
    runs = [
        r for r in store.runs(sweep=sweep, status=list(status) if status else None) if spec_matches(r.spec, filters)
    ]
    ids = [r.id for r in runs]
    steps = store.last_steps(ids) if ids else {}
    detail = detail_limit is None or len(runs) <= detail_limit
    val = pick_val_keys(val_keys(store, ids), "mean", None) if ids and detail else {}
    latest = store.latest_values(ids, [REWARD, *val]) if ids and detail else {}
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    running = [r for r in runs if r.status == "running"]
    facts = store.stall_facts(r.id for r in running) if running else {}
    stalls = {r.id: stalled(r.spec, r.run_dir, steps.get(r.id), *facts[r.id], now) for r in running}
    costs = run_costs(store, runs, now, steps, with_pace=detail)
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
                "s_per_step": costs[r.id].s_per_step,
                "tokens_s_per_device": costs[r.id].tokens_s_per_device,
                "device_hours": costs[r.id].device_hours,
                "eta_s": costs[r.id].eta_s,
                "submitted": _when(r.started_at),
                "started": _when(r.running_at),
                "finished": _when(r.finished_at),
                "error": r.error,
                "stalled_s": None if (stall := stalls.get(r.id)) is None else stall.idle_s,
                "last_line": None if stall is None else last_line(r.run_dir),
            }
        )
    return out


def sweeps_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per sweep of `runs_summary`'s rows, in their order: how many runs, how many in each state
    (STATUSES), how many of the running ones stalled, the lowest and highest step reached, the device-hours of
    its runs so far (None: none has held its devices), the latest start: what `rpg runs` shows of a store with
    more runs than a terminal table can hold."""
    from rpg_cli.states import STATUSES

    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        sweep = out.setdefault(
            r["sweep"],
            {
                "sweep": r["sweep"],
                "runs": 0,
                **dict.fromkeys(STATUSES, 0),
                "stalled": 0,
                "steps": [],
                "device_hours": None,
                "started": None,
            },
        )
        sweep["runs"] += 1
        sweep[r["status"]] = sweep.get(r["status"], 0) + 1
        sweep["stalled"] += r["stalled_s"] is not None
        if r["step"] is not None:
            sweep["steps"].append(r["step"])
        if r.get("device_hours") is not None:
            sweep["device_hours"] = (sweep["device_hours"] or 0.0) + r["device_hours"]
        if r["started"] is not None and (sweep["started"] is None or r["started"] > sweep["started"]):
            sweep["started"] = r["started"]
    for sweep in out.values():
        steps = sweep.pop("steps")
        sweep["step_min"], sweep["step_max"] = (min(steps), max(steps)) if steps else (None, None)
    return list(out.values())


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
