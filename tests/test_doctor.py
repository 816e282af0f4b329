"""`rpg doctor` and the node checks behind it (backends/verl/node.py): the real CLI on this (CPU) machine, stand-in
nodes that have or lack each piece, a sweep's inputs, a verl job refusing to start verl on a node without
flash-attn (the line `rpg runs` shows), and `rpg sweep`'s check of a real local Ray head's GPU nodes."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from conftest import make_spec, spec_dict
from typer.testing import CliRunner

from rpg_cli import gpu_stack
from rpg_cli.backends.verl import node
from rpg_cli.backends.verl.node import Facts, NodeReport
from rpg_cli.cli import app

INSTALL = "(README, Install)"
H100 = ("NVIDIA H100 80GB HBM3", 80 * 2**30)


def gpu_node(**changes) -> Facts:
    """A GPU node with everything verl needs, at the versions rpg_cli/gpu_stack.py pins; `changes` replace fields
    (`versions={...}` is merged into the installed versions)."""
    versions = {
        "torch": f"{gpu_stack.TORCH}+cu130",
        "vllm": gpu_stack.VLLM,
        "verl": gpu_stack.VERL,
        "transformers": gpu_stack.TRANSFORMERS,
        "ray": gpu_stack.RAY,
        "flash-attn": "2.8.3",
        **changes.pop("versions", {}),
    }
    facts = Facts(
        python=(*gpu_stack.PYTHON_MAX, 3),
        glibc="2.35",
        versions=versions,
        platform="nvidia/cuda",
        torch_cuda=gpu_stack.TORCH_CUDA,
        gpus=[H100] * 8,
        nccl="2.27.3",
        driver=f"{gpu_stack.DRIVER_MIN}.65.06",
        driver_how="nvidia-smi",
    )
    return dataclasses.replace(facts, **changes)


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A working directory of the test's own, with an HF cache in it and no cluster."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path


def doctor(*args: str):
    """`rpg doctor ARGS`: its result, which ended by exiting (no exception, no traceback)."""
    result = CliRunner().invoke(app, ["doctor", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def stand_in(monkeypatch, facts: Facts) -> list:
    """Every node check reads `facts` (node.facts is what gathers them); returns the calls' arguments."""
    calls = []

    def read(flash_attention=True, env=None, plugin="", ray_gpus=None):
        calls.append({"flash_attention": flash_attention, "env": env, "plugin": plugin})
        return dataclasses.replace(facts, ray_gpus=ray_gpus)

    monkeypatch.setattr(node, "facts", read)
    return calls


def write_inputs(root: Path) -> tuple[Path, Path]:
    """A model directory (config.json only: prompts are not counted) and a one-row training file verl can read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 4096}))
    data = root / "data"
    data.mkdir()
    rows = [
        {
            "prompt": [{"role": "user", "content": f"{i}+1="}],
            "reward_model": {"ground_truth": str(i + 1)},
            "data_source": "toy_add",
        }
        for i in range(8)
    ]
    pq.write_table(pa.Table.from_pylist(rows), data / "train.parquet")
    return model, data / "train.parquet"


def write_sweep(root: Path, **base) -> Path:
    path = root / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "doc", "base": spec_dict(**base)}))
    return path


# ------------------------------------------------------------------------------------------ this machine


def test_this_cpu_node_lacks_what_verl_runs_need_and_says_so_in_lines(here):
    """The real CLI, nothing stood in: every check says one line; a node without a GPU is missing CUDA."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CPU node's lines do not apply")
    result = doctor("--runs-dir", str(here / "runs"))
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    names = [line[9:].split(":", 1)[0] for line in lines]
    assert names == [
        "Python",
        "glibc",
        "NVIDIA driver",
        "torch",
        "CUDA",
        "NCCL",
        "verl",
        "rpg plugin",
        "vLLM",
        "flash-attn",
        "transformers",
        "ray",
        "data dir",
        "runs dir",
        "HF cache",
    ]
    version = ".".join(map(str, sys.version_info[:3]))
    low, high = (".".join(map(str, v)) for v in (gpu_stack.PYTHON_MIN, gpu_stack.PYTHON_MAX))
    assert f"ok       Python: {version} (verl {gpu_stack.VERL} runs on {low} to {high})" in lines
    assert (
        f"missing  CUDA: torch {torch.__version__} sees no GPU; verl runs need NVIDIA GPUs (the local backend runs here)"
        in lines
    )
    assert (
        f"ok       runs dir: {here}/runs does not exist yet (`rpg sweep` creates it; the same path on every node)"
        in lines
    )
    assert f"ok       HF cache: {here}/hf does not exist yet" in result.output
    assert all(line.split()[0] in ("ok", "missing", "warn") for line in lines)


