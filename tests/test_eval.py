"""`rpg eval` end to end on CPU: a tiny local model, a 3-problem set, k = 4, the real CLI, a real SQLite store.

The tiny model is a toy-vocabulary Llama trained for a moment to answer "Answer: 3" or "Answer: 7"
(at random), so that on the problems below (answers 3, 7, 5) some samples are right and some wrong.
Every stored metric is recomputed here from the stored samples with plain combinatorics.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import sqlite3
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import make_spec
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rpg_cli import rundir  # noqa: E402
from rpg_cli.cli import app  # noqa: E402
from rpg_cli.evaluation import EvalError, EvalOptions, plan_eval  # noqa: E402
from rpg_cli.evaluation.__main__ import parse_args  # noqa: E402
from rpg_cli.evaluation.generation import HFGenerator  # noqa: E402
from rpg_cli.orchestration.plan import RunPlan  # noqa: E402
from rpg_cli.spec import ExperimentSpec  # noqa: E402
from rpg_cli.store import open_store  # noqa: E402

if TYPE_CHECKING:
    from rpg_cli.store import Store

PROBLEMS = [("1+2=", "3"), ("3+4=", "7"), ("2+2=", "5")]
K = 4
MAX_TOKENS = 12


def build_model(out: Path) -> Path:
    from rpg_cli.datasets.toy import build_model as toy_model
    from rpg_cli.datasets.toy import build_tokenizer

    torch.set_num_threads(1)  # two busy cores: more threads only contend
    tokenizer = build_tokenizer()
    model = toy_model(tokenizer, seed=0)
    rng = random.Random(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        batch = [(rng.choice(PROBLEMS)[0], f"Answer: {rng.choice('37')}") for _ in range(32)]
        prompt = tokenizer([q for q, _ in batch], add_special_tokens=False)["input_ids"]
        target = tokenizer([a for _, a in batch], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([p + t + [tokenizer.eos_token_id] for p, t in zip(prompt, target)])
        labels = ids.clone()
        labels[:, : len(prompt[0])] = -100
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def write_problems(path: Path, copies: int = 3) -> Path:
    """The 3 problems, each repeated `copies` times in shuffled order, as prepare-data writes eval sets."""
    from rpg_cli.datasets.pipeline import rows_to_batch, write_verl_parquet
    from rpg_cli.datasets.toy import toy_row

    rows = [toy_row(q, a, copy) for copy in range(copies) for q, a in PROBLEMS]
    random.Random(1).shuffle(rows)
    write_verl_parquet([rows_to_batch(rows)], path)
    return path


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-assets")
    return {"model": build_model(root / "model"), "data": write_problems(root / "toy3.parquet")}


def run_spec(model: Path) -> ExperimentSpec:
    """A two-step rpg_reinforce run on `model` whose validation samples K per problem."""
    return make_spec(
        algorithm="rpg_reinforce",
        beta=1e-4,
        model=str(model),
        data={"train_files": ["x.parquet"]},
        train_batch_size=2,
        lr=1e-4,
        steps=2,
        val={"n": K, "temperature": 0.9, "top_p": 0.95},
        save_every=1,
    )


VERL_LINES = [
    {
        "step": 1,
        "data": {
            "critic/score/mean": 0.1,
            "val-core/aime2025/acc/mean@32": 0.25,
            "val-core/aime2025/acc/best@32/mean": 0.6,
            "val-core/aime2025/acc/best@32/std": 0.05,
            "val-core/aime2025/acc/maj@32/mean": 0.3,
            "val-aux/aime2025/acc/std@32": 0.4,
            "val-aux/aime2025/acc/best@2/mean": 0.35,
            "val-aux/aime2025/score/mean@32": -0.5,
            "val-core/math_dapo/reward/mean@32": 0.9,
        },
    },
    {"step": 2, "data": {"val-core/aime2025/acc/mean@32": 0.5, "val-core/amc_23/acc/mean@32": float("nan")}},
]


def make_run(
    root: Path, model: Path, db: str, steps=(1, 2), layout: str = "local", record: bool = True
) -> ExperimentSpec:
    """runs/<sweep>/<run>/ with spec.json, checkpoints of `steps` and a metrics.jsonl with verl val keys."""
    spec = run_spec(model)
    run_dir = root / "runs" / "s1" / spec.run_name
    for step in steps:
        where = (
            run_dir / "checkpoints" / (f"step_{step}" if layout == "local" else f"global_step_{step}/actor/huggingface")
        )
        shutil.copytree(model, where)
    (run_dir / "spec.json").write_text(json.dumps(spec.canonical()))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in VERL_LINES))
    if record:
        store = open_store(db)
        store.record_plans([RunPlan(spec.run_id, spec.run_name, "s1", "local", spec.canonical(), run_dir, [])])
        store.close()
    return spec


def rpg(*args: str):
    return CliRunner().invoke(app, list(args))


def query(db_file: Path, sql: str, *params):
    """Raw SQL, only for what the store's API does not read: samples row by row (their position, index,
    length), every row whatever its completeness, and deleting rows to fake a lost store."""
    con = sqlite3.connect(db_file)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def read(db_file: Path, ask: Callable[[Store], Any]) -> Any:
    """What `ask(store)` reads from the store at `db_file`, through the store's API."""
    store = open_store(f"sqlite:///{db_file}")
    try:
        return ask(store)
    finally:
        store.close()


