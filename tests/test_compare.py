"""Intervals in `rpg report --table`, `rpg compare`, Best (val-selected) and the protocol guard, through
the real CLI on a real SQLite store built with the store API: runs with several seeds, per-problem
samples of `rpg eval` under a recorded protocol, and logged validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import record_eval
from typer.testing import CliRunner

from rpg_cli import report, rundir, stats
from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import open_store

PROTOCOL = {"n": 8, "temperature": 1.0, "top_p": 1.0, "max_tokens": 28, "seed": 0}
N_PROBLEMS = 20


def spec(algorithm: str, seed: int, **extra) -> dict:
    return {
        "algorithm": algorithm,
        "kl": "none",
        "seed": seed,
        "optimizer": "adamw",
        "context": "2k",
        "model": "data/toy/model",
        "lr": 5e-4,
        "beta": 1e-3,
        **extra,
    }


class Builder:
    """Runs, and `rpg eval` results of them: per problem, `correct` of n samples right."""

    def __init__(self, store, root):
        self.store, self.root, self.count = store, root, 0

    def run(self, spec_: dict, sweep: str = "sw", status: str = "succeeded") -> str:
        """A run recorded in `status`: a table and a comparison hold finished runs only."""
        self.count += 1
        run_id = f"r{self.count:04d}"
        name = f"{spec_['algorithm']}-s{spec_['seed']}-{run_id}"
        self.store.record_plan(
            RunPlan(
                id=run_id,
                name=name,
                sweep=sweep,
                backend="local",
                spec=spec_,
                run_dir=self.root / name,
                entrypoint=["true"],
            )
        )
        self.store.set_status(run_id, status)
        return run_id

    def evaluate(
        self, run_id: str, step: int, bench: str, correct: list[int], scorer: str = "dapo", **protocol
    ) -> None:
        record_eval(self.store, run_id, step, bench, correct, scorer, **{**PROTOCOL, **protocol})


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


def correct_counts(rng, rates, n: int = 8) -> list[int]:
    return [int(c) for c in rng.binomial(n, np.clip(rates, 0, 1))]


def two_methods(build, shift_b: float, seeds=(0, 1, 2), steps=(300,), bench: str = "toy_add", **spec_b) -> dict:
    """GRPO and DAPO x seeds on the same problems; DAPO's per-problem rates shifted by shift_b."""
    rng = np.random.default_rng(7)
    rates = rng.uniform(0.1, 0.7, size=N_PROBLEMS)
    ids = {}
    for alg, shift in (("grpo", 0.0), ("dapo", shift_b)):
        for seed in seeds:
            run_id = build.run(spec(alg, seed, **(spec_b if alg == "dapo" else {})))
            ids[(alg, seed)] = run_id
            for step in steps:
                build.evaluate(run_id, step, bench, correct_counts(rng, rates + shift + rng.normal(0, 0.02)))
    return ids


# ----------------------------------------------------------------------------------- the table


def test_table_cells_are_the_hierarchical_bootstrap_of_the_stored_samples(build, db):
    ids = two_methods(build, 0.2)
    table = report.build_table(build.store)
    assert table.which == ("last",) and table.benchmarks == ["toy_add"]
    cell = next(r for g in table.groups for r in g.rows if r.method == "DAPO").cells[("toy_add", "last")]
    # the same numbers rpg_cli.stats gives on the per-problem accuracies read back from the samples
    rows = build.store.problem_scores([ids[("dapo", s)] for s in (0, 1, 2)])
    matrix = np.array([[p.accuracy for p in rows if p.run_id == ids[("dapo", s)]] for s in (0, 1, 2)])
    expected = stats.score(stats.Runs({"toy_add": matrix}), "toy_add")
    assert (cell.mean, cell.low, cell.high) == pytest.approx((expected.estimate, expected.low, expected.high))
    assert (cell.n, cell.problems, cell.covers) == (3, N_PROBLEMS, stats.SEEDS_AND_PROBLEMS)

    res = invoke("report", "--table", "--db", db)
    assert res.exit_code == 0, res.output
    dapo_line = next(line for line in res.output.splitlines() if "DAPO" in line)
    assert f"{cell.mean * 100:.1f} ±{(cell.high - cell.low) * 50:.1f}" in dapo_line
    assert f"interval over new seeds and new problems: 3 seeds x {N_PROBLEMS} problems" in res.output
    assert "n=8 T=1 top_p=1 max_tokens=28 seed=0" in res.output  # the protocol: samples per problem, sampling

    records = json.loads(invoke("report", "--table", "--format", "json", "--db", db).output)
    got = records["groups"][0]["rows"][1]["cells"]["toy_add"]["last"]
    assert (got["low"], got["high"]) == pytest.approx((cell.low, cell.high))
    md = invoke("report", "--table", "--format", "markdown", "--db", db).output
    assert f"{cell.mean * 100:.1f} [{cell.low * 100:.1f}, {cell.high * 100:.1f}]" in md


