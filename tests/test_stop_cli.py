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


def test_the_step_a_graceful_stop_would_save_after_is_the_current_attempts(tmp_path):
    """`rpg cancel --graceful` asks only a run that trained in this attempt: the steps after its last restart
    line (a resumed attempt writes one first); a torn last line (being written) is skipped."""
    from rpg_cli import rundir
    from rpg_cli.orchestration.cancel import attempt_step

    path = tmp_path / "metrics.jsonl"
    assert attempt_step(path) is None  # no file yet
    path.write_text("".join(f'{{"step": {s}, "data": {{}}}}\n' for s in range(4)))
    assert attempt_step(path) == 3
    with open(path, "a") as f:
        f.write(rundir.restart_line(2))
    assert attempt_step(path) is None  # resumed, nothing logged since
    with open(path, "a") as f:
        f.write('{"step": 3, "data": {}}\n{"step": 4, "da')
    assert attempt_step(path) == 3
    with open(path, "a") as f:
        f.write('ta": {}}\n' + rundir.stopped_line(4, rundir.CANCELLED))
    assert attempt_step(path) == 4


def test_graceful_cancel_of_nothing_known_is_one_line(tmp_path):
    url = f"sqlite:///{tmp_path}/r.db"
    open_store(url).close()
    result = CliRunner().invoke(
        app, ["cancel", "nope", "--graceful", "--db", url, "--runs-dir", str(tmp_path / "runs")]
    )
    assert result.exit_code == 2
    assert result.output.strip() == "rpg cancel: no run or sweep 'nope' in the store; `rpg runs` lists them"
