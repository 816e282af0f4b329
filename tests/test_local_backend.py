"""The local backend end to end on the toy task: learning, exact resume, metrics, and refusing what it cannot do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_spec

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rpg_cli import rundir  # noqa: E402
from rpg_cli.algorithms.table import ALGORITHMS  # noqa: E402
from rpg_cli.backends.local.trainer import main as run_trainer  # noqa: E402
from rpg_cli.datasets.toy import ToyPaths  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# Every metric the issue names, in every training step's line.
REQUIRED = (
    "actor/pg_loss",
    "actor/rpg_kl",  # the KL term of rpg's loss (a separate KL loss is actor/kl_loss, only where the spec has one)
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/grad_norm",
    "critic/score/mean",
    "critic/rewards/mean",
    "response_length/mean",
    "timing_s/step",
    "perf/throughput",
)
VAL_KEY = "val-core/toy_add/acc/mean@8"


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy task as `rpg prepare-data --toy` writes it (the real CLI)."""
    from typer.testing import CliRunner

    from rpg_cli.cli import app

    out = tmp_path_factory.mktemp("data")
    result = CliRunner().invoke(app, ["prepare-data", "--toy", "--out", str(out)])
    assert result.exit_code == 0, result.output
    paths = ToyPaths(out / "toy" / "model", out / "toy" / "train.parquet", out / "toy" / "val.parquet")
    assert all(p.exists() for p in (paths.model / "config.json", paths.train, paths.val))
    return paths


