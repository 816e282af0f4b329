"""Trackers on verl: the logger entries and environment rpg gives verl's own Tracking, and verl 0.9.1's
Tracking writing each tracker where rpg reads it (read back with the tracker's own reader)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from trackers_support import (
    EXPERIMENTS,
    MISSING,
    SECRETS,
    assert_no_secrets,
    mlflow_runs,
    read_mlflow,
    read_tensorboard,
    read_wandb_offline,
)

from rpg_cli.backends.verl.launch import tracker_env, tracker_loggers
from rpg_cli.orchestration.plan import plan_sweep
from rpg_cli.spec import ExperimentSpec, SweepSpec, load_sweep
from rpg_cli.trackers.wandb import wandb_run_id


def verl_run(tmp_path: Path, monkeypatch) -> tuple[ExperimentSpec, Path]:
    monkeypatch.setattr("rpg_cli.trackers.runs.missing", lambda trackers: None)
    sweep = load_sweep(EXPERIMENTS / "paper-qwen3-4b.yaml")
    tracked = SweepSpec.model_validate(
        {
            **sweep.model_dump(),
            "base": {
                **sweep.base,
                "trackers": {
                    "project": "rpg-verl",
                    "wandb": {"mode": "offline"},
                    "tensorboard": {},
                    "mlflow": {"tracking_uri": f"file:{tmp_path / 'mlruns'}"},
                },
            },
        }
    )
    plan = plan_sweep(tracked, tmp_path / "runs")[0]
    return ExperimentSpec.model_validate(plan.spec), plan.run_dir


def test_verl_gets_its_own_logger_entries_and_the_env_its_tracking_reads(tmp_path, monkeypatch):
    from rpg_cli.backends.verl import launch

    spec, run_dir = verl_run(tmp_path, monkeypatch)
    args = dict(a.split("=", 1) for a in launch.overrides(spec, run_dir))
    assert args["trainer.logger"] == "[console,file,wandb,tensorboard,mlflow]"
    assert args["trainer.project_name"] == "rpg-verl" and args["trainer.experiment_name"] == spec.run_name
    env = launch.env(spec, run_dir)
    assert env["WANDB_RUN_ID"] == wandb_run_id(spec.run_id) and env["WANDB_RESUME"] == "allow"
    assert env["WANDB_RUN_GROUP"] == spec.trackers.group and env["WANDB_JOB_TYPE"] == "paper-qwen3-4b"
    assert env["WANDB_TAGS"].split(",") == spec.trackers.tags and env["WANDB_MODE"] == "offline"
    assert env["TENSORBOARD_DIR"] == str(tmp_path / "runs" / "tensorboard" / "paper-qwen3-4b" / spec.run_name)
    assert env["MLFLOW_TRACKING_URI"] == (tmp_path / "mlruns").as_uri()
    assert json.loads(env["MLFLOW_RUN_CONTEXT"])["rpg.run_id"] == spec.run_id
    # the job's runtime_env is their one home (Ray hands it to every verl process; a repeat fails ray.init)
    assert not any(a.startswith("+ray_kwargs.ray_init.runtime_env") for a in args)
    assert not any(s in json.dumps(env) for s in SECRETS.values())
    untracked = ExperimentSpec.model_validate({**spec.canonical(), "trackers": None})
    assert tracker_loggers(untracked) == [] and tracker_env(untracked, run_dir) == {}


@pytest.mark.skipif(bool(MISSING), reason="; ".join(MISSING))
def test_verls_own_tracking_reports_where_the_spec_says(tmp_path, monkeypatch, offline_env):
    """verl 0.9.1's Tracking class, given the composed config and our env, writes each tracker where rpg
    reads: the W&B run with our id/group/tags, TensorBoard under TENSORBOARD_DIR, MLflow with our tags."""
    pytest.importorskip("verl", reason="the verl extra is not installed")
    from omegaconf import OmegaConf
    from test_verl_backend import compose_verl
    from verl.utils.tracking import Tracking

    from rpg_cli.backends.verl import launch

    spec, run_dir = verl_run(tmp_path, monkeypatch)
    cfg = compose_verl(spec, run_dir)
    for key, value in launch.env(spec, run_dir).items():  # the job's runtime_env, which verl's processes get
        monkeypatch.setenv(key, value)
    run_dir.mkdir(parents=True)
    tracking = Tracking(
        cfg.trainer.project_name,
        cfg.trainer.experiment_name,
        list(cfg.trainer.logger),
        config=OmegaConf.to_container(cfg, resolve=True),
    )
    steps = {1: {"actor/pg_loss": 0.5, "val-core/aime2025/acc/mean@32": 0.25}, 2: {"actor/pg_loss": -0.125}}
    for step, data in steps.items():
        tracking.log(data, step)
    tracking.finish()

    assert [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [
        {"step": s, "data": d} for s, d in steps.items()
    ]
    tb = read_tensorboard(Path(os.environ["TENSORBOARD_DIR"]))
    assert tb["actor/pg_loss"] == {1: 0.5, 2: -0.125} and tb["val-core/aime2025/acc/mean@32"] == {1: 0.25}
    (offline,) = (run_dir / "wandb").glob(f"offline-run-*-{wandb_run_id(spec.run_id)}")
    run, history, _ = read_wandb_offline(offline)
    assert (run.run_id, run.project, run.display_name) == (wandb_run_id(spec.run_id), "rpg-verl", spec.run_name)
    assert (run.run_group, run.job_type, list(run.tags)) == (spec.trackers.group, "paper-qwen3-4b", spec.trackers.tags)
    assert history == steps
    uri = os.environ["MLFLOW_TRACKING_URI"]
    (found,) = mlflow_runs(uri, "rpg-verl", spec.run_id)
    assert found.data.tags["rpg.group"] == spec.trackers.group and found.info.run_name == spec.run_name
    assert read_mlflow(uri, found.info.run_id) == {
        "actor/pg_loss": [(1, 0.5), (2, -0.125)],
        "val-core/aime2025/acc/mean_at_32": [(1, 0.25)],
    }
    assert_no_secrets(run_dir, tmp_path / "runs" / "tensorboard", tmp_path / "mlruns")
