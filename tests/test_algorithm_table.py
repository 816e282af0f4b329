"""The algorithm table (rpg_cli/algorithms/table.py) drives the spec: which fields each algorithm takes, its
defaults, its KL variant and clip, the sweep's collapsing of axes, the report's names; and an algorithm added to
the table is a spec algorithm with no other edit (in a fresh process, as a researcher would add one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rpg_cli.algorithms import table
from rpg_cli.spec import ExperimentSpec, SpecError, SweepSpec, load_sweep
from rpg_cli.spec.algorithm_rules import NOUNS, show, takers
from rpg_cli.spec.errors import _validate

REPO = Path(__file__).resolve().parents[1]

# a value other than the neutral one, for each field only some algorithms take
NON_NEUTRAL = {
    "kl": "urkl",
    "beta": 1e-3,
    "reference": "frozen",
    "kl_loss": {"estimator": "k1", "coef": 1e-3},
    "kl_correction": True,
    "kl_clamp": False,
    "clip.c": 3.0,
    "clip.clipped_weight_in_sg": True,
    "sapo": {"tau_pos": 2.0},
    "loss": "examples.my_loss:capped_reinforce",
    "loss_settings": {"clip": 3.0},
    "advantage": "rloo",
}


@pytest.fixture(scope="module")
def cells() -> dict[str, dict]:
    """A valid canonical spec of every algorithm: the cells of experiments/smoke-baselines.yaml."""
    sys.path.insert(0, str(REPO))  # its custom loss's module, examples.my_loss
    try:
        return {x.algorithm: x.canonical() for x in load_sweep(REPO / "experiments" / "smoke-baselines.yaml").expand()}
    finally:
        sys.path.remove(str(REPO))


def with_value(spec: dict, path: str, value) -> dict:
    """`spec` with the (dotted) field `path` set."""
    out = json.loads(json.dumps(spec))
    *parents, leaf = path.split(".")
    node = out
    for part in parents:
        node = node[part]
    node[leaf] = value
    return out


def not_taken() -> list:
    """(algorithm, field) for every NEUTRAL field an algorithm does not take (clip's fields: where it has a clip)."""
    return [
        pytest.param(alg.name, path, id=f"{alg.name}-{path}")
        for alg in table.ALGORITHMS.values()
        for path in table.NEUTRAL
        if not alg.takes(path) and not (path.startswith("clip.") and alg.clip == "none")
    ]


def test_the_table_and_these_tests_know_the_same_fields():
    assert set(NON_NEUTRAL) == set(table.NEUTRAL) == set(NOUNS)
    assert all(NON_NEUTRAL[p] != n for p, n in table.NEUTRAL.items())


def test_every_algorithms_cell_is_valid_and_each_spec_field_it_takes_is_accepted(cells):
    assert set(cells) == set(table.ALGORITHMS)
    for name, spec in cells.items():
        alg = table.algorithm(name)
        for path in alg.applies - {"kl"}:  # kl: each variant, below
            _validate(ExperimentSpec, with_value(spec, path, NON_NEUTRAL[path]))
        if alg.takes("kl"):
            assert {_validate(ExperimentSpec, {**spec, "kl": kl}).loss_name for kl in table.KL_VARIANTS} == {
                alg.loss_name(kl) for kl in table.KL_VARIANTS
            }


@pytest.mark.parametrize("name, path", not_taken())
def test_a_field_an_algorithm_does_not_take_is_refused_in_one_line(cells, name, path):
    with pytest.raises(SpecError) as info:
        _validate(ExperimentSpec, with_value(cells[name], path, NON_NEUTRAL[path]))
    error = info.value
    assert error.path == path and "\n" not in str(error)
    neutral = show(table.NEUTRAL[path], quote=False)
    assert error.reason.startswith(f"{name} has no {NOUNS[path]} (got ")
    assert f"; allowed: {neutral} (" in error.reason
    assert error.reason.endswith(f"{path} is for {', '.join(takers(path))})")
    assert name not in takers(path)


@pytest.mark.parametrize("name, path", not_taken())
def test_a_sweep_axis_over_a_field_an_algorithm_does_not_take_collapses(cells, name, path):
    base = cells[name]
    sweep = SweepSpec.model_validate(
        {"name": "t", "base": base, "grid": {path: [table.NEUTRAL[path], NON_NEUTRAL[path]]}}
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO))
        specs = sweep.expand()
    assert [x.run_id for x in specs] == [ExperimentSpec.model_validate(base).run_id]  # one run: the algorithm's own


