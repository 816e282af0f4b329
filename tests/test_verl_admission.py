"""A verl run waits for GPUs other runs hold (rpg_cli/backends/verl/admission.py), where verl 0.9.1 failed it."""

from __future__ import annotations

import pytest

from rpg_cli.backends.verl import diagnose
from rpg_cli.backends.verl.admission import admit


def test_a_run_the_cluster_could_never_hold_fails_with_verls_message():
    with pytest.raises(ValueError) as raised:
        admit(8, cluster=lambda: {"CPU": 64.0, "GPU": 4.0}, available=lambda: {"GPU": 4.0}, sleep=pytest.fail)
    assert str(raised.value) == "Total available GPUs 4 is less than total desired GPUs 8"
    assert diagnose.failure_reason(f"ValueError: {raised.value}\n").startswith("verl needs 8 GPU(s)")


def test_a_run_waits_while_other_runs_hold_its_gpus_then_goes():
    free = iter([0.0, 4.0, 8.0])  # another run holds all 8, then half of them, then none
    said, slept = [], []
    admit(8, cluster=lambda: {"GPU": 8.0}, available=lambda: {"GPU": next(free)}, say=said.append, sleep=slept.append)
    assert len(slept) == 2 and all(5.0 <= s <= 15.0 for s in slept)
    assert said == [
        "rpg: waiting for 8 GPU(s), 0 of the cluster's 8 free: other runs hold them",
        "rpg: 8 GPU(s) free, reserving 8",
    ]


def test_a_run_whose_gpus_are_free_goes_at_once_and_says_nothing():
    said = []
    admit(1, cluster=lambda: {"NPU": 2.0}, available=lambda: {"NPU": 1.0}, say=said.append, sleep=pytest.fail)
    assert said == []


# ---------------------------------------------------------------- the job waits before verl starts (start.py)


def started(monkeypatch, environ: dict[str, str]) -> list:
    """What `python -m rpg_cli.backends.verl.start --gpus 2 --run rpg-1a2b3c4d -- a=1 +b=2` does, in order."""
    from rpg_cli.backends.verl import start

    calls = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(start, "wait_for_gpus", lambda gpus, run: calls.append(("wait", gpus, run)))
    monkeypatch.setattr(start.os, "execv", lambda path, argv: calls.append(("exec", path, argv)))
    start.main(["--gpus", "2", "--run", "rpg-1a2b3c4d", "--", "a=1", "+b=2"])
    return calls


def test_a_job_waits_for_its_gpus_then_becomes_main_ppo_with_its_overrides(monkeypatch):
    import sys

    calls = started(monkeypatch, {"RAY_ADDRESS": "127.0.0.1:6379"})  # Ray sets it for every job's entrypoint
    main_ppo = [sys.executable, "-m", "verl.trainer.main_ppo", "a=1", "+b=2"]
    assert calls == [("wait", 2, "rpg-1a2b3c4d"), ("exec", sys.executable, main_ppo)]


def test_outside_a_ray_job_it_waits_for_nothing(monkeypatch):
    assert [call[0] for call in started(monkeypatch, {})] == ["exec"]  # verl starts a Ray of its own


def test_the_entrypoint_names_the_runs_gpus_and_check_install_reads_its_overrides(tmp_path):
    from conftest import make_spec

    from rpg_cli.backends.verl import launch

    spec = make_spec(backend="verl", resources={"nodes": 2, "gpus_per_node": 4, "cpus": 2}, train_batch_size=8)
    argv = launch.entrypoint(spec, tmp_path)
    lease = f"rpg-{spec.run_id}"  # the run's Ray namespace, which its trainer ends the lease with
    assert argv[:8] == ["python", "-m", "rpg_cli.backends.verl.start", "--gpus", "8", "--run", lease, "--"]
    assert launch.overrides_of(argv) == launch.overrides(spec, tmp_path)
    assert f"+ray_kwargs.ray_init.namespace={lease}" in launch.overrides_of(argv)


def test_the_wait_marks_its_lines_apart_from_verls():
    from rpg_cli.backends.verl.start import say

    said = []
    admit(
        1,
        cluster=lambda: {"GPU": 1.0},
        available=iter([{"GPU": 0.0}, {"GPU": 1.0}]).__next__,
        say=said.append,
        sleep=lambda s: None,
    )
    assert [say(line) for line in said] == [
        "rpg (before verl starts): waiting for 1 GPU(s), 0 of the cluster's 1 free: other runs hold them",
        "rpg (before verl starts): 1 GPU(s) free, reserving 1",
    ]


def test_gpus_a_run_was_let_through_for_are_leased_to_it_until_it_reserves_them():
    """Runs submitted together all see the same GPUs free before verl reserves any: a lease per run."""
    from rpg_cli.backends.verl.admission import LEASE_S, Leases

    leases = Leases()
    assert leases.claim("a", 1, free=1, now=0) == 1  # a: through, leased
    assert leases.claim("b", 1, free=1, now=1) == 0  # b: the free GPU is a's
    assert leases.claim("a", 1, free=1, now=2) == 1  # a's own lease does not count against it
    leases.release("a")  # a's trainer reserved it: the cluster's count has it now
    assert leases.claim("b", 1, free=0, now=3) == 0
    assert leases.claim("b", 1, free=1, now=4) == 1  # a ended: b through
    assert leases.claim("c", 1, free=1, now=4 + LEASE_S - 1) == 0
    assert leases.claim("c", 1, free=1, now=4 + LEASE_S) == 1  # b died before reserving: its lease ran out


LEDGER_ON_RAY = """
import json, sys, tempfile
import ray
from rpg_cli.backends.verl.admission import ledger, release_lease
ray.init(num_cpus=1, num_gpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="rpgl"), _node_ip_address="127.0.0.1")
first, again = ledger(), ledger()  # one actor for the cluster, whoever asks
out = [ray.get(first.claim.remote("a", 2)), ray.get(again.claim.remote("b", 1))]
release_lease("a")  # as a's trainer does
out.append(ray.get(again.claim.remote("b", 1)))
print(json.dumps(out))
ray.shutdown()
"""


def test_the_ledger_is_one_detached_actor_per_cluster_that_reads_the_free_gpus_itself(tmp_path):
    import json
    import subprocess
    import sys

    pytest.importorskip("ray")
    done = subprocess.run(
        [sys.executable, "-c", LEDGER_ON_RAY], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [2, 0, 2]
