"""The watchdog (issue 30 items 2 and 4): bounds on what each step logs, checked at ingest; the spec's `watch:`
block; and the verdict on a job that exited 0 (every step through `steps`, a resumed attempt that updated
nothing). The store is real (SQLite, and the suite's PostgreSQL for the one query); the cluster is a stand-in
client with Ray's job fields, so that the watcher's poll and sync run as `rpg sweep` runs them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import make_spec, spec_dict

from rpg_cli import watch
from rpg_cli.orchestration import reconcile
from rpg_cli.orchestration import sweep as orchestration
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.orchestration.watch import breach, verdict
from rpg_cli.spec import SpecError
from rpg_cli.spec.errors import _validate
from rpg_cli.spec.models import ExperimentSpec
from rpg_cli.store import open_store

K3, DIFF = watch.K3_KL, watch.PROBS_DIFF


def line(step: int, **data: float) -> str:
    return json.dumps({"step": step, "data": data or {"critic/score/mean": 0.5}}) + "\n"


def restart(keep: int | None) -> str:
    return json.dumps({"restart": {"keep_through": keep}}) + "\n"


def record(store, tmp_path: Path, text: str, spec: dict | None = None, name: str = "r", attempts: int = 1):
    """A running run of `spec` whose metrics.jsonl holds `text`, ingested; its record."""
    plan = RunPlan(name, name, "s", "local", spec if spec is not None else {"steps": 3}, tmp_path / name, ["true"])
    store.record_plans([plan], "s")
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    (plan.run_dir / "metrics.jsonl").write_text(text)
    for _ in range(attempts):
        store.begin_attempt(name)
        store.set_status(name, "running", submission_id=name)
        store.ingest_metrics(name, plan.run_dir / "metrics.jsonl")
    return store.run(name)


@pytest.fixture
def store(tmp_path):
    opened = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    yield opened
    opened.close()


# ------------------------------------------------------------------------------------------ the spec


def test_the_watch_block_is_checked_kept_in_spec_json_and_out_of_the_run_id():
    plain = make_spec()
    given = {"actor/entropy": {"min": 0.05, "after_step": 10}, K3: None, "stall": {"factor": 5, "floor_s": 60}}
    watched = make_spec(watch=given)
    assert watched.run_id == plain.run_id  # it stops runs; it changes no number a run computes
    assert "watch" not in plain.canonical()  # no block: spec.json as before it existed
    assert watched.canonical()["watch"] == {
        "stall": {"factor": 5.0, "floor_s": 60.0},
        "actor/entropy": {"min": 0.05, "after_step": 10},
        K3: None,  # a default turned off stays off in spec.json and the store
    }
    partial = make_spec(watch={K3: {"after_step": 3}}).canonical()["watch"]
    assert partial[K3] == {"after_step": 3}  # only what the spec sets: the default's max fills the rest


@pytest.mark.parametrize(
    ("block", "error"),
    [
        ({"actor/entropy": 0.05}, "watch.actor/entropy: got 0.05; allowed: {max: X}, {min: X}, both"),
        ({"actor/entropy": {"mx": 1}}, "watch.actor/entropy: unknown field 'mx'; allowed: max, min, after_step"),
        ({"actor/entropy": {"after_step": 2}}, "watch: actor/entropy bounds nothing; allowed: {max: X}"),
        ({"actor/entropy": {"min": 2, "max": 1}}, "watch.actor/entropy: min 2 is above max 1; allowed: min <= max"),
        ({"actor/entropy": {"max": math.inf}}, "watch.actor/entropy.max: got inf (float); allowed: a finite number"),
        ({"actor/entropy": {"max": "0.1"}}, "watch.actor/entropy.max: got '0.1' (str)"),
        ({"actor/entropy": {"min": 0, "after_step": -1}}, "watch.actor/entropy.after_step: got -1; allowed: >= 0"),
        ({"stall": {"factor": 0.5}}, "watch.stall.factor: got 0.5; allowed: >= 1"),
        ({"stall": {"floor": 60}}, "watch.stall.floor: unknown field; allowed: factor, floor_s"),
        ({" ": {"max": 1}}, "watch: ' ' is not a metric name"),
    ],
)
def test_a_bad_watch_block_is_one_line_naming_the_field(block, error):
    with pytest.raises(SpecError) as caught:
        _validate(ExperimentSpec, spec_dict(watch=block))
    assert str(caught.value).startswith(error), str(caught.value)
    assert "\n" not in str(caught.value)


def test_bounds_are_the_defaults_changed_turned_off_or_added_by_the_spec():
    defaults = {b.key: b for b in watch.bounds({})}
    assert {k: (b.max, b.min, b.after_step) for k, b in defaults.items()} == {K3: (0.1, None, 0), DIFF: (0.05, None, 0)}
    spec = make_spec(
        watch={
            K3: {"after_step": 5},
            DIFF: None,
            "actor/entropy": {"min": 0.05},
            "response_length/clip_ratio": {"max": 0.9},
        }
    ).canonical()
    found = {b.key: b for b in watch.bounds(spec)}
    assert set(found) == {K3, "actor/entropy", "response_length/clip_ratio"}  # DIFF turned off
    assert (found[K3].max, found[K3].after_step, found[K3].meaning) == (0.1, 5, defaults[K3].meaning)
    assert (found["actor/entropy"].min, found["actor/entropy"].max) == (0.05, None)
    assert watch.stall_rule(spec) == watch.StallRule(10.0, 600.0)


# ------------------------------------------------------------------------------------ at ingest


def test_the_first_step_beyond_a_bound_is_found_in_one_query(db_url, tmp_path):
    store = open_store(db_url)
    try:
        text = (
            line(1, **{K3: 2e-3, "actor/entropy": 0.5})
            + line(2, **{K3: 0.02, "actor/entropy": math.nan})  # NaN (NULL) is beyond no bound
            + line(3, **{K3: 0.3, "actor/entropy": 0.01})
            + line(4, **{K3: 0.5})
        )
        spec = {"steps": 4, "watch": {"actor/entropy": {"min": 0.05, "after_step": 2}}}
        run = record(store, tmp_path, text, spec)
        bounds = [(K3, 0.1, None, 0), ("actor/entropy", None, 0.05, 2)]
        assert store.first_breach(run.id, bounds) == (3, "actor/entropy", 0.01)  # a step's keys in order
        assert store.first_breach(run.id, bounds[:1]) == (3, K3, 0.3)
        assert store.first_breach(run.id, [("actor/entropy", None, 0.05, 0)]) == (3, "actor/entropy", 0.01)
        assert store.first_breach(run.id, [(K3, 0.01, None, 0)]) == (2, K3, 0.02)
        assert store.first_breach(run.id, [(K3, 0.01, None, 3)]) == (4, K3, 0.5)  # the grace skips steps 1-3
        assert store.first_breach(run.id, [(K3, None, None, 0)]) is None and store.first_breach(run.id, []) is None
        assert breach(store, run).startswith("a metric left the bound the spec's watch block sets: actor/entropy 0.01")
        defaults = record(store, tmp_path, text, {"steps": 4}, name="defaults")
        assert breach(store, defaults) == (
            "weights in vLLM differ from the trainer's: rollout_corr/k3_kl 0.3 at step 3, bound 0.1; "
            + watch.DEFAULT_BOUNDS[K3].fix
        )
    finally:
        store.close()


def test_a_lower_bound_and_a_divergence_come_first_in_their_own_words(store, tmp_path):
    run = record(
        store, tmp_path, line(1, **{"actor/entropy": 0.01, K3: 0.5}), {"watch": {"actor/entropy": {"min": 0.05}}}
    )
    why = breach(store, run)  # same step: keys in order, actor/ before rollout_corr/
    assert why.startswith(
        "a metric left the bound the spec's watch block sets: actor/entropy 0.01 at step 1, lower bound 0.05;"
    )
    assert "`rpg sweep SPEC --retry-failed`" in why
    nan = record(store, tmp_path, line(1, **{"actor/pg_loss": math.nan, K3: 0.5}), name="nan")
    assert breach(store, nan).startswith("training diverged at step 1: actor/pg_loss is nan")
    fine = record(store, tmp_path, line(1, **{K3: 0.5, DIFF: 0.3}), {"watch": {K3: None, DIFF: None}}, name="off")
    assert breach(store, fine) is None


class StandInCluster:
    """What the watcher asks of Ray's JobSubmissionClient, for jobs {submission id: Ray status}."""

    def __init__(self, jobs: dict[str, str]):
        self.jobs, self.stopped = dict(jobs), []

    def job(self, submission_id: str):
        status = self.jobs[submission_id]
        end = None if status in ("PENDING", "RUNNING") else 2_000_000
        return SimpleNamespace(
            submission_id=submission_id, status=status, start_time=1_000_000, end_time=end, message=f"Job {status}"
        )

    def list_jobs(self):
        return [self.job(j) for j in self.jobs]

    def stop_job(self, submission_id: str) -> bool:
        self.stopped.append(submission_id)
        self.jobs[submission_id] = "STOPPED"
        return True

    def get_job_logs(self, submission_id: str) -> str:
        return "step 3 done\n"


