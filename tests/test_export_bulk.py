"""`rpg export` in bulk (issue 34): TensorBoard's event file written whole (one event per step, checksummed by
google-crc32c), MLflow's metrics sent 1,000 per log_batch across steps, only the sampled steps an interval needs
read from the store. Each checked against what the per-value path wrote before, on a generated store, read
back with the tracker's own reader (TensorBoard's EventAccumulator, MlflowClient on a `file:` store)."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import pytest
from helpers import eval_row
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import plan_sweep
from rpg_cli.spec import SweepSpec, load_sweep
from rpg_cli.store import open_store

REPO = Path(__file__).resolve().parents[1]


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


needs_tensorboard = pytest.mark.skipif(not installed("tensorboard"), reason="tensorboard is not installed")
needs_torch_tensorboard = pytest.mark.skipif(
    not (installed("tensorboard") and installed("torch")), reason="tensorboard or torch is not installed"
)
needs_mlflow = pytest.mark.skipif(not installed("mlflow"), reason="mlflow is not installed")

PROTOCOL = {"n": 4, "temperature": 1.0, "top_p": 1.0, "max_tokens": 64, "seed": 0}


@pytest.fixture
def offline_env(monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for key in ("MLFLOW_TRACKING_URI", "TENSORBOARD_DIR", "MLFLOW_RUN_CONTEXT"):
        monkeypatch.delenv(key, raising=False)


def generated_store(
    root: Path, steps: int = 40, metrics: int = 30, wide: int = 300, samples: bool = True
) -> tuple[str, list]:
    """Sweep `gen`, 2 runs: `steps` steps of `metrics` metrics (one NaN, long and odd names, step 5 with `wide`
    more), evals at steps 10 and 20 (mean@4 and pass@1), samples of 3 problems at steps 10 and 30 (step 30
    has no eval row: it needs no interval) unless not `samples`."""
    base = load_sweep(REPO / "experiments" / "smoke.yaml").base
    sweep = SweepSpec.model_validate(
        {"name": "gen", "base": {**base, "kl": "urkl"}, "grid": {"algorithm": ["rpg"]}, "seeds": [0, 1]}
    )
    plans = plan_sweep(sweep, root / "runs")
    db = f"sqlite:///{root / 'results.db'}"
    store = open_store(db)
    store.record_plans(plans)
    rng = random.Random(0)
    for i, p in enumerate(plans):
        p.run_dir.mkdir(parents=True)
        lines = []
        for s in range(steps):
            data = {f"actor/metric_{m:02d}/{'x' * (m % 7)}@k": rng.uniform(-1e3, 1e3) for m in range(metrics)}
            data["critic/score/mean"] = float("nan") if s == 3 else s / 3
            if s == 5:  # one step with many more values: a record many CRC blocks long
                data.update({f"timing/wide_{m:03d}": m * 1e-3 for m in range(wide)})
            lines.append(json.dumps({"step": s, "data": data}) + "\n")
        (p.run_dir / "metrics.jsonl").write_text("".join(lines))
        store.ingest_metrics(p.id, p.run_dir / "metrics.jsonl")
        store.record_evals(
            [
                eval_row(
                    run_id=p.id, step=s, benchmark="aime25", metric=metric, k=k, value=0.1 * s + i / 100, **PROTOCOL
                )
                for s in (10, 20)
                for metric, k in (("mean@k", 4), ("pass@k", 1))
            ]
        )
        store.record_samples(
            [
                {
                    "run_id": p.id,
                    "step": s,
                    "benchmark": "aime25",
                    "problem": f"p{j}",
                    "sample_index": k,
                    "scorer": "dapo",
                    **PROTOCOL,
                    "position": j,
                    "extracted": "1",
                    "correct": bool((i + j + k + s) % 3),
                    "response_length": 5,
                }
                for s in ((10, 30) if samples else ())
                for j in range(3)
                for k in range(4)
            ]
        )
    store.close()
    return db, plans


def read_tensorboard(log_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """{tag: [(step, value, wall time)]} as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def values_only(read: dict[str, list[tuple[int, float, float]]]) -> dict[str, list[tuple[int, str]]]:
    """Steps and float32 values, exactly (NaN included: compared by its repr)."""
    return {tag: [(step, repr(value)) for step, value, _ in events] for tag, events in read.items()}


# ---------------------------------------------------------------------------------------- the checksum


