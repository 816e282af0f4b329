"""rpg_cli.rewards: the dapo "Answer:" rule, math-verify in worker processes, and verl's reward entry."""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import make_spec

from rpg_cli import rewards
from rpg_cli.benchmarks import NoScorerError, scorer_for
from rpg_cli.rewards import compute_score, score, score_batch, scorer_version
from rpg_cli.rewards import math_verify_pool as pool_module
from rpg_cli.rewards.dapo import normalize_final_answer, score_dapo
from rpg_cli.rewards.math_verify_pool import MathVerifyPool

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RPG_SHARED_DATA") or REPO.parent / "shared" / "data")
EVAL_FILES = ("aime-2024.parquet", "aime25.parquet", "amc-23.parquet")
FRAC_BOMB = "\\frac{" * 300 + "1" + "}{2}" * 300  # deeply nested: sympy takes seconds on it
MEGABYTE = 1 << 20


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_rewards", REPO / "benchmarks" / "bench_rewards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_bench()
verl_math_dapo = bench.load_verl_math_dapo()
needs_verl = pytest.mark.skipif(verl_math_dapo is None, reason="verl is not installed")


@pytest.fixture(scope="module")
def eval_rows() -> list[dict]:
    """Every row of the three evaluation sets as {data_source, ground_truth}."""
    if not all((SHARED_DATA / name).is_file() for name in EVAL_FILES):
        pytest.skip(f"evaluation parquet files not found in {SHARED_DATA}")
    import pyarrow.parquet as pq

    rows = []
    for name in EVAL_FILES:
        table = pq.read_table(SHARED_DATA / name, columns=["data_source", "reward_model"]).to_pylist()
        rows += [{"data_source": r["data_source"], "ground_truth": r["reward_model"]["ground_truth"]} for r in table]
    return rows


@pytest.fixture(scope="module")
def pool():
    with MathVerifyPool(workers=2, timeout=3.0) as mv_pool:
        yield mv_pool


# --- the dapo rule ----------------------------------------------------------------------------------------


def test_dapo_accepts_every_real_ground_truth_and_rejects_a_changed_one(eval_rows):
    truths = sorted({row["ground_truth"] for row in eval_rows})
    assert len(truths) > 50
    for truth in truths:
        right = score_dapo(f"Some reasoning.\n\nAnswer: {truth}", truth)
        assert right == {"score": 1.0, "acc": True, "pred": normalize_final_answer(truth)}, truth
        wrong = score_dapo(f"Some reasoning.\n\nAnswer: {bench._off_by_one(truth)}", truth)
        assert wrong["acc"] is False and wrong["score"] == -1.0, truth


@pytest.mark.parametrize("answer", ["336", "336^\\circ", "336^{\\circ}", "336 degrees", "$336^\\circ$", "x = 336"])
def test_dapo_normalizes_degree_forms(answer):
    assert score(f"So the angle is found.\nAnswer: {answer}", "336^\\circ")["acc"] is True


@pytest.mark.parametrize(
    "response, truth, acc, pred",
    [
        ("Answer: 3\nHmm, no.\nAnswer: 5", "5", True, "5"),  # the last Answer line counts
        ("Answer: 5\nHmm, no.\nAnswer: 3", "5", False, "3"),
        ("Answer: 12 cm", "12", True, "12"),  # trailing units
        ("Answer: 7 meters", "7", True, "7"),
        ("Answer: 3,000 dollars", "3000", True, "3000"),  # integer thousands commas
        ("ANSWER :\n42", "42", True, "42"),  # case-insensitive, value on the next line
        ("Answer: $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}", True, "\\frac{1}{2}"),
        ("Answer: \\text{(B)}", "(B)", True, "(B)"),
        ("Answer: 0.5", "\\frac{1}{2}", False, "0.5"),  # exact match only: no numeric equivalence
        ("**Answer: 5**", "5", False, "5**"),  # markdown bold: the paper's rule extracts `5**`
        ("**Answer:** 5", "5", False, "**5"),
        ("Therefore $\\boxed{540}$.", "540", True, "540"),  # no Answer line: the last box, unnormalized
        ("Therefore $\\boxed{336}$.", "336^\\circ", False, "336"),
        ("No final line at all.", "5", False, None),
        ("Answer: 5\n" + "more words " * 40, "5", False, None),  # Answer line outside the 300-character tail
    ],
)
def test_dapo_extraction_cases(response, truth, acc, pred):
    result = score_dapo(response, truth)
    assert result == {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}
    if verl_math_dapo is not None:  # the paper's rule as verl implements it agrees
        assert verl_math_dapo.compute_score(response, truth)["acc"] is acc