def eval_rows(db_file: Path, run_id: str) -> list[dict[str, Any]]:
    """The run's eval rows (Store.run_history): step, benchmark, metric, k, scorer, value, scorer_version,
    the protocol."""
    return read(db_file, lambda store: store.run_history(run_id)[1])


def evals(
    db_file: Path, run_id: str, scorer: str = "dapo", benchmark: str = "toy_add"
) -> dict[tuple[int, str, int], float]:
    return {
        (r["step"], r["metric"], r["k"]): r["value"]
        for r in eval_rows(db_file, run_id)
        if r["scorer"] == scorer and r["benchmark"] == benchmark
    }


def sample_count(db_file: Path, run_id: str, scorer: str | None = None) -> int:
    """Samples stored for the run (of the scorer), of problems with all n of them (Store.problem_scores)."""
    return read(db_file, lambda store: sum(p.n for p in store.problem_scores([run_id], scorer=scorer)))


def run_ids(db_file: Path) -> list[str]:
    return [r.id for r in read(db_file, lambda store: store.runs())]


def recompute(samples: list[tuple[int, int, str | None, int]]) -> dict[tuple[str, int], float]:
    """mean@n, pass@k (1 - C(n-c, k)/C(n, k)), maj@n and std@n from (problem, index, extracted, correct) rows."""
    by_problem: dict[int, list[tuple[str | None, bool]]] = {}
    for problem, _, extracted, correct in sorted(samples):
        by_problem.setdefault(problem, []).append((extracted, bool(correct)))
    groups = list(by_problem.values())
    n = len(groups[0])
    out = {("mean@k", n): sum(sum(c for _, c in g) / n for g in groups) / len(groups)}
    for k in sorted({2**e for e in range(n.bit_length())} | {n}):
        out[("pass@k", k)] = sum(1 - math.comb(n - sum(c for _, c in g), k) / math.comb(n, k) for g in groups) / len(
            groups
        )
    maj = 0.0
    for g in groups:
        votes = Counter(a for a, _ in g if a is not None)
        if votes:
            top = max(votes.values())
            winner = next(a for a, _ in g if a is not None and votes[a] == top)
            maj += next(c for a, c in g if a == winner)
    out[("maj@k", n)] = maj / len(groups)
    out[("std@k", n)] = statistics.pstdev([sum(g[j][1] for g in groups) / len(groups) for j in range(n)])
    return out


@pytest.fixture
def count_generation(monkeypatch):
    calls = {"load": 0, "generate": 0}
    original_init, original_generate = HFGenerator.__init__, HFGenerator.generate

    def init(self, *args, **kwargs):
        calls["load"] += 1
        original_init(self, *args, **kwargs)

    def generate(self, problems, seeds, sampling):
        calls["generate"] += len(problems)
        return original_generate(self, problems, seeds, sampling)

    monkeypatch.setattr(HFGenerator, "__init__", init)
    monkeypatch.setattr(HFGenerator, "generate", generate)
    return calls