@needs_tensorboard
def test_the_records_checksum_is_tensorboards_masked_crc32c():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboards

    from rpg_cli.trackers.tensorboard import masked_crc32c, tf_records

    rng = random.Random(1)
    chunks = [b"", b"a", bytes(64), b"\xff" * 64] + [rng.randbytes(rng.randint(1, 3000)) for _ in range(50)]
    assert [masked_crc32c(c) for c in chunks] == [tensorboards(c) for c in chunks]
    framed = tf_records([b"xyz"])
    assert framed[:8] == (3).to_bytes(8, "little") and framed[12:15] == b"xyz"
    assert int.from_bytes(framed[8:12], "little") == tensorboards(framed[:8])
    assert int.from_bytes(framed[15:], "little") == tensorboards(b"xyz")


# ---------------------------------------------------------------------------------------- TensorBoard


def export_before(db: str, out: Path) -> None:
    """What `rpg export --to tensorboard` wrote before issue 34: every sampled step's problem scores, and
    torch's SummaryWriter, one add_scalar per value (still the live runs' writer)."""
    from rpg_cli.trackers.base import write
    from rpg_cli.trackers.export import eval_summary, history, with_intervals
    from rpg_cli.trackers.tensorboard import TensorBoardWriter

    store = open_store(db)
    try:
        for run in store.runs(sweep="gen"):
            metrics, evals = store.run_history(run.id)
            evals = with_intervals(evals, store.problem_scores([run.id]))
            write(TensorBoardWriter(out / run.sweep / run.name), history(metrics, evals), eval_summary(evals))
    finally:
        store.close()


@needs_torch_tensorboard
def test_export_writes_the_same_scalars_as_the_per_value_writer(tmp_path, offline_env, monkeypatch):
    from rpg_cli.trackers.tensorboard import EventFile

    db, plans = generated_store(tmp_path, steps=32)
    monkeypatch.setattr(EventFile, "FLUSH_BYTES", 4096)  # many flushes, records split across them
    export_before(db, tmp_path / "before")
    start = time.time()
    result = CliRunner().invoke(app, ["export", "--to", "tensorboard", "--db", db, "--dir", str(tmp_path / "after")])
    end = time.time()
    assert result.exit_code == 0, result.output
    assert "exported 2 of 2 run(s) to tensorboard" in result.output
    for p in plans:
        before = read_tensorboard(tmp_path / "before" / "gen" / p.name)
        (event_file,) = (tmp_path / "after" / "gen" / p.name).iterdir()  # one file, TensorBoard's name
        assert event_file.name.startswith("events.out.tfevents.")
        after = read_tensorboard(event_file.parent)
        assert values_only(after) == values_only(before)
        assert len(after) == 30 + 1 + 300 + 4  # metrics, critic, wide, mean@4, pass@1 and its interval bounds
        assert [step for step, _, _ in after["eval/aime25/dapo/mean@4_ci_low"]] == [10]  # step 20: no samples
        assert math.isnan(dict((s, v) for s, v, _ in after["critic/score/mean"])[3])
        walls = [wall for events in after.values() for _, _, wall in events]
        assert start <= min(walls) and max(walls) <= end  # wall time: when exported, as before


