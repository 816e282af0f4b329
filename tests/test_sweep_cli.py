"""`rpg sweep SPEC --dry-run`: the plan as a table or JSON, states from the store, and nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from run_inputs import write_inputs
from typer.testing import CliRunner

from rpg_cli.cli import app

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"


def rpg(*args: str, cwd: Path, **env_vars: str) -> subprocess.CompletedProcess:
    """The real command line, in a fresh interpreter, from `cwd`."""
    env = {**os.environ, "COLUMNS": "250", **env_vars}
    return subprocess.run(
        [sys.executable, "-m", "rpg_cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory holding copies of the shipped sweeps and the files their runs read, used as the
    working directory."""
    shutil.copytree(EXPERIMENTS, tmp_path / "experiments")
    for sweep_file in (tmp_path / "experiments").glob("*.yaml"):
        write_inputs(tmp_path, sweep_file)
    return tmp_path


def test_dry_run_table_lists_the_32_runs_and_writes_nothing(workdir):
    before = snapshot(workdir)
    result = rpg("sweep", "experiments/paper-qwen25-7b-instruct.yaml", "--dry-run", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert snapshot(workdir) == before  # no runs/, no results.db, nothing touched
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 32
    assert sum("rpg_reinforce" in r and "0.1/0.1" in r for r in rows) == 8
    assert all(r.rstrip().rstrip("│").rstrip().endswith("new") for r in rows)
    header = next(line for line in result.stdout.splitlines() if "algorithm" in line)
    for column in ("name", "id", "kl", "clip", "optimizer", "context", "seed", "state"):
        assert column in header
    assert "32 runs: 32 to submit (256 GPUs)" in result.stdout


def test_dry_run_json_shape_for_the_qwen3_grid(workdir):
    before = snapshot(workdir)
    result = rpg(
        "sweep",
        "experiments/paper-qwen3-4b.yaml",
        "--dry-run",
        "--format",
        "json",
        "--runs-dir",
        "elsewhere",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    assert snapshot(workdir) == before
    runs = json.loads(result.stdout)
    assert len(runs) == 20
    keys = {"id", "name", "spec", "state", "entrypoint", "validation", "scorers", "gpu_memory_gib", "disk_gb"}
    assert all(set(r) == keys | {"disk_peak_gb"} for r in runs)
    assert {r["disk_gb"] for r in runs} == {None}  # no config.json of the model here: not estimated
    assert all(isinstance(r["scorers"], str) and "dapo" in r["scorers"] for r in runs)  # the dry run's scorer line
    assert {r["validation"]["samples_per_problem"] for r in runs} == {32}  # no data here: problems not counted
    assert Counter(r["spec"]["context"] for r in runs) == {"2k": 6, "4k": 8, "8k": 6}
    assert {r["spec"]["algorithm"] for r in runs if r["spec"]["context"] == "8k"} == {
        "grpo",
        "dapo",
        "rpg",
        "rpg_reinforce",
    }
    assert len({r["id"] for r in runs}) == 20 and all(r["state"] == "new" for r in runs)
    for r in runs:
        assert r["name"].endswith(r["id"]) and len(r["id"]) == 8
        ep = r["entrypoint"]
        assert all(isinstance(a, str) for a in ep)
        assert ep[:3] == ["python", "-m", "rpg_cli.backends.verl.start"] and ep[7] == "--"
        run_dir = workdir / "elsewhere" / "paper-qwen3-4b" / r["name"]
        assert f"trainer.default_local_dir={run_dir / 'checkpoints'}" in ep  # the run's own directory


def test_json_spec_is_the_canonical_spec(workdir, monkeypatch):
    from rpg_cli.spec import ExperimentSpec

    monkeypatch.chdir(workdir)
    result = CliRunner().invoke(
        app,
        [
            "sweep",
            str(workdir / "experiments/paper-qwen3-4b.yaml"),
            "--dry-run",
            "--format",
            "json",
            "--backend",
            "local",
        ],
    )
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)
    assert len(runs) == 20
    for r in runs:
        spec = ExperimentSpec.model_validate(r["spec"])
        assert spec.run_id == r["id"] and spec.backend == "local"  # --backend overrides the spec's
        assert r["entrypoint"][2] == "rpg_cli.backends.local"


def test_spec_error_is_one_line_on_stderr_with_exit_2(tmp_path):
    text = (EXPERIMENTS / "paper-qwen3-4b.yaml").read_text().replace("lr: 1.0e-6", "lr: 0", 1)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = rpg("sweep", str(path), "--dry-run", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == [f"rpg sweep: {path}: base.lr: got 0; allowed: > 0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_missing_spec_and_bad_format_are_usage_errors(tmp_path):
    result = CliRunner().invoke(app, ["sweep", str(tmp_path / "nope.yaml"), "--dry-run"])
    assert result.exit_code == 2 and "no such file" in result.stderr
    result = CliRunner().invoke(app, ["sweep", str(EXPERIMENTS / "smoke.yaml"), "--dry-run", "--format", "csv"])
    assert result.exit_code == 2 and "allowed: table, json" in result.output + result.stderr


def test_states_come_from_the_store_when_the_database_exists(tmp_path, monkeypatch):
    from rpg_cli.orchestration.plan import plan_sweep
    from rpg_cli.spec import load_sweep
    from rpg_cli.store import open_store

    write_inputs(tmp_path, EXPERIMENTS / "smoke.yaml")
    monkeypatch.chdir(tmp_path)

    plans = plan_sweep(load_sweep(EXPERIMENTS / "smoke.yaml"), tmp_path / "runs")
    recorded = {plans[0].id: "succeeded", plans[1].id: "failed", plans[2].id: "running"}
    db = tmp_path / "results.db"
    url = f"sqlite:///{db}"
    args = ["sweep", str(EXPERIMENTS / "smoke.yaml"), "--dry-run", "--db", url, "--runs-dir", str(tmp_path / "runs")]

    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert {r["state"] for r in json.loads(result.stdout)} == {"new"} and not db.exists()  # no database: none made

    store = open_store(url)
    store.record_plans([p for p in plans if p.id in recorded])
    for run_id, state in recorded.items():
        store.set_status(run_id, state)
    store.close()
    before = snapshot(tmp_path)
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    states = {r["id"]: r["state"] for r in json.loads(result.stdout)}
    assert states == {p.id: recorded.get(p.id, "new") for p in plans}
    assert snapshot(tmp_path) == before  # read only

    result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0
    n = len(plans)
    assert (
        f"{n} runs: {n - 3} to submit" in result.stdout
        and "1 live to re-attach, 1 succeeded, 1 failed/stopped skipped" in result.stdout
        and "--retry-failed" in result.stdout
    )
    result = CliRunner().invoke(app, [*args, "--retry-failed"], env={"COLUMNS": "250"})
    assert f"{n} runs: {n - 2} to submit" in result.stdout


def test_dry_run_imports_no_heavy_package(workdir):
    code = (
        "import sys, runpy; sys.argv = ['rpg', 'sweep', 'experiments/paper-qwen25-7b-instruct.yaml', '--dry-run'];"
        "\ntry:\n    runpy.run_module('rpg_cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'ray', 'verl', 'transformers', 'omegaconf', 'sqlalchemy') "
        "if m in sys.modules)\nprint('HEAVY', heavy, file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in result.stderr, result.stderr


def hub_cache_with(root: Path, repo: str, config: dict) -> Path:
    """A Hugging Face hub cache holding `repo`'s config.json only (as a download leaves it)."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "snapshots" / "0").mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0")
    (folder / "snapshots" / "0" / "config.json").write_text(json.dumps(config))
    return root


def test_the_dry_run_sizes_each_run_and_refuses_one_that_cannot_fit(workdir, tmp_path):
    """Disk and per-GPU memory per run from the model's config.json in the HF cache (figures: footprint.py, whose
    own tests compute them by hand), the sweep's sum; GPUs too small for a run are refused with the knob."""
    from test_footprint import QWEN3_4B

    from rpg_cli.backends.verl import footprint, launch
    from rpg_cli.model_shape import shape_from_config
    from rpg_cli.spec import load_sweep

    cache = hub_cache_with(tmp_path / "hub", "Qwen/Qwen3-4B", QWEN3_4B)
    result = rpg(
        "sweep",
        "experiments/paper-qwen3-4b.yaml",
        "--dry-run",
        "--format",
        "json",
        cwd=workdir,
        HF_HUB_CACHE=str(cache),
    )
    assert result.returncode == 0, result.stderr
    runs = {r["id"]: r for r in json.loads(result.stdout)}
    shape = shape_from_config(QWEN3_4B)
    for spec in load_sweep(workdir / "experiments" / "paper-qwen3-4b.yaml").expand():
        memory = footprint.gpu_memory(spec, shape, launch.overrides(spec, Path("run")), 80.0)
        assert runs[spec.run_id]["gpu_memory_gib"] == round(memory.peak_gib, 1)
        assert runs[spec.run_id]["disk_gb"] == round(footprint.disk(spec, shape).run_gb, 1) == 370.1

    table = rpg("sweep", "experiments/paper-qwen3-4b.yaml", "--dry-run", cwd=workdir, HF_HUB_CACHE=str(cache))
    assert "disk (20 runs to submit): 7,402 GB of checkpoints when they end" in table.stdout
    assert "memory: at most ~46.9 GiB per GPU" in table.stdout

    small = workdir / "experiments" / "small-gpus.yaml"
    text = (workdir / "experiments" / "paper-qwen3-4b.yaml").read_text()
    small.write_text(
        text.replace(
            "resources: {nodes: 1, gpus_per_node: 8, cpus: 8}",
            "resources: {nodes: 1, gpus_per_node: 8, cpus: 8, gpu_memory_gib: 24}",
        )
    )
    assert "gpu_memory_gib: 24" in small.read_text()
    refused = rpg("sweep", str(small), "--dry-run", cwd=workdir, HF_HUB_CACHE=str(cache))
    assert refused.returncode == 2
    lines = [line for line in refused.stderr.splitlines() if "resources.gpu_memory_gib" in line]
    # on 24 GiB GPUs the 2k runs fit, the 4k runs fit with chunked entropy, the 8k runs with no one setting
    assert len(lines) == 2 and not [line for line in lines if "-2k-" in line]
    four, eight = sorted(lines, key=lambda line: "-8k-" in line)
    assert four.startswith("rpg sweep: error: 8 runs (") and "-4k-" in four
    assert four.endswith(
        "resources.gpu_memory_gib: ~25.4 of 24 GiB per GPU at its peak (log-prob): does not fit: "
        "set actor_rollout_ref.actor.entropy_from_logits_with_chunking=true (verl.site)"
    )
    assert eight.endswith(
        "~41.8 of 24 GiB per GPU at its peak (log-prob): does not fit: no one setting fits 4.02B parameters on "
        "8 GPU(s) of 24 GiB; allowed: more GPUs (resources.nodes x gpus_per_node) or a smaller model"
    )
