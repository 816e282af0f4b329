"""No metric lost or stale: the store's copy of metrics.jsonl equals what the file says, whatever the
order of writing, ingesting, resuming (the local trainer's restart lines) and starting the file over
(verl's file logger, which opens it with "wb"). Every interleaving is tried, deterministically."""

from __future__ import annotations

import itertools
import json
import logging
import os
from pathlib import Path

import sqlalchemy as sa

from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.rundir import restart_line
from rpg_cli.store import open_store
from rpg_cli.store.ingest import metrics_view


def line(step: int, **data: float) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"


def db_metrics(store, run_id: str) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT step, key, value FROM metrics WHERE run_id = :r"), {"r": run_id})
        for step, key, value in rows:
            out.setdefault(step, {})[key] = value
    return dict(sorted(out.items()))


def db_val(store, run_id: str) -> dict[int, float]:
    """The validation copies (`evals`, scorer verl-val) of one key, by step."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT step, value FROM evals WHERE run_id = :r AND scorer = 'verl-val' AND metric = 'mean@k'"),
            {"r": run_id},
        )
        return dict(sorted(rows.all()))


def record(store, run_id: str, root: Path) -> None:
    store.record_plan(RunPlan(run_id, run_id, "sw", "local", {"seed": 0}, root / run_id, ["true"]))


VAL = "val-core/toy_add/acc/mean@4"

# The local trainer: each event appends bytes (a line may come in two writes); attempt 2 resumes from the
# checkpoint of step 1 after attempt 1 logged step 3 and half of step 4.
LOCAL_EVENTS = [
    line(0, **{VAL: 0.1}),
    line(1, a=1.0, b=10.0),
    line(2, a=2.0, b=20.0, **{VAL: 0.2}),
    line(3, a=3.0)[:9],
    line(3, a=3.0)[9:],
    '{"step": 4, "data": {"a": 4',  # the crash cuts this line; the next attempt ends it (MetricsLog)
    "\n" + restart_line(1),
    line(2, a=-2.0, c=7.0, **{VAL: 0.5}),  # redone: other values, another key
    line(3, a=-3.0),
]


def oracle_local(text: str) -> dict[int, dict[str, float]]:
    """What the complete lines say, folded independently of the store's code: the last value of a
    (step, key) wins; a restart keeps only the steps up to its checkpoint."""
    view: dict[int, dict[str, float]] = {}
    for raw in text.split("\n")[:-1]:  # complete lines only
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if "restart" in obj:
            keep = obj["restart"]["keep_through"]
            view = {s: d for s, d in view.items() if keep is not None and s <= keep}
        else:
            view.setdefault(obj["step"], {}).update(obj["data"])
    return dict(sorted(view.items()))


def _val_of(view: dict[int, dict[str, float]]) -> dict[int, float]:
    return {s: d[VAL] for s, d in view.items() if VAL in d}


def test_local_writer_every_interleaving_of_writes_and_ingestion(tmp_path, caplog):
    """After every ingestion, at any point between any two writes, the store equals the file."""
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    gaps = len(LOCAL_EVENTS) + 1
    try:
        for n, when in enumerate(itertools.product((False, True), repeat=gaps - 1)):
            run_id, path = f"run{n:04d}", tmp_path / f"m{n:04d}.jsonl"
            record(store, run_id, tmp_path)
            path.write_text("")
            for event, ingest in zip(LOCAL_EVENTS, when):
                with open(path, "a") as f:
                    f.write(event)
                if ingest:
                    store.ingest_metrics(run_id, path)
                    text = path.read_text()
                    assert db_metrics(store, run_id) == oracle_local(text), (when, text)
            store.ingest_metrics(run_id, path)
            want = oracle_local(path.read_text())
            assert db_metrics(store, run_id) == want == metrics_view(path.read_text())
            assert db_val(store, run_id) == _val_of(want)
            assert store.last_steps([run_id]) == {run_id: 3}
    finally:
        store.close()
    # the torn line of step 4 (line 5) became corrupt: warned about once per run, with its line number
    warned = [r.getMessage() for r in caplog.records if "line 5" in r.getMessage()]
    assert len(warned) == 2 ** (gaps - 1) and all("not JSON" in w for w in warned)


def verl_attempts() -> tuple[list[str], list[str]]:
    """verl: attempt 1 logs steps 0-3 and dies; attempt 2 resumes from global_step_2: its file logger
    starts the file over, validation first (at step 2), then steps 3 and 4."""
    first = [line(0, **{VAL: 0.1}), line(1, a=1.0), line(2, a=2.0, **{VAL: 0.2}), line(3, a=3.0, b=3.5)]
    second = [line(2, **{VAL: 0.25}), line(3, a=-3.0), line(4, a=-4.0, **{VAL: 0.4})]
    return first, second


def truth_verl() -> dict[int, dict[str, float]]:
    """The run's metrics: attempt 1 up to its checkpoint, what attempt 2 logged over it."""
    return {0: {VAL: 0.1}, 1: {"a": 1.0}, 2: {"a": 2.0, VAL: 0.25}, 3: {"a": -3.0}, 4: {"a": -4.0, VAL: 0.4}}


