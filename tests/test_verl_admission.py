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
    """What `python -m rpg_cli.backends.verl.start --gpus 2 -- a=1 +b=2` does, in order: waits, then exec."""
    from rpg_cli.backends.verl import start

    calls = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(start, "wait_for_gpus", lambda gpus: calls.append(("wait", gpus)))
    monkeypatch.setattr(start.os, "execv", lambda path, argv: calls.append(("exec", path, argv)))
    start.main(["--gpus", "2", "--", "a=1", "+b=2"])
    return calls


def test_a_job_waits_for_its_gpus_then_becomes_main_ppo_with_its_overrides(monkeypatch):
    import sys

    calls = started(monkeypatch, {"RAY_ADDRESS": "127.0.0.1:6379"})  # Ray sets it for every job's entrypoint
    assert calls == [
        ("wait", 2),
        ("exec", sys.executable, [sys.executable, "-m", "verl.trainer.main_ppo", "a=1", "+b=2"]),
    ]


def test_outside_a_ray_job_it_waits_for_nothing(monkeypatch):
    assert [call[0] for call in started(monkeypatch, {})] == ["exec"]  # verl starts a Ray of its own


def test_the_entrypoint_names_the_runs_gpus_and_check_install_reads_its_overrides(tmp_path):
    from conftest import make_spec

    from rpg_cli.backends.verl import launch

    spec = make_spec(backend="verl", resources={"nodes": 2, "gpus_per_node": 4, "cpus": 2}, train_batch_size=8)
    argv = launch.entrypoint(spec, tmp_path)
    assert argv[:6] == ["python", "-m", "rpg_cli.backends.verl.start", "--gpus", "8", "--"]
    assert launch.overrides_of(argv) == launch.overrides(spec, tmp_path)


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
