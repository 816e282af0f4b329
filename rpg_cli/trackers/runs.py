"""What the trackers do with runs, whatever the tracker (each one's own part: its module, registered in
rpg_cli.trackers.TRACKERS): which trackers a run has and whether their libraries are here (the
preflight), the credentials a local Ray head lacks, the group and tags (identity and grouping), the
settings with every default resolved. Pure Python; a trainer's own logger entries and env vars are its backend's
(backends/verl/launch.py `tracker_env`, through each tracker's `library_env`).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rpg_cli.spec import NOT_IN_RUN_ID, ExperimentSpec, SpecError, Trackers, cell_id, flatten, run_identity
from rpg_cli.trackers import TRACKERS
from rpg_cli.trackers.base import RunInfo, SettingError, TrackerError

TAG_CHARS = 64  # W&B refuses longer tags


def enabled(trackers: Trackers | None) -> list[str]:
    return [name for name in TRACKERS if trackers is not None and getattr(trackers, name) is not None]


def not_installed(name: str, settings: Any = None) -> str | None:
    """Why tracker `name` cannot run in this environment (one line naming the extra), or None."""
    for module in TRACKERS[name].libraries(settings):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed here; install it with pip install 'rpg-cli[{name}]'"
    return None


def missing(trackers: Trackers | None) -> tuple[str, str] | None:
    """(tracker, why) for the first enabled tracker whose library is not installed here, or None."""
    for name in enabled(trackers):
        if (why := not_installed(name, getattr(trackers, name))) is not None:
            return name, why
    return None


def require(trackers: Trackers | None) -> None:
    if (found := missing(trackers)) is not None:
        raise TrackerError(f"trackers.{found[0]}: {found[1]}")


# The Hugging Face Hub's credential variables (a model downloaded by any run); a job finds them, and each
# tracker's (Tracker.credential_vars), only in its Ray head's environment.
HUB_CREDENTIAL_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def spec_trackers(spec: Mapping[str, Any]) -> list[str]:
    """The trackers a run's (canonical) spec enables."""
    block = spec.get("trackers")
    return [name for name in TRACKERS if isinstance(block, Mapping) and block.get(name) is not None]


