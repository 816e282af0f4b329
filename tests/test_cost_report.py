"""`rpg report --cost`, `rpg report --plot --x device-hours` and `rpg compare --budget` on a store built here
through the Store API: known devices, held times (set_held_at, then a terminal state at a known time), step and
phase times, throughput, MFU and `rpg eval` curves; the real CLI, exact output."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta

import pytest
from helpers import record_eval
from typer.testing import CliRunner

from rpg_cli import cost, report
from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.report.costs import Clock
from rpg_cli.store import open_store

T0 = datetime(2026, 1, 1, 12, 0, 0)  # naive UTC, as the store keeps times
PROTOCOL = {"n": 4, "temperature": 1.0, "top_p": 1.0, "max_tokens": 512, "seed": 0}
GPUS = 2  # every run holds 1 node x 2 GPUs: a step of 900 s is 0.5 device-hours


def spec(algorithm: str, seed: int) -> dict:
    return {
        "algorithm": algorithm,
        "kl": "none",
        "seed": seed,
        "optimizer": "adamw",
        "context": "2k",
        "model": "data/toy/model",
        "lr": 5e-4,
        "beta": 1e-3,
        "resources": {"nodes": 1, "gpus_per_node": GPUS},
    }


class Builder:
    """Runs with held times, metrics lines (through metrics.jsonl ingestion) and `rpg eval` samples."""

    def __init__(self, store, root):
        self.store, self.root, self.count = store, root, 0

    def run(self, algorithm: str, seed: int, status: str = "succeeded", held_h: float | None = 1.0) -> str:
        """A run that held its devices from T0 for `held_h` hours (None: never held them) and ended in `status`
        then (a live status: still running)."""
        self.count += 1
        run_id = f"r{self.count:04d}"
        name = f"{algorithm}-s{seed}-{run_id}"
        plan = RunPlan(run_id, name, "sw", "local", spec(algorithm, seed), self.root / name, entrypoint=["true"])
        self.store.record_plan(plan)
        self.store.set_status(run_id, "running", at=T0 - timedelta(minutes=30))  # queued half an hour: not paid
        if held_h is not None:
            assert self.store.set_held_at(run_id, T0)
        if status != "running":
            error = "step 1 crashed" if status == "failed" else None
            self.store.set_status(run_id, status, error=error, at=T0 + timedelta(hours=held_h or 0))
        return run_id

    def steps(self, run_id: str, n: int, validated: tuple[int, ...] = (), mfu: float | None = None) -> None:
        """`n` step lines of 900 s (generation 600, old log-prob 90, update 180; validation 180 s more at the
        steps in `validated`), 1000 tokens/s per device."""
        lines = []
        for step in range(1, n + 1):
            data = {
                "timing_s/step": 900.0,
                "timing_s/gen": 600.0,
                "timing_s/old_log_prob": 90.0,
                "timing_s/update_actor": 180.0,
                "perf/throughput": 1000.0 + 100 * step,
            }
            if step in validated:
                data["timing_s/testing"] = 180.0
            if mfu is not None:
                data["perf/mfu/actor"] = mfu
            lines.append(json.dumps({"step": step, "data": data}) + "\n")
        path = self.root / f"{run_id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(lines))
        self.store.ingest_metrics(run_id, path)

    def evaluate(self, run_id: str, step: int, correct: list[int], bench: str = "toy_add") -> None:
        """`rpg eval` of the checkpoint at `step`: per problem, `correct` of PROTOCOL['n'] samples right."""
        record_eval(self.store, run_id, step, bench, correct, **PROTOCOL)


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'results.db'}"


@pytest.fixture
def build(db, tmp_path):
    store = open_store(db)
    yield Builder(store, tmp_path / "runs")
    store.close()


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


# ------------------------------------------------------------------------------------ report --cost


@pytest.fixture
def costly(build):
    """GRPO: 3 seeds that finished after holding 2 GPUs for 1, 1.5 and 2 hours (2, 3, 4 device-hours), 4 steps each,
    validated at step 2, MFU 20%. DAPO: one that finished after 0.5 h (1 device-hour), one that failed after 0.25 h
    (0.5), one still waiting for its GPUs (0): 2 steps each, no MFU logged."""
    for seed, hours in enumerate((1.0, 1.5, 2.0)):
        build.steps(build.run("grpo", seed, held_h=hours), 4, validated=(2,), mfu=0.2)
    build.steps(build.run("dapo", 0, held_h=0.5), 2)
    build.steps(build.run("dapo", 1, "failed", held_h=0.25), 2)
    build.run("dapo", 2, "running", held_h=None)


def test_device_hours_of_a_run_count_the_held_time_not_the_queue(build, costly):
    runs = {r.name.split("-r")[0]: r for r in build.store.runs()}
    # 2 GPUs x 1.5 h held; the half hour between running and held (the wait for GPUs) is not counted
    assert cost.run_device_hours(runs["grpo-s1"], T0) == pytest.approx(3.0)
    assert cost.run_device_hours(runs["dapo-s1"], T0) == pytest.approx(0.5)  # failed: its time was paid for too
    assert cost.run_device_hours(runs["dapo-s2"], T0 + timedelta(hours=5)) is None  # live, not holding yet
    clock = Clock.of(GPUS, {1: 900.0, 2: 1080.0, 3: 900.0})
    assert clock.hours == pytest.approx((0.5, 1.1, 1.6)) and clock.at(2) == pytest.approx(1.1)
    assert clock.at(0) == 0.0 and clock.at(9) == pytest.approx(1.6)


# By hand. GRPO: 2, 3, 4 device-hours: mean 3, sd 1, t(0.975, 2) 4.303 x 1 / sqrt(3) = 2.48; total 9. Its steps:
# 4 x 900 s + 180 s of validation = 3780 s per run: generation 2400/3780 = 63%, old log-prob 360/3780 = 10%, update
# 720/3780 = 19%, validation 180/3780 = 5%, other 120/3780 = 3%; tokens/s (1100 + 1200 + 1300 + 1400) / 4 = 1250.
# DAPO: 1 device-hour (one run finished: no interval), total 1 + 0.5 + 0 (the failed run's was paid too); the
# steps of its two runs that logged: 2400/3600 = 67% generation, 10%, 20%, no validation, 3% other; no MFU.
COST_TABLE = """\
toy/model · 2K · cost
┏━━━━━━━━┳━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━━━━━┳━━━━━━━┓
┃ method ┃ runs ┃ device-hours ┃ total ┃ generation ┃ old log-prob ┃ update ┃ validation ┃ other ┃ tokens/s/device ┃   MFU ┃
┡━━━━━━━━╇━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━┩
│ GRPO   │    3 │   3.00 ±2.48 │  9.00 │        63% │          10% │    19% │         5% │    3% │            1250 │ 20.0% │
│ DAPO   │  1/3 │         1.00 │  1.50 │        67% │          10% │    20% │         0% │    3% │            1150 │     - │
└────────┴──────┴──────────────┴───────┴────────────┴──────────────┴────────┴────────────┴───────┴─────────────────┴───────┘
device-hours: devices x the time each run held them (queued time excluded); mean over the runs that finished ±half of its 95% confidence interval over seeds (t); total: every run, finished or not
no interval (one run finished): DAPO
runs: finished/ran; did not finish (in the total only): 2 runs
phases: share of the cell's summed step device time (timing_s/step + timing_s/testing) over every logged step of its runs (generation timing_s/gen, old log-prob timing_s/old_log_prob, update timing_s/update_actor, validation timing_s/testing); other: the rest of the step
tokens/s per device: perf/throughput; MFU: perf/mfu/actor; each the mean over a run's steps, then over its runs; -: not logged (a CPU run reports no MFU)
"""


def test_report_cost_terminal_exact(costly, db):
    result = invoke("report", "--cost", "--db", db)
    assert result.exit_code == 0, result.output
    assert result.output == COST_TABLE


COST_CSV = """\
model,context,method,finished,ran,runs,device_hours,device_hours_low,device_hours_high,device_hours_total,\
share_generation,share_old_log_prob,share_update,share_validation,share_other,tokens_per_s_per_device,mfu
"""


def test_report_cost_csv_and_json_exact(costly, db, tmp_path):
    result = invoke("report", "--cost", "--db", db, "-o", str(tmp_path / "cost.csv"))
    assert result.exit_code == 0, result.output
    text = (tmp_path / "cost.csv").read_text()
    assert text.startswith(COST_CSV)
    grpo, dapo = list(csv.DictReader(io.StringIO(text)))
    assert (grpo["method"], grpo["finished"], grpo["ran"], grpo["runs"]) == (
        "GRPO",
        "3",
        "3",
        "grpo-s0-r0001 grpo-s1-r0002 grpo-s2-r0003",
    )
    half = 4.302652729911275 / 3**0.5  # t(0.975, 2) x sd 1 / sqrt(3)
    assert float(grpo["device_hours"]) == pytest.approx(3.0)
    assert float(grpo["device_hours_low"]) == pytest.approx(3.0 - half)
    assert float(grpo["device_hours_high"]) == pytest.approx(3.0 + half)
    assert float(grpo["device_hours_total"]) == pytest.approx(9.0)
    assert float(grpo["share_generation"]) == pytest.approx(2400 / 3780)
    assert float(grpo["share_validation"]) == pytest.approx(180 / 3780)
    assert float(grpo["share_other"]) == pytest.approx(120 / 3780)
    assert float(grpo["tokens_per_s_per_device"]) == 1250.0 and float(grpo["mfu"]) == pytest.approx(0.2)
    assert (dapo["finished"], dapo["ran"], dapo["device_hours_low"], dapo["mfu"]) == ("1", "3", "", "")
    assert float(dapo["device_hours_total"]) == pytest.approx(1.5)

    doc = json.loads(invoke("report", "--cost", "--db", db, "--format", "json").output)
    assert doc["phases"] == {
        "generation": "timing_s/gen",
        "old log-prob": "timing_s/old_log_prob",
        "update": "timing_s/update_actor",
        "validation": "timing_s/testing",
    }
    assert [c["method"] for c in doc["cells"]] == ["GRPO", "DAPO"]
    assert doc["cells"][1]["device_hours"] == pytest.approx(1.0) and doc["cells"][1]["mfu"] is None

    markdown = invoke("report", "--cost", "--db", db, "--format", "markdown").output
    assert (
        f"| GRPO | 3 | 3.00 [{3 - half:.2f}, {3 + half:.2f}] | 9.00 | 63% | 10% | 19% | 5% | 3% | 1250 | 20.0% |"
        in (markdown)
    )
    latex = invoke("report", "--cost", "--db", db, "--format", "latex").output
    assert "DAPO & 1/3 & 1.00 & 1.50 & 67\\% & 10\\% & 20\\% & 0\\% & 3\\% & 1150 & -- \\\\" in latex


def test_report_cost_bad_input_is_one_line(costly, db):
    result = invoke("report", "--cost", "--table", "--db", db)
    assert result.exit_code != 0 and "--table and --cost" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = invoke("report", "--cost", "--sweep", "nope", "--db", db)
    assert result.exit_code != 0 and "no sweep 'nope'" in result.output and "Traceback" not in result.output


# ------------------------------------------------------------------------------- plot --x device-hours


def test_plot_x_device_hours_puts_each_step_at_its_cumulative_device_hours(build, db, tmp_path):
    """Two GRPO seeds, 4 steps of 900 s on 2 GPUs (0.5 device-hours each; step 2 validated: 180 s more, 0.1)."""
    for seed in (0, 1):
        build.steps(build.run("grpo", seed), 4, validated=(2,))
    hours = [0.5, 1.1, 1.6, 2.1]
    fig = report.plot_training(build.store, metrics=["perf/throughput"], x="device-hours", per_seed=True)
    (ax,) = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    mean, *seeds = ax.get_lines()
    assert list(mean.get_xdata()) == pytest.approx(hours) and list(mean.get_ydata()) == [1100, 1200, 1300, 1400]
    assert all(list(line.get_xdata()) == pytest.approx(hours) for line in seeds) and len(seeds) == 2
    assert ax.get_xlabel().startswith("device-hours")
    default = report.plot_training(build.store, metrics=["perf/throughput"])
    assert list(default.axes[0].get_lines()[0].get_xdata()) == [1, 2, 3, 4]  # the default stays the step

    out = tmp_path / "plots"
    res = invoke("report", "--plot", "--metrics", "perf/throughput", "--x", "device-hours", "-o", str(out), "--db", db)
    assert res.exit_code == 0, res.output
    assert (out / "training-all.png").exists()
    res = invoke("report", "--plot", "--x", "hours", "--db", db)
    assert res.exit_code != 0 and "--x hours: expected step or device-hours" in res.output


# ------------------------------------------------------------------------------------ compare --budget

EASY, HARD = [4, 4, 3, 3, 2, 2, 1, 1], [2, 2, 1, 1, 1, 0, 0, 0]  # correct of 4 on 8 problems: 0.625, 0.21875


@pytest.fixture
def race(build):
    """Every step 900 s on 2 GPUs: 0.5 device-hours, evaluated at every step. GRPO: 3 seeds, 4 steps, finished,
    scoring HARD at steps 1-2 and EASY from step 3 (1.5 device-hours). DAPO: seed 0 like GRPO but EASY from step 2
    (1.0 device-hours); seed 1 finished after 2 steps (1.0 device-hours) with EASY at step 2; seed 2 failed after
    step 1 (0.5); seed 3 still running at step 1 (0.5). Steps are ingested for the failed and live runs as well."""
    ids = {}
    for seed in (0, 1, 2):
        ids[("grpo", seed)] = run_id = build.run("grpo", seed, held_h=1.0)
        build.steps(run_id, 4)
        for step in (1, 2, 3, 4):
            build.evaluate(run_id, step, HARD if step < 3 else EASY)
    plans = {0: ("succeeded", 4), 1: ("succeeded", 2), 2: ("failed", 1), 3: ("running", 1)}
    for seed, (status, steps) in plans.items():
        ids[("dapo", seed)] = run_id = build.run("dapo", seed, status, held_h=0.5)
        build.steps(run_id, steps)
        for step in range(1, steps + 1):
            build.evaluate(run_id, step, HARD if step < 2 else EASY)
    return ids


BUDGET_1_2 = """\
A: GRPO, 3 runs (seeds 0, 1, 2)
B: DAPO, 2 runs (seeds 0, 1); never reached the budget, not compared: seed 2, failed at step 1 (0.50 device-hours); \
seed 3, still running (0.50 device-hours so far)
scores: rpg eval (scorer dapo), mean@4, n=4 T=1 top_p=1 max_tokens=512 seed=0; step: by 1.20 device-hours, each run's \
last evaluated step at or below it (a step function, no interpolation) (step 2)
budget used: A 1.00, B 1.00 device-hours (mean over runs of the device-hours at the step each score is from; budget \
1.20)
toy_add: DAPO - GRPO = +40.6 [29.8, 51.4]; P(DAPO > GRPO) = 1.00 [1.00, 1.00]; detectable at 80% power: 14.9; DAPO \
better (95% intervals over new seeds and new problems, seeds unpaired)
DAPO: 2 of 4 runs never reached 1.20 device-hours (seed 2 failed at step 1 (0.50 device-hours); seed 3 still running \
(0.50 device-hours so far)); the interval is over the 2 that did
"""


def test_compare_budget_reads_each_run_at_its_last_evaluated_step_within_it(race, db):
    """At 1.2 device-hours GRPO is read at step 2 (1.0 device-hours; step 3 is 1.5): HARD; DAPO seed 0 at step 2
    too: EASY; DAPO seed 1 finished at 1.0, before the budget: its final score (EASY, step 2). DAPO - GRPO =
    0.625 - 0.21875 = +40.6 points. DAPO's failed and live runs never reached 1.2: named, not compared."""
    result = invoke("compare", "GRPO", "DAPO", "--budget", "1.2", "--db", db)
    assert result.exit_code == 0, result.output
    assert result.output == BUDGET_1_2


