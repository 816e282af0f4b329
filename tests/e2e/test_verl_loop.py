"""verl 0.9.1's whole loop, as a user runs it: `rpg sweep --address` on a Ray head, vLLM (its CPU build) rolling
out, FSDP training, rewards, old and reference log-probs, the weight sync back to vLLM, validation, rpg's
reference resets, checkpoints and metrics.jsonl; a job killed after a checkpoint and resumed by `rpg sweep
--retry-failed`; then `rpg eval --engine vllm` and `rpg report`. What stands in for a GPU is in stand_ins.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def resumed(run_rpg, ray_head, first_sweep):
    return run_rpg("sweep", "e2e.yaml", "--address", ray_head, "--retry-failed")


def per_step(metrics: dict[int, dict], key: str) -> dict[int, float]:
    return {step: values[key] for step, values in metrics.items() if values.get(key) is not None}


def test_grpo_and_dapo_train_validate_and_checkpoint(workdir, first_sweep):
    assert "succeeded 2" in first_sweep.stdout and "failed 1" in first_sweep.stdout, first_sweep.stdout[-3000:]
    for algorithm in ("grpo", "dapo"):
        run, metrics, evals = run_of(workdir, algorithm)
        assert run.status == "succeeded", (algorithm, run.error)
        assert steps_with(metrics, "actor/pg_loss") == [1, 2]
        assert {e["step"] for e in evals if e["scorer"] == "verl-val" and e["metric"] == "mean@k"} == {0, 2}
        assert (run.run_dir / "checkpoints" / "global_step_2" / "actor" / "huggingface").is_dir()
    _, grpo, _ = run_of(workdir, "grpo")
    assert all(grpo[step]["actor/kl_loss"] >= 0 for step in (1, 2))  # the frozen reference's clamped k3 (>= 0)


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
    run, _, _ = run_of(workdir, "grpo")  # one attempt: its file holds every step
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    training = [line for line in lines if line["step"] > 0]
    assert [line["step"] for line in training] == [1, 2]
    for line in training:
        assert set(line["data"]) >= EMITTED_BY_BOTH, sorted(EMITTED_BY_BOTH - set(line["data"]))


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
    assert control.returncode == 0, control.stdout[-3000:] + control.stderr[-3000:]
    _, metrics, _ = run_of(workdir, "rpg_reinforce", sweep="e2e-control")
    stale = per_step(metrics, KL)
    assert sorted(stale) == [1, 2, 3, 4], stale
    assert stale[1] <= noise  # before any update vLLM has the initial weights, synced or not
    updated = [stale[step] for step in (2, 3, 4)]  # after 1, 2, 3 updates vLLM never took
    assert sum(updated) / 3 > max(5 * noise, SYNCED_KL), (stale, synced_kl)


def test_rpg_eval_samples_through_vllm_and_the_report_keeps_its_own_section(workdir, run_rpg, ray_head, resumed):
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
    table = run_rpg("report", "--table", "--sweep", "e2e")
    assert table.returncode == 0, table.stderr
    assert "rpg eval" in table.stdout and "validation" in table.stdout, table.stdout
