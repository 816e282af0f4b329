"""verl 0.9.1's whole loop, as a user runs it: `rpg sweep --address` on a Ray head, vLLM (its CPU build) rolling
out, FSDP training, rewards, old and reference log-probs, the weight sync back to vLLM, validation, rpg's
reference resets, checkpoints and metrics.jsonl; a job killed after a checkpoint and resumed by `rpg sweep
--retry-failed`; then `rpg eval --engine vllm` and `rpg report`. What stands in for a GPU is in stand_ins.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rpg_cli.metrics import EMITTED_BY_BOTH
from rpg_cli.store import open_store
from rpg_cli.store.ingest import metrics_view

# verl's measures of how far vLLM's sampling distribution is from the actor's on the step's tokens: the mean
# probability difference and a k3 estimate of the KL between the two (its max, over ~80 tokens here, is one token's
# bf16 luck: 0.002-0.05 synced, so it tells nothing). With the weights synced both are bf16 noise (measured: mean
# difference <= 0.002, KL <= 1.4e-5); with vLLM on stale weights the KL is ~100 times that.
GAP, KL = "training/rollout_probs_diff_mean", "rollout_corr/k3_kl"
SYNCED_GAP, SYNCED_KL = 0.01, 3e-4


def store(workdir: Path):
    return open_store(f"sqlite:///{workdir / 'runs' / 'results.db'}")


def run_of(workdir: Path, algorithm: str, sweep: str = "e2e"):
    db = store(workdir)
    try:
        (run,) = [r for r in db.runs() if r.spec["algorithm"] == algorithm and r.sweep == sweep]
        return run, *db.run_history(run.id)
    finally:
        db.close()


def steps_with(metrics: dict[int, dict], key: str) -> list[int]:
    return sorted(step for step, values in metrics.items() if key in values)


@pytest.fixture(scope="module")
def first_sweep(run_rpg, ray_head):
    """The sweep's three cells; the RPG-REINFORCE job dies after its step-4 checkpoint, so the sweep fails."""
    return run_rpg("sweep", "e2e.yaml", "--address", ray_head)


REFERENCE_AT_4 = "reference-saved-at-step-4.pt"  # in workdir: kept from the first attempt's step-4 checkpoint


@pytest.fixture(scope="module")
def resumed(workdir, run_rpg, ray_head, first_sweep):
    # the resumed attempt's step-5 checkpoint prunes step 4's (keep 1): its reference is kept aside to compare
    shards = run_of(workdir, "rpg_reinforce")[0].run_dir / "checkpoints" / "global_step_4" / "reference"
    shutil.copy(shards / "model_world_size_1_rank_0.pt", workdir / REFERENCE_AT_4)
    return run_rpg("sweep", "e2e.yaml", "--address", ray_head, "--retry-failed")


def per_step(metrics: dict[int, dict], key: str) -> dict[int, float]:
    return {step: values[key] for step, values in metrics.items() if values.get(key) is not None}


def test_dapo_trains_validates_and_checkpoints(workdir, first_sweep):
    db = store(workdir)
    try:
        states = {r.spec["algorithm"]: r.status for r in db.runs(sweep="e2e")}
    finally:
        db.close()
    assert states == {"dapo": "succeeded", "grpo": "preempted", "rpg_reinforce": "failed"}, first_sweep.stdout[-3000:]
    run, metrics, evals = run_of(workdir, "dapo")
    assert steps_with(metrics, "actor/pg_loss") == [1, 2]
    assert {e["step"] for e in evals if e["scorer"] == "verl-val" and e["metric"] == "mean@k"} == {0, 2}
    assert (run.run_dir / "checkpoints" / "global_step_2" / "actor" / "huggingface").is_dir()
    # dynamic sampling acted: groups without signal (all right or all wrong) were evicted and refilled
    assert sum(per_step(metrics, "training/filter_groups/evicted_samples").values()) > 0, metrics
    # overlong shaping acted: with a buffer of 12 of the 16 response tokens, a response past 4 tokens is penalised
    # (the toy model's answers take about 6), and verl's dapo reward manager reports it at validation
    shaped = per_step(metrics, "val-aux/toy_add/overlong_reward/mean@2")
    assert shaped and all(value < 0 for value in shaped.values()), shaped