def test_score_rejects_unknown_scorer_naming_the_choices():
    with pytest.raises(ValueError, match="dapo, math_verify"):
        score("Answer: 1", "1", scorer="sympy")
    with pytest.raises(ValueError, match="dapo, math_verify"):
        score_batch(["Answer: 1"], ["1"], scorer="exact")


@pytest.mark.timeout(60)  # generous wall bound; each call below takes milliseconds
@pytest.mark.parametrize(
    "response, acc",
    [
        ("x" * MEGABYTE + "\nAnswer: 5", True),
        ("$" * MEGABYTE + "Answer: 5", True),
        ("Answer: " * (MEGABYTE // 8) + "5", False),  # the first Answer: in the tail swallows the rest of the line
        ("Answer: $" + FRAC_BOMB + "$", False),  # the Answer: itself lies outside the tail
        ("\\boxed{" * (MEGABYTE // 7), False),  # never closed
        ("{" * MEGABYTE, False),
    ],
)
def test_dapo_returns_promptly_on_adversarial_input(response, acc):
    assert score_dapo(response, "5")["acc"] is acc


@needs_verl
def test_normalization_equals_verl_on_random_token_soup():
    pieces = [
        "1",
        "23",
        ",",
        " ",
        "=",
        "$",
        "\\$",
        ".",
        "a ",
        "an ",
        "\\text{",
        "\\textbf{",
        "}",
        "{",
        "\\boxed{",
        "frac",
        "\\frac",
        "sqrt",
        "\\sqrt",
        "ab",
        "^\\circ",
        "^{\\circ}",
        "un",
        "its",
        "cm",
        "\\!",
        "\\;",
        '"',
        "\\ldots",
        "\\dots",
        "mbox",
        "\\text{and}",
        "\n",
        "\t",
        "x",
        "\\overline{",
        "²",
        "é",
        "-",
        "^2",
        "\\mathrm{th}",
    ]
    rng = random.Random(0)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert normalize_final_answer(text) == verl_math_dapo.normalize_final_answer(text), repr(text)


@needs_verl
def test_dapo_gives_verls_verdicts_on_generated_responses():
    for text, truth in bench.generate_responses(20_000, seed=1):
        ours, theirs = score_dapo(text, truth), verl_math_dapo.compute_score(text, truth)
        assert ours["acc"] == theirs["acc"] and ours["score"] == theirs["score"], (text[-300:], truth)
        assert ours["pred"] == (None if theirs["pred"] == "[INVALID]" else theirs["pred"]), (text[-300:], truth)


# --- math-verify ------------------------------------------------------------------------------------------


def test_math_verify_accepts_every_real_ground_truth_and_rejects_a_changed_one(eval_rows, pool):
    truths = sorted({row["ground_truth"] for row in eval_rows})
    right = pool.score_many([f"Reasoning.\n\nAnswer: {t}" for t in truths], truths)
    wrong = pool.score_many([f"Reasoning.\n\nAnswer: {bench._off_by_one(t)}" for t in truths], truths)
    assert [r["acc"] for r in right] == [True] * len(truths)
    assert [r["acc"] for r in wrong] == [False] * len(truths)
    assert all(r["pred"] is not None for r in right)


@pytest.mark.parametrize(
    "response, truth, acc",
    [
        ("Answer: 0.5", "\\frac{1}{2}", True),  # numeric equivalence, unlike dapo
        ("Answer: $\\frac{1}{2}$", "0.5", True),
        ("Answer: 336", "336^\\circ", True),
        ("**Answer: 5**", "5", True),  # bold is read, unlike dapo
        ("Thus $\\boxed{336}$.", "336^\\circ", True),
        ("Answer: 12 cm", "12", True),
        ("Answer: 3\nwait\nAnswer: 5", "5", True),
        ("Answer: 0.51", "\\frac{1}{2}", False),
        ("I cannot solve this.", "5", False),
    ],
)
def test_math_verify_equivalences(pool, response, truth, acc):
    result = pool.score_one(response, truth)
    assert result["acc"] is acc and result["score"] == (1.0 if acc else -1.0)
    if "cannot" in response:
        assert result["pred"] is None


@pytest.mark.timeout(120)
def test_math_verify_times_out_pathological_answers_and_keeps_working(pool):
    before = pool.timeouts
    start = time.monotonic()
    bomb = pool.score_one("Answer: $" + FRAC_BOMB + "$", "5", timeout=0.5)
    assert time.monotonic() - start < 0.5 + pool_module.HARD_GRACE_S + 5  # bounded by the deadline, not sympy
    assert bomb == {"score": -1.0, "acc": False, "pred": None}
    assert pool.timeouts == before + 1
    huge = pool.score_one("x" * MEGABYTE + "\nAnswer: 5", "5", timeout=30)
    assert huge["acc"] is True
    assert pool.score_one("Answer: 4", "4")["acc"] is True


@pytest.mark.timeout(120)
def test_math_verify_kills_a_worker_past_the_hard_deadline(monkeypatch):
    with MathVerifyPool(workers=1, timeout=5.0) as mv_pool:
        assert mv_pool.score_one("Answer: 1", "1")["acc"] is True
        (worker,) = mv_pool._all
        old_pid = worker.process.pid
        # a negative grace makes the parent's deadline (0.5 s) fall before the worker's own alarm (5 s)
        monkeypatch.setattr(pool_module, "HARD_GRACE_S", -4.5)
        result = mv_pool.score_one("Answer: $" + FRAC_BOMB + "$", "5")
        monkeypatch.setattr(pool_module, "HARD_GRACE_S", 2.0)
        assert result == {"score": -1.0, "acc": False, "pred": None}
        assert mv_pool.timeouts == 1
        assert worker.process.poll() is not None  # killed
        (replacement,) = mv_pool._all
        assert replacement.process.pid != old_pid
        assert mv_pool.score_one("Answer: 2", "2")["acc"] is True


@pytest.mark.timeout(120)
def test_math_verify_survives_a_worker_that_dies():
    with MathVerifyPool(workers=1, timeout=5.0) as mv_pool:
        assert mv_pool.score_one("Answer: 1", "1")["acc"] is True
        (worker,) = mv_pool._all
        worker.process.kill()  # our own child, by its Popen handle
        worker.process.wait(10)
        assert mv_pool.score_one("Answer: 2", "2") == {"score": -1.0, "acc": False, "pred": None}
        assert mv_pool.score_one("Answer: 3", "3")["acc"] is True


def test_score_batch_keeps_order_for_both_scorers():
    solutions = [f"Answer: {i}" for i in range(40)]
    truths = [str(i if i % 3 else i + 1) for i in range(40)]
    expected = [i % 3 != 0 for i in range(40)]
    assert [r["acc"] for r in score_batch(solutions, truths)] == expected
    assert [r["acc"] for r in score_batch(solutions, truths, scorer="math_verify", workers=2)] == expected
    with pytest.raises(ValueError, match="ground truths"):
        score_batch(solutions, truths[:-1])


def test_score_with_math_verify_uses_the_shared_pool():
    assert score("Answer: 0.5", "\\frac{1}{2}", scorer="math_verify")["acc"] is True
    assert rewards.shared_pool() is rewards.shared_pool()


# --- verl's reward entry ------------------------------------------------------------------------------------


def test_compute_score_routes_math_sources_to_dapo(eval_rows):
    sources = ["math_dapo", "aime24", "amc23", "math_dapo_holdout", "toy_add"]
    for source in sorted({row["data_source"] for row in eval_rows}) + sources:
        assert compute_score(source, "Answer: 5", "5", extra_info={"index": 0}) == {
            "score": 1.0,
            "acc": True,
            "pred": "5",
        }
        assert compute_score(source, "Answer: 0.5", "\\frac{1}{2}")["acc"] is False  # dapo by default


def test_compute_score_scorer_kwarg_and_verl_extras():
    result = compute_score("aime2025", "Answer: 0.5", "\\frac{1}{2}", None, scorer="math_verify", timeout=5.0)
    assert result["acc"] is True and result["score"] == 1.0
    # verl passes extra keyword arguments; a missing answer is "" so verl's maj@N stays computable
    result = compute_score("math_dapo", "no answer", "5", extra_info={}, sandbox_fusion_url=None)
    assert result == {"score": -1.0, "acc": False, "pred": ""}
    with pytest.raises(ValueError, match="dapo, math_verify"):
        compute_score("math_dapo", "Answer: 5", "5", scorer="nope")


def test_compute_score_refuses_unknown_sources_unless_a_scorer_is_named():
    with pytest.raises(NoScorerError, match=r"no scorer for benchmark 'gsm8k'.*scorers: \{gsm8k: dapo\}"):
        compute_score("gsm8k", "Answer: 5", "5")
    assert compute_score("gsm8k", "Answer: 5", "5", scorer="dapo")["acc"] is True
    assert compute_score("gsm8k", "Answer: 5", "5", scorers={"gsm8k": "dapo"})["acc"] is True


def test_one_table_gives_every_benchmark_the_papers_scorer_and_a_spec_overrides_it():
    table = {name: scorer_for(name) for name in ("aime24", "aime25", "amc23", "minerva_math", "olympiadbench")}
    assert table == {
        "aime24": "dapo",
        "aime25": "dapo",
        "amc23": "dapo",
        "minerva_math": "math_verify",  # the paper's verl fork: math-verify for Minerva-Math and OlympiadBench
        "olympiadbench": "math_verify",
    }
    # verl's data sources, the paper's files' and a held-out slice are judged as their benchmark
    assert [scorer_for(s) for s in ("math_dapo", "aime2025", "amc_23", "minerva-math", "math_dapo_holdout")] == [
        "dapo"
    ] * 3 + ["math_verify", "dapo"]
    assert scorer_for("toy_add") == "dapo"  # as the local backend scored the toy task before the table
    assert scorer_for("minerva-math", {"minerva_math": "dapo"}) == "dapo"  # by benchmark name or data source
    assert scorer_for("olympiadbench", {"olympiadbench": "dapo"}) == "dapo"
    # the same answer, judged by each benchmark's rule: math-verify sees 0.5 = 1/2, the Answer: rule does not
    assert compute_score("minerva_math", "Answer: 0.5", "\\frac{1}{2}")["acc"] is True
    assert compute_score("aime25", "Answer: 0.5", "\\frac{1}{2}")["acc"] is False
    assert (
        compute_score("minerva_math", "Answer: 0.5", "\\frac{1}{2}", scorers={"minerva_math": "dapo"})["acc"] is False
    )


def test_verls_reward_entry_point_scores_a_toy_row_with_no_scorer_passed(tmp_path):
    """The function verl 0.9.1 calls (its reward managers: compute_score(data_source=, solution_str=,
    ground_truth=, extra_info=) merged with custom_reward_function.reward_kwargs), loaded by verl from the
    overrides rpg generates for a toy run: no scorer by hand."""
    pytest.importorskip("verl")
    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from rpg_cli.backends.verl import launch

    toy = dict(
        beta=1e-4,
        clip="off",
        model=str(tmp_path / "model"),
        data={"train_files": [str(tmp_path / "train.parquet")]},
        train_batch_size=2,
        steps=1,
        save_every=1,
        backend="verl",
        resources={"nodes": 1, "gpus_per_node": 1, "cpus": 1},
    )

    def reward_fn(**changes):
        spec = make_spec(**{**toy, **changes})
        with initialize_config_dir(
            config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
        ):
            return get_custom_reward_fn(compose(config_name="ppo_trainer", overrides=launch.overrides(spec, tmp_path)))

    fn = reward_fn()
    row = {"data_source": "toy_add", "ground_truth": "7", "extra_info": {"index": 0, "split": None}}
    right = fn(data_source=row["data_source"], solution_str="3 + 4\nAnswer: 7", ground_truth="7", extra_info={})
    assert right == {"score": 1.0, "acc": True, "pred": "7"}
    assert (
        fn(data_source="toy_add", solution_str="Answer: 8", ground_truth="7", extra_info=row["extra_info"])["acc"]
        is False
    )
    # a spec's override reaches verl's call through reward_kwargs
    overridden = reward_fn(scorers={"minerva_math": "dapo"})
    args = dict(data_source="minerva_math", solution_str="Answer: 0.5", ground_truth="\\frac{1}{2}", extra_info={})
    assert overridden(**args)["acc"] is False and fn(**args)["acc"] is True
    with pytest.raises(NoScorerError, match="gsm8k"):
        fn(data_source="gsm8k", solution_str="Answer: 7", ground_truth="7", extra_info={})


@pytest.mark.parametrize(
    "response, truth, acc",
    [
        ("Answer: 1, 2", "1, 2", True),  # a bare "1, 2" would parse as its last number, 2
        ("Answer: 2, 1", "1, 2", True),  # multi-answer problems compare as sets
        ("Answer: $1, 2$", "1, 2", True),
        ("So $\\boxed{2, 1}$", "1, 2", True),
        ("Answer: 1", "1, 2", False),
        ("Answer: 1, 2, 3", "1, 2", False),
        ("Answer: 5.", "5", True),  # a sentence's full stop is not part of the answer
        ("Answer: (1, 2)", "(1,2)", True),
    ],
)
def test_math_verify_judges_the_answer_line_boxed_so_several_answers_are_a_set(pool, response, truth, acc):
    assert pool.score_one(response, truth)["acc"] is acc


@pytest.mark.timeout(120)
def test_compute_score_math_verify_from_many_threads():
    # verl's reward managers call the reward function from executor threads, where signal timeouts fail
    pairs = [(f"Answer: {i / 4}", f"\\frac{{{i}}}{{4}}") for i in range(60)]
    with ThreadPoolExecutor(max_workers=6) as threads:
        results = list(threads.map(lambda p: compute_score("amc_23", p[0], p[1], scorer="math_verify"), pairs))
    assert all(r["acc"] for r in results)
    assert threading.current_thread() is threading.main_thread()


def test_scorer_versions_are_distinct_labels():
    assert scorer_version("dapo").startswith("dapo-")
    assert scorer_version("math_verify").startswith("math-verify-")
    assert scorer_version("math_verify").endswith("+rpg2")  # the Answer: line boxed: verdicts of its own
    with pytest.raises(ValueError):
        scorer_version("other")


def test_importing_rewards_stays_cheap():
    code = (
        "import sys, rpg_cli.rewards, rpg_cli.evaluation.metrics\n"
        "heavy = [m for m in ('math_verify', 'sympy', 'torch', 'verl') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_a_data_files_benchmarks_are_read_as_the_file_is_now(tmp_path, monkeypatch):
    """The dry run names each file's benchmarks: a relative name in another directory, a file written after a
    first look, or one rewritten, is read again (a cached answer once kept "not readable here")."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rpg_cli.benchmarks import data_sources

    def write(directory: Path, *sources: str) -> None:
        (directory / "data").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"data_source": list(sources)}), directory / "data" / "val.parquet")

    monkeypatch.chdir(tmp_path)
    assert data_sources("data/val.parquet") is None  # not written yet
    write(tmp_path, "aime2025", "aime2025")
    assert data_sources("data/val.parquet") == ["aime2025"]
    write(tmp_path, "amc_23", "minerva_math", "amc_23")
    assert data_sources("data/val.parquet") == ["amc_23", "minerva_math"]
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere, "olympiadbench")
    monkeypatch.chdir(elsewhere)
    assert data_sources("data/val.parquet") == ["olympiadbench"]
