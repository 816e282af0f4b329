"""Trackers (W&B, TensorBoard, MLflow): the spec field, grouping, verl's logger mapping, the local
trainer's live reporting and `rpg export`, each read back with the tracker's own reader: TensorBoard's
EventAccumulator, W&B's offline run file decoded with wandb's own record schema, MlflowClient on a
`file:` store. No network: W&B runs offline."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest
from conftest import spec_dict
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import plan_sweep
from rpg_cli.rundir import write_spec
from rpg_cli.spec import ExperimentSpec, SpecError, SweepSpec, load_sweep
from rpg_cli.store import open_store
from rpg_cli.trackers import TRACKERS
from rpg_cli.trackers.runs import axis_tags, cell_id, plan_trackers, verl_env, verl_loggers
from rpg_cli.trackers.wandb import wandb_run_id

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
SECRETS = {
    "WANDB_API_KEY": "wandbsecret" + "0" * 29,
    "MLFLOW_TRACKING_TOKEN": "mlflowtokensecret",
    "MLFLOW_TRACKING_PASSWORD": "mlflowpasswordsecret",
}


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


needs_wandb = pytest.mark.skipif(not installed("wandb"), reason="wandb is not installed (pip install 'rpg-cli[wandb]')")
needs_tensorboard = pytest.mark.skipif(
    not installed("tensorboard"), reason="tensorboard is not installed (pip install 'rpg-cli[tensorboard]')"
)
needs_mlflow = pytest.mark.skipif(
    not installed("mlflow"), reason="mlflow is not installed (pip install 'rpg-cli[mlflow]')"
)
MISSING = [m.kwargs["reason"] for m in (needs_wandb, needs_tensorboard, needs_mlflow) if m.args[0]]


def _offline(mp: pytest.MonkeyPatch) -> None:
    """No network for W&B, file stores allowed for MLflow, and credentials in the environment that must
    never be written anywhere."""
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for key in ("MLFLOW_TRACKING_URI", "WANDB_ENTITY", "WANDB_DIR", "TENSORBOARD_DIR", "MLFLOW_RUN_CONTEXT"):
        mp.delenv(key, raising=False)
    for key, value in SECRETS.items():
        mp.setenv(key, value)


@pytest.fixture
def offline_env(monkeypatch):
    _offline(monkeypatch)


def assert_no_secrets(*roots: Path, text: str = "") -> None:
    for secret in SECRETS.values():
        assert secret not in text
        for root in roots:
            for path in Path(root).rglob("*"):
                if path.is_file():
                    assert secret.encode() not in path.read_bytes(), f"{secret} written to {path}"


# ---------------------------------------------------------------------------------------- readers


def read_tensorboard(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def wandb_records(run_file: Path) -> list:
    """The records of an offline run's `.wandb` file, decoded with wandb's own protobuf schema. The file
    is a 7-byte header then LevelDB's log format (32 KiB blocks of records: crc32, length, type); wandb
    0.31 ships no Python reader of it (its Go core reads it for `wandb sync`)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(run_file).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room  # block trailer
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:  # zero padding to the end of the block
            pos += block - pos % block if pos % block else 0
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def read_wandb_offline(run_dir: Path) -> tuple:
    """(run record, {step: {key: value}}, summary) of an offline-run-* directory."""
    (run_file,) = Path(run_dir).glob("run-*.wandb")
    run, history, summary = None, {}, {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history[row.pop("_step")] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return run, history, summary


def mlflow_runs(uri: str, experiment: str, run_id: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment}"
    return client.search_runs([found.experiment_id], filter_string=f"tags.`rpg.run_id` = '{run_id}'")


def read_mlflow(uri: str, mlflow_run_id: str) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(mlflow_run_id)
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(mlflow_run_id, key))
        for key in run.data.metrics
    }


