"""verl 0.9.1's real worker path on a CPU: rpg's worker and loss inside verl's own engine, step by step.

tests/verl_worker_harness.py runs verl's `ActorRolloutRefWorker` (as rpg's subclass, role actor_rollout_ref: the
actor and the reference engines of one GPU) on a tiny random model with the overrides rpg generates for a
cell, with verl's FSDP1 engine (its default) and with FSDP2, each in a fresh process with CPU stand-ins that
live in the harness only (its docstring lists them). The tests here read what it measured. Deselect with
`-m "not verl_workers"`; CI runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="the verl extra is not installed")

pytestmark = pytest.mark.verl_workers

HARNESS = Path(__file__).with_name("verl_worker_harness.py")


STRATEGIES = ("fsdp", "fsdp2")  # verl's default FSDP1 engine, and FSDP2


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Both strategies, one fresh process each."""
    work = tmp_path_factory.mktemp("verl_cpu")
    out = {}
    for strategy in STRATEGIES:
        done = subprocess.run(
            [sys.executable, str(HARNESS), str(work / strategy), str(work / f"{strategy}.json"), strategy],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=HARNESS.parents[1],
        )
        out[strategy] = (
            json.loads((work / f"{strategy}.json").read_text())
            if done.returncode == 0
            else (done.stdout + done.stderr)[-6000:]
        )
    return out


@pytest.fixture(params=STRATEGIES)
def run(request, measured):
    result = measured[request.param]
    assert isinstance(result, dict), f"the harness failed ({request.param}):\n{result}"
    return result


def test_the_worker_is_verls_fsdp_engine_with_rpgs_trainer_optimizer_and_loss(run):
    assert run["verl_version"] == "0.9.1"
    actor, reference = run["engines"]  # FSDP1's wrapper, or FSDP2's FSDP<model class>
    assert actor == reference == ("FullyShardedDataParallel" if run["strategy"] == "fsdp" else "FSDPLlamaForCausalLM")
    assert run["trainer_mode"] == "rpg" and run["loss_mode"] == "rpg_reinforce_urkl"
    assert run["optimizer"] == "rpg_cli.backends.verl.optim.AdamWScheduleFree"


def test_the_cpu_stand_ins_keep_each_packed_sequence_its_own(run):
    # verl packs sequences into one row (remove-padding); sdpa must not let them attend to each other: the
    # log-probs match a plain HF forward of each sequence alone (bf16 rounding), far below what mixing changes
    assert run["logprob_gap_to_hf"] < 0.05
    assert run["cross_sequence_gap"] > 5 * run["logprob_gap_to_hf"]


def test_verl_calls_the_rpg_loss(run):
    # the registered loss is called once per micro-batch of each mini-batch (2 mini-batches of 8 sequences)
    assert run["update_loss_calls"] == 2
    # and verl's update reports the metric only the rpg losses emit
    assert "actor/rpg_kl" in run["update_metric_keys"] and "actor/pg_loss" in run["update_metric_keys"]
    assert run["advantages_nonzero"]  # verl's advantage code gave the loss something to learn from


def test_the_reference_log_probs_reach_the_loss(run):
    seen = run["ref_reached_loss"]
    assert seen["calls"] == seen["with_ref"] == 2
    assert seen["max_gap"] == 0.0  # exactly the values compute_ref_log_prob returned, every token once


def test_summed_micro_batch_losses_equal_the_full_batch_loss(run):
    assert run["micro_whole"] == 1 and run["micro_split"] > 5
    whole, split = run["loss_whole"], run["loss_split"]
    assert whole != 0
    # verl normalises each micro-batch by the whole batch; a per-micro-batch mean would be ~micro_split x off.
    # What remains is bf16 rounding of other packings (split_logprob_gap) through w = exp(logp - old_logp)
    assert abs(split - whole) <= 2e-3 * abs(whole) + 2 * run["split_logprob_gap"] * abs(whole)


def test_schedule_free_steps_and_round_trips_a_checkpoint(run):
    assert run["params_moved_by_update"] > 0
    assert run["optimizer_steps_after_update"] > run["optimizer_steps_at_save"] > 0
    assert run["params_restored"] == 0.0 and run["optimizer_steps_restored"] == run["optimizer_steps_at_save"]
    assert run["repeat_update_gap"] <= 1e-6  # the same update from the restored state: the same parameters


def test_a_reset_makes_the_reference_the_actor_and_not_before(run):
    assert run["step1_ref_minus_actor"] == 0.0  # both start as the initial model
    assert run["actor_moved"] > 0.01
    assert run["step2_reset"] == 0 and run["step2_ref_minus_actor"] > 0.01  # every 2: not yet
    assert run["step3_reset"] == 1 and run["step3_ref_minus_actor"] <= 1e-6  # reset before step 3's ref log-probs
    step2, step3 = run["metrics_step2"], run["metrics_step3"]
    assert (step2["ref/resets"], step2["ref/steps_since_reset"]) == (0.0, 1.0) and step2["ref/kl"] > 0
    assert step2["ref/kl_ema"] == pytest.approx(0.1 * step2["ref/kl"])  # DEFAULT_KL_EMA, after a 0 at step 1
    assert step3 == {"ref/resets": 1.0, "ref/steps_since_reset": 0.0, "ref/kl": 0.0, "ref/kl_ema": 0.0}
    assert run["elements_copied"] == run["actor_elements"] > 0  # every parameter element, shard to shard


def test_the_reference_round_trips_a_checkpoint(run):
    assert run["ref_before_restore_minus_saved_actor"] > 0.01
    assert run["ref_restored_minus_saved_actor"] <= 1e-6


def test_the_memory_estimate_reads_the_harness_setting(run):
    """`make gpu-check` compares it with the measured peak on CUDA; here it must exist and be the size of the
    tiny model's states plus its micro-batch (well under a GiB)."""
    assert 0 < run["estimated_update_gib"] < 1


def test_a_custom_loss_in_verls_worker_is_the_local_paths_custom_policy_loss(run):
    """The plugin's `custom` loss inside verl's update (MATH.md section 11), with the spec's settings, the separate
    reference's log-probs and rollout correction's weights in the batch: every micro-batch's value and gradient are
    those `custom_policy_loss` gives on the same tensors (the local backend's call), and the function's own metric
    is logged under actor/<name>."""
    custom = run["custom_loss"]
    calls = custom["calls"]
    assert len(calls) == 2  # one micro-batch per mini-batch, each normalised by itself (scale 1)
    for call in calls:
        assert call["with_ref"] and call["with_weights"] and call["scale"] == 1.0
        assert call["value_gap"] == 0.0 and call["grad_gap"] == 0.0 and call["grad_sum"] > 0
    assert "actor/capped_frac" in custom["metric_keys"] and "actor/pg_loss" in custom["metric_keys"]