# ------------------------------------------------------------------------------- end to end


def test_run_is_evaluated_end_to_end_and_the_store_agrees_with_its_samples(assets, tmp_path, count_generation):
    db_file = tmp_path / "results.db"
    db = f"sqlite:///{db_file}"
    spec = make_run(tmp_path, assets["model"], db)
    result = rpg(
        "eval",
        spec.run_name,
        "-b",
        str(assets["data"]),
        "--k",
        str(K),
        "--local",
        "--db",
        db,
        "--max-tokens",
        str(MAX_TOKENS),
        "--runs-dir",
        str(tmp_path / "runs"),
    )
    assert result.exit_code == 0, result.output
    assert spec.run_name in result.output and "mean@k" in result.output
    assert count_generation == {"load": 1, "generate": 3}  # 3 unique problems out of 9 rows, the last step only

    samples = query(
        db_file,
        "SELECT position, sample_index, extracted, correct, response_length, step, benchmark, scorer "
        "FROM samples WHERE run_id=?",
        spec.run_id,
    )
    assert len(samples) == 3 * K
    assert {(s[5], s[6], s[7]) for s in samples} == {(2, "toy_add", "dapo")}  # --steps last = 2; named by data_source
    assert sorted((s[0], s[1]) for s in samples) == [(p, j) for p in range(3) for j in range(K)]
    assert all(1 <= s[4] <= MAX_TOKENS for s in samples)
    # problems are numbered in order of first appearance in the (shuffled, repeated) file
    first_seen = list(dict.fromkeys(r["prompt"][0]["content"] for r in _rows(assets["data"])))
    truths = {p: dict(PROBLEMS)[q] for p, q in enumerate(first_seen)}
    assert len(first_seen) == 3
    for problem, _, extracted, correct, *_ in samples:
        assert bool(correct) == (extracted == truths[problem])
    verdicts = [bool(s[3]) for s in samples]
    assert any(verdicts) and not all(verdicts)  # the numbers below are not trivially 0 or 1

    stored = evals(db_file, spec.run_id)
    expected = recompute([s[:4] for s in samples])
    assert {(m, k) for (_, m, k) in stored} == set(expected)
    for (step, metric, k), value in stored.items():
        assert step == 2
        assert value == pytest.approx(expected[(metric, k)], abs=1e-12), (metric, k)
    assert {r["scorer_version"] for r in eval_rows(db_file, spec.run_id) if r["scorer"] == "dapo"} == {"dapo-1"}
    # the run's own validation metrics came along, under verl's names
    verl = evals(db_file, spec.run_id, scorer="verl-val", benchmark="aime25")  # one name for aime2025
    assert verl[(1, "mean@k", 32)] == pytest.approx(0.25) and verl[(2, "mean@k", 32)] == pytest.approx(0.5)