BUDGET_1_5 = """\
budget used: A 1.50, B 1.25 device-hours (mean over runs of the device-hours at the step each score is from; budget \
1.50)
toy_add: DAPO - GRPO = +0.0 [0.0, 0.0]; P(DAPO > GRPO) = 0.50 [0.50, 0.50]; detectable at 80% power: 0.0; no \
detectable difference (95% intervals over new seeds and new problems, seeds unpaired)
"""


def test_compare_budget_at_equal_compute_says_what_each_side_used(race, db):
    """At 1.5 device-hours GRPO reaches EASY too (step 3): no difference. B used 1.25 on average: seed 0 at step 3
    (1.5), seed 1 at its final step 2 (1.0)."""
    result = invoke("compare", "GRPO", "DAPO", "--budget", "1.5", "--db", db)
    assert result.exit_code == 0, result.output
    assert "(steps 2-3)" in result.output
    assert BUDGET_1_5 in result.output
    doc = json.loads(invoke("compare", "GRPO", "DAPO", "--budget", "1.5", "--format", "json", "--db", db).output)
    assert doc["budget"]["device_hours"] == 1.5 and doc["budget"]["used"] == {"a": 1.5, "b": 1.25}
    assert "no interpolation" in doc["budget"]["read"]
    assert [r["name"] for r in doc["b"]["never_reached_budget"]] == ["dapo-s2-r0006", "dapo-s3-r0007"]
    assert doc["b"]["runs"] == ["dapo-s0-r0004", "dapo-s1-r0005"] and doc["b"]["ran"] == 4


