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
