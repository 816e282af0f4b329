"""Absurd values never run: every numeric spec field is bounded by its meaning, sizes by the data, a
YAML of nested aliases is refused before it expands, names fit a file system, and a run whose loss or
gradient goes non-finite is marked failed (never "succeeded"). Each through the real CLI and real files."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_spec
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.datasets import VERL_SCHEMA, verl_row
from rpg_cli.store import open_store

ROWS = 20

BASE = """\
name: {name}
base:
  algorithm: rpg
  kl: urkl
  beta: 1.0e-3
  clip: {{eps_low: 0.2, eps_high: 0.28}}
  optimizer: adamw
  context: 2k
  model: Qwen/Qwen3-4B
  data: {{train_files: [{data}/train.parquet], val_files: [{data}/val.parquet]}}
  train_batch_size: 8
  rollout_n: 4
  ppo_mini_batch_size: 4
  lr: 1.0e-6
  steps: 10
  seed: 0
  save_every: 5
  backend: local
  resources: {{nodes: 1, gpus_per_node: 0, cpus: 1}}
"""


def write_data(root: Path, rows: int = ROWS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in ("train", "val"):
        table = pa.Table.from_pylist(
            [verl_row(f"{i}+1?", str(i + 1), "toy", i) for i in range(rows)], schema=VERL_SCHEMA
        )
        pq.write_table(table, root / f"{name}.parquet")
    return root


def sweep_file(tmp_path: Path, name: str = "bounds", extra: str = "", **base: str) -> Path:
    data = write_data(tmp_path / "data")
    text = BASE.format(name=name, data=data)
    for key, value in base.items():  # replace one base field
        lines = [line for line in text.splitlines() if not line.startswith(f"  {key}:")]
        text = "\n".join([*lines, f"  {key}: {value}"]) + "\n"
    path = tmp_path / "sweep.yaml"
    path.write_text(text + extra)
    return path


def dry_run(spec: Path, db: Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["sweep", str(spec), "--dry-run", "--db", f"sqlite:///{db}"])
    return result.exit_code, result.stdout, result.stderr


# ------------------------------------------------------------------------------------ item 5: bounds


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("beta", ".inf", "base.beta: got inf (float); allowed: a finite number"),
        ("lr", ".nan", "base.lr: got nan (float); allowed: a finite number"),
        ("clip", "{eps_low: 5.0, eps_high: 0.28}", "base.clip.eps_low: got 5.0; allowed: < 1"),
        ("clip", "{eps_low: 0.2, eps_high: 0.28, c: 1.0}", "base.clip.c: got 1.0; allowed: > 1"),
        ("steps", "100000000000000000000000", "base.steps: got 100000000000000000000000; allowed: <= 1000000"),
        ("train_batch_size", "1000000000", "base.train_batch_size: got 1000000000; allowed: <= 1048576"),
        ("rollout_n", "100000", "base.rollout_n: got 100000; allowed: <= 4096"),
        ("seed", "99999999999", "base.seed: got 99999999999; allowed: <= 4294967295"),
    ],
)
def test_a_value_outside_its_fields_meaning_is_one_line_naming_the_field(field, value, said, tmp_path):
    code, out, err = dry_run(sweep_file(tmp_path, **{field: value}), tmp_path / "runs" / "results.db")
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert out == "" and not (tmp_path / "runs").exists()


def test_an_infinite_value_in_a_grid_axis_is_refused_too(tmp_path):
    spec = sweep_file(tmp_path, extra="grid:\n  beta: [0.001, .inf]\n")
    code, _, err = dry_run(spec, tmp_path / "results.db")
    assert code == 2 and "grid.beta[1]: got inf (float); allowed: a finite number" in err


def test_a_batch_larger_than_the_training_rows_is_refused_by_the_dry_run(tmp_path):
    code, out, err = dry_run(sweep_file(tmp_path, train_batch_size="64"), tmp_path / "results.db")
    assert code == 2
    assert f"train_batch_size: 64 prompts per step, but the training files hold {ROWS} rows" in err
    ok, _, err = dry_run(sweep_file(tmp_path, train_batch_size=str(ROWS)), tmp_path / "results.db")
    assert ok == 0 and "train_batch_size" not in err


# ----------------------------------------------------------------------- item 6: nested YAML aliases

LAUGHS = """\
name: laughs
base:
  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]
  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
  d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
  f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
  g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
  h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
  i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