# ------------------------------------------------------------------------------------------ stand-in nodes


def test_a_gpu_node_with_everything_passes(here, monkeypatch):
    calls = stand_in(monkeypatch, gpu_node())
    result = doctor()
    assert result.exit_code == 0, result.output
    assert "ok       CUDA: 8 GPU(s): 8 x NVIDIA H100 80GB HBM3 (80.0 GiB)" in result.output.splitlines()
    assert "ok       flash-attn: 2.8.3" in result.output.splitlines()
    # without a sweep: verl's default attention (flash-attn checked), the plugin loaded as a job loads it
    assert calls == [{"flash_attention": True, "env": None, "plugin": "rpg_cli.backends.verl.plugin"}]


def test_json_prints_one_record_per_check(here, monkeypatch):
    stand_in(monkeypatch, gpu_node(gpus=[]))
    text, as_json = doctor(), doctor("--json")
    records = [json.loads(line) for line in as_json.output.splitlines()]
    assert as_json.exit_code == text.exit_code == 1
    assert [r["name"] for r in records] == [line[9:].split(":", 1)[0] for line in text.output.splitlines()]
    assert next(r for r in records if r["name"] == "CUDA") == {
        "status": "missing",
        "name": "CUDA",
        "ok": False,
        "needed": True,
        "detail": f"torch {gpu_stack.TORCH}+cu130 sees no GPU",
        "fix": "verl runs need NVIDIA GPUs (the local backend runs here)",
    }


FLASH_FIX = (
    f"build flash-attn {gpu_stack.FLASH_ATTN} against this torch on every node {INSTALL}, "
    "or set +actor_rollout_ref.model.override_config.attn_implementation=sdpa in the spec's verl.site"
)


@pytest.mark.parametrize(
    "changes, line",
    [
        (
            {"versions": {"flash-attn": None}},
            "missing  flash-attn: flash-attn is not installed (verl loads models with flash_attention_2); " + FLASH_FIX,
        ),
        (
            {"flash_attn_error": "ImportError: undefined symbol: _ZN3c104cuda9SetDeviceEi"},
            "missing  flash-attn: flash-attn 2.8.3 does not import: ImportError: undefined symbol: "
            "_ZN3c104cuda9SetDeviceEi; " + FLASH_FIX,
        ),
        (
            {"driver": "550.54.15"},
            f"missing  NVIDIA driver: NVIDIA driver 550.54.15 is older than {gpu_stack.DRIVER_MIN}, CUDA "
            f"{gpu_stack.TORCH_CUDA}'s minimum: torch {gpu_stack.TORCH} installs and sees no GPU; upgrade the driver "
            f"to >= {gpu_stack.DRIVER_MIN} on every node {INSTALL}",
        ),
        (
            {"python": (3, 13, 1)},
            f"missing  Python: Python 3.13.1 is outside {'.'.join(map(str, gpu_stack.PYTHON_MIN))} to "
            f"{'.'.join(map(str, gpu_stack.PYTHON_MAX))}, which verl {gpu_stack.VERL} and its GPU stack install on; "
            f"create the environment with Python {'.'.join(map(str, gpu_stack.PYTHON_MIN))} to "
            f"{'.'.join(map(str, gpu_stack.PYTHON_MAX))} on every node {INSTALL}",
        ),
        (
            {"versions": {"vllm": None}},
            "missing  vLLM: vLLM is not installed (verl rolls out with it); pip install -r requirements/gpu.txt "
            f"(vLLM {gpu_stack.VLLM}) on every node {INSTALL}",
        ),
        (
            {
                "plugin_error": "the rpg verl plugin does not load: ModuleNotFoundError: No module named 'verl.x'; "
                "install verl (pip install -r requirements/gpu.txt on a GPU node, or -e '.[verl]')",
                "platform": None,
            },
            "missing  rpg plugin: the rpg verl plugin does not load: ModuleNotFoundError: No module named 'verl.x'; "
            "install verl (pip install -r requirements/gpu.txt on a GPU node, or -e '.[verl]')",
        ),
        (
            {"gpus": []},
            f"missing  CUDA: torch {gpu_stack.TORCH}+cu130 sees no GPU; verl runs need NVIDIA GPUs (the local backend "
            "runs here)",
        ),
    ],
    ids=["no-flash-attn", "flash-attn-broken", "driver-550", "python-3.13", "no-vllm", "plugin-broken", "no-gpu"],
)
def test_a_node_that_lacks_a_piece_is_missing_it_in_one_line_and_exits_1(here, monkeypatch, changes, line):
    stand_in(monkeypatch, gpu_node(**changes))
    result = doctor()
    assert result.exit_code == 1, result.output
    assert line in result.output.splitlines(), result.output
    assert [row for row in result.output.splitlines() if row.startswith("missing")] == [line]