def run_verl_interleavings(store, tmp_path: Path, every: int = 1) -> int:
    first, second = verl_attempts()
    tried = 0
    for n, when in enumerate(itertools.product((False, True), repeat=len(first) + len(second))):
        if n % every:
            continue
        tried += 1
        run_id, path = f"verl{n:04d}", tmp_path / f"v{n:04d}.jsonl"
        record(store, run_id, tmp_path)
        with open(path, "wb", buffering=0) as f:
            for event, ingest in zip(first, when):
                f.write(event.encode())
                if ingest:
                    store.ingest_metrics(run_id, path)
        store.ingest_metrics(run_id, path)  # rpg reads the end of a job before submitting the next attempt
        with open(path, "wb", buffering=0) as f:  # verl's FileLogger: the same file, started over
            for event, ingest in zip(second, when[len(first) :]):
                f.write(event.encode())
                if ingest:
                    store.ingest_metrics(run_id, path)
        store.ingest_metrics(run_id, path)
        assert db_metrics(store, run_id) == truth_verl(), when
        assert db_val(store, run_id) == {0: 0.1, 2: 0.25, 4: 0.4}
        assert store.last_steps([run_id]) == {run_id: 4}
    return tried


def test_verl_file_started_over_every_interleaving(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        assert run_verl_interleavings(store, tmp_path) == 2**7
    finally:
        store.close()


def test_verl_file_started_over_on_postgresql(postgres_db, tmp_path):
    store = open_store(postgres_db)
    try:
        assert run_verl_interleavings(store, tmp_path, every=9) == 15
    finally:
        store.close()


def test_a_file_rewritten_in_place_to_the_same_size_is_noticed(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    path = tmp_path / "metrics.jsonl"
    try:
        record(store, "r", tmp_path)
        path.write_text(line(1, a=1.0) + line(2, a=2.0))
        store.ingest_metrics("r", path)
        inode = os.stat(path).st_ino
        with open(path, "r+") as f:  # another writer: same file, same length, other values
            f.write(line(1, a=7.0) + line(2, a=8.0))
        assert os.stat(path).st_ino == inode and store.ingest_metrics("r", path) == 2
        assert db_metrics(store, "r") == {1: {"a": 7.0}, 2: {"a": 8.0}}  # a live run's attempt starting it over
        store.begin_attempt("r")  # the next attempt: its file moved over the old one (another inode)
        replaced = tmp_path / "other.jsonl"
        replaced.write_text(line(1, a=5.0) + line(2, a=6.0))
        os.replace(replaced, path)
        assert store.ingest_metrics("r", path) == 2 and db_metrics(store, "r") == {1: {"a": 5.0}, 2: {"a": 6.0}}
        with open(path, "r+") as f:  # changed again within that attempt: not believed, the store keeps its rows
            f.write(line(1, a=9.0))
        assert store.ingest_metrics("r", path) == 0 and db_metrics(store, "r") == {1: {"a": 5.0}, 2: {"a": 6.0}}
        assert "rewritten" in store.changed_files(["r"])["r"]
    finally:
        store.close()


def test_a_corrupt_line_is_warned_about_with_its_file_and_line_number_once(tmp_path, caplog):
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    path = tmp_path / "metrics.jsonl"
    try:
        record(store, "r", tmp_path)
        path.write_text(line(1, a=1.0) + line(2, a=2.0) + "garbage{\n" + line(3, a=3.0))
        with caplog.at_level(logging.WARNING, logger="rpg_cli.store"):
            assert store.ingest_metrics("r", path) == 3
            with open(path, "a") as f:
                f.write(line(4, a=4.0) + '["a list"]\n')
            assert store.ingest_metrics("r", path) == 1
            assert store.ingest_metrics("r", path) == 0
        warnings = [r.getMessage() for r in caplog.records]
        assert warnings == [f"{path} line 3: not JSON; skipped", f"{path} line 6: not a JSON object; skipped"]
    finally:
        store.close()


def test_metrics_log_appends_a_restart_line_and_ends_a_torn_line(tmp_path):
    from rpg_cli.rundir import MetricsLog

    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, keep_through=None)  # a new run: nothing to void, no restart line
    log.write(1, {"a": 1.0})
    log.write(2, {"a": 2.0})
    assert path.read_text() == '{"data": {"a": 1.0}, "step": 1}\n{"data": {"a": 2.0}, "step": 2}\n'
    with open(path, "a") as f:
        f.write('{"data": {"a": 3')  # killed mid-line
    MetricsLog(path, keep_through=1).write(2, {"a": -2.0})
    assert metrics_view(path.read_text()) == {1: {"a": 1.0}, 2: {"a": -2.0}}
    MetricsLog(path, keep_through=None).write(0, {"v": 0.5})  # retried without a checkpoint: all void
    assert metrics_view(path.read_text()) == {0: {"v": 0.5}}
    assert path.read_text().startswith('{"data": {"a": 1.0}, "step": 1}\n')  # never rewritten
