"""The paper grids are the paper's runs: every cell's settings, read from the verl overrides it generates.

What is pinned is what verl receives (the Hydra overrides of `rpg sweep --dry-run --format json`), not what
the YAML says, so an edit of the grids, the spec defaults or the override generator cannot drift silently.
Expected values: the paper where it states one, else the released scripts (see the grids' headers).
Pure python: no verl needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rpg_cli.backends.verl import launch
from rpg_cli.spec import load_sweep

REPO = Path(__file__).resolve().parents[1]
GRIDS = {
    "paper-qwen25-7b-instruct": 32,
    "paper-qwen3-4b": 20,
}
ACTOR, ROLLOUT = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
TRICKS = ("rpg", "rpg_reinforce", "reinforce_pp", "reinforce_pp_baseline", "dapo")  # the scripts' DAPO tricks


def overrides(spec) -> dict[str, str]:
    pairs = [arg.split("=", 1) for arg in launch.overrides(spec, Path("/runs") / spec.run_name)]
    out = {key.lstrip("+"): value for key, value in pairs}
    assert len(out) == len(pairs)  # no key twice
    return out


@pytest.fixture(autouse=True)
def _no_local_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the grids' data/ paths resolve here: never to a checkout's own data files


def cells(grid: str):
    specs = load_sweep(REPO / "experiments" / f"{grid}.yaml").expand()
    assert len(specs) == GRIDS[grid]
    return [(spec.algorithm, spec.kl, spec.context, overrides(spec)) for spec in specs]


ALL = [pytest.param(grid, id=grid) for grid in GRIDS]


@pytest.mark.parametrize("grid", ALL)
def test_every_cell_validates_32_samples_per_problem_every_10_steps_at_top_p_1(grid):
    for _, _, _, o in cells(grid):
        assert (
            o[f"{ROLLOUT}.val_kwargs.n"],
            o[f"{ROLLOUT}.val_kwargs.temperature"],
            o[f"{ROLLOUT}.val_kwargs.top_p"],
            o[f"{ROLLOUT}.val_kwargs.do_sample"],
        ) == ("32", "1.0", "1.0", "true")
        assert (o["trainer.test_freq"], o["trainer.val_before_train"]) == ("10", "true")
        assert [Path(f).name for f in o["data.val_files"].strip("[]").split(",")] == [
            "aime-2024.parquet",
            "aime-2025.parquet",
            "amc-2023.parquet",
        ]
        assert Path(o["data.train_files"].strip("[]")).name == "dapo-math-17k-eng.parquet"


@pytest.mark.parametrize("grid", ALL)
def test_every_cell_has_the_papers_context_and_the_scripts_dual_clip_bound(grid):
    for _, _, context, o in cells(grid):
        n = int(context.rstrip("k")) * 1024  # "Nk" = N x 1024 prompt + N x 1024 response tokens
        assert (o["data.max_prompt_length"], o["data.max_response_length"]) == (str(n), str(n))
        assert o[f"{ACTOR}.clip_ratio_c"] == "10.0"
        assert (o["data.seed"], o[f"{ROLLOUT}.seed"], o[f"{ACTOR}.data_loader_seed"]) == ("0", "0", "0")


@pytest.mark.parametrize("grid", ALL)
def test_dynamic_sampling_and_overlong_shaping_on_every_method_but_grpo(grid):
    for algorithm, _, _, o in cells(grid):
        on = algorithm in TRICKS
        assert o["algorithm.filter_groups.enable"] == ("true" if on else "false")
        if on:
            assert (
                o["algorithm.filter_groups.metric"],
                o["algorithm.filter_groups.max_inflight_gen_batches"],
                o["algorithm.filter_groups.max_num_gen_batches"],
            ) == ("acc", "3", "20")
            assert (
                o["reward.reward_manager.name"],
                o["reward.reward_kwargs.overlong_buffer_cfg.len"],
                o["reward.reward_kwargs.overlong_buffer_cfg.penalty_factor"],
            ) == ("dapo", "512", "1.0")
        else:
            assert "reward.reward_manager.name" not in o and "algorithm.filter_groups.metric" not in o


@pytest.mark.parametrize("grid", ALL)
def test_each_method_regularises_as_the_paper_ran_it(grid):
    seen = set()
    for algorithm, kl, _, o in cells(grid):
        seen.add(algorithm)
        loss = f"{ACTOR}.policy_loss"
        clip = (o[f"{ACTOR}.clip_ratio_low"], o[f"{ACTOR}.clip_ratio_high"])
        kl_loss = (
            o[f"{ACTOR}.use_kl_loss"],
            o[f"{ACTOR}.kl_loss_type"],
            o[f"{ACTOR}.kl_loss_coef"],
            o[f"{loss}.kl_loss_to_old"],
        )
        no_kl_loss = ("false", "low_var_kl", "0.0", "false")
        assert o["algorithm.use_kl_in_reward"] == "false"  # no method of the paper's runs puts KL in the reward
        if algorithm in ("reinforce_pp", "reinforce_pp_baseline"):
            # the scripts: verl's k1 KL loss (type `kl`), 1e-4, toward the iterative reference pi_old (handed in
            # by rpg's plugin: no ref worker), clip (0.2, 0.28), lr 1e-6
            assert kl_loss == ("false", "kl", "0.0001", "true")
            assert (o[f"{loss}.loss_mode"], o[f"{loss}.use_reference"], clip) == ("ppo", "false", ("0.2", "0.28"))
            assert o[f"{ACTOR}.optim.lr"] == "1e-06"
        elif algorithm == "dapo":  # beta = 0: no KL and no reference model loaded
            assert kl_loss == no_kl_loss and o[f"{loss}.use_reference"] == "false"
            assert (o[f"{loss}.loss_mode"], o[f"{loss}.beta"], clip) == ("ppo", "0.0", ("0.2", "0.28"))
        elif algorithm == "grpo":
            # verl's PPO loss + 1e-3 x low_var_kl toward the frozen model: our grpo loss (clamped k3) reads the
            # ref worker's log-probs, which verl computes when use_kl_loss is on (its own coefficient 0)
            assert (o[f"{loss}.loss_mode"], o[f"{loss}.beta"], o[f"{loss}.kl_clamp"]) == ("grpo", "0.001", "true")
            assert (o[f"{loss}.use_reference"], o[f"{ACTOR}.use_kl_loss"], o[f"{ACTOR}.kl_loss_coef"]) == (
                "true",
                "true",
                "0.0",
            )
            assert clip == ("0.2", "0.2")
        else:  # rpg, rpg_reinforce: beta 1e-4 toward pi_old inside the loss, no reference model
            prefix = "rpg_reinforce" if algorithm == "rpg_reinforce" else "rpg"
            assert (o[f"{loss}.loss_mode"], o[f"{loss}.beta"]) == (f"{prefix}_{kl}", "0.0001")
            assert kl_loss == no_kl_loss and o[f"{loss}.use_reference"] == "false"
            assert o[f"{ACTOR}.optim.lr"] == ("5e-07" if algorithm == "rpg_reinforce" else "1e-06")
    assert {"grpo", "dapo", "reinforce_pp", "reinforce_pp_baseline", "rpg", "rpg_reinforce"} <= seen


# ---------------------------------------------------------------- what validation costs, stated before it is paid


def write_eval_file(path: Path, problems: int, copies: int = 1) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rpg_cli.datasets.template import VERL_SCHEMA, verl_row

    rows = [verl_row(f"Problem {i}?", str(i), "math_dapo", i) for _ in range(copies) for i in range(problems)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=VERL_SCHEMA), path)
    return path


def dry_run(grid: str, cwd: Path, monkeypatch, *args: str):
    from typer.testing import CliRunner

    from rpg_cli.cli import app

    # the grids' training file (the dry run checks it): enough rows for a step's 512 prompts
    write_eval_file(cwd / "data" / "dapo-math-17k-eng.parquet", 512)
    monkeypatch.chdir(cwd)
    return CliRunner().invoke(
        app,
        [
            "sweep",
            str(REPO / "experiments" / f"{grid}.yaml"),
            "--dry-run",
            "--db",
            f"sqlite:///{cwd / 'none.db'}",
            *args,
        ],
    )


def test_dry_run_states_the_generations_of_a_validation(tmp_path, monkeypatch):
    for name, n in (("aime-2024", 2), ("aime-2025", 3), ("amc-2023", 4)):
        write_eval_file(tmp_path / "data" / f"{name}.parquet", n)
    result = dry_run("paper-qwen3-4b", tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert (
        "validation (20 runs): 9 problems x 32 samples = 288 generations per validation, 41 per run "
        "(before training, every 10 steps and at the last)"
    ) in " ".join(result.output.split())
    import json

    rows = json.loads(dry_run("paper-qwen3-4b", tmp_path, monkeypatch, "--format", "json").stdout)
    assert {json.dumps(r["validation"], sort_keys=True) for r in rows} == {
        json.dumps(
            {"problems": 9, "samples_per_problem": 32, "generations_per_validation": 288, "validations_per_run": 41},
            sort_keys=True,
        )
    }
    # without the files here, the plan still says what a validation samples per problem
    (tmp_path / "elsewhere").mkdir()
    bare = dry_run("paper-qwen3-4b", tmp_path / "elsewhere", monkeypatch)
    assert "32 samples per problem (problems not counted" in " ".join(bare.output.split())


def test_verl_refuses_a_validation_file_that_repeats_problems_and_the_local_backend_groups_it(tmp_path, monkeypatch):
    write_eval_file(tmp_path / "data" / "aime-2024.parquet", 30, copies=32)  # the paper's own representation
    write_eval_file(tmp_path / "data" / "aime-2025.parquet", 3)
    write_eval_file(tmp_path / "data" / "amc-2023.parquet", 4)
    result = dry_run("paper-qwen25-7b-instruct", tmp_path, monkeypatch)
    assert result.exit_code == 2
    line = " ".join(result.output.split())
    assert "data.val_files: data/aime-2024.parquet holds 960 rows for 30 distinct problems" in line
    assert "30,720 responses per validation instead of 960" in line and "rpg prepare-data" in line
    local = dry_run("paper-qwen25-7b-instruct", tmp_path, monkeypatch, "--backend", "local")
    assert local.exit_code == 0 and "37 problems x 32 samples = 1,184 generations" in " ".join(local.output.split())


def test_validations_per_run_count_the_start_every_k_steps_and_the_last():
    from rpg_cli.inputs import validation_cost
    from rpg_cli.spec import ExperimentSpec

    spec = load_sweep(REPO / "experiments" / "smoke.yaml").expand()[0].canonical()
    for steps, every, expected in ((400, 10, 41), (5, 2, 4), (300, 50, 7)):
        cost = validation_cost({**spec, "steps": steps, "val": {**spec["val"], "every": every}})
        assert cost.validations == expected
    assert validation_cost(ExperimentSpec.model_validate({**spec, "data": {"train_files": ["t.parquet"]}})) is None


# ---------------------------------------------------------------- every value's source, and the conflicts listed

import re  # noqa: E402

# the fixed vocabulary of a source label (see the grids' headers): segments joined by "; "
SOURCE_SEGMENT = re.compile(
    r"paper (section \d+|Tables? \d+( \(\w+\))?(, (Table )?\d+( \(\w+\))?)*|Appendix [A-Z])\b.*"
    r"|scripts [\w*./{},-]+(\.sh)?:\S+.*"
    r"|rpg: \S+( \S+){2,}"
)
CONFLICT = re.compile(r" ?\[conflict: ([a-z0-9-]+)\]")
HEADER_CONFLICT = re.compile(r"^#   ([a-z0-9-]+): ")
# what the paper and the seed scripts disagree on, or leave open (issue "Benchmarks as they really are")
REQUIRED_CONFLICTS = {"grpo-clip", "grpo-beta", "rpg-reinforce-lr", "grpo-tricks", "reference", "steps"}


def labelled_lines(grid: str) -> tuple[list[tuple[int, str, str]], set[str]]:
    """(line number, value, label) of every value line of a grid, and the conflicts its header lists."""
    text = (REPO / "experiments" / f"{grid}.yaml").read_text()
    header, values = set(), []
    in_header, listing = True, False
    for number, line in enumerate(text.splitlines(), start=1):
        if in_header and line.startswith("#"):
            listing = listing or line.startswith("# Conflicts")  # the list below that line
            if listing and (m := HEADER_CONFLICT.match(line)):
                header.add(m[1])
            continue
        in_header = False
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        value, _, label = line.partition(" # ")
        if value.rstrip().endswith(":") and not label:  # a mapping's key (base:, data:, grid:): no value of its own
            continue
        values.append((number, value.strip(), label.strip()))
    return values, header


@pytest.mark.parametrize("grid", ALL)
def test_every_value_names_its_source_from_the_fixed_vocabulary(grid):
    values, header = labelled_lines(grid)
    assert len(values) > 30
    used = set()
    for number, value, label in values:
        assert label, f"{grid}.yaml line {number}: {value!r} has no source label"
        used |= set(CONFLICT.findall(label))
        for segment in CONFLICT.sub("", label).split("; "):
            assert SOURCE_SEGMENT.fullmatch(segment), f"{grid}.yaml line {number}: {segment!r} is not a source label"
    assert used <= header, f"{grid}.yaml: labels name conflicts its header does not list: {used - header}"
    assert header <= used, f"{grid}.yaml: header conflicts no value names: {header - used}"
    assert header >= REQUIRED_CONFLICTS


def test_the_known_conflicts_label_the_values_they_concern():
    for grid in GRIDS:
        labels = {value: label for _, value, label in labelled_lines(grid)[0]}
        assert labels["save_every: 20"].startswith("scripts ") and "save_freq=20" in labels["save_every: 20"]
        assert labels["steps: 400"] == "paper Appendix H [conflict: steps]"
        assert "[conflict: rpg-reinforce-lr]" in labels["- {algorithm: rpg_reinforce, lr: 5.0e-7}"]
        assert (
            labels["reference: iterative"].startswith("scripts ")
            and "use_iterative_ref_model" in (labels["reference: iterative"])
        )
        assert labels["seed: 0"].startswith("rpg: ")
        beta = next(label for value, label in labels.items() if value.startswith("beta: 1.0e-3"))
        assert beta.startswith("scripts ") and "[conflict: grpo-beta]" in beta
    qwen3 = {value: label for _, value, label in labelled_lines("paper-qwen3-4b")[0]}
    assert "rpg: " in qwen3["context: [2k, 4k, 8k]"] and "[conflict: context-8k]" in qwen3["context: [2k, 4k, 8k]"]
    assert "[conflict: checkpoint]" in qwen3["model: Qwen/Qwen3-4B"]
    assert qwen3["chat_template_kwargs: {enable_thinking: false}"].startswith("rpg: ")
    seven_b = {value: label for _, value, label in labelled_lines("paper-qwen25-7b-instruct")[0]}
    assert "[conflict: optimizer]" in seven_b["optimizer: [adamw, schedule_free]"]


@pytest.mark.parametrize("grid", ALL)
def test_every_cell_saves_every_20_steps_as_the_scripts(grid):
    assert {o["trainer.save_freq"] for *_, o in cells(grid)} == {"20"}


def test_qwen3_cells_sample_without_thinking_on_verl_and_the_dry_run_says_so(tmp_path, monkeypatch):
    for *_, o in cells("paper-qwen3-4b"):
        assert o["data.apply_chat_template_kwargs"] == "{enable_thinking:false}"
    for *_, o in cells("paper-qwen25-7b-instruct"):
        assert o["data.apply_chat_template_kwargs"] == "{}"
    for name, n in (("aime-2024", 2), ("aime-2025", 3), ("amc-2023", 4)):
        write_eval_file(tmp_path / "data" / f"{name}.parquet", n)
    line = " ".join(dry_run("paper-qwen3-4b", tmp_path, monkeypatch).output.split())
    assert "scorers: aime24 dapo; chat template: enable_thinking=False (20 runs)" in line


# ---------------------------------------------------------------- today's baselines in the paper's settings, every grid

BASELINE_GRIDS = {"baselines-qwen25-7b-instruct": "paper-qwen25-7b-instruct", "baselines-qwen3-4b": "paper-qwen3-4b"}
BASELINES = {"rpg_reinforce", "grpo", "dr_grpo", "rloo", "gspo", "cispo", "gmpo", "sapo"}
# what a run computes beyond the algorithm's own settings: the paper grid's value for every cell
PAPER_SETTINGS = (
    "model",
    "model_max_length",
    "chat_template_kwargs",
    "data",
    "train_batch_size",
    "rollout_n",
    "ppo_mini_batch_size",
    "steps",
    "seed",
    "optimizer",
    "lr_warmup_steps",
    "weight_decay",
    "grad_clip",
    "val",
    "rollout",
    "save_every",
    "backend",
    "resources",
)


def _holds(value, default) -> bool:
    """Whether a canonical spec's value is the table default `default` (a mapping: every key it gives)."""
    if isinstance(default, dict):
        return isinstance(value, dict) and all(value.get(k) == v for k, v in default.items())
    return value == default


