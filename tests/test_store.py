"""The results store on real SQLite files: runs and states, metrics ingestion (idempotent, incremental,
truncated lines, rewrites, concurrent writers), evals/samples upserts, run_states, `rpg runs`."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import eval_row
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import StoreError, migrations, open_store, parse_metric_lines, run_states


def plan(i: int, root: Path, sweep: str = "sw") -> RunPlan:
    return RunPlan(
        id=f"id{i:04d}",
        name=f"run-{i}",
        sweep=sweep,
        backend="local",
        spec={"seed": i, "algorithm": "rpg"},
        run_dir=root / sweep / f"run-{i}",
        entrypoint=["python", "-c", "pass"],
    )


def line(step: int, **data) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'runs' / 'results.db'}")
    yield s
    s.close()


def count(store, run_id: str | None = None) -> int:
    with sqlite3.connect(store.engine.url.database) as con:
        if run_id is None:
            return con.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
        return con.execute("SELECT COUNT(*) FROM metrics WHERE run_id = ?", (run_id,)).fetchone()[0]


# ------------------------------------------------------------------------------ database basics


def test_open_store_creates_parent_dir_and_uses_wal(tmp_path):
    db = tmp_path / "deep" / "er" / "results.db"
    store = open_store(str(db))  # a bare path means a SQLite file
    store.close()
    assert db.is_file()
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"sweeps", "runs", "metrics", "evals", "samples"} <= tables


def test_open_store_without_create_refuses_a_missing_file(tmp_path):
    with pytest.raises(StoreError, match="no results database"):
        open_store(f"sqlite:///{tmp_path / 'results.db'}", create=False)
    with pytest.raises(StoreError, match="no directory"):  # a path under a missing directory: a mistyped --db
        open_store(f"sqlite:///{tmp_path / 'runs' / 'results.db'}", create=False)
    assert not (tmp_path / "runs").exists()


def test_record_plans_keeps_state_of_known_runs(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    run = store.run(p.id)
    assert (run.status, run.attempts, run.sweep, run.spec) == ("pending", 0, "sw", p.spec)
    assert run.run_dir == p.run_dir.resolve()
    store.set_status(p.id, "running", submission_id=p.id)
    store.record_plans([p, plan(2, tmp_path)])
    assert store.run(p.id).status == "running"
    assert [r.id for r in store.runs(sweep="sw")] == [p.id, plan(2, tmp_path).id]
    assert [r.id for r in store.runs(status="pending")] == [plan(2, tmp_path).id]
    assert store.sweeps() == ["sw"]


def test_set_status_stamps_times_and_rejects_unknown_states(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    store.set_status(p.id, "submitted")
    assert store.run(p.id).started_at is None
    store.set_status(p.id, "running")
    started = store.run(p.id).started_at
    assert started is not None
    store.set_status(p.id, "failed", error="x" * 5000 + "the end")
    run = store.run(p.id)
    assert run.started_at == started and run.finished_at >= started
    assert len(run.error) == 2000 and run.error.endswith("the end")  # the tail is what matters
    with pytest.raises(ValueError, match="unknown run status"):
        store.set_status(p.id, "exploded")
    with pytest.raises(StoreError):
        store.set_status("nope", "running")


def test_begin_attempt_gives_fresh_submission_ids_and_keeps_metrics(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    assert store.begin_attempt(p.id) == (1, p.id)
    p.run_dir.mkdir(parents=True)
    (p.run_dir / "metrics.jsonl").write_text(line(1, a=1.0) + line(2, a=2.0))
    store.ingest_metrics(p.id, p.run_dir / "metrics.jsonl")
    store.set_status(p.id, "failed", error="boom")
    assert store.begin_attempt(p.id) == (2, f"{p.id}-2")
    run = store.run(p.id)
    assert (run.status, run.error, run.finished_at, run.attempts) == ("pending", None, None, 2)
    # the metrics stay: the new attempt's file says what it redoes (a restart line, or verl starting it over)
    assert count(store, p.id) == 2 and store.latest(p.id) == (2, {"a": 2.0})
    assert store.ingest_metrics(p.id, p.run_dir / "metrics.jsonl") == 0


def test_resolve_by_id_prefix_name_and_sweep(store, tmp_path):
    store.record_plans([plan(1, tmp_path), plan(2, tmp_path), plan(3, tmp_path, sweep="other")])
    assert [r.name for r in store.resolve("id0001")] == ["run-1"]
    assert [r.name for r in store.resolve("run-2")] == ["run-2"]
    assert [r.name for r in store.resolve("sw")] == ["run-1", "run-2"]
    assert [r.name for r in store.resolve("id0003")] == ["run-3"]
    assert store.resolve("id00") == []  # ambiguous prefix
    assert store.resolve("nothing") == []


# ----------------------------------------------------------------------------------- ingestion


def test_parse_metric_lines_skips_garbage_and_waits_for_a_partial_tail():
    chunk = (line(1, a=1) + "not json\n\n" + json.dumps([1, 2]) + "\n" + line(2, a=2) + '{"step": 3, "da').encode()
    parsed = parse_metric_lines(chunk)
    assert [step for step, _ in parsed.records] == [1, 2]
    assert chunk[parsed.consumed :] == b'{"step": 3, "da'
    assert parsed.lines == 5 and [index for index, _ in parsed.bad] == [1, 3]  # the blank line is no fault
    complete_tail = line(4, a=4).rstrip("\n").encode()  # a complete record that only lacks its newline
    parsed = parse_metric_lines(complete_tail)
    assert [step for step, _ in parsed.records] == [4] and parsed.consumed == len(complete_tail)


def test_ingest_is_idempotent_and_skips_non_numeric_values(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        line(1, **{"actor/pg_loss": -0.5, "critic/score/mean": 0.25, "note": "text", "hist": [1, 2], "none": None})
        + line(2, **{"actor/pg_loss": -0.25, "critic/score/mean": 0.5, "flag": True, "count": 7})
    )
    assert store.ingest_metrics(p.id, path) == 6
    assert store.ingest_metrics(p.id, path) == 0
    assert store.ingest_metrics(p.id, path) == 0
    assert count(store) == 6
    assert store.latest(p.id) == (2, {"actor/pg_loss": -0.25, "critic/score/mean": 0.5, "flag": 1.0, "count": 7.0})
    assert store.last_steps([p.id]) == {p.id: 2}


def test_nan_is_stored_as_null_and_inf_kept(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    path = tmp_path / "metrics.jsonl"
    path.write_text(line(1, a=float("nan"), b=float("inf"), c=1.5))
    assert store.ingest_metrics(p.id, path) == 3
    step, values = store.latest(p.id)
    assert step == 1 and values["a"] is None and math.isinf(values["b"]) and values["c"] == 1.5


def test_truncated_last_line_is_skipped_then_read_once_complete(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    path = tmp_path / "metrics.jsonl"
    full = line(3, a=3.0, b=30.0)
    path.write_text(line(1, a=1.0, b=10.0) + line(2, a=2.0, b=20.0) + full[:17])
    assert store.ingest_metrics(p.id, path) == 4
    assert store.latest(p.id)[0] == 2
    with open(path, "a") as f:
        f.write(full[17:])
    assert store.ingest_metrics(p.id, path) == 2
    assert store.latest(p.id) == (3, {"a": 3.0, "b": 30.0})
    assert count(store) == 6


def test_ingest_is_incremental(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        f.write("".join(line(s, a=s, b=-s) for s in range(1, 51)))
    assert store.ingest_metrics(p.id, path) == 100
    with open(path, "a") as f:
        f.write("".join(line(s, a=s, b=-s) for s in range(51, 54)))
    assert store.ingest_metrics(p.id, path) == 6  # only the three new lines were read
    with sqlite3.connect(store.engine.url.database) as con:
        offset = con.execute("SELECT offset FROM metric_files WHERE run_id = ?", (p.id,)).fetchone()[0]
    assert offset == path.stat().st_size
    assert count(store) == 106 and store.latest(p.id) == (53, {"a": 53.0, "b": -53.0})


def test_missing_file_ingests_nothing(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    assert store.ingest_metrics(p.id, tmp_path / "absent.jsonl") == 0


def test_a_step_logged_twice_keeps_its_last_value(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    path = tmp_path / "metrics.jsonl"
    path.write_text(line(1, a=1.0) + line(2, a=2.0) + line(2, a=2.5) + line(3, a=3.0))  # a resumed trainer
    assert store.ingest_metrics(p.id, path) == 4
    assert store.latest_values([p.id], ["a"]) == {p.id: {"a": (3, 3.0)}}
    with sqlite3.connect(store.engine.url.database) as con:
        assert con.execute("SELECT value FROM metrics WHERE step = 2").fetchall() == [(2.5,)]


def test_a_rewritten_shorter_file_is_read_again_from_the_start(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(line(s, a=float(s)) for s in range(1, 11)))
    assert store.ingest_metrics(p.id, path) == 10
    path.write_text(line(1, a=100.0) + line(2, a=200.0))  # a new attempt started the file over
    assert store.ingest_metrics(p.id, path) == 2
    assert count(store, p.id) == 2 and store.latest(p.id) == (2, {"a": 200.0})


def test_latest_values_per_key_and_run(store, tmp_path):
    plans = [plan(i, tmp_path) for i in range(3)]
    store.record_plans(plans)
    for i, p in enumerate(plans):
        path = tmp_path / f"m{i}.jsonl"
        # validation keys are logged every 5 steps only: their latest step differs from the run's
        path.write_text(
            "".join(line(s, loss=s * (i + 1), **({"val": s / 10} if s % 5 == 0 else {})) for s in range(1, 13 + i))
        )
        store.ingest_metrics(p.id, path)
    got = store.latest_values([p.id for p in plans], ["loss", "val", "absent"])
    assert got == {
        plans[0].id: {"loss": (12, 12.0), "val": (10, 1.0)},
        plans[1].id: {"loss": (13, 26.0), "val": (10, 1.0)},
        plans[2].id: {"loss": (14, 42.0), "val": (10, 1.0)},
    }
    assert store.latest_values([], ["loss"]) == {}


WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from rpg_cli.store import open_store

    db, run_id, own, shared, go = sys.argv[1:6]
    while not Path(go).exists():
        time.sleep(0.01)
    store = open_store(db)  # all four create the schema at once
    for chunk in range(10):
        with open(own, "a") as f:
            for step in range(chunk * 20 + 1, chunk * 20 + 21):
                f.write(json.dumps({"step": step, "data": {f"k{j}": step * j for j in range(5)}}) + "\\n")
        store.ingest_metrics(run_id, own)
        store.ingest_metrics("shared", shared)
    store.close()
    """
)


