"""The backends' registry: the registered names are the spec's and the CLI's choices, each backend's declared facts
(Slurm's CPUs and memory, who writes the trackers) with their defaults, and a stand-in backend registered in a fresh
process that runs a toy sweep through `rpg sweep` with no other edit (its dry run; a real sweep on a local head)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from rpg_cli.backends import registry
from rpg_cli.orchestration.slurm import allocation, run_cpus
from rpg_cli.spec import ExperimentSpec, SpecError, load_sweep
from rpg_cli.spec.errors import _validate

REPO = Path(__file__).resolve().parents[1]


def test_the_registered_names_and_their_launch_modules():
    assert registry.backend_names() == ["verl", "local"] and registry.allowed() == "verl, local"
    assert registry.get("local").__name__ == "rpg_cli.backends.local.launch"
    assert callable(registry.get("verl").entrypoint) and registry.NODE_BACKEND in registry.BACKENDS
    with pytest.raises(registry.UnknownBackend, match=r"^unknown backend 'vllm'; allowed: verl, local$"):
        registry.get("vllm")


def test_each_backend_declares_what_slurm_and_the_trackers_ask():
    # verl: 3 CPUs per GPU + 11 on each node and the whole node's memory; its trainer reports to the trackers
    assert registry.node_cpus("verl", 8, 1.0) == 35 and registry.run_mem_mb("verl") is None
    assert registry.node_cpus_rule("verl") == (3, 11) and not registry.writes_trackers("verl")
    # local: its spec's CPUs and 4 GB; its job writes the trackers with rpg's writers
    assert registry.node_cpus("local", 0, 1.5) == 2 and registry.run_mem_mb("local") == 4096
    assert registry.node_cpus_rule("local") is None and registry.writes_trackers("local")


def smoke_spec(**change) -> dict:
    return {**load_sweep(REPO / "experiments" / "smoke.yaml").expand()[0].canonical(), **change}


def test_the_spec_takes_the_registered_names_with_the_literal_error():
    assert _validate(ExperimentSpec, smoke_spec(backend="local")).backend == "local"
    for bad in ("vllm", 3, None):
        with pytest.raises(SpecError) as e:
            _validate(ExperimentSpec, smoke_spec(backend=bad))
        assert str(e.value) == f"backend: got {bad!r}; allowed: 'verl' or 'local'"


def test_a_backend_registered_later_is_a_spec_backend(monkeypatch):
    monkeypatch.setitem(registry.BACKENDS, "toy", "toy_backend.launch")  # never imported: the spec reads names only
    assert _validate(ExperimentSpec, smoke_spec(backend="toy")).backend == "toy"
    with pytest.raises(SpecError, match=r"^backend: got 'vllm'; allowed: 'verl', 'local' or 'toy'$"):
        _validate(ExperimentSpec, smoke_spec(backend="vllm"))


def test_a_slurm_allocation_is_sized_from_the_backends_facts():
    def plan(backend: str, gpus: int, cpus: float = 1.0) -> SimpleNamespace:
        return SimpleNamespace(backend=backend, num_cpus=cpus, spec={"resources": {"nodes": 1, "gpus_per_node": gpus}})

    assert run_cpus(plan("verl", 8)) == 35 and run_cpus(plan("local", 0, 2.0)) == 2
    assert allocation([plan("verl", 8)]).mem == "0"  # the whole node
    assert allocation([plan("local", 0), plan("local", 0)]).mem == f"{2 * 4096 + 2048}M"  # two at once, and Ray's
    with pytest.raises(Exception, match=r"needs 35 CPUs per node \(verl: 3 per GPU \+ 11; fewer and Ray waits"):
        allocation([plan("verl", 8)], cpus_per_node=32)


# ------------------------------------------------------------------------------------------------------------------
# A stand-in backend, in a fresh process: its package and its one line in the registry, nothing else edited

LAUNCH = '''
"""A stand-in backend: its job writes `steps` lines of metrics.jsonl and exits (the registry's interface, bare)."""
import sys
from pathlib import Path

JOB = str(Path(__file__).with_name("job.py"))


def entrypoint(spec, run_dir):
    return [sys.executable, JOB, str(run_dir), str(spec.steps)]


def resources(spec):
    return 1.0, 0.0


def env(spec, run_dir):
    return {"TOY_BACKEND": spec.run_id}
'''

JOB = """
import os, sys
from pathlib import Path
from rpg_cli import rundir

run_dir, steps = Path(sys.argv[1]), int(sys.argv[2])
log = rundir.MetricsLog(rundir.metrics_path(run_dir), keep_through=None)
for step in range(1, steps + 1):
    log.write(step, {"critic/score/mean": step / steps, "actor/pg_loss": -float(step)})
print("toy job", os.environ["TOY_BACKEND"], "finished", steps, "steps", flush=True)
"""

# rpg with the stand-in registered (here set before rpg starts, as its line in registry.py would be)
RPG = """
import runpy, sys
from rpg_cli.backends import registry

registry.BACKENDS["toy"] = "toy_backend.launch"
sys.argv = ["rpg", *sys.argv[1:]]
runpy.run_module("rpg_cli", run_name="__main__", alter_sys=True)
"""

SWEEP = """
name: toy
base:
  model: data/toy/model
  context: 2k
  data: {train_files: [data/toy/train.parquet]}
  train_batch_size: 8
  rollout_n: 8
  ppo_mini_batch_size: 4
  steps: 2
  optimizer: adamw
  lr: 5.0e-4
  algorithm: grpo
  beta: 1.0e-3
  kl: none
  clip: {eps_low: 0.2, eps_high: 0.28, c: 10.0}
  reference: frozen
  rollout: {engine: hf}
  save_every: 1
  backend: toy
  resources: {nodes: 1, gpus_per_node: 0, cpus: 1}
grid:
  seed: [0, 1]
"""


@pytest.fixture
def toy(tmp_path):
    package = tmp_path / "toy_backend"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch.py").write_text(textwrap.dedent(LAUNCH))
    (package / "job.py").write_text(textwrap.dedent(JOB))
    (tmp_path / "rpg.py").write_text(textwrap.dedent(RPG))
    (tmp_path / "toy.yaml").write_text(textwrap.dedent(SWEEP))
    runs, db = tmp_path / "runs", f"sqlite:///{tmp_path / 'results.db'}"

    def rpg(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, str(tmp_path / "rpg.py"), *args, "--runs-dir", str(runs), "--db", db]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)

    return SimpleNamespace(rpg=rpg, runs=runs, db=db)


def test_a_stand_in_backend_plans_a_sweep_with_no_other_edit(toy):
    result = toy.rpg("sweep", "toy.yaml", "--dry-run", "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    runs = json.loads(result.stdout)
    runs = runs["runs"] if isinstance(runs, dict) else runs
    assert len(runs) == 2 and {r["spec"]["backend"] for r in runs} == {"toy"}
    assert all(r["entrypoint"][1].endswith("toy_backend/job.py") for r in runs)
    assert not toy.runs.exists()  # a dry run writes nothing
    bad = toy.rpg("sweep", "toy.yaml", "--dry-run", "--backend", "nope")
    assert bad.returncode != 0 and "allowed: verl, local, toy" in bad.stdout + bad.stderr


def planned_ids(toy) -> list[str]:
    result = toy.rpg("sweep", "toy.yaml", "--dry-run", "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(result.stdout)
    return [r["id"] for r in (found["runs"] if isinstance(found, dict) else found)]


@pytest.mark.slow
@pytest.mark.cluster  # a real Ray head and a whole run: make test-cluster
def test_a_stand_in_backend_runs_a_sweep_to_succeeded_on_a_local_head(toy):
    pytest.importorskip("ray.job_submission", reason="rpg sweep needs ray[default]")
    from rpg_cli.orchestration.head import _head_dir, _temp_dir, local_head, stop_local_head
    from rpg_cli.store import open_store, run_states

    ids = planned_ids(toy)
    temp_dir = _temp_dir(_head_dir(toy.runs))
    try:
        try:
            local_head(toy.runs, num_cpus=2)
        except Exception as e:  # a sandbox without Ray's ports or shared memory
            pytest.skip(f"a local Ray head cannot start here: {str(e).splitlines()[0][:120]}")
        result = toy.rpg("sweep", "toy.yaml", timeout=240)
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        stop_local_head(toy.runs)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert run_states(toy.db, ids) == dict.fromkeys(ids, "succeeded")
    store = open_store(toy.db)
    try:
        for run_id in ids:
            assert store.latest(run_id) == (2, {"critic/score/mean": 1.0, "actor/pg_loss": -2.0})
    finally:
        store.close()
    logs = sorted(toy.runs.glob("toy/*/job.log"))
    assert len(logs) == 2 and all("finished 2 steps" in p.read_text() for p in logs)