@pytest.mark.parametrize("grid", BASELINE_GRIDS)
def test_the_baselines_grids_run_each_baseline_at_its_table_defaults_in_the_papers_settings(grid):
    from rpg_cli.algorithms import table

    specs = load_sweep(REPO / "experiments" / f"{grid}.yaml").expand()
    assert sorted(x.algorithm for x in specs) == sorted(BASELINES)  # one run each
    paper = load_sweep(REPO / "experiments" / f"{BASELINE_GRIDS[grid]}.yaml").expand()
    paper_ids = {x.run_id for x in paper}
    settings = {json.dumps({k: x.canonical().get(k) for k in PAPER_SETTINGS}, sort_keys=True) for x in paper}
    contexts = {x.context for x in paper}
    for x in specs:
        spec = x.canonical()
        assert json.dumps({k: spec.get(k) for k in PAPER_SETTINGS}, sort_keys=True) in settings, x.run_name
        assert x.context in contexts and x.lr == (5e-7 if x.algorithm == "rpg_reinforce" else 1e-6)
        for key, default in x.entry.defaults.items():  # the table's, never the grid's
            if key == "sapo":
                assert spec["sapo"] == {"tau_pos": 1.0, "tau_neg": 1.05}  # defaults.SAPO_TAU_POS, SAPO_TAU_NEG
            else:
                assert _holds(spec[key], default), (x.algorithm, key, spec[key])
        if x.algorithm in ("rpg_reinforce", "grpo"):
            assert x.run_id in paper_ids  # the paper's own run, not a look-alike
        else:
            assert x.beta == 0.0 and x.kl_loss is None  # today's baselines as their papers run them: no KL
        o = overrides(x)  # what verl receives: its own loss where it has one, the table's clip and aggregation
        assert o[f"{ACTOR}.policy_loss.loss_mode"] == (x.entry.verl_loss or x.loss_name)
        assert o[f"{ACTOR}.loss_agg_mode"] == x.loss_agg_mode
        if x.clip is not None:
            assert (o[f"{ACTOR}.clip_ratio_low"], o[f"{ACTOR}.clip_ratio_high"]) == (
                str(x.clip.eps_low),
                str(x.clip.eps_high),
            )
        assert o["algorithm.adv_estimator"] == table.ADVANTAGES[x.advantage_estimator][0]
    rpg = next(x for x in specs if x.algorithm == "rpg_reinforce")
    assert rpg.kl == "urkl"  # the paper's best
    gspo = next(x for x in specs if x.algorithm == "gspo")
    assert (gspo.clip.eps_low, gspo.clip.eps_high, gspo.loss_agg_mode) == (3e-4, 4e-4, "seq-mean-token-mean")
    assert next(x for x in specs if x.algorithm == "sapo").clip is None