def test_one_seed_covers_problems_only_and_says_so(build, db):
    two_methods(build, 0.0, seeds=(0,))
    res = invoke("report", "--table", "--db", db)
    assert res.exit_code == 0, res.output
    assert f"interval over {stats.PROBLEMS_ONLY}: 1 seed x {N_PROBLEMS} problems" in res.output


def test_validation_means_give_seeds_only_intervals(build, db, tmp_path):
    for seed, value in enumerate((0.40, 0.50, 0.45)):
        run_id = build.run(spec("grpo", seed))
        path = tmp_path / f"{run_id}.jsonl"
        path.write_text(json.dumps({"step": 50, "data": {"val-core/toy_add/acc/mean@8": value}}) + "\n")
        build.store.ingest_metrics(run_id, path)
    table = report.build_table(build.store)
    cell = table.groups[0].rows[0].cells[("toy_add", "last")]
    expected = stats.score_from_means([0.40, 0.50, 0.45])
    assert (cell.mean, cell.low, cell.high) == pytest.approx((0.45, expected.low, expected.high))
    assert cell.covers == stats.MEANS_ONLY and cell.problems is None


def test_best_val_selected_picks_the_selection_benchmarks_step_not_the_test_max(build, db):
    run_id = build.run(spec("grpo", 0))
    # the test benchmark peaks at step 100; the selection benchmark at step 200
    for step, test_correct, select_correct in ((100, 6, 2), (200, 3, 7), (300, 4, 4)):
        build.evaluate(run_id, step, "aime24", [test_correct] * 10)
        build.evaluate(run_id, step, "heldout", [select_correct] * 10)
    table = report.build_table(build.store, select_on="heldout", compare_paper=True)
    assert table.benchmarks == ["aime24"]  # the selection benchmark is not a test column
    cells = table.groups[0].rows[0].cells
    assert cells[("aime24", "best_val")].mean == pytest.approx(3 / 8)  # step 200's test score
    assert cells[("aime24", "best_test")].mean == pytest.approx(6 / 8)  # the test max (step 100)
    assert cells[("aime24", "last")].mean == pytest.approx(4 / 8)
    res = invoke("report", "--table", "--select-on", "heldout", "--compare-paper", "--db", db)
    assert res.exit_code == 0, res.output
    assert "Best (val-selected)" in res.output and "Best (test-selected)" in res.output
    res = invoke("report", "--table", "--select-on", "nope", "--db", db)
    assert res.exit_code == 2 and "--select-on nope: no mean@8 scores on it; scored: aime24, heldout" in res.output


def test_best_val_selected_on_a_holdout_in_training_validation(build, db, tmp_path):
    """The `prepare-data --holdout` path: the held-out file validated during training picks the step."""
    for seed in (0, 1):
        run_id = build.run(spec("grpo", seed))
        lines = [
            {"step": step, "data": {"val-core/aime2025/acc/mean@8": test, "val-core/math_dapo_holdout/acc/mean@8": sel}}
            for step, test, sel in ((10, 0.50, 0.20), (20, 0.30 + seed / 10, 0.60), (30, 0.40, 0.30))
        ]
        path = tmp_path / f"{run_id}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        build.store.ingest_metrics(run_id, path)
    table = report.build_table(build.store, select_on="math_dapo_holdout", compare_paper=True)
    assert table.benchmarks == ["aime25"]  # data_source aime2025, as the report names it
    cells = table.groups[0].rows[0].cells
    assert cells[("aime25", "best_val")].mean == pytest.approx(0.35)  # step 20 of each seed: 0.30, 0.40
    assert cells[("aime25", "best_test")].mean == pytest.approx(0.50)
    assert cells[("aime25", "last")].mean == pytest.approx(0.40)


