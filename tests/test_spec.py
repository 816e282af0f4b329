"""ExperimentSpec / SweepSpec: validation messages, canonical run ids, grid expansion, run plans."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pydantic
import pytest

from rpg_cli.orchestration.plan import RunPlan, known_states, plan_sweep
from rpg_cli.rundir import write_spec
from rpg_cli.spec import (
    CONTEXT_LENGTHS,
    ExperimentSpec,
    SpecError,
    SweepSpec,
    expand_sweep,
    load_spec,
    load_sweep,
)
from rpg_cli.spec.errors import _validate

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"

SPEC_YAML = """\
algorithm: rpg_reinforce
kl: urkl
beta: 1.0e-4
clip: {eps_low: 0.2, eps_high: 0.28}
optimizer: adamw
context: 4k
model: Qwen/Qwen3-4B
data: {train_files: [data/dapo-math-17k.parquet], val_files: [data/aime-2025.parquet]}
train_batch_size: 512
rollout_n: 16
ppo_mini_batch_size: 32
lr: 5.0e-7
steps: 400
seed: 0
save_every: 50
backend: verl
resources: {gpus_per_node: 8, cpus: 8}
"""


def yaml_dict(**changes) -> dict:
    """SPEC_YAML as a dict, with `changes`: the file tests' spec in the form the model tests validate."""
    import yaml

    data = yaml.safe_load(SPEC_YAML)
    data["beta"], data["lr"] = 1e-4, 5e-7  # PyYAML alone would read these as floats too (they have a dot)
    data.update(changes)
    return data


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def sweep_yaml(grid: str = "", extra: str = "", base_changes: str = "") -> str:
    base = textwrap.indent(SPEC_YAML + base_changes, "  ")
    return f"name: t\nbase:\n{base}\n{grid}\n{extra}\n"