def test_toy_task_rows_are_verl_rows_the_scorer_accepts(toy):
    import pyarrow.parquet as pq

    from rpg_cli.datasets import VERL_SCHEMA
    from rpg_cli.rewards import score

    train, val = (pq.read_table(path) for path in (toy.train, toy.val))
    assert train.schema.names == val.schema.names == VERL_SCHEMA.names
    problems = {}
    for split, table in (("train", train), ("val", val)):
        for row in table.to_pylist():
            question = row["prompt"][0]["content"]
            a, b = int(question[:2]), int(question[3])
            assert question == f"{a}+{b}=" and row["reward_model"]["ground_truth"] == str(a + b)
            assert score(f"Answer: {a + b}", row["reward_model"]["ground_truth"])["acc"]
            problems.setdefault(split, set()).add((a, b))
    assert len(train) == 144 and len(val) == 18 and len(problems["train"] | problems["val"]) == 162
    # held out: no validation problem is trained on, and each is a new pairing of digits training has seen
    assert not problems["train"] & problems["val"]
    assert all(a // 10 + a % 10 == 9 for a, _ in problems["val"])
    for a, b in problems["val"]:
        assert any(t == a // 10 and bb == b for t, _, bb in _digits(problems["train"]))
        assert any(u == a % 10 and bb == b for _, u, bb in _digits(problems["train"]))


def _digits(problems):
    return [(a // 10, a % 10, b) for a, b in problems]


def answer_probability(model_dir: Path, rows: list[dict]) -> float:
    """The mean probability that sampling at temperature 1 answers a row right: P("Answer: <truth>" + eos)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total = 0.0
    for row in rows:
        question, truth = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
        prompt = tokenizer(question, add_special_tokens=False)["input_ids"]
        ids = prompt + tokenizer(f"Answer: {truth}", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].double(), -1)
        positions = torch.arange(len(prompt) - 1, len(ids) - 1)
        total += float(logp[positions, torch.tensor(ids[len(prompt) :])].sum().exp())
    return total / len(rows)


def test_the_starting_policy_copies_where_b_is_0_and_guesses_where_b_is_1_on_either_split(toy):
    """The warm-up (datasets/toy.py) taught the form and the copy, never adding, and only on training
    questions: held-out problems start where training ones do."""
    import pyarrow.parquet as pq

    for path in (toy.train, toy.val):
        rows = pq.read_table(path).to_pylist()
        copy = answer_probability(toy.model, [r for r in rows if r["prompt"][0]["content"][3] == "0"])
        add = answer_probability(toy.model, [r for r in rows if r["prompt"][0]["content"][3] == "1"])
        assert 0.4 < copy < 0.7 and 0.05 < add < 0.15, (path.name, copy, add)


def test_prepare_data_toy_refuses_sources_too(tmp_path):
    from typer.testing import CliRunner

    from rpg_cli.cli import app

    result = CliRunner().invoke(app, ["prepare-data", "aime24", "--toy", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--toy" in result.output
    assert not any(tmp_path.iterdir())


def write_spec(run_dir: Path, toy, **changes) -> Path:
    """The run's spec.json: the toy task, 150 steps of 8 prompts x 8 responses, validated every 50."""
    toy_run = dict(
        clip={"eps_low": 0.2, "eps_high": 0.28, "c": 10.0},
        model=str(toy.model),
        data={"train_files": [str(toy.train)], "val_files": [str(toy.val)]},
        train_batch_size=8,
        rollout_n=8,
        ppo_mini_batch_size=8,
        lr=5e-4,
        steps=150,
        val={"n": 8, "every": 50, "temperature": 1.0, "top_p": 1.0},
        rollout={"temperature": 1.0, "top_p": 1.0, "engine": "hf"},
        save_every=150,
    )
    spec = make_spec(**{**toy_run, **changes})
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "spec.json"
    path.write_text(json.dumps(spec.canonical()))
    return path


def read_metrics(run_dir: Path) -> list[dict]:
    """What metrics.jsonl says, restarts applied (store/ingest.py), as its lines in step order."""
    from rpg_cli.store.ingest import metrics_view

    view = metrics_view((run_dir / "metrics.jsonl").read_text())
    return [{"step": step, "data": data} for step, data in view.items()]


BASELINES = ("dr_grpo", "gspo", "cispo", "gmpo", "sapo")
FAMILIES = {
    "grpo": dict(algorithm="grpo", kl="none", reference="frozen"),
    "dapo": dict(
        algorithm="dapo",
        kl="none",
        beta=0.0,
        dynamic_sampling={"gen_batches": 1, "max_num_gen_batches": 4},
        overlong={"buffer": 16},
    ),
    "reinforce_pp": dict(algorithm="reinforce_pp", kl="none", reference="frozen"),
    "reinforce_pp_baseline": dict(
        algorithm="reinforce_pp_baseline", kl="none", beta=0.0, kl_loss={"estimator": "k1", "coef": 1e-3}
    ),
    "rpg": dict(algorithm="rpg", kl="urkl"),
    "rpg_reinforce": dict(algorithm="rpg_reinforce", kl="rkl"),
    # today's baselines with the table's defaults (GSPO's clip 3e-4/4e-4, SAPO's gate, ...), no KL term
    **{name: dict(algorithm=name, kl="none", beta=0.0, **ALGORITHMS[name].defaults) for name in BASELINES},
    # RLOO's beta is a k1 penalty in the reward, toward the frozen model
    "rloo": dict(algorithm="rloo", kl="none", reference="frozen"),
    # a researcher's own loss: the README's example (REINFORCE with a capped weight)
    "custom": dict(
        algorithm="custom",
        kl="none",
        beta=0.0,
        clip=None,
        loss="examples.my_loss:capped_reinforce",
        loss_settings={"clip": 2.0},
    ),
}


PAPERS = ("grpo", "dapo", "reinforce_pp", "reinforce_pp_baseline", "rpg", "rpg_reinforce")


def test_the_learning_test_covers_every_algorithm_of_the_table():
    assert {spec["algorithm"] for spec in FAMILIES.values()} == set(ALGORITHMS)


@pytest.mark.slow
@pytest.mark.parametrize("family", PAPERS)  # today's baselines: test_learning_baselines.py (the other xdist worker)
def test_each_algorithm_family_learns_the_toy_task(family, toy, tmp_path):
    assert_learns(family, toy, tmp_path)


def assert_learns(family: str, toy, tmp_path: Path) -> None:
    """150 steps of FAMILIES[family] on the toy task lift held-out accuracy, and what it learned is adding."""
    import pyarrow.parquet as pq

    spec = write_spec(tmp_path / family, toy, **FAMILIES[family])
    assert run_trainer(str(spec)) == 0
    lines = read_metrics(tmp_path / family)
    before = lines[0]["data"][VAL_KEY]  # step 0: the starting policy, on the 18 held-out problems
    after = lines[-1]["data"][VAL_KEY]
    assert lines[0]["step"] == 0 and lines[-1]["step"] == 150
    # the warmed-up toy model copies a where b = 0 about 60% of the time and guesses a units digit where
    # b = 1 (datasets/toy.py): about 0.33 in all; it has to learn to add b
    assert before < 0.45
    assert after >= before + 0.15, f"{family}: validation accuracy {before:.3f} -> {after:.3f}"
    # and what it learned is adding, on problems it never trained on: copying alone leaves b = 1 at 0.1
    adding = [r for r in pq.read_table(toy.val).to_pylist() if r["prompt"][0]["content"][3] == "1"]
    start, end = (answer_probability(m, adding) for m in (toy.model, tmp_path / family / "checkpoints" / "step_150"))
    assert end >= start + 0.05, f"{family}: held-out b = 1 accuracy {start:.3f} -> {end:.3f}"


def comparable(data: dict) -> dict:
    return {k: v for k, v in data.items() if not k.startswith(("timing_s/", "perf/throughput", "perf/time_per_step"))}


def test_resubmitted_run_resumes_from_its_checkpoint_without_repeating_steps(toy, tmp_path, capsys):
    # schedule-free and a reference reset every 2 steps: the state a resume must restore exactly
    changes = dict(
        steps=5,
        save_every=2,
        optimizer="schedule_free",
        reference={"every": 2},
        val={"n": 2, "every": 2, "temperature": 1.0, "top_p": 1.0},
    )
    whole = write_spec(tmp_path / "whole", toy, **changes)
    assert run_trainer(str(whole)) == 0
    broken = write_spec(tmp_path / "broken", toy, **changes)
    assert run_trainer(str(broken), stop_after=3) == 0  # "killed" after step 3; last checkpoint: step 2
    with (tmp_path / "broken" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "data": {"actor/pg_lo')  # a line cut short by the crash
    before = (tmp_path / "broken" / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert run_trainer(str(broken)) == 0  # the resubmitted job
    out = capsys.readouterr().out
    assert "resuming from step_2: continuing at step 3" in out
    assert "step 1/5" not in out and "step 2/5" not in out and "step 3/5" in out

    # appended to, never rewritten: the torn line ended, then a restart line voiding step 3 (redone)
    after = (tmp_path / "broken" / "metrics.jsonl").read_bytes()
    assert after.startswith(before + b'\n{"restart": {"keep_through": 2}}\n{"data": ')
    resumed, reference = read_metrics(tmp_path / "broken"), read_metrics(tmp_path / "whole")
    assert [line["step"] for line in resumed] == [0, 1, 2, 3, 4, 5]
    for got, want in zip(resumed, reference):
        assert comparable(got["data"]) == pytest.approx(comparable(want["data"]), rel=1e-6, abs=1e-9)
    checkpoints = tmp_path / "broken" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_2", "step_4", "step_5"]
    # the spec's default `checkpoints` (keep 1, weights all): only the newest keeps its trainer state, every
    # one keeps the HF weights `rpg eval` reads
    assert [(checkpoints / n / rundir.LOCAL_STATE_FILE).exists() for n in ("step_2", "step_4", "step_5")] == [
        False,
        False,
        True,
    ]
    assert all(rundir.find_checkpoints(tmp_path / "broken").values())


def test_metrics_jsonl_carries_every_verl_metric_and_checkpoints_load(toy, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = write_spec(
        tmp_path / "run",
        toy,
        steps=2,
        save_every=2,
        rollout={"temperature": 1.0, "top_p": 1.0, "engine": "vllm"},
        val={"n": 8, "every": 2, "temperature": 1.0, "top_p": 1.0},
    )
    assert run_trainer(str(spec)) == 0
    assert "note: rollout.engine vllm" in capsys.readouterr().out  # the fallback is said, not silent
    lines = read_metrics(tmp_path / "run")
    assert [line["step"] for line in lines] == [0, 1, 2]
    for line in lines[1:]:
        missing = [k for k in REQUIRED if k not in line["data"]]
        assert not missing, f"step {line['step']} lacks {missing}"
        assert all(isinstance(v, float) for v in line["data"].values())
    assert VAL_KEY in lines[0]["data"] and VAL_KEY in lines[2]["data"] and VAL_KEY not in lines[1]["data"]
    assert lines[1]["data"]["response_length/mean"] > 0
    checkpoint = tmp_path / "run" / "checkpoints" / "step_2"
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert tokenizer.decode(tokenizer("Answer: 7")["input_ids"]) == "Answer: 7"
    assert model.config.vocab_size == len(tokenizer)


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(resources={"nodes": 2, "gpus_per_node": 0, "cpus": 1}), "resources.nodes is 2"),
        (dict(resources={"nodes": 1, "gpus_per_node": 2, "cpus": 1}), "gpus_per_node is 2"),
        (dict(model="no/such/model-dir"), "model: no/such/model-dir does not exist"),
        (
            dict(data={"train_files": ["missing.parquet"], "val_files": []}),
            "data.train_files: missing.parquet does not exist",
        ),
        (dict(backend="verl"), "backend is 'verl'"),
    ],
)
def test_spec_the_backend_cannot_honour_fails_before_any_work(changes, words, toy, tmp_path, capsys):
    spec = write_spec(tmp_path / "run", toy, **changes)
    assert run_trainer(str(spec)) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["spec.json"]  # nothing written


def write_long_prompt_file(toy, path: Path) -> Path:
    """The toy's training set with one prompt of 258 tokens (one per character), far past its 32 positions."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(toy.train)
    rows = table.to_pylist()
    rows[3]["prompt"] = [{"role": "user", "content": "1+" * 129}]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    return path


def test_prompts_longer_than_the_models_positions_fail_before_any_work(toy, tmp_path, capsys):
    """Such a run once "succeeded" with score -1.000; now the job stops in one line, naming the file,
    the longest prompt and the limit."""
    long = write_long_prompt_file(toy, tmp_path / "long.parquet")
    spec = write_spec(tmp_path / "run", toy, data={"train_files": [str(long)], "val_files": [str(toy.val)]})
    assert run_trainer(str(spec)) == 2
    assert capsys.readouterr().err.strip() == (
        f"rpg local backend: data.train_files: {long}: the longest prompt is 258 tokens but {toy.model} has 32 "
        "positions (max_position_embeddings), which must hold a prompt and its response; use shorter prompts or "
        "a model with more positions"
    )
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["spec.json"]  # nothing written


def test_the_preflight_counts_prompt_tokens_as_the_trainer_encodes_them(toy, tmp_path):
    """rpg_cli.inputs counts without transformers; the trainer encodes with it: the same numbers."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from rpg_cli.backends.local.rollout import encode_prompt
    from rpg_cli.inputs import _PromptCounter

    long = write_long_prompt_file(toy, tmp_path / "long.parquet")
    tokenizer = AutoTokenizer.from_pretrained(toy.model)
    for name in (toy.train, long):
        expected = [len(encode_prompt(tokenizer, list(m))) for m in pq.read_table(name).column("prompt").to_pylist()]
        assert _PromptCounter(toy.model).lengths(str(name), threshold=0) == expected  # threshold 0: every count exact
    assert max(expected) == 258


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_job_entrypoint_refuses_a_gpu_it_does_not_have(toy, tmp_path):
    spec = write_spec(tmp_path / "run", toy, resources={"nodes": 1, "gpus_per_node": 1, "cpus": 1})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "rpg_cli.backends.local", "--spec", str(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "rpg local backend: resources.gpus_per_node is 1 but no CUDA GPU is visible here; allowed: 0 (runs on the CPU)"
    ]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---------------------------------------------------------------- DAPO's tricks on any algorithm, KL loss, seeds


def trainer_for(run_dir: Path, toy, **changes):
    from rpg_cli.backends.local.preflight import check
    from rpg_cli.backends.local.trainer import Trainer

    return Trainer(check(write_spec(run_dir, toy, **changes)))


def test_dynamic_sampling_on_rpg_filters_on_accuracy_in_rounds_and_keeps_groups_of_one(toy, tmp_path, monkeypatch):
    import rpg_cli.backends.local.trainer as trainer_module

    trainer = trainer_for(
        tmp_path / "run",
        toy,
        train_batch_size=2,
        rollout_n=2,
        ppo_mini_batch_size=2,
        dynamic_sampling={"gen_batches": 3, "max_num_gen_batches": 2},
        overlong={"buffer": 4},
    )
    calls = []

    def fake_score(rollouts, problems):
        calls.append(len(problems))
        n = len(rollouts.texts)
        acc = torch.tensor([float(i % 2) if i < 4 else 1.0 for i in range(n)])  # two mixed groups, then uniform
        return torch.full((n,), 0.5), acc  # the score is uniform: a filter on it would drop everything

    monkeypatch.setattr(trainer_module, "score_rollouts", fake_score)
    torch.manual_seed(0)
    batch = trainer.sample_batch()
    assert calls == [6]  # one round of 3 prompt batches of 2 filled the batch
    assert len(batch.rollouts.texts) == 4 and batch.acc.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert batch.gen_batches == 1 and trainer.gen_batches == 3
    budget = trainer.max_new_tokens(batch.rollouts)
    lengths = batch.rollouts.response_mask.sum(-1).float()
    assert torch.allclose(batch.rewards - batch.scores, (-(lengths - (budget - 4)) / 4).clamp(max=0))  # overlong

    # groups of one response are kept (std > 0 or size == 1), so rollout_n = 1 fills the batch at once
    single = trainer_for(
        tmp_path / "single",
        toy,
        train_batch_size=2,
        rollout_n=1,
        ppo_mini_batch_size=2,
        dynamic_sampling={"gen_batches": 1, "max_num_gen_batches": 5},
    )
    calls.clear()
    assert len(single.sample_batch().rollouts.texts) == 2 and calls == [2]


def test_kl_loss_toward_pi_old_enters_the_local_update(toy, tmp_path):
    spec = write_spec(
        tmp_path / "run",
        toy,
        algorithm="reinforce_pp_baseline",
        kl="none",
        beta=0.0,
        steps=1,
        ppo_mini_batch_size=4,
        kl_loss={"estimator": "k1", "coef": 0.5},
        val={"n": 1, "every": 1},
    )
    assert run_trainer(str(spec)) == 0
    step = read_metrics(tmp_path / "run")[-1]["data"]
    # the second mini-batch is off-policy, so log pi_theta - log pi_old (k1 toward pi_old) is no longer 0
    assert step["actor/kl_loss"] != 0.0 and abs(step["actor/kl_loss"]) < 1.0


def test_local_validation_samples_each_distinct_problem_once(toy, tmp_path):
    import pyarrow.parquet as pq

    from rpg_cli.backends.local.data import load_problems

    table = pq.read_table(toy.val)
    repeated = tmp_path / "val-x3.parquet"
    pq.write_table(pyarrow_concat([table, table, table]), repeated)
    trainer = trainer_for(tmp_path / "run", toy, data={"train_files": [str(toy.train)], "val_files": [str(repeated)]})
    assert len(trainer.val_problems) == table.num_rows  # not 3x: val.n samples per problem, as rpg eval
    assert len(load_problems([str(repeated)], trainer.tokenizer, 2048)) == 3 * table.num_rows  # training keeps rows


def pyarrow_concat(tables):
    import pyarrow as pa

    return pa.concat_tables(tables)


def test_the_seed_reaches_the_prompt_order_and_the_sampler(toy, tmp_path):
    from rpg_cli.backends.local.trainer import step_seed

    def first_batch(seed):
        trainer = trainer_for(tmp_path / f"s{seed}", toy, seed=seed)
        torch.manual_seed(step_seed(seed, 1))
        return trainer.sample_batch().rollouts.texts

    assert first_batch(0) == first_batch(0)
    assert first_batch(0) != first_batch(1)


def test_a_local_runs_metrics_carry_every_name_the_report_reads(toy, tmp_path):
    """The metric-name contract (rpg_cli.metrics) from the writer's side: a tiny run's metrics.jsonl,
    ingested, gives every default plot panel, the reward and validation columns of `rpg runs`, and every
    name both backends promise on each training step."""
    from types import SimpleNamespace

    from rpg_cli import metrics
    from rpg_cli.report import DEFAULT_PLOT_METRICS, runs_summary
    from rpg_cli.report.plots import plot_panels
    from rpg_cli.store import open_store

    run_dir = tmp_path / "sw" / "run"
    spec = write_spec(run_dir, toy, steps=2, save_every=2, val={"n": 2, "every": 1, "temperature": 1.0, "top_p": 1.0})
    assert run_trainer(str(spec)) == 0
    lines = read_metrics(run_dir)
    assert [line["step"] for line in lines] == [0, 1, 2]
    for line in lines[1:]:
        missing = sorted(metrics.EMITTED_BY_BOTH - set(line["data"]))
        assert not missing, f"step {line['step']} lacks {missing}"
    assert set(metrics.DIVERGED_KEYS) <= metrics.EMITTED_BY_BOTH  # the store's failure check always has its keys

    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        plan = SimpleNamespace(
            id="r1", name="run", sweep="sw", backend="local", spec=json.loads(spec.read_text()), run_dir=run_dir
        )
        store.record_plan(plan)
        store.ingest_metrics("r1", run_dir / "metrics.jsonl")
        panels = {p.key for p in plot_panels(store, ["r1"], DEFAULT_PLOT_METRICS)}  # strict: none may be missing
        (row,) = runs_summary(store)
    finally:
        store.close()
    wanted = {metrics.REWARD, metrics.ENTROPY, metrics.RESPONSE_LENGTH, metrics.RPG_KL, metrics.REF_KL, metrics.REF_AGE}
    assert wanted <= panels and any(metrics.VAL_KEY_RE.match(key) for key in panels)
    assert row["reward"] == lines[-1]["data"][metrics.REWARD] and row["val"] is not None


def test_kl_target_resets_the_reference_logs_ref_metrics_and_resumes_exactly(toy, tmp_path, capsys):
    # a tiny target and a weight-1 average: any KL to the reference resets it before the next step
    changes = dict(
        steps=6,
        save_every=3,
        beta=0.2,
        reference={"kl_target": 1e-9, "ema": 1.0},
        val={"n": 2, "every": 6, "temperature": 1.0, "top_p": 1.0},
    )
    whole = write_spec(tmp_path / "whole", toy, **changes)
    assert run_trainer(str(whole)) == 0
    lines = read_metrics(tmp_path / "whole")[1:]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5, 6]
    resets = 0
    for before, line in zip([None, *lines], lines):
        data = line["data"]
        reset = before is not None and before["data"]["ref/kl_ema"] > 1e-9
        resets += reset
        assert data["ref/resets"] == resets
        if reset or line["step"] == 1:  # pi_ref is the policy that sampled the step: KL exactly 0
            assert data["ref/steps_since_reset"] == 0 and data["ref/kl"] == 0.0
        else:
            assert data["ref/steps_since_reset"] == before["data"]["ref/steps_since_reset"] + 1
        assert data["ref/kl_ema"] == data["ref/kl"]  # ema weight 1
    assert resets >= 2
    broken = write_spec(tmp_path / "broken", toy, **changes)
    assert run_trainer(str(broken), stop_after=4) == 0  # "killed" after step 4; last checkpoint: step 3
    capsys.readouterr()
    assert run_trainer(str(broken)) == 0
    assert "resuming from step_3: continuing at step 4" in capsys.readouterr().out
    for got, want in zip(read_metrics(tmp_path / "broken"), read_metrics(tmp_path / "whole")):
        assert comparable(got["data"]) == pytest.approx(comparable(want["data"]), rel=1e-6, abs=1e-9)