def test_protocol_guard_splits_the_table_by_protocol(build, db):
    rng = np.random.default_rng(0)
    a = build.run(spec("grpo", 0))
    b = build.run(spec("dapo", 0))
    build.evaluate(a, 300, "toy_add", correct_counts(rng, np.full(10, 0.5)))
    build.evaluate(b, 300, "toy_add", correct_counts(rng, np.full(5, 0.5)), temperature=0.6)
    table = report.build_table(build.store)
    sections = {g.rows[0].method: g.protocol for g in table.groups}
    assert len(table.groups) == 2 and all(len(g.rows) == 1 for g in table.groups)  # never one cell, never one section
    assert "n=8 T=1 " in sections["GRPO"] and "n=8 T=0.6 " in sections["DAPO"]
    res = invoke("report", "--table", "--db", db)
    assert res.exit_code == 0 and "toy_add Last" in res.output
    assert res.output.count("n=8 T=0.6 top_p=1 max_tokens=28 seed=0") >= 2  # its section's title and source


# ------------------------------------------------------------------------------------- compare


def test_compare_identical_groups_no_detectable_difference(build, db):
    two_methods(build, 0.0, seeds=(0, 1, 2))
    res = invoke("compare", "GRPO", "GRPO", "--db", db)
    assert res.exit_code == 0, res.output
    assert "toy_add: GRPO - GRPO = +0.0" in res.output and "no detectable difference" in res.output


def test_compare_clear_difference_b_better_and_json(build, db):
    two_methods(build, 0.3, seeds=(0, 1, 2, 3, 4))
    res = invoke("compare", "GRPO", "DAPO", "--db", db)
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("toy_add:"))
    assert line.startswith("toy_add: DAPO - GRPO = +"), line
    assert line.endswith("; DAPO better (95% intervals over new seeds and new problems, seeds unpaired)"), line
    assert "P(DAPO > GRPO) = " in line and "; detectable at 80% power: " in line and "seeds per method" not in line
    assert "A: GRPO, 5 runs (seeds 0, 1, 2, 3, 4)" in res.output
    doc = json.loads(invoke("compare", "algorithm=grpo", "algorithm=dapo", "--format", "json", "--db", db).output)
    (c,) = doc["comparisons"]
    assert c["verdict"] == stats.B_BETTER and not c["seeds_paired"] and c["difference"]["low"] > 0
    assert c["difference"]["covers"] == stats.SEEDS_AND_PROBLEMS and c["detectable_difference"] > 0
    reverse = invoke("compare", "DAPO", "GRPO", "--db", db).output
    assert "GRPO - DAPO = -" in reverse and "DAPO better" in reverse  # A better, named


def test_compare_lists_spec_fields_that_differ_besides_the_method(build, db):
    two_methods(build, 0.0, lr=1e-3)
    res = invoke("compare", "GRPO", "DAPO", "--db", db)
    assert res.exit_code == 0, res.output
    assert "also differs: lr (A: 0.0005; B: 0.001)" in res.output
    assert "algorithm" not in res.output.split("also differs")[1]  # the compared field is not a difference


def test_compare_overall_and_step(build, db):
    two_methods(build, 0.0, steps=(100, 300))
    res = invoke("compare", "GRPO", "DAPO", "--step", "100", "--db", db)
    assert res.exit_code == 0 and "step: 100" in res.output
    res = invoke("compare", "GRPO", "DAPO", "--step", "150", "--db", db)
    assert res.exit_code == 2 and "no toy_add score at step 150; its steps: 100, 300" in res.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["GRPO", "PPO"], "B: no method, run or filter 'PPO'; methods: DAPO, GRPO"),
        (["algorithm=rpg", "GRPO"], "A (algorithm=rpg): no run in scope matches this filter"),
        (
            ["GRPO", "DAPO", "--benchmarks", "aime24"],
            "benchmark aime24 is not scored for every run of A and B; common: toy_add",
        ),
        (["GRPO", "DAPO", "--step", "x"], "--step 'x': expected last or a step number"),
    ],
)
def test_compare_bad_input_one_line_exit_2(build, db, args, message):
    two_methods(build, 0.1)
    res = invoke("compare", *args, "--db", db)
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1