def test_rollout_correction_weights_the_dapo_run_by_vllms_gap_to_fsdp(workdir, first_sweep):
    """The dapo cell's `rollout_correction` (verl's token-level truncated importance weights): verl computes the
    weights of pi_old (FSDP) to pi_vLLM on every step and rpg's loss takes them; vLLM's CPU build and FSDP differ
    (k3 about 1e-5), so they are not all 1, and they stay under the truncation bound."""
    _, metrics, _ = run_of(workdir, "dapo")
    low, high = per_step(metrics, "rollout_corr/rollout_is_min"), per_step(metrics, "rollout_corr/rollout_is_max")
    assert sorted(low) == sorted(high) == [1, 2], metrics
    assert all(0 < low[s] < high[s] <= 2.0 for s in (1, 2)), (low, high)  # not all equal: not all 1


def test_a_sigterm_mid_step_stops_the_run_after_that_step_with_a_checkpoint(workdir, first_sweep):
    """GRPO's entrypoint gets SIGTERM in the middle of step 1 (stand_ins.py): the step ends, its checkpoint is
    saved (save_every is 2: only the stop saves step 1), the run is recorded preempted at step 1."""
    run, metrics, _ = run_of(workdir, "grpo")
    assert run.status == "preempted" and "step 1" in run.error, (run.status, run.error)
    assert steps_with(metrics, "actor/pg_loss") == [1]
    assert (run.run_dir / "checkpoints" / "global_step_1" / "actor" / "huggingface").is_dir()
    last = json.loads(run.metrics_path.read_text().splitlines()[-1])
    assert last == {"stopped": {"step": 1, "why": "preempted"}}


def test_runs_waiting_for_the_gpu_wait_before_verl_starts(workdir, first_sweep):
    """Three runs, one GPU: a run that waits does so as its bare entrypoint (start.py), before verl's driver,
    task runner and TransferQueue actors exist, and starts verl once the GPU is free."""
    logs = [(run_of(workdir, a)[0].run_dir / "job.log").read_text() for a in ("grpo", "dapo")]
    waited = [log for log in logs if "rpg (before verl starts): waiting for 1 GPU(s)" in log]
    assert waited, [log[-2000:] for log in logs]
    for log in waited:
        verl_started = log.index("[validate_config] All configuration checks passed successfully!")
        assert log.index("rpg (before verl starts): 1 GPU(s) free, reserving 1") < verl_started


def test_every_training_line_carries_the_metrics_both_backends_promise(workdir, first_sweep):
    run, _, _ = run_of(workdir, "dapo")  # one attempt: its file holds every step
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    training = [line for line in lines if line["step"] > 0]
    assert [line["step"] for line in training] == [1, 2]
    for line in training:
        assert set(line["data"]) >= EMITTED_BY_BOTH, sorted(EMITTED_BY_BOTH - set(line["data"]))
        # what a run costs (rpg_cli.metrics, issue 32) under verl's own names, weight sync (verl only) included
        cost = {"timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights"}
        cost.add("perf/throughput")
        assert set(line["data"]) >= cost, sorted(cost - set(line["data"]))


def test_the_killed_job_is_a_failed_run_with_its_metrics_through_the_checkpoint(workdir, first_sweep):
    run, metrics, _ = run_of(workdir, "rpg_reinforce")
    assert run.status == "failed" and run.error, run
    # the checkpoint of step 4 is written after step 4's metrics (rpg's trainer): none is lost
    assert steps_with(metrics, "actor/pg_loss") == [1, 2, 3, 4]
    assert (run.run_dir / "checkpoints" / "global_step_4" / "reference").is_dir()  # reset at step 4, so saved


