"""Issue 35, class 10: four small holes, each through the real CLI.

- A value that lands in an #SBATCH line (`--account`, `--partition`, `--sbatch-arg`, the paths rpg writes)
  with a blank, line break, quote, backslash or `#` would reach sbatch as something else (a second option,
  a comment): refused in one line naming the option.
- A `%` in the working directory's path is a Slurm filename pattern in --output (`%j`: the job id): rpg
  writes it as `%%`, which Slurm reads back as the path itself.
- `rpg runs` into a pipe or a file keeps every name whole, however long (it squeezed the name column to
  nothing beside a 100-character sweep name).
- `rpg sweep --detach` with nothing to submit says so, and what the runs are, instead of "submitted".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_bounds import BASE, write_data
from test_cancel import FakeRay
from test_slurm import dry_run as slurm_dry_run
from test_slurm import (
    write_sweep,
)
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan, plan_sweep
from rpg_cli.spec import load_sweep
from rpg_cli.store import open_store

# ------------------------------------------------------------------------------------ #SBATCH values


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--account", "lab --output=elsewhere.out"),  # the case: a second option
        ("--partition", "gpu --qos=high"),
        ("--sbatch-arg", "--comment=two words"),
        ("--sbatch-arg", '--comment="quoted"'),  # sbatch takes quotes away
        ("--account", "lab#1"),  # the rest of the line would be a comment
        ("--account", "lab\\x"),  # sbatch takes a backslash away
        ("--partition", "gpu\t--qos=high"),
        ("--sbatch-arg", "--qos=high\n#SBATCH --x"),
    ],
)
def test_a_value_sbatch_would_read_otherwise_is_refused_naming_its_option(no_slurm_here, option, value):
    spec = write_sweep(no_slurm_here, "tiny", "  algorithm: [grpo]")
    result = slurm_dry_run(str(spec), option, value)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rpg slurm: ") and option in lines[0], result.stderr
    assert result.stdout == ""


def test_values_without_them_still_go_through(no_slurm_here):
    spec = write_sweep(no_slurm_here, "tiny", "  algorithm: [grpo]")
    result = slurm_dry_run(str(spec), "--account", "lab-1", "--sbatch-arg=--qos=high", "--sbatch-arg=--comment=a,b")
    assert result.exit_code == 0, result.output
    directives = [line for line in result.stdout.splitlines() if line.startswith("#SBATCH")]
    assert {"#SBATCH --account=lab-1", "#SBATCH --qos=high", "#SBATCH --comment=a,b"} <= set(directives)


def slurm_expands(pattern: str, job_id: str) -> str:
    """A filename pattern as Slurm expands it (sbatch(1), "filename pattern"; Slurm's expand_stdio_fields):
    %% is %, %j the job id, %N the node, %u the user, %x the job name; another %c stays as written."""
    values = {"%": "%", "j": job_id, "N": "node1", "u": "someone", "x": "rpg-tiny"}
    return re.sub(r"%(\d*)(.)", lambda m: values.get(m.group(2), m.group(0)), pattern)


@pytest.mark.parametrize("directory", ["runs%j", "100%", "a%%b", "x%Nu%u"])
def test_a_percent_in_the_working_directory_reaches_slurm_as_itself(no_slurm_here, monkeypatch, directory):
    here = no_slurm_here / directory
    here.mkdir()
    monkeypatch.chdir(here)
    spec = write_sweep(here, "tiny", "  algorithm: [grpo]")
    result = slurm_dry_run(str(spec))
    assert result.exit_code == 0, result.output
    output = next(line for line in result.stdout.splitlines() if line.startswith("#SBATCH --output="))
    pattern = output.removeprefix("#SBATCH --output=")
    assert slurm_expands(pattern, "4242") == f"{here}/runs/tiny/slurm/slurm-4242.out", pattern
    assert pattern == f"{str(here).replace('%', '%%')}/runs/tiny/slurm/slurm-%j.out"
    check = subprocess.run(["/bin/bash", "-n"], input=result.stdout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("directory", ["run#1", "back\\slash", "two words", "it's"])
def test_a_working_directory_an_sbatch_line_cannot_carry_is_refused(no_slurm_here, monkeypatch, directory):
    here = no_slurm_here / directory
    here.mkdir()
    monkeypatch.chdir(here)
    spec = write_sweep(here, "tiny", "  algorithm: [grpo]")
    result = slurm_dry_run(str(spec))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(here) in lines[0] and "#SBATCH" in lines[0], result.stderr
    assert result.stdout == ""


# --------------------------------------------------------------------------- rpg runs into a pipe


def test_rpg_runs_into_a_pipe_keeps_every_name_whole(tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    sweep, name = "s" * 100, "r" * 60 + "-" + "n" * 39  # a 100-character sweep name and run name
    store = open_store(db)
    try:
        for i, run_name in enumerate([name, "short"]):
            plan = RunPlan(f"id{i:06d}", run_name, sweep, "local", {"seed": i}, tmp_path / "runs" / run_name, ["true"])
            store.record_plans([plan], sweep)
            store.set_status(plan.id, "failed", error="x" * 300)
    finally:
        store.close()

    for args in (["runs"], ["runs", "--wide"], ["runs", "--sweep", sweep]):
        result = CliRunner().invoke(app, [*args, "--db", db])
        assert result.exit_code == 0, result.output
        rows = [line for line in result.output.splitlines() if "id000000" in line]
        assert len(rows) == 1 and name in rows[0] and sweep in rows[0], result.output
        assert any("short" in line and "id000001" in line for line in result.output.splitlines())
        if "--wide" in args:
            assert "x" * 300 in rows[0]  # --wide: the reason whole too, on the run's own line

    piped = subprocess.run(  # the real thing: a pipe, not a terminal, whatever COLUMNS says
        [sys.executable, "-m", "rpg_cli", "runs", "--db", db],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        timeout=120,
    )
    assert piped.returncode == 0, piped.stderr
    assert any(name in line and sweep in line and "id000000" in line for line in piped.stdout.splitlines())


# ------------------------------------------------------------------------- rpg sweep --detach


@pytest.fixture
def recorded_sweep(tmp_path):
    """A two-seed sweep whose runs the store already has; a stand-in Ray head at --address (token set)."""
    data = write_data(tmp_path / "data")
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE.format(name="done", data=data) + "seeds: [0, 1]\n")
    runs = tmp_path / "runs"
    plans = plan_sweep(load_sweep(path), runs)
    ray = FakeRay({})
    yield path, f"sqlite:///{tmp_path / 'results.db'}", runs, plans, ray
    ray.close()


def detach(path: Path, db: str, runs: Path, ray: FakeRay):
    env = {"RAY_AUTH_TOKEN": ray.token}
    args = ["sweep", str(path), "--detach", "--db", db, "--runs-dir", str(runs), "--address", ray.url]
    return CliRunner().invoke(app, args, env=env)


def test_detach_with_nothing_to_submit_says_so(recorded_sweep):
    path, db, runs, plans, ray = recorded_sweep
    store = open_store(db)
    try:
        store.record_plans(plans, "done")
        for plan in plans:
            store.set_status(plan.id, "succeeded")
    finally:
        store.close()
    result = detach(path, db, runs, ray)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == "nothing to submit in done: 2 succeeded"
    assert "submitted" not in result.stdout


def test_detach_with_live_and_skipped_runs_says_what_they_are(recorded_sweep):
    path, db, runs, plans, ray = recorded_sweep
    live, failed = plans
    ray.jobs[live.id] = "RUNNING"
    store = open_store(db)
    try:
        store.record_plans(plans, "done")
        store.begin_attempt(live.id)
        store.set_status(live.id, "running", submission_id=live.id)
        store.set_status(failed.id, "failed", error="boom")
    finally:
        store.close()
    result = detach(path, db, runs, ray)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == (
        "nothing to submit in done: 1 live, 1 failed or stopped (--retry-failed reruns them); "
        "follow with `rpg runs --sweep done` or `rpg logs RUN --follow`"
    )