def credentials_missing_on_head(
    specs: list[Mapping[str, Any]], head_names: set[str] | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """One line when a credential the runs (their canonical specs) may need is set in this shell but
    absent from the environment the local Ray head started with (`head_names`; None: unknown, nothing
    said), with the fix; None when nothing is missing. The value is never passed to the job instead: a
    job's runtime_env is readable by whoever reaches the cluster's jobs API."""
    if head_names is None:
        return None
    environ = os.environ if environ is None else environ
    wanted = dict.fromkeys(HUB_CREDENTIAL_VARS)
    for spec in specs:
        for name in spec_trackers(spec):
            wanted.update(dict.fromkeys(TRACKERS[name].credential_vars))
    lacking = [var for var in wanted if environ.get(var) and var not in head_names]
    if not lacking:
        return None
    verb = "is" if len(lacking) == 1 else "are"
    return (
        f"{', '.join(lacking)} {verb} set in this shell but not in the local Ray head's environment (it started "
        "before), so the runs would not see it, and rpg never puts credentials into a job: run `rpg stop`, "
        "then run this command again (a new head starts with this shell's environment)"
    )


# ---------------------------------------------------------------------------------------------
# Identity and grouping


def default_group(spec: Mapping[str, Any], name: str, run_id: str) -> str:
    """`<run name less seed and id>-<cell id>`, e.g. rpg-urkl-clip0.2_0.28-adamw-4k-1f2e3d4c."""
    label = name.removesuffix(f"-{run_id}").removesuffix(f"-s{spec.get('seed')}")
    return f"{label}-{cell_id(spec)}"


def axis_tags(specs: list[Mapping[str, Any]]) -> list[list[str]]:
    """Per spec, `field=value` for every field whose value differs across `specs` (seed and trackers aside)."""
    flat = [flatten({k: v for k, v in run_identity(dict(s)).items() if k != "seed"}) for s in specs]
    paths = sorted({p for f in flat for p in f})
    varying = [p for p in paths if len({json.dumps(f.get(p, "<absent>"), sort_keys=True) for f in flat}) > 1]
    return [[_tag(p, f[p]) for p in varying if p in f] for f in flat]


def _tag(path: str, value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return f"{path}={text}".replace(",", ";")[:TAG_CHARS]  # commas separate tags in WANDB_TAGS


# ---------------------------------------------------------------------------------------------
# Settings: every default resolved, so spec.json records where the metrics went


def resolve(
    trackers: Trackers,
    spec: Mapping[str, Any],
    name: str,
    run_id: str,
    sweep: str,
    runs_root: Path,
    axes: list[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Trackers:
    """`trackers` with group, tags and each enabled tracker's defaults filled in (`Tracker.resolve`:
    from its env vars, under the runs root), relative paths made absolute (a job runs in its own
    directory). Idempotent."""
    environ = os.environ if environ is None else environ
    update: dict[str, Any] = {
        "group": trackers.group or default_group(spec, name, run_id),
        "tags": list(dict.fromkeys([f"sweep={sweep}"[:TAG_CHARS], *axes, *trackers.tags])),
    }
    for tracker in enabled(trackers):
        try:
            update[tracker] = TRACKERS[tracker].resolve(getattr(trackers, tracker), Path(runs_root), environ)
        except SettingError as e:
            raise SpecError(e.reason, f"trackers.{tracker}.{e.field}") from None
    return trackers.model_copy(update=update)


def run_info(
    spec: Mapping[str, Any],
    run_id: str,
    name: str,
    sweep: str,
    run_dir: Path,
    trackers: Trackers | None = None,
    axes: list[str] = (),
    environ: Mapping[str, str] | None = None,
) -> RunInfo:
    """The RunInfo of a run directory `<runs root>/<sweep>/<name>/` (trackers: default, the spec's own)."""
    if trackers is None:
        trackers = Trackers.model_validate(spec.get("trackers") or {})
    try:
        resolved = resolve(trackers, spec, name, run_id, sweep, Path(run_dir).absolute().parent.parent, axes, environ)
    except SpecError as e:  # past plan time: a tracker problem, not a spec one
        raise TrackerError(e.message) from None
    config = {k: v for k, v in spec.items() if k not in NOT_IN_RUN_ID}
    config["rpg"] = {"run_id": run_id, "sweep": sweep, "group": resolved.group}
    return RunInfo(run_id, name, sweep, config, resolved, Path(run_dir))


# ---------------------------------------------------------------------------------------------
# Plan time (rpg sweep)


def plan_trackers(specs: list[ExperimentSpec], sweep: str, runs_root: Path) -> list[ExperimentSpec]:
    """The sweep's specs with their trackers resolved for the record (group, tags = the axes, defaults).

    Checks at plan time what can be checked here: the libraries of a run whose backend writes its trackers with
    rpg's writers (`registry.writes_trackers`: it runs on this machine's environment). A run whose trainer reports
    does so from the cluster, whose packages cannot be seen from here.
    """
    from rpg_cli.backends import registry  # an arrow up by design, as the spec's (ARCHITECTURE.md)

    if not any(s.trackers is not None for s in specs):
        return specs
    axes = axis_tags([s.canonical() for s in specs])
    out = []
    for spec, tags in zip(specs, axes):
        if spec.trackers is None:
            out.append(spec)
            continue
        if registry.writes_trackers(spec.backend) and (found := missing(spec.trackers)) is not None:
            raise SpecError(found[1], f"trackers.{found[0]}")
        resolved = resolve(spec.trackers, spec.canonical(), spec.run_name, spec.run_id, sweep, runs_root, tags)
        out.append(spec.model_copy(update={"trackers": resolved}))
    return out