grid:
  train_batch_size: [*i]
"""


def test_a_yaml_of_nested_aliases_is_one_line_and_never_expanded(tmp_path):
    spec = tmp_path / "laughs.yaml"
    spec.write_text(LAUGHS)
    assert len(LAUGHS) < 1500

    def one_gigabyte() -> None:  # what expanding it would take is far beyond this
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    done = subprocess.run(
        [sys.executable, "-m", "rpg_cli", "sweep", str(spec), "--dry-run", "--db", str(tmp_path / "r.db")],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=one_gigabyte,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        f"rpg sweep: {spec}: its aliases (*name) expand to more than 100,000 values; allowed: a spec whose "
        "anchors are reused a bounded number of times"
    )


def test_aliases_reused_a_few_times_still_work(tmp_path):
    spec = sweep_file(tmp_path, extra="grid:\n  seed: &seeds [0, 1]\ninclude:\n  - {seed: 2}\n")
    code, out, err = dry_run(spec, tmp_path / "results.db")
    assert code == 0 and "3 runs" in out, err


# ------------------------------------------------------------------------------------- item 7: names


def test_a_sweep_name_too_long_for_a_directory_is_refused_by_the_dry_run(tmp_path):
    code, _, err = dry_run(sweep_file(tmp_path, name="s" * 300), tmp_path / "results.db")
    assert code == 2 and "name: got 'sss" in err and "allowed: at most 100 characters" in err
    assert len(err.strip().splitlines()) == 1


def test_cancel_stops_any_run_in_the_store_even_one_whose_directory_cannot_exist(tmp_path):
    """A run recorded by an older rpg under a 300-character sweep name: `rpg cancel` records it stopped."""
    db = f"sqlite:///{tmp_path / 'results.db'}"
    store = open_store(db)
    run_dir = tmp_path / "runs" / ("s" * 300) / "rpg-urkl-1234abcd"
    plan = SimpleNamespace(
        id="1234abcd", name="rpg-urkl-1234abcd", sweep="s" * 300, backend="local", spec={"seed": 0}, run_dir=run_dir
    )
    store.record_plans([plan])
    store.close()
    result = CliRunner().invoke(app, ["cancel", "1234abcd", "--db", db, "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "stopped 1 run(s): rpg-urkl-1234abcd" in result.stdout
    store = open_store(db, create=False)
    assert store.run("1234abcd").status == "stopped"
    store.close()


# ------------------------------------------------------------------- item 14: a copied sweep file


def test_a_sweep_file_copied_under_a_new_name_says_its_runs_already_ran(tmp_path):
    from rpg_cli.orchestration.plan import plan_sweep
    from rpg_cli.spec import load_sweep

    original = sweep_file(tmp_path, name="first", extra="grid:\n  seed: [0, 1, 2]\n")
    db = tmp_path / "results.db"
    store = open_store(f"sqlite:///{db}")
    plans = plan_sweep(load_sweep(original), tmp_path / "runs")
    store.record_plans(plans, "first")
    for p in plans:
        store.set_status(p.id, "succeeded")
    store.close()
    copy = tmp_path / "copy.yaml"
    copy.write_text(original.read_text().replace("name: first", "name: second"))
    code, out, err = dry_run(copy, db)
    assert code == 0 and "0 to submit" in out
    assert (
        "rpg sweep: 3 run(s) already succeeded in sweep first: a run is its spec, not its sweep's name, so they "
        "are not run again and their files stay in first's directory"
    ) in err
    _, _, err = dry_run(original, db)  # the sweep that made them says nothing of the kind
    assert "already" not in err


# ---------------------------------------------------------------- item 5: non-finite loss -> failed


def test_a_run_that_logged_a_nan_loss_is_marked_failed_when_its_job_succeeds(tmp_path, db_url):
    """verl trains through a NaN loss and exits 0: the watcher reads the metrics and records a failure."""
    pytest.importorskip("ray.job_submission")
    from ray.job_submission import JobDetails, JobStatus

    from rpg_cli.orchestration import reconcile

    run_dir = tmp_path / "runs" / "s" / "run-1"
    run_dir.mkdir(parents=True)
    lines = [
        {"step": 1, "data": {"actor/pg_loss": 0.5, "actor/grad_norm": 1.0}},
        {"step": 2, "data": {"actor/pg_loss": float("nan"), "actor/grad_norm": float("inf")}},
        {"step": 3, "data": {"actor/pg_loss": float("nan"), "actor/grad_norm": float("nan")}},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    store = open_store(db_url)
    plan = SimpleNamespace(id="abcd1234", name="run-1", sweep="s", backend="verl", spec={"seed": 0}, run_dir=run_dir)
    store.record_plans([plan])
    store.set_status("abcd1234", "running", submission_id="abcd1234")
    job = JobDetails(
        type="SUBMISSION", submission_id="abcd1234", entrypoint="python x", status=JobStatus.SUCCEEDED,
        start_time=1_700_000_000_000, end_time=1_700_000_060_000,
    )  # fmt: skip
    client = SimpleNamespace(get_job_logs=lambda _id: "done\n")
    assert reconcile.sync_run(client, store, store.run("abcd1234"), job) == "failed"
    run = store.run("abcd1234")
    assert run.status == "failed"
    assert run.error.startswith("training diverged at step 2: actor/grad_norm is inf; lower lr or beta")
    store.close()


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy")
    result = CliRunner().invoke(app, ["prepare-data", "--toy", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out / "toy"


def test_the_local_backend_stops_a_run_whose_loss_goes_non_finite(toy, tmp_path, capsys):
    from rpg_cli.backends.local.trainer import main
    from rpg_cli.rundir import write_spec

    spec = make_spec(
        algorithm="grpo",
        kl="none",
        beta=0.0,
        model=str(toy / "model"),
        data={"train_files": [str(toy / "train.parquet")], "val_files": []},
        rollout_n=4,
        ppo_mini_batch_size=4,
        lr=1.0e30,  # finite, and absurd: the weights overflow after one step
        steps=6,
        save_every=1,
        rollout={"engine": "hf"},
    )
    run_dir = tmp_path / "run"
    write_spec(run_dir, spec.canonical())
    assert main(str(run_dir / "spec.json")) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("rpg local backend:")]
    assert line.startswith("rpg local backend: training diverged at step ") and "; lower lr or beta" in line
    step = int(line.split("at step ")[1].split(":")[0])
    logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert step < spec.steps and max(logged, default=0) <= step  # it stopped there


# ---------------------------------------------------------------------- item 12: queued and run apart


def test_runs_shows_the_time_queued_and_the_time_run_apart_after_upgrading_an_old_store(tmp_path):
    import sqlite3

    from rpg_cli.report import wall_text

    path = tmp_path / "results.db"
    db = f"sqlite:///{path}"
    open_store(db).close()
    with sqlite3.connect(path) as con:  # the layout of schema version 2: no running_at, nor version 4's columns
        con.execute("ALTER TABLE runs DROP COLUMN running_at")
        for column in ("restart_attempt", "changed"):
            con.execute(f"ALTER TABLE metric_files DROP COLUMN {column}")
        con.execute("UPDATE schema_version SET version = 2")
    store = open_store(db)  # upgraded in place
    plan = SimpleNamespace(
        id="feed0001", name="r-feed0001", sweep="s", backend="local", spec={"seed": 3}, run_dir=tmp_path
    )
    store.record_plans([plan])
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    store.set_status("feed0001", "submitted", submission_id="feed0001")
    store.set_status("feed0001", "running", at=now - timedelta(seconds=129))  # Ray took it 129 s ago
    store.set_status("feed0001", "succeeded", at=now + timedelta(seconds=40))
    store.close()
    result = CliRunner().invoke(app, ["runs", "--db", db, "--format", "json"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    assert row["queued_s"] == pytest.approx(129, abs=5) and row["run_s"] == pytest.approx(40, abs=5)
    assert row["wall_s"] == pytest.approx(169, abs=1)
    table = CliRunner().invoke(app, ["runs", "--db", db], env={"COLUMNS": "250"})
    assert "queued" in table.stdout and "run" in table.stdout
    assert wall_text(row["queued_s"]) in table.stdout and wall_text(row["run_s"]) in table.stdout


# ----------------------------------------------------------------------- item 10: rpg runs' arguments


@pytest.mark.parametrize("where", ["directory", "missing"])
def test_runs_on_a_database_path_that_cannot_be_one_is_an_error(where, tmp_path):
    target = tmp_path if where == "directory" else tmp_path / "nowhere" / "results.db"
    result = CliRunner().invoke(app, ["runs", "--db", f"sqlite:///{target}"])
    assert result.exit_code == 2
    said = "is a directory, not a results database" if where == "directory" else "no directory"
    assert said in result.stderr and "no runs recorded yet" not in result.output


@pytest.mark.parametrize(
    ("clause", "said"),
    [
        ("algorithm=grpoo", "'grpoo' is not a value of algorithm; allowed: grpo, dapo, reinforce_pp"),
        ("clip.eps_low=abc", "'abc' is not a value of clip.eps_low; allowed: a number"),
        ("kl_correction=maybe", "'maybe' is not a value of kl_correction; allowed: true or false"),
        ("clip.eps_lo=0.2", "no spec field 'clip.eps_lo'; fields there: eps_low, eps_high, c"),
    ],
)
def test_runs_where_a_value_that_cannot_match_is_an_error(clause, said, tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    open_store(db).close()
    result = CliRunner().invoke(app, ["runs", "--db", db, "--where", clause])
    assert result.exit_code == 2 and said in result.stderr, result.output
    fine = CliRunner().invoke(app, ["runs", "--db", db, "--where", "algorithm=grpo", "--where", "clip.eps_low=0.2"])
    assert fine.exit_code == 0, fine.output


# ------------------------------------------------------------------------------- item 9: data files


def test_data_files_say_exactly_what_is_wrong(tmp_path):
    from rpg_cli.inputs import check_data_file

    numbers = tmp_path / "numbers.parquet"
    pq.write_table(
        pa.table({"prompt": [1, 2], "reward_model": [{"ground_truth": "1"}] * 2, "data_source": ["toy"] * 2}), numbers
    )
    [f] = check_data_file("data.train_files", str(numbers))
    assert f.error and f.message == (
        f"{numbers}: its prompt column holds int64, not chat messages (a list of {{role, content}}); "
        "write it with `rpg prepare-data`"
    )
    [f] = check_data_file("data.train_files", str(tmp_path))
    assert f.error and f.message == f"{tmp_path} is a directory, not a parquet file; name the .parquet file in it"
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({}), empty)  # what an empty data frame writes: no rows, no columns
    [f] = check_data_file("data.val_files", str(empty))
    assert f.error and f.message == f"{empty} has no rows; write it with `rpg prepare-data`"


def test_a_numeric_prompt_column_is_one_line_in_the_dry_run(tmp_path):
    spec = sweep_file(tmp_path)
    numbers = tmp_path / "data" / "train.parquet"
    pq.write_table(
        pa.table({"prompt": list(range(20)), "reward_model": [{"ground_truth": "1"}] * 20, "data_source": ["t"] * 20}),
        numbers,
    )
    code, _, err = dry_run(spec, tmp_path / "results.db")
    assert code == 2 and "its prompt column holds int64" in err and "Traceback" not in err