def test_compare_budget_below_every_first_evaluation_is_one_line(race, db):
    """The first evaluations are at step 1, 0.5 device-hours: at 0.2 no run has a score yet."""
    result = invoke("compare", "GRPO", "DAPO", "--budget", "0.2", "--db", db)
    assert result.exit_code == 2, result.output
    assert result.output == (
        "rpg compare: A (GRPO): no run of it reached 0.20 device-hours with a score by then (seed 0 no evaluation "
        "by then (first at step 1, 0.50 device-hours); seed 1 no evaluation by then (first at step 1, 0.50 "
        "device-hours); seed 2 no evaluation by then (first at step 1, 0.50 device-hours)); lower --budget, or "
        "compare at a step (--step)\n"
    )


def test_compare_budget_a_method_whose_runs_all_fell_short_is_an_error(build, db):
    grpo = build.run("grpo", 0)
    build.steps(grpo, 2)
    build.evaluate(grpo, 2, EASY)
    dapo = build.run("dapo", 0, "failed", held_h=0.5)
    build.steps(dapo, 1)
    build.evaluate(dapo, 1, EASY)
    result = invoke("compare", "GRPO", "DAPO", "--budget", "0.8", "--db", db)
    assert result.exit_code == 2 and result.output.startswith("rpg compare: B (DAPO): no run of it reached 0.80")
    assert "seed 0 failed at step 1 (0.50 device-hours)" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (("--budget", "1", "--step", "2"), "--budget and --step"),
        (("--budget", "0"), "--budget 0: give device-hours above 0"),
    ],
)
def test_compare_budget_bad_input(race, db, args, message):
    result = invoke("compare", "GRPO", "DAPO", *args, "--db", db)
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output