def test_retry_resumes_from_the_checkpoint_with_its_reference_and_loses_no_row(workdir, resumed):
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    run, metrics, evals = run_of(workdir, "rpg_reinforce")
    assert run.status == "succeeded" and run.attempts == 2
    # metrics.jsonl keeps the first attempt (rpg's log, not verl's file logger, which starts the file over), then
    # a restart line keeping the steps through the checkpoint, then the resumed attempt from step 4 (validation first)
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    restart = lines.index({"restart": {"keep_through": 4}})
    assert [line["step"] for line in lines[:restart] if "actor/pg_loss" in line["data"]] == [1, 2, 3, 4]
    assert lines[restart + 1]["step"] == 4 and "actor/pg_loss" not in lines[restart + 1]["data"]
    assert [line["step"] for line in lines[restart + 1 :] if "actor/pg_loss" in line["data"]] == [5]
    assert steps_with(metrics_view(run.metrics_path.read_text()), "actor/pg_loss") == [1, 2, 3, 4, 5]
    assert steps_with(metrics, "actor/pg_loss") == [1, 2, 3, 4, 5]  # every step once (the store's key)
    assert {e["step"] for e in evals if e["scorer"] == "verl-val" and e["metric"] == "mean@k"} == {0, 2, 4, 5}
    ref = {step: {k: v for k, v in metrics[step].items() if k.startswith("ref/")} for step in range(1, 6)}
    assert [ref[s]["ref/resets"] for s in range(1, 6)] == [0, 0, 0, 1, 1]  # reset before step 4 (every 3)
    assert ref[4]["ref/kl"] == 0.0  # right after the reset the reference is the sampling policy
    # resumed with the saved schedule and reference: one step since the reset, a KL to that reference
    assert ref[5]["ref/steps_since_reset"] == 1 and ref[5]["ref/kl"] > 0
    # and the reference is the saved one, bit for bit, not the initial model: the step-5 checkpoint saves what the
    # reference engine holds (no reset since step 4), which is what the step-4 checkpoint held. (Comparing KLs of
    # different steps cannot tell: each is measured on its own samples; one step's update once gave 0.057, two 0.009)
    held = torch.load(run.run_dir / "checkpoints" / "global_step_5" / "reference" / "model_world_size_1_rank_0.pt")
    saved = torch.load(workdir / REFERENCE_AT_4)
    assert held.keys() == saved.keys() and all(torch.equal(held[name], saved[name]) for name in saved)


def test_the_preempted_run_resumes_at_the_next_step_with_every_row_once(workdir, resumed):
    run, metrics, evals = run_of(workdir, "grpo")
    assert (run.status, run.attempts) == ("succeeded", 2), run.error
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    restart = lines.index({"restart": {"keep_through": 1}})
    assert [line["step"] for line in lines[restart + 1 :] if "actor/pg_loss" in line.get("data", {})] == [2]
    assert steps_with(metrics, "actor/pg_loss") == [1, 2]  # every step once (the store's key)
    assert {e["step"] for e in evals if e["scorer"] == "verl-val" and e["metric"] == "mean@k"} >= {0, 2}


def test_grpo_kl_term_is_verls_own_k3_on_the_same_tokens(workdir, resumed):
    """rpg's GRPO loss holds the clamped k3 to the frozen reference; verl computes the same estimator on the same
    tokens as its KL loss (logged at coefficient 0): the two agree at every step, within 25%, or within 1e-5 where
    both are about 0 (step 1's first update is from the reference itself; the actor's forward need not give the
    sampling forward's log-probs bit for bit, and k3 of that noise is ~1e-6 with rpg's expm1 where verl's float32
    exp(x) - x - 1 cancels it to 0: 1.27e-6 against 0.0 once). Runs differ: step 1's KL was 0 and 8e-4."""
    _, metrics, _ = run_of(workdir, "grpo")
    ours, verls = per_step(metrics, "actor/rpg_kl"), per_step(metrics, "actor/kl_loss")
    assert sorted(ours) == sorted(verls) == [1, 2], (ours, verls)
    for step in (1, 2):
        assert ours[step] == pytest.approx(verls[step], rel=0.25, abs=1e-5), (ours, verls)
    assert ours[2] > 1e-4, ours