def test_four_processes_ingesting_at_once_lose_no_row(tmp_path):
    db = f"sqlite:///{tmp_path / 'runs' / 'results.db'}"
    shared = tmp_path / "shared.jsonl"
    shared.write_text("".join(line(s, **{f"k{j}": s + j for j in range(5)}) for s in range(1, 201)))
    # No database yet: the workers also race on creating it (SQLite does not enforce the runs
    # foreign key, so metrics of runs never recorded are accepted here).
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                db,
                plan(i, tmp_path).id,
                str(tmp_path / f"own{i}.jsonl"),
                str(shared),
                str(go),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    time.sleep(0.5)
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    store = open_store(db)
    try:
        for i in range(4):
            assert count(store, plan(i, tmp_path).id) == 200 * 5
            assert store.latest(plan(i, tmp_path).id) == (200, {f"k{j}": 200.0 * j for j in range(5)})
        assert count(store, "shared") == 200 * 5
        assert count(store) == 5 * 200 * 5
        with sqlite3.connect(tmp_path / "runs" / "results.db") as con:
            offsets = dict(con.execute("SELECT run_id, offset FROM metric_files").fetchall())
        assert offsets["shared"] == shared.stat().st_size
        assert offsets[plan(0, tmp_path).id] == (tmp_path / "own0.jsonl").stat().st_size
    finally:
        store.close()