def test_the_baselines_smoke_grid_runs_every_algorithm_of_the_table_locally(monkeypatch):
    from rpg_cli.algorithms import table

    monkeypatch.syspath_prepend(str(REPO))  # its custom loss, examples.my_loss, is found from the repository's root
    specs = load_sweep(REPO / "experiments" / "smoke-baselines.yaml").expand()
    assert sorted(x.algorithm for x in specs) == sorted(table.ALGORITHMS)
    assert {x.backend for x in specs} == {"local"} and {x.model for x in specs} == {"data/toy/model"}
    smoke = {x.run_id for x in load_sweep(REPO / "experiments" / "smoke.yaml").expand()}
    paper_algorithms = ("grpo", "dapo", "reinforce_pp", "reinforce_pp_baseline", "rpg", "rpg_reinforce")
    # the paper's algorithms are smoke.yaml's own runs (the URKL ones)
    assert {x.run_id for x in specs if x.algorithm in paper_algorithms} <= smoke
    custom = next(x for x in specs if x.algorithm == "custom")
    assert (custom.loss, custom.loss_settings, custom.advantage_estimator) == (
        "examples.my_loss:capped_reinforce",
        {"clip": 2.0},
        "grpo",
    )
    assert custom.run_name.startswith("custom-capped_reinforce-") and len(custom.loss_source) == 12


@pytest.mark.parametrize("grid", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_grid_expands_and_dry_runs(grid, tmp_path, monkeypatch):
    """Every grid under experiments/ plans: each cell validates and `rpg sweep --dry-run` lists it, exit 0."""
    from run_inputs import write_inputs
    from typer.testing import CliRunner

    from rpg_cli.cli import app

    monkeypatch.syspath_prepend(str(REPO))  # a custom loss's module (examples.my_loss)
    specs = load_sweep(grid).expand()
    write_inputs(tmp_path, specs)
    for spec in specs:  # verl refuses a training file smaller than a step's batch: one the size of it
        if spec.backend == "verl":
            write_eval_file(tmp_path / spec.data.train_files[0], spec.train_batch_size)
    result = CliRunner().invoke(
        app, ["sweep", str(grid), "--dry-run", "--format", "json", "--db", f"sqlite:///{tmp_path / 'none.db'}"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert sorted(r["id"] for r in rows) == sorted(x.run_id for x in specs)
    assert not (tmp_path / "none.db").exists()