def test_every_update_reaches_vllm(workdir, run_rpg, ray_head, resumed):
    """verl measures how far vLLM's sampling probabilities are from the trained actor's on the same tokens:
    small after every update, and large when vLLM is made to keep the initial weights."""
    synced_gap, synced_kl = {}, {}
    for algorithm, steps in (("rpg_reinforce", 5), ("grpo", 2), ("dapo", 2)):
        _, metrics, _ = run_of(workdir, algorithm)
        synced_gap[algorithm], synced_kl[algorithm] = per_step(metrics, GAP), per_step(metrics, KL)
        assert sorted(synced_gap[algorithm]) == sorted(synced_kl[algorithm]) == list(range(1, steps + 1))
    assert max(g for run in synced_gap.values() for g in run.values()) < SYNCED_GAP, synced_gap
    noise = max(kl for run in synced_kl.values() for kl in run.values())
    assert noise < SYNCED_KL, synced_kl
    control = run_rpg("sweep", "control.yaml", "--address", ray_head)
    run, metrics, _ = run_of(workdir, "rpg_reinforce", sweep="e2e-control")
    # the watchdog stops it at the first step sampled from stale weights (its bound: 3e-4, conftest.py)
    assert run.status == "failed", (run.status, control.stdout[-3000:], control.stderr[-3000:])
    assert run.error.startswith("weights in vLLM differ from the trainer's: rollout_corr/k3_kl "), run.error
    assert " at step 2, bound " in run.error, run.error
    stale = per_step(metrics, KL)
    assert stale[1] <= noise  # before any update vLLM has the initial weights, synced or not
    assert 2 in stale and all(stale[step] > SYNCED_KL for step in stale if step > 1), (stale, synced_kl)


def test_rpg_eval_samples_through_vllm_and_the_report_scores_that_run_from_it(workdir, run_rpg, ray_head, resumed):
    run, _, _ = run_of(workdir, "rpg_reinforce")
    done = run_rpg("eval", run.id, "--engine", "vllm", "-b", "data/toy/val.parquet", "--address", ray_head)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _, _, evals = run_of(workdir, "rpg_reinforce")
    ours = [e for e in evals if e["scorer"] != "verl-val" and e["metric"] == "mean@k"]
    assert [(e["step"], e["benchmark"], e["n"]) for e in ours] == [(5, "toy_add", 2)]
    db = store(workdir)
    try:
        protocol = {name: ours[0][name] for name in ("n", "temperature", "top_p", "max_tokens", "seed")}
        samples = db.stored_samples(run.id, 5, "toy_add", ours[0]["scorer"], protocol)
    finally:
        db.close()
    assert len(samples) == 18 and all(len(s) == 2 for s in samples.values())  # every problem, every sample
    mean = sum(correct for s in samples.values() for _, correct in s) / 36
    assert ours[0]["value"] == pytest.approx(mean)
    table = run_rpg("report", "--table", "--sweep", "e2e", "--format", "json")
    assert table.returncode == 0, table.stderr
    report = json.loads(table.stdout)
    sources = [source.split(" (")[0] + source.rsplit(")", 1)[-1] for source in report["sources"]]
    assert sources[:2] == ["rpg eval: 1 run", "training validation: 2 runs"], report["sources"]
    cells = {
        name: row["cells"]["toy_add"]["last"]
        for group in report["groups"]
        for row in group["rows"]
        for name in row["runs"]
    }
    # its cell is rpg eval's score over the 18 problems it sampled; the others' is their logged validation mean
    assert (cells[run.name]["mean"], cells[run.name]["problems"]) == (pytest.approx(ours[0]["value"]), 18), cells
    assert all(cell["problems"] is None for name, cell in cells.items() if name != run.name), cells
