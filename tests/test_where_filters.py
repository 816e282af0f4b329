"""`--where FIELD=VALUE` takes only values some run could have, by the spec's own types (its literals, nested
models, bounds, the kinds of its lists and mappings), with or without a store: a filter that cannot match is
one line naming the field and what it takes, exit 2, never "0 runs". A value is written as in a spec's YAML
and matches the runs whose stored spec holds it. All through the real CLI."""

from __future__ import annotations

import json

import pytest
from conftest import make_spec
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.orchestration.plan import RunPlan
from rpg_cli.store import open_store

A = {"reference": "frozen"}  # rpg, urkl, clip 0.2/0.28, 2k, one train file: conftest's BASE_SPEC
B = {
    "kl": "ufkl",
    "clip": None,
    "reference": {"every": 10},
    "context": {"prompt": 64, "response": 32},
    "data": {"train_files": ["a.parquet", "b.parquet"]},
    "seed": 1,
}


@pytest.fixture
def db(tmp_path):
    """A store holding runs a (A) and b (B), both finished."""
    url = f"sqlite:///{tmp_path / 'runs' / 'results.db'}"
    store = open_store(url)
    for name, changes in (("a", A), ("b", B)):
        spec = make_spec(**changes)
        plan = RunPlan(spec.run_id, name, "sw", "local", spec.canonical(), tmp_path / "runs" / "sw" / name, ["true"])
        store.record_plans([plan])
        store.set_status(plan.id, "succeeded")
    store.close()
    return url


def runs(*args: str):
    return CliRunner().invoke(app, ["runs", *args])


def names(db: str, *clauses: str) -> list[str]:
    result = runs("--db", db, "--format", "json", *(x for c in clauses for x in ("--where", c)))
    assert result.exit_code == 0, result.output
    return [row["name"] for row in json.loads(result.stdout)]


CANNOT_MATCH = [
    (
        "reference=frozenn",
        "'frozenn' is not a value of reference; allowed: iterative, frozen, {every: K}, {kl_target: kappa, "
        "ema: alpha}, or both every and kl_target",
    ),
    ("context=3k", "'3k' is not a value of context; allowed: 2k, 4k, 8k, a mapping of prompt, response"),
    ("clip=1", "'1' is not a value of clip; allowed: a mapping of eps_low, eps_high, c, clipped_weight_in_sg, null"),
    ("data.train_files=x", "'x' is not a value of data.train_files; allowed: a list ([A, B])"),
    (
        "algorithm=rpg,grpoo",
        "'grpoo' is not a value of algorithm; allowed: grpo, dapo, reinforce_pp, reinforce_pp_baseline, rpg, "
        "rpg_reinforce, dr_grpo, rloo, gspo, cispo, gmpo, sapo, custom",
    ),
    ("kl!=urkk", "'urkk' is not a value of kl; allowed: fkl, rkl, ufkl, urkl, none"),
    ("seed=-1", "'-1' is not a value of seed; allowed: >= 0"),
    ("seed=1.5", "'1.5' is not a value of seed; allowed: an integer"),
    ("lr=.inf", "'.inf' is not a value of lr; allowed: a finite number"),
    ("clip.eps_low=1.5", "'1.5' is not a value of clip.eps_low; allowed: < 1"),
    ("clip={eps_low: x}", "'{eps_low: x}' is not a value of clip.eps_low; allowed: a number"),
    (
        "clip={eps_lo: 0.1}",
        "'{eps_lo: 0.1}' is not a value of clip (no field 'eps_lo'); allowed: a mapping of eps_low, eps_high, c, "
        "clipped_weight_in_sg",
    ),
    ("reference={every: 0}", "'{every: 0}' is not a value of reference.every; allowed: >= 1"),
    ("context={prompt: x}", "'{prompt: x}' is not a value of context.prompt; allowed: an integer"),
    ("kl_loss={estimator: k9}", "'{estimator: k9}' is not a value of kl_loss.estimator; allowed: k1, k2, k3"),
    ("model_max_length=none", "'none' is not a value of model_max_length; allowed: an integer, null"),
    ("trackers=foo", "'foo' is not a value of trackers; allowed: wandb, tensorboard, mlflow"),
    ("trackers.wandb.mode=x", "'x' is not a value of trackers.wandb.mode; allowed: online, offline, null"),
    ("verl.overrides=x", "'x' is not a value of verl.overrides; allowed: a list ([A, B])"),
    ("kl_correction=maybe", "'maybe' is not a value of kl_correction; allowed: true or false"),
    ("data.train_files=[a, b", "'[a, b' is not a YAML value (did not find expected ',' or ']')"),
    ("clip.eps_lo=0.2", "no spec field 'clip.eps_lo'; fields there: eps_low, eps_high, c, clipped_weight_in_sg"),
    ("verl.env.HOME=x", "verl.env has no fields of its own; filter on it whole (verl.env=VALUE)"),
]


