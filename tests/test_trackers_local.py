"""Trackers on the local backend: a toy run tracked live to W&B (offline), TensorBoard and MLflow shows the
store's values at every step in all three, and no credential from the environment is written anywhere."""

from __future__ import annotations

import pytest
from conftest import spec_dict
from trackers_support import (
    MISSING,
    assert_no_secrets,
    by_key,
    go_offline,
    mlflow_runs,
    read_mlflow,
    read_tensorboard,
    read_wandb_offline,
)
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import plan_sweep
from rpg_cli.rundir import write_spec
from rpg_cli.spec import ExperimentSpec, SweepSpec
from rpg_cli.store import open_store
from rpg_cli.trackers.wandb import wandb_run_id


@pytest.fixture(scope="module")
def tracked_toy_run(tmp_path_factory):
    """A 3-step toy run of the local backend tracked live to all three, its metrics ingested into a store.
    Credentials sit in the environment the whole time."""
    if MISSING:
        pytest.skip("; ".join(MISSING))
    pytest.importorskip("transformers")
    from rpg_cli.backends.local.trainer import main as run_trainer

    root = tmp_path_factory.mktemp("toy")
    with pytest.MonkeyPatch.context() as mp:
        go_offline(mp)
        mp.setattr(
            "rpg_cli.datasets.toy.warm_up_format", lambda *args, **kwargs: 0.0
        )  # what it learns is no matter here
        assert CliRunner().invoke(app, ["prepare-data", "--toy", "--out", str(root / "data")]).exit_code == 0
        toy = root / "data" / "toy"
        sweep = SweepSpec.model_validate(
            {
                "name": "toy",
                "base": spec_dict(
                    model=str(toy / "model"),
                    data={"train_files": [str(toy / "train.parquet")], "val_files": [str(toy / "val.parquet")]},
                    rollout_n=4,
                    ppo_mini_batch_size=4,
                    lr=5e-4,
                    steps=3,
                    val={"n": 2, "every": 2},
                    rollout={"engine": "hf"},
                    save_every=3,
                    trackers={
                        "project": "rpg-toy",
                        "wandb": {"mode": "offline"},
                        "tensorboard": {},
                        "mlflow": {"tracking_uri": f"file:{root / 'mlruns'}"},
                    },
                ),
            }
        )
        (plan,) = plan_sweep(sweep, root / "runs")
        spec_path = write_spec(plan.run_dir, plan.spec)
        assert run_trainer(str(spec_path)) == 0
        store = open_store(f"sqlite:///{root / 'results.db'}")
        store.record_plans([plan])
        store.ingest_metrics(plan.id, plan.run_dir / "metrics.jsonl")
        metrics, _ = store.run_history(plan.id)
        store.close()
    return root, plan, ExperimentSpec.model_validate(plan.spec), metrics


def test_a_toy_run_shows_the_stores_values_at_every_step_in_all_three(tracked_toy_run, offline_env):
    root, plan, spec, metrics = tracked_toy_run
    store = by_key(metrics)
    assert sorted(metrics) == [0, 1, 2, 3] and "actor/pg_loss" in store and "val-core/toy_add/acc/mean@2" in store

    tb = read_tensorboard(root / "runs" / "tensorboard" / "toy" / plan.name)
    assert set(tb) == set(store)
    for key, values in store.items():  # TensorBoard keeps float32
        assert tb[key] == pytest.approx(values, rel=1e-6, abs=1e-6), key

    (offline,) = (plan.run_dir / "wandb").glob("offline-run-*")
    run, history, _ = read_wandb_offline(offline)
    assert (run.run_id, run.project, run.run_group, run.job_type) == (
        wandb_run_id(plan.id),
        "rpg-toy",
        spec.trackers.group,
        "toy",
    )
    assert history == metrics

    (found,) = mlflow_runs(f"file:{root / 'mlruns'}", "rpg-toy", plan.id)
    assert found.data.tags["rpg.group"] == spec.trackers.group and found.data.params["lr"] == "0.0005"
    logged = read_mlflow(f"file:{root / 'mlruns'}", found.info.run_id)
    assert logged.pop("val-core/toy_add/acc/mean_at_2") == sorted(store.pop("val-core/toy_add/acc/mean@2").items())
    assert {k.replace("@", "_at_"): sorted(v.items()) for k, v in store.items()} == logged

    assert_no_secrets(root / "runs", root / "mlruns", root / "results.db")