def test_the_watcher_stops_and_fails_a_live_run_beyond_a_bound_once(store, tmp_path):
    run = record(store, tmp_path, line(1, **{K3: 1e-3}) + line(2, **{K3: 2e-3}) + line(3, **{K3: 0.22}), {"steps": 9})
    ray = StandInCluster({run.id: "RUNNING"})
    orchestration._poll(ray, store, [run.id])
    after = store.run(run.id)
    assert ray.stopped == [run.id] and after.status == "failed"
    assert after.error.startswith(
        "weights in vLLM differ from the trainer's: rollout_corr/k3_kl 0.22 at step 3, bound 0.1;"
    )
    assert (run.run_dir / "job.log").read_text() == "step 3 done\n"
    orchestration._poll(ray, store, [run.id])  # Ray now says STOPPED: the watcher's reason stays
    reconcile.sync_run(ray, store, after, ray.job(run.id))  # as the next `rpg sweep` brings Ray's word in
    assert store.run(run.id).status == "failed" and store.run(run.id).error == after.error and ray.stopped == [run.id]


# --------------------------------------------------------------------------------- exit 0, judged


@pytest.mark.parametrize(
    ("text", "spec", "attempts", "reason"),
    [
        (line(1) + line(2) + line(3), {"steps": 3}, 1, None),
        (line(0) + line(1) + line(2) + line(3), {"steps": 3}, 1, None),  # step 0: the validation before training
        (line(1) + line(2), {"steps": 3}, 1, "the job exited 0 at step 2 of 3: the run is short of its steps;"),
        (
            line(1) + line(3),
            {"steps": 3},
            1,
            "the job exited 0 but 1 of its 3 steps have no metrics (the first: step 2)",
        ),
        ("", {"steps": 3}, 1, "the job exited 0 without logging a step of 3;"),
        (line(1), {"seed": 0}, 1, None),  # no step count: a job rpg does not train
        (line(1) + line(2) + line(3, **{K3: 0.4}), {"steps": 3}, 1, "weights in vLLM differ from the trainer's"),
        (line(1, **{"actor/grad_norm": math.inf}), {"steps": 1}, 1, "training diverged at step 1"),
    ],
)
def test_a_run_whose_job_exited_0_succeeds_only_with_every_step(store, tmp_path, text, spec, attempts, reason):
    run = record(store, tmp_path, text, spec, attempts=attempts)
    found = verdict(store, run)
    assert found is None if reason is None else found.startswith(reason), found