def test_compare_refuses_different_protocols(build, db):
    rng = np.random.default_rng(0)
    a = build.run(spec("grpo", 0))
    b = build.run(spec("dapo", 0))
    build.evaluate(a, 300, "toy_add", correct_counts(rng, np.full(10, 0.5)))
    build.evaluate(b, 300, "toy_add", correct_counts(rng, np.full(10, 0.5)), max_tokens=64)
    res = invoke("compare", "GRPO", "DAPO", "--db", db)
    assert res.exit_code == 2
    assert "max_tokens=64" in res.output and "scores drawn differently never compare" in res.output


def test_compare_no_common_benchmark(build, db):
    rng = np.random.default_rng(0)
    build.evaluate(build.run(spec("grpo", 0)), 300, "aime24", correct_counts(rng, np.full(10, 0.5)))
    build.evaluate(build.run(spec("dapo", 0)), 300, "aime25", correct_counts(rng, np.full(10, 0.5)))
    res = invoke("compare", "GRPO", "DAPO", "--db", db)
    assert res.exit_code == 2 and "no benchmark scored for every run of A and B (A: aime24; B: aime25)" in res.output


def test_validation_rewards_outside_zero_one_get_no_interval_not_a_traceback(build, db, tmp_path):
    for seed, value in enumerate((-0.4, 0.2)):  # a score in [-1, 1] (a reward), not an accuracy
        run_id = build.run(spec("grpo", seed))
        path = tmp_path / f"{run_id}.jsonl"
        path.write_text(json.dumps({"step": 50, "data": {"val-core/toy_add/score/mean@8": value}}) + "\n")
        build.store.ingest_metrics(run_id, path)
    res = invoke("report", "--table", "--db", db)
    assert res.exit_code == 0, res.output
    assert "-10.0" in res.output and "no interval: 2 seeds" in res.output
    res = invoke("compare", "GRPO", "GRPO", "--db", db)
    assert res.exit_code == 2 and "scores must be per-problem accuracies in [0, 1]" in res.output


def test_compare_fixed_problems_pair_seeds_and_effect_say_so(build, db):
    """--fixed-problems narrows the interval to these problems and says so in the line; --pair-seeds
    pairs by seed and says so; --effect prints the seeds per method for that effect, which are what
    rpg_cli.stats gives for the named effect (not the observed difference)."""
    two_methods(build, 0.05, seeds=(0, 1, 2, 3))
    default = invoke("compare", "GRPO", "DAPO", "--effect", "5", "--db", db)
    fixed = invoke("compare", "GRPO", "DAPO", "--fixed-problems", "--pair-seeds", "--effect", "5", "--db", db)
    assert default.exit_code == 0 and fixed.exit_code == 0, default.output + fixed.output

    def line(res):
        return next(x for x in res.output.splitlines() if x.startswith("toy_add:"))

    assert line(default).endswith("(95% intervals over new seeds and new problems, seeds unpaired)")
    assert line(fixed).endswith("(95% intervals over new seeds, these problems, seeds paired by label)")
    assert "note: seeds paired by label (--pair-seeds)" in fixed.output
    assert "--pair-seeds" not in default.output
    doc = json.loads(invoke("compare", "GRPO", "DAPO", "--fixed-problems", "--format", "json", "--db", db).output)
    assert doc["comparisons"][0]["difference"]["covers"] == stats.THESE_PROBLEMS
    doc = json.loads(invoke("compare", "GRPO", "DAPO", "--effect", "5", "--format", "json", "--db", db).output)
    (c,) = doc["comparisons"]
    assert c["effect"] == pytest.approx(0.05)
    assert f"seeds per method for 5.0: {c['seeds_for_effect'] or '-'}" in line(default)
    bad = invoke("compare", "GRPO", "DAPO", "--effect", "0", "--db", db)
    assert bad.exit_code == 2 and "--effect 0: give a difference in points" in bad.output