def spec_error(fn, *args) -> str:
    with pytest.raises(SpecError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message, "SpecError messages are one line"
    return message


# ---------------------------------------------------------------------------------------------
# canonical run ids


def test_run_id_is_a_literal_stable_hash(tmp_path):
    spec = load_spec(write(tmp_path, SPEC_YAML))
    # A fixed spec must keep its id (stored runs and Ray submission ids depend on it); it changes only when
    # what a spec means changes (here: "4k" became 4096 + 4096 tokens, the paper's context lengths).
    assert spec.run_id == "38e3b824"
    assert spec.run_name == "rpg_reinforce-urkl-clip0.2_0.28-adamw-4k-s0-38e3b824"


def test_run_id_is_the_sha256_of_the_sorted_compact_json():
    import hashlib

    spec = ExperimentSpec.model_validate(yaml_dict())
    text = spec.canonical_json()
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    assert spec.run_id == hashlib.sha256(text.encode()).hexdigest()[:8]
    assert json.loads(text)["weight_decay"] == 0.01  # defaults are part of the canonical spec


def test_float_spelling_does_not_change_the_id(tmp_path):
    a = load_spec(write(tmp_path, SPEC_YAML.replace("beta: 1.0e-4", "beta: 1e-4"), "a.yaml"))
    b = load_spec(write(tmp_path, SPEC_YAML.replace("beta: 1.0e-4", "beta: 0.0001"), "b.yaml"))
    c = load_spec(write(tmp_path, SPEC_YAML.replace("lr: 5.0e-7", "lr: 0.0000005"), "c.yaml"))
    assert a.beta == b.beta == 1e-4 and isinstance(a.beta, float)
    assert a.run_id == b.run_id == c.run_id
    d = load_spec(write(tmp_path, SPEC_YAML.replace("beta: 1.0e-4", "beta: 2e-4"), "d.yaml"))
    assert d.run_id != a.run_id


def test_int_and_float_spelling_and_explicit_defaults_give_the_same_id():
    a = ExperimentSpec.model_validate(yaml_dict(entropy_coeff=0, weight_decay=0.01))
    b = ExperimentSpec.model_validate(yaml_dict())
    assert a.run_id == b.run_id


def test_id_does_not_depend_on_key_order():
    data = yaml_dict(val={"n": 32, "every": 5, "temperature": 1.0, "top_p": 0.7})
    shuffled = {k: data[k] for k in reversed(list(data))}
    shuffled["val"] = {k: data["val"][k] for k in reversed(list(data["val"]))}
    shuffled["clip"] = {"eps_high": 0.28, "eps_low": 0.2}
    assert list(shuffled) != list(data)
    assert ExperimentSpec.model_validate(shuffled).run_id == ExperimentSpec.model_validate(data).run_id


def test_id_is_the_same_in_another_interpreter_with_another_hash_seed(tmp_path):
    path = write(tmp_path, SPEC_YAML)
    code = f"from rpg_cli.spec import load_spec; print(load_spec({str(path)!r}).run_id)"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == load_spec(path).run_id


def test_every_field_takes_part_in_the_id():
    base = ExperimentSpec.model_validate(yaml_dict())
    for change in (
        {"seed": 1},
        {"optimizer": "schedule_free"},
        {"reference": {"every": 10}},
        {"clip": {"eps_low": 0.2, "eps_high": 0.28, "c": 3.0}},
        {"backend": "local"},
    ):
        assert ExperimentSpec.model_validate(yaml_dict(**change)).run_id != base.run_id, change


# ---------------------------------------------------------------------------------------------
# derived properties


@pytest.mark.parametrize(
    "changes, loss, estimator",
    [
        ({}, "rpg_reinforce_urkl", "rpg"),
        ({"algorithm": "rpg", "kl": "fkl"}, "rpg_fkl", "rpg"),
        ({"algorithm": "grpo", "kl": "none"}, "grpo", "grpo"),
        ({"algorithm": "grpo", "kl": "none", "kl_correction": True}, "grpo_corrected", "grpo"),
        ({"algorithm": "dapo", "kl": "none", "beta": 0.0}, "ppo", "grpo"),
        ({"algorithm": "reinforce_pp", "kl": "none"}, "ppo", "reinforce_pp"),
        ({"algorithm": "reinforce_pp_baseline", "kl": "none"}, "ppo", "reinforce_pp_baseline"),
    ],
)
def test_loss_name_and_advantage_estimator(changes, loss, estimator):
    spec = ExperimentSpec.model_validate(yaml_dict(**changes))
    assert (spec.loss_name, spec.advantage_estimator) == (loss, estimator)


def test_context_lengths_and_dapo_defaults():
    # "Nk" is N x 1024 prompt tokens and N x 1024 response tokens (the paper's 4,096 tokens for 2K)
    assert CONTEXT_LENGTHS == {"2k": (2048, 2048), "4k": (4096, 4096), "8k": (8192, 8192)}
    spec = ExperimentSpec.model_validate(yaml_dict(context="8k"))
    assert (spec.max_prompt_length, spec.max_response_length) == (8192, 8192)
    assert spec.dynamic_sampling is None and spec.overlong is None  # the tricks are off unless asked for
    dapo = ExperimentSpec.model_validate(yaml_dict(algorithm="dapo", kl="none", beta=0))
    assert dapo.canonical()["dynamic_sampling"] == {"gen_batches": 3, "max_num_gen_batches": 20}
    assert dapo.canonical()["overlong"] == {"buffer": 512, "penalty_factor": 1.0}
    plain = ExperimentSpec.model_validate(
        yaml_dict(algorithm="dapo", kl="none", beta=0, dynamic_sampling="off", overlong=False)
    )
    assert plain.dynamic_sampling is None and plain.overlong is None
    assert ExperimentSpec.model_validate(plain.canonical()) == plain  # the canonical form round-trips


def test_tricks_and_kl_loss_on_other_algorithms():
    rpg = ExperimentSpec.model_validate(yaml_dict(dynamic_sampling=True, overlong={"buffer": 256}))
    assert rpg.dynamic_sampling.max_num_gen_batches == 20 and rpg.overlong.buffer == 256
    rfpp = ExperimentSpec.model_validate(
        yaml_dict(algorithm="reinforce_pp", kl="none", beta=0, kl_loss={"estimator": "k1", "coef": 1e-4})
    )
    assert (rfpp.kl_loss.estimator, rfpp.kl_loss.coef) == ("k1", 1e-4)


def test_clip_off_and_every_reference(tmp_path):
    text = SPEC_YAML.replace("clip: {eps_low: 0.2, eps_high: 0.28}", "clip: off") + "reference: {every: 10}\n"
    spec = load_spec(write(tmp_path, text))
    assert spec.clip is None and spec.reference.every == 10
    assert "noclip" in spec.run_name


def test_spec_is_frozen():
    spec = ExperimentSpec.model_validate(yaml_dict())
    with pytest.raises(pydantic.ValidationError):
        spec.lr = 1.0  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# validation errors: file, field path, what is allowed


def test_unknown_field(tmp_path):
    path = write(tmp_path, SPEC_YAML + "learning_rate: 1e-6\n")
    message = spec_error(load_spec, path)
    assert message.startswith(f"{path}: learning_rate: unknown field; allowed: algorithm, kl,")
    assert "lr" in message.split("allowed:")[1]


def test_unknown_nested_field(tmp_path):
    path = write(tmp_path, SPEC_YAML.replace("eps_high: 0.28}", "eps_high: 0.28, cc: 3}"))
    message = spec_error(load_spec, path)
    assert "clip.cc: unknown field; allowed: eps_low, eps_high, c, clipped_weight_in_sg" in message


@pytest.mark.parametrize(
    "old, new, path, allowed",
    [
        ("rollout_n: 16", 'rollout_n: "16"', "rollout_n", "integer"),
        ("rollout_n: 16", "rollout_n: 1.5", "rollout_n", "integer"),
        ("optimizer: adamw", "optimizer: sgd", "optimizer", "'adamw' or 'schedule_free'"),
        ("context: 4k", "context: 16k", "context", "'2k', '4k' or '8k'"),
        ("seed: 0", "seed: [0, 1]", "seed", "integer"),
        ("train_files: [data/dapo-math-17k.parquet]", "train_files: data/x.parquet", "data.train_files", "list"),
    ],
)
def test_wrong_type(tmp_path, old, new, path, allowed):
    file = write(tmp_path, SPEC_YAML.replace(old, new))
    message = spec_error(load_spec, file)
    assert message.startswith(f"{file}: {path}: got ")
    assert allowed in message.split("allowed:")[1]


@pytest.mark.parametrize(
    "changes, path, allowed",
    [
        ({"algorithm": "grpo"}, "kl", "allowed: none"),  # grpo has no KL variant
        ({"algorithm": "rpg", "kl": "none"}, "kl", "allowed: fkl, rkl, ufkl, urkl"),
        ({"algorithm": "dapo", "kl": "none"}, "beta", "allowed: 0"),
        ({"algorithm": "rpg", "kl_correction": True}, "kl_correction", "allowed: false"),
        (
            {"algorithm": "rpg", "clip": {"eps_low": 0.2, "eps_high": 0.2, "clipped_weight_in_sg": True}},
            "clip.clipped_weight_in_sg",
            "allowed: false",
        ),
        ({"algorithm": "reinforce_pp", "kl": "none", "clip": None}, "clip", "off only for rpg, rpg_reinforce"),
        ({"dapo": {"dynamic_sampling": True}}, "dapo", "unknown field"),
        ({"kl_loss": {"estimator": "k1", "coef": 1e-4}}, "kl_loss", "allowed: null"),  # rpg_reinforce: beta is its KL
        (
            {"algorithm": "dapo", "kl": "none", "beta": 0, "kl_loss": {"estimator": "k3", "coef": 1e-3}},
            "kl_loss",
            "dapo has no KL loss",
        ),
        (
            {"algorithm": "reinforce_pp", "kl": "none", "kl_loss": {"estimator": "k4", "coef": 1e-3}},
            "kl_loss.estimator",
            "'k1', 'k2' or 'k3'",
        ),
        ({"kl_clamp": False}, "kl_clamp", "allowed: true"),
        ({"algorithm": "dapo", "kl": "none", "beta": 0, "reference": "frozen"}, "reference", "loads nothing"),
        ({"ppo_mini_batch_size": 48}, "ppo_mini_batch_size", "divisor of train_batch_size"),
    ],
)
def test_invalid_combinations(changes, path, allowed):
    from rpg_cli.spec.errors import _validate

    with pytest.raises(SpecError) as info:
        _validate(ExperimentSpec, yaml_dict(**changes))
    assert info.value.path == path
    assert allowed in info.value.reason


def test_eps_must_be_positive_and_c_above_one(tmp_path):
    path = write(tmp_path, SPEC_YAML.replace("eps_low: 0.2", "eps_low: 0"))
    assert "clip.eps_low: got 0; allowed: > 0" in spec_error(load_spec, path)
    path = write(tmp_path, SPEC_YAML.replace("eps_high: 0.28}", "eps_high: -0.1}"))
    assert "clip.eps_high: got -0.1; allowed: > 0" in spec_error(load_spec, path)
    path = write(tmp_path, SPEC_YAML.replace("eps_high: 0.28}", "eps_high: 0.28, c: 1.0}"))
    assert "clip.c: got 1.0; allowed: > 1" in spec_error(load_spec, path)


def test_context_must_fit_the_model(tmp_path):
    path = write(tmp_path, SPEC_YAML + "model_max_length: 4096\n")  # 4k = 4096 prompt + 4096 response
    message = spec_error(load_spec, path)
    assert message.startswith(f"{path}: context: 4k needs 4096+4096 tokens")
    assert message.endswith("allowed: 2k")
    ok = load_spec(write(tmp_path, SPEC_YAML + "model_max_length: 8192\n", "ok.yaml"))
    assert ok.model_max_length == 8192


def test_bad_reference(tmp_path):
    path = write(tmp_path, SPEC_YAML + "reference: {every: 0}\n")
    assert spec_error(load_spec, path).endswith("spec.yaml: reference.every: got 0; allowed: >= 1")


def test_missing_file_and_broken_yaml(tmp_path):
    assert spec_error(load_spec, tmp_path / "nope.yaml").endswith(
        "no such file; pass the path of a spec YAML (the paper's are in experiments/)"
    )
    path = write(tmp_path, "algorithm: [rpg\nkl: urkl\n")
    message = spec_error(load_spec, path)
    assert message.startswith(f"{path}: line ") and "invalid YAML" in message
    path.write_bytes(b"\xff\xfe\x00")  # not text (a parquet or a model file passed by mistake)
    assert (
        spec_error(load_sweep, path) == f"{path}: not a text file (byte 0 is not UTF-8); pass the path of a spec YAML"
    )
    path.write_text("")
    assert spec_error(load_sweep, path) == f"{path}: expected a mapping of SweepSpec fields, got an empty file"


# ---------------------------------------------------------------------------------------------
# sweeps: errors located in the file


def test_sweep_error_in_a_grid_value_names_its_index(tmp_path):
    grid = "grid:\n  clip:\n    - {eps_low: 0.2, eps_high: 0.28}\n    - {eps_low: -0.1, eps_high: 0.1}\n"
    path = write(tmp_path, sweep_yaml(grid))
    assert spec_error(load_sweep, path) == f"{path}: grid.clip[1].eps_low: got -0.1; allowed: > 0"


def test_sweep_error_in_base_include_exclude_and_top_level(tmp_path):
    path = write(tmp_path, sweep_yaml().replace("lr: 5.0e-7", "lr: -1"), "a.yaml")
    assert "base.lr: got -1; allowed: > 0" in spec_error(load_sweep, path)
    path = write(tmp_path, sweep_yaml("grid:\n  optimizer: [adamw]\n", "include:\n  - {optimiser: sgd}\n"), "b.yaml")
    assert "include[0].optimiser: unknown field; allowed: algorithm," in spec_error(load_sweep, path)
    path = write(tmp_path, sweep_yaml("grid:\n  optimizer: [adamw]\n", "exclude:\n  - {seed: 0}\n"), "c.yaml")
    assert spec_error(load_sweep, path).endswith("exclude[0].seed: not a grid axis; allowed: optimizer")
    path = write(tmp_path, sweep_yaml("grids:\n  optimizer: [adamw]\n"), "d.yaml")
    assert spec_error(load_sweep, path) == (
        f"{path}: grids: unknown field; allowed: name, base, grid, include, exclude, seeds"
    )
    path = write(tmp_path, sweep_yaml("grid:\n  optimizer: []\n"), "e.yaml")
    assert "grid.optimizer: empty axis" in spec_error(load_sweep, path)


def test_cell_errors_name_the_cell(tmp_path):
    grid = "grid:\n  algorithm: [grpo, rpg]\n  context: [2k, 8k]\n"
    path = write(tmp_path, sweep_yaml(grid, base_changes="model_max_length: 4096\n").replace("  kl: urkl\n", ""))
    message = spec_error(lambda p: load_sweep(p).expand(), path)
    # cell 1 (grpo, 2k) is fine; cell 2 is grpo at 8k, which does not fit 4096 tokens
    assert message.startswith(f"{path}: cell 2 (grpo-clip0.2_0.28-adamw-8k-s0) context: 8k needs 8192+8192")
    path = write(tmp_path, sweep_yaml("grid:\n  algorithm: [grpo, rpg]\n").replace("  kl: urkl\n", ""), "b.yaml")
    assert spec_error(lambda p: load_sweep(p).expand(), path) == (
        f"{path}: cell 2 (rpg-clip0.2_0.28-adamw-4k-s0) kl: rpg needs a KL variant; allowed: fkl, rkl, ufkl, urkl"
    )


# ---------------------------------------------------------------------------------------------
# expansion


def sweep(grid: dict | None = None, **fields) -> SweepSpec:
    return SweepSpec.model_validate({"name": "t", "base": yaml_dict(), "grid": grid or {}, **fields})


def cells(s: SweepSpec) -> list[tuple]:
    return [
        (x.algorithm, x.kl, x.clip and (x.clip.eps_low, x.clip.eps_high, x.clip.c), x.optimizer, x.seed)
        for x in s.expand()
    ]


def test_no_grid_is_one_run():
    assert len(sweep().expand()) == 1


def test_product_and_kl_collapse_for_baselines():
    s = sweep(
        {
            "algorithm": ["grpo", "dapo", "reinforce_pp", "rpg"],
            "kl": ["fkl", "urkl"],
            "optimizer": ["adamw", "schedule_free"],
        }
    )
    got = cells(s)
    # the kl axis multiplies only rpg: 3 baselines x 2 optimizers + rpg x 2 kl x 2 optimizers
    assert len(got) == 3 * 2 + 2 * 2
    assert {c[1] for c in got if c[0] != "rpg"} == {"none"}
    assert [x.beta for x in s.expand() if x.algorithm == "dapo"] == [0.0, 0.0]  # dapo's beta collapses to 0


def test_clip_subfields_collapse_for_unclipped_runs():
    s = sweep({"clip": [{"eps_low": 0.2, "eps_high": 0.28}, "off"], "clip.c": [3.0, 10.0]})
    got = cells(s)
    assert sorted(got, key=str) == sorted(
        [
            ("rpg_reinforce", "urkl", (0.2, 0.28, 3.0), "adamw", 0),
            ("rpg_reinforce", "urkl", (0.2, 0.28, 10.0), "adamw", 0),
            ("rpg_reinforce", "urkl", None, "adamw", 0),
        ],
        key=str,
    )


def test_identical_cells_are_merged():
    assert len(sweep({"optimizer": ["adamw", "adamw"], "lr": [5e-7, 0.0000005]}).expand()) == 1


def test_exclude_drops_matching_combinations_including_partial_mappings():
    s = sweep(
        {"kl": ["fkl", "urkl"], "clip": [{"eps_low": 0.2, "eps_high": 0.28}, {"eps_low": 0.1, "eps_high": 0.1}]},
        exclude=[{"kl": "fkl", "clip": {"eps_low": 0.1}}],
    )
    assert sorted((k, c[0]) for _, k, c, _, _ in cells(s)) == [("fkl", 0.2), ("urkl", 0.1), ("urkl", 0.2)]


def test_include_extends_matching_cells_and_otherwise_adds_a_cell():
    s = sweep(
        {"kl": ["fkl", "urkl"], "optimizer": ["adamw", "schedule_free"]},
        include=[
            {"kl": "urkl", "lr": 1e-6},  # added to both urkl cells
            {"kl": "urkl", "optimizer": "adamw", "lr": 2e-6},  # overwrites the added lr of one cell
            {"algorithm": "grpo", "kl": "fkl", "beta": 1e-3},  # algorithm is not an axis: added to fkl cells
            {"kl": "rkl", "optimizer": "adamw"},  # contradicts every cell's kl: a cell of its own
        ],
    )
    by_key = {(x.kl, x.optimizer, x.algorithm): x for x in s.expand()}
    assert by_key[("urkl", "adamw", "rpg_reinforce")].lr == 2e-6
    assert by_key[("urkl", "schedule_free", "rpg_reinforce")].lr == 1e-6
    # grpo was added to the fkl cells, whose kl then collapses to none
    assert by_key[("none", "adamw", "grpo")].beta == 1e-3 and ("none", "schedule_free", "grpo") in by_key
    assert by_key[("rkl", "adamw", "rpg_reinforce")].lr == 5e-7  # the new cell is base + entry only
    assert len(by_key) == 5


@pytest.mark.parametrize(
    "entry, field, words",
    [
        ({"algorithm": "dapo", "beta": 1e-3}, "beta", "dapo has no KL term"),
        ({"algorithm": "dapo", "kl": "urkl"}, "kl", "dapo has no KL variant"),
        ({"algorithm": "dapo", "reference": "frozen"}, "reference", "no reference model"),
        ({"algorithm": "rpg", "kl": "urkl", "kl_correction": True}, "kl_correction", "kl_correction is for grpo"),
        ({"algorithm": "rpg", "kl": "urkl", "kl_loss": {"estimator": "k1", "coef": 1e-4}}, "kl_loss", "allowed: null"),
        (
            {"algorithm": "grpo", "clip": {"eps_low": 0.2, "eps_high": 0.2, "clipped_weight_in_sg": True}},
            "clip.clipped_weight_in_sg",
            "clip.clipped_weight_in_sg is for rpg_reinforce",
        ),
    ],
)
def test_a_value_written_in_a_cells_own_include_entry_is_explicit_and_never_collapses(entry, field, words):
    message = spec_error(lambda: sweep({"optimizer": ["adamw"]}, include=[entry]).expand())
    assert f"{field}: " in message and words in message
    assert "(set in include[0]" in message  # where it was written
    # the same value from base or a grid axis collapses as designed
    base = {**yaml_dict(), **{k: v for k, v in entry.items() if k != "algorithm"}}
    grid = SweepSpec.model_validate({"name": "t", "base": base, "grid": {"algorithm": [entry["algorithm"], "rpg"]}})
    assert {x.algorithm for x in grid.expand()} == {entry["algorithm"], "rpg"}


def test_a_sub_field_of_a_switched_off_mapping_written_in_include_is_an_error():
    message = spec_error(lambda: sweep({"optimizer": ["adamw"]}, include=[{"clip": "off", "clip.c": 3.0}]).expand())
    assert "clip.c: sets c of a clip that is off in this cell (set in include[0].clip.c)" in message


def test_a_key_given_twice_in_a_yaml_mapping_names_the_key_and_its_lines(tmp_path):
    text = sweep_yaml().replace("  lr: 5.0e-7\n", "  lr: 5.0e-7\n  steps: 10\n  lr: 1.0e-6\n")
    path = write(tmp_path, text)
    assert spec_error(load_sweep, path) == (
        f"{path}: line 16: duplicate key 'lr' (first on line 14); allowed: each key once per mapping"
    )
    nested = write(
        tmp_path,
        SPEC_YAML.replace("clip: {eps_low: 0.2, eps_high: 0.28}", "clip: {eps_low: 0.2, eps_high: 0.28, eps_low: 0.1}"),
        "n.yaml",
    )
    assert "line 4: duplicate key 'eps_low'" in spec_error(load_spec, nested)
    # keys merged in from an anchor may be overridden: only a mapping's own keys must be distinct
    merged = write(
        tmp_path,
        sweep_yaml(
            "grid:\n  optimizer: [adamw]\n",
            "include:\n  - &a {algorithm: grpo, kl: none}\n  - {<<: *a, optimizer: schedule_free}\n",
        ),
        "m.yaml",
    )
    assert {x.optimizer for x in load_sweep(merged).expand() if x.algorithm == "grpo"} == {"adamw", "schedule_free"}


def test_include_never_overwrites_a_grid_value():
    s = sweep({"optimizer": ["adamw"]}, include=[{"optimizer": "schedule_free", "seed": 7}])
    assert sorted((x.optimizer, x.seed) for x in s.expand()) == [("adamw", 0), ("schedule_free", 7)]


def test_seeds_replicate_every_cell_and_conflict_with_a_seed_axis():
    s = sweep({"kl": ["fkl", "urkl"]}, include=[{"algorithm": "grpo", "kl": "none"}], seeds=[0, 1, 2])
    got = cells(s)
    assert len(got) == 3 * 3 and sorted({c[4] for c in got}) == [0, 1, 2]
    with pytest.raises(SpecError, match="seeds: the grid already has a seed axis"):
        sweep({"seed": [0, 1]}, seeds=[0]).expand()


def test_backend_override_and_dotted_keys():
    s = sweep({"rollout.temperature": [0.6, 1.0]})
    specs = expand_sweep(s, backend="local")
    assert [x.rollout.temperature for x in specs] == [0.6, 1.0]
    assert {x.backend for x in specs} == {"local"}


def test_interpolation_is_resolved(tmp_path):
    text = sweep_yaml("grid:\n  optimizer: [adamw]\n").replace("save_every: 50", "save_every: ${base.steps}")
    specs = load_sweep(write(tmp_path, text)).expand()
    assert specs[0].save_every == 400


# ---------------------------------------------------------------------------------------------
# the shipped grids


def combos(specs) -> set[tuple]:
    return {
        (x.algorithm, x.kl, (x.clip.eps_low, x.clip.eps_high) if x.clip else None, x.optimizer, x.context)
        for x in specs
    }


def test_paper_qwen25_7b_instruct_grid():
    specs = load_sweep(EXPERIMENTS / "paper-qwen25-7b-instruct.yaml").expand()
    assert len(specs) == 32
    opts, kls = ("adamw", "schedule_free"), ("fkl", "rkl", "ufkl", "urkl")
    baseline_clip = {
        "grpo": (0.2, 0.2),
        "dapo": (0.2, 0.28),
        "reinforce_pp": (0.2, 0.28),
        "reinforce_pp_baseline": (0.2, 0.28),
    }
    expected = {(a, "none", baseline_clip[a], o, "2k") for a in baseline_clip for o in opts}
    expected |= {("rpg", k, (0.2, 0.28), o, "2k") for k, o in itertools.product(kls, opts)}
    expected |= {
        ("rpg_reinforce", k, c, o, "2k") for k, c, o in itertools.product(kls, [(0.2, 0.28), (0.1, 0.1)], opts)
    }
    assert combos(specs) == expected
    for x in specs:
        assert x.model == "Qwen/Qwen2.5-7B-Instruct" and x.backend == "verl" and x.steps == 400
        assert (x.train_batch_size, x.rollout_n, x.ppo_mini_batch_size) == (512, 16, 32)
        assert x.lr == (5e-7 if x.algorithm == "rpg_reinforce" else 1e-6)
        assert x.beta == {"grpo": 1e-3, "dapo": 0.0, "reinforce_pp": 0.0, "reinforce_pp_baseline": 0.0}.get(
            x.algorithm, 1e-4
        )
        assert x.resources.nodes * x.resources.gpus_per_node == 8
        assert x.data.train_files == ["data/dapo-math-17k-eng.parquet"]
        assert x.data.val_files == ["data/aime-2024.parquet", "data/aime-2025.parquet", "data/amc-2023.parquet"]
    assert len({x.run_name for x in specs}) == 32


def test_paper_qwen3_4b_grid():
    specs = load_sweep(EXPERIMENTS / "paper-qwen3-4b.yaml").expand()
    assert len(specs) == 20
    core = [("grpo", "none", (0.2, 0.2)), ("dapo", "none", (0.2, 0.28))]
    core += [(a, k, (0.2, 0.28)) for a in ("rpg", "rpg_reinforce") for k in ("ufkl", "urkl")]
    expected = {(a, k, c, "adamw", ctx) for a, k, c in core for ctx in ("2k", "4k", "8k")}
    expected |= {(a, "none", (0.2, 0.28), "adamw", "4k") for a in ("reinforce_pp", "reinforce_pp_baseline")}
    assert combos(specs) == expected
    per_context = {ctx: sum(x.context == ctx for x in specs) for ctx in ("2k", "4k", "8k")}
    assert per_context == {"2k": 6, "4k": 8, "8k": 6}
    assert all(
        x.model == "Qwen/Qwen3-4B" and x.max_prompt_length + x.max_response_length <= x.model_max_length for x in specs
    )


def test_smoke_grid_runs_every_algorithm_locally():
    specs = load_sweep(EXPERIMENTS / "smoke.yaml").expand()
    baselines = [(a, "none") for a in ("grpo", "dapo", "reinforce_pp", "reinforce_pp_baseline")]
    rpgs = [(a, k) for a in ("rpg", "rpg_reinforce") for k in ("fkl", "rkl", "ufkl", "urkl")]
    assert sorted((x.algorithm, x.kl) for x in specs) == sorted(baselines + rpgs)
    assert {x.backend for x in specs} == {"local"} and len({x.optimizer for x in specs}) == 1
    assert {x.seed for x in specs} == {0} and {x.model for x in specs} == {"data/toy/model"}
    assert {x.resources.gpus_per_node for x in specs} == {0}
    assert specs[0].data.train_files == ["data/toy/train.parquet"]


# ---------------------------------------------------------------------------------------------
# run plans


def test_plan_sweep_entrypoints_resources_and_paths(tmp_path):
    s = load_sweep(EXPERIMENTS / "paper-qwen25-7b-instruct.yaml")
    plans = plan_sweep(s, tmp_path / "runs")
    assert len(plans) == 32 and all(isinstance(p, RunPlan) for p in plans)
    p = plans[0]
    assert p.run_dir == (tmp_path / "runs" / "paper-qwen25-7b-instruct" / p.name) and p.run_dir.is_absolute()
    # rpg's start waits for the run's 8 GPUs, then becomes verl's main_ppo with the overrides after --
    assert p.entrypoint[:8] == [
        "python",
        "-m",
        "rpg_cli.backends.verl.start",
        "--gpus",
        "8",
        "--run",
        f"rpg-{p.id}",
        "--",
    ]
    # the verl driver reserves no GPU: its Ray workers take the spec's 8
    assert (p.num_gpus, p.num_cpus, p.backend, p.sweep) == (0.0, 1.0, "verl", "paper-qwen25-7b-instruct")
    assert p.id == p.name[-8:] and p.spec["algorithm"] == p.name.split("-")[0]
    local = plan_sweep(s, Path("runs"), backend="local")[0]
    assert local.entrypoint[:3] == ["python", "-m", "rpg_cli.backends.local"]
    assert Path(local.entrypoint[-1]).is_absolute() and local.backend == "local" and local.id != p.id
    assert list(tmp_path.iterdir()) == []  # planning writes nothing


def test_write_spec_is_atomic_and_round_trips(tmp_path):
    plan = plan_sweep(load_sweep(EXPERIMENTS / "smoke.yaml"), tmp_path)[0]
    path = write_spec(plan.run_dir, plan.spec)
    assert path == plan.run_dir / "spec.json" and json.loads(path.read_text()) == plan.spec
    assert sorted(q.name for q in plan.run_dir.iterdir()) == ["spec.json"]  # no temp file left
    assert ExperimentSpec.model_validate(json.loads(path.read_text())).run_id == plan.id


def test_run_action():
    from rpg_cli.states import run_action

    assert [run_action(s) for s in ("new", "pending", "running", "succeeded", "failed", "stopped")] == [
        "submit",
        "attach",
        "attach",
        "done",
        "skip",
        "skip",
    ]
    assert run_action("failed", retry_failed=True) == "submit"


def test_known_states_reads_the_store_only_when_the_database_exists(tmp_path, monkeypatch):
    from rpg_cli.store import open_store, sqlite_path

    monkeypatch.chdir(tmp_path)
    plans = [RunPlan(i, f"run-{i}", "s", "local", {}, tmp_path / "runs" / i, []) for i in ("a", "b")]
    db = Path("sqlite-results.db")  # a bare path, even one that starts like a URL scheme
    url = f"sqlite:///{db}"
    assert sqlite_path(url) == str(db) == sqlite_path(str(db)) and sqlite_path("postgresql://h/db") is None
    assert known_states(url, plans) == {"a": "new", "b": "new"}
    assert not db.exists()  # not created by looking
    store = open_store(url)
    store.record_plans(plans[:1])
    store.set_status("a", "succeeded")
    store.close()
    assert known_states(url, plans) == {"a": "succeeded", "b": "new"}
    assert known_states(str(db), plans) == {"a": "succeeded", "b": "new"}  # a bare path is the same file


def test_a_sweep_without_runs_is_an_error():
    with pytest.raises(SpecError, match="exclude: removes every grid combination"):
        sweep({"optimizer": ["adamw"]}, exclude=[{"optimizer": "adamw"}]).expand()


@pytest.mark.parametrize("value", ["${oc.env:DB_PASS}", "x-${oc.env:HOME,/}", "${ env:DB_PASS}"])
def test_an_environment_interpolation_is_refused_before_it_is_read(tmp_path, monkeypatch, value):
    """A spec is published (spec.json, the store, Ray's jobs API): ${oc.env:...} would carry a value of rpg's own
    environment into it under any name. Refused in one line naming the field, the value never read."""
    monkeypatch.setenv("DB_PASS", "hunter2")
    text = sweep_yaml("grid:\n  optimizer: [adamw]\n").replace(
        "save_every: 50", "save_every: 50\n  verl: {env: {NCCL_DEBUG: '" + value + "'}}"
    )
    with pytest.raises(SpecError) as error:
        load_sweep(write(tmp_path, text))
    message = str(error.value)
    assert "base.verl.env.NCCL_DEBUG" in message and "reads rpg's environment" in message
    assert "hunter2" not in message and "\n" not in message


# ---------------------------------------------------------------------------------------------
# run ids from before the algorithm table, and the fields it brought


def test_run_ids_and_names_from_before_the_algorithm_table_stand():
    # computed with the if-chains the table replaced: stored runs and Ray submission ids depend on them
    assert [x.run_name for x in load_sweep(EXPERIMENTS / "smoke.yaml").expand()] == [
        "grpo-clip0.2_0.28-adamw-2k-s0-65c5b17e",
        "dapo-clip0.2_0.28-adamw-2k-s0-25745ebb",
        "reinforce_pp-clip0.2_0.28-adamw-2k-s0-62a580da",
        "reinforce_pp_baseline-clip0.2_0.28-adamw-2k-s0-63899e89",
        "rpg-fkl-clip0.2_0.28-adamw-2k-s0-47283a7c",
        "rpg-rkl-clip0.2_0.28-adamw-2k-s0-07de2984",
        "rpg-ufkl-clip0.2_0.28-adamw-2k-s0-fa3ef75a",
        "rpg-urkl-clip0.2_0.28-adamw-2k-s0-544a5dc8",
        "rpg_reinforce-fkl-clip0.2_0.28-adamw-2k-s0-ca42df4b",
        "rpg_reinforce-rkl-clip0.2_0.28-adamw-2k-s0-8349dba5",
        "rpg_reinforce-ufkl-clip0.2_0.28-adamw-2k-s0-f8355dd8",
        "rpg_reinforce-urkl-clip0.2_0.28-adamw-2k-s0-2ec1c41f",
    ]
    canonical = ExperimentSpec.model_validate(yaml_dict()).canonical()
    for field in ("sapo", "loss", "loss_settings", "loss_source", "advantage", "rollout_correction"):
        assert field not in canonical  # omitted while empty: the ids above stand


def baseline(algorithm: str, **changes) -> ExperimentSpec:
    """A spec of one of today's baselines: its table defaults, no KL."""
    data = {k: v for k, v in yaml_dict().items() if k not in ("kl", "beta", "clip")}
    return _validate(ExperimentSpec, {**data, "algorithm": algorithm, **changes})


def test_sapos_gate_defaults_to_its_papers_temperatures_and_is_in_the_id():
    sapo = baseline("sapo")
    assert (sapo.sapo.tau_pos, sapo.sapo.tau_neg, sapo.clip, sapo.loss_agg_mode) == (
        1.0,
        1.05,
        None,
        "seq-mean-token-mean",
    )
    assert sapo.run_name.startswith("sapo-adamw-4k-s0-")  # no clip, and no "noclip" either: it never has one
    assert baseline("sapo", sapo={"tau_neg": 2.0}).run_id != sapo.run_id
    assert baseline("sapo", sapo={}).run_id == sapo.run_id
    with pytest.raises(SpecError, match="sapo.tau_pos: got 0; allowed: > 0"):
        baseline("sapo", sapo={"tau_pos": 0})


def test_rollout_correction_under_verls_names_and_in_the_id():
    plain = baseline("gspo")
    tis = baseline("gspo", rollout_correction={"rollout_is": "token"})
    assert tis.rollout_correction.rollout_is_threshold == 2.0  # verl's default
    assert tis.run_id != plain.run_id and tis.canonical()["rollout_correction"]["rollout_is"] == "token"
    assert ExperimentSpec.model_validate(tis.canonical()).run_id == tis.run_id  # spec.json reads back the same
    both = ExperimentSpec.model_validate(
        {
            **yaml_dict(),  # rpg_reinforce: every algorithm takes it
            "rollout_correction": {
                "rollout_is": "sequence",
                "rollout_is_threshold": 5.0,
                "rollout_rs": "token_k1,seq_mean_k3",
                "rollout_rs_threshold": "0.5_2.0,0.01",
            },
        }
    )
    assert both.rollout_correction.rollout_rs == "token_k1,seq_mean_k3"


@pytest.mark.parametrize(
    "block, path, words",
    [
        ({}, "rollout_correction", "turns on neither importance weights nor rejection"),
        ({"rollout_is": "tokens"}, "rollout_correction.rollout_is", "allowed: 'token' or 'sequence'"),
        ({"rollout_is": "token", "rollout_is_threshold": 1.0}, "rollout_correction.rollout_is_threshold", "> 1"),
        ({"rollout_rs": "token_k4", "rollout_rs_threshold": 2.0}, "rollout_correction.rollout_rs", "token_k1, "),
        ({"rollout_rs": "seq_mean_k3"}, "rollout_correction", "needs rollout_rs_threshold"),
        ({"rollout_is": "token", "rollout_rs_threshold": 2.0}, "rollout_correction", "rejects nothing"),
        (
            {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": "0.5_2"},
            "rollout_correction.rollout_rs_threshold",
            "no '_'",
        ),
        (
            {"rollout_rs": "token_k1,token_k2", "rollout_rs_threshold": "0.5_2,1,3"},
            "rollout_correction.rollout_rs_threshold",
            "3 thresholds for 2 modes",
        ),
        (
            {"rollout_rs": "token_k1", "rollout_rs_threshold": "2_0.5"},
            "rollout_correction.rollout_rs_threshold",
            "lower <= upper",
        ),
        (
            {"rollout_rs": "token_k2", "rollout_rs_threshold": 1, "rollout_is_batch_normalize": True},
            "rollout_correction",
            "which are off",
        ),
        ({"rollout_is": "token", "bypass_mode": True}, "rollout_correction.bypass_mode", "unknown field"),
    ],
)
def test_a_rollout_correction_verl_would_refuse_or_ignore_is_refused_in_one_line(block, path, words):
    with pytest.raises(SpecError) as info:
        baseline("gspo", rollout_correction=block)
    assert info.value.path == path and words in info.value.reason and "\n" not in str(info.value)


LOSS_MODULE = """
def my_loss(*, log_prob, old_log_prob, advantages, response_mask, settings, **_):
    return -advantages * log_prob
"""


@pytest.fixture
def loss_module(tmp_path, monkeypatch) -> Path:
    """A researcher's loss module, mylosses/pg.py, importable from tmp_path (sys.path and PYTHONPATH)."""
    package = tmp_path / "mylosses"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pg.py").write_text(LOSS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return package / "pg.py"


def custom(**changes) -> ExperimentSpec:
    data = {k: v for k, v in yaml_dict().items() if k not in ("kl", "beta", "clip")}
    return _validate(ExperimentSpec, {**data, "algorithm": "custom", "loss": "mylosses.pg:my_loss", **changes})


def test_a_custom_loss_is_named_by_its_function_and_its_source_is_in_the_id(loss_module):
    import hashlib

    spec = custom(loss_settings={"scale": 2.0, "mode": "a", "list": [1, None]})
    assert spec.loss_source == hashlib.sha256(loss_module.read_bytes()).hexdigest()[:12]
    assert spec.run_name.startswith("custom-my_loss-adamw-4k-s0-")
    assert (spec.loss_name, spec.advantage_estimator, spec.clip) == ("custom", "grpo", None)
    assert custom(loss_settings={"scale": 3.0}).run_id != spec.run_id  # the settings are in the id
    assert custom(advantage="rloo").advantage_estimator == "rloo"
    same = ExperimentSpec.model_validate(spec.canonical())
    loss_module.write_text(LOSS_MODULE + "\n# edited\n")
    assert custom(loss_settings={"scale": 2.0, "mode": "a", "list": [1, None]}).run_id != spec.run_id  # a new run
    # spec.json keeps its hash: the run it recorded keeps its id
    assert ExperimentSpec.model_validate(spec.canonical()).run_id == same.run_id == spec.run_id
    assert custom(loss_settings={"x": None}).canonical()["loss_settings"] == {"x": None}  # a setting, not empty


@pytest.mark.parametrize(
    "changes, path, words",
    [
        ({"loss": "mylosses/pg.py"}, "loss", "allowed: package.module:function"),
        ({"loss": "nowhere.pg:my_loss"}, "loss", "cannot find module 'nowhere.pg'"),
        ({"loss": None}, "loss", "custom needs a loss; allowed: package.module:function"),
        ({"loss_settings": {"when": __import__("datetime").date(2025, 1, 1)}}, "loss_settings", "when: got"),
        ({"loss_settings": {"x": [1.0, float("nan")]}}, "loss_settings", "x[1]: got nan; allowed: a finite number"),
        ({"advantage": "gae"}, "advantage", "'rpg'"),
        ({"clip": {"eps_low": 0.2, "eps_high": 0.2}}, "clip", "custom has no clip; allowed: off"),
        ({"loss_source": "xyz"}, "loss_source", "allowed: text matching"),
    ],
)
def test_a_bad_custom_loss_is_one_line_naming_the_fix(loss_module, changes, path, words):
    with pytest.raises(SpecError) as info:
        custom(**changes)
    assert info.value.path == path and words in info.value.reason and "\n" not in str(info.value)


def test_a_loss_on_another_algorithm_is_refused_and_collapses_in_a_sweep(loss_module):
    with pytest.raises(SpecError, match="loss: rpg_reinforce has no loss of its own .*allowed: null"):
        ExperimentSpec.model_validate(yaml_dict(loss="mylosses.pg:my_loss"))
    with pytest.raises(SpecError, match="loss_source: is the hash of the loss's source, and there is no loss"):
        ExperimentSpec.model_validate(yaml_dict(loss_source="0123456789ab"))
    base = {**yaml_dict(), "loss": "mylosses.pg:my_loss", "loss_settings": {"scale": 2.0}}
    s = SweepSpec.model_validate({"name": "t", "base": base, "grid": {"algorithm": ["custom", "rpg_reinforce"]}})
    by_algorithm = {x.algorithm: x for x in s.expand()}
    assert by_algorithm["custom"].loss_settings == {"scale": 2.0} and by_algorithm["custom"].loss_source
    assert by_algorithm["rpg_reinforce"].run_id == ExperimentSpec.model_validate(yaml_dict()).run_id