def test_a_version_other_than_the_pinned_one_is_a_warning_but_verls_is_missing():
    lines = {c.name: c for c in node.checks(gpu_node(versions={"transformers": "5.10.4", "verl": "0.8.0"}))}
    assert lines["transformers"].status == "warn" and "not " + gpu_stack.TRANSFORMERS in lines["transformers"].detail
    assert lines["verl"].status == "missing"
    assert [c.name for c in node.checks(gpu_node()) if not c.ok] == []


def test_where_verls_platform_is_not_nvidia_no_gpu_driver_or_flash_attn_is_demanded():
    """The e2e's CPU stand-in platform (tests/e2e/stand_ins.py, loaded through the job's VERL_USE_EXTERNAL_MODULES):
    the NVIDIA checks do not apply, and the node passes."""
    cpu = gpu_node(platform="cpu/cpu", gpus=[], driver=None, torch_cuda=None, nccl=None, versions={"flash-attn": None})
    found = {c.name: c for c in node.checks(cpu)}
    for name in ("NVIDIA driver", "CUDA", "NCCL", "flash-attn"):
        assert found[name].ok and "verl's platform here is cpu/cpu" in found[name].detail, found[name]
    assert node.refusal([NodeReport("127.0.0.1", 1.0, list(found.values()))], 1, 1) is None


def test_facts_read_verls_platform_and_vllm_with_the_jobs_modules(monkeypatch):
    """The probe (diagnose.check_plugin_loads) runs with the job's environment, rpg's plugin among its modules."""
    seen = {}

    def probe(plugin, env=None, node=False, timeout_s=120.0):
        seen.update(plugin=plugin, modules=env["VERL_USE_EXTERNAL_MODULES"], node=node, path=env.get("PATH"))
        return {"vendor": "cpu", "device": "cpu", "vllm": f"{gpu_stack.VLLM}+cpu"}

    monkeypatch.setattr(node.diagnose, "check_plugin_loads", probe)
    found = node.facts(flash_attention=True, env={"VERL_USE_EXTERNAL_MODULES": "stand_ins"}, plugin="p.plugin")
    assert seen == {"plugin": "p.plugin", "modules": "stand_ins,p.plugin", "node": True, "path": os.environ["PATH"]}
    assert found.platform == "cpu/cpu" and not found.nvidia
    assert {c.name: c.status for c in node.checks(found)}["vLLM"] == "ok"  # 0.24.0+cpu is vLLM's CPU build


def test_the_runs_attention_decides_whether_flash_attn_is_checked():
    site = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"  # tests/e2e's verl.site
    assert node.uses_flash_attention(["a=1"]) and not node.uses_flash_attention(["a=1", site])
    assert node.uses_flash_attention([site.replace("sdpa", "flash_attention_2")])
    assert node.gpus_per_node(["trainer.nnodes=2", "trainer.n_gpus_per_node=4"]) == (2, 4)
    found = node.checks(gpu_node(versions={"flash-attn": None}), flash_attention=False)
    assert {c.name: c.ok for c in found}["flash-attn"]