def _rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def test_resume_generates_only_what_is_missing_and_rescoring_reuses_responses(assets, tmp_path, count_generation):
    db_file = tmp_path / "results.db"
    db = f"sqlite:///{db_file}"
    args = [
        "eval",
        str(assets["model"]),
        "-b",
        str(assets["data"]),
        "--k",
        str(K),
        "--local",
        "--db",
        db,
        "--max-tokens",
        str(MAX_TOKENS),
        "--runs-dir",
        str(tmp_path / "runs"),
    ]
    assert rpg(*args).exit_code == 0
    assert count_generation == {"load": 1, "generate": 3}
    (run,) = read(db_file, lambda store: store.runs())
    run_id, first = run.id, evals(db_file, run.id)
    assert (run.sweep, run.status) == ("checkpoints", "succeeded")

    # everything scored: nothing generated, the model is not even loaded
    assert rpg(*args).exit_code == 0
    assert count_generation == {"load": 1, "generate": 3}

    # the store lost samples, the run directory did not: they come back from it, nothing is generated
    def forget(where: str) -> None:
        con = sqlite3.connect(db_file)
        con.execute(f"DELETE FROM samples WHERE {where}")
        con.execute("DELETE FROM evals")
        con.commit()
        con.close()

    forget("position = 2")
    assert rpg(*args).exit_code == 0
    assert count_generation == {"load": 1, "generate": 3}
    assert sample_count(db_file, run_id) == 3 * K and evals(db_file, run_id) == pytest.approx(first)

    # one problem lost from the store, its scored line and the response cache (as if killed mid-way): only
    # it is redone
    forget("position = 1")
    (cache,) = (tmp_path / "runs").glob("checkpoints/*/eval/step_0/toy_add.jsonl")
    scored = cache.with_name("toy_add.scored.jsonl")
    lines = cache.read_text().splitlines()
    assert len(lines) == 3
    cache.write_text("\n".join(lines[:1] + lines[2:]) + "\n" + lines[1][:20])  # problem 1's line torn
    kept = [line for line in scored.read_text().splitlines() if json.loads(line)["position"] != 1]
    assert len(kept) == 2
    scored.write_text("\n".join(kept) + "\n")
    assert rpg(*args).exit_code == 0
    assert count_generation == {"load": 2, "generate": 4}
    assert sample_count(db_file, run_id) == 3 * K
    again = evals(db_file, run_id)
    assert set(again) == set(first)  # recomputed from the stored samples (problem 1 was sampled again, same seed)
    assert again == pytest.approx(first)

    # another scorer: the cached responses are rescored, nothing is generated
    assert rpg(*args, "--scorer", "math_verify").exit_code == 0
    assert count_generation["generate"] == 4
    (mv,) = [r for r in eval_rows(db_file, run_id) if r["scorer"] == "math_verify" and r["metric"] == "mean@k"]
    assert sample_count(db_file, run_id, "math_verify") == 3 * K and mv["scorer_version"].startswith("math-verify")


def test_steps_select_checkpoints(assets, tmp_path, count_generation):
    db_file = tmp_path / "results.db"
    db = f"sqlite:///{db_file}"
    spec = make_run(tmp_path, assets["model"], db, steps=(1, 2, 3))
    options = EvalOptions(ref=spec.run_name, benchmarks=(str(assets["data"]),), db=db)
    steps_of = lambda s: [
        c.step for c in plan_eval(EvalOptions(**{**options.__dict__, "steps": s})).targets[0].checkpoints
    ]  # noqa: E731
    assert steps_of("last") == [3]
    assert steps_of("all") == [1, 2, 3]
    assert steps_of("3,1") == [1, 3]
    with pytest.raises(EvalError, match="no checkpoint for step 7; its steps: 1, 2, 3"):
        steps_of("7")
    result = rpg(
        "eval",
        spec.run_id,
        "-b",
        str(assets["data"]),
        "--steps",
        "1,3",
        "--local",
        "--db",
        db,
        "--max-tokens",
        str(MAX_TOKENS),
        "--k",
        "2",
    )
    assert result.exit_code == 0, result.output
    assert {s for (s, m, k) in evals(db_file, spec.run_id) if m == "mean@k"} == {1, 3}
    assert count_generation["load"] == 2  # one model per checkpoint