def test_a_kl_variant_is_required_exactly_where_the_table_says(cells):
    for name, spec in cells.items():
        alg = table.algorithm(name)
        if alg.takes("kl"):
            with pytest.raises(SpecError) as info:
                _validate(ExperimentSpec, {**spec, "kl": "none"})
            assert str(info.value) == f"kl: {name} needs a KL variant; allowed: fkl, rkl, ufkl, urkl"


def test_the_clip_rule_of_each_algorithm(cells):
    clip = {"eps_low": 0.2, "eps_high": 0.28}
    optional = ", ".join(a.name for a in table.ALGORITHMS.values() if a.clip == "optional")
    assert optional == "rpg, rpg_reinforce"
    for name, spec in cells.items():
        rule = table.algorithm(name).clip
        off, on = {**spec, "clip": None}, {**spec, "clip": clip}
        if rule == "required":
            with pytest.raises(SpecError) as info:
                _validate(ExperimentSpec, off)
            assert info.value.path == "clip" and info.value.reason.startswith(f"{name} needs a clip; allowed: {{")
            assert info.value.reason.endswith(f"(off only for {optional})")
            assert _validate(ExperimentSpec, on).clip.eps_high == 0.28
        elif rule == "none":
            with pytest.raises(SpecError) as info:
                _validate(ExperimentSpec, on)
            assert str(info.value) == f"clip: {name} has no clip; allowed: off"
            assert _validate(ExperimentSpec, off).clip is None
        else:
            assert _validate(ExperimentSpec, off).clip is None and _validate(ExperimentSpec, on).clip is not None


def test_the_tables_defaults_fill_what_a_spec_leaves_out_and_never_replace_what_it_gives(cells):
    for name, spec in cells.items():
        defaults = table.algorithm(name).defaults
        bare = {k: v for k, v in spec.items() if k not in defaults}
        canonical = _validate(ExperimentSpec, bare).canonical()
        for key, default in defaults.items():
            if isinstance(default, dict):  # a block: its own defaults fill the rest
                assert all(canonical[key][k] == v for k, v in default.items()), (name, key)
            else:
                assert canonical[key] == default, (name, key)
    gspo = _validate(ExperimentSpec, {**cells["gspo"], "loss_agg_mode": "token-mean"})
    assert gspo.loss_agg_mode == "token-mean"  # the spec's own value stands
    # a field the algorithm does not take need not be written: gspo has no beta
    no_beta = {k: v for k, v in cells["gspo"].items() if k != "beta"}
    assert _validate(ExperimentSpec, no_beta).run_id == _validate(ExperimentSpec, cells["gspo"]).run_id


def test_loss_name_and_advantage_estimator_come_from_the_table(cells):
    for name, spec in cells.items():
        x = _validate(ExperimentSpec, spec)
        assert x.entry is table.ALGORITHMS[name]
        assert x.loss_name == table.ALGORITHMS[name].loss_name(x.kl)
        assert x.advantage_estimator in table.ADVANTAGES
    custom = _validate(ExperimentSpec, {**cells["custom"], "advantage": "rloo"})
    assert (custom.loss_name, custom.advantage_estimator) == ("custom", "rloo")


def test_the_reports_names_and_order_come_from_the_table():
    from rpg_cli.report.names import METHOD_ORDER, method_base

    assert METHOD_ORDER[:5] == ["GRPO", "GRPO-Corrected", "DAPO", "REINFORCE++", "REINFORCE++-Baseline"]
    assert METHOD_ORDER[-6:] == ["Dr. GRPO", "RLOO", "GSPO", "CISPO", "GMPO", "SAPO"]
    assert METHOD_ORDER.index("RPG-REINFORCE-URKL") < METHOD_ORDER.index("Dr. GRPO")
    assert [method_base({"algorithm": a, "kl": "ufkl"}) for a in ("rpg", "gmpo", "dr_grpo")] == [
        "RPG-UFKL",
        "GMPO",
        "Dr. GRPO",
    ]


# ---------------------------------------------------------------------------------------------
# An algorithm added to the table, in a fresh process: nothing else is edited

