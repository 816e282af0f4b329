"""`rpg export`: a sweep's stored metrics and evals written to each tracker, twice (the second adds only what
is new), read back with the tracker's own reader; evals under two protocols on their own keys; one-line
errors; servers that never answer, refuse or hang bounded by --timeout; a failure midway; live runs
brought up to date first."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers import eval_row
from trackers_support import (
    EXPERIMENTS,
    SECRETS,
    assert_no_secrets,
    mlflow_runs,
    needs_mlflow,
    needs_tensorboard,
    needs_wandb,
    read_mlflow,
    read_tensorboard,
    read_wandb_offline,
)
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import plan_sweep
from rpg_cli.spec import SweepSpec, load_sweep
from rpg_cli.store import open_store
from rpg_cli.trackers import TRACKERS
from rpg_cli.trackers.wandb import wandb_run_id


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
                eval_row(run_id=p.id, step=s, benchmark="aime25", metric=m, k=k, value=v + i / 100)
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
    got = (tb["eval/aime25/dapo/mean@8_ci_low"][3], tb["eval/aime25/dapo/mean@8_ci_high"][3])
    assert got == pytest.approx((want.low, want.high), abs=1e-6) and want.low < want.high
    assert 2 not in tb["eval/aime25/dapo/mean@8_ci_low"]  # step 2: no samples stored, no interval
    other = read_tensorboard(tmp_path / "tb" / "sw" / plans[1].name)
    assert not any(key.endswith("_ci_low") for key in other)  # pass@1 and runs without samples: none


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
        return eval_row(step=step, benchmark="aime25", value=value, temperature=temperature)

    rows = [row(2, 0.5, 1.0), row(3, 0.6, 1.0), row(3, 0.9, 0.6)]  # step 3 scored twice, at T 1.0 and 0.6
    assert eval_metrics(rows) == {
        2: {"eval/aime25/dapo/mean@8": 0.5},
        3: {"eval/aime25/dapo/mean@8": 0.6, "eval/aime25/dapo/n8_T0.6_top_p1_max64_seed0/mean@8": 0.9},
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