def test_sampling_comes_from_the_run_spec_unless_overridden(assets, tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    spec = make_run(tmp_path, assets["model"], db)
    sampling = plan_eval(EvalOptions(ref=spec.run_name, benchmarks=(str(assets["data"]),), db=db)).targets[0].sampling
    assert (sampling.k, sampling.temperature, sampling.top_p, sampling.max_tokens) == (K, 0.9, 0.95, 2048)
    sampling = (
        plan_eval(
            EvalOptions(
                ref=spec.run_name,
                benchmarks=(str(assets["data"]),),
                db=db,
                k=8,
                top_p=0.5,
                temperature=0.0,
                max_tokens=64,
            )
        )
        .targets[0]
        .sampling
    )
    assert (sampling.k, sampling.temperature, sampling.top_p, sampling.max_tokens) == (8, 0.0, 0.5, 64)


def test_verl_checkpoint_layouts(assets, tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    spec = make_run(tmp_path, assets["model"], db, steps=(5,), layout="verl", record=False)
    run_dir = tmp_path / "runs" / "s1" / spec.run_name
    (run_dir / "checkpoints" / "global_step_10" / "actor").mkdir(parents=True)  # saved without hf_model
    bench = (str(assets["data"]),)
    plan = plan_eval(EvalOptions(ref=str(run_dir), benchmarks=bench, db=db, steps="all"))
    (target,) = plan.targets
    assert target.run_id == spec.run_id and not target.known
    assert [(c.step, c.path) for c in target.checkpoints] == [
        (5, run_dir / "checkpoints/global_step_5/actor/huggingface")
    ]
    with pytest.raises(EvalError, match="hf_model"):
        plan_eval(EvalOptions(ref=str(run_dir), benchmarks=bench, db=db))  # the last step has no HF weights
    for ref in ("global_step_5", "global_step_5/actor", "global_step_5/actor/huggingface"):
        (target,) = plan_eval(EvalOptions(ref=str(run_dir / "checkpoints" / ref), benchmarks=bench, db=db)).targets
        assert (target.run_id, [c.step for c in target.checkpoints]) == (spec.run_id, [5])


def test_verl_validation_metrics_are_ingested_under_verl_names(tmp_path):
    db_file = tmp_path / "results.db"
    store = open_store(f"sqlite:///{db_file}")
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in VERL_LINES) + '{"step": 3, "data": {"val-core/x/acc/me')

    def all_evals(run_id: str) -> list[tuple]:
        fields = ("step", "benchmark", "metric", "k", "scorer", "value")
        return [tuple(row[f] for f in fields) for row in store.run_history(run_id)[1]]

    try:
        assert store.ingest_metrics("r1", path) == 11  # the metrics, and in the same pass the evals below
        first = all_evals("r1")
        assert store.ingest_metrics("r1", path) == 0  # nothing new: idempotent
        store.ingest_metrics("r2", path)  # another run ingesting the same file (all of it again): upserts
        assert store.ingest_metrics("r1", tmp_path / "missing.jsonl") == 0
        rows, other = all_evals("r1"), all_evals("r2")
    finally:
        store.close()
    assert rows == first and other == rows
    assert rows == [
        (1, "aime25", "best@k/mean", 2, "verl-val", 0.35),
        (1, "aime25", "best@k/mean", 32, "verl-val", 0.6),
        (1, "aime25", "best@k/std", 32, "verl-val", 0.05),
        (1, "aime25", "maj@k/mean", 32, "verl-val", 0.3),
        (1, "aime25", "mean@k", 32, "verl-val", 0.25),
        (1, "aime25", "std@k", 32, "verl-val", 0.4),
        (2, "aime25", "mean@k", 32, "verl-val", 0.5),
        (2, "amc23", "mean@k", 32, "verl-val", None),  # NaN is stored as NULL; the benchmarks' one names
    ]
    assert not any(metric.startswith("pass@") for _, _, metric, *_ in rows)


def test_job_options_and_targets_round_trip_through_the_entry_point(assets, tmp_path):
    from rpg_cli.evaluation.__main__ import parse_targets
    from rpg_cli.evaluation.job import job_argv
    from rpg_cli.store.url import DEFAULT_DB_URL

    options = EvalOptions(
        ref="runs/s/r",
        benchmarks=("aime24", "x/y.parquet"),
        k=8,
        steps="1,2",
        scorer="math_verify",
        data_dir="d",
        db="sqlite:///a.db",
        runs_dir="rr",
        engine="hf",
        temperature=0.5,
        top_p=0.9,
        max_tokens=100,
        seed=3,
    )
    argv = job_argv(options)
    assert argv[:3] == ["python", "-m", "rpg_cli.evaluation"] and len(argv) == 4
    assert "a.db" not in " ".join(argv)  # the job never gets the store's URL ...
    assert parse_args(argv[3:]) == options.model_copy(update={"db": DEFAULT_DB_URL})  # ... all the rest
    with pytest.raises(EvalError, match="bad evaluation options: k: "):
        parse_args(['{"ref": "r", "k": "many"}'])

    db = f"sqlite:///{tmp_path / 'results.db'}"
    spec = make_run(tmp_path, assets["model"], db, steps=(1, 2))
    plan = plan_eval(EvalOptions(ref=spec.run_name, benchmarks=(str(assets["data"]),), db=db, steps="all"))
    argv = job_argv(plan.options, plan.targets)
    assert "results.db" not in " ".join(argv)
    assert parse_targets(argv[4]) == list(plan.targets)  # what this process resolved in the store, whole
    with pytest.raises(EvalError, match="bad evaluation targets"):
        parse_targets('[{"run_id": "x"}]')