NEW_ALGORITHM = """
import json, sys

from rpg_cli.algorithms import table

# its one entry (here inserted before the spec is imported, as an edit of table.py would be)
table.ALGORITHMS["my_pg"] = table.Algorithm(
    "my_pg",
    "MyPG",
    "dual-clip PPO on leave-one-out baselines, token sums per sequence",
    "ppo",
    "rloo",
    frozenset({"clip.c", "kl_loss", "reference"}),
    defaults={"loss_agg_mode": "seq-mean-token-sum"},
)

from rpg_cli.report.names import METHOD_ORDER, method_base
from rpg_cli.spec import ExperimentSpec, SpecError, SweepSpec
from rpg_cli.spec.errors import _validate

base = json.loads(sys.argv[1])  # an rpg run's spec
# less what my_pg does not take (beta) and what its defaults fill in (loss_agg_mode)
bare = {**{k: v for k, v in base.items() if k not in ("beta", "loss_agg_mode")}, "algorithm": "my_pg", "kl": "none"}
out = {"errors": []}
spec = _validate(ExperimentSpec, bare)
out["spec"] = [spec.loss_name, spec.advantage_estimator, spec.canonical()["loss_agg_mode"], spec.beta]
out["name"] = [spec.run_name.rsplit("-", 1)[0], method_base(spec.canonical()), METHOD_ORDER[-1]]
for change in ({"beta": 1e-3}, {"kl": "urkl"}, {"clip": None}, {"algorithm": "my_pgg"}):
    try:
        _validate(ExperimentSpec, {**bare, **change})
    except SpecError as e:
        out["errors"].append(str(e))
grid = {"algorithm": ["my_pg", "rpg"], "kl": ["fkl", "urkl"]}
sweep = SweepSpec.model_validate({"name": "t", "base": base, "grid": grid})
out["cells"] = sorted((x.algorithm, x.kl) for x in sweep.expand())
print(json.dumps(out))
"""


def test_an_algorithm_added_to_the_table_is_a_spec_algorithm_with_no_other_edit(cells):
    done = subprocess.run(
        [sys.executable, "-c", NEW_ALGORITHM, json.dumps(cells["rpg"])],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["spec"] == ["ppo", "rloo", "seq-mean-token-sum", 0.0]  # its loss, advantage, default; beta not taken
    assert out["name"] == ["my_pg-clip0.2_0.28-adamw-2k-s0", "MyPG", "MyPG"]
    beta, kl, clip, unknown = out["errors"]
    assert beta.startswith("beta: my_pg has no KL term (got 0.001); allowed: 0 (beta is for ")
    assert kl.startswith("kl: my_pg has no KL variant (got 'urkl'); allowed: none (kl is for rpg, rpg_reinforce)")
    assert clip == "clip: my_pg needs a clip; allowed: {eps_low, eps_high, c} (off only for rpg, rpg_reinforce)"
    assert unknown.startswith("algorithm: got 'my_pgg'; allowed: ") and "'my_pg'" in unknown
    # the kl axis multiplies rpg only: my_pg's collapses to none
    assert out["cells"] == [["my_pg", "none"], ["rpg", "fkl"], ["rpg", "urkl"]]


def test_a_clip_axis_collapses_to_off_for_an_algorithm_without_a_clip(cells):
    for name in (a.name for a in table.ALGORITHMS.values() if a.clip == "none"):
        grid = {"clip": [None, {"eps_low": 0.2, "eps_high": 0.28}], "clip.c": [3.0, 10.0]}
        sweep = SweepSpec.model_validate({"name": "t", "base": cells[name], "grid": grid})
        assert [x.run_id for x in sweep.expand()] == [ExperimentSpec.model_validate(cells[name]).run_id]
        explicit = SweepSpec.model_validate(
            {"name": "t", "base": cells[name], "include": [{"clip": {"eps_low": 0.2, "eps_high": 0.28}}]}
        )
        with pytest.raises(SpecError, match=rf"clip: {name} has no clip; allowed: off \(set in include\[0\]\.clip\)"):
            explicit.expand()


def test_an_algorithm_whose_verl_function_fixes_its_aggregation_refuses_another(cells):
    """verl 0.9.1's sapo aggregates seq-mean-token-mean whatever loss_agg_mode says: another mode would train
    differently on the two backends, so the spec refuses it (table field `fixed_agg`)."""
    fixed = [a for a in table.ALGORITHMS.values() if a.fixed_agg is not None]
    assert [a.name for a in fixed] == ["sapo"]
    for alg in fixed:
        assert cells[alg.name]["loss_agg_mode"] == alg.defaults["loss_agg_mode"] == alg.fixed_agg
        with pytest.raises(SpecError) as info:
            _validate(ExperimentSpec, with_value(cells[alg.name], "loss_agg_mode", "token-mean"))
        assert info.value.path == "loss_agg_mode"
        assert info.value.reason.startswith(f"{alg.name} aggregates as {alg.fixed_agg} ")
        assert info.value.reason.endswith(f"allowed: {alg.fixed_agg}")
