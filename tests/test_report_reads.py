"""`rpg report --table` (with --select-on) and `rpg compare` read only the samples they show: the store's
`problem_scores` is asked for the steps the cells pick (Last, the val-selected step, `--step N`) of one
benchmark under one protocol (`evaluation_problems`), never every checkpoint; and what they print is the same as when every
sample of every checkpoint is read (the store asked for everything, as before). A real SQLite store,
through the real CLI."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import record_eval
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.report.evidence import aligned
from rpg_cli.store import open_store
from rpg_cli.store.queries import Queries

PROTOCOL = {"n": 4, "temperature": 1.0, "top_p": 1.0, "max_tokens": 28, "seed": 0}
OTHER = {**PROTOCOL, "temperature": 0.6}  # a second protocol: its own section, never mixed in
STEPS = (100, 200, 300, 400)
PROBLEMS = 12


def spec(algorithm: str, seed: int) -> dict:
    return {"algorithm": algorithm, "kl": "none", "seed": seed, "optimizer": "adamw", "context": "2k"} | {
        "model": "data/toy/model",
        "lr": 5e-4,
        "beta": 1e-3,
    }


def evaluate(store, run_id: str, step: int, bench: str, correct: list[int], protocol: dict) -> None:
    """An `rpg eval` result: per problem, `correct` of n samples right, and its mean@n row."""
    record_eval(store, run_id, step, bench, correct, **protocol)


@pytest.fixture
def db(tmp_path):
    """GRPO and DAPO x 3 seeds evaluated at four steps on a test and a selection benchmark; two more runs
    under another protocol."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    store = open_store(url)
    rng = np.random.default_rng(3)
    count = 0
    for alg, protocol, seeds in (("grpo", PROTOCOL, (0, 1, 2)), ("dapo", PROTOCOL, (0, 1, 2)), ("dapo", OTHER, (7, 8))):
        for seed in seeds:
            count += 1
            run_id = f"r{count:04d}"
            store.record_plan(
                RunPlan(
                    id=run_id,
                    name=f"{alg}-s{seed}-{run_id}",
                    sweep="sw",
                    backend="local",
                    spec=spec(alg, seed),
                    run_dir=tmp_path / "runs" / run_id,
                    entrypoint=["true"],
                )
            )
            store.set_status(run_id, "succeeded")
            for step in STEPS:
                for bench in ("toy_add", "heldout"):
                    evaluate(store, run_id, step, bench, [int(c) for c in rng.integers(0, 5, PROBLEMS)], protocol)
    store.close()
    return url


@pytest.fixture
def asked(monkeypatch):
    """Every call to `evaluation_problems` (what it was asked), through every Store the CLI opens."""
    calls: list[dict] = []
    original = Queries.evaluation_problems

    def recording(self, steps, benchmark, scorer, protocol):
        calls.append(
            {"runs": sorted(steps), "benchmark": benchmark, "scorer": scorer, "steps": steps, "protocol": protocol}
        )
        return original(self, steps, benchmark, scorer, protocol)

    monkeypatch.setattr(Queries, "evaluation_problems", recording)
    return calls


def everything(monkeypatch) -> None:
    """The store asked as before: every step, benchmark, scorer and protocol of the runs (`problem_scores`, the
    general query), what was asked picked out of it afterwards."""

    def unfiltered(self, steps, benchmark, scorer, protocol):
        out: dict = {}
        for row in self.problem_scores(list(steps)):
            if (row.benchmark, row.scorer) != (benchmark, scorer) or row.step not in steps[row.run_id]:
                continue
            if any(getattr(row, name) != value for name, value in protocol.items()):
                continue
            problems, correct = out.get((row.run_id, row.step), ((), ()))
            out[(row.run_id, row.step)] = (problems + (row.problem,), correct + (round(row.accuracy * row.n),))
        return out

    monkeypatch.setattr(Queries, "evaluation_problems", unfiltered)


