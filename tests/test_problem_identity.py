"""Each piece of spec and data logic written once (issue 33): a problem's identity (rpg_cli.benchmarks.problem_key)
shared by the dry run's count, the local trainer's validation set and `rpg eval`, with the store's fingerprint pinned;
the benchmark order; a spec as dotted paths; the run id and name (spec/identity.py); where beta goes."""

from __future__ import annotations

import pytest
from conftest import make_spec

from rpg_cli.benchmarks import BENCHMARK_ORDER, benchmark_sort_key, problem_key
from rpg_cli.spec import ExperimentSpec, flatten, identity

ADD = [{"role": "user", "content": "What is 2+3? Answer: $x$"}]
SUM = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Été: ∑ 1/n²?"}]


def test_the_stored_fingerprint_of_a_problem_never_changes():
    """samples.problem in every existing store is this hash: a change would orphan their samples."""
    from rpg_cli.evaluation.plan import Problem

    assert Problem(tuple(ADD), "5", "toy_add").key == "6ae371697cd5113e"
    assert Problem(tuple(SUM), "\\infty", "aime24").key == "9a5d348e1c4dcd24"
    # a row as pyarrow reads it: a missing role is the user's, other fields and the truth's type do not count
    raw = [{"role": None, "content": ADD[0]["content"], "name": None}]
    assert problem_key(raw, 5) == problem_key(ADD, "5") == "6ae371697cd5113e"
    assert problem_key(ADD, "6") != problem_key(ADD, "5")


def write_rows(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {"prompt": prompt, "reward_model": {"ground_truth": truth}, "data_source": source}
        for prompt, truth, source in rows
    ]
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


class CharTokenizer:
    """No chat template: the local backend tokenizes the messages' text (one id per byte)."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": list(text.encode())}


def test_the_dry_run_the_local_trainer_and_rpg_eval_count_the_same_problems(tmp_path):
    from rpg_cli.backends.local.data import load_problems
    from rpg_cli.evaluation.plan import read_problems
    from rpg_cli.inputs import count_problems

    other = [{"role": "user", "content": "What is 1+1?"}]
    path = write_rows(
        tmp_path / "val.parquet",
        [
            (ADD, "5", "toy_add"),
            (ADD, "5", "toy_add"),  # an older file's copy
            (ADD, "5", "aime24"),  # the same problem under another data source: still one problem
            ([{"role": None, "content": ADD[0]["content"]}], "5", "toy_add"),  # no role: the user's
            (other, "2", "toy_add"),
        ],
    )
    count = count_problems(path)
    validation = load_problems([str(path)], CharTokenizer(), 2048, distinct=True)
    problems, rows = read_problems(path)
    assert (count.rows, rows) == (5, 5)
    assert count.problems == len(validation) == len(problems) == 2  # before: the trainer counted 3, by data source
    assert [p.data_source for p in validation] == ["toy_add", "toy_add"]  # a problem's first row stands for it
    assert len(load_problems([str(path)], CharTokenizer(), 2048)) == 5  # training keeps every row


def test_benchmarks_sort_in_the_papers_order_then_by_name():
    names = ["zeta", "olympiadbench", "aime25", "alpha", "aime24", "minerva_math", "amc23"]
    assert sorted(names, key=benchmark_sort_key) == [*BENCHMARK_ORDER, "alpha", "zeta"]


def test_flatten_gives_dotted_paths_to_leaves():
    spec = {"clip": {"eps_low": 0.2, "eps_high": 0.28}, "verl": {}, "data": {"train_files": ["a"]}, "seed": 0}
    assert flatten(spec) == {
        "clip.eps_low": 0.2,
        "clip.eps_high": 0.28,
        "verl": {},  # an empty block is a leaf, not dropped
        "data.train_files": ["a"],
        "seed": 0,
    }
    assert flatten(3) == {"": 3}


def spec(**changes) -> ExperimentSpec:
    """An RPG-REINFORCE run of the 4k context on eight GPUs (conftest's base run otherwise)."""
    verl = {
        "algorithm": "rpg_reinforce",
        "context": "4k",
        "backend": "verl",
        "resources": {"gpus_per_node": 8, "cpus": 8},
    }
    return make_spec(**{**verl, **changes})


def test_the_run_id_and_name_are_identitys_functions_of_the_canonical_spec():
    run = spec()
    canonical = run.canonical()
    assert run.run_id == identity.run_id(canonical) and run.run_name == identity.run_name(canonical)
    assert run.run_name == f"rpg_reinforce-urkl-clip0.2_0.28-adamw-4k-s0-{run.run_id}"
    # the cell's id: the seeds of a cell share it (the trackers' group)
    assert identity.cell_id(canonical) == identity.cell_id(spec(seed=1).canonical()) != run.run_id
    # fields of NOT_IN_RUN_ID change the canonical spec, never the id
    moved = spec(resources={"gpus_per_node": 8, "cpus": 8, "gpu_memory_gib": 141.0}, checkpoints={"keep": 3})
    assert moved.canonical() != canonical and moved.run_id == run.run_id


@pytest.mark.parametrize(
    ("changes", "in_reward"),
    [
        ({"algorithm": "reinforce_pp", "kl": "none", "beta": 0.01}, True),
        ({"algorithm": "rloo", "kl": "none", "beta": 0.01}, True),
        ({"algorithm": "rloo", "kl": "none", "beta": 0.0}, False),  # no penalty to fold in
        ({}, False),  # rpg_reinforce: beta weighs its loss's KL term
    ],
)
def test_kl_in_reward_is_the_tables_beta_in_with_a_beta(changes, in_reward):
    assert spec(**changes).kl_in_reward is in_reward