def test_help_teaches_cost_and_budget():
    report_help = " ".join(invoke("report", "--help").output.split())
    assert "rpg report --cost --sweep smoke-seeds" in report_help and "--x" in report_help
    compare_help = " ".join(invoke("compare", "--help").output.split())
    assert "rpg compare GRPO RPG-REINFORCE-URKL --budget 120" in compare_help
    assert "no interpolation" in compare_help


def test_compare_budget_counts_a_run_that_reached_it_before_it_failed_and_says_so(build, db):
    """DAPO seed 1 failed after step 3 (1.5 device-hours): at 1.2 it had its step 2 score, compared, with a note."""
    for alg, seed, status, steps in (
        ("grpo", 0, "succeeded", 4),
        ("grpo", 1, "succeeded", 4),
        ("dapo", 0, "succeeded", 4),
    ):
        run_id = build.run(alg, seed, status)
        build.steps(run_id, steps)
        for step in range(1, steps + 1):
            build.evaluate(run_id, step, HARD if alg == "grpo" else EASY)
    failed = build.run("dapo", 1, "failed", held_h=0.75)
    build.steps(failed, 3)
    for step in (1, 2, 3):
        build.evaluate(failed, step, EASY)
    result = invoke("compare", "GRPO", "DAPO", "--budget", "1.2", "--db", db)
    assert result.exit_code == 0, result.output
    assert "B: DAPO, 2 runs (seeds 0, 1)\n" in result.output and "never reached" not in result.output
    assert (
        "note: DAPO: compared at the score it had by the budget, though it did not finish: seed 1 failed at step 3: "
        "step 1 crashed\n"
    ) in result.output


def test_compare_budget_names_a_run_that_logged_no_step_time(race, build, db):
    """A finished run without timing_s/step cannot be placed at a budget: named, never read at its final score."""
    untimed = build.run("grpo", 3)
    build.evaluate(untimed, 4, EASY)
    result = invoke("compare", "GRPO", "DAPO", "--budget", "1.2", "--db", db)
    assert result.exit_code == 0, result.output
    assert "GRPO: 1 of 4 runs never reached 1.20 device-hours (seed 3 logged no timing_s/step: its device-hours" in (
        result.output
    )
    assert "A: GRPO, 3 runs (seeds 0, 1, 2)" in result.output