def test_compare_pair_seeds_needs_the_same_seeds(build, db):
    two_methods(build, 0.0, seeds=(0, 1, 2))
    build.evaluate(build.run(spec("dapo", 7)), 300, "toy_add", [4] * N_PROBLEMS)
    res = invoke("compare", "GRPO", "DAPO", "--pair-seeds", "--db", db)
    assert res.exit_code == 2 and "pairing seeds needs the same seeds in A (0, 1, 2) and B (0, 1, 2, 7)" in res.output


def test_a_cell_holds_one_source_and_every_protocol_and_step_is_said(build, db, tmp_path):
    """Partial `rpg eval` (one GRPO seed at step 200; the others only validated, at step 300), a second
    protocol (k=4, T=0.7) on one run, DAPO evaluated at two different last steps: the GRPO cell is the
    evaluated run alone, the validated runs are named, the other protocol is named with the flags that
    show it, and the mixed steps are said."""
    rng = np.random.default_rng(3)
    rates = np.full(N_PROBLEMS, 0.5)
    grpo = [build.run(spec("grpo", seed)) for seed in (0, 1, 2)]
    build.evaluate(grpo[0], 200, "toy_add", [2] * N_PROBLEMS)  # 25%
    for run_id in grpo[1:]:
        path = tmp_path / f"{run_id}.jsonl"
        path.write_text(json.dumps({"step": 300, "data": {"val-core/toy_add/acc/mean@8": 0.9}}) + "\n")
        build.store.ingest_metrics(run_id, path)
    build.evaluate(grpo[1], 300, "toy_add", correct_counts(rng, rates, 4), n=4, temperature=0.7)
    for seed, step in ((0, 200), (1, 300)):
        build.evaluate(build.run(spec("dapo", seed)), step, "toy_add", correct_counts(rng, rates))

    table = report.build_table(build.store)
    cells = {r.method: r.cells[("toy_add", "last")] for g in table.groups for r in g.rows}
    assert (cells["GRPO"].mean, cells["GRPO"].n) == (0.25, 1)  # never averaged with the validated 90%
    assert cells["DAPO"].n == 2 and cells["DAPO"].steps == (200, 300)
    res = invoke("report", "--table", "--db", db)
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())  # the footer may wrap
    names = [f"grpo-s{seed}-{run_id}" for seed, run_id in ((1, grpo[1]), (2, grpo[2]))]
    assert "left out (scored there only by another source, never averaged in; evaluate them the same way): " in out
    assert all(f"{name} (training validation, mean@8" in out for name in names)
    assert (
        "not shown: rpg eval (scorer dapo), mean@4, n=4 T=0.7 top_p=1 max_tokens=28 seed=0: 1 run "
        "(show with --metric mean@4 --scorer dapo)" in out
    )
    assert "runs at different steps, each counted at its own: DAPO toy_add Last (200, 300)" in out
    assert "interval over new seeds and new problems: 2 seeds x 20 problems" in out
    assert f"interval over {stats.PROBLEMS_ONLY}: 1 seed x 20 problems" in out  # GRPO's one evaluated run
    shown = invoke("report", "--table", "--metric", "mean@4", "--db", db)
    assert shown.exit_code == 0 and "n=4 T=0.7" in shown.output


def test_fixed_problems_table_is_narrower_and_says_so(build, db):
    two_methods(build, 0.1, seeds=(0, 1, 2, 3))
    default = report.build_table(build.store)
    fixed = report.build_table(build.store, fixed_problems=True)
    for g_d, g_f in zip(default.groups, fixed.groups):
        for r_d, r_f in zip(g_d.rows, g_f.rows):
            d, f = r_d.cells[("toy_add", "last")], r_f.cells[("toy_add", "last")]
            assert f.mean == d.mean and f.high - f.low < d.high - d.low  # without the problems' part
            assert (d.covers, f.covers) == (stats.SEEDS_AND_PROBLEMS, stats.THESE_PROBLEMS)
    res = invoke("report", "--table", "--fixed-problems", "--db", db)
    out = " ".join(res.output.split())
    assert "interval over new seeds, these problems: 4 seeds x 20 problems" in out
    assert "intervals over new seeds, these problems (--fixed-problems): the score a new training run" in out
    doc = json.loads(invoke("report", "--table", "--fixed-problems", "--format", "json", "--db", db).output)
    assert doc["intervals_over"] == stats.THESE_PROBLEMS
    assert doc["groups"][0]["rows"][0]["cells"]["toy_add"]["last"]["covers"] == stats.THESE_PROBLEMS