@needs_tensorboard
def test_every_record_of_the_event_file_is_framed_and_checksummed(tmp_path, monkeypatch):
    """TensorBoard's own record reader (which checks both CRCs of each record) reads every event back."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    from rpg_cli.trackers.base import write
    from rpg_cli.trackers.tensorboard import EventFile

    monkeypatch.setattr(EventFile, "FLUSH_BYTES", 1000)
    steps = {s: {f"m{k}": float(s * k) for k in range(s % 40)} for s in range(200)}  # 0 to 39 values a step
    write(EventFile(tmp_path), steps, {})
    (path,) = tmp_path.iterdir()
    events = [event_pb2.Event.FromString(raw) for raw in RawEventFileLoader(str(path)).Load()]
    assert events[0].file_version == "brain.Event:2"
    assert [e.step for e in events[1:]] == [s for s in steps if steps[s]]  # one event per step with values
    assert all({v.tag: v.simple_value for v in e.summary.value} == steps[e.step] for e in events[1:])
    data = path.read_bytes()
    data = data[:-1] + bytes([data[-1] ^ 1])  # one bit of the last CRC flipped: the reader refuses it
    path.write_bytes(data)
    assert len(list(RawEventFileLoader(str(path)).Load())) == len(events) - 1


# ---------------------------------------------------------------------------------------- the store


def test_export_reads_samples_only_at_the_steps_an_interval_needs(tmp_path, offline_env, monkeypatch):
    from rpg_cli.store import Store
    from rpg_cli.trackers.export import interval_scores, with_intervals

    db, plans = generated_store(tmp_path, steps=3, metrics=2)
    asked: list[dict] = []
    original = Store.problem_scores

    def spy(self, run_ids, *args, **kwargs):
        asked.append({"runs": list(run_ids), **kwargs})
        return original(self, run_ids, *args, **kwargs)

    monkeypatch.setattr(Store, "problem_scores", spy)
    store = open_store(db)
    try:
        for p in plans:
            _, evals = store.run_history(p.id)
            every_step = with_intervals(evals, original(store, [p.id]))
            assert with_intervals(evals, interval_scores(store, p.id, evals)) == every_step
            assert asked[-1] == {"runs": [p.id], "steps": {p.id: {10, 20}}}  # not 30: no eval row there
        assert interval_scores(store, plans[0].id, [e for e in evals if e["metric"] == "pass@k"]) == []
        assert len(asked) == len(plans)  # no mean@n row: no query
    finally:
        store.close()


# ---------------------------------------------------------------------------------------- MLflow


@needs_mlflow
def test_mlflow_export_fills_each_log_batch_and_logs_what_the_per_step_writer_logs(tmp_path, offline_env):
    from mlflow.tracking import MlflowClient

    from rpg_cli.trackers import mlflow as mlflow_module
    from rpg_cli.trackers.mlflow import MLFLOW_METRICS_PER_BATCH

    # with samples: `mean_at_4` and its interval `mean_at_4_ci_low` side by side in MLflow's file store
    db, plans = generated_store(tmp_path, steps=12, metrics=90, wide=0)
    sent: list[int] = []
    log_batch = MlflowClient.log_batch

    def counting(self, run_id, metrics=(), *args, **kwargs):
        if metrics:
            sent.append(len(metrics))
        return log_batch(self, run_id, metrics, *args, **kwargs)

    class PerStep(mlflow_module.MlflowWriter):  # the writer before issue 34 (a live run's): a log_batch a step
        def __init__(self, info, batched=False):
            super().__init__(info, batched=False)

    def export(uri: str, mp: pytest.MonkeyPatch) -> None:
        mp.setattr(MlflowClient, "log_batch", counting)
        result = CliRunner().invoke(app, ["export", "--to", "mlflow", "--db", db, "--tracking-uri", uri])
        assert result.exit_code == 0, result.output

    before, after = f"file:{tmp_path / 'before'}", f"file:{tmp_path / 'after'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mlflow_module, "MlflowWriter", PerStep)
        export(before, mp)
    per_step, sent = sent, []
    with pytest.MonkeyPatch.context() as mp:
        export(after, mp)

    def logged(uri: str, run_id: str) -> dict[str, list[tuple[int, str]]]:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("rpg")
        (found,) = client.search_runs([experiment.experiment_id], filter_string=f"tags.`rpg.run_id` = '{run_id}'")
        return {
            key: sorted((m.step, repr(m.value)) for m in client.get_metric_history(found.info.run_id, key))
            for key in found.data.metrics
        }

    full = []
    for p in plans:
        exported = logged(after, p.id)
        assert exported == logged(before, p.id)
        values = sum(len(v) for v in exported.values())
        assert values == 12 * 91 + 4 + 2  # metrics, evals at 10 and 20, the interval at 10 (samples there)
        full += [MLFLOW_METRICS_PER_BATCH] * (values // MLFLOW_METRICS_PER_BATCH) + [values % MLFLOW_METRICS_PER_BATCH]
    assert sent == full and len(per_step) == 2 * 13  # 2 calls a run, not one a step (12 and the eval at 20)


# ---------------------------------------------------------------------------------------- W&B


@pytest.mark.skipif(not installed("wandb"), reason="wandb is not installed")
def test_a_wandb_export_records_the_runs_values_not_the_exporting_machine(tmp_path, monkeypatch):
    from trackers_support import read_wandb_offline

    from rpg_cli.trackers.export import history

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for key in ("WANDB_ENTITY", "WANDB_DIR", "WANDB_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    db, plans = generated_store(tmp_path, steps=5, metrics=3, wide=0, samples=False)
    args = ["export", "--to", "wandb", "--offline", "--sweep", "gen", "--db", db, "--dir", str(tmp_path / "wb")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    store = open_store(db)
    try:
        for p in plans:
            (run_dir,) = (tmp_path / "wb" / "wandb").glob(f"offline-run-*-rpg-{p.id}")
            _, logged, _ = read_wandb_offline(run_dir)
            want = history(*store.run_history(p.id))
            assert logged.keys() == want.keys()
            for step, values in want.items():  # W&B's JSON keeps 2.0 as 2, NaN as NaN
                assert {k: repr(float(v)) for k, v in logged[step].items()} == {k: repr(v) for k, v in values.items()}
            # the packages, machine and git of where `rpg export` ran are not the run's: none recorded
            assert not {"requirements.txt", "wandb-metadata.json"} & {f.name for f in (run_dir / "files").iterdir()}
    finally:
        store.close()