def test_a_resumed_attempt_that_logged_no_new_step_fails_naming_verl_7401(store, tmp_path):
    run = record(store, tmp_path, line(1) + line(2), {"steps": 4})
    store.begin_attempt(run.id)  # resubmitted: it resumes from its step-2 checkpoint...
    store.set_status(run.id, "running", submission_id=f"{run.id}-2")
    with open(run.metrics_path, "a") as f:  # ...logs its restart and the resumed step's validation, then exits 0
        f.write(restart(2) + line(2, **{"val-core/aime/acc/mean@4": 0.5}))
    ray = StandInCluster({f"{run.id}-2": "SUCCEEDED"})
    state = reconcile.sync_run(ray, store, store.run(run.id), ray.job(f"{run.id}-2"))
    after = store.run(run.id)
    assert state == "failed" and after.status == "failed" and after.attempts == 2
    assert after.error.startswith("the resumed attempt ended without a new step after step 2 of 4 (verl #7401:")
    # the same resume that does log a step is judged on its steps alone
    resumed = record(store, tmp_path, line(1) + line(2), {"steps": 3}, name="ok")
    store.begin_attempt(resumed.id)
    store.set_status(resumed.id, "running", submission_id="ok-2")
    with open(resumed.metrics_path, "a") as f:
        f.write(restart(2) + line(3))
    ray = StandInCluster({"ok-2": "SUCCEEDED"})
    assert reconcile.sync_run(ray, store, store.run("ok"), ray.job("ok-2")) == "succeeded"


