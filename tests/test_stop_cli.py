"""`rpg stop`: stops the local Ray head, but not under live runs unless forced."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import open_store


def test_stop_without_a_head_says_so(tmp_path):
    result = CliRunner().invoke(app, ["stop", "--runs-dir", str(tmp_path / "runs"), "--db", f"sqlite:///{tmp_path}/r.db"])
    assert result.exit_code == 0 and "no local Ray head is running" in result.output
    assert not (tmp_path / "r.db").exists()  # looking for live runs creates no database


def test_stop_refuses_while_runs_are_live(tmp_path):
    url = f"sqlite:///{tmp_path}/r.db"
    store = open_store(url)
    plan = RunPlan(id="abcd1234", name="grpo-x-abcd1234", sweep="s", backend="local", spec={},
                   run_dir=Path(tmp_path / "runs/s/grpo-x-abcd1234"), entrypoint=["true"])
    store.record_plans([plan], "s")
    store.set_status(plan.id, "running")
    store.close()
    args = ["stop", "--runs-dir", str(tmp_path / "runs"), "--db", url]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "1 run(s) are live (grpo-x-abcd1234); `rpg cancel` them first, or pass --force" in result.output
    forced = CliRunner().invoke(app, [*args, "--force"])
    assert forced.exit_code == 0 and "no local Ray head is running" in forced.output