def test_refusals_name_the_first_node_and_what_it_lacks():
    good = NodeReport("10.0.0.2", 8.0, node.checks(gpu_node()))
    bad = NodeReport("10.0.0.3", 8.0, node.checks(gpu_node(versions={"flash-attn": None, "vllm": None})))
    assert node.refusal([]).startswith("the Ray cluster has no GPU node; ")
    assert node.refusal([good, bad], 1, 8) == (
        "node 10.0.0.3: vLLM is not installed (verl rolls out with it); pip install -r requirements/gpu.txt "
        f"(vLLM {gpu_stack.VLLM}) on every node {INSTALL} (and 1 more: `rpg doctor` on the node lists them)"
    )
    assert node.refusal([good], 1, 8) is None
    assert node.refusal([good], 2, 8).startswith("the run needs 2 node(s) with 8 GPUs each; ")
    few = NodeReport("10.0.0.4", 8.0, node.checks(gpu_node(gpus=[H100] * 4, ray_gpus=8.0)))
    assert node.refusal([few], 1, 8) == (
        "node 10.0.0.4: torch sees 4 GPU(s) but the node declares 8 to Ray; check CUDA_VISIBLE_DEVICES and "
        "`nvidia-smi` there, or start its Ray with --num-gpus it has"
    )


class Jobs:
    """A Jobs API client stand-in: every job ends as `status` with `log`."""

    def __init__(self, log: str, status: str = "SUCCEEDED"):
        self.log, self.status, self.submitted, self.stopped, self.deleted = log, status, [], [], []

    def submit_job(self, **job):
        self.submitted.append(job)

    def get_job_status(self, submission_id):
        return self.status

    def get_job_logs(self, submission_id):
        return self.log

    def stop_job(self, submission_id):
        self.stopped.append(submission_id)

    def delete_job(self, submission_id):
        self.deleted.append(submission_id)


def node_log(*reports: NodeReport) -> str:
    lines = ["Ray: connecting", *(node.LINE_PREFIX + json.dumps(r.as_dict()) for r in reports), node.DONE_LINE]
    return "\n".join(lines) + "\n"


def test_the_sweeps_node_job_runs_once_per_platform_environment_and_reads_each_nodes_line():
    sdpa = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
    cuda = {"VERL_USE_EXTERNAL_MODULES": "rpg_cli.backends.verl.plugin", "VERL_FILE_LOGGER_PATH": "a/metrics.jsonl"}
    cpu = {"VERL_USE_EXTERNAL_MODULES": "stand_ins,rpg_cli.backends.verl.plugin", "PYTHONPATH": "tests/e2e"}
    runs = [(["trainer.n_gpus_per_node=1"], cuda), ([sdpa], {**cuda, "X": "1"}), ([sdpa], cpu)]
    client = Jobs(node_log(NodeReport("10.0.0.2", 8.0, node.checks(gpu_node()))))
    node.check_cluster(client, runs, "rpg_cli.backends.verl.plugin")
    assert [job["runtime_env"]["env_vars"] for job in client.submitted] == [cuda, cpu]  # the first run's of each
    assert ["--flash-attention" in job["entrypoint"] for job in client.submitted] == [True, False]
    assert all(job["entrypoint_num_cpus"] == 0 for job in client.submitted)
    assert len(client.deleted) == 2  # Ray's job list keeps the runs' jobs only

    lacking = NodeReport("10.0.0.3", 8.0, node.checks(gpu_node(versions={"flash-attn": None})))
    with pytest.raises(RuntimeError, match=r"^node 10\.0\.0\.3: flash-attn is not installed"):
        node.check_cluster(Jobs(node_log(lacking)), runs[:1], "rpg_cli.backends.verl.plugin")
    with pytest.raises(RuntimeError, match="^the Ray cluster has no GPU node; "):
        node.check_cluster(Jobs(node_log()), runs[:1], "rpg_cli.backends.verl.plugin")