def test_a_resumed_attempt_of_a_complete_run_is_not_failed_for_having_nothing_left(store, tmp_path):
    """Its last checkpoint was its last step (the job failed after it): a resume has nothing to do, and the
    run has every step; failing it would fail every retry too."""
    run = record(store, tmp_path, line(1) + line(2) + line(3), {"steps": 3}, attempts=2)
    with open(run.metrics_path, "a") as f:
        f.write(restart(3))
    store.ingest_metrics(run.id, run.metrics_path)
    assert store.stall_facts([run.id])[run.id][0] is None  # this attempt advanced nothing...
    assert verdict(store, store.run(run.id)) is None  # ...and the run has every step


def test_a_resumed_attempt_is_judged_on_its_own_steps_under_the_sweeps_current_watch_block(store, tmp_path):
    """Failed for a bound at a checkpoint step, resumed from that checkpoint: the earlier attempt's row stays
    (the store keeps steps up to the restart) and fails nothing now; and the bound the sweep's file says now is
    the one obeyed (the store keeps the spec it first recorded: the watch block is not in the run id)."""
    run = record(store, tmp_path, line(1, **{K3: 1e-3}) + line(2, **{K3: 0.3}), {"steps": 4})
    assert breach(store, run).startswith("weights in vLLM differ from the trainer's: rollout_corr/k3_kl 0.3 at step 2")
    store.set_status(run.id, "failed", error=breach(store, run))
    store.begin_attempt(run.id)  # `rpg sweep --retry-failed`, after the fix: it resumes from step 2's checkpoint
    store.set_status(run.id, "running", submission_id=f"{run.id}-2")
    with open(run.metrics_path, "a") as f:
        f.write(restart(2) + line(3, **{K3: 2e-3}))
    store.ingest_metrics(run.id, run.metrics_path)
    assert store.run_history(run.id)[0][2][K3] == 0.3 and breach(store, store.run(run.id)) is None
    with open(run.metrics_path, "a") as f:
        f.write(line(4, **{K3: 0.2}))
    ray = StandInCluster({f"{run.id}-2": "RUNNING"})
    looser = {run.id: {"steps": 4, "watch": {K3: {"max": 0.25}}}}  # the file's block, raised since
    orchestration._poll(ray, store, [run.id], specs=looser)
    assert ray.stopped == [] and store.run(run.id).status == "running"
    orchestration._poll(ray, store, [run.id])  # the store's own spec: the default bound 0.1
    assert ray.stopped == [f"{run.id}-2"] and "0.2 at step 4, bound 0.1" in store.run(run.id).error
