"""The spec's `trackers` field: run ids and names unchanged by it, its shorthand and one-line errors, the
W&B group (the cell) and tags (the axes the sweep varies), planning without trackers, a missing extra as
a one-line error of the dry run, and credentials in MLflow's URI refused."""

from __future__ import annotations

import json

import pytest
from trackers_support import (
    EXPERIMENTS,
)
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import plan_sweep
from rpg_cli.rundir import write_spec
from rpg_cli.spec import ExperimentSpec, SpecError, SweepSpec, load_sweep
from rpg_cli.trackers.runs import axis_tags, cell_id, plan_trackers

TRACKED = {
    "trackers": {
        "project": "rpg-test",
        "wandb": {"mode": "offline"},
        "tensorboard": {},
        "mlflow": {"tracking_uri": "file:./mlruns"},
    }
}


@pytest.mark.parametrize("grid", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_trackers_leave_every_run_id_and_name_unchanged(grid, tmp_path, monkeypatch):
    monkeypatch.setattr("rpg_cli.trackers.runs.missing", lambda trackers: None)  # planning only; nothing reports
    sweep = load_sweep(grid)
    tracked = SweepSpec.model_validate({**sweep.model_dump(), "base": {**sweep.base, **TRACKED}})
    plain, with_trackers = plan_sweep(sweep, tmp_path), plan_sweep(tracked, tmp_path)
    assert [(p.id, p.name, p.run_dir) for p in with_trackers] == [(p.id, p.name, p.run_dir) for p in plain]
    for p in with_trackers:  # spec.json records them, and still hashes to the same id
        assert p.spec["trackers"]["project"] == "rpg-test"
        written = json.loads(write_spec(p.run_dir, p.spec).read_text())
        assert written["trackers"]["wandb"]["mode"] == "offline"
        assert ExperimentSpec.model_validate(written).run_id == p.id


def test_shorthand_and_one_line_errors_of_the_trackers_field(tmp_path):
    from rpg_cli.spec.errors import _validate

    base = load_sweep(EXPERIMENTS / "smoke.yaml").expand()[0].canonical()
    spec = _validate(ExperimentSpec, {**base, "trackers": ["wandb", "tensorboard"]})
    assert spec.trackers.wandb is not None and spec.trackers.tensorboard is not None and spec.trackers.mlflow is None
    assert _validate(ExperimentSpec, {**base, "trackers": {"mlflow": True}}).trackers.mlflow is not None
    for value, words in [
        (["wandb", "neptune"], "trackers: got 'neptune'; allowed: wandb, tensorboard, mlflow"),
        ({"wandb": {"mode": "sometimes"}}, "trackers.wandb.mode: got 'sometimes'; allowed: 'online' or 'offline'"),
        (
            {"mlflow": {"tracking_uri": "https://me:hunter2@mlflow.example.org"}},
            "trackers.mlflow.tracking_uri: credentials",
        ),
    ]:
        with pytest.raises(SpecError) as caught:
            _validate(ExperimentSpec, {**base, "trackers": value})
        assert words in str(caught.value) and "\n" not in str(caught.value)
        assert "hunter2" not in str(caught.value)


def test_group_is_the_cell_and_tags_are_the_axes_the_sweep_varies(tmp_path, monkeypatch):
    monkeypatch.setattr("rpg_cli.trackers.runs.missing", lambda trackers: None)
    sweep = SweepSpec.model_validate(
        {
            "name": "bands",
            "base": {**load_sweep(EXPERIMENTS / "smoke.yaml").base, "trackers": {"tensorboard": {}, "tags": ["mine"]}},
            "grid": {"algorithm": ["rpg", "rpg_reinforce"], "kl": ["fkl", "urkl"], "lr": [1e-4, 5e-4]},
            "seeds": [0, 1, 2],
        }
    )
    plans = plan_sweep(sweep, tmp_path / "runs")
    assert len(plans) == 24
    groups: dict[str, set[int]] = {}
    for p in plans:
        t = p.spec["trackers"]
        groups.setdefault(t["group"], set()).add(p.spec["seed"])
        assert t["group"].startswith(p.name.removesuffix(f"-s{p.spec['seed']}-{p.id}"))
        assert t["tags"] == [
            "sweep=bands",
            f"algorithm={p.spec['algorithm']}",
            f"kl={p.spec['kl']}",
            f"lr={p.spec['lr']!r}",
            "mine",
        ]
        assert t["tensorboard"]["dir"] == str(tmp_path / "runs" / "tensorboard")
    assert len(groups) == 8 and all(seeds == {0, 1, 2} for seeds in groups.values())  # one band per cell
    assert cell_id(plans[0].spec) == cell_id({**plans[0].spec, "seed": 7, "trackers": None})
    assert cell_id(plans[0].spec) != cell_id({**plans[0].spec, "lr": 1.0})
    # fields that collapse (kl of grpo) or never vary make no tag
    assert axis_tags([{"algorithm": "grpo", "kl": "none", "x": 1}, {"algorithm": "dapo", "kl": "none", "x": 1}]) == [
        ["algorithm=grpo"],
        ["algorithm=dapo"],
    ]


def test_a_missing_extra_is_a_one_line_error_of_the_dry_run(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    sweep_file = tmp_path / "tracked.yaml"
    text = (EXPERIMENTS / "smoke.yaml").read_text().replace("base:\n", "base:\n  trackers: [tensorboard, mlflow]\n", 1)
    sweep_file.write_text(text)
    result = CliRunner().invoke(
        app,
        ["sweep", str(sweep_file), "--dry-run", "--db", str(tmp_path / "r.db"), "--runs-dir", str(tmp_path / "runs")],
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == [
        "rpg sweep: trackers.mlflow: mlflow is not installed here; install it with pip install 'rpg-cli[mlflow]'"
    ]
    assert not (tmp_path / "runs").exists()


def test_an_mlflow_uri_with_credentials_in_the_environment_is_refused_not_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr("rpg_cli.trackers.runs.missing", lambda trackers: None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://me:hunter2@mlflow.example.org")
    sweep = load_sweep(EXPERIMENTS / "smoke.yaml")
    tracked = SweepSpec.model_validate({**sweep.model_dump(), "base": {**sweep.base, "trackers": ["mlflow"]}})
    with pytest.raises(SpecError) as caught:
        plan_sweep(tracked, tmp_path)
    assert "MLFLOW_TRACKING_URI" in str(caught.value) and "hunter2" not in str(caught.value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.example.org")  # credentials in their own env vars
    assert {p.spec["trackers"]["mlflow"]["tracking_uri"] for p in plan_sweep(tracked, tmp_path)} == {
        "https://mlflow.example.org"
    }


def test_plan_trackers_without_trackers_is_the_identity(tmp_path):
    specs = load_sweep(EXPERIMENTS / "smoke.yaml").expand()
    assert plan_trackers(specs, "smoke", tmp_path) is specs
