"""The trackers' registry (`TRACKERS`, trackers/__init__.py): the spec's `trackers` block is built from it,
and a new tracker is its module and its one line there, with no edit of the spec (in a process of its own)."""

from __future__ import annotations

import json

from conftest import spec_dict
from trackers_support import (
    REPO,
)

from rpg_cli.trackers import TRACKERS


def test_the_registry_and_the_specs_trackers_block_name_the_same_trackers():
    from rpg_cli.spec import TRACKER_NAMES, Trackers

    assert tuple(TRACKERS) == TRACKER_NAMES
    assert list(Trackers.model_fields) == ["project", "group", "tags", *TRACKERS]  # the block is built from it
    for name, tracker in TRACKERS.items():
        assert tracker.name == name and tracker.library  # the extra rpg-cli[<name>] installs it
        assert Trackers.model_fields[name].annotation == tracker.settings | None  # its module's own model
        assert tracker.settings.__module__ == f"rpg_cli.trackers.{name}"


# A tracker written the way the registry asks, registered before the spec is imported: a process of its own
NEW_TRACKER = """
import json, sys
from pathlib import Path
from rpg_cli.trackers import TRACKERS
from rpg_cli.trackers.base import Tracker, TrackerSettings

class NotebookSettings(TrackerSettings):
    path: str | None = None

class Notebook(Tracker):
    name = "notebook"
    settings = NotebookSettings
    library = "json"

    def resolve(self, settings, runs_root, environ):
        return settings.model_copy(update={"path": settings.path or str(runs_root / "notebook")})

TRACKERS["notebook"] = Notebook()  # its one line

from rpg_cli.spec import ExperimentSpec, SpecError
from rpg_cli.spec.errors import _validate
from rpg_cli.backends.verl.launch import tracker_loggers
from rpg_cli.trackers.runs import plan_trackers

base = json.loads(sys.argv[1])
def spec(trackers):
    return _validate(ExperimentSpec, {**base, "trackers": trackers})
def planned(trackers):
    return plan_trackers([spec(trackers)], "sw", Path("/runs"))[0].trackers.notebook

both = spec({"wandb": {"mode": "offline"}, "notebook": {"path": "nb"}})
out = {
    "settings": type(both.trackers.notebook).__name__,
    "loggers": tracker_loggers(both),
    "same_id": both.run_id == _validate(ExperimentSpec, base).run_id,
    "paths": [planned({"notebook": {"path": "nb"}}).path, planned(["notebook"]).path, planned({"notebook": True}).path],
    "errors": [],
}
for value in (["neptune"], {"notebook": {"pth": "x"}}, {"notebook": {"path": 3}}):
    try:
        spec(value)
    except SpecError as e:
        out["errors"].append(str(e))
print(json.dumps(out))
"""


def test_a_new_tracker_is_its_module_and_its_line_in_the_registry():
    """The spec's `trackers` block takes a registered tracker's settings with no edit of the spec: its
    field, the shorthand, its defaults at plan time, verl's logger entry and one-line errors."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", NEW_TRACKER, json.dumps(spec_dict())],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["settings"] == "NotebookSettings" and out["loggers"] == ["wandb", "notebook"] and out["same_id"]
    assert out["paths"] == ["nb", "/runs/notebook", "/runs/notebook"]  # its own, then its default (resolve)
    assert out["errors"] == [
        "trackers: got 'neptune'; allowed: wandb, tensorboard, mlflow, notebook",
        "trackers.notebook.pth: unknown field; allowed: path",
        "trackers.notebook.path: got 3 (int); allowed: a valid string",
    ]
