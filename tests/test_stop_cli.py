"""`rpg stop`: stops the local Ray head, but not under live jobs unless forced."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import open_store


def test_stop_without_a_head_says_so(tmp_path):
    result = CliRunner().invoke(
        app, ["stop", "--runs-dir", str(tmp_path / "runs"), "--db", f"sqlite:///{tmp_path}/r.db"]
    )
    assert result.exit_code == 0 and "no local Ray head is running" in result.output
    assert not (tmp_path / "r.db").exists()  # looking for live runs creates no database


def test_stop_is_not_held_back_by_runs_only_the_store_calls_live(tmp_path):
    """A run recorded as running whose head is gone (it finished, or died with the head) blocks
    nothing: only jobs the head reports live do (tests/test_jobs.py checks that refusal)."""
    url = f"sqlite:///{tmp_path}/r.db"
    store = open_store(url)
    plan = RunPlan(
        id="abcd1234",
        name="grpo-x-abcd1234",
        sweep="s",
        backend="local",
        spec={},
        run_dir=Path(tmp_path / "runs/s/grpo-x-abcd1234"),
        entrypoint=["true"],
    )
    store.record_plans([plan], "s")
    store.set_status(plan.id, "running")
    store.close()
    result = CliRunner().invoke(app, ["stop", "--runs-dir", str(tmp_path / "runs"), "--db", url])
    assert result.exit_code == 0 and "no local Ray head is running" in result.output