# ---------------------------------------------------------------------- runs that did not finish


def lose(build, run_id: str, status: str, error: str | None = None, last_step: int | None = None) -> None:
    """Record `run_id` as ended in `status`, having logged metrics through `last_step`."""
    if last_step is not None:
        path = build.root / f"{run_id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "".join(json.dumps({"step": s, "data": {"critic/score/mean": 0.5}}) + "\n" for s in range(1, last_step + 1))
        )
        build.store.ingest_metrics(run_id, path)
    build.store.set_status(run_id, status, error=error)


def test_compare_counts_the_seeds_each_side_lost_and_compares_only_the_finished(build, db):
    """GRPO's seed 2 diverged (its `rpg eval` scores stay out), DAPO lost two seeds two ways: the verdict says
    so per side, and the numbers are those of the finished runs alone."""
    ids = two_methods(build, 0.3, seeds=(0, 1, 2))
    lose(build, ids["grpo", 2], "failed", rundir.diverged(120, "actor/pg_loss is nan"), last_step=125)
    lose(build, ids["dapo", 1], "preempted", last_step=40)
    lose(build, ids["dapo", 2], "failed", "torch.OutOfMemoryError: CUDA out of memory", last_step=7)
    res = invoke("compare", "GRPO", "DAPO", "--db", db)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[:2] == [
        "A: GRPO, 2 runs (seeds 0, 1); did not finish, not compared: seed 2, diverged at step 120 (actor/pg_loss is nan)",
        "B: DAPO, 1 run (seed 0); did not finish, not compared: seed 1, preempted at step 40; "
        "seed 2, failed at step 7: torch.OutOfMemoryError: CUDA out of memory",
    ]
    assert lines[3].startswith("toy_add: DAPO - GRPO = +")
    assert lines[4:6] == [
        "GRPO: 1 of 3 seeds diverged at step 120; the interval is over the 2 that finished",
        "DAPO: 2 of 3 seeds did not finish (1 preempted at step 40, 1 failed at step 7); "
        "the interval is over the 1 that finished",
    ]
    doc = json.loads(invoke("compare", "GRPO", "DAPO", "--format", "json", "--db", db).output)
    assert doc["not_finished"] == lines[4:6]
    assert {k: doc["a"][k] for k in ("runs", "finished", "ran")} == {
        "runs": ["grpo-s0-r0001", "grpo-s1-r0002"],
        "finished": 2,
        "ran": 3,
    }
    assert doc["a"]["not_finished"] == [
        {"name": "grpo-s2-r0003", "seed": 2, "state": "diverged", "reason": "actor/pg_loss is nan", "step": 120}
    ]
    assert [(u["seed"], u["state"], u["step"]) for u in doc["b"]["not_finished"]] == [
        (1, "preempted", 40),
        (2, "failed", 7),
    ]
    finished_only = json.loads(
        invoke("compare", "grpo-s0-r0001,grpo-s1-r0002", "dapo-s0-r0004", "--format", "json", "--db", db).output
    )
    assert finished_only["comparisons"][0]["difference"] == doc["comparisons"][0]["difference"]
    assert finished_only["not_finished"] == []


def test_compare_refuses_a_side_none_of_whose_runs_finished(build, db):
    ids = two_methods(build, 0.3, seeds=(0, 1))
    lose(build, ids["dapo", 0], "running", last_step=37)
    lose(build, ids["dapo", 1], "failed", rundir.diverged(9, "actor/pg_loss is nan"))
    res = invoke("compare", "GRPO", "DAPO", "--db", db)
    assert res.exit_code == 2
    assert res.output.strip() == (
        "rpg compare: B (DAPO): no run of it finished (seed 0 running, step 37; seed 1 diverged at step 9 "
        "(actor/pg_loss is nan)); only finished runs are compared: `rpg runs` shows where each one is"
    )