def test_the_sweeps_node_job_is_bounded_and_its_failure_is_one_line(monkeypatch):
    monkeypatch.setattr(node, "JOB_START_S", 0.0)
    stuck = Jobs("", status="RUNNING")
    with pytest.raises(RuntimeError) as late:
        node.check_cluster(stuck, [], "p", timeout_s=0.0, poll_s=0.0)
    assert str(late.value).startswith("the check of the cluster's GPU nodes did not finish in 0 s (Ray job rpg-node")
    assert len(stuck.stopped) == 1
    broken = Jobs("Traceback (most recent call last):\nModuleNotFoundError: No module named 'rpg_cli'\n", "FAILED")
    with pytest.raises(RuntimeError) as failed:
        node.check_cluster(broken, [], "p")
    assert str(failed.value) == (
        "the check of the cluster's GPU nodes failed: ModuleNotFoundError: No module named 'rpg_cli'; is rpg-cli "
        "installed there?"
    )


# ---------------------------------------------------------------------------------------------- a sweep


def test_a_sweep_of_local_runs_needs_no_gpu_and_passes_here(here):
    model, train = write_inputs(here)
    sweep = write_sweep(here, model=str(model), data={"train_files": [str(train)]})
    result = doctor(str(sweep), "--runs-dir", str(here / "runs"))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert not [line for line in lines if line.split(":")[0].split()[-1] in ("CUDA", "vLLM", "flash-attn")]
    assert f"ok       data dir: {here}/data is writable (the same path on every node)" in lines
    assert f"ok       model: {model} present here" in lines


