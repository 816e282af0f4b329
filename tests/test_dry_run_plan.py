"""orchestration/dryrun.py: a sweep's plan is made once and acted on as made. Its states are read once, its
inputs checked once and its cluster decided once, by the dry run and by the submission alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration import dryrun, preflight, sweep
from rpg_cli.orchestration.plan import RunPlan

SMOKE = Path(__file__).resolve().parents[1] / "experiments" / "smoke.yaml"


def counted(monkeypatch, module, name: str) -> list:
    """`module.name` wrapped to record each call's arguments; the list of calls."""
    calls, real = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


class Cluster:
    """A stand-in Ray cluster: no jobs, and a record of what is submitted."""

    def __init__(self) -> None:
        self.submitted: list[dict] = []

    def list_jobs(self):
        return []

    def submit_job(self, **kwargs):
        self.submitted.append(kwargs)


@pytest.fixture
def cluster(monkeypatch) -> tuple[Cluster, list]:
    """The stand-in as the cluster `rpg sweep` connects to, and how each connect asked for it: (address, local)."""
    stand_in, asked = Cluster(), []

    def connect(address=None, runs_dir=None, start=True, local=False):
        asked.append((address, local))
        return stand_in

    monkeypatch.setattr(sweep, "connect", connect)
    return stand_in, asked


def hand_plans(runs: Path, n: int = 2) -> list[RunPlan]:
    return [
        RunPlan(f"r{i}", f"r{i}", "s", "local", {"seed": i}, runs / "s" / f"r{i}", ["python", "-c", "pass"])
        for i in range(n)
    ]


def test_a_submission_acts_on_its_plan_reading_states_and_checking_inputs_once(tmp_path, monkeypatch, cluster):
    stand_in, _ = cluster
    states = counted(monkeypatch, dryrun, "known_states")
    checks = counted(monkeypatch, dryrun, "check_plans")
    db, runs = f"sqlite:///{tmp_path / 'results.db'}", tmp_path / "runs"

    planned = dryrun.plan_runs(hand_plans(runs), db)
    final = sweep.run_sweep(planned, "s", db, runs_dir=runs, detach=True)

    assert (len(states), len(checks)) == (1, 1)
    assert len(stand_in.submitted) == 2 and {r.status for r in final.runs} == {"submitted"}
    # without a plan, run_sweep makes one: once too
    sweep.run_sweep(hand_plans(runs, 3), "s", db, runs_dir=runs, detach=True)
    assert (len(states), len(checks)) == (2, 2)


def test_the_cluster_is_decided_once_by_the_plan(tmp_path, monkeypatch, cluster):
    _, asked = cluster
    credentials = counted(monkeypatch, sweep, "head_env_names")  # asked of rpg's own local head only
    db, runs = f"sqlite:///{tmp_path / 'results.db'}", tmp_path / "runs"

    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    remote = dryrun.plan_runs(hand_plans(runs)[:1], db)
    monkeypatch.delenv("RAY_ADDRESS")  # changed after the plan was made: the plan stands
    sweep.run_sweep(remote, "s", db, runs_dir=runs, detach=True)
    assert (remote.address, remote.local_head) == ("http://head:8265", False)
    assert asked == [("http://head:8265", False)] and credentials == []

    local = dryrun.plan_runs(hand_plans(runs)[1:], db)
    monkeypatch.setenv("RAY_ADDRESS", "http://elsewhere:8265")
    sweep.run_sweep(local, "s", db, runs_dir=runs, detach=True)
    assert local.local_head and asked[-1] == (None, True) and len(credentials) == 1

    assert dryrun.plan_runs(hand_plans(runs), db, address="http://given:8265").address == "http://given:8265"


@pytest.mark.parametrize("output", ["table", "json"])
def test_the_dry_run_reads_states_checks_inputs_and_runs_check_once(tmp_path, monkeypatch, output):
    states = counted(monkeypatch, dryrun, "known_states")
    checks = counted(monkeypatch, dryrun, "check_plans")
    configs = counted(monkeypatch, preflight, "check_configs")
    db = f"sqlite:///{tmp_path / 'results.db'}"

    args = ["sweep", str(SMOKE), "--dry-run", "--check", "--backend", "local", "--db", db, "--format", output]
    result = CliRunner().invoke(app, args)

    assert result.exit_code in (0, 2), result.output  # 2: the smoke grid's data may be missing here
    assert (len(states), len(checks), len(configs)) == (1, 1, 1)
    assert not (tmp_path / "results.db").exists()  # a dry run writes nothing


def test_a_store_the_dry_run_cannot_read_shows_unknown_states_and_a_submission_refuses(tmp_path):
    plans, bad = hand_plans(tmp_path / "runs"), "postgresql://u:p@127.0.0.1:1/none"

    shown = dryrun.plan_runs(plans, bad, dry_run=True)
    assert set(shown.states.values()) == {"unknown"} and shown.unread.startswith(f"cannot read run states from {bad}")

    with pytest.raises(Exception) as refused:
        dryrun.plan_runs(plans, bad)
    assert "127.0.0.1" in str(refused.value)
