"""Test helper for the trackers' tests (tests/test_trackers_*.py): which tracker libraries are installed,
an offline environment holding credentials that must never be written anywhere, and each tracker's own
reader of what it wrote: TensorBoard's EventAccumulator, W&B's offline run file decoded with wandb's own
record schema, MlflowClient."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

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


def go_offline(mp: pytest.MonkeyPatch) -> None:
    """No network for W&B, file stores allowed for MLflow, and credentials in the environment that must
    never be written anywhere."""
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for key in ("MLFLOW_TRACKING_URI", "WANDB_ENTITY", "WANDB_DIR", "TENSORBOARD_DIR", "MLFLOW_RUN_CONTEXT"):
        mp.delenv(key, raising=False)
    for key, value in SECRETS.items():
        mp.setenv(key, value)
    if "wandb" in sys.modules:  # W&B's process-wide settings (an earlier run's directory) forgotten, as in a job
        sys.modules["wandb"].teardown()


def assert_no_secrets(*roots: Path, text: str = "") -> None:
    """No credential of SECRETS in `text` nor in any file under `roots`."""
    for secret in SECRETS.values():
        assert secret not in text
        for root in roots:
            for path in Path(root).rglob("*"):
                if path.is_file():
                    assert secret.encode() not in path.read_bytes(), f"{secret} written to {path}"


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
    """{step: {key: value}} turned into {key: {step: value}}."""
    out: dict[str, dict[int, float]] = {}
    for step, values in steps.items():
        for key, value in values.items():
            out.setdefault(key, {})[step] = value
    return out