def test_a_verl_sweep_naming_an_absent_model_is_missing_it(here, monkeypatch):
    stand_in(monkeypatch, gpu_node())  # a GPU node with everything: only the model is missing
    _, train = write_inputs(here)
    absent = here / "no-such-model"
    sweep = write_sweep(
        here,
        model=str(absent),
        data={"train_files": [str(train)]},
        backend="verl",
        resources={"nodes": 1, "gpus_per_node": 1, "cpus": 1},
        verl={"site": ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa"]},
    )
    result = doctor(str(sweep), "--runs-dir", str(here / "runs"))
    assert result.exit_code == 1, result.output
    missing = [line for line in result.output.splitlines() if line.startswith("missing")]
    assert len(missing) == 1 and missing[0].startswith(f"missing  model: {absent} does not exist; "), result.output
    assert "ok       flash-attn: not needed" in result.output  # the sweep loads its model with sdpa


def test_a_bad_spec_is_one_line_and_exit_2(here):
    (here / "bad.yaml").write_text("name: doc\nbase: {algorithm: nope}\n")
    result = doctor(str(here / "bad.yaml"))
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert result.output.startswith("rpg doctor: ") and "algorithm" in result.output


# -------------------------------------------------------------------------------------- the job's check


def run_start(monkeypatch, capsys, facts: Facts, overrides: list[str]) -> tuple[list, list]:
    """`python -m rpg_cli.backends.verl.start` in a Ray job whose one GPU node has `facts` (the wait stood in);
    returns (what it printed, what it did: released a lease, exec'd main_ppo)."""
    import ray

    from rpg_cli.backends.verl import admission, start

    did = []
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setattr(start, "wait_for_gpus", lambda gpus, run: did.append("wait"))
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # the session the wait leaves open
    monkeypatch.setattr(ray, "shutdown", lambda: did.append("shutdown"))
    monkeypatch.setattr(
        node,
        "gpu_node_reports",
        lambda flash, plugin, timeout_s: [NodeReport("10.0.0.3", 1.0, node.checks(facts, flash))],
    )
    monkeypatch.setattr(admission, "release_lease", lambda run: did.append(f"release {run}"))
    monkeypatch.setattr(start.os, "execv", lambda path, argv: did.append("exec"))
    try:
        start.main(["--gpus", "1", "--run", "rpg-1a2b3c4d", "--", "trainer.n_gpus_per_node=1", *overrides])
    except SystemExit as exc:
        did.append(f"exit {exc.code}")
    return capsys.readouterr().out.splitlines(), did


def test_a_job_on_a_node_without_flash_attn_fails_with_the_line_rpg_runs_shows(monkeypatch, capsys):
    from rpg_cli.orchestration.plan import failure_reason

    printed, did = run_start(monkeypatch, capsys, gpu_node(versions={"flash-attn": None}), [])
    assert did == ["wait", "release rpg-1a2b3c4d", "shutdown", "exit 1"]  # verl never starts
    log = "\n".join(["rpg (before verl starts): 1 GPU(s) free, reserving 1", *printed, ""])
    assert failure_reason("verl", log) == (
        "node 10.0.0.3: flash-attn is not installed (verl loads models with flash_attention_2); " + FLASH_FIX
    )
    assert len(printed) == 1


def test_a_job_that_sets_sdpa_or_runs_on_another_platform_starts_verl(monkeypatch, capsys):
    sdpa = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
    _, did = run_start(monkeypatch, capsys, gpu_node(versions={"flash-attn": None}), [sdpa])
    assert did == ["wait", "shutdown", "exec"]
    cpu = gpu_node(platform="cpu/cpu", gpus=[], driver=None, torch_cuda=None, nccl=None)  # the e2e's stand-in
    _, did = run_start(monkeypatch, capsys, cpu, [])
    assert did == ["wait", "shutdown", "exec"]


# ------------------------------------------------------------------------------------------ a real Ray head


def _head(tmp_path_factory, gpus: int):
    pytest.importorskip("ray.job_submission", reason="the Ray tests need ray[default]")
    from rpg_cli.orchestration.head import _head_dir, _temp_dir, local_head, stop_local_head

    runs = tmp_path_factory.mktemp("doctor") / "runs"
    temp_dir = str(_temp_dir(_head_dir(runs)))
    try:
        local_head(runs, num_cpus=2, num_gpus=gpus)
        yield runs
        stop_local_head(runs)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def head_without_gpu(tmp_path_factory):
    yield from _head(tmp_path_factory, 0)


@pytest.fixture
def head_with_a_gpu(tmp_path_factory):
    yield from _head(tmp_path_factory, 1)


def verl_plan(root: Path, runs: Path):
    from rpg_cli.orchestration.plan import plan_run

    model, train = write_inputs(root)
    spec = make_spec(
        backend="verl",
        model=str(model),
        data={"train_files": [str(train)]},
        resources={"nodes": 1, "gpus_per_node": 1, "cpus": 1},
    )
    return plan_run(spec, runs / "doc" / spec.run_name, "doc")


def test_a_sweep_on_a_cluster_without_a_gpu_node_is_refused_before_anything_is_recorded(
    head_without_gpu, tmp_path, monkeypatch
):
    from rpg_cli.backends.verl import launch
    from rpg_cli.orchestration.head import ClusterError
    from rpg_cli.orchestration.sweep import run_sweep

    monkeypatch.setattr(launch, "check_install", lambda entrypoints: None)  # tests/test_verl_backend.py's
    plan = verl_plan(tmp_path, head_without_gpu)
    db = tmp_path / "results.db"
    with pytest.raises(ClusterError) as refused:
        run_sweep([plan], "doc", f"sqlite:///{db}", runs_dir=head_without_gpu, detach=True)
    assert str(refused.value) == node.refusal([])
    assert not db.exists() and not plan.run_dir.exists()


@pytest.mark.slow
def test_the_gpu_nodes_of_a_cluster_are_checked_with_the_runs_environment(head_with_a_gpu, tmp_path):
    """A head declaring one GPU, whose jobs find an NVIDIA driver 550 (a stand-in nvidia-smi on the runs' PATH):
    the node job checks it in a Ray task there, and the sweep is refused with the node's line."""
    from rpg_cli.backends.verl import launch
    from rpg_cli.orchestration.head import connect

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 550.54.15\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    plan = verl_plan(tmp_path, head_with_a_gpu)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    client = connect(runs_dir=head_with_a_gpu, start=False)
    with pytest.raises(RuntimeError) as refused:
        launch.check_cluster(client, [(plan.entrypoint, {**plan.env, "PATH": path})])
    assert str(refused.value).startswith(
        f"node 127.0.0.1: NVIDIA driver 550.54.15 is older than {gpu_stack.DRIVER_MIN}, CUDA {gpu_stack.TORCH_CUDA}'s "
        f"minimum: torch {gpu_stack.TORCH} installs and sees no GPU; upgrade the driver to >= {gpu_stack.DRIVER_MIN} "
        f"on every node {INSTALL}"
    ), refused.value
    assert not [j for j in client.list_jobs() if (j.submission_id or "").startswith("rpg-node-check-")]  # cleared