@pytest.mark.parametrize(("clause", "said"), CANNOT_MATCH, ids=[c for c, _ in CANNOT_MATCH])
@pytest.mark.parametrize("store", ["store", "no-store"])
def test_a_filter_no_run_could_match_is_one_line_and_exit_2(clause, said, store, db, tmp_path):
    url = db if store == "store" else f"sqlite:///{tmp_path / 'nothing-yet.db'}"
    result = runs("--db", url, "--where", "algorithm=rpg", "--where", clause)
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr == f"rpg runs: --where {clause!r}: {said}\n"


def test_without_a_store_a_filter_that_could_match_says_no_runs_yet(tmp_path):
    result = runs("--db", str(tmp_path / "nothing-yet.db"), "--where", "clip=off", "--where", "context=4k")
    assert (result.exit_code, result.stdout) == (0, "")
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("rpg runs: no runs recorded yet (")


def test_compare_checks_its_filter_before_it_looks_for_a_store(tmp_path):
    result = CliRunner().invoke(
        app, ["compare", "a", "b", "--db", str(tmp_path / "nothing-yet.db"), "--where", "context=3k"]
    )
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        "rpg compare: --where 'context=3k': '3k' is not a value of context; allowed: 2k, 4k, 8k, a mapping of "
        "prompt, response\n"
    )


@pytest.mark.parametrize(
    ("clauses", "found"),
    [
        (["reference=frozen"], ["a"]),
        (["reference={every: 10}"], ["b"]),
        (["reference=iterative,frozen"], ["a"]),
        (["clip=off"], ["b"]),
        (["clip=null"], ["b"]),
        (["clip!=off"], ["a"]),
        (["clip={eps_low: 0.2}"], ["a"]),  # a partial mapping matches on the keys it gives
        (["clip={eps_low: 0.2, eps_high: 0.28}"], ["a"]),
        (["clip.eps_high=0.28"], ["a"]),
        (["context=2k"], ["a"]),
        (["context={prompt: 64, response: 32}"], ["b"]),
        (["context={prompt: 64}"], ["b"]),
        (["data.train_files=[a.parquet, b.parquet]"], ["b"]),
        (["data.train_files=[t.parquet]"], ["a"]),
        (["data.train_files=[a.parquet]"], []),  # a list matches whole
        (["kl=urkl,ufkl"], ["a", "b"]),
        (["seed=1"], ["b"]),
        (["lr=1e-6", "beta=0.001"], ["a", "b"]),  # numbers by value
        (["chat_template_kwargs={}"], ["a", "b"]),  # left out of spec.json while empty: its default
        (["verl={}"], ["a", "b"]),
        (["trackers=null"], ["a", "b"]),
        (["kl_correction=false", "kl_clamp=true"], ["a", "b"]),
    ],
)
def test_a_value_matches_the_runs_whose_spec_holds_it(clauses, found, db):
    assert names(db, *clauses) == found


def test_a_filter_that_could_match_but_does_not_says_so_in_one_line(db):
    result = runs("--db", db, "--where", "reference=iterative")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "0 runs: none matches --where\n", "")