# -------------------------------------------------------------------------------- evals, samples


def test_evals_and_samples_upsert_on_their_keys(store, tmp_path):
    p = plan(1, tmp_path)
    store.record_plan(p)
    protocol = {"n": 32, "temperature": 0.6, "top_p": 0.95, "max_tokens": 4096, "seed": 0}
    key = eval_row(run_id=p.id, step=400, benchmark="aime2025", metric="mean@32", scorer="answer", **protocol)
    assert store.record_evals([{**key, "value": 0.25, "scorer_version": "1"}]) == 1
    store.record_evals(
        [
            {**key, "value": 0.3, "scorer_version": "2"},
            {**key, "metric": "pass@32", "value": 0.6, "scorer_version": "2"},
        ]
    )
    sample = {
        "run_id": p.id,
        "step": 400,
        "benchmark": "aime2025",
        "problem": "3a5f",
        "sample_index": 0,
        "scorer": "answer",
        "position": 3,
        **protocol,
    }
    store.record_samples([{**sample, "extracted": "17", "correct": False, "response_length": 900}])
    store.record_samples([{**sample, "extracted": "18", "correct": True, "response_length": 900}])
    with sqlite3.connect(store.engine.url.database) as con:
        assert sorted(con.execute("SELECT metric, value, scorer_version FROM evals").fetchall()) == [
            ("mean@32", 0.3, "2"),
            ("pass@32", 0.6, "2"),
        ]
        assert con.execute("SELECT extracted, correct FROM samples").fetchall() == [("18", 1)]
    store.record_evals([{**key, "n": 8, "value": 0.1, "scorer_version": "2"}])  # another protocol: its own row
    with pytest.raises(ValueError, match="without its sampling protocol \\(top_p, seed\\)"):
        store.record_evals([{**key, "top_p": None, "seed": None, "value": 0.9, "scorer_version": "2"}])
    with pytest.raises(ValueError, match="without its sampling protocol \\(n\\)"):
        store.record_samples([{k: v for k, v in sample.items() if k != "n"} | {"correct": True}])
    with sqlite3.connect(store.engine.url.database) as con:
        assert sorted(con.execute("SELECT n, metric, value FROM evals").fetchall()) == [
            (8, "mean@32", 0.1),
            (32, "mean@32", 0.3),
            (32, "pass@32", 0.6),
        ]  # nothing overwritten