# ------------------------------------------------------------- an evaluation killed, then resumed


class Killed(Exception):
    """Stands for the evaluation job's process dying: nothing after it runs."""


def fake_generator(calls: dict, die_after: int | None = None):
    """A deterministic stand-in for the model: answers 3 or 7 by the bits of the problem's seed; raises
    Killed instead of generating problem number `die_after` (counted over the whole run)."""
    from rpg_cli.evaluation.generation import Response

    class Fake:
        def generate(self, problems, seeds, sampling):
            out = []
            for seed in seeds:
                if die_after is not None and calls["generated"] >= die_after:
                    raise Killed
                calls["generated"] += 1
                out.append([Response(f"Answer: {'37'[(seed >> j) & 1]}", 4 + j) for j in range(sampling.k)])
            return out

        def close(self):
            pass

    return lambda model_dir, engine: Fake()


def _stored(db_file: Path) -> tuple[list, list]:
    """Every sample row (raw SQL: the API reads no row as such) and the run's dapo eval rows."""
    (run_id,) = run_ids(db_file)
    fields = ("step", "metric", "k", "value", "scorer_version")
    return (
        query(
            db_file,
            "SELECT step, problem, sample_index, extracted, correct, response_length FROM samples ORDER BY 1, 2, 3",
        ),
        sorted(tuple(r[f] for f in fields) for r in eval_rows(db_file, run_id) if r["scorer"] == "dapo"),
    )