COMMANDS = [
    ("report", "--table"),
    ("report", "--table", "--select-on", "heldout", "--compare-paper"),
    ("report", "--table", "--format", "json", "--select-on", "heldout"),
    ("compare", "GRPO", "DAPO", "--where", "seed=0,1,2"),
    ("compare", "GRPO", "DAPO", "--where", "seed=0,1,2", "--step", "200", "--format", "json"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a[:3]) + f" #{i}" for i, a in enumerate(COMMANDS)])
def test_output_is_the_same_as_when_every_sample_is_read(db, monkeypatch, args):
    narrow = CliRunner().invoke(app, [*args, "--db", db])
    assert narrow.exit_code == 0, narrow.output
    everything(monkeypatch)
    wide = CliRunner().invoke(app, [*args, "--db", db])
    assert wide.exit_code == 0, wide.output
    assert narrow.output == wide.output


def test_the_table_asks_for_the_last_step_of_the_test_benchmark_under_one_protocol(db, asked):
    res = CliRunner().invoke(app, ["report", "--table", "--benchmarks", "toy_add", "--db", db])
    assert res.exit_code == 0, res.output
    # the shown protocol's six runs, then the other protocol's section (two runs): Last only, toy_add only
    assert [(c["runs"], c["benchmark"], c["protocol"]["temperature"]) for c in asked] == [
        ([f"r{i:04d}" for i in range(1, 7)], "toy_add", 1.0),
        (["r0007", "r0008"], "toy_add", 0.6),
    ]
    assert all(set(steps) == {400} for c in asked for steps in c["steps"].values())
    assert [c["protocol"] for c in asked] == [PROTOCOL, OTHER] and {c["scorer"] for c in asked} == {"dapo"}


def test_select_on_asks_for_the_selected_step_besides_the_last(db, asked):
    store = open_store(db)
    series = store.eval_series([f"r{i:04d}" for i in range(1, 7)], ["mean@k"], 4, "dapo", PROTOCOL)
    store.close()
    selected = {run: max(STEPS, key=lambda s: (series[(run, "heldout")][s], -s)) for run, _ in series}
    res = CliRunner().invoke(app, ["report", "--table", "--select-on", "heldout", "--db", db])
    assert res.exit_code == 0, res.output
    first = asked[0]
    assert first["benchmark"] == "toy_add"  # never the selection benchmark's samples: its means pick the step
    assert {run: set(steps) for run, steps in first["steps"].items()} == {run: {400, selected[run]} for run in selected}


def test_compare_asks_for_the_compared_step_only(db, asked):
    res = CliRunner().invoke(app, ["compare", "GRPO", "DAPO", "--where", "seed=0,1,2", "--step", "200", "--db", db])
    assert res.exit_code == 0, res.output
    assert [c["benchmark"] for c in asked] == ["heldout", "toy_add"]  # one query per benchmark compared
    assert all(c["runs"] == [f"r{i:04d}" for i in range(1, 7)] and c["protocol"] == PROTOCOL for c in asked)
    assert all(set(steps) == {200} for c in asked for steps in c["steps"].values())


def test_runs_scored_on_other_problems_are_aligned_on_the_ones_they_share():
    """The usual case (the same problems, the same order) stacks the rows; otherwise the problems every run has,
    in the first run's order, each run's score of each; none shared, or a run without samples: no matrix."""
    a, b = ("p1", "p2", "p3"), ("p3", "p1", "p4")
    same = aligned([(a, np.array([0.1, 0.2, 0.3])), (a, np.array([0.4, 0.5, 0.6]))])
    assert same is not None and same[1] == a and same[0].tolist() == [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]
    mixed = aligned([(a, np.array([0.1, 0.2, 0.3])), (b, np.array([0.7, 0.8, 0.9]))])
    assert mixed is not None and mixed[1] == ("p1", "p3") and mixed[0].tolist() == [[0.1, 0.3], [0.8, 0.7]]
    assert aligned([(a, np.zeros(3)), (("q",), np.zeros(1))]) is None
    assert aligned([(a, np.zeros(3)), None]) is None and aligned([]) is None
