"""`rpg runs` at scale: above SUMMARIZE_ABOVE runs its table has one row per sweep (its runs counted by
state, the steps reached, the latest start) and says how to list them; `--all` lists every run, CSV and
JSON always do; a small store prints what it printed before, with each run's cost (s/step, tokens/s per device,
device-hours, ETA), and a sweep's row its device-hours. Real SQLite stores, the real CLI."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.report.summary import SUMMARIZE_ABOVE, sweeps_summary
from rpg_cli.store import open_store

T0 = datetime(2026, 3, 1, 9, 0, 0)


def plan(tmp_path, i: int, sweep: str) -> RunPlan:
    spec = {"algorithm": "grpo", "kl": "none", "seed": i, "model": "data/toy/model", "context": "2k"}
    return RunPlan(
        id=f"r{i:05d}",
        name=f"grpo-s{i}",
        sweep=sweep,
        backend="local",
        spec=spec,
        run_dir=tmp_path / "runs" / sweep / f"grpo-s{i}",
        entrypoint=["true"],
    )


def fill(store, tmp_path, sweeps: dict[str, list[str]]) -> None:
    """Runs per sweep in these (terminal) states, each ended at a known time (never seen running: no
    time queued or run, which would be now's), with a step logged (run i: step i % 7 * 10, 12.5 s, 2345.6 tokens/s
    per device) and its one device held for (i + 1) x 30 minutes before it ended where i is even."""
    i = 0
    for sweep, states in sweeps.items():
        plans = [plan(tmp_path, i + j, sweep) for j in range(len(states))]
        store.record_plans(plans)
        for p, state in zip(plans, states):
            end = T0 + timedelta(minutes=i)
            if i % 2 == 0:
                path = tmp_path / f"{p.id}.jsonl"
                data = {"critic/score/mean": 0.5, "timing_s/step": 12.5, "perf/throughput": 2345.6}
                path.write_text(json.dumps({"step": i % 7 * 10, "data": data}) + "\n")
                store.ingest_metrics(p.id, path)
                store.set_held_at(p.id, end - timedelta(minutes=30 * (i + 1)))
            store.set_status(p.id, state, at=end, error="boom" if state == "failed" else None)
            i += 1


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'results.db'}"


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def lines(text: str) -> list[str]:
    """The lines of an output as printed (rich pads a table's title line with spaces: not kept here)."""
    return [line.rstrip() for line in text.splitlines()]


SMALL = """\
                                                                             runs
┏━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━┳━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━┳━━━━━┳━━━━━━━━━━━━━━━┳━━━━━━━┓
┃ sweep ┃ name    ┃ id     ┃ seed ┃ status    ┃ attempts ┃ step ┃ reward ┃ val acc ┃ queued ┃ run ┃ s/step ┃ tok/s/dev ┃ dev-h ┃ ETA ┃ started (UTC) ┃ error ┃
┡━━━━━━━╇━━━━━━━━━╇━━━━━━━━╇━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━━╇━━━━━╇━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━╇━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━┩
│ a     │ grpo-s0 │ r00000 │    0 │ succeeded │        0 │    0 │ 0.5000 │       - │      - │   - │   12.5 │     2,346 │  0.50 │   - │ -             │       │
│ a     │ grpo-s1 │ r00001 │    1 │ failed    │        0 │    - │      - │       - │      - │   - │      - │         - │     - │   - │ -             │ boom  │
│ b     │ grpo-s2 │ r00002 │    2 │ stopped   │        0 │   20 │ 0.5000 │       - │      - │   - │   12.5 │     2,346 │  1.50 │   - │ -             │       │
└───────┴─────────┴────────┴──────┴───────────┴──────────┴──────┴────────┴─────────┴────────┴─────┴────────┴───────────┴───────┴─────┴───────────────┴───────┘
3 runs: 1 succeeded, 1 failed, 1 stopped
"""


def test_a_small_store_prints_one_row_per_run_as_before(db, tmp_path):
    store = open_store(db)
    fill(store, tmp_path, {"a": ["succeeded", "failed"], "b": ["stopped"]})
    store.close()
    res = invoke("runs", "--db", db)
    assert res.exit_code == 0, res.output
    assert lines(res.output) == lines(SMALL)
    assert lines(invoke("runs", "--db", db, "--all").output) == lines(SMALL)


MANY = """\
                                   runs per sweep
┏━━━━━━━━┳━━━━━━┳━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━━━━━━━━┓
┃ sweep  ┃ runs ┃ succeeded ┃ failed ┃ stopped ┃ steps ┃ dev-h ┃ last started (UTC) ┃
┡━━━━━━━━╇━━━━━━╇━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━┩
│ big    │  150 │       140 │     10 │       - │  0-60 │  2812 │ -                  │
│ bigger │   60 │         - │      - │      60 │  0-60 │  2700 │ -                  │
└────────┴──────┴───────────┴────────┴─────────┴───────┴───────┴────────────────────┘
210 runs: 140 succeeded, 10 failed, 60 stopped
one row per sweep (more than 200 runs): `rpg runs --sweep NAME --status STATE` lists some, --all lists every run (--format csv or json: every run, every column)
"""


def test_many_runs_are_summarized_per_sweep_and_listed_on_request(db, tmp_path):
    store = open_store(db)
    fill(store, tmp_path, {"big": ["succeeded"] * 140 + ["failed"] * 10, "bigger": ["stopped"] * 60})
    store.close()
    res = invoke("runs", "--db", db)
    assert res.exit_code == 0, res.output
    assert lines(res.output) == lines(MANY)
    every = invoke("runs", "--db", db, "--all")
    assert every.exit_code == 0 and every.output.count("│ grpo-s") == 210
    assert every.output.endswith("\n210 runs: 140 succeeded, 10 failed, 60 stopped\n")  # no summary line
    assert len(json.loads(invoke("runs", "--db", db, "--format", "json").output)) == 210  # data: every run
    assert invoke("runs", "--db", db, "--format", "csv").output.count("\n") == 211
    narrowed = invoke("runs", "--db", db, "--status", "failed")  # 10 runs: listed
    assert narrowed.output.count("│ grpo-s") == 10 and "10 runs: 10 failed" in narrowed.output


def test_sweeps_summary_counts_states_steps_and_stalls():
    rows = [
        {"sweep": "s", "status": "running", "stalled_s": 300.0, "step": 4, "started": "2026-01-01 10:00:00"},
        {"sweep": "s", "status": "running", "stalled_s": None, "step": 9, "started": "2026-01-01 11:00:00"},
        {"sweep": "s", "status": "running", "stalled_s": None, "step": 2, "started": None, "device_hours": 1.25},
        {"sweep": "s", "status": "running", "stalled_s": None, "step": 3, "started": None, "device_hours": 0.5},
        {"sweep": "t", "status": "pending", "stalled_s": None, "step": None, "started": None},
    ]
    (s, t) = sweeps_summary(rows)
    assert (s["runs"], s["running"], s["stalled"], s["step_min"], s["step_max"]) == (4, 4, 1, 2, 9)
    assert s["device_hours"] == 1.75 and t["device_hours"] is None  # summed; none held: unknown, not 0
    assert s["started"] == "2026-01-01 11:00:00" and s["succeeded"] == 0
    assert (t["runs"], t["pending"], t["step_min"], t["started"]) == (1, 1, None, None)
    assert SUMMARIZE_ABOVE == 200