# ---------------------------------------------------------------------------------- run_states


def test_run_states_reads_without_creating_anything(tmp_path):
    db = f"sqlite:///{tmp_path / 'runs' / 'results.db'}"
    assert run_states(db, ["a", "b"]) == {}
    assert not (tmp_path / "runs").exists()
    store = open_store(db)
    store.record_plans([plan(1, tmp_path), plan(2, tmp_path)])
    store.set_status(plan(2, tmp_path).id, "succeeded")
    store.close()
    before = sorted(os.listdir(tmp_path / "runs"))
    assert run_states(db, [plan(1, tmp_path).id, plan(2, tmp_path).id, "unknown"]) == {
        plan(1, tmp_path).id: "pending",
        plan(2, tmp_path).id: "succeeded",
    }
    assert sorted(os.listdir(tmp_path / "runs")) == before  # no -wal/-shm left behind either


def test_run_states_sees_a_live_writer(tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    store = open_store(db)  # kept open: WAL files exist, uncheckpointed commits live in the -wal file
    try:
        store.record_plan(plan(1, tmp_path))
        store.set_status(plan(1, tmp_path).id, "running")
        assert run_states(db, [plan(1, tmp_path).id]) == {plan(1, tmp_path).id: "running"}
    finally:
        store.close()


def test_run_states_of_a_database_without_tables(tmp_path):
    sqlite3.connect(tmp_path / "empty.db").close()
    assert run_states(str(tmp_path / "empty.db"), ["a"]) == {}


# ---------------------------------------------------------------------------------------- CLI


def test_rpg_runs_lists_and_filters(tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    store = open_store(db)
    plans = [plan(1, tmp_path), plan(2, tmp_path), plan(3, tmp_path, sweep="other")]
    store.record_plans(plans)
    store.set_status(plans[0].id, "failed", error="Traceback ...\nValueError: reward went sideways")
    path = tmp_path / "m.jsonl"
    path.write_text(line(7, **{"critic/score/mean": 0.625}))
    store.ingest_metrics(plans[1].id, path)
    store.close()
    runner = CliRunner()

    result = runner.invoke(app, ["runs", "--db", db])
    assert result.exit_code == 0, result.output
    for p in plans:
        assert p.name in result.output
    assert "0.6250" in result.output and "reward went sideways" in result.output

    result = runner.invoke(app, ["runs", "--db", db, "--format", "json"])
    assert {r["name"]: r["seed"] for r in json.loads(result.output)} == {"run-1": 1, "run-2": 2, "run-3": 3}
    result = runner.invoke(app, ["runs", "--db", db, "--format", "csv", "--sweep", "other"])
    assert result.output.splitlines()[0].startswith("sweep,name,id,seed,status,")
    assert result.output.splitlines()[1].startswith(f"other,run-3,{plans[2].id},3,pending,")
    result = runner.invoke(app, ["runs", "--db", db, "--sweep", "other"], env={"COLUMNS": "200"})
    header = [c.strip() for c in next(line for line in result.output.splitlines() if "seed" in line).split("┃")]
    row = [c.strip() for c in next(line for line in result.output.splitlines() if "run-3" in line).split("│")]
    assert row[header.index("seed")] == "3"

    result = runner.invoke(app, ["runs", "--db", db, "--sweep", "sw", "--status", "pending"])
    assert result.exit_code == 0
    assert "run-2" in result.output and "run-1" not in result.output and "run-3" not in result.output

    result = runner.invoke(app, ["runs", "--db", db, "--status", "exploded"])
    assert result.exit_code == 2 and "unknown --status exploded" in result.output

    result = runner.invoke(app, ["runs", "--db", f"sqlite:///{tmp_path / 'none.db'}"])
    assert result.exit_code == 0 and "no runs recorded yet" in result.output
    result = runner.invoke(app, ["runs", "--db", f"sqlite:///{tmp_path / 'none' / 'results.db'}"])
    assert result.exit_code == 2 and "no directory" in result.output
    assert not (tmp_path / "none").exists()


# ---------------------------------------------------------------------------------- schema versions

V1_DUMP = Path(__file__).resolve().parent / "data" / "results-v1.sql"


def v1_database(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.executescript(V1_DUMP.read_text(encoding="utf-8"))
    con.close()
    return path


def table_rows(db: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(db) as con:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {n: sorted(con.execute(f'SELECT * FROM "{n}"').fetchall(), key=repr) for n in names}


def test_a_database_written_before_schema_versions_opens_with_nothing_lost(tmp_path):
    db = v1_database(tmp_path / "results.db")
    before = table_rows(db)
    assert "schema_version" not in before and len(before["metrics"]) == 3 * 10 and len(before["samples"]) == 8
    v1 = {"n": 4, "temperature": 1.0, "top_p": 0.7, "max_tokens": 4096, "seed": 0}  # what version 1 sampled with
    for create in (False, True):  # as `rpg runs` opens it, then as `rpg sweep` does
        store = open_store(f"sqlite:///{db}", create=create)
        try:
            runs = {r.id: r for r in store.runs()}
            assert {i: r.status for i, r in runs.items()} == {
                "v1run001": "succeeded",
                "v1run002": "failed",
                "v1run003": "running",
            }
            assert runs["v1run002"].error.endswith("ValueError: boom") and runs["v1run001"].spec["kl"] == "urkl"
            assert (runs["v1run001"].finished_at - runs["v1run001"].started_at).total_seconds() == 3600
            assert store.latest("v1run003") == (
                4,
                {"critic/score/mean": 0.4, "actor/pg_loss": -4.0, "val-core/aime2025/acc/mean@32": 0.2},
            )
            assert store.last_steps(runs) == dict.fromkeys(runs, 4)
            assert sorted(store.eval_values("v1run001", 4, "aime24", "dapo", ["mean@k", "pass@k"], v1)) == [
                ("mean@k", 4, 0.25),
                ("pass@k", 1, 0.25),
                ("pass@k", 4, 0.75),
            ]  # pass@1 of the n = 4 evaluation
            assert store.stored_samples("v1run001", 4, "aime24", "dapo", v1)["position-1"][1] == ("1", True)
            assert [r.id for r in store.runs(sweep="old")] == ["v1run001", "v1run002"]  # membership: its sweep
            assert [r.id for r in store.runs(sweep="other")] == ["v1run003"]
        finally:
            store.close()
    after = table_rows(db)
    assert after["schema_version"] == [(migrations.LATEST,)]
    for name in ("runs", "sweeps", "metrics"):  # every row, as it was (columns added since: unknown, NULL)
        assert [r[: len(before[name][0])] for r in after[name]] == before[name]
    assert {r[-3:] for r in after["runs"]} == {(None, 0.0, None)}  # running_at (version 3); held_s, held_at (v7)
    assert sorted(r[:4] for r in after["metric_files"]) == sorted(before["metric_files"])  # identity unknown: NULL
    assert all(r[4:] == (None,) * 7 for r in after["metric_files"])  # and v4's restart_attempt, changed; v5's two
    with sqlite3.connect(db) as con:
        evals = con.execute("SELECT run_id, step, benchmark, metric, k, scorer, value, scorer_version, n FROM evals")
        assert sorted(r[:-1] for r in evals.fetchall()) == sorted(before["evals"])
        assert con.execute("SELECT DISTINCT n, temperature, top_p, max_tokens, seed FROM evals").fetchall() == [
            tuple(v1.values())
        ]
        samples = con.execute(
            "SELECT run_id, step, benchmark, position, sample_index, scorer, extracted, correct,"
            " response_length, problem, n FROM samples"
        ).fetchall()
        assert sorted(r[:-2] for r in samples) == sorted(before["samples"])
        assert {(r[3], r[9], r[10]) for r in samples} == {(0, "position-0", 4), (1, "position-1", 4)}
        assert con.execute("SELECT sweep, run_id FROM sweep_runs ORDER BY run_id").fetchall() == [
            ("old", "v1run001"),
            ("old", "v1run002"),
            ("other", "v1run003"),
        ]


def test_a_new_version_upgrades_an_older_database_in_place_once(tmp_path, monkeypatch):

    db = v1_database(tmp_path / "results.db")
    calls = []
    latest = migrations.LATEST + 1

    def add_note(conn):  # what a new version looks like: a few lines
        calls.append(1)
        conn.exec_driver_sql("ALTER TABLE evals ADD COLUMN note VARCHAR(20)")
        conn.exec_driver_sql("UPDATE evals SET note = 'upgraded'")

    monkeypatch.setitem(migrations.MIGRATIONS, latest, add_note)
    monkeypatch.setattr(migrations, "LATEST", latest)
    for _ in range(2):
        open_store(f"sqlite:///{db}", create=False).close()
    assert calls == [1]  # upgraded on the first open only, through every version in turn
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT version FROM schema_version").fetchall() == [(latest,)]
        assert con.execute("SELECT DISTINCT note FROM evals").fetchall() == [("upgraded",)]
        assert con.execute("SELECT COUNT(*) FROM metrics").fetchone()[0] == 30
    fresh = tmp_path / "fresh.db"
    open_store(f"sqlite:///{fresh}").close()  # a new database starts at the latest version, no migration
    assert calls == [1] and table_rows(fresh)["schema_version"] == [(latest,)]


def test_a_version_4_database_gains_the_stall_clock_and_takes_every_state(db_url, tmp_path):
    """Version 5: metric_files.advanced_at (NULL for what was read before: no stall is judged until a step
    comes) and resumed_after, and runs.status takes every state of states.STATUSES (version 4's check knew six)."""
    import re

    import sqlalchemy as sa

    from rpg_cli.states import STATUSES

    v4_states = ("pending", "submitted", "running", "succeeded", "failed", "stopped")
    store = open_store(db_url)
    try:
        plans = [RunPlan(f"r{i}", f"r{i}", "s", "local", {"steps": 3}, tmp_path / f"r{i}", ["true"]) for i in range(9)]
        store.record_plans(plans, "s")
        plans[0].run_dir.mkdir(parents=True)
        (plans[0].run_dir / "metrics.jsonl").write_text('{"step": 1, "data": {"timing_s/step": 2.0}}\n')
        store.ingest_metrics("r0", plans[0].run_dir / "metrics.jsonl")
        store.set_status("r0", "running", submission_id="r0")
        old_check = "status IN ({})".format(", ".join(f"'{s}'" for s in v4_states))
        with store.engine.begin() as conn:  # what version 4 wrote
            for column in ("advanced_at", "resumed_after"):
                conn.exec_driver_sql(f"ALTER TABLE metric_files DROP COLUMN {column}")
            conn.exec_driver_sql("UPDATE schema_version SET version = 4")
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("ALTER TABLE runs DROP CONSTRAINT runs_status")
                conn.exec_driver_sql(f"ALTER TABLE runs ADD CONSTRAINT runs_status CHECK ({old_check})")
    finally:
        store.close()
    if db_url.startswith("sqlite"):  # SQLite cannot alter a check: version 4's table, as it was created
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as con:
            (ddl,) = con.execute("SELECT sql FROM sqlite_master WHERE name = 'runs'").fetchone()
            cookie = con.execute("PRAGMA schema_version").fetchone()[0]
            con.execute("PRAGMA writable_schema = ON")
            v4 = re.sub(r"status IN \([^)]*\)", old_check, ddl)
            assert v4 != ddl
            con.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'runs'", (v4,))
            con.execute(f"PRAGMA schema_version = {cookie + 1}")
    store = open_store(db_url, create=False)  # upgraded as `rpg runs` opens it
    try:
        with store.engine.connect() as conn:
            assert migrations.current_version(conn, store.t) == migrations.LATEST
        assert store.stall_facts(["r0"]) == {"r0": (None, [2.0])}  # read before: no clock yet
        assert store.run("r0").status == "running"  # every row kept
        for plan, state in zip(plans[1:], STATUSES):  # every state rpg knows now is recorded
            store.set_status(plan.id, state)
        assert {r.status for r in store.runs()} == set(STATUSES)
        with pytest.raises(sa.exc.IntegrityError), store.engine.begin() as conn:  # and nothing else
            conn.exec_driver_sql("UPDATE runs SET status = 'bogus' WHERE id = 'r1'")
        with open(plans[0].run_dir / "metrics.jsonl", "a") as f:
            f.write('{"step": 2, "data": {"timing_s/step": 3.0}}\n')
        store.ingest_metrics("r0", plans[0].run_dir / "metrics.jsonl")
        assert store.stall_facts(["r0"])["r0"][0] is not None  # the clock starts with the next step
    finally:
        store.close()
    again = open_store(db_url, create=False)  # a second open: nothing to do
    again.close()


def test_a_database_newer_than_this_rpg_is_refused(tmp_path):
    db = tmp_path / "results.db"
    open_store(f"sqlite:///{db}").close()
    with sqlite3.connect(db) as con:
        con.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(StoreError, match="schema version 99, newer than this rpg knows"):
        open_store(f"sqlite:///{db}", create=False)


# ------------------------------------------------------------------ scored samples of an evaluation


def _scored(problem: int, verdicts: str, scorer: str = "dapo") -> str:
    """The scored-samples line of problem `problem`: one sample per character of `verdicts` (1 right)."""
    from rpg_cli.store.ingest import sample_line

    protocol = {"n": len(verdicts), "temperature": 1.0, "top_p": 1.0, "max_tokens": 16, "seed": 0}
    samples = [(str(problem) if v == "1" else "x", v == "1", 3 + j) for j, v in enumerate(verdicts)]
    return sample_line(f"p{problem}", problem, scorer, "dapo-1", protocol, samples) + "\n"


def _ingest_scored(store, run_id: str, path: Path, cursor):
    """What ScoredFeed does for one file: the new lines, as sample rows, into the store."""
    from rpg_cli.store.ingest import parse_sample_line, read_new, sample_rows

    parsed, cursor = read_new(path, cursor, parse_sample_line)
    store.record_samples([row for event in parsed.events for row in sample_rows(run_id, 7, "b", event)])
    return cursor, parsed


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _samples(store) -> list[tuple]:
    with sqlite3.connect(store.engine.url.database) as con:
        return con.execute(
            "SELECT problem, sample_index, correct, response_length FROM samples ORDER BY problem, sample_index"
        ).fetchall()


def test_scored_samples_killed_at_any_byte_are_ingested_once_and_whole(store, tmp_path):
    """An evaluation killed at any byte of its file, ingested then, resumed (the writer ends the torn
    line first) and ingested again: every sample once, none lost, none from a torn line."""
    from rpg_cli.rundir import append_line

    store.record_plan(plan(1, tmp_path))
    lines = [_scored(0, "1100"), _scored(1, "0001"), _scored(2, "1111")]
    whole = "".join(lines).encode()
    expected = [
        (f"p{p}", j, int(v == "1"), 3 + j) for p, vs in enumerate(["1100", "0001", "1111"]) for j, v in enumerate(vs)
    ]
    for cut in range(len(whole) + 1):
        with sqlite3.connect(store.engine.url.database) as con:
            con.execute("DELETE FROM samples")
        path = tmp_path / f"cut{cut}.scored.jsonl"
        path.write_bytes(whole[:cut])
        cursor, first = _ingest_scored(store, "id0001", path, None)
        fragment = whole[:cut].rsplit(b"\n", 1)[-1]  # the last line, cut short where the kill came
        torn = bool(fragment) and not _is_json(fragment)
        complete = whole[:cut].count(b"\n") + (1 if fragment and not torn else 0)
        assert len(first.events) == complete and not first.bad, cut  # a torn tail waits, never misread
        # the resumed evaluation redoes every problem it has no complete line for, each as one line
        done = {e["problem"] for e in first.events}
        for p, line in enumerate(lines):
            if f"p{p}" not in done:
                append_line(path, line)
        cursor, second = _ingest_scored(store, "id0001", path, cursor)
        assert {e["problem"] for e in second.events} == {f"p{p}" for p in range(3)} - done, cut
        assert len(second.bad) == int(torn), cut  # the torn line, ended by the resumed writer: skipped, warned
        assert _samples(store) == expected, cut
        assert _ingest_scored(store, "id0001", path, cursor)[1].events == []  # nothing new: nothing read


def test_scored_samples_rewritten_or_replaced_are_read_again_and_the_last_line_wins(store, tmp_path):
    store.record_plan(plan(1, tmp_path))
    path = tmp_path / "b.scored.jsonl"
    path.write_text(_scored(0, "00") + _scored(1, "00"))
    cursor, _ = _ingest_scored(store, "id0001", path, None)
    assert [c for _, _, c, _ in _samples(store)] == [0, 0, 0, 0]
    # rewritten in place, same length, same inode: the fingerprint tells; problem 1 scored again
    with open(path, "r+b") as f:
        f.write((_scored(0, "00") + _scored(1, "11")).encode())
    cursor, parsed = _ingest_scored(store, "id0001", path, cursor)
    assert len(parsed.events) == 2 and [c for _, _, c, _ in _samples(store)] == [0, 0, 1, 1]
    # replaced by another file (a new inode), shorter: read from its start
    replacement = tmp_path / "new"
    replacement.write_text(_scored(0, "10"))
    os.replace(replacement, path)
    cursor, parsed = _ingest_scored(store, "id0001", path, cursor)
    assert len(parsed.events) == 1 and [c for _, _, c, _ in _samples(store)] == [1, 0, 1, 1]
    # a problem scored twice in one file: the later line wins, one row per sample
    path.write_text(_scored(2, "00") + "garbage\n" + _scored(2, "01"))
    cursor, parsed = _ingest_scored(store, "id0001", path, None)
    assert parsed.bad == [(1, "not JSON")]
    assert [(p, c) for p, _, c, _ in _samples(store) if p == "p2"] == [("p2", 0), ("p2", 1)]


# ------------------------------------------------------------------------------- passwords


@pytest.mark.parametrize(
    "text, secret",
    [
        ("postgresql://alice:S3cr3t@db.example:5432/rpg", "S3cr3t"),
        ("postgresql://alice:p@ss:w0rd/x@db.example/rpg", "ss:w0rd"),  # @, : and / in the password
        ("postgresql://alice@db.example/rpg?password=S3cr3t", "S3cr3t"),
        ("postgresql://db.example/rpg?sslmode=require&password=S3cr3t&user=alice", "S3cr3t"),
        ("postgresql://db.example/rpg?PASSWORD=S3cr3t", "S3cr3t"),
        ("host=db.example password=S3cr3t user=alice", "S3cr3t"),
        ("cannot open 'postgresql://u:S3cr3t@h/d' (refused)", "S3cr3t"),
    ],
)
def test_one_redactor_hides_every_form_of_password(text, secret):
    from rpg_cli.store.url import display_url, redact

    for shown in (redact(text), display_url(text)):
        assert secret not in shown and "***" in shown, shown
    assert "db.example" in redact(text) or "h/d" in redact(text)  # only the password goes


def test_redaction_keeps_what_holds_no_password():
    from rpg_cli.store.url import redact

    for text in ("sqlite:///runs/results.db", "http://127.0.0.1:8265", "https://user@host/x", "bypass the cache"):
        assert redact(text) == text


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://alice:p@ss:w0rd@127.0.0.1:1/rpg",  # the port parse would quote "w0rd@127.0.0.1:1"
        "postgresql://alice@127.0.0.1:1/rpg?password=S3cr3tQ",
        "postgresql://127.0.0.1:1/rpg?sslmode=disable&password=S3cr3tA",
    ],
)
def test_a_password_in_a_bad_or_unreachable_url_is_never_printed(url, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "rpg_cli", "runs", "--db", url],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    for fragment in ("w0rd", "S3cr3tQ", "S3cr3tA", "ss:"):
        assert fragment not in out, out