def by_key(steps: dict[int, dict[str, float]]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for step, values in steps.items():
        for key, value in values.items():
            out.setdefault(key, {})[step] = value
    return out


# ---------------------------------------------------------------------------------------- the spec


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


# ---------------------------------------------------------------------------------------- verl


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
    assert verl_loggers(untracked) == [] and verl_env(untracked, run_dir) == {}


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


# ---------------------------------------------------------------------------------------- the local backend


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
        _offline(mp)
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


# ---------------------------------------------------------------------------------------- rpg export


def synthetic_store(root: Path) -> tuple[str, list]:
    """A store holding sweep `sw`: 2 cells x 2 seeds, metrics at steps 0-3 (one NaN), evals at steps 2 and 3."""
    base = load_sweep(EXPERIMENTS / "smoke.yaml").base
    sweep = SweepSpec.model_validate(
        {"name": "sw", "base": {**base, "kl": "urkl"}, "grid": {"algorithm": ["rpg", "rpg_reinforce"]}, "seeds": [0, 1]}
    )
    plans = plan_sweep(sweep, root / "runs")
    db = f"sqlite:///{root / 'results.db'}"
    store = open_store(db)
    store.record_plans(plans)
    for i, p in enumerate(plans):
        p.run_dir.mkdir(parents=True)
        lines = [
            {
                "step": s,
                "data": {
                    "actor/pg_loss": i + s / 8,
                    "val-core/toy_add/acc/mean@8": s / 4,
                    "critic/score/mean": float("nan") if s == 1 else s / 2,
                },
            }
            for s in range(4)
        ]
        (p.run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        store.ingest_metrics(p.id, p.run_dir / "metrics.jsonl")
        store.record_evals(
            [
                {
                    "run_id": p.id,
                    "step": s,
                    "benchmark": "aime25",
                    "metric": m,
                    "k": k,
                    "scorer": "dapo",
                    "value": v + i / 100,
                    "scorer_version": "1",
                    "n": 8,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "max_tokens": 64,
                    "seed": 0,
                }
                for s in (2, 3)
                for m, k, v in (("mean@k", 8, 0.25 * s), ("pass@k", 1, 0.1 * s))
            ]
        )
    store.close()
    return db, plans


def export_twice(args: list[str]) -> list[str]:
    outputs = []
    for _ in range(2):
        result = CliRunner().invoke(app, ["export", *args])
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    return outputs


def expected_steps(plan_index: int) -> dict[int, dict[str, float]]:
    i = plan_index
    return {
        s: {
            "actor/pg_loss": i + s / 8,
            "val-core/toy_add/acc/mean@8": s / 4,
            "critic/score/mean": float("nan") if s == 1 else s / 2,
            **(
                {"eval/aime25/dapo/mean@8": 0.25 * s + i / 100, "eval/aime25/dapo/pass@1": 0.1 * s + i / 100}
                if s >= 2
                else {}
            ),
        }
        for s in range(4)
    }


def same(got: dict, want: dict) -> bool:
    import math

    return got.keys() == want.keys() and all(
        (math.isnan(w) and math.isnan(g)) or g == pytest.approx(w, rel=1e-6)
        for g, w in zip([got[k] for k in want], want.values())
    )


@needs_tensorboard
def test_export_to_tensorboard_twice_rewrites_one_log_dir_per_run(tmp_path, offline_env):
    db, plans = synthetic_store(tmp_path)
    out = export_twice(["--to", "tensorboard", "--sweep", "sw", "--db", db, "--dir", str(tmp_path / "tb")])
    assert "exported 4 of 4 run(s) to tensorboard" in out[1]
    assert sorted(p.name for p in (tmp_path / "tb" / "sw").iterdir()) == sorted(p.name for p in plans)
    for i, p in enumerate(plans):
        (events,) = (tmp_path / "tb" / "sw" / p.name).iterdir()  # one event file: rewritten, not appended
        tb = read_tensorboard(events.parent)
        for step, values in expected_steps(i).items():
            assert same({k: tb[k][step] for k in values}, values), (p.name, step)
    assert_no_secrets(tmp_path, text="".join(out))


@needs_tensorboard
def test_export_carries_the_interval_of_an_evaluation_whose_samples_are_stored(tmp_path, offline_env):
    import numpy as np

    from rpg_cli import stats

    db, plans = synthetic_store(tmp_path)
    correct = [[1, 1, 0, 1, 1, 1, 0, 1], [0] * 8, [1] * 8, [1, 0] * 4]  # 4 problems x 8 samples
    protocol = {"n": 8, "temperature": 1.0, "top_p": 1.0, "max_tokens": 64, "seed": 0}
    store = open_store(db)
    store.record_samples(
        [
            {
                "run_id": plans[0].id,
                "step": 3,
                "benchmark": "aime25",
                "problem": f"p{i}",
                "sample_index": j,
                "scorer": "dapo",
                **protocol,
                "position": i,
                "extracted": "1",
                "correct": bool(c),
                "response_length": 5,
            }
            for i, row in enumerate(correct)
            for j, c in enumerate(row)
        ]
    )
    store.close()
    export_twice(["--to", "tensorboard", "--sweep", "sw", "--db", db, "--dir", str(tmp_path / "tb")])
    want = stats.score(stats.Runs({"b": np.array([[sum(row) / 8 for row in correct]])}), "b")
    tb = read_tensorboard(tmp_path / "tb" / "sw" / plans[0].name)
    got = (tb["eval/aime25/dapo/mean@8/ci_low"][3], tb["eval/aime25/dapo/mean@8/ci_high"][3])
    assert got == pytest.approx((want.low, want.high), abs=1e-6) and want.low < want.high
    assert 2 not in tb["eval/aime25/dapo/mean@8/ci_low"]  # step 2: no samples stored, no interval
    other = read_tensorboard(tmp_path / "tb" / "sw" / plans[1].name)
    assert not any(key.endswith("/ci_low") for key in other)  # pass@1 and runs without samples: none


@needs_wandb
def test_export_to_wandb_offline_twice_keeps_one_run_per_rpg_run(tmp_path, offline_env):
    db, plans = synthetic_store(tmp_path)
    out = export_twice(["--to", "wandb", "--offline", "--db", db, "--dir", str(tmp_path / "wb"), "--project", "exp"])
    dirs = sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    # offline-run-<time>-rpg-<run id>, with a suffix (-1) when the second export starts in the same second
    ids = [re.fullmatch(r"offline-run-[0-9_]+-rpg-([0-9a-f]+)(-\d+)?", d.name).group(1) for d in dirs]
    assert sorted(ids) == sorted(p.id for p in plans)  # one per run
    groups = {}
    for i, p in enumerate(plans):
        (run_dir,) = [d for d in dirs if f"-{wandb_run_id(p.id)}" in d.name]
        run, history, summary = read_wandb_offline(run_dir)
        assert (run.project, run.display_name, run.job_type) == ("exp", p.name, "sw")
        assert f"algorithm={p.spec['algorithm']}" in run.tags and "sweep=sw" in run.tags
        groups.setdefault(run.run_group, set()).add(p.spec["seed"])
        for step, values in expected_steps(i).items():
            assert same(history[step], values), (p.name, step)
        assert summary["eval/aime25/dapo/mean@8"] == pytest.approx(0.75 + i / 100)
    assert list(groups.values()) == [{0, 1}, {0, 1}]  # each cell's seeds in one W&B group
    assert_no_secrets(tmp_path, text="".join(out))


def test_evals_under_two_protocols_never_share_a_tracker_key():
    from rpg_cli.trackers.export import eval_metrics

    def row(step, value, temperature):
        return {
            "step": step,
            "benchmark": "aime25",
            "scorer": "dapo",
            "metric": "mean@k",
            "k": 8,
            "value": value,
            "n": 8,
            "temperature": temperature,
            "top_p": 1.0,
            "max_tokens": 64,
            "seed": 0,
        }

    rows = [row(2, 0.5, 1.0), row(3, 0.6, 1.0), row(3, 0.9, 0.6)]  # step 3 scored twice, at T 1.0 and 0.6
    assert eval_metrics(rows) == {
        2: {"eval/aime25/dapo/mean@8": 0.5},
        3: {"eval/aime25/dapo/mean@8": 0.6, "eval/aime25/dapo/mean@8/n8_T0.6_top_p1_max64_seed0": 0.9},
    }


def test_an_offline_reexport_in_the_same_second_replaces_the_earlier_one(tmp_path):
    from rpg_cli.trackers.wandb import drop_earlier_offline_runs

    wandb_dir = tmp_path / "wandb"
    names = [
        "offline-run-20261123_113450-rpg-aaaa1111",  # the earlier export
        "offline-run-20261123_113450-rpg-aaaa1111-1",  # this one: W&B's suffix, the same second
        "offline-run-20261123_113450-rpg-aaaa11112",  # another run whose id extends this one's
        "offline-run-20261123_113450-rpg-bbbb2222",
    ]
    for name in names:
        (wandb_dir / name).mkdir(parents=True)
    drop_earlier_offline_runs(wandb_dir / names[1], "rpg-aaaa1111")
    assert sorted(p.name for p in wandb_dir.iterdir()) == names[1:]


@needs_mlflow
def test_export_to_mlflow_twice_logs_each_step_once_and_adds_what_is_new(tmp_path, offline_env):
    db, plans = synthetic_store(tmp_path)
    uri = f"file:{tmp_path / 'mlruns'}"
    first = CliRunner().invoke(app, ["export", "--to", "mlflow", "--sweep", "sw", "--db", db, "--tracking-uri", uri])
    assert first.exit_code == 0, first.output
    # one progress line per run on stderr, as it goes: 4 steps, 5 metric names (3 logged, 2 evals)
    progress = first.stderr.splitlines()
    assert [line.split(": ")[0] for line in progress] == [f"exported {i}/4" for i in range(1, 5)], progress
    assert sorted(line.split(": ")[1].split(" (")[0] for line in progress) == sorted(f"sw/{p.name}" for p in plans)
    assert all("(4 steps, 5 metrics) -> file:" in line for line in progress), progress
    assert first.stdout.strip() == "exported 4 of 4 run(s) to mlflow"
    export_twice(["--to", "mlflow", "--sweep", "sw", "--db", db, "--tracking-uri", uri])
    for i, p in enumerate(plans):
        (found,) = mlflow_runs(uri, "rpg", p.id)  # one run per rpg run
        assert found.data.tags["rpg.sweep"] == "sw" and found.data.tags["algorithm"] == p.spec["algorithm"]
        logged = read_mlflow(uri, found.info.run_id)
        for step, values in expected_steps(i).items():
            got = {k.replace("_at_", "@"): dict(v)[step] for k, v in logged.items() if step in dict(v)}
            assert same(got, values), (p.name, step)
        assert all(len({s for s, _ in v}) == len(v) for v in logged.values())  # no step twice
    assert len({mlflow_runs(uri, "rpg", p.id)[0].data.tags["rpg.group"] for p in plans}) == 2

    with (plans[0].run_dir / "metrics.jsonl").open("a") as f:  # the run went on: one more step
        f.write(json.dumps({"step": 4, "data": {"actor/pg_loss": 9.0}}) + "\n")
    store = open_store(db)
    store.ingest_metrics(plans[0].id, plans[0].run_dir / "metrics.jsonl")
    store.close()
    export_twice(["--to", "mlflow", "--sweep", "sw", "--db", db, "--tracking-uri", uri])
    (found,) = mlflow_runs(uri, "rpg", plans[0].id)
    assert read_mlflow(uri, found.info.run_id)["actor/pg_loss"] == [(s, s / 8) for s in range(4)] + [(4, 9.0)]
    assert_no_secrets(tmp_path)


@needs_mlflow
def test_export_errors_are_one_line(tmp_path, offline_env, monkeypatch):
    db, _ = synthetic_store(tmp_path)
    for args, words, env_uri in [
        (["--to", "neptune"], "unknown tracker 'neptune'; allowed: wandb, tensorboard, mlflow", None),
        (["--to", "tensorboard", "--sweep", "nope"], "no runs of sweep 'nope' in the store", None),
        (
            ["--to", "mlflow", "--tracking-uri", "https://me:hunter2@mlflow.example.org"],
            "--tracking-uri: credentials",
            None,
        ),
        (["--to", "mlflow"], "MLFLOW_TRACKING_URI: credentials", "https://me:hunter2@mlflow.example.org"),
        (
            ["--to", "mlflow", "--tracking-uri", f"http://127.0.0.1:{closed_port()}"],
            "cannot reach the MLflow server at http://127.0.0.1:",
            None,
        ),
        (["--to", "tensorboard", "--timeout", "0"], "--timeout 0: give a positive number of seconds", None),
        (["--to", "tensorboard", "--timeout", "nan"], "--timeout nan: give a positive number of seconds", None),
    ]:
        if env_uri:
            monkeypatch.setenv("MLFLOW_TRACKING_URI", env_uri)
        else:
            monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        result = CliRunner().invoke(app, ["export", "--db", db, *args])
        assert result.exit_code == 2 and words in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and "hunter2" not in result.output
    missing = CliRunner().invoke(app, ["export", "--to", "wandb", "--db", str(tmp_path / "none.db")])
    assert missing.exit_code == 2 and "no results database" in missing.output


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then released): a connection is refused at once."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port():
    """A port of 127.0.0.1 that accepts connections (the kernel completes them) and never answers:
    a server that hangs. Closed by the test."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def health_only_port():
    """An HTTP server on 127.0.0.1 that answers /health and never answers anything else (until the
    test ends): a tracking server that passes the check, then hangs."""
    import http.server
    import threading

    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.endswith("/health"):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"OK")
            else:
                release.wait(120)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    release.set()
    server.shutdown()
    server.server_close()


def rpg_export(args: list[str], env: dict[str, str], limit: float = 60.0) -> tuple[int, str, str, float]:
    """`rpg export ARGS` as a process of its own (the real CLI, a fresh wandb/mlflow): rc, stdout,
    stderr, seconds; a run past `limit` fails the test (the libraries' own waits are minutes)."""
    import subprocess
    import sys
    import time

    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "rpg_cli", "export", *args], env=env, capture_output=True, text=True, timeout=limit
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def export_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    return {**env, "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_SILENT": "true", **extra}


STARTUP_S = 8.0  # slack for the process to start and open the store, on a loaded machine


@needs_mlflow
def test_export_to_an_mlflow_server_that_never_answers_stops_within_the_timeout(tmp_path, silent_port):
    db, _ = synthetic_store(tmp_path)
    uri = f"http://127.0.0.1:{silent_port}"
    rc, out, err, seconds = rpg_export(
        ["--to", "mlflow", "--db", db, "--tracking-uri", uri, "--timeout", "2"], export_env(tmp_path)
    )
    assert rc == 2 and out == "", (rc, out, err)
    assert err.splitlines() == [
        f"rpg export: trackers.mlflow: cannot reach the MLflow server at {uri} (no answer within 2 s); check "
        "--tracking-uri (or MLFLOW_TRACKING_URI) and that the server is up, or give it longer with --timeout SECONDS"
    ]
    assert 2 <= seconds < 2 + STARTUP_S, seconds  # it waited the timeout, and no more


@needs_mlflow
def test_export_to_a_closed_port_stops_at_once_not_after_the_timeout(tmp_path):
    db, _ = synthetic_store(tmp_path)
    uri = f"http://127.0.0.1:{closed_port()}/"
    rc, out, err, seconds = rpg_export(
        ["--to", "mlflow", "--db", db, "--tracking-uri", uri, "--timeout", "30"], export_env(tmp_path)
    )
    assert rc == 2 and out == "", (rc, out, err)
    (line,) = err.splitlines()
    assert line.startswith(f"rpg export: trackers.mlflow: cannot reach the MLflow server at {uri} (connection refused)")
    assert seconds < STARTUP_S, seconds  # at once: no retries, no waiting for the 30 s


@needs_mlflow
def test_an_mlflow_server_that_hangs_after_the_check_is_bounded_by_the_timeout_too(tmp_path, health_only_port):
    """The check passes; MLflow's own requests then wait --timeout each and are not retried (its defaults:
    120 s, 7 retries with backoff)."""
    db, _ = synthetic_store(tmp_path)
    uri = f"http://127.0.0.1:{health_only_port}"
    rc, out, err, seconds = rpg_export(
        ["--to", "mlflow", "--db", db, "--tracking-uri", uri, "--timeout", "2"], export_env(tmp_path)
    )
    assert rc == 2 and out == "", (rc, out, err)
    (line,) = err.splitlines()
    assert line.startswith(f"rpg export: trackers.mlflow: cannot open the MLflow run at {uri} ("), line
    assert 2 <= seconds < 2 + STARTUP_S, seconds


@needs_wandb
def test_export_to_a_wandb_server_that_never_answers_stops_before_writing_anything(tmp_path, silent_port):
    db, _ = synthetic_store(tmp_path)
    base = f"http://rpg:hunter2@127.0.0.1:{silent_port}"  # a password in the URL is never printed
    env = export_env(tmp_path, WANDB_BASE_URL=base, WANDB_API_KEY=SECRETS["WANDB_API_KEY"])
    rc, out, err, seconds = rpg_export(
        ["--to", "wandb", "--db", db, "--dir", str(tmp_path / "wb"), "--timeout", "2"], env
    )
    assert rc == 2 and out == "", (rc, out, err)
    (line,) = err.splitlines()
    assert line.startswith(
        f"rpg export: trackers.wandb: cannot reach the W&B server at http://rpg:***@127.0.0.1:{silent_port} "
        "(no answer within 2 s); check WANDB_BASE_URL"
    ), line
    assert "hunter2" not in err and SECRETS["WANDB_API_KEY"] not in err
    assert 2 <= seconds < 2 + STARTUP_S, seconds
    assert not (tmp_path / "wb").exists()  # nothing half-exported


@needs_tensorboard
def test_a_run_that_fails_midway_stops_the_export_with_one_line_saying_what_went(tmp_path, offline_env, monkeypatch):
    db, plans = synthetic_store(tmp_path)
    tracker, calls = TRACKERS["tensorboard"], []
    export_run = tracker.export_run

    def second_fails(info, *args):
        calls.append(info.name)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")  # what a library raises, not a TrackerError
        return export_run(info, *args)

    monkeypatch.setattr(tracker, "export_run", second_fails)
    args = ["export", "--to", "tensorboard", "--sweep", "sw", "--db", db, "--dir", str(tmp_path / "tb")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.stdout == "", result.output
    first, last = result.stderr.splitlines()
    assert first.startswith(f"exported 1/4: sw/{calls[0]} (4 steps, 5 metrics) -> ")
    assert last == (
        f"rpg export: trackers.tensorboard: exporting sw/{calls[1]} failed (OSError: [Errno 28] No space left on "
        "device); 1 of 4 run(s) were exported before it: run the command again, it adds only what is missing"
    )


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
from rpg_cli.trackers.runs import plan_trackers, verl_loggers

base = json.loads(sys.argv[1])
def spec(trackers):
    return _validate(ExperimentSpec, {**base, "trackers": trackers})
def planned(trackers):
    return plan_trackers([spec(trackers)], "sw", Path("/runs"))[0].trackers.notebook

both = spec({"wandb": {"mode": "offline"}, "notebook": {"path": "nb"}})
out = {
    "settings": type(both.trackers.notebook).__name__,
    "loggers": verl_loggers(both),
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


def test_plan_trackers_without_trackers_is_the_identity(tmp_path):
    specs = load_sweep(EXPERIMENTS / "smoke.yaml").expand()
    assert plan_trackers(specs, "smoke", tmp_path) is specs


@needs_tensorboard
def test_export_first_brings_live_runs_up_to_date_and_says_which_it_could_not(tmp_path, offline_env):
    db, plans = synthetic_store(tmp_path)
    store = open_store(db)
    store.begin_attempt(plans[0].id)
    store.set_status(plans[0].id, "running", submission_id=plans[0].id)  # left by `rpg sweep --detach`
    store.close()
    args = ["export", "--to", "tensorboard", "--sweep", "sw", "--db", db, "--dir", str(tmp_path / "tb")]
    result = CliRunner().invoke(app, [*args, "--runs-dir", str(tmp_path / "runs")])  # no head there
    assert result.exit_code == 0, result.output
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("rpg export:")]
    assert warning.startswith("rpg export: 1 live run(s) taken as last recorded, possibly stale: no Ray cluster")
    assert "exported 4 of 4 run(s) to tensorboard" in result.stdout
    assert not (tmp_path / "runs" / "ray").exists()  # asking starts no head