@pytest.mark.parametrize("kill_at", range(6))
def test_a_killed_evaluation_job_resumes_and_nothing_is_lost_or_counted_twice(assets, tmp_path, kill_at):
    """The job's part (files only) killed before its problem `kill_at` of 6 (2 checkpoints x 3 problems),
    its last line torn on odd kills; `rpg eval`'s part ingests what is there, the job is run again, and
    the store ends up exactly as after an evaluation never interrupted."""
    from rpg_cli.evaluation.pipeline import run_eval
    from rpg_cli.evaluation.recording import ScoredFeed, finish_eval, prepare_target

    def setup(root: Path):
        db_file = root / "results.db"
        spec = make_run(root, assets["model"], f"sqlite:///{db_file}")
        options = EvalOptions(
            ref=spec.run_name,
            benchmarks=(str(assets["data"]),),
            db=f"sqlite:///{db_file}",
            k=K,
            engine="hf",
            steps="all",
        )
        plan = plan_eval(options)
        store = open_store(options.db)
        for target in plan.targets:
            prepare_target(store, target)
        return db_file, plan, store

    # never interrupted: the reference
    ref_db, plan, store = setup(tmp_path / "reference")
    calls = {"generated": 0}
    run_eval(plan, None, make_generator=fake_generator(calls))
    assert finish_eval(store, plan, ScoredFeed()) == [] and calls["generated"] == 6
    store.close()
    reference = _stored(ref_db)
    assert len(reference[0]) == 6 * K and reference[1]

    db_file, plan, store = setup(tmp_path / "killed")
    calls = {"generated": 0}
    with pytest.raises(Killed):
        run_eval(plan, None, make_generator=fake_generator(calls, die_after=kill_at))
    (target,) = plan.targets
    step = [c.step for c in target.checkpoints][kill_at // 3]
    scored = rundir.eval_scored_path(target.run_dir, step, "toy_add")
    if kill_at % 2:  # killed while writing its next line
        scored.parent.mkdir(parents=True, exist_ok=True)
        with open(scored, "ab") as f:
            f.write(b'{"position": 9, "problem": "to')
    feed = ScoredFeed()
    incomplete = finish_eval(store, plan, feed)  # what `rpg eval` does when the job ends: keep what is there
    assert len(query(db_file, "SELECT * FROM samples")) == kill_at * K
    assert len(incomplete) == (2 if kill_at < 3 else 1)

    calls["generated"] = 0
    results = run_eval(plan, None, make_generator=fake_generator(calls))  # the job again: what is missing only
    assert calls["generated"] == 6 - kill_at
    assert {(r.step, r.benchmark) for r in results} == {(1, "toy_add"), (2, "toy_add")}
    assert finish_eval(store, plan, feed) == []
    assert _stored(db_file) == reference  # every sample once, the metrics from them
    store.close()

    # a new `rpg eval` (no cursor: every file read from its start) changes nothing
    store = open_store(f"sqlite:///{db_file}")
    assert finish_eval(store, plan, ScoredFeed()) == []
    store.close()
    assert _stored(db_file) == reference


# ------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing-checkpoint", "is not a checkpoint, run directory or model directory"),
        ("unknown-benchmark", "unknown benchmark 'aime99'"),
        ("missing-data-file", "write it with `rpg prepare-data aime25`"),
        ("no-checkpoints", "has no checkpoints yet"),
        ("bad-steps", "--steps 'soon'"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(assets, tmp_path, case, message):
    db_file = tmp_path / "results.db"
    ref, bench, extra = str(assets["model"]), str(assets["data"]), []
    if case == "missing-checkpoint":
        ref = str(tmp_path / "runs" / "s1" / "gone" / "checkpoints" / "step_9")
    elif case == "unknown-benchmark":
        bench = "aime99"
    elif case == "missing-data-file":
        bench, extra = "aime25", ["--data-dir", str(tmp_path / "empty")]
    elif case == "no-checkpoints":
        ref = str(tmp_path / "run")
        (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    elif case == "bad-steps":
        extra = ["--steps", "soon"]
    result = rpg("eval", ref, "-b", bench, "--local", "--db", f"sqlite:///{db_file}", *extra)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rpg eval: ") and message in lines[0], result.output
    assert not db_file.exists()


# ------------------------------------------------------------------------------------ as a Ray job


@pytest.mark.slow
@pytest.mark.cluster  # a real Ray head and a whole run: make test-cluster
def test_eval_runs_as_a_ray_job_on_the_local_head(assets, tmp_path):
    pytest.importorskip("ray.job_submission", reason="the Ray job path needs ray[default]")
    from rpg_cli.orchestration.head import stop_local_head

    db_file = tmp_path / "results.db"
    runs = tmp_path / "runs"
    try:
        result = rpg(
            "eval",
            str(assets["model"]),
            "-b",
            str(assets["data"]),
            "--k",
            "2",
            "--db",
            f"sqlite:///{db_file}",
            "--runs-dir",
            str(runs),
            "--max-tokens",
            str(MAX_TOKENS),
        )
        assert result.exit_code == 0, result.output
        assert "Ray job rpg-eval-" in result.output and "mean@k" in result.output
    finally:
        stop_local_head(runs)
    samples = query(db_file, "SELECT position, sample_index, extracted, correct FROM samples")
    assert len(samples) == 3 * 2
    (run_id,) = run_ids(db_file)
    stored = evals(db_file, run_id)
    for (metric, k), value in recompute(samples).items():
        assert stored[(0, metric, k)] == pytest.approx(value, abs=1e-12)


@pytest.mark.slow
@pytest.mark.cluster  # a real Ray head and a whole run: make test-cluster
def test_an_eval_job_never_sees_the_store_password(assets, tmp_path, postgres_db, monkeypatch):
    """`rpg eval` as a Ray job on the local head, the store a PostgreSQL database whose URL (in $RPG_DB,
    as the README says) holds a password: the samples reach the store, and the password is nowhere Ray
    or the job could read it: the jobs API (list_jobs, get_job_info), the environment a job gets,
    the job's log, and every file under runs/ (Ray's own logs included)."""
    pytest.importorskip("ray.job_submission", reason="the Ray job path needs ray[default]")
    from rpg_cli.orchestration.head import connect, head_env_names, local_head, stop_local_head

    secret = "Pw-7731-eval-S3cr3t"
    url = postgres_db.replace("://rpg@", f"://rpg:{secret}@", 1)  # the test server trusts: any password works
    spec = make_run(tmp_path, assets["model"], url)
    runs = tmp_path / "runs"
    monkeypatch.setenv("RPG_DB", url)
    monkeypatch.chdir(tmp_path)
    try:
        result = rpg(
            "eval", spec.run_name, "-b", str(assets["data"]), "--k", "2", "--runs-dir", str(runs),
            "--max-tokens", str(MAX_TOKENS),
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "Ray job rpg-eval-" in result.output and secret not in result.output
        store = open_store(url)
        try:
            assert len(store.stored_samples(spec.run_id, 2, "toy_add", "dapo", plan_eval(
                EvalOptions(ref=spec.run_name, benchmarks=(str(assets["data"]),), db=url, k=2, max_tokens=MAX_TOKENS)
            ).targets[0].sampling.protocol)) == 3  # fmt: skip
        finally:
            store.close()

        client = connect(runs_dir=runs, start=False)
        jobs = client.list_jobs()
        assert [j.submission_id for j in jobs if (j.submission_id or "").startswith("rpg-eval-")]
        for job in jobs:
            seen = repr(job) + repr(client.get_job_info(job.submission_id or job.job_id))
            assert secret not in seen and "RPG_DB" not in seen and "RPG_EVAL_DB" not in seen, seen[:300]
            assert not ((job.runtime_env or {}).get("env_vars") or {})  # nothing of the store, nor anything else
            assert secret not in client.get_job_logs(job.submission_id)

        # what a job's process finds in its environment: the head's, which never held the URL
        probe = client.submit_job(
            entrypoint="python -c 'import json, os; print(\"ENV\", json.dumps(sorted(os.environ.items())))'"
        )
        for _ in range(240):
            if str(client.get_job_status(probe)) in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            time.sleep(0.5)
        env_line = next(line for line in client.get_job_logs(probe).splitlines() if line.startswith("ENV "))
        env = dict(json.loads(env_line[4:]))
        assert "PATH" in env and "RPG_DB" not in env and secret not in env_line
        names = head_env_names(runs)
        assert names is not None and "PATH" in names and "RPG_DB" not in names

        head = local_head(runs, start=False)
        roots = [runs] + ([Path(head.temp_dir)] if head is not None else [])
    finally:
        stop_local_head(runs)
    checked = 0
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                checked += 1
                assert secret.encode() not in path.read_bytes(), path
    assert checked > 20  # Ray's logs, the eval's files: the scan saw them


def test_a_sweep_evaluates_its_runs_and_skips_those_without_checkpoints(assets, tmp_path):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    spec = make_run(tmp_path, assets["model"], db)
    empty = run_spec(assets["model"]).model_copy(update={"seed": 1})
    (tmp_path / "runs" / "s1" / empty.run_name).mkdir(parents=True)
    store = open_store(db)
    store.record_plans(
        [
            RunPlan(
                empty.run_id,
                empty.run_name,
                "s1",
                "local",
                empty.canonical(),
                tmp_path / "runs" / "s1" / empty.run_name,
                [],
            )
        ]
    )
    store.close()
    plan = plan_eval(EvalOptions(ref="s1", benchmarks=(str(assets["data"]),), db=db, steps="all"))
    assert [(t.run_id, [c.step for c in t.checkpoints]) for t in plan.targets] == [(spec.run_id, [1, 2])]
    assert len(plan.skipped) == 1 and empty.run_name in plan.skipped[0] and "no checkpoints yet" in plan.skipped[0]
    assert plan.total_samples == 2 * 3 * K
